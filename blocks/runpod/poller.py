"""One ``GET /v2/pods`` per interval for every pod watched in a process.

RunPod's REST v2 allows about 60 requests a minute per account (its ``RateLimit-Policy``),
so watches of several pods must not each read their own pod: ``PodListPoller`` reads
the whole list at most once per ``interval_seconds`` and answers every ``status(pod_id)``
asked in that interval from it. A pod missing from the list is read once by id before it
counts as gone (RunPod lists a new pod late, so absence alone proves nothing). The clock
is injectable: tests step it instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefect_runpod.blocks.provider import PodCause, PodStatus
from prefect_runpod.blocks.runpod.api import PodRecord, RunPodApi
from prefect_runpod.blocks.runpod.errors import FailoverAction, classify_exception
from prefect_runpod.blocks.runpod.lifecycle import status_from_pod

__all__ = ["PodListPoller"]


class PodListPoller:
    """A shared, cached read of the account's pod list.

    Args:
        api: the RunPod client.
        interval_seconds: how old the list may be before the next ask reads it again, s.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        api: RunPodApi,
        interval_seconds: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.list_reads = 0
        """How many times the list was read (what the rate budget pays)."""
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}
        self._read_at: float | None = None
        self._error: str | None = None

    def _fresh(self) -> None:
        """Read the list when it is older than the interval (one reader at a time; the
        others wait for its answer). Call with the lock held."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < self.interval_seconds:
            return
        self._read_at = now
        self.list_reads += 1
        try:
            self._pods = {p.id: p for p in self.api.list_pods()}
            self._error = None
        except Exception as exc:  # a list that cannot be read is "unknown", never "gone"
            self._error = classify_exception(exc).message

    def status(self, pod_id: str) -> PodStatus:
        """What the latest list says about ``pod_id`` (read again once the interval has
        passed); absent from it → one read by id decides. Never raises: a RunPod that
        cannot be asked answers ``unknown``."""
        with self._lock:
            self._fresh()
            error, pod = self._error, self._pods.get(pod_id)
        if error is not None:
            return PodStatus(
                pod_id=pod_id,
                cause=PodCause.UNKNOWN,
                provider_status=f"RunPod did not answer: {error}",
            )
        if pod is not None:
            return status_from_pod(pod_id, pod)
        try:
            return status_from_pod(pod_id, self.api.get_pod(pod_id))
        except Exception as exc:
            classified = classify_exception(exc)
            if classified.action is FailoverAction.GONE:
                return status_from_pod(pod_id, None)
            return PodStatus(
                pod_id=pod_id,
                cause=PodCause.UNKNOWN,
                provider_status=f"RunPod did not answer: {classified.message}",
            )
