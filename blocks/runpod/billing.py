"""RunPod's own bill for a pod, from REST v2's billing API, to show beside our estimate.

``GET {base}/v2/billing/pods?podId=&bucketSize=&startTime=&endTime=`` (or ``lastN``
instead of the window) answers ``{records: [{startTime, endTime, podId, totalAmount,
gpuAmount, cpuAmount, diskAmount}], metadata: {query, recordCount, uniquePodCount,
totals}}`` (RunPod's v2 OpenAPI schema); ``RestApi.pod_bill`` asks it. REST v1
(``/billing/pods`` on its own host) was retired on 2026-11-15 and is never asked; a
record fetched from it by an older release still reads (``api: v1``).

Records appear some time after the usage (RunPod does not say how long), so a run's
record fills RunPod's amount in when it can and ``prefect-runpod cost --reconcile``
completes it later. The parsers are plain functions.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr

__all__ = ["BillingRecord", "RunPodBill", "fetch_pod_bill", "parse_v2_records", "summarise"]


class BillingRecord(BaseModel):
    """One billing record of one pod.

    Attributes:
        pod_id: the pod.
        start: the bucket's start (UTC), when the record says it.
        end: the bucket's end (UTC), when the record says it (v2 only).
        usd: the amount charged in that bucket (v2 ``totalAmount``).
        gpu_usd / cpu_usd / disk_usd: v2's ``gpuAmount``, ``cpuAmount``, ``diskAmount``.
        billed_seconds: the time billed in that bucket, when the API said it (REST v1,
            in records fetched before its retirement), else None.
        api: ``v2``, or ``v1`` for such an old record.
    """

    pod_id: str
    start: datetime | None = None
    end: datetime | None = None
    usd: float
    gpu_usd: float | None = None
    cpu_usd: float | None = None
    disk_usd: float | None = None
    billed_seconds: float | None = None
    api: Literal["v1", "v2"]


class RunPodBill(BaseModel):
    """What RunPod charged for one pod, summed over its records.

    Attributes:
        pod_id: the pod.
        usd: the total amount (v2 ``totalAmount`` summed).
        gpu_usd / cpu_usd / disk_usd: v2's ``gpuAmount``, ``cpuAmount``, ``diskAmount``
            summed, or None when a record does not say (an old v1 record).
        billed_seconds: the total time billed, or None when the API does not say.
        records: the records summed.
        api: which API answered.
        fetched_at: when (UTC).
    """

    pod_id: str
    usd: float
    gpu_usd: float | None = None
    cpu_usd: float | None = None
    disk_usd: float | None = None
    billed_seconds: float | None
    records: list[BillingRecord] = Field(default_factory=list)
    api: Literal["v1", "v2"]
    fetched_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def parse_v2_records(data: Any, pod_id: str) -> list[BillingRecord]:
    """The records of ``pod_id`` in a REST v2 ``/v2/billing/pods`` answer
    (``{records: [{startTime, endTime, podId, totalAmount, …}], metadata}``)."""
    rows = data.get("records") if isinstance(data, dict) else None
    return [
        BillingRecord(
            pod_id=pod_id,
            start=_when(row.get("startTime")),
            end=_when(row.get("endTime")),
            usd=_number(row.get("totalAmount")),
            gpu_usd=_number(row.get("gpuAmount")),
            cpu_usd=_number(row.get("cpuAmount")),
            disk_usd=_number(row.get("diskAmount")),
            api="v2",
        )
        for row in rows or []
        if isinstance(row, dict) and row.get("podId") in (pod_id, None)
    ]


def summarise(records: list[BillingRecord], pod_id: str, api: Literal["v1", "v2"]) -> RunPodBill:
    """Sum ``records`` into one ``RunPodBill`` (billed seconds, and each of v2's amounts,
    only when every record says them)."""
    seconds = [r.billed_seconds for r in records]

    def total(amounts: list[float | None]) -> float | None:
        known = [a for a in amounts if a is not None]
        return round(sum(known), 8) if records and len(known) == len(amounts) else None

    return RunPodBill(
        pod_id=pod_id,
        usd=round(sum(r.usd for r in records), 8),
        gpu_usd=total([r.gpu_usd for r in records]),
        cpu_usd=total([r.cpu_usd for r in records]),
        disk_usd=total([r.disk_usd for r in records]),
        billed_seconds=None
        if not records or any(s is None for s in seconds)
        else round(sum(s or 0.0 for s in seconds), 3),
        records=records,
        api=api,
    )


def fetch_pod_bill(
    api_key: SecretStr,
    pod_id: str,
    created_at: datetime,
    ended_at: datetime,
    *,
    base_url: str | None = None,
) -> RunPodBill | None:
    """RunPod's bill for ``pod_id`` between ``created_at`` and ``ended_at``, from REST v2
    (``RestApi.pod_bill``: hour buckets from the hour of create to the end of the hour
    it ended in).

    Args:
        api_key: the account's key (unwrapped at the call).
        pod_id: the pod (checked whole, it goes into a URL).
        created_at / ended_at: the pod's life (UTC).
        base_url: RunPod's base URL (``rest.resolve_base_url``).

    Returns:
        The bill, or None while RunPod has no record of the pod yet (billing lags).

    Raises:
        ProviderAuthError: the key was refused (HTTP 401/403).
        ProviderTransientError: RunPod could not be reached or kept failing (network,
            5xx, 429); the message says to reconcile later.
        ProviderError: any other refusal, in RunPod's words (410: a retired API …).
        SpecError: a malformed pod id or base URL.
        SecretShapeError: ``requests`` refused the header made from the key.
    """
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.runpod.errors import classify_exception, to_provider_error
    from prefect_runpod.blocks.runpod.rest import RestApi

    api = RestApi(api_key, base_url=base_url)
    try:
        return api.pod_bill(pod_id, created_at, ended_at)
    except SpecError:
        raise
    except Exception as exc:
        raise to_provider_error(
            classify_exception(exc),
            what=f"RunPod's billing for pod {pod_id} (run `prefect-runpod cost RUN_ID "
            "--reconcile` later)",
            pod_id=pod_id,
        ) from exc
    finally:
        api.close()
