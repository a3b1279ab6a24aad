"""Which pod providers exist, by name: the one registry every caller asks
(docs/architecture.md#pod-providers).

A provider is a class that implements ``blocks.provider.PodProvider``; the registry maps
its name (``provider_name``, the run's ``provider`` parameter) to the class, imported
only when asked for, so naming the choices (``--help``, a parameter schema) loads no
SDK. The two built in are ``blocks/local_pod/`` and ``blocks/runpod/``; another is one
``register_provider`` call. Nothing outside a provider's own package decides anything
by its name: callers ask the class what it can do (``supports(capability)``).

Imports the standard library only (and ``blocks.exceptions``), so the parameter schema
(``blocks/validation/parameters.py``) can list the names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.exceptions import SpecError

if TYPE_CHECKING:
    from prefect_runpod.blocks.provider_capabilities import Capability

__all__ = [
    "provider_class",
    "provider_declaration",
    "provider_names",
    "provider_supports",
    "register_provider",
    "unregister_provider",
]

_REGISTRY: dict[str, Any] = {
    "local": "prefect_runpod.blocks.local_pod.provider:LocalPodProvider",
    "runpod": "prefect_runpod.blocks.runpod.provider:RunPodProvider",
}
"""Provider name -> its class, or ``"module:Class"`` until first asked for."""
_DECLARATIONS: dict[str, str] = {
    "local": "prefect_runpod.blocks.local_pod.capabilities:LocalPodCapabilities",
    "runpod": "prefect_runpod.blocks.runpod.capabilities:RunPodCapabilities",
}
"""Built-in provider name -> the class its provider inherits its capabilities from,
which imports neither Prefect nor the provider's SDK."""


def provider_names() -> tuple[str, ...]:
    """Every registered provider name, the built-in ones first (``local``, ``runpod``)."""
    return tuple(_REGISTRY)


def register_provider(cls: type, *, replace: bool = False) -> None:
    """Add a provider class under its ``provider_name``.

    Args:
        cls: a class implementing ``PodProvider`` (with ``provider_name`` and a
            ``from_params`` class method that builds it from a run's parameters).
        replace: allow replacing a provider of that name.

    Raises:
        ValueError: the name is taken (and ``replace`` is False), or the class has no
            ``provider_name``.
    """
    name = getattr(cls, "provider_name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls!r} has no provider_name")
    if name in _REGISTRY and not replace:
        raise ValueError(f"a provider named {name!r} is registered already")
    _REGISTRY[name] = cls


def unregister_provider(name: str) -> None:
    """Remove the provider ``name`` (a no-op when it is not registered)."""
    _REGISTRY.pop(name, None)


def provider_class(name: str) -> Any:
    """The provider class registered as ``name``, imported on first use.

    Raises:
        SpecError: no provider of that name (the registered ones are listed).
    """
    found = _REGISTRY.get(name)
    if found is None:
        raise SpecError(f"provider {name!r} is not one of: {', '.join(provider_names())}")
    if isinstance(found, str):
        module, _, attr = found.partition(":")
        found = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = found
    return found


def provider_declaration(name: str) -> Any:
    """What the provider registered as ``name`` declares (``supports``,
    ``option_names``), from a class that loads neither Prefect nor an SDK: a built-in
    provider's capabilities side, else the registered class itself. The CLI checks a
    run's arguments with it before Prefect is imported.

    Raises:
        SpecError: no provider of that name.
    """
    found = _REGISTRY.get(name)
    if isinstance(found, str) and name in _DECLARATIONS:
        module, _, attr = _DECLARATIONS[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    return provider_class(name)


def provider_supports(name: str, capability: Capability) -> bool:
    """Whether the provider registered as ``name`` offers ``capability``; False for a
    name not registered here (a record written by a provider this process lacks)."""
    if name not in _REGISTRY:
        return False
    return bool(provider_class(name).supports(capability))
