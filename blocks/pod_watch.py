"""The pod watch: is the pod a run uses still there? (docs/architecture.md#lost-pods)

``PodWatch`` asks the pod's provider from a daemon thread and before every reconnect,
and gives one of three verdicts: lost, unreachable, degraded (see the class).
``watch_for`` finds the running watch of a pod in this process, for the consoles.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from prefect_runpod.blocks.exceptions import ConsoleConnectError, TerminateError
from prefect_runpod.blocks.provider import (
    PodCause,
    PodProvider,
    PodStatus,
    lost_error,
    lost_sentence,
)
from prefect_runpod.blocks.validation.parameters import DEFAULT_POD_POLL_SECONDS

__all__ = ["PodWatch", "watch_for"]

_log = logging.getLogger("prefect_runpod.liveness")

_WATCHES: dict[str, PodWatch] = {}
_WATCHES_LOCK = threading.Lock()


def watch_for(pod_id: str | None) -> PodWatch | None:
    """The running ``PodWatch`` of ``pod_id`` in this process, or None. Consoles ask it
    before every reconnect attempt, so no stage waits out a reconnect window for a pod
    that is gone."""
    if pod_id is None:
        return None
    with _WATCHES_LOCK:
        return _WATCHES.get(pod_id)


class PodWatch:
    """Watches one ready pod, with three verdicts (docs/architecture.md#lost-pods):
    **lost** (the provider confirms a terminal state, or a ready pod's runtime reads back
    null twice), **unreachable** (``unreachable``: SSH silent for the reconnect budget
    while the provider says it runs: terminated, then lost once confirmed gone) and
    **degraded** (the provider cannot be asked: logged, counted in ``degraded``, never a
    loss; a later attempt's watch starts at zero).

    A daemon thread asks every ``poll_seconds`` — through ``shared_status`` when the
    provider has it (RunPod: one pod-list read per interval for every pod of the account
    watched in this process) —; ``check_now`` asks afresh before a reconnect. Both it and
    ``raise_if_lost`` raise ``PodGoneError`` with one sentence once the pod is lost.

    Args:
        provider: the pod's provider.
        pod_id: the pod.
        poll_seconds: seconds between two background asks (``pod_poll_seconds``).
        on_lost: called once, from whichever thread sees the loss first, with the status.
    """

    def __init__(
        self,
        provider: PodProvider,
        pod_id: str,
        poll_seconds: float = DEFAULT_POD_POLL_SECONDS,
        *,
        on_lost: Callable[[PodStatus], None] | None = None,
    ) -> None:
        self.provider = provider
        self.pod_id = pod_id
        self.poll_seconds = poll_seconds
        self.on_lost = on_lost
        self.lost: PodStatus | None = None
        self.last: PodStatus | None = None
        self.polls = 0
        self.degraded = 0
        """Answers for which the provider could not be asked (never a loss)."""
        self._failing = 0
        self._starting_seen = 0
        self._ending: tuple[PodStatus, float] | None = None
        """While ``unreachable`` terminates the pod: the provider's last "it runs" and the
        seconds its SSH stayed silent (a concurrent ask then finds the run's own end)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"podwatch-{pod_id}", daemon=True)

    def start(self) -> PodWatch:
        """Start the background asks and register for ``watch_for``; returns self."""
        with _WATCHES_LOCK:
            _WATCHES[self.pod_id] = self
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 10.0) -> None:
        """Stop asking and unregister (bounded wait for the thread)."""
        self._stop.set()
        with _WATCHES_LOCK:
            if _WATCHES.get(self.pod_id) is self:
                del _WATCHES[self.pod_id]
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_seconds)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.ask()
            if self.lost is not None:
                return

    def _read(self, fresh: bool) -> PodStatus:
        shared = None if fresh else getattr(self.provider, "shared_status", None)
        try:
            if shared is not None:
                return shared(self.pod_id, self.poll_seconds)  # type: ignore[no-any-return]
            return self.provider.status(self.pod_id)
        except Exception as exc:  # a provider that cannot be asked: never "gone"
            return PodStatus(
                pod_id=self.pod_id, cause=PodCause.UNKNOWN, provider_status=f"unanswered: {exc}"
            )

    def ask(self, fresh: bool = False) -> PodStatus:
        """Ask the provider (the shared read unless ``fresh``) and record the answer: a
        loss is kept and reported once to ``on_lost``; an unanswered ask counts as
        degraded. Never raises. What a ``ReconnectPolicy`` calls before each retry."""
        status = self._read(fresh)
        with self._lock:
            self.polls += 1
            failing_before = self._failing
            self._failing = self._failing + 1 if status.cause is PodCause.UNKNOWN else 0
            self.degraded += status.cause is PodCause.UNKNOWN
            self._starting_seen = (
                self._starting_seen + 1 if status.cause is PodCause.STARTING else 0
            )
            if self._starting_seen >= 2:
                status = status.model_copy(
                    update={
                        "cause": PodCause.HOST_LOST,
                        "provider_status": f"{status.provider_status}: runtime gone",
                    }
                )
            if status.gone and self._ending is not None:  # gone by the run's own terminate
                status = _own_end(*self._ending, ended_at=status.ended_at or status.observed_at)
            self.last = status
            first = status.gone and self.lost is None
            if first:
                self.lost = status
        if self._failing == 1:
            _log.warning("%s: the provider did not answer (%s); degraded: the pod is not "
                         "counted lost", self.pod_id, status.provider_status)  # fmt: skip
        elif failing_before and not self._failing:
            _log.info("%s: the provider answers again after %d failure(s)",
                      self.pod_id, failing_before)  # fmt: skip
        if first:
            _log.warning("%s", lost_sentence(status))
            if self.on_lost is not None:
                self.on_lost(status)
        return status

    def raise_if_lost(self) -> None:
        """Raise ``PodGoneError`` when an earlier answer found the pod gone; else return."""
        if self.lost is not None:
            raise lost_error(self.lost)

    def check_now(self) -> PodStatus:
        """Ask the provider afresh (before a reconnect attempt).

        Returns:
            The status, when the pod is not gone.

        Raises:
            PodGoneError: the pod is gone (this answer or an earlier one).
        """
        self.raise_if_lost()
        status = self.ask(fresh=True)
        self.raise_if_lost()
        return status

    def unreachable(self, seconds: float) -> BaseException:
        """The error for a pod whose SSH stayed down for ``seconds``, its reconnect budget.
        Asked afresh, the provider says: gone → lost; nothing (it cannot be asked) →
        ``ConsoleConnectError``, no loss; it runs → the pod is terminated here and, once
        confirmed gone, lost (``host_lost``); ``TerminateError`` when not confirmed."""
        status = self.ask(fresh=True)
        if self.lost is not None:
            return lost_error(self.lost)
        if status.cause is PodCause.UNKNOWN:
            return ConsoleConnectError(
                f"pod {self.pod_id}: its SSH did not answer for {seconds:.0f} s and the "
                f"provider could not be asked either ({status.provider_status}); it is not "
                "counted lost: the run stops here and terminates it",
                pod_id=self.pod_id,
            )
        _log.warning("%s: unreachable for %.0f s while the provider says it runs: "
                     "terminating it", self.pod_id, seconds)  # fmt: skip
        with self._lock:  # from now on, "gone" is this terminate, never "outside this run"
            self._ending = (status, seconds)
        try:
            ended = self.provider.terminate(self.pod_id)
        except TerminateError as exc:
            with self._lock:
                self._ending = None
            return exc
        lost = _own_end(status, seconds, ended_at=ended.confirmed_at)
        with self._lock:
            self.lost = self.lost or lost
        return lost_error(self.lost)


def _own_end(running: PodStatus, seconds: float, *, ended_at: datetime | None) -> PodStatus:
    """The loss of a pod the run terminated itself because its SSH stayed silent for
    ``seconds`` while the provider said it runs (``running``): host lost, ended by the
    run, at ``ended_at`` (the provider's confirmed end)."""
    return running.model_copy(
        update={
            "cause": PodCause.HOST_LOST,  # who ended it and when: lost_sentence says
            "provider_status": f"the provider says {running.provider_status}, yet its SSH "
            f"did not answer for {seconds:.0f} s",
            "ended_at": ended_at,
            "observed_at": datetime.now(UTC),
            "ended_by": "flow",
            "ended_layer": "terminate (the run, its pod unreachable)",
        }
    )
