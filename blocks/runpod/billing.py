"""RunPod's own bill for a pod, from its REST billing API, to show beside our estimate.

The ``runpod`` SDK speaks GraphQL only, and GraphQL has no billing query, so this
module asks RunPod's REST APIs through ``requests`` (what the SDK itself uses):

- **v1** ``GET {rest}/billing/pods?podId=&bucketSize=&startTime=&endTime=&grouping=podId``
  (``rest`` = ``RUNPOD_REST_BASE_URL``, default ``https://rest.runpod.io/v1``) answers a
  JSON list of ``{time, amount, timeBilledMs, diskSpaceBilledGb, podId, gpuTypeId}``
  (the shape runpodctl 2.x reads in ``internal/api/billing.go``);
- **v2** ``GET {api}/v2/billing/pods?podId=&bucketSize=&startTime=&endTime=``
  (``api`` = ``RUNPOD_API_BASE_URL``, default ``https://api.runpod.io``, the SDK's own
  variable) answers ``{records: [{startTime, endTime, podId, totalAmount, gpuAmount,
  cpuAmount, diskAmount}], metadata: {totals}}`` (RunPod's v2 OpenAPI spec).

Records appear some time after the usage (RunPod does not say how long), so a run's
record fills RunPod's amount in when it can and ``prefect-runpod cost --reconcile``
completes it later. The parsers are plain functions.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr

from prefect_runpod.blocks.exceptions import ProviderAuthError, ProviderTransientError
from prefect_runpod.blocks.runpod.client import REFUSED_KEY_HEADER
from prefect_runpod.blocks.secret_mask import register
from prefect_runpod.blocks.validation import check_pod_id, check_url, utc_timestamp

__all__ = [
    "API_BASE_ENV",
    "DEFAULT_API_BASE_URL",
    "DEFAULT_REST_BASE_URL",
    "REST_BASE_ENV",
    "BillingRecord",
    "RunPodBill",
    "fetch_pod_bill",
    "parse_v1_records",
    "parse_v2_records",
    "rest_endpoints",
    "summarise",
]

DEFAULT_REST_BASE_URL = "https://rest.runpod.io/v1"
"""RunPod's REST v1 base (Bearer key); marked deprecated by RunPod in favour of v2."""
REST_BASE_ENV = "RUNPOD_REST_BASE_URL"
"""Points the REST v1 calls elsewhere (the emulator in tests), beside the SDK's
``RUNPOD_API_BASE_URL``."""
DEFAULT_API_BASE_URL = "https://api.runpod.io"
API_BASE_ENV = "RUNPOD_API_BASE_URL"
"""The SDK's variable: GraphQL at ``{base}/graphql``, REST v2 at ``{base}/v2``."""

_TIMEOUT_SECONDS = 15.0
_WINDOW_MARGIN = timedelta(hours=1)
"""Billing buckets are hours: ask from an hour before create to an hour after the end."""


class BillingRecord(BaseModel):
    """One billing record of one pod.

    Attributes:
        pod_id: the pod.
        start: the bucket's start (UTC), when the record says it.
        end: the bucket's end (UTC), when the record says it (v2 only).
        usd: the amount charged in that bucket.
        billed_seconds: the time billed in that bucket (v1's ``timeBilledMs``), or None
            when the API does not say (v2).
        api: ``v1`` or ``v2``.
    """

    pod_id: str
    start: datetime | None = None
    end: datetime | None = None
    usd: float
    billed_seconds: float | None = None
    api: Literal["v1", "v2"]


class RunPodBill(BaseModel):
    """What RunPod charged for one pod, summed over its records.

    Attributes:
        pod_id: the pod.
        usd: the total amount.
        billed_seconds: the total time billed, or None when the API does not say.
        records: the records summed.
        api: which API answered.
        fetched_at: when (UTC).
    """

    pod_id: str
    usd: float
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


def parse_v1_records(data: Any, pod_id: str) -> list[BillingRecord]:
    """The records of ``pod_id`` in a REST v1 ``/billing/pods`` answer (a JSON list of
    ``{time, amount, timeBilledMs, diskSpaceBilledGb, podId, gpuTypeId}``); records of
    other pods, and anything that is not such a record, are left out."""
    rows = data if isinstance(data, list) else []
    return [
        BillingRecord(
            pod_id=pod_id,
            start=_when(row.get("time")),
            usd=_number(row.get("amount")),
            billed_seconds=_number(row.get("timeBilledMs")) / 1000.0,
            api="v1",
        )
        for row in rows
        if isinstance(row, dict) and row.get("podId") in (pod_id, None)
    ]


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
            api="v2",
        )
        for row in rows or []
        if isinstance(row, dict) and row.get("podId") in (pod_id, None)
    ]


