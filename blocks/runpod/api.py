"""The one RunPod client interface, and the records both of its backends answer with.

Two backends fill in ``RunPodApi``:

- ``rest.RestApi``: RunPod's REST v2 (``{base}/v2``) on httpx — every pod call, the
  account's SSH keys, the GPU catalog, billing and pod logs;
- ``graphql_api.GraphQLApi``: the ``runpod`` SDK's GraphQL (the same base) for the pod
  calls and the account's keys, the fallback until GraphQL's retirement (early 2027);
  catalog availability, billing and logs exist only on v2, so it asks ``RestApi`` for them.

Which one a credentials block uses is ``RunPodCredentials.api`` (``DEFAULT_API`` when
unset). The provider and everything above it see only ``RunPodApi`` and these records;
``RunPodApi.name`` says which API answered (for ``prefect-runpod check``).

Errors: a backend raises what its transport raises (``RunPodAPIError`` for a v2 problem
object, httpx's or the SDK's exceptions); ``runpod.errors.classify_exception`` is the one
place that decides what each means.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, model_validator

from prefect_runpod.blocks.runpod.billing import RunPodBill
from prefect_runpod.blocks.runpod.catalog import GpuAvailability

__all__ = [
    "API_NAMES",
    "DEFAULT_API",
    "ApiName",
    "LogLine",
    "PodCreate",
    "PodRecord",
    "RunPodApi",
    "SshLogin",
]

ApiName = Literal["v2", "graphql"]
API_NAMES: tuple[ApiName, ...] = ("v2", "graphql")

DEFAULT_API: ApiName = "v2"
"""The API a ``RunPodCredentials`` block uses when it does not say: REST v2. GraphQL (the
``runpod`` SDK) only when a block asks for it, until RunPod retires it (early 2027)."""

PodState = Literal["PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR", "TERMINATED"]
"""A pod's status in REST v2's words; the GraphQL backend maps ``desiredStatus`` onto
them (``DEAD`` → ``ERROR``, ``CREATED``/``RESTARTING`` → ``STARTING``)."""


class SshLogin(BaseModel):
    """One way into a pod over SSH, as RunPod reports it.

    Attributes:
        host / port: where to connect; None when the API does not say (GraphQL reports
            only the gateway's user: the gateway is the SSH key block's).
        username: the login. For the gateway (``ssh.proxy``) an opaque routing token
            (``7h9k2m4n6p-64411eb2``): used exactly as given, never built.
    """

    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    username: str


class PodRecord(BaseModel):
    """A pod as either backend reads it.

    Attributes:
        id / name: RunPod's.
        status: REST v2's status word (``PodState``).
        runtime_up: True when RunPod reports a runtime (the container is up).
        cost_per_hr: what the pod costs now, USD/h.
        gpu_type_id / gpu_display_name / gpu_count: the GPU rented.
        data_center_id / cuda_version: where it runs, the host's CUDA (v2 only).
        image / env: the container settings RunPod reports.
        workdir: where the pod's volume is mounted (``/workspace``), when known.
        created_at: when RunPod created it (UTC), when it says.
        uptime_seconds: seconds since create (GraphQL) or container start (v2).
        proxy: the gateway login (v2 ``ssh.proxy``; GraphQL ``machine.podHostId``).
        direct: 22/tcp on a public IP (v2 ``ssh.direct``; GraphQL ``runtime.ports``).
    """

    id: str
    name: str = ""
    status: PodState
    runtime_up: bool = False
    cost_per_hr: float = 0.0
    gpu_type_id: str | None = None
    gpu_display_name: str | None = None
    gpu_count: int = 1
    data_center_id: str | None = None
    cuda_version: str | None = None
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    created_at: datetime | None = None
    uptime_seconds: float | None = None
    proxy: SshLogin | None = None
    direct: SshLogin | None = None

    def said(self) -> str:
        """What RunPod said, in one phrase: ``status=RUNNING runtime=null``."""
        return f"status={self.status} runtime={'up' if self.runtime_up else 'null'}"


class PodCreate(BaseModel):
    """One create: one GPU type, at most one data centre, one cloud — the unit both APIs
    place (REST v2 never falls back; failover over GPU types, data centres and clouds is
    the provider's).

    Attributes:
        name / image: the pod's.
        gpu_type_id / gpu_count: what to rent; the count is always sent (a v2 create
            without it is answered as if no machine were free: runpod-mcp PR #77).
        cloud: ``SECURE`` or ``COMMUNITY`` (``ALL`` only for GraphQL, which accepts it).
        data_center_id: the one data centre asked for, or None for any.
        env: the pod's environment (validated, secrets refused, by the provider).
        ports: exposed ports (``22/tcp`` is what direct SSH needs).
        container_disk_gb / volume_gb / volume_mount_path: disks (GB) and the mount.
        cuda_versions: the CUDA versions a host may have; empty for any.
        cuda_floor: True when ``cuda_versions`` means "the lowest of them or newer" (v2
            sends ``minCudaVersion``), False for an exact set (``allowedCudaVersions``).
        public_ip: ask for a public IP (GraphQL ``supportPublicIp``; v2 gives one with a
            TCP port).

    No create carries a server-side deadline: GraphQL's ``terminateAfter`` was accepted and
    never acted on (runpodctl dropped its flags on 2026-08-26), and REST v2 has no such
    field.
    """

    name: str
    image: str
    gpu_type_id: str
    gpu_count: int = Field(ge=1)
    cloud: Literal["SECURE", "COMMUNITY", "ALL"] = "SECURE"
    data_center_id: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[str] = Field(default_factory=list)
    container_disk_gb: int = Field(default=20, ge=1)
    volume_gb: int = Field(default=0, ge=0)
    volume_mount_path: str = "/workspace"
    cuda_versions: list[str] = Field(default_factory=list)
    cuda_floor: bool = False
    public_ip: bool = True

    @model_validator(mode="after")
    def _floor_has_versions(self) -> PodCreate:
        if self.cuda_floor and not self.cuda_versions:
            raise ValueError("a CUDA floor needs at least one version")
        return self


class LogLine(BaseModel):
    """One event of a pod's log stream (``GET /v2/pods/{id}/logs``, Server-Sent Events).

    Attributes:
        id: the event id (RunPod: the line's timestamp), the cursor to resume from.
        ts: when the line was written (UTC).
        source: ``container`` (the container's stdout/stderr) or ``system`` (the host:
            image pull, start, restarts).
        line: the text.
    """

    id: str
    ts: datetime
    source: Literal["container", "system"]
    line: str


@runtime_checkable
class RunPodApi(Protocol):
    """What the provider asks of RunPod, whichever API answers.

    Every method may raise ``RunPodAPIError``, httpx's or the SDK's exceptions;
    ``runpod.errors.classify_exception`` says what each one means.
    """

    name: ApiName
    """``v2`` or ``graphql``: which API answers pod calls."""

    def create_pod(self, create: PodCreate) -> PodRecord:
        """Create one pod; returns it as soon as RunPod has an id for it."""
        ...

    def get_pod(self, pod_id: str) -> PodRecord | None:
        """One pod, or None when RunPod does not know it (404 / ``pod: null``)."""
        ...

    def list_pods(self) -> list[PodRecord]:
        """Every pod of the account (v2: ``GET /v2/pods``, one request)."""
        ...

    def terminate_pod(self, pod_id: str) -> None:
        """Ask RunPod to terminate the pod (v2: ``DELETE /v2/pods/{id}``, 204). Does not
        wait: the caller confirms the pod gone by reading it back."""
        ...

    def get_account_keys(self) -> list[str]:
        """The account's SSH public keys, one OpenSSH line each."""
        ...

    def put_account_keys(self, keys: list[str], *, replacing: list[str]) -> list[str]:
        """Replace the account's SSH keys with ``keys``; returns the list RunPod kept.

        Raises:
            AccountKeysError: ``keys`` is empty or misses a key of ``replacing`` (the
                list just read): refused, nothing sent.
        """
        ...

    def gpu_offers(self, gpu_type_ids: list[str], gpu_count: int) -> dict[str, GpuAvailability]:
        """The catalog's entries for ``gpu_type_ids`` (prices per GPU-hour, availability
        when the API has it); an id RunPod does not know is absent."""
        ...

    def gpu_catalog(self) -> dict[str, GpuAvailability]:
        """Every GPU type of REST v2's catalog, with availability for pods."""
        ...

    def pod_bill(self, pod_id: str, created_at: datetime, ended_at: datetime) -> RunPodBill | None:
        """RunPod's bill for the pod over its life (REST v2 billing); None while RunPod
        has no record yet."""
        ...

    def pod_logs(
        self,
        pod_id: str,
        *,
        source: Literal["container", "system"] | None = None,
        tail: int | None = None,
        last_event_id: str | None = None,
        idle_seconds: float | None = None,
    ) -> Iterator[LogLine]:
        """The pod's log lines as RunPod streams them; resumes after a dropped stream
        from the last event id seen; ends when RunPod closes the stream or sends nothing
        for ``idle_seconds`` (the backend's default when None)."""
        ...
