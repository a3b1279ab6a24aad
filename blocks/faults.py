"""Named fault points, so failure tests are deterministic on a busy machine (DESIGN §11).

A fault fires at a named point inside a stage, never after a guessed delay. The
variable ``PREFECT_RUNPOD_FAULTS`` lists ``point:action`` pairs separated by commas:

- ``raise`` — raise ``InjectedFault`` (an ordinary exception in the stage);
- ``sigterm`` / ``sigkill`` — send that signal to this process;
- ``pause`` — write ``<point>.reached`` into ``PREFECT_RUNPOD_FAULT_DIR`` and wait there
  (up to ``PREFECT_RUNPOD_FAULT_PAUSE_SECONDS``, default 300 s) so a test can cancel the
  run, drop its SSH link or kill its process at exactly that point.

Unset (the normal case) every point is a no-op costing one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["FAULTS_ENV", "InjectedFault", "fault_point"]

FAULTS_ENV = "PREFECT_RUNPOD_FAULTS"


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault point raises."""


def _actions(point: str) -> list[str]:
    spec = os.environ.get(FAULTS_ENV, "")
    out = []
    for item in spec.split(","):
        name, _, action = item.strip().partition(":")
        if name == point and action:
            out.append(action)
    return out


def fault_point(point: str) -> None:
    """Fire the faults configured for ``point`` (see the module docstring).

    Raises:
        InjectedFault: for a ``raise`` action.
    """
    for action in _actions(point):
        if action == "raise":
            raise InjectedFault(f"fault injected at {point}")
        if action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread; give it the moment
        elif action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "pause":
            marker_dir = Path(os.environ.get("PREFECT_RUNPOD_FAULT_DIR", "."))
            marker_dir.mkdir(parents=True, exist_ok=True)
            (marker_dir / f"{point}.reached").write_text(str(os.getpid()))
            deadline = time.monotonic() + float(
                os.environ.get("PREFECT_RUNPOD_FAULT_PAUSE_SECONDS", "300")
            )
            while time.monotonic() < deadline:
                time.sleep(0.1)  # short steps: signals and cancellation land at once
