"""Build the pod provider and the SSH key a run uses, from the run's parameters alone,
so the crash/cancel hooks and the reaper (which may run in another process) rebuild
the same provider the flow used."""

from __future__ import annotations

import os
from typing import Any

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import KeyPair, generate_keypair
from prefect_runpod.blocks.provider import PodProvider

__all__ = ["build_provider"]


def build_provider(
    params: dict[str, Any], *, need_ssh_key: bool = True
) -> tuple[PodProvider, KeyPair]:
    """The provider and SSH key pair for a run's parameters.

    ``local``: a ``LocalPodProvider`` (mode and price from the parameters) and a fresh
    per-run key pair. ``runpod``: a ``RunPodProvider`` from the named blocks
    (``runpod_credentials_block``, ``runpod_spec_block``, ``ssh_key_block``); without
    saved blocks, the API key is read from ``RUNPOD_API_KEY`` and the SSH key from
    ``RUNPOD_SSH_KEY_PATH`` (default ``~/.ssh/id_ed25519_runpod``).

    Args:
        params: the run's parameters (see above).
        need_ssh_key: False for callers that only list and terminate pods (hooks, the
            reaper, the CLI's ``pods``/``terminate``): without a saved key they get a
            throwaway one, never used to connect.

    Raises:
        SpecError: when RunPod is asked for and no credentials (or, when needed, no
            SSH key) can be found.
    """
    kind = params.get("provider", "local")
    if kind == "local":
        from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

        provider = LocalPodProvider(
            mode=params.get("local_mode", "gateway"),
            cost_per_hr=float(params.get("local_cost_per_hr", 0.0) or 0.0),
        )
        return provider, generate_keypair("prefect-runpod-local")
    if kind == "runpod":
        return _runpod_provider(params, need_ssh_key)
    raise SpecError(f"provider {kind!r} is not one of: local, runpod")


def _runpod_provider(params: dict[str, Any], need_ssh_key: bool) -> tuple[PodProvider, KeyPair]:
    from prefect_runpod.blocks.keys import public_key_line
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

    def _load(cls: Any, name: str | None) -> Any:
        if not name:
            return None
        try:
            return cls.load(name)
        except ValueError:
            return None

    creds = _load(RunPodCredentials, params.get("runpod_credentials_block"))
    if creds is None:
        api_key = os.environ.get("RUNPOD_API_KEY")
        if not api_key:
            raise SpecError(
                "RunPod needs an API key: save a RunPodCredentials block "
                "(prefect block register -m prefect_runpod.blocks) and pass "
                "--runpod-credentials NAME, or set RUNPOD_API_KEY"
            )
        creds = RunPodCredentials(api_key=SecretStr(api_key))
    spec = _load(RunPodPodSpec, params.get("runpod_spec_block")) or RunPodPodSpec()
    if params.get("gpu_type_ids"):
        spec = spec.model_copy(update={"gpu_type_ids": list(params["gpu_type_ids"])})
        spec = RunPodPodSpec.model_validate(spec.model_dump())  # validate the ids
    key_block = _load(RunPodSSHKey, params.get("ssh_key_block"))
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
