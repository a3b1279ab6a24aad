"""What a GPU type costs and whether RunPod has it now, for ``prefect-runpod plan``.

Two sources, each for what it is good at:

- **the price** comes from the SDK's GPU query (GraphQL ``gpuTypes(input:{id})``:
  ``securePrice``, ``communityPrice``, ``lowestPrice { uninterruptablePrice }``), the same
  number the provider compares with ``max_usd_per_hour`` before renting
  (``RunPodProvider.gpu_prices``); never a spot or bid price (RunPod is removing them);
- **availability** comes from REST v2's catalog, ``GET {api}/v2/catalog/gpus?include=
  AVAILABILITY&product=POD`` (``api`` = ``$RUNPOD_API_BASE_URL``, default
  ``https://api.runpod.io``), which answers per GPU ``price.secure``/``price.community``
  (USD per GPU-hour), ``maxCount`` and ``availability`` (``NONE``, ``LOW``, ``MEDIUM``,
  ``HIGH``) overall and per data center. REST v2 is a beta: the parser reads those
  fields wherever a GPU list is found and leaves what is missing as unknown.

Availability is a hint, not a promise: RunPod can still answer "no longer any instances
available" at create (the provider then fails over to the next GPU type).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr

from prefect_runpod.blocks.exceptions import ProviderAuthError, ProviderTransientError
from prefect_runpod.blocks.runpod.client import REFUSED_KEY_HEADER
from prefect_runpod.blocks.secret_mask import error_text, register

__all__ = ["GpuAvailability", "fetch_gpu_availability", "parse_catalog"]

Availability = Literal["NONE", "LOW", "MEDIUM", "HIGH", "UNKNOWN"]

_TIMEOUT_SECONDS = 15.0


class GpuAvailability(BaseModel):
    """One GPU type in REST v2's catalog.

    Attributes:
        gpu_type_id: RunPod's GPU type id (``NVIDIA GeForce RTX 3090``).
        availability: ``NONE`` … ``HIGH`` overall, ``UNKNOWN`` when not said.
        secure_usd_per_hr / community_usd_per_hr: the catalog's prices per GPU-hour.
        max_count: the most GPUs of this type one pod can have, when said.
        data_centers: data center id → its availability.
    """

    gpu_type_id: str
    availability: Availability = "UNKNOWN"
    secure_usd_per_hr: float | None = None
    community_usd_per_hr: float | None = None
    max_count: int | None = None
    data_centers: dict[str, Availability] = Field(default_factory=dict)


def _level(value: Any) -> Availability:
    text = str(value or "").upper()
    return text if text in ("NONE", "LOW", "MEDIUM", "HIGH") else "UNKNOWN"  # type: ignore[return-value]


def _price(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def parse_catalog(data: Any) -> dict[str, GpuAvailability]:
    """GPU type id → ``GpuAvailability`` from a ``/v2/catalog/gpus`` answer (a list of GPU
    objects, or an object holding one under ``gpus``, ``data`` or ``items``). Pure."""
    items: Any = data
    if isinstance(data, dict):
        items = data.get("gpus") or data.get("data") or data.get("items") or []
    out: dict[str, GpuAvailability] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or not item.get("id"):
            continue
        found = item.get("price")
        price: dict[str, Any] = found if isinstance(found, dict) else {}
        avail = item.get("availability")
        overall = avail.get("overall") if isinstance(avail, dict) else avail
        centers = item.get("dataCenters") or (
            avail.get("dataCenters") if isinstance(avail, dict) else None
        )
        max_count = item.get("maxCount")
        out[str(item["id"])] = GpuAvailability(
            gpu_type_id=str(item["id"]),
            availability=_level(overall),
            secure_usd_per_hr=_price(price.get("secure")),
            community_usd_per_hr=_price(price.get("community")),
            max_count=int(max_count) if isinstance(max_count, int | float) else None,
            data_centers={
                str(dc.get("id")): _level(dc.get("availability"))
                for dc in centers or []
                if isinstance(dc, dict) and dc.get("id")
            },
        )
    return out


def fetch_gpu_availability(
    api_key: SecretStr, *, timeout_seconds: float = _TIMEOUT_SECONDS
) -> dict[str, GpuAvailability]:
    """REST v2's GPU catalogue with availability (see the module docstring).

    Args:
        api_key: the account's key (unwrapped here, at the call).
        timeout_seconds: the request's deadline, s.

    Returns:
        GPU type id → ``GpuAvailability``.

    Raises:
        ProviderAuthError: the key was refused (HTTP 401/403).
        ProviderTransientError: no answer, another status, or a body that is not JSON.
        SecretShapeError: ``requests`` refused the header made from the key.
    """
    import requests

    from prefect_runpod.blocks.runpod.billing import rest_endpoints

    _, v2 = rest_endpoints()
    register(api_key)
    try:
        with REFUSED_KEY_HEADER:
            answer = requests.get(
                f"{v2}/catalog/gpus",
                params={"include": "AVAILABILITY", "product": "POD"},
                headers={"Authorization": f"Bearer {api_key.get_secret_value()}"},
                timeout=timeout_seconds,
            )
    except requests.RequestException as exc:
        raise ProviderTransientError(
            f"RunPod's GPU catalog did not answer ({error_text(exc)})"
        ) from None
    if answer.status_code in (401, 403):
        raise ProviderAuthError(
            f"RunPod's GPU catalog refused the API key (HTTP {answer.status_code}); check "
            "the RunPodCredentials block's api_key"
        )
    if answer.status_code != 200:
        raise ProviderTransientError(f"RunPod's GPU catalog answered HTTP {answer.status_code}")
    try:
        return parse_catalog(answer.json())
    except ValueError:
        raise ProviderTransientError(
            "RunPod's GPU catalog answered a body that is not JSON"
        ) from None
