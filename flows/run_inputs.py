"""Everything a fine-tune run is checked against before a pod is rented, in one call
that the CLI (before Prefect starts a run) and the flow's ``preflight`` stage (for
deployments, the API and Python callers) share (docs/architecture.md#input-validation).

``prepare_run(params)``, in order:

1. ``tasks.preflight.validate_settings``: every parameter, the bundle and the files it
   would upload (no network, no Prefect API);
2. the saved blocks the run names, each loaded or refused with the saved names of its
   type listed (``blocks.validation.load_block``), and the provider built from them;
3. the Hugging Face token's source (``blocks.huggingface.resolve_hf_access``);
4. the pod about to be rented (``flows.providers.planned_pod``): the transfer method
   against what it will offer and this machine's end, the bundle's bytes against its disk.

Nothing here rents, uploads or logs a secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.huggingface import HFAccess, resolve_hf_access
from prefect_runpod.blocks.keys import KeyPair
from prefect_runpod.blocks.provider import PodProvider
from prefect_runpod.blocks.validation import load_block
from prefect_runpod.flows.providers import PlannedPod, build_provider, planned_pod
from prefect_runpod.tasks.preflight import (
    RunSettings,
    check_pod_disk,
    check_transfer_before_renting,
    validate_settings,
)

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["PreparedRun", "prepare_run", "settings_params"]


@dataclass
class PreparedRun:
    """A run that passed every check before renting.

    Attributes:
        settings: the validated settings.
        provider: the pod provider built from the run's blocks or environment.
        keypair: the SSH key pair the pod is reached with.
        s3: the loaded ``S3Target``, or None.
        hf: the Hugging Face token (a ``SecretStr``), endpoint and where the token came from.
        planned: the pod about to be rented.
        upload_line: file count and bytes to upload, and their share of the pod's disk.
    """

    settings: RunSettings
    provider: PodProvider
    keypair: KeyPair
    s3: S3Target | None
    hf: HFAccess
    planned: PlannedPod
    upload_line: str


def settings_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The fine-tune parameters ``validate_settings`` takes, from a parameter mapping
    (the flow's or the CLI's); missing ones keep ``validate_settings``' defaults."""
    import inspect

    accepted = set(inspect.signature(validate_settings).parameters)
    return {k: val for k, val in params.items() if k in accepted}


def prepare_run(params: Mapping[str, Any], *, demo_bundle: Path, run_name: str) -> PreparedRun:
    """Check a fine-tune run's parameters against everything known before renting.

    Args:
        params: the flow's parameters by name (``bundle`` None means the demo bundle;
            ``output_dir`` None means ``./prefect-runpod-runs/<flow_run_id>``, given
            here already resolved by the caller).
        demo_bundle: the bundle used when ``params["bundle"]`` is None.
        run_name: the pod's name to be (``<prefix>-<flow_run_id>``), for the plan.

    Returns:
        The ``PreparedRun``.

    Raises:
        SpecError: the first problem found (see the module docstring); nothing was rented.
    """
    values = settings_params(params)
    values["bundle"] = params.get("bundle") or demo_bundle
    settings = validate_settings(**values)
    provider, keypair = build_provider(dict(params))
    s3 = None
    if params.get("s3_target_block"):
        from prefect_runpod.blocks.transfer.s3 import S3Target

        s3 = load_block(S3Target, params["s3_target_block"], "s3_target_block")
    hf = resolve_hf_access(
        credentials_block=params.get("hf_credentials_block"),
        token_secret=params.get("hf_token_secret"),
        token_env=params.get("hf_token_env") or "HF_TOKEN",
        endpoint=settings.hf_endpoint,
    )
    plan = planned_pod(provider, run_name)
    check_transfer_before_renting(settings.transfer_method, plan.handle, plan.description, s3)
    assert settings.upload is not None
    line = check_pod_disk(settings.upload, plan.disk_bytes, plan.disk_description)
    return PreparedRun(settings, provider, keypair, s3, hf, plan, line)
