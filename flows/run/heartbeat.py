"""The flow's side of the dead-man switch: keep the pod's heartbeat file fresh for as
long as this process lives (docs/architecture.md#termination-layers, layer 3).

A daemon thread touches ``<run_dir>/heartbeat`` on the pod every few seconds through
its own console, through every stage (a 45-minute download must not look like a dead
flow). When the process dies — SIGKILL, a lost host — the touches stop, the file goes
stale and the pod-side watchdog removes the pod.

``deadman_note`` reads the other side back: what the pod's own dead-man switch recorded
doing, for ``pods`` and the reaper.
"""

from __future__ import annotations

import logging
import shlex
import threading
from pathlib import Path

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import RunPodFlowError
from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["HeartbeatKeeper", "deadman_attempts", "deadman_note", "heartbeat_interval_seconds"]

_log = logging.getLogger(__name__)


def heartbeat_interval_seconds(heartbeat_stale_seconds: float) -> float:
    """How often to touch the heartbeat: a third of the staleness limit, at most 60 s,
    at least 0.5 s, so two missed touches still leave the pod alive."""
    return max(0.5, min(60.0, heartbeat_stale_seconds / 3.0))


class HeartbeatKeeper:
    """Touches ``path`` on the pod every ``interval_seconds`` in a daemon thread.

    Args:
        handle: the pod.
        private_key: the SSH key (the thread opens its own console).
        path: the pod-side heartbeat file.
        interval_seconds: the touch period in seconds.

    A failed touch is logged and retried at the next tick (the console reopens after a
    drop); it never raises into the flow.
    """

    def __init__(
        self, handle: PodHandle, private_key: SecretStr, path: str, interval_seconds: float
    ) -> None:
        self.handle = handle
        self.path = path
        self.interval_seconds = interval_seconds
        self.touches = 0
        self._key = private_key
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{handle.pod_id}", daemon=True
        )

    def start(self) -> HeartbeatKeeper:
        """Start touching; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop touching and wait (bounded) for the thread to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_seconds)

    def _run(self) -> None:
        from prefect_runpod.blocks.console.session import PodConsole

        console = PodConsole.for_pod(self.handle, self._key)
        command = f"touch {shlex.quote(self.path)}"
        try:
            while not self._stop.wait(self.interval_seconds):
                try:
                    console.run(command, timeout_seconds=max(10.0, self.interval_seconds))
                    self.touches += 1
                except RunPodFlowError as exc:
                    _log.warning(
                        "%s: heartbeat touch failed (%s); retrying", self.handle.pod_id, exc
                    )
        finally:
            console.close()


def deadman_attempts(pod: PodHandle) -> list[dict] | None:
    """What the pod's dead-man switch recorded (``deadman.jsonl`` in each run directory),
    when it can be read from here: a local pod's workspace is on this disk. None for a
    pod elsewhere (RunPod: the file is on the pod, ``<workdir>/prefect-runpod/*/``)."""
    from prefect_runpod.blocks.provider import Capability
    from prefect_runpod.blocks.provider_registry import provider_supports

    if not provider_supports(pod.provider, Capability.ON_THIS_MACHINE):
        return None
    from prefect_runpod.blocks.local_pod.registry import read_deadman_attempts

    return read_deadman_attempts(Path(pod.workdir))


def deadman_note(pod: PodHandle) -> str:
    """One line on the pod's dead-man switch: its last attempt and outcome, ``quiet``
    when it has not acted, or where to read it when it cannot be read from here."""
    attempts = deadman_attempts(pod)
    if attempts is None:
        return f"on the pod: {pod.workdir}/prefect-runpod/*/deadman.jsonl"
    if not attempts:
        return "quiet (has not acted)"
    last = attempts[-1]
    ok = "ok" if last.get("ok") else "failed"
    outcome = f"; {last['outcome']}" if last.get("outcome") else ""
    return f"{last.get('layer', '?')} {ok} at {last.get('at', '?')}{outcome}"
