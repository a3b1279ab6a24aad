"""RunPod blocks: the API key, and the spec of the pod to rent.

Register with ``prefect block register -m prefect_runpod.blocks``. Validation lives in
plain functions (``validate_*``) shared with the provider, because the ``runpod`` SDK
inlines every value into GraphQL text unescaped: a name or id that is not plain text
must fail here, with ``SpecError``, before any request is sent.
"""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Literal

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation import (
    POD_NAME_MAX_CHARS,
    SECRET_ENV_NAME,
    check_name_prefix,
    check_pod_id,
    constrained,
    find_token_shape,
)

if TYPE_CHECKING:
    from datetime import datetime

    from prefect_runpod.blocks.runpod.api import RunPodApi
    from prefect_runpod.blocks.runpod.billing import RunPodBill
    from prefect_runpod.blocks.runpod.client import RunPodClient
    from prefect_runpod.blocks.runpod.provider import RunPodProvider
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

__all__ = [
    "DEFAULT_GPU_TYPE_IDS",
    "DEFAULT_IMAGE",
    "RunPodCredentials",
    "RunPodPodSpec",
    "merge_cuda_versions",
    "validate_env",
    "validate_gpu_type_id",
    "validate_pod_id",
    "validate_pod_name",
]

DEFAULT_IMAGE = "runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04"
DEFAULT_GPU_TYPE_IDS = ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090", "NVIDIA RTX A5000"]

