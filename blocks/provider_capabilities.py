"""What a pod provider may offer beyond the ``PodProvider`` calls, asked for by
capability, never by the provider's name (docs/architecture.md#capabilities).

Like SkyPilot's provisioners, each provider class declares what it supports
(``capabilities``) and implements the matching method; a caller asks
``provider.supports(Capability.BILL)`` (or, with only a name from a record,
``provider_registry.provider_supports(name, …)``) before calling it:

| capability | method | what for |
|---|---|---|
| ``POD_PLAN`` | ``plan_pod(name) -> PlannedPod`` | the pod about to be rented, for the pre-rent checks |
| ``PRICES`` | ``offers() -> Offers`` | what it would cost, per GPU type (``plan``) |
| ``BILL`` | ``fetch_bill(pod_id, start, end) -> ProviderBill | None`` | the provider's own bill beside our estimate |
| ``SELF_TERMINATE`` | — | the pod can end itself through the provider's API with its own key (the dead-man's API layer) |
| ``OPTIONS`` | ``option_names() -> tuple[str, ...]`` | the run parameters only this provider takes |
| ``ACCOUNT`` | ``account_checks(key_only) -> list[AccountCheck]`` | ``check`` and ``plan``: the account's key and SSH key |
| ``USER_KEY`` | ``user_key_path() -> str`` | the pod is reached with the user's own key file, not a per-run key |
| ``ON_THIS_MACHINE`` | — | the pod lives on this machine: its workspace is on this disk and it may borrow this environment's packages |

Every provider also has ``from_params(params, need_ssh_key=…)``, the class method the
registry builds it with from a run's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = [
    "AccountCheck",
    "Capability",
    "Capable",
    "Offer",
    "Offers",
    "PlannedPod",
    "ProviderBill",
]


class Capability(StrEnum):
    """An optional part of a provider (see the module docstring for each one's method)."""

    POD_PLAN = "pod_plan"
    PRICES = "prices"
    BILL = "bill"
    SELF_TERMINATE = "self_terminate"
    OPTIONS = "options"
    ACCOUNT = "account"
    USER_KEY = "user_key"
    ON_THIS_MACHINE = "on_this_machine"


class Capable:
    """The base of every provider class: its name, its words for people, and what it
    offers (``capabilities``), answered by ``supports`` for the class and its instances.

    Attributes:
        provider_name: the run's ``provider`` parameter (``local``, ``runpod``…).
        display_name: the provider in a sentence (``RunPod``, ``the local pod``).
        capabilities: the ``Capability`` members the class implements.
    """

    provider_name: ClassVar[str]
    display_name: ClassVar[str] = "the provider"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    @classmethod
    def supports(cls, capability: Capability) -> bool:
        """True when the provider implements ``capability``'s method."""
        return capability in cls.capabilities


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
        gateway_only: the same pod when its host grants no public IP (RunPod shows that
            only once the pod runs), or None when the endpoints are certain.
    """

    description: str
    handle: PodHandle
    disk_bytes: int | None
    disk_description: str
    gateway_only: PodHandle | None = None


@dataclass(frozen=True)
class Offer:
    """One GPU type a provider would rent.

    Attributes:
        gpu_type: its id (``NVIDIA GeForce RTX 4090``, ``cpu (local pod)``).
        usd_per_hr: its price, USD/h, or None when the provider gives none.
        availability: ``HIGH``, ``MEDIUM``, ``LOW``, ``NONE`` or ``UNKNOWN``.
    """

    gpu_type: str
    usd_per_hr: float | None
    availability: str = "UNKNOWN"


@dataclass(frozen=True)
class Offers:
    """A provider's offers in failover order, and why availability is missing, if it is."""

    offers: list[Offer] = field(default_factory=list)
    note: str | None = None


@dataclass(frozen=True)
class ProviderBill:
    """What the provider billed for one pod over a window.

    Attributes:
        usd: the amount, USD.
        billed_seconds: the time it billed, s, when it says (None otherwise).
        note: where the amount came from (``RunPod REST v2, 1 record(s)``).
        gpu_usd / cpu_usd / disk_usd: the amount's parts, when the bill splits it
            (RunPod's v2 ``gpuAmount``, ``cpuAmount``, ``diskAmount``), else None.
    """

    usd: float
    billed_seconds: float | None
    note: str
    gpu_usd: float | None = None
    cpu_usd: float | None = None
    disk_usd: float | None = None


@dataclass(frozen=True)
class AccountCheck:
    """One check of the provider account (``check``, ``plan``).

    Attributes:
        name: what was checked (``RunPod API key``, ``account SSH key``).
        ok: True passed, False failed.
        detail: what was found, or the problem with its fix.
    """

    name: str
    ok: bool
    detail: str
