"""The ``runpod`` work pool's job variables and the job configuration a flow run gets
from them (docs/worker.md#job-variables).

``RunPodJobVariables`` is the schema of the pool's base job template: every field has a
default and a description, shown by the UI and by ``prefect work-pool inspect``.
``RunPodJobConfiguration`` is what the worker receives for one flow run, the same
fields rendered from the template, plus the deployment the run came from.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.workers.base import BaseJobConfiguration, BaseVariables
from pydantic import Field, PrivateAttr

from prefect_runpod.blocks.provider import PodProvider
from prefect_runpod.blocks.provider_registry import provider_names
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_HEARTBEAT_STALE_SECONDS,
    DEFAULT_MAX_RUNTIME_SECONDS,
    DEFAULT_NAME_PREFIX,
    DEFAULT_POD_LIFETIME_SECONDS,
    DEFAULT_PROVIDER,
    DEFAULT_TERMINATE_TIMEOUT_SECONDS,
)

__all__ = ["POD_FIELDS", "RunPodJobConfiguration", "RunPodJobVariables", "with_spec"]

POD_FIELDS: dict[str, tuple[Any, Any, str]] = {
    "provider": (
        Literal[tuple(provider_names())],  # type: ignore[misc]
        DEFAULT_PROVIDER,
        "Where the pod is rented: 'local' (a pod on the worker's machine, the embedded "
        "default, free) or 'runpod'.",
    ),
    "image": (
        str | None,
        None,
        "RunPod: the pod's container image (default: the spec block's, else RunPod's "
        "PyTorch image).",
    ),
    "gpu_type_ids": (
        list[str],
        [],
        "RunPod: GPU type ids in order of preference, exactly as RunPod's catalog names "
        "them (e.g. 'NVIDIA GeForce RTX 4090'); empty for the spec block's.",
    ),
    "gpu_count": (int, 1, "RunPod: GPUs per pod (1 to 8)."),
    "cloud_type": (
        Literal["SECURE", "COMMUNITY", "ALL"] | None,
        None,
        "RunPod: SECURE, COMMUNITY or ALL (default: the spec block's).",
    ),
    "data_center_ids": (
        list[str],
        [],
        "RunPod: data centres the pod may be placed in (e.g. 'EU-RO-1'); empty for any.",
    ),
    "container_disk_gb": (
        int | None,
        None,
        "RunPod: the container disk, GB (default: the spec block's).",
    ),
    "allowed_cuda_versions": (
        list[str],
        [],
        "RunPod: CUDA versions the host's driver must support (e.g. '12.4'); empty for any.",
    ),
    "requirements": (
        list[str],
        [],
        "pip requirement specifiers installed on the pod before the flow starts (e.g. "
        "'pandas>=2', 'name @ URL'), into the Python that runs it; checked before any pod "
        "is rented.",
    ),
    "runpod_credentials_block": (
        str | None,
        None,
        "RunPod: the name of a saved RunPodCredentials block (default: RUNPOD_API_KEY in "
        "the worker's environment).",
    ),
    "runpod_spec_block": (
        str | None,
        None,
        "RunPod: the name of a saved RunPodPodSpec block the fields above override.",
    ),
    "ssh_key_block": (
        str | None,
        None,
        "RunPod: the name of a saved RunPodSSHKey block (default: RUNPOD_SSH_KEY_PATH, "
        "else ~/.ssh/id_ed25519_runpod).",
    ),
    "max_usd_per_hour": (
        float | None,
        None,
        "The most the pod may cost, USD/h: a pod priced above it is never kept.",
    ),
    "max_runtime_seconds": (
        float,
        DEFAULT_MAX_RUNTIME_SECONDS,
        "The flow run's runtime cap on the pod, s: past it the flow process is stopped, the "
        "pod ended and the run marked Crashed.",
    ),
    "heartbeat_stale_seconds": (
        float,
        DEFAULT_HEARTBEAT_STALE_SECONDS,
        "Dead-man switch: the pod ends itself when the worker's heartbeat is older than "
        "this, s (a worker that died).",
    ),
    "pod_lifetime_seconds": (
        float,
        DEFAULT_POD_LIFETIME_SECONDS,
        "Dead-man switch: the pod ends itself after this long whatever happens, s.",
    ),
    "terminate_timeout_seconds": (
        float,
        DEFAULT_TERMINATE_TIMEOUT_SECONDS,
        "How long the worker waits for the provider to confirm the pod gone, s.",
    ),
    "name_prefix": (
        str,
        DEFAULT_NAME_PREFIX,
        "Pods are named '<name_prefix>-<flow_run_id>'; the reaper finds them by it.",
    ),
    "prefect_api_url_for_pod": (
        str | None,
        None,
        "The Prefect API URL as the pod must use it, when the worker's own (PREFECT_API_URL) "
        "is one a RunPod pod cannot reach (loopback, link-local, private).",
    ),
    "local_image": (
        str,
        "plain",
        "Local pod: the image profile whose login environment the pod reproduces.",
    ),
    "local_mode": (
        Literal["gateway", "direct"],
        "gateway",
        "Local pod: 'gateway' (PTY only, like RunPod's SSH gateway) or 'direct' (exec and SFTP).",
    ),
}
"""Every pod job variable: ``name: (type, default, description)``; one table for the
variables' schema and the configuration's fields."""


def _fields(template: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, (kind, default, description) in POD_FIELDS.items():
        extra: dict[str, Any] | None = {"template": "{{ " + name + " }}"} if template else None
        field = Field(default=default, description=description, json_schema_extra=extra)  # type: ignore[arg-type]
        fields[name] = (kind, field)
    return fields


def _with_fields(name: str, base: type, template: bool, doc: str) -> type:
    from pydantic import create_model

    model: type = create_model(name, __base__=base, __doc__=doc, **_fields(template))
    model.__module__ = __name__
    return model


_VariablesBase = _with_fields(
    "_VariablesBase",
    BaseVariables,
    False,
    "The pod job variables on top of Prefect's own (name, env, labels, command).",
)
_ConfigurationBase = _with_fields(
    "_ConfigurationBase",
    BaseJobConfiguration,
    True,
    "The pod fields on top of Prefect's own job configuration.",
)


class RunPodJobVariables(_VariablesBase):  # type: ignore[misc, valid-type]
    """The ``runpod`` pool's job variables: Prefect's ``name``, ``env``, ``labels`` and
    ``command`` (Prefect's default: execute the flow run), and ``POD_FIELDS``: the
    provider, the pod spec, the blocks, the caps and the dead-man's limits."""


class RunPodJobConfiguration(_ConfigurationBase):  # type: ignore[misc, valid-type]
    """One flow run's job configuration: the job variables rendered for it.

    Attributes:
        POD_FIELDS: as ``RunPodJobVariables``.
        env: the flow process's environment (Prefect's settings and the run's ids among
            them); the API URL and key never travel in it: the worker hands them to the
            pod's shell hidden.
        deployment: the deployment the run came from (its entrypoint and pull steps),
            set when the worker prepares the configuration.
    """

    _deployment: Any = PrivateAttr(default=None)

    def prepare_for_flow_run(
        self,
        flow_run: Any,
        deployment: Any = None,
        flow: Any = None,
        work_pool: Any = None,
        worker_name: str | None = None,
        worker_id: Any = None,
    ) -> None:
        """Prefect's preparation (env, labels, name, command), the deployment kept."""
        super().prepare_for_flow_run(
            flow_run,
            deployment=deployment,
            flow=flow,
            work_pool=work_pool,
            worker_name=worker_name,
            worker_id=worker_id,
        )
        self._deployment = deployment

    @property
    def deployment(self) -> Any:
        """The run's deployment, or None for a run without one."""
        return self._deployment

    def provider_params(self) -> dict[str, Any]:
        """The parameters the provider registry builds a provider from
        (``flows.run.providers.build_provider``), as a fine-tune's would be."""
        return {
            "provider": self.provider,
            "runpod_credentials_block": self.runpod_credentials_block,
            "runpod_spec_block": self.runpod_spec_block,
            "ssh_key_block": self.ssh_key_block,
            "gpu_type_ids": list(self.gpu_type_ids),
            "local_mode": self.local_mode,
            "local_image": self.local_image,
        }


def with_spec(provider: PodProvider, config: RunPodJobConfiguration) -> PodProvider:
    """A RunPod provider whose spec takes the job variables that are set (image, GPU
    count, cloud, data centres, disk, CUDA floor, price cap); any other as it is."""
    spec = getattr(provider, "spec", None)
    if spec is None:  # a provider without a pod spec (the local pod) takes none of them
        return provider
    update: dict[str, Any] = {
        "gpu_count": config.gpu_count,
        "name_prefix": config.name_prefix,
    }
    for field, value in (
        ("image_name", config.image),
        ("cloud_type", config.cloud_type),
        ("container_disk_gb", config.container_disk_gb),
        ("max_usd_per_hour", config.max_usd_per_hour),
    ):
        if value is not None:
            update[field] = value
    for field, values in (
        ("data_center_ids", config.data_center_ids),
        ("allowed_cuda_versions", config.allowed_cuda_versions),
    ):
        if values:
            update[field] = list(values)
    provider.spec = type(spec).model_validate(spec.model_dump() | update)  # type: ignore[attr-defined]
    return provider
