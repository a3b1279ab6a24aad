"""Build the pod provider and the SSH key a run uses, from the run's parameters alone,
so the crash/cancel hooks and the reaper (which may run in another process) rebuild
the same provider the flow used; and describe the pod a run is about to rent
(``planned_pod``), so preflight can hold the run against it before renting.

Which providers exist, and how each is built, is the provider packages' own
(``blocks.provider_registry``, each class's ``from_params``): nothing here knows one by
name."""

from __future__ import annotations

import os
from typing import Any, cast

from prefect_runpod.blocks.keys import KeyPair
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider import Capability, PodProvider
from prefect_runpod.blocks.provider_capabilities import PlannedPod
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER

__all__ = ["PlannedPod", "build_provider", "planned_pod", "ssh_key_file"]


def build_provider(
    params: dict[str, Any], *, need_ssh_key: bool = True
) -> tuple[PodProvider, KeyPair]:
    """The provider and SSH key pair for a run's parameters: the class registered under
    ``params["provider"]`` builds itself from them (``from_params``). The local pod: its
    mode, price and image profile, a fresh per-run key pair. RunPod: the named blocks
    (``runpod_credentials_block``, ``runpod_spec_block``, ``ssh_key_block``), a block that
    is named must exist; only without a name, ``RUNPOD_API_KEY`` and
    ``RUNPOD_SSH_KEY_PATH`` (default ``~/.ssh/id_ed25519_runpod``).

    Args:
        params: the run's parameters (see above).
        need_ssh_key: False for callers that only list and terminate pods (hooks, the
            reaper, the CLI's ``pods``/``terminate``): without a saved key they get a
            throwaway one, never used to connect.

    Raises:
        SpecError: no provider of that name, a named block is not saved, RunPod is
            asked for and no credentials (or, when needed, no SSH key) can be found, or
            ``local_image`` names no image profile.
        SecretShapeError: the API key holds whitespace or a control character (one
            trailing newline is stripped, and said; ``blocks.secret_mask.check_secret``).
    """
    kind = provider_class(params.get("provider") or DEFAULT_PROVIDER)
    return cast("tuple[PodProvider, KeyPair]", kind.from_params(params, need_ssh_key=need_ssh_key))


def ssh_key_file(params: dict[str, Any]) -> str | None:
    """The private key file a run's pod is reached with, when the key is a file of the
    user's: a provider that reaches pods with the user's own key (``Capability.USER_KEY``:
    RunPod's ``RUNPOD_SSH_KEY_PATH``, default ``~/.ssh/id_ed25519_runpod``; returned
    expanded, as the path in use) unless a saved ``RunPodSSHKey`` block is named. None
    when the key lives elsewhere: a saved block, or the local pod's per-run key."""
    name = params.get("provider") or DEFAULT_PROVIDER
    if params.get("ssh_key_block") or not provider_supports(name, Capability.USER_KEY):
        return None
    return os.path.expanduser(provider_class(name).user_key_path())


def planned_pod(provider: PodProvider, name: str) -> PlannedPod:
    """Describe the pod ``provider`` would rent under ``name`` (nothing is rented): its
    own plan (``Capability.POD_PLAN``), else a pod reached through a gateway only, of a
    disk not known before renting."""
    if provider.supports(Capability.POD_PLAN):
        return cast("PlannedPod", provider.plan_pod(name))  # type: ignore[attr-defined]
    pending = "(not rented yet)"
    gateway = SSHEndpoint(host="(its gateway)", port=22, user=pending, mode="gateway")
    handle = PodHandle(pod_id=pending, name=name, provider=provider.provider_name, ssh=gateway)
    return PlannedPod(
        description=f"a {provider.provider_name} pod (gateway SSH)",
        handle=handle,
        disk_bytes=None,
        disk_description="its disk",
    )
