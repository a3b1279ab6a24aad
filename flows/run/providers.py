"""Build the pod provider and the SSH key a run uses, from the run's parameters alone,
so the crash/cancel hooks and the reaper (which may run in another process) rebuild
the same provider the flow used; and describe the pod a run is about to rent
(``planned_pod``), so preflight can hold the run against it before renting."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import KeyPair, generate_keypair
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider import PodProvider
from prefect_runpod.blocks.secret_mask import check_secret
from prefect_runpod.blocks.validation import load_block, pydantic_reason

__all__ = ["PlannedPod", "build_provider", "planned_pod"]


def build_provider(
    params: dict[str, Any], *, need_ssh_key: bool = True
) -> tuple[PodProvider, KeyPair]:
    """The provider and SSH key pair for a run's parameters.

    ``local``: a ``LocalPodProvider`` (mode, price and image profile from the
    parameters) and a fresh per-run key pair. ``runpod``: a ``RunPodProvider`` from the
    named blocks (``runpod_credentials_block``, ``runpod_spec_block``,
    ``ssh_key_block``); a block that is named must exist. Only without a name, the API
    key is read from ``RUNPOD_API_KEY`` and the SSH key from ``RUNPOD_SSH_KEY_PATH``
    (default ``~/.ssh/id_ed25519_runpod``).

    Args:
        params: the run's parameters (see above).
        need_ssh_key: False for callers that only list and terminate pods (hooks, the
            reaper, the CLI's ``pods``/``terminate``): without a saved key they get a
            throwaway one, never used to connect.

    Raises:
        SpecError: a named block is not saved (the saved ones of its type are listed),
            RunPod is asked for and no credentials (or, when needed, no SSH key) can be
            found, or ``local_image`` names no image profile.
        SecretShapeError: the API key holds whitespace or a control character (one
            trailing newline is stripped, and said; ``blocks.secret_mask.check_secret``).
    """
    kind = params.get("provider", "local")
    if kind == "local":
        from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

        provider = LocalPodProvider(
            mode=params.get("local_mode") or "gateway",
            cost_per_hr=float(params.get("local_cost_per_hr") or 0.0),
            image=params.get("local_image") or "plain",
        )
        return provider, generate_keypair("prefect-runpod-local")
    if kind == "runpod":
        return _runpod_provider(params, need_ssh_key)
    raise SpecError(f"provider {kind!r} is not one of: local, runpod")


def _runpod_provider(params: dict[str, Any], need_ssh_key: bool) -> tuple[PodProvider, KeyPair]:
    from prefect_runpod.blocks.keys import public_key_line
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

    def _load(cls: Any, param: str) -> Any:
        name = params.get(param)
        return load_block(cls, name, param) if name else None

    creds = _load(RunPodCredentials, "runpod_credentials_block")
    if creds is None:
        api_key = os.environ.get("RUNPOD_API_KEY")
        if not api_key:
            raise SpecError(
                "RunPod needs an API key: save a RunPodCredentials block "
                "(prefect block register -m prefect_runpod.blocks) and pass "
                "--runpod-credentials NAME, or set RUNPOD_API_KEY"
            )
        creds = RunPodCredentials(api_key=SecretStr(check_secret(api_key, "RUNPOD_API_KEY")))
    else:
        what = f"the api_key of the RunPodCredentials block {params['runpod_credentials_block']!r}"
        key = creds.api_key.get_secret_value()
        creds.api_key = SecretStr(check_secret(key, what, fix="remove it and save the block again"))
    spec = _load(RunPodPodSpec, "runpod_spec_block") or RunPodPodSpec()
    if params.get("gpu_type_ids"):
        spec = spec.model_copy(update={"gpu_type_ids": list(params["gpu_type_ids"])})
        try:
            spec = RunPodPodSpec.model_validate(spec.model_dump())  # validate the ids
        except ValueError as exc:
            raise SpecError(f"gpu_type_ids (--gpu-type): {pydantic_reason(exc)}") from None
    key_block = _load(RunPodSSHKey, "ssh_key_block")
    if key_block is None:
        key_path = os.path.expanduser(
            os.environ.get("RUNPOD_SSH_KEY_PATH", "~/.ssh/id_ed25519_runpod")
        )
        if not os.path.isfile(key_path) and not need_ssh_key:
            key_block = RunPodSSHKey.generate(comment="prefect-runpod-lister")
        elif not os.path.isfile(key_path):
            raise SpecError(
                f"no SSH key for RunPod: {key_path} does not exist; create one with "
                "`ssh-keygen -t ed25519 -f ~/.ssh/id_ed25519_runpod -N ''`, add its .pub at "
                "account level, or save a RunPodSSHKey block and pass --ssh-key NAME"
            )
        else:
            with open(key_path, encoding="utf-8") as fh:
                private = SecretStr(fh.read())
            key_block = RunPodSSHKey(private_key=private, public_key=public_key_line(private))
    gateway_host = os.environ.get("RUNPOD_SSH_GATEWAY_HOST")
    gateway_port = os.environ.get("RUNPOD_SSH_GATEWAY_PORT")
    if gateway_host:
        key_block.gateway_host = gateway_host
    if gateway_port:
        key_block.gateway_port = int(gateway_port)
    provider = spec.get_provider(creds, key_block)
    keypair = KeyPair(private_key=key_block.get_private_key(), public_key=key_block.public_key)
    return provider, keypair


@dataclass(frozen=True)
class PlannedPod:
    """The pod a run is about to rent, as far as it is known before renting.

    Attributes:
        description: the pod in words (``a local pod in gateway mode``).
        handle: a stand-in handle with the endpoints the pod will offer (no pod id yet),
            for the transfer methods' ``unavailable`` checks.
        disk_bytes: room for the bundle where it lands (the pod's workdir), or None
            when not known.
        disk_description: that disk in words (``the pod's 20 GB container disk``).
    """

    description: str
    handle: PodHandle
    disk_bytes: int | None
    disk_description: str


def planned_pod(provider: PodProvider, name: str) -> PlannedPod:
    """Describe the pod ``provider`` would rent under ``name`` (nothing is rented).

    Local pod: its SSH mode decides the endpoints (gateway: PTY only; direct: exec and
    SFTP) and the pod workspace's filesystem the disk. RunPod: the gateway always, a
    direct endpoint when the spec exposes ``22/tcp`` on a public IP (whether the host
    grants one shows only once the pod runs, and is checked again then), and the
    volume (when mounted at the workdir) or container disk the spec asks for.
    """
    pending = "(not rented yet)"
    gateway = SSHEndpoint(host="ssh.runpod.io", port=22, user=pending, mode="gateway")
    spec = getattr(provider, "spec", None)
    if provider.provider_name == "runpod" and spec is not None:
        direct = "22/tcp" in spec.ports.split(",") and spec.support_public_ip
        handle = PodHandle(
            pod_id=pending,
            name=name,
            provider="runpod",
            ssh=gateway,
            direct_ssh=SSHEndpoint(host="0.0.0.0", port=22, user="root", mode="direct")
            if direct
            else None,
        )
        on_volume = spec.volume_gb > 0 and spec.volume_mount_path.rstrip("/") == handle.workdir
        size_gb = spec.volume_gb if on_volume else spec.container_disk_gb
        what = "volume" if on_volume else "container disk"
        return PlannedPod(
            description=f"a RunPod pod ({'gateway and direct SSH' if direct else 'gateway SSH only'})",
            handle=handle,
            disk_bytes=size_gb * 10**9,
            disk_description=f"the pod's {size_gb} GB {what}",
        )
    mode: Literal["gateway", "direct"] = getattr(provider, "mode", "gateway")
    local = SSHEndpoint(host="127.0.0.1", port=22, user="root", mode=mode)
    handle = PodHandle(
        pod_id=pending,
        name=name,
        provider="local",
        ssh=local,
        direct_ssh=local if mode == "direct" else None,
    )
    home = Path(getattr(provider, "home", Path.home()))
    while not home.exists() and home != home.parent:
        home = home.parent
    free = shutil.disk_usage(home).free
    described = "PTY only, like RunPod's gateway" if mode == "gateway" else "exec and SFTP"
    return PlannedPod(
        description=f"a local pod in {mode} mode ({described})",
        handle=handle,
        disk_bytes=free,
        disk_description=f"the free space under {home}",
    )
