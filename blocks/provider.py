"""The provider protocol every pod backend fills in (docs/architecture.md#pod-providers).

Two implementations: ``RunPodProvider`` (RunPod's REST v2, GraphQL as a fallback) and
``LocalPodProvider`` (the embedded default: a loopback SSH server in a scratch
workspace). Like SkyPilot's provision layer, this module is the contract; each
backend module only implements it. What a provider offers beyond it is asked for by
``supports(Capability…)`` (``blocks/provider_capabilities.py``); which providers exist
is ``blocks/provider_registry.py``'s.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

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
    "OWN_LAYERS",
    "REAPER_TTL_GRACE_SECONDS",
    "DeadmanConfig",
    "EndedBy",
    "PodCause",
    "PodEnd",
    "PodProvider",
    "PodRequest",
    "PodStatus",
    "TerminateResult",
    "end_command",
    "lost_error",
    "lost_sentence",
    "reaper_ttl_seconds",
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
        stop_run_seconds: before ending the pod, SIGTERM the run's own process and give
            it this long to exit, s (0: not asked). A Prefect flow on a worker's pod marks
            its run Crashed itself when signalled, which it cannot once the pod is gone.
    """

    heartbeat_stale_seconds: constrained("heartbeat_stale_seconds") = DEFAULT_HEARTBEAT_STALE_SECONDS  # type: ignore[valid-type]  # fmt: skip
    lifetime_seconds: constrained("pod_lifetime_seconds") = DEFAULT_POD_LIFETIME_SECONDS  # type: ignore[valid-type]
    check_interval_seconds: constrained("check_interval_seconds") = 30.0  # type: ignore[valid-type]
    stop_run_seconds: float = Field(default=0.0, ge=0.0, le=300.0)


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

    def end(self, ended_by: EndedBy, layer: str, **more: Any) -> PodEnd:
        """This confirmed end as the run's record keeps it: ended by ``ended_by``
        through ``layer``, billing ended at ``confirmed_at``; ``more`` sets the other
        ``PodEnd`` fields (``cause``, ``detail``)."""
        return PodEnd(
            pod_id=self.pod_id,
            ended_by=ended_by,
            confirmed=True,
            ended_at=self.confirmed_at,
            layer=layer,
            **more,
        )


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


OWN_LAYERS = {
    "deadman": "the run's own dead-man switch (its heartbeat went stale or its lifetime ran out)",
    "guardian": "the run's guardian",
    "hook": "the run's crash hook",
    "reaper": "the reaper",
    "lease": "its lease",
}
"""The layers of prefect-runpod that end a pod (``EndedBy`` values), as a sentence names
them: a pod one of them ended was not "terminated outside this run"."""


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
        12:00:03 UTC; the run stopped waiting for it.``; a pod a layer of prefect-runpod
        ended (``status.ended_by`` in ``OWN_LAYERS``) is named as ended by that layer.
    """
    at = status.observed_at.astimezone(UTC).strftime("%H:%M:%S UTC")
    said = status.provider_status
    layer = OWN_LAYERS.get(status.ended_by or "")
    if status.cause is PodCause.TERMINATED_OUTSIDE and layer:
        return (
            f"pod {status.pod_id} was ended by {layer} ({said}; seen at {at}); the run "
            "stopped waiting for it."
        )
    if status.cause is PodCause.TERMINATED_OUTSIDE:
        return (
            f"pod {status.pod_id} was terminated outside this run ({said}; seen at {at}); "
            "the run stopped waiting for it."
        )
    ended = _ended_words(status)
    then = f"stopped waiting for it: {ended}" if ended else "stopped waiting and ends the pod"
    if status.cause is PodCause.EXITED:
        return (
            f"pod {status.pod_id} exited ({said}) at {at}: its container stopped, so the run "
            f"{then}."
        )
    return f"pod {status.pod_id} lost its host ({said}) at {at}; the run {then}."


_ENDERS = {"flow": "the run itself", "cli": "`prefect-runpod terminate`", **OWN_LAYERS}
"""Who ended a pod, as the end of a lost pod's sentence names them."""


def _ended_words(status: PodStatus) -> str | None:
    """``the run itself had ended it, confirmed gone at 12:00:25 UTC`` (another layer
    with how: ``the reaper had ended it (DELETE /v2/pods), …``) for a lost pod whose end is known (``ended_at`` or
    ``ended_by``: a pod the run terminated when its SSH stayed silent, a local pod's
    tombstone); None when the pod is still to be ended."""
    if status.ended_at is None and not status.ended_by:
        return None
    by = status.ended_by or ""
    who = _ENDERS.get(by) or ("someone outside this run" if by in ("", "outside") else by)
    how = f" ({status.ended_layer})" if status.ended_layer and by != "flow" else ""
    when = status.ended_at
    at = f", confirmed gone at {when.astimezone(UTC):%H:%M:%S} UTC" if when else ""
    return f"{who} had ended it{how}{at}"


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


def lost_error(status: PodStatus) -> PodGoneError:
    """The ``PodGoneError`` for a gone ``status``: ``lost_sentence``, its cause, when."""
    return PodGoneError(
        lost_sentence(status),
        pod_id=status.pod_id,
        cause=status.cause.value,
        seen_at=status.observed_at,
    )
