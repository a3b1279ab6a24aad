"""Each run parameter's CLI option, for messages (:func:`label`), and the options that
belong to one provider only (:func:`check_provider_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.parameters import FINETUNE_PARAMETERS

__all__ = [
    "OPTIONS",
    "PROVIDER_OPTIONS",
    "check_provider_options",
    "label",
]

OPTIONS: dict[str, str] = {
    **{p.name: p.option for p in FINETUNE_PARAMETERS if p.option},
    "ttl_seconds": "--ttl-seconds",
    "run_id": "RUN_ID",
    "pod_id": "POD_ID",
}
"""Each run parameter and the ``prefect-runpod`` option that sets it (from the parameter's
declaration, ``parameters.FINETUNE_PARAMETERS``), so a message names both: a CLI user and a deployment's caller each recognise their own spelling."""


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