_POD_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{POD_NAME_MAX_CHARS - 1}}}")
"""Pod names: dstack notes 60 characters work; plain characters keep GraphQL text safe."""
_GPU_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._/()+-]{0,99}")
_DC_ID = re.compile(r"[A-Za-z0-9-]{1,40}")
_CUDA = re.compile(r"\d{1,2}\.\d{1,2}")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_PORTS = re.compile(r"\d{1,5}/(tcp|http|udp)(,\d{1,5}/(tcp|http|udp))*")
_MOUNT = re.compile(r"/[A-Za-z0-9._/-]{0,200}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ENV_VALUE_MAX_CHARS = 32768


def _check(pattern: re.Pattern[str], value: object, what: str, hint: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(f"invalid {what} {value!r}: {hint}")
    return value


def validate_pod_name(name: str) -> str:
    """A pod name safe to inline in GraphQL: ``[A-Za-z0-9._-]``, 1–60 characters.

    Raises:
        SpecError: otherwise (no request is sent).
    """
    return _check(_POD_NAME, name, "pod name", "use letters, digits, '.', '_', '-' (≤ 60)")


def validate_pod_id(pod_id: str) -> str:
    """A RunPod pod id: lowercase letters and digits, whole string
    (``validation.check_pod_id``).

    Raises:
        SpecError: otherwise (no request is sent).
    """
    return check_pod_id(pod_id)


def validate_gpu_type_id(gpu_type_id: str) -> str:
    """A GPU type id such as ``NVIDIA GeForce RTX 3090`` (plain text only).

    Raises:
        SpecError: otherwise.
    """
    return _check(_GPU_ID, gpu_type_id, "GPU type id", "see runpod.get_gpus() for the ids")


def validate_env(env: dict[str, str]) -> dict[str, str]:
    """Check a pod environment: POSIX names, no NUL, no secrets.

    Secrets never go into pod env: RunPod shows env in its console and API answers
    (and the API request would carry them); they reach the pod through the console.

    Raises:
        SpecError: on a bad name, a value with NUL, a value over 32768 characters, or a
            name/value that looks like a secret (``HF_TOKEN``, ``hf_…``).
    """
    for key, value in env.items():
        _check(_ENV_KEY, key, "env name", "use [A-Za-z_][A-Za-z0-9_]*")
        if key != "PUBLIC_KEY" and SECRET_ENV_NAME.fullmatch(key):
            raise SpecError(
                f"env {key} looks like a secret; secrets are never put in pod env (RunPod "
                "shows env in its API). Give it to the run as a secret so it is exported "
                "through the console instead."
            )
        if not isinstance(value, str):
            raise SpecError(f"env {key}: value must be a string, got {type(value).__name__}")
        if "\x00" in value or len(value) > _ENV_VALUE_MAX_CHARS:
            raise SpecError(f"env {key}: value has a NUL byte or is over 32768 characters")
        if find_token_shape(value):
            raise SpecError(
                f"env {key}: the value looks like a token; pass it as a secret, not pod env"
            )
    return env


def merge_cuda_versions(spec_versions: list[str], plan_versions: list[str]) -> list[str]:
    """The CUDA versions a host may have: both lists must allow it (empty = any).

    Args:
        spec_versions: the pod spec's ``allowed_cuda_versions``.
        plan_versions: the env plan's (``PodRequest.allowed_cuda_versions``).

    Returns:
        The intersection in the spec's order, or whichever list is non-empty.

    Raises:
        SpecError: when both are given and share no version, or a version is malformed.
    """
    for v in [*spec_versions, *plan_versions]:
        _check(_CUDA, v, "CUDA version", "use MAJOR.MINOR such as 12.4")
    if not spec_versions or not plan_versions:
        return list(dict.fromkeys(spec_versions or plan_versions))
    merged = [v for v in dict.fromkeys(spec_versions) if v in plan_versions]
    if not merged:
        raise SpecError(
            f"allowed CUDA versions {spec_versions} (pod spec) and {plan_versions} (env plan) "
            "share none; widen the pod spec's allowed_cuda_versions"
        )
    return merged


class RunPodCredentials(Block):
    """A RunPod API key, where RunPod is, and which API to speak. The key is unwrapped
    only at the call and never logged. A key with whitespace or a control character in
    it is refused where a run reads it, naming the block, never the key
    (docs/secrets.md)."""

    _block_type_name = "RunPod Credentials"
    _block_type_slug = "runpod-credentials"
    _documentation_url = "https://docs.runpod.io/get-started/api-keys"  # type: ignore[assignment]
    _code_example = """```python
from prefect_runpod.blocks.runpod.blocks import RunPodCredentials

credentials = RunPodCredentials.load("BLOCK_NAME")
client = credentials.get_client()
```"""

    api_key: SecretStr = Field(
        description="RunPod API key (console → Settings → API Keys); sent only as the "
        "Authorization header.",
    )
    api_base_url: str | None = Field(
        default=None,
        title="API base URL",
        description="Where RunPod is, without a path (REST v2 at <base>/v2, the runpod "
        "SDK's GraphQL beside it); empty means $RUNPOD_API_BASE_URL or https://api.runpod.io.",
    )
    api: Literal["v2", "graphql"] | None = Field(
        default=None,
        title="API",
        description="Which RunPod API pod calls use: v2 (REST) or graphql (the runpod SDK, "
        "until RunPod retires it); empty means the package default.",
    )
    rest_base_url: str | None = Field(
        default=None,
        title="REST base URL (obsolete)",
        description="Obsolete and ignored: REST v1 was retired on 2026-11-15; kept so "
        "blocks saved before still load. Use api_base_url.",
    )

    @field_validator("api_base_url")
    @classmethod
    def _check_api_base_url(cls, value: str | None) -> str | None:
        from prefect_runpod.blocks.runpod.rest import resolve_base_url

        return None if value is None else resolve_base_url(value)

    @field_validator("rest_base_url")
    @classmethod
    def _obsolete_rest_base_url(cls, value: str | None) -> str | None:
        if value:
            warnings.warn(
                "RunPodCredentials.rest_base_url is obsolete and ignored: RunPod retired "
                "REST v1 on 2026-11-15; set api_base_url (a base URL without a path)",
                DeprecationWarning,
                stacklevel=2,
            )
        return value

    @property
    def api_name(self) -> Literal["v2", "graphql"]:
        """The API pod calls use: ``api``, else ``runpod.api.DEFAULT_API``."""
        from prefect_runpod.blocks.runpod.api import DEFAULT_API

        return self.api or DEFAULT_API

    def get_client(self) -> RunPodClient:
        """A ``RunPodClient`` bound to this key (the ``runpod`` SDK underneath)."""
        from prefect_runpod.blocks.runpod.client import RunPodClient

        return RunPodClient(self.api_key)

    def get_api(self) -> RunPodApi:
        """The RunPod client for pod calls: ``RestApi`` (v2) or ``GraphQLApi`` (the
        SDK), per ``api_name``; both fill in ``runpod.api.RunPodApi``.

        Raises:
            SpecError: ``api_base_url`` (or ``$RUNPOD_API_BASE_URL``) is not a base URL.
        """
        import os

        from prefect_runpod.blocks.runpod.graphql_api import GraphQLApi
        from prefect_runpod.blocks.runpod.rest import API_BASE_ENV, RestApi, resolve_base_url

        rest = RestApi(self.api_key, base_url=self.api_base_url)
        if self.api_name == "v2":
            return rest
        if self.api_base_url and self.api_base_url != resolve_base_url(
            os.environ.get(API_BASE_ENV)
        ):
            warnings.warn(
                f"api_base_url {self.api_base_url} reaches REST v2 only: the runpod SDK's "
                f"GraphQL reads ${API_BASE_ENV} on every call; set it to the same base",
                UserWarning,
                stacklevel=2,
            )
        return GraphQLApi(self.get_client(), rest)

    def fetch_pod_bill(
        self, pod_id: str, created_at: datetime, ended_at: datetime
    ) -> RunPodBill | None:
        """RunPod's own bill for ``pod_id`` over its life, from REST v2's billing API
        (``runpod.billing.fetch_pod_bill``; whichever ``api`` pod calls use, billing is
        v2's); None while RunPod has no record yet.

        Raises:
            ProviderAuthError / ProviderTransientError / ProviderError: as
                ``fetch_pod_bill``.
        """
        from prefect_runpod.blocks.runpod.billing import fetch_pod_bill

        return fetch_pod_bill(
            self.api_key, pod_id, created_at, ended_at, base_url=self.api_base_url
        )


class RunPodPodSpec(Block):
    """What pod to rent on RunPod, with the GPU types to fall back over, in order."""

    _block_type_name = "RunPod Pod Spec"
    _block_type_slug = "runpod-pod-spec"
    _documentation_url = "https://docs.runpod.io/pods/overview"  # type: ignore[assignment]
    _code_example = """```python
from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec

spec = RunPodPodSpec.load("BLOCK_NAME")
provider = spec.get_provider(credentials, ssh_key)
```"""

    gpu_type_ids: list[str] = Field(
        default_factory=lambda: list(DEFAULT_GPU_TYPE_IDS),
        min_length=1,
        description="GPU type ids to try in order when one has no capacity "
        "(see runpod.get_gpus()).",
    )
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = Field(
        default="SECURE", description="RunPod cloud to rent from: SECURE, COMMUNITY or ALL."
    )
    gpu_count: int = Field(default=1, ge=1, le=8, description="GPUs per pod.")
    image_name: str = Field(default=DEFAULT_IMAGE, description="Container image of the pod.")
    container_disk_gb: int = Field(
        default=20, ge=1, le=2000, description="Container disk size in GB (lost on terminate)."
    )
    volume_gb: int = Field(
        default=20,
        ge=0,
        le=10000,
        description="Pod volume size in GB, mounted at volume_mount_path (0 for none; RunPod "
        "asks at least 10). The run's directory lives there, so it survives a container "
        "restart; REST v2 reports a pod's working directory only as this mount's path.",
    )
    volume_mount_path: str = Field(
        default="/workspace", description="Where the pod volume is mounted in the pod."
    )
    ports: str = Field(
        default="22/tcp",
        description="Exposed ports, e.g. 22/tcp,8888/http; 22/tcp on a public IP enables "
        "direct SSH.",
    )
    support_public_ip: bool = Field(
        default=True, description="Ask for a public IP (needed for direct SSH on 22/tcp)."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Non-secret environment variables for the pod."
    )
    data_center_ids: list[str] = Field(
        default_factory=list,
        description="Data centers to try in order (e.g. EU-RO-1); empty for any.",
    )
    allowed_cuda_versions: list[str] = Field(
        default_factory=list,
        description="CUDA versions the host driver must support (e.g. 12.4); empty for any.",
    )
    max_usd_per_hour: constrained("max_usd_per_hour", optional=True) = Field(  # type: ignore[valid-type]
        default=None, description="Skip GPU types priced above this, in USD per hour."
    )
    name_prefix: str = Field(
        default="prft", description="Pod names are <name_prefix>-<flow run id>."
    )

    @field_validator("gpu_type_ids")
    @classmethod
    def _gpu_ids(cls, value: list[str]) -> list[str]:
        return [validate_gpu_type_id(v) for v in value]

    @field_validator("image_name")
    @classmethod
    def _image(cls, value: str) -> str:
        return _check(_IMAGE, value, "image name", "use registry/name:tag characters only")

    @field_validator("volume_mount_path")
    @classmethod
    def _mount(cls, value: str) -> str:
        return _check(_MOUNT, value, "mount path", "absolute")

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: str) -> str:
        value = value.replace(" ", "")
        return _check(_PORTS, value, "ports", "use PORT/tcp or PORT/http, comma-separated")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        return validate_env(value)

    @field_validator("data_center_ids")
    @classmethod
    def _dcs(cls, value: list[str]) -> list[str]:
        return [_check(_DC_ID, v, "data center id", "e.g. EU-RO-1") for v in value]

    @field_validator("allowed_cuda_versions")
    @classmethod
    def _cuda(cls, value: list[str]) -> list[str]:
        return merge_cuda_versions(value, [])

    @field_validator("name_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_name_prefix(value)

    def pod_name(self, flow_run_id: str) -> str:
        """``<name_prefix>-<flow_run_id>``, validated.

        Raises:
            SpecError: when the result is not a safe pod name.
        """
        return validate_pod_name(f"{self.name_prefix}-{flow_run_id}")

    def get_provider(
        self,
        credentials: RunPodCredentials,
        ssh_key: RunPodSSHKey,
        **kwargs: float | int,
    ) -> RunPodProvider:
        """A ``RunPodProvider`` renting pods of this spec.

        Args:
            credentials: the API key block.
            ssh_key: the SSH key block (key pair, gateway host/port/pinned key).
            **kwargs: ``retry_initial_delay_seconds``, ``retry_max_attempts``.
        """
        from prefect_runpod.blocks.runpod.provider import RunPodProvider

        return RunPodProvider(credentials, self, ssh_key, **kwargs)  # type: ignore[arg-type]