def summarise(records: list[BillingRecord], pod_id: str, api: Literal["v1", "v2"]) -> RunPodBill:
    """Sum ``records`` into one ``RunPodBill`` (billed seconds only when every record
    says them)."""
    seconds = [r.billed_seconds for r in records]
    return RunPodBill(
        pod_id=pod_id,
        usd=round(sum(r.usd for r in records), 8),
        billed_seconds=None
        if not records or any(s is None for s in seconds)
        else round(sum(s or 0.0 for s in seconds), 3),
        records=records,
        api=api,
    )


def rest_endpoints(rest_base_url: str | None = None) -> tuple[str, str]:
    """``(v1 base, v2 base)``: ``rest_base_url`` or ``$RUNPOD_REST_BASE_URL`` or RunPod's
    v1 address; ``$RUNPOD_API_BASE_URL`` (or RunPod's) + ``/v2``.

    Raises:
        SpecError: a base URL that is not an http(s) URL.
    """
    v1 = rest_base_url or os.environ.get(REST_BASE_ENV) or DEFAULT_REST_BASE_URL
    api = os.environ.get(API_BASE_ENV) or DEFAULT_API_BASE_URL
    return check_url(v1, "rest_base_url"), f"{check_url(api, API_BASE_ENV)}/v2"


def fetch_pod_bill(
    api_key: SecretStr,
    pod_id: str,
    created_at: datetime,
    ended_at: datetime,
    *,
    rest_base_url: str | None = None,
    api: Literal["v1", "v2", "auto"] = "auto",
    timeout_seconds: float = _TIMEOUT_SECONDS,
) -> RunPodBill | None:
    """RunPod's bill for ``pod_id`` between ``created_at`` and ``ended_at``.

    Args:
        api_key: the account's key (unwrapped here, at the call).
        pod_id: the pod (checked whole, it goes into a URL).
        created_at / ended_at: the pod's life (UTC); the query window adds an hour on
            each side, the buckets' size.
        rest_base_url: the REST v1 base (the credentials block's); see ``rest_endpoints``.
        api: ``v1``, ``v2``, or ``auto`` (v1, then v2 when v1 does not answer).
        timeout_seconds: per request.

    Returns:
        The bill, or None while RunPod has no record of the pod yet (billing lags).

    Raises:
        ProviderAuthError: the key was refused (HTTP 401/403).
        ProviderTransientError: no API answered (network, 5xx, a body that is not JSON).
        SpecError: a malformed pod id or base URL.
        SecretShapeError: ``requests`` refused the header made from the key.
    """
    import requests

    check_pod_id(pod_id)
    v1, v2 = rest_endpoints(rest_base_url)
    params = {
        "podId": pod_id,
        "bucketSize": "hour",
        "startTime": utc_timestamp(created_at - _WINDOW_MARGIN),
        "endTime": utc_timestamp(ended_at + _WINDOW_MARGIN),
    }
    register(api_key)
    headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"}
    order: list[Literal["v1", "v2"]] = ["v1", "v2"] if api == "auto" else [api]
    problems = []
    for which in order:
        url = f"{v1}/billing/pods" if which == "v1" else f"{v2}/billing/pods"
        query = dict(params, grouping="podId") if which == "v1" else params
        try:
            with REFUSED_KEY_HEADER:
                answer = requests.get(url, params=query, headers=headers, timeout=timeout_seconds)
        except requests.RequestException as exc:
            problems.append(f"{which}: {type(exc).__name__}")
            continue
        if answer.status_code in (401, 403):
            raise ProviderAuthError(
                f"RunPod's billing API refused the API key (HTTP {answer.status_code}); "
                "check the RunPodCredentials block's api_key",
                pod_id=pod_id,
            )
        if answer.status_code != 200:
            problems.append(f"{which}: HTTP {answer.status_code}")
            continue
        try:
            data = answer.json()
        except ValueError:
            problems.append(f"{which}: a body that is not JSON")
            continue
        records = (
            parse_v1_records(data, pod_id) if which == "v1" else parse_v2_records(data, pod_id)
        )
        return summarise(records, pod_id, which) if records else None
    raise ProviderTransientError(
        f"RunPod's billing API did not answer for pod {pod_id} ({'; '.join(problems)}); "
        "run `prefect-runpod cost RUN_ID --reconcile` later",
        pod_id=pod_id,
    )
