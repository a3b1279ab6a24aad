"""Named fault points, so failure tests are deterministic on a busy machine (docs/architecture.md#testing).

A fault fires at a named point inside a stage, never after a guessed delay. The
variable ``PREFECT_RUNPOD_FAULTS`` lists ``point:action`` pairs separated by commas:

- ``raise`` — raise ``InjectedFault`` (an ordinary exception in the stage);
- ``sigterm`` / ``sigkill`` — send that signal to this process;
- ``pause`` — write ``<point>.reached`` into ``PREFECT_RUNPOD_FAULT_DIR`` and wait there
  (up to ``PREFECT_RUNPOD_FAULT_PAUSE_SECONDS``, default 300 s) so a test can cancel the
  run, drop its SSH link or kill its process at exactly that point. The wait ends early
  when ``<point>.release`` appears beside the marker (the run then goes on).

One point is read by the local pod's daemon rather than by a stage:
``gateway_relay:cooked`` makes the gateway relay PTY bytes as a cooked terminal path
would (``local_pod.sessions.CookedRelay``).

With ``PREFECT_RUNPOD_FAULT_DIR`` set, each action also leaves ``<point>.fired``
(``<epoch seconds> <action>``) there just before it fires.

One process serving many runs (a Prefect runner) cannot give each run its own
environment, so a run also reads the faults meant for it alone from the file
``<PREFECT_RUNPOD_FAULT_DIR>/runs/<flow_run_id>/faults`` (same syntax); the markers and
release files of those faults live in that per-run directory (``run_fault_dir``).

Unset (the normal case) every point is a no-op costing one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from prefect_runpod.blocks.interrupts import raise_if_stopped

__all__ = [
    "FAULTS_ENV",
    "FAULT_DIR_ENV",
    "InjectedFault",
    "fault_point",
    "parse_faults",
    "release_marker",
    "run_fault_dir",
]

FAULTS_ENV = "PREFECT_RUNPOD_FAULTS"
FAULT_DIR_ENV = "PREFECT_RUNPOD_FAULT_DIR"
_PAUSE_ENV = "PREFECT_RUNPOD_FAULT_PAUSE_SECONDS"
_PAUSE_STEP_SECONDS = 0.1


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault point raises."""


def parse_faults(spec: str, point: str) -> list[str]:
    """The actions ``spec`` (``point:action,point:action…``) lists for ``point``, in order."""
    out = []
    for item in spec.split(","):
        name, _, action = item.strip().partition(":")
        if name == point and action:
            out.append(action.strip())
    return out


def run_fault_dir(fault_dir: Path | str, flow_run_id: str) -> Path:
    """The directory holding one run's own ``faults`` file, markers and release files:
    ``<fault_dir>/runs/<flow_run_id>``."""
    return Path(fault_dir) / "runs" / str(flow_run_id)


def release_marker(marker_dir: Path | str, point: str) -> Path:
    """Create ``<point>.release`` in ``marker_dir``: a run paused at ``point`` goes on.
    Returns the file's path."""
    path = Path(marker_dir) / f"{point}.release"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("release\n")
    return path


def _current_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return flow_run.get_id()
    except Exception:  # no Prefect context: only the environment's faults apply
        return None


def _actions(point: str) -> list[tuple[str, Path]]:
    """``(action, marker_dir)`` pairs for ``point``: the environment's, then the run's own."""
    fault_dir = os.environ.get(FAULT_DIR_ENV)
    base = Path(fault_dir or ".")
    out = [(a, base) for a in parse_faults(os.environ.get(FAULTS_ENV, ""), point)]
    if fault_dir:
        run_id = _current_flow_run_id()
        if run_id:
            own = run_fault_dir(fault_dir, run_id)
            try:
                spec = (own / "faults").read_text()
            except OSError:
                spec = ""
            out.extend((a, own) for a in parse_faults(spec.replace("\n", ","), point))
    return out


def _record_fired(marker_dir: Path, point: str, action: str) -> None:
    """Write ``<point>.fired`` (``<epoch seconds> <action>``) when a fault directory is
    set, so a test can time what follows from the moment the fault fired."""
    if FAULT_DIR_ENV not in os.environ:
        return
    try:
        marker_dir.mkdir(parents=True, exist_ok=True)
        (marker_dir / f"{point}.fired").write_text(f"{time.time():.3f} {action}\n")
    except OSError:
        pass  # a marker is a convenience; the fault itself must still fire


def _pause(point: str, marker_dir: Path) -> None:
    marker_dir.mkdir(parents=True, exist_ok=True)
    release = marker_dir / f"{point}.release"
    (marker_dir / f"{point}.reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + float(os.environ.get(_PAUSE_ENV, "300"))
    while time.monotonic() < deadline and not release.exists():
        raise_if_stopped()  # a Ctrl-C the garbage collector dropped is raised here
        time.sleep(_PAUSE_STEP_SECONDS)  # short steps: signals and cancellation land at once


def fault_point(point: str) -> None:
    """Fire the faults configured for ``point`` (see the module docstring).

    Raises:
        InjectedFault: for a ``raise`` action.
    """
    if FAULTS_ENV not in os.environ and FAULT_DIR_ENV not in os.environ:
        return
    for action, marker_dir in _actions(point):
        _record_fired(marker_dir, point, action)
        if action == "raise":
            raise InjectedFault(f"fault injected at {point}")
        if action == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises in this thread; give it the moment
        elif action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "pause":
            _pause(point, marker_dir)
