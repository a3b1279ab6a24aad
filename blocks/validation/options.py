"""Each run parameter's CLI option, for messages (:func:`label`), and the options that
belong to one provider only (:func:`check_provider_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.parameters import FINETUNE_PARAMETERS

__all__ = [
    "OPTIONS",
    "check_provider_options",
    "label",
    "provider_options",
]

OPTIONS: dict[str, str] = {
    **{p.name: p.option for p in FINETUNE_PARAMETERS if p.option},
    "ttl_seconds": "--ttl-seconds",
    "max_seconds": "--max-seconds",
    "limit": "--limit",
    "gpu_limit": "--gpu-limit",
    "heartbeat_seconds": "--heartbeat-seconds",
    "run_limit": "--limit",
    "query_seconds": "--query-seconds",
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


def provider_options() -> dict[str, tuple[str, ...]]:
    """The parameters that mean something for one provider only, by provider: each
    registered provider names its own (``Capability.OPTIONS``), and
    :func:`check_provider_options` refuses them elsewhere."""
    from prefect_runpod.blocks.provider_capabilities import Capability
    from prefect_runpod.blocks.provider_registry import provider_declaration, provider_names

    found = {}
    for name in provider_names():
        cls = provider_declaration(name)
        found[name] = tuple(cls.option_names()) if cls.supports(Capability.OPTIONS) else ()
    return found


def check_provider_options(provider: str, given: Mapping[str, Any]) -> None:
    """Refuse options of the other provider (``--gpu-type`` with the local pod, say):
    silently ignoring them would run something other than what was asked.

    Args:
        provider: the chosen provider (a registered name).
        given: parameter name -> value; None, ``""`` and ``[]`` count as not given.

    Raises:
        SpecError: an unknown provider, or an option of another provider was given.
    """
    from prefect_runpod.blocks.provider_registry import provider_names

    if provider not in provider_names():
        raise SpecError(
            f"{label('provider')} {provider!r} is not one of: {', '.join(provider_names())}."
        )
    for other, names in provider_options().items():
        if other == provider:
            continue
        for param in names:
            if given.get(param) not in (None, "", []):
                raise SpecError(
                    f"{label(param)} applies only to --provider {other}, and this run uses "
                    f"{provider}: drop it, or add --provider {other}."
                )
