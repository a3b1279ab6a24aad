"""Each run parameter's CLI option, for messages (:func:`label`), and the options that
belong to one provider only (:func:`check_provider_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError

__all__ = [
    "OPTIONS",
    "PROVIDER_OPTIONS",
    "check_provider_options",
    "label",
]

OPTIONS: dict[str, str] = {
    "bundle": "--bundle", "provider": "--provider", "model_id": "--model-id",
    "hf_endpoint": "--hf-endpoint", "hf_credentials_block": "--hf-credentials",
    "hf_token_secret": "--hf-token-secret", "hf_token_env": "--hf-token-env",
    "transfer_method": "--transfer", "follow_links": "--follow-links",
    "max_cost_usd": "--max-cost-usd",
    "max_runtime_seconds": "--max-runtime-seconds", "parity_tolerance": "--parity-tolerance",
    "name_prefix": "--name-prefix", "local_mode": "--local-mode",
    "local_cost_per_hr": "--local-cost-per-hr", "local_image": "--local-image",
    "output_dir": "--output-dir",
    "concurrency_limit": "--concurrency-limit",
    "heartbeat_stale_seconds": "--heartbeat-stale-seconds",
    "pod_lifetime_seconds": "--pod-lifetime-seconds",
    "reconnect_budget_seconds": "--reconnect-budget-seconds",
    "runpod_credentials_block": "--runpod-credentials", "runpod_spec_block": "--runpod-spec",
    "ssh_key_block": "--ssh-key", "s3_target_block": "--s3-target",
    "gpu_type_ids": "--gpu-type", "allow_secret_files": "--allow-secret-file",
    "ttl_seconds": "--ttl-seconds", "publish": "--publish",
    "publish_public": "--publish-public", "download": "--download",
    "pod_poll_seconds": "--pod-poll-seconds",
    "terminate_timeout_seconds": "--terminate-timeout-seconds", "run_id": "RUN_ID",
    "pod_id": "POD_ID",
    "pty_framing": "--pty-framing", "pty_streams": "--pty-streams",
}  # fmt: skip
"""Each run parameter and the ``prefect-runpod`` option that sets it, so a message names
both: a CLI user and a deployment's caller each recognise their own spelling."""


def label(name: str) -> str:
    """``max_cost_usd (--max-cost-usd)``: a parameter with its CLI option, or the bare
    name when the CLI has no option for it."""
    option = OPTIONS.get(name)
    return f"{name} ({option})" if option else name


PROVIDER_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("local_mode", "local_cost_per_hr", "local_image"),
    "runpod": ("runpod_credentials_block", "runpod_spec_block", "ssh_key_block", "gpu_type_ids"),
}
"""The parameters that mean something for one provider only. Later provider-specific
options are added here, and :func:`check_provider_options` refuses them elsewhere."""


def check_provider_options(provider: str, given: Mapping[str, Any]) -> None:
    """Refuse options of the other provider (``--gpu-type`` with the local pod, say):
    silently ignoring them would run something other than what was asked.

    Args:
        provider: the chosen provider (``local`` or ``runpod``).
        given: parameter name -> value; None, ``""`` and ``[]`` count as not given.

    Raises:
        SpecError: an unknown provider, or an option of another provider was given.
    """
    if provider not in PROVIDER_OPTIONS:
        raise SpecError(
            f"{label('provider')} {provider!r} is not one of: {', '.join(PROVIDER_OPTIONS)}."
        )
    for other, names in PROVIDER_OPTIONS.items():
        if other == provider:
            continue
        for param in names:
            if given.get(param) not in (None, "", []):
                raise SpecError(
                    f"{label(param)} applies only to --provider {other}, and this run uses "
                    f"{provider}: drop it, or add --provider {other}."
                )
