"""The shapes of RunPod's REST v2 that prefect-runpod sends and reads (RunPod's v2
OpenAPI schema, version 2.0.0), as pydantic models.

- ``CreatePodRequest`` is the body of ``POST /v2/pods`` **as we build it**: closed
  (an unknown field cannot be set), ``gpu.count`` required (a create without it is
  answered with the misleading capacity error: runpod-mcp PR #77 — the schema's default
  of 1 is not what the server does), the CUDA floor as ``minCudaVersion`` and an explicit
  set as ``allowedCudaVersions`` (never both: RunPod answers 400), ``startSsh`` always.
- ``V2Pod``, ``Problem`` and ``SshKeys`` read RunPod's answers tolerantly (fields RunPod
  adds later are ignored here; the tests check every answer strictly against the
  schema instead).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.runpod.api import PodCreate, PodRecord, SshLogin

__all__ = [
    "CreatePodRequest",
    "GpuRequest",
    "PersistentMount",
    "Problem",
    "SshKeys",
    "V2Pod",
]

MIN_PERSISTENT_GB = 10
"""RunPod v2's floor for a persistent (host-local) volume, GB."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuRequest(_Closed):
    """``gpu`` of a create: one GPU type, how many (required), the CUDA constraint."""

    id: str = Field(min_length=1)
    count: int = Field(ge=1)
    minCudaVersion: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    allowedCudaVersions: list[str] | None = None

    @model_validator(mode="after")
    def _one_cuda_form(self) -> GpuRequest:
        if self.minCudaVersion is not None and self.allowedCudaVersions:
            raise ValueError("minCudaVersion and allowedCudaVersions are exclusive")
        return self


class PersistentMount(_Closed):
    """``mounts.persistent``: host-local storage (GB ≥ 10) at ``path``."""

    size: int = Field(ge=MIN_PERSISTENT_GB)
    path: str


class Mounts(_Closed):
    persistent: PersistentMount | None = None


class CreatePodRequest(_Closed):
    """The body of ``POST /v2/pods`` (see the module docstring). ``body()`` is what is
    sent: unset optional fields are left out, never sent as null."""

    name: str = Field(min_length=1)
    image: str = Field(min_length=1)
    gpu: GpuRequest
    cloud: Literal["SECURE", "COMMUNITY"] = "SECURE"
    dataCenterIds: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[str] = Field(default_factory=list)
    disk: int = Field(ge=1)
    mounts: Mounts | None = None
    startSsh: Literal[True] = True

    @classmethod
    def from_create(cls, create: PodCreate) -> CreatePodRequest:
        """The body for one create.

        Raises:
            SpecError: cloud ``ALL`` (v2 places one cloud per create: the caller fails
                over), or a pod volume under RunPod's 10 GB floor.
        """
        if create.cloud == "ALL":
            raise SpecError("REST v2 places one cloud per create: SECURE or COMMUNITY")
        if 0 < create.volume_gb < MIN_PERSISTENT_GB:
            raise SpecError(
                f"volume_gb {create.volume_gb}: RunPod's pod volume is at least "
                f"{MIN_PERSISTENT_GB} GB (or 0 for none); fix the pod spec"
            )
        versions = list(create.cuda_versions)
        floor = (
            min(versions, key=lambda v: tuple(int(p) for p in v.split("."))) if versions else None
        )
        ports = list(dict.fromkeys(create.ports))
        if create.public_ip and "22/tcp" not in ports:
            ports.append("22/tcp")
        return cls(
            name=create.name,
            image=create.image,
            gpu=GpuRequest(
                id=create.gpu_type_id,
                count=create.gpu_count,
                minCudaVersion=floor if create.cuda_floor else None,
                allowedCudaVersions=None if create.cuda_floor or not versions else versions,
            ),
            cloud=create.cloud,
            dataCenterIds=[create.data_center_id] if create.data_center_id else None,
            env=dict(create.env),
            ports=ports,
            disk=create.container_disk_gb,
            mounts=Mounts(
                persistent=PersistentMount(size=create.volume_gb, path=create.volume_mount_path)
            )
            if create.volume_gb
            else None,
        )

    def body(self) -> dict[str, object]:
        """The JSON body (optional fields left out when unset)."""
        return self.model_dump(exclude_none=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class V2Endpoint(_Open):
    host: str
    port: int
    username: str
    command: str = ""

    def login(self) -> SshLogin:
        return SshLogin(host=self.host, port=self.port, username=self.username)


class V2Ssh(_Open):
    proxy: V2Endpoint | None = None
    direct: V2Endpoint | None = None


class V2Gpu(_Open):
    id: str
    count: int = 1


class V2Mount(_Open):
    path: str | None = None


class V2Mounts(_Open):
    persistent: V2Mount | None = None
    network: list[V2Mount] | None = None


class V2Pod(_Open):
    """A ``Pod`` as RunPod's REST v2 answers it (the fields prefect-runpod reads)."""

    id: str
    name: str = ""
    status: Literal["PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR", "TERMINATED"]
    cost: float = 0.0
    gpu: V2Gpu | None = None
    dataCenterId: str | None = None
    cudaVersion: str | None = None
    image: str | None = None
    env: dict[str, str] | None = None
    ssh: V2Ssh | None = None
    runtime: dict[str, object] | None = None
    mounts: V2Mounts | None = None
    createdAt: datetime | None = None

    def record(self) -> PodRecord:
        """The backend-neutral ``PodRecord``; the gateway login is ``ssh.proxy`` exactly
        as given, direct SSH is ``ssh.direct``."""
        mount = None
        if self.mounts is not None:
            if self.mounts.persistent is not None:
                mount = self.mounts.persistent.path
            elif self.mounts.network:
                mount = self.mounts.network[0].path
        uptime = (self.runtime or {}).get("uptime")
        return PodRecord(
            id=self.id,
            name=self.name,
            status=self.status,
            runtime_up=self.runtime is not None and self.status == "RUNNING",
            cost_per_hr=self.cost,
            gpu_type_id=self.gpu.id if self.gpu else None,
            gpu_display_name=self.gpu.id if self.gpu else None,
            gpu_count=self.gpu.count if self.gpu else 0,
            data_center_id=self.dataCenterId,
            cuda_version=self.cudaVersion,
            image=self.image,
            env=dict(self.env or {}),
            workdir=mount,
            created_at=self.createdAt,
            uptime_seconds=float(uptime) if isinstance(uptime, int | float) else None,
            proxy=self.ssh.proxy.login() if self.ssh and self.ssh.proxy else None,
            direct=self.ssh.direct.login() if self.ssh and self.ssh.direct else None,
        )


class Problem(_Open):
    """An RFC 9457 problem object, as RunPod's REST v2 answers errors."""

    title: str = ""
    status: int | None = None
    detail: str = ""
    errors: list[str] = Field(default_factory=list)


class SshKeys(_Open):
    """``{"keys": [...]}`` of ``/v2/account/ssh-keys``."""

    keys: list[str] = Field(default_factory=list)
