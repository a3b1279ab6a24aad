"""The provider protocol every pod backend fills in (docs/architecture.md#pod-providers).

Two implementations: ``RunPodProvider`` (the ``runpod`` SDK, GraphQL) and
``LocalPodProvider`` (the embedded default: a loopback SSH server in a scratch
workspace). Like SkyPilot's provision layer, this module is the contract; each
backend module only implements it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, Field

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.validation import constrained

__all__ = ["DeadmanConfig", "PodProvider", "PodRequest", "PodStatus", "TerminateResult"]


class PodStatus(StrEnum):
    """Whether a pod still lives, in its provider's own view (``PodProvider.status``).

    A stage that lost its SSH connection asks this before each retry, so a pod that
    is gone is noticed at once instead of after the whole reconnect budget. Later work
    may add finer members (why a pod is gone); ``GONE`` stays the answer to "stop
    waiting".
    """

    ALIVE = "alive"
    """The provider lists the pod as running (or starting): waiting may help."""
    GONE = "gone"
    """The provider no longer has it running (terminated, stopped, lost)."""
    UNKNOWN = "unknown"
    """The provider could not be asked (its API unreachable): keep waiting."""


class DeadmanConfig(BaseModel):
    """The pod-side dead-man switch (docs/architecture.md#termination-layers, layer 3).

    Attributes:
        heartbeat_stale_seconds: the pod removes itself when the flow's heartbeat file
            is older than this.
        lifetime_seconds: hard cap on the pod's life, whatever the heartbeat says.
        check_interval_seconds: how often the pod-side watchdog looks.
    """

    heartbeat_stale_seconds: constrained("heartbeat_stale_seconds") = 900.0  # type: ignore[valid-type]
    lifetime_seconds: constrained("pod_lifetime_seconds") = 6 * 3600.0  # type: ignore[valid-type]
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

    def status(self, pod_id: str) -> PodStatus:
        """Whether the pod still lives, from the provider's own records (one quick
        look, no retries: ``UNKNOWN`` when the provider cannot be asked)."""
        ...

    def terminate(self, pod_id: str, timeout_seconds: float = 120.0) -> TerminateResult:
        """Terminate and return only once the provider confirms the pod is gone.
        Idempotent: an unknown/already-terminated pod counts as gone. Raises
        ``TerminateError`` when not confirmed within ``timeout_seconds`` (never
        reports gone on a timeout)."""
        ...
