"""One ``GET /v2/pods`` per interval for every pod watched in a process.

RunPod's REST v2 allows about 60 requests a minute per account (its ``RateLimit-Policy``),
so watches of several pods must not each read their own pod: ``PodListPoller`` reads
the whole list at most once per interval and answers every ``status(pod_id)`` asked in
that interval from it. A pod missing from the list is read once by id before it counts
as gone (RunPod lists a new pod late, so absence alone proves nothing). ``poller_for``
gives every client of one account the same poller, so the watches of ten runs in one
process (ten providers) still read one list per interval. The clock is injectable:
tests step it instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefect_runpod.blocks.provider import PodCause, PodStatus
from prefect_runpod.blocks.runpod.api import PodRecord, RunPodApi
from prefect_runpod.blocks.runpod.errors import FailoverAction, classify_exception
from prefect_runpod.blocks.runpod.lifecycle import status_from_pod

__all__ = ["PodListPoller", "poller_for"]

_POLLERS: dict[tuple[str, int], PodListPoller] = {}
_POLLERS_LOCK = threading.Lock()


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

    def _fresh(self, max_age_seconds: float) -> None:
        """Read the list when it is older than ``max_age_seconds`` (one reader at a time;
        the others wait for its answer). Call with the lock held."""
        if self._read_at is not None and self.clock() - self._read_at < max_age_seconds:
            return
        self.list_reads += 1
        try:
            self._pods = {p.id: p for p in self.api.list_pods()}
            self._error = None
        except Exception as exc:  # a list that cannot be read is "unknown", never "gone"
            self._error = classify_exception(exc).message
        # The age counts from the answer, not the ask: the watches that waited on the
        # lock meanwhile take this answer instead of each reading again when RunPod is
        # slower than the interval.
        self._read_at = self.clock()

    def status(self, pod_id: str, max_age_seconds: float | None = None) -> PodStatus:
        """What the latest list says about ``pod_id`` (read again once it is older than
        ``max_age_seconds``, by default the interval); absent from it → one read by id
        decides. Never raises: a RunPod that cannot be asked answers ``unknown``."""
        with self._lock:
            self._fresh(self.interval_seconds if max_age_seconds is None else max_age_seconds)
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


def poller_for(api: RunPodApi, interval_seconds: float = 10.0) -> PodListPoller:
    """The process's one poller for ``api``'s account (keyed by the account's rate budget,
    which ``ratelimit.budget_for`` shares per base URL and key), made on first use.

    Args:
        api: a RunPod client of the account (the first one asking lends the poller its
            connection).
        interval_seconds: the list's default age limit, s (each ask may pass its own).
    """
    budget = getattr(api, "budget", None) or getattr(getattr(api, "rest", None), "budget", None)
    key = (api.name, id(budget if budget is not None else api))
    with _POLLERS_LOCK:
        poller = _POLLERS.get(key)
        if poller is None:
            poller = _POLLERS[key] = PodListPoller(api, interval_seconds)
        return poller
