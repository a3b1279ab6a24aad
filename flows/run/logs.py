"""How much a fine-tune run logs (docs/architecture.md#prefect-surface): quiet by default.

A run's Prefect log is meant to be read: one line per stage at its end (with its seconds
and, when Skipped or Failed, why), a few lines from the stages that did something, the
training log's own lines coalesced at a bounded rate (``tasks.train_log.LogCoalescer``),
and every warning and error. Progress lives in the ``train-progress`` artifact and on
one terminal line, metrics in the ``train-metrics`` table.

- ``stage_logger`` gives the flow's ``on_stage`` callback: the start of a stage is a
  DEBUG record, its end one INFO record.
- ``QuietTaskEngine`` drops the task engine's own ``Finished in state Completed()``
  record (the stage line says it, with the seconds), and its crash records of a stage a
  cancel in Prefect stopped; any other end keeps its record.
- ``ConsoleFilter`` decides what a terminal shows: ``quiet`` (warnings and errors, and
  the line that says how to get into the pod), ``normal`` (INFO records except the
  training log's lines) or ``verbose`` (everything, the training log too). The
  ``prefect-runpod`` CLI installs it (``--quiet``, ``--verbose``); the Prefect API always
  gets the records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from prefect_runpod.tasks.models import StageState

__all__ = [
    "WAY_IN",
    "ConsoleFilter",
    "QuietTaskEngine",
    "Verbosity",
    "install_quiet_engine",
    "stage_logger",
]

WAY_IN = {"way_in": True}
"""The ``extra`` of the record that says how to get into the pod (``ssh …``): a terminal
shows it at every verbosity."""

Verbosity = Literal["quiet", "normal", "verbose"]


class QuietTaskEngine(logging.Filter):
    """Leaves out the task engine's INFO ``Finished in state Completed()`` records, and
    its ``Crash detected!`` / ``Finished in state Crashed(…)`` records of a stage stopped
    by a cancel in Prefect (``CancelRequested``): the stage's own line says it, Cancelled,
    with the stage and the seconds."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if "CancelRequested: a cancel in Prefect" in text:
            return False
        if record.levelno != logging.INFO:
            return True
        return not text.startswith("Finished in state Completed(")


def install_quiet_engine() -> None:
    """Add ``QuietTaskEngine`` to Prefect's task-run logger (once per process)."""
    logger = logging.getLogger("prefect.task_runs")
    if not any(isinstance(f, QuietTaskEngine) for f in logger.filters):
        logger.addFilter(QuietTaskEngine())


class ConsoleFilter(logging.Filter):
    """What a terminal shows of a run's log records, by verbosity (see the module)."""

    def __init__(self, verbosity: Verbosity = "normal") -> None:
        super().__init__()
        self.verbosity = verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        if _api_noise(record):
            return False
        if self.verbosity == "verbose":
            return True
        if self.verbosity == "quiet":
            return record.levelno >= logging.WARNING or getattr(record, "way_in", False)
        return not getattr(record, "train_log", False) or record.levelno >= logging.WARNING


_API_PLUMBING = ("prefect.events.clients", "prefect._internal.concurrency", "EventsWorker")
"""Prefect's own loggers that complain, each in its own words and more than once, about an
API that does not answer."""


def _api_noise(record: logging.LogRecord) -> bool:
    """A record of Prefect's own plumbing about an API the run's outbox has already said
    is down (``blocks.api_outbox``: one sentence when it goes, one when it is back)."""
    from prefect_runpod.blocks.api_outbox import api_down

    if not api_down():
        return False
    if record.name in _API_PLUMBING:
        return True
    return record.name.startswith("prefect.flow_runs") and str(record.msg).startswith(
        "Encountered exception during execution: ConnectError"
    )


def stage_logger(logger: Any, report: Any) -> Callable[[str, StageState], None]:
    """The flow's ``on_stage(name, state)``: DEBUG when a stage starts, one INFO record
    when it ends (``stage upload      Completed  0.29 s``; a Skipped or Failed stage with
    its reason).

    Args:
        logger: the flow run's logger.
        report: the run's ``RunReport`` (its stage records hold the seconds and reasons).
    """

    def on_stage(name: str, state: StageState) -> None:
        if state is StageState.RUNNING:
            logger.debug("stage %-11s %s", name, state.value)
            return
        record = report.stage(name)
        why = f": {record.reason}" if record.reason and state is not StageState.COMPLETED else ""
        logger.info("stage %-11s %-9s %6.2f s%s", name, state.value, record.seconds or 0.0, why)

    return on_stage
