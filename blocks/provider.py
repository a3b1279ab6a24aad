"""The provider protocol every pod backend fills in (docs/architecture.md#pod-providers).

Two implementations: ``RunPodProvider`` (the ``runpod`` SDK, GraphQL) and
``LocalPodProvider`` (the embedded default: a loopback SSH server in a scratch
workspace). Like SkyPilot's provision layer, this module is the contract; each
backend module only implements it. What a provider offers beyond it is asked for by
``supports(Capability…)`` (``blocks/provider_capabilities.py``); which providers exist
is ``blocks/provider_registry.py``'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, Field

from prefect_runpod.blocks.defaults import REAPER_TTL_GRACE_SECONDS
from prefect_runpod.blocks.exceptions import PodGoneError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider_capabilities import Capability
from prefect_runpod.blocks.validation import constrained
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_HEARTBEAT_STALE_SECONDS,
    DEFAULT_POD_LIFETIME_SECONDS,
    DEFAULT_POD_POLL_SECONDS,
    DEFAULT_TERMINATE_TIMEOUT_SECONDS,
)

__all__ = [
    "Capability",
    "DEFAULT_POD_LIFETIME_SECONDS",
    "DEFAULT_POD_POLL_SECONDS",
    "DEFAULT_TERMINATE_TIMEOUT_SECONDS",
    "GONE_CAUSES",
    "LIFETIME_ENV",
    "REAPER_TTL_GRACE_SECONDS",
    "DeadmanConfig",
    "EndedBy",
    "PodCause",
    "PodEnd",
    "PodProvider",
    "PodRequest",
    "PodStatus",
    "PodWatch",
    "TerminateResult",
    "end_command",
    "host_lost",
    "lost_error",
    "lost_sentence",
    "reaper_ttl_seconds",
    "watch_for",
]

_log = logging.getLogger("prefect_runpod.liveness")

LIFETIME_ENV = "PREFECT_RUNPOD_LIFETIME_SECONDS"
"""The pod env variable holding the dead-man lifetime a pod was created with, so whoever
lists the pod later (the reaper) can read it."""


class DeadmanConfig(BaseModel):
    """The pod-side dead-man switch (docs/architecture.md#termination-layers, layer 3).

    Attributes:
        heartbeat_stale_seconds: the pod removes itself when the flow's heartbeat file
            is older than this.
        lifetime_seconds: hard cap on the pod's life, whatever the heartbeat says.
        check_interval_seconds: how often the pod-side watchdog looks.
    """

    heartbeat_stale_seconds: constrained("heartbeat_stale_seconds") = DEFAULT_HEARTBEAT_STALE_SECONDS  # type: ignore[valid-type]  # fmt: skip
    lifetime_seconds: constrained("pod_lifetime_seconds") = DEFAULT_POD_LIFETIME_SECONDS  # type: ignore[valid-type]
    check_interval_seconds: constrained("check_interval_seconds") = 30.0  # type: ignore[valid-type]


class PodRequest(BaseModel):
    """What a run asks of a provider, beyond the provider's own block settings.

    Attributes:
        public_key: one OpenSSH public-key line authorised on the pod (RunPod's
            ``PUBLIC_KEY`` env on create).
        env: non-secret environment for the pod; validated before any API call.
        allowed_cuda_versions: CUDA versions the host driver must support (RunPod's
            ``allowedCudaVersions``), from the env plan's floor; empty = any.
        deadman: the dead-man switch settings, or None for none.
    """

    public_key: str
    env: dict[str, str] = Field(default_factory=dict)
    allowed_cuda_versions: list[str] = Field(default_factory=list)
    deadman: DeadmanConfig | None = None


class PodCause(StrEnum):
    """What a provider's status says about a pod (``PodProvider.status``)."""

    ALIVE = "alive"
    """Running, as far as the provider knows."""
    STARTING = "starting"
    """Created, not running yet (RunPod: ``runtime`` still null)."""
    TERMINATED_OUTSIDE = "terminated_outside"
    """Not found, or TERMINATED: the pod ended, and not through this run."""
    EXITED = "exited"
    """EXITED: the container stopped; the pod is not ended (its disk still bills)."""
    HOST_LOST = "host_lost"
    """ERROR, the runtime gone after the pod was up, or the gateway dead past the
    reconnect budget while the provider still says RUNNING."""
    UNKNOWN = "unknown"
    """The provider could not be asked (network); never counts as gone."""


GONE_CAUSES = frozenset({PodCause.TERMINATED_OUTSIDE, PodCause.EXITED, PodCause.HOST_LOST})
"""The causes after which a run stops waiting for its pod at once."""


class PodStatus(BaseModel):
    """One answer of ``PodProvider.status``.

    Attributes:
        pod_id: the pod.
        cause: what the answer means for the run (``PodCause``).
        provider_status: what the provider said, in its own words (``desiredStatus=EXITED``,
            ``not found``, ``daemon dead``).
        observed_at: when the answer came (UTC).
        ended_at: when the pod ended, when the provider knows it (the local pod's record);
            None otherwise (RunPod forgets terminated pods: its billing holds the end).
        ended_by: who ended it, when the provider knows (``deadman``, ``guardian``, ``cli``…).
        ended_layer: how, when known (``runpodctl pod delete``, ``terminate (the guardian)``…).
    """

    pod_id: str
    cause: PodCause
    provider_status: str
    observed_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    ended_at: datetime | None = None
    ended_by: str | None = None
    ended_layer: str | None = None

    @property
    def gone(self) -> bool:
        """True for ``terminated_outside``, ``exited`` and ``host_lost``."""
        return self.cause in GONE_CAUSES


class EndedBy(StrEnum):
    """Who ended a pod (docs/architecture.md#termination-layers)."""

    FLOW = "flow"
    """The run's own ``finally`` (layer 1)."""
    HOOK = "hook"
    """An ``on_crashed`` / ``on_cancellation`` hook (layer 2)."""
    DEADMAN = "deadman"
    """The pod-side dead-man switch (layer 3)."""
    REAPER = "reaper"
    """The reaper flow (layer 4)."""
    GUARDIAN = "guardian"
    """The run's local guardian, after its process died before the dead-man was armed
    (layer 5)."""
    LEASE = "lease"
    """Read from old records only: a provider-side lease (RunPod's ``terminateAfter``, the
    local pod's former deadline). RunPod never acted on it; no layer of today ends a pod
    so."""
    CLI = "cli"
    """``prefect-runpod terminate``."""
    OUTSIDE = "outside"
    """Someone or something else (the RunPod console, a lost host)."""
    UNKNOWN = "unknown"
    """Not known (yet): the record may still be billing."""


class PodEnd(BaseModel):
    """How and when a pod ended, as the run's record keeps it.

    Attributes:
        pod_id: the pod.
        ended_by: who ended it (``EndedBy``).
        confirmed: True once the provider confirmed the pod gone (billing ended).
        ended_at: when billing ended (UTC); None while the pod may still be billing.
        layer: how (``terminate (the run's finally)``, ``runpodctl pod delete``,
            ``DELETE /v2/pods with the pod's key``, ``terminate (the guardian)``…).
        cause: the liveness cause when the pod was lost under the run
            (``terminated_outside``, ``exited``, ``host_lost``), else None.
        inferred: True when ``ended_by`` was deduced (no witness left a record).
        detail: one line more: attempts, evidence, the next step.
        recorded_at: when this record was written (UTC).
    """

    pod_id: str
    ended_by: EndedBy = EndedBy.UNKNOWN
    confirmed: bool = False
    ended_at: datetime | None = None
    layer: str = ""
    cause: str | None = None
    inferred: bool = False
    detail: str = ""
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class TerminateResult(BaseModel):
    """The confirmed end of a pod.

    Attributes:
        pod_id: the pod.
        confirmed_at: when the provider confirmed the pod gone (UTC): billing ends here.
        already_gone: True when the pod was already gone (idempotent call).
        attempts: how many terminate calls were made.
    """

    pod_id: str
    confirmed_at: datetime
    already_gone: bool = False
    attempts: int = 1


@runtime_checkable
class PodProvider(Protocol):
    """A place that rents pods. Every method may raise ``ProviderError`` subclasses."""

    provider_name: str

    def create(self, request: PodRequest, name: str) -> PodHandle:
        """Create a pod named ``name`` and return as soon as its id exists (before it is
        ready), so the caller can record it at once. Adopts an existing pod of that name
        instead of creating a second one."""
        ...

    def wait_ready(self, handle: PodHandle, timeout_seconds: float) -> PodHandle:
        """Block until the pod runs and its SSH endpoint answers; return the handle with
        its endpoint filled in. Raises ``PodTimeoutError`` after ``timeout_seconds``."""
        ...

    def find(self, name: str) -> PodHandle | None:
        """The live pod with exactly this name, or None."""
        ...

    def list(self, prefix: str) -> list[PodHandle]:
        """Live pods whose name starts with ``prefix``."""
        ...

    def terminate(
        self, pod_id: str, timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
    ) -> TerminateResult:
        """Terminate and return only once the provider confirms the pod is gone.
        Idempotent: an unknown/already-terminated pod counts as gone. Raises
        ``TerminateError`` when not confirmed within ``timeout_seconds`` (never
        reports gone on a timeout)."""
        ...

    def supports(self, capability: Capability) -> bool:
        """Whether the provider offers ``capability`` and its method (``plan_pod``,
        ``offers``, ``fetch_bill``…; see ``blocks/provider_capabilities.py``)."""
        ...

    def status(self, pod_id: str) -> PodStatus:
        """What the provider says about the pod now, from its own records (one quick
        look, no retries), mapped to a ``PodCause``: not found or TERMINATED →
        ``terminated_outside``; EXITED → ``exited``; ERROR or a runtime gone →
        ``host_lost``. Never raises for a provider that cannot be asked: that is
        ``unknown``. ``PodStatus.gone`` is the answer to "stop waiting"."""
        ...


def end_command(provider_name: str, pod_id: str) -> str:
    """The command a person runs to end a pod by hand:
    ``prefect-runpod terminate --provider runpod 50qynxzilsxoey``."""
    return f"prefect-runpod terminate --provider {provider_name} {pod_id}"


def lost_sentence(status: PodStatus) -> str:
    """The one sentence a run fails with when its pod is gone under it.

    Args:
        status: a status whose cause is in ``GONE_CAUSES``.

    Returns:
        e.g. ``pod 50qynxzilsxoey was terminated outside this run (RunPod: not found) at
        12:00:03 UTC; the run stopped waiting for it.``
    """
    at = status.observed_at.astimezone(UTC).strftime("%H:%M:%S UTC")
    said = status.provider_status
    if status.cause is PodCause.TERMINATED_OUTSIDE:
        return (
            f"pod {status.pod_id} was terminated outside this run ({said}; seen at {at}); "
            "the run stopped waiting for it."
        )
    if status.cause is PodCause.EXITED:
        return (
            f"pod {status.pod_id} exited ({said}) at {at}: its container stopped, so the run "
            "stopped waiting and ends the pod."
        )
    return (
        f"pod {status.pod_id} lost its host ({said}) at {at}; the run stopped waiting and "
        "ends the pod."
    )


def reaper_ttl_seconds(handle: PodHandle, ttl_seconds: float | None = None) -> float:
    """The age after which the reaper ends ``handle`` whatever its run says.

    Args:
        handle: the pod as listed (``lifetime_seconds`` when the pod recorded one).
        ttl_seconds: an explicit TTL (the reaper's ``ttl_seconds``), or None for the
            default: the pod's recorded lifetime (else ``DEFAULT_POD_LIFETIME_SECONDS``)
            plus ``REAPER_TTL_GRACE_SECONDS``.

    Returns:
        Seconds.
    """
    if ttl_seconds is not None:
        return ttl_seconds
    lifetime = handle.lifetime_seconds or DEFAULT_POD_LIFETIME_SECONDS
    return lifetime + REAPER_TTL_GRACE_SECONDS


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
    """Watches one ready pod: asks ``provider.status`` every ``poll_seconds`` from a
    daemon thread, and on demand before every reconnect attempt (docs/architecture.md#termination-layers).

    The run's main thread calls ``raise_if_lost`` in its waits (cheap: the thread's
    last answer) and ``check_now`` before reconnecting (a fresh answer); both raise
    ``PodGoneError`` with one sentence once the pod is gone. A pod watched while ready
    that reads back ``starting`` (RunPod: ``runtime`` null again) on two answers in a
    row has lost its runtime: ``host_lost``.

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
        self._starting_seen = 0
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

    def ask(self) -> PodStatus:
        """Ask the provider now and record what it says (a loss is kept, and reported
        once to ``on_lost``); never raises: a provider that cannot be asked answers
        ``unknown``. What a ``ReconnectPolicy`` calls before each retry."""
        try:
            status = self.provider.status(self.pod_id)
        except Exception as exc:  # a provider that cannot be asked: never "gone"
            status = PodStatus(
                pod_id=self.pod_id, cause=PodCause.UNKNOWN, provider_status=f"unanswered: {exc}"
            )
        with self._lock:
            self.polls += 1
            if status.cause is PodCause.STARTING:
                self._starting_seen += 1
                if self._starting_seen >= 2:
                    status = status.model_copy(
                        update={
                            "cause": PodCause.HOST_LOST,
                            "provider_status": f"{status.provider_status}: runtime gone",
                        }
                    )
            else:
                self._starting_seen = 0
            self.last = status
            first = status.gone and self.lost is None
            if first:
                self.lost = status
        if first:
            _log.warning("%s", lost_sentence(status))
            if self.on_lost is not None:
                self.on_lost(status)
        return status

    def raise_if_lost(self) -> None:
        """Raise ``PodGoneError`` when an earlier answer found the pod gone; else return."""
        if self.lost is not None:
            raise self.error(self.lost)

    def check_now(self) -> PodStatus:
        """Ask the provider now (before a reconnect attempt).

        Returns:
            The status, when the pod is not gone.

        Raises:
            PodGoneError: the pod is gone (this answer or an earlier one).
        """
        self.raise_if_lost()
        status = self.ask()
        self.raise_if_lost()
        return status

    def gateway_dead(self, seconds: float) -> PodGoneError:
        """The error for a pod whose SSH stayed down past the reconnect budget: the
        provider is asked once more; if it still says the pod runs, that is
        ``host_lost`` (the caller then terminates it)."""
        status = self.ask()
        lost = status if status.gone else host_lost(status, seconds)
        with self._lock:
            if self.lost is None:
                self.lost = lost
        return self.error(self.lost or lost)

    @staticmethod
    def error(status: PodStatus) -> PodGoneError:
        """The ``PodGoneError`` for a gone ``status``."""
        return lost_error(status)


def host_lost(status: PodStatus, seconds: float) -> PodStatus:
    """``status`` (the provider says the pod runs) seen together with an SSH gateway that
    did not answer for ``seconds``, past the reconnect budget: the pod lost its host."""
    return status.model_copy(
        update={
            "cause": PodCause.HOST_LOST,
            "provider_status": (
                f"the provider says {status.provider_status}, yet its SSH gateway did not "
                f"answer for {seconds:.0f} s"
            ),
        }
    )


def lost_error(status: PodStatus) -> PodGoneError:
    """The ``PodGoneError`` for a gone ``status``: ``lost_sentence``, its cause, when."""
    return PodGoneError(
        lost_sentence(status),
        pod_id=status.pod_id,
        cause=status.cause.value,
        seen_at=status.observed_at,
    )
