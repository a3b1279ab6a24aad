"""What a GPU type costs and whether RunPod has it now: REST v2's catalog.

``GET {base}/v2/catalog/gpus?include=AVAILABILITY&product=POD`` answers
``{"gpus": [GpuType]}`` (RunPod's v2 OpenAPI schema): per GPU type its ``id`` (the exact
id a create needs), ``name``, ``memory`` (GB), ``price.secure`` / ``price.community``
(USD per GPU-hour), ``maxCount.secure`` / ``maxCount.community``, and with
availability asked for, ``availability`` (``NONE`` … ``HIGH``), ``dataCenters[]`` and
``cudaVersions[]`` (``{version, available}``). ``parse_catalog`` reads it tolerantly
(what is missing stays unknown); the GraphQL fallback fills the same ``GpuAvailability``
from the SDK's ``gpuTypes`` prices.

Availability is a hint, not a promise: RunPod can still answer "no longer any instances
available" at create (the provider then fails over to the next GPU type).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["GpuAvailability", "parse_catalog"]

CloudType = Literal["SECURE", "COMMUNITY", "ALL"]

Availability = Literal["NONE", "LOW", "MEDIUM", "HIGH", "UNKNOWN"]


class GpuAvailability(BaseModel):
    """One GPU type in REST v2's catalog.

    Attributes:
        gpu_type_id: RunPod's GPU type id (``NVIDIA GeForce RTX 3090``).
        name: its short name (``RTX 3090``), when said.
        memory_gb: its memory (GB), when said.
        availability: ``NONE`` … ``HIGH`` overall, ``UNKNOWN`` when not said.
        secure_usd_per_hr / community_usd_per_hr: the catalog's prices per GPU-hour.
        lowest_usd_per_hr: the lowest price per GPU-hour over both clouds (GraphQL's
            ``lowestPrice.uninterruptablePrice``, else the lower of the two).
        max_count: the most GPUs of this type one pod can have (the larger cloud's).
        max_count_secure / max_count_community: the same per cloud, when said.
        data_centers: data center id → its availability.
        cuda_versions: CUDA version → whether a machine on it is free now.
    """

    gpu_type_id: str
    name: str | None = None
    memory_gb: int | None = None
    availability: Availability = "UNKNOWN"
    secure_usd_per_hr: float | None = None
    community_usd_per_hr: float | None = None
    lowest_usd_per_hr: float | None = None
    max_count: int | None = None
    max_count_secure: int | None = None
    max_count_community: int | None = None
    data_centers: dict[str, Availability] = Field(default_factory=dict)
    cuda_versions: dict[str, bool] = Field(default_factory=dict)

    def usd_per_hr(self, cloud: CloudType, gpu_count: int) -> float | None:
        """The price of ``gpu_count`` GPUs of this type in ``cloud`` (USD/h), None when
        the catalog gives none: SECURE's, COMMUNITY's, or for ALL the lowest."""
        if cloud == "SECURE":
            price = self.secure_usd_per_hr
        elif cloud == "COMMUNITY":
            price = self.community_usd_per_hr
        else:
            known = [
                p for p in (self.secure_usd_per_hr, self.community_usd_per_hr) if p is not None
            ]
            price = self.lowest_usd_per_hr
            if price is None and known:
                price = min(known)
        return None if price is None else round(price * gpu_count, 6)


def _level(value: Any) -> Availability:
    text = str(value or "").upper()
    return text if text in ("NONE", "LOW", "MEDIUM", "HIGH") else "UNKNOWN"  # type: ignore[return-value]


def _price(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
        found_max = item.get("maxCount")
        per_cloud: dict[str, Any] = found_max if isinstance(found_max, dict) else {}
        secure_max = _count(per_cloud.get("secure")) if per_cloud else _count(found_max)
        community_max = _count(per_cloud.get("community")) if per_cloud else _count(found_max)
        counts = [c for c in (secure_max, community_max) if c is not None]
        memory = item.get("memory", item.get("memoryInGb"))
        out[str(item["id"])] = GpuAvailability(
            gpu_type_id=str(item["id"]),
            name=item.get("name") if isinstance(item.get("name"), str) else None,
            memory_gb=_count(memory),
            availability=_level(overall),
            secure_usd_per_hr=_price(price.get("secure")),
            community_usd_per_hr=_price(price.get("community")),
            max_count=max(counts) if counts else None,
            max_count_secure=secure_max,
            max_count_community=community_max,
            data_centers={
                str(dc.get("id")): _level(dc.get("availability"))
                for dc in centers or []
                if isinstance(dc, dict) and dc.get("id")
            },
            cuda_versions={
                str(c["version"]): bool(c.get("available"))
                for c in item.get("cudaVersions") or []
                if isinstance(c, dict) and c.get("version")
            },
        )
    return out
