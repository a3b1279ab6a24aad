"""A cancel asked for in Prefect stops the run, whoever executes it
(docs/architecture.md#termination-layers).

Prefect's runner and workers end a run whose flow run is set Cancelling by killing its
process. A cancel that none of them acts on is lost otherwise: a run started from the
CLI or a script has no runner, and a runner learns of a cancel from an event it drops
while the run's process is still starting (it follows a run only once its process
exists). The run therefore reads its own state every ``CANCEL_POLL_SECONDS`` in a
thread of its own; once it is Cancelling (or Cancelled), the watch notes the stop in the
run's one stop slot (``blocks.interrupts``: the first reason wins), the next boundary
raises ``CancelRequested``, the run ends its pod, and the flow returns a Cancelled state
whose message names the stage and the pod's end (``cancelled_state``).

A read the API does not answer decides nothing: the outbox and the API probe tell an
outage; the watch asks again at its next turn.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any

from prefect_runpod.blocks.exceptions import CancelRequested
from prefect_runpod.blocks.interrupts import forget_stop, note_stop

__all__ = [
    "CANCEL_POLL_SECONDS",
    "CANCELLED_STATE_TYPES",
    "CancelWatch",
    "cancelled_state",
    "end_words",
]

CANCEL_POLL_SECONDS = 5.0
"""How often a run reads its own flow run's state (s): one small API read each time."""
CANCELLED_STATE_TYPES = frozenset({"CANCELLING", "CANCELLED"})
"""The state types that stop the run."""


def _state_type_now(flow_run_id: str) -> str | None:
    """The flow run's state type, or None when the API did not answer (or has no such
    run): ``crashed.run_state_type`` with a client that waits at most 10 s."""
    from prefect_runpod.blocks.api_outbox import fresh_client

    try:
        with fresh_client(10.0) as client:
            run = client.read_flow_run(flow_run_id)
    except Exception:  # an outage or a lost run: the next turn asks again
        return None
    return run.state.type.value if run.state else None


class CancelWatch:
    """Reads the run's flow run state in a thread; notes ``CancelRequested`` once it is
    Cancelling or Cancelled (see the module).

    Args:
        flow_run_id: the run's flow run.
        interval_seconds: the time between two reads (s).
        read_state: the flow run's state type now, None when unknown (default: one read
            through the Prefect API of the caller's context).
    """

    def __init__(
        self,
        flow_run_id: str,
        *,
        interval_seconds: float = CANCEL_POLL_SECONDS,
        read_state: Callable[[str], str | None] = _state_type_now,
    ) -> None:
        self.flow_run_id = flow_run_id
        self.interval_seconds = interval_seconds
        self._read = read_state
        self._context = contextvars.copy_context()  # the run's settings: its API URL
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._make = functools.partial(CancelRequested, flow_run_id)  # one stop, one identity
        self.noted = False
        """Whether the watch saw the cancel and noted the stop."""

    def start(self) -> CancelWatch:
        """Start reading (once); returns the watch."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch (before the pod's end, which no stop interrupts) and forget a
        stop it noted that no boundary raised, so it never reaches another run this
        process serves."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(15.0)
        forget_stop(self._make)

    def _run(self) -> None:
        while not self._done.wait(self.interval_seconds):
            state = self._context.copy().run(self._read, self.flow_run_id)
            if state in CANCELLED_STATE_TYPES and not self._done.is_set():
                self.noted = True
                note_stop(self._make)  # refused while another stop is under way
                return


def end_words(data: dict[str, Any]) -> str:
    """The pod's end for a stopped run's state message, from its ``run-report.json``
    data: ``pod 3f2a… was ended``, ``no pod was created``, or that it may still bill
    and the command that ends it."""
    pod_id = data.get("pod_id")
    if not pod_id:
        return "no pod was created"
    if data.get("terminated"):
        return f"pod {pod_id} was ended"
    return f"pod {pod_id} may still be billing: `prefect-runpod terminate {pod_id}` ends it"


def cancelled_state(data: dict[str, Any]) -> Any:
    """The Cancelled state a run stopped by a cancel in Prefect returns (Prefect makes a
    flow's returned state its final state), its message the stop's sentence and the
    pod's end: ``stopped by a cancel in Prefect during train (4.1 s into the stage); pod
    3f2a… was ended`` (at most 500 characters)."""
    from prefect.states import Cancelled

    said = str(data.get("error") or "stopped by a cancel in Prefect")
    said = said.split("; the run ends its pod")[0]
    return Cancelled(message=f"{said}; {end_words(data)}"[:500])
