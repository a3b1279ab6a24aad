"""Stage bookkeeping for a run: state, times and reasons of each stage in the RunReport,
with one context manager so every stage is recorded the same way."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from prefect.exceptions import CancelledRun, TerminationSignal

from prefect_runpod.blocks.api_probe import probe_api
from prefect_runpod.blocks.exceptions import (
    CancelRequested,
    ConsoleError,
    PodGoneError,
    TrainingError,
    TransferError,
)
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.interrupts import clear_stop, raise_if_stopped
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.secret_mask import error_text, is_header_error, redact
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import StageState

__all__ = ["StageSkipped", "error_line", "run_stage", "stop_sentence"]


class StageSkipped(Exception):
    """Raised inside ``run_stage`` to mark the stage Skipped; the message is the reason."""


_CANCELLED = (TerminationSignal, KeyboardInterrupt, CancelledRun, CancelRequested)
"""What stops a stage from outside (SIGTERM, Ctrl-C, a cancelled run, a cancel in Prefect):
Cancelled, not Failed."""

_SIGNALS = (TerminationSignal, KeyboardInterrupt)

_POD_ERRORS = (ConsoleError, TransferError, TrainingError)
"""Failures that may only mean the pod went away: the provider is asked before they stand."""


@contextmanager
def run_stage(  # type: ignore[no-untyped-def]
    report: RunReport,
    name: str,
    on_change=None,
    *,
    watch: PodWatch | None = None,
    attempt: int | None = None,
) -> Iterator[None]:
    """Record stage ``name`` around the block: Running, then Completed, Skipped (when the
    block raises ``StageSkipped``) or Failed/Cancelled (re-raising the error).

    A stage runs once per pod attempt: when it already ran in an earlier attempt, that
    run moves to ``report.earlier_stages`` and this one takes its place (its seconds add
    to the stage's in the cost record).

    With the pod's liveness ``watch``, a pod already gone fails the stage before it
    starts, and a console, transfer or training failure is checked against the provider
    first: when the pod is gone, the stage fails with that one sentence
    (``PodGoneError``) instead.

    A stop a signal asked for (``blocks.interrupts``) is raised at the start and at the
    end of every stage but ``terminate``, which always runs; a stop the stage records
    is forgotten, so the cleanup after it is not stopped again. Each stage's end probes
    the Prefect API (``blocks.api_probe``), so an outage is told while it lasts.

    Args:
        report: the run's report, updated in place.
        name: one of ``preflight`` and ``STAGES``.
        on_change: called with ``(name, state)`` at each change (live terminal output).
        watch: the pod's liveness watch, once the pod is ready.
        attempt: the pod attempt the stage runs in (None: a stage of the run itself).
    """
    record = report.stage(name)
    before = report.cost.stage_seconds.get(name, 0.0) if record.attempt != attempt else 0.0
    if record.state is not StageState.PENDING and record.attempt != attempt:
        report.earlier_stages.append(record.model_copy())
        record.reason, record.ended_at = None, None
    record.attempt = attempt
    record.state = StageState.RUNNING
    record.started_at = datetime.now(UTC)
    start = time.monotonic()
    if on_change:
        on_change(name, record.state)
    boundary = raise_if_stopped if name != "terminate" else _nothing
    try:
        boundary()  # a Ctrl-C the garbage collector dropped is raised here
        if name != "provision":  # provision's point fires once the pod id exists
            fault_point(name)
        if watch is not None:
            watch.raise_if_lost()
        try:
            yield
        except _POD_ERRORS as exc:
            if watch is not None and not isinstance(exc, PodGoneError):
                watch.check_now()  # raises PodGoneError when the pod is gone
            raise
        boundary()
    except StageSkipped as skip:
        record.state = StageState.SKIPPED
        record.reason = str(skip) or "skipped"
    except BaseException as exc:
        record.state = StageState.CANCELLED if isinstance(exc, _CANCELLED) else StageState.FAILED
        if not isinstance(exc, Exception):
            clear_stop()  # acted on: the cleanup that follows is not stopped again
            record.reason = stop_sentence(exc, name, time.monotonic() - start)
        else:
            record.reason = _one_line(exc)
        raise
    else:
        record.state = StageState.COMPLETED
    finally:
        record.ended_at = datetime.now(UTC)
        record.seconds = round(time.monotonic() - start, 3)
        report.cost.stage_seconds[name] = round(before + record.seconds, 3)
        if on_change:
            on_change(name, record.state)
        probe_api(now=True)  # an API outage that began in a stage writing nothing is told


def _nothing() -> None:
    return None


def _signal_name(number: object) -> str:
    try:
        return signal.Signals(number).name  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "a termination signal"


def stop_sentence(exc: BaseException, stage: str | None, seconds: float | None = None) -> str:
    """The one sentence a run stopped by a signal ends with: what stopped it, in which
    stage and how far into it, e.g. ``stopped by Ctrl-C during upload (1.8 s into the
    stage); the run ends its pod``. A ``BaseException`` that is no signal keeps its text.

    Args:
        exc: the ``KeyboardInterrupt``, the CLI's ``Terminated`` (its text names the
            signal), Prefect's ``TerminationSignal``, a cancellation or a cancel asked for
            in Prefect (``CancelRequested``).
        stage: the stage it stopped, or None outside any stage.
        seconds: how long the stage had run, if known.
    """
    if isinstance(exc, KeyboardInterrupt):
        what = "Ctrl-C"
    elif isinstance(exc, TerminationSignal):
        what = _signal_name(getattr(exc, "signal", None))
    elif isinstance(exc, CancelledRun):
        what = "a cancellation of the flow run"
    elif isinstance(exc, CancelRequested):
        what = str(exc)  # a cancel in Prefect
    else:
        text = redact(str(exc)).strip().splitlines()
        what = text[0] if text and text[0].startswith("SIG") else ""
        if not what:
            return _one_line(exc)
    where = f" during {stage}" if stage else ""
    into = f" ({seconds:.1f} s into the stage)" if stage and seconds is not None else ""
    return f"stopped by {what}{where}{into}; the run ends its pod"


def error_line(report: RunReport, exc: BaseException) -> str:
    """The run's error sentence for ``exc``, the error that ended it: for a stop by a
    signal, the sentence its stage recorded (``stop_sentence``, naming the stage), else
    ``Type: message`` (redacted, at most 400 characters)."""
    if not isinstance(exc, Exception):
        stopped = [s.reason for s in report.stages if s.state is StageState.CANCELLED]
        return next((r for r in reversed(stopped) if r), None) or stop_sentence(exc, None)
    return error_text(exc).strip()[:400]


def _one_line(exc: BaseException) -> str:
    if is_header_error(exc):
        return error_text(exc)[:500]
    text = redact(str(exc)).strip().splitlines()
    first = text[0] if text else ""
    if not first and isinstance(exc, _SIGNALS):
        first = "stopped by a signal (SIGTERM or Ctrl-C); the pod is terminated next"
    return f"{type(exc).__name__}: {first}"[:500]
