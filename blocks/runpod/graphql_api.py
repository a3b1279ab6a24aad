"""``GraphQLApi``: the GraphQL fallback behind ``RunPodApi``, through the ``runpod`` SDK.

The pod calls and the account's SSH keys go through the SDK (``client.RunPodClient``:
its mutation builders and its transport, ``POST {RUNPOD_API_BASE_URL}/graphql``), for
accounts or calls REST v2 cannot serve, until RunPod retires GraphQL (early 2027). The
pod reads are one query each with the fields the provider needs
(``machine { podHostId }`` included, which the SDK's own pod query leaves out). The GPU
catalog's availability, billing and pod logs exist only on REST v2: those calls go to a
``RestApi``.

The SDK reads where RunPod is from ``$RUNPOD_API_BASE_URL`` on every call, so this
backend always follows that variable. Values the SDK inlines unescaped are validated or
escaped first (``runpod.blocks``, ``client.graphql_escape``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from prefect_runpod.blocks.runpod.account_keys import check_superset
from prefect_runpod.blocks.runpod.api import ApiName, LogLine, PodCreate, PodRecord, SshLogin
from prefect_runpod.blocks.runpod.billing import RunPodBill
from prefect_runpod.blocks.runpod.catalog import GpuAvailability
from prefect_runpod.blocks.runpod.client import RunPodClient, graphql_escape
from prefect_runpod.blocks.runpod.errors import ErrorKind, classify_exception
from prefect_runpod.blocks.runpod.rest import RestApi
from prefect_runpod.blocks.validation import check_pod_id

__all__ = ["GraphQLApi", "record_from_graphql"]

POD_FIELDS = (
    "id name desiredStatus costPerHr env imageName gpuCount volumeMountPath uptimeSeconds "
    "runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } } "
    "machine { podHostId gpuDisplayName gpuTypeId }"
)
"""What the provider reads of a pod, in one query."""

_STATUS = {"RUNNING": "RUNNING", "EXITED": "EXITED", "TERMINATED": "TERMINATED"}
_LOST = frozenset({"DEAD", "ERROR"})


def _direct(pod: dict[str, Any]) -> SshLogin | None:
    for port in ((pod.get("runtime") or {}).get("ports")) or []:
        if (
            port.get("privatePort") == 22
            and port.get("type") == "tcp"
            and port.get("isIpPublic")
            and port.get("ip")
            and port.get("publicPort")
        ):
            return SshLogin(host=port["ip"], port=int(port["publicPort"]), username="root")
    return None


def record_from_graphql(pod: dict[str, Any]) -> PodRecord:
    """A GraphQL ``Pod`` → ``PodRecord``: ``desiredStatus`` in v2's words (DEAD/ERROR →
    ERROR; CREATED, RESTARTING and the like → STARTING), the gateway login from
    ``machine.podHostId``, direct SSH from ``runtime.ports`` (22/tcp on a public IP, as
    the SDK's own CLI connects)."""
    desired = str(pod.get("desiredStatus") or "")
    status = _STATUS.get(desired) or ("ERROR" if desired in _LOST else "STARTING")
    machine = pod.get("machine") or {}
    env = dict(str(e).partition("=")[::2] for e in pod.get("env") or [] if "=" in str(e))
    host_id = machine.get("podHostId")
    uptime = pod.get("uptimeSeconds")
    created = (
        datetime.now(UTC) - timedelta(seconds=float(uptime))
        if isinstance(uptime, int | float)
        else None
    )
    return PodRecord(
        id=pod["id"],
        name=pod.get("name") or "",
        status=status,  # type: ignore[arg-type]
        runtime_up=bool(pod.get("runtime")),
        cost_per_hr=float(pod.get("costPerHr") or 0.0),
        gpu_type_id=machine.get("gpuTypeId"),
        gpu_display_name=machine.get("gpuDisplayName"),
        gpu_count=int(pod.get("gpuCount") or 1),
        image=pod.get("imageName"),
        env=env,
        workdir=pod.get("volumeMountPath"),
        created_at=created,
        uptime_seconds=float(uptime) if isinstance(uptime, int | float) else None,
        proxy=SshLogin(username=host_id) if host_id else None,
        direct=_direct(pod),
    )


class GraphQLApi:
    """``RunPodApi`` over GraphQL (the ``runpod`` SDK); see the module docstring.

    Args:
        client: the SDK bound to the account's key.
        rest: REST v2, for what GraphQL does not have (availability, billing, logs).
    """

    name: ApiName = "graphql"

    def __init__(self, client: RunPodClient, rest: RestApi) -> None:
        self.client = client
        self.rest = rest

    def __repr__(self) -> str:
        return "GraphQLApi(api_key=SecretStr('**********'))"

    def create_pod(self, create: PodCreate) -> PodRecord:
        """``podFindAndDeployOnDemand`` (the SDK's own mutation builder)."""
        created = self.client.deploy_on_demand(
            name=create.name,
            image_name=create.image,
            gpu_type_id=create.gpu_type_id,
            cloud_type=create.cloud,
            support_public_ip=create.public_ip,
            start_ssh=True,
            data_center_id=create.data_center_id,
            gpu_count=create.gpu_count,
            volume_in_gb=create.volume_gb,
            container_disk_in_gb=create.container_disk_gb,
            min_vcpu_count=1,
            min_memory_in_gb=1,
            docker_args="",
            ports=",".join(create.ports),
            volume_mount_path=create.volume_mount_path,
            env={k: graphql_escape(v) for k, v in create.env.items()},
            allowed_cuda_versions=create.cuda_versions or None,
        )
        host_id = (created.get("machine") or {}).get("podHostId")
        return PodRecord(
            id=created["id"],
            name=create.name,
            status="STARTING",
            gpu_type_id=create.gpu_type_id,
            gpu_count=create.gpu_count,
            image=created.get("imageName") or create.image,
            env=dict(create.env),
            workdir=create.volume_mount_path,
            created_at=datetime.now(UTC),
            proxy=SshLogin(username=host_id) if host_id else None,
        )

    def get_pod(self, pod_id: str) -> PodRecord | None:
        """``pod(input: {podId})``; None for ``pod: null``."""
        query = (
            f'query pod {{ pod(input: {{podId: "{check_pod_id(pod_id)}"}}) {{ {POD_FIELDS} }} }}'
        )
        pod = (self.client.query(query).get("data") or {}).get("pod")
        return record_from_graphql(pod) if pod else None

    def list_pods(self) -> list[PodRecord]:
        """``myself { pods { … } }`` (one query)."""
        answer = self.client.query(f"query myPods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}")
        pods = ((answer["data"] or {}).get("myself") or {}).get("pods") or []
        return [record_from_graphql(p) for p in pods]

    def terminate_pod(self, pod_id: str) -> None:
        """``podTerminate(input: {podId})``."""
        self.client.terminate_pod(check_pod_id(pod_id))

    def get_account_keys(self) -> list[str]:
        """``myself { pubKey }``, one key a line."""
        keys = self.client.get_user().get("pubKey") or ""
        return [line.strip() for line in keys.splitlines() if line.strip()]

    def put_account_keys(self, keys: list[str], *, replacing: list[str]) -> list[str]:
        """``updateUserSettings(input: {pubKey})`` after ``account_keys.check_superset``;
        returns the keys read back."""
        check_superset(keys, replacing)
        self.client.update_user_settings("\n".join(keys))
        return self.get_account_keys()

    def gpu_offers(self, gpu_type_ids: list[str], gpu_count: int) -> dict[str, GpuAvailability]:
        """The SDK's ``get_gpu`` per id (``securePrice``, ``communityPrice``,
        ``lowestPrice.uninterruptablePrice``); an id RunPod does not know is left out."""
        out = {}
        for gpu_id in gpu_type_ids:
            try:
                gpu = self.client.get_gpu(gpu_id, gpu_count)
            except ValueError as exc:
                if classify_exception(exc).kind is ErrorKind.UNKNOWN_GPU:
                    continue
                raise
            lowest = (gpu.get("lowestPrice") or {}).get("uninterruptablePrice")
            out[gpu_id] = GpuAvailability(
                gpu_type_id=gpu_id,
                name=gpu.get("displayName"),
                memory_gb=gpu.get("memoryInGb"),
                secure_usd_per_hr=gpu.get("securePrice"),
                community_usd_per_hr=gpu.get("communityPrice"),
                lowest_usd_per_hr=None if lowest is None else float(lowest),
                max_count=gpu.get("maxGpuCount"),
            )
        return out

    def gpu_catalog(self) -> dict[str, GpuAvailability]:
        """REST v2's catalog (GraphQL has no availability)."""
        return self.rest.gpu_catalog()

    def pod_bill(self, pod_id: str, created_at: datetime, ended_at: datetime) -> RunPodBill | None:
        """REST v2's billing (GraphQL has none)."""
        return self.rest.pod_bill(pod_id, created_at, ended_at)

    def pod_logs(
        self,
        pod_id: str,
        *,
        source: Literal["container", "system"] | None = None,
        tail: int | None = None,
        last_event_id: str | None = None,
        idle_seconds: float | None = None,
    ) -> Iterator[LogLine]:
        """REST v2's log stream (GraphQL has none)."""
        return self.rest.pod_logs(
            pod_id, source=source, tail=tail, last_event_id=last_event_id, idle_seconds=idle_seconds
        )
