"""A run's pods as their providers billed them: each pod attempt's bill filled into the
run's cost record where its provider has one (RunPod's REST v2 billing), or why it is
missing (docs/architecture.md#what-a-run-cost).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prefect_runpod.blocks.costs import round_usd
from prefect_runpod.blocks.provider import Capability, PodProvider
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.secret_mask import error_text
from prefect_runpod.flows.run.attempts import PodAttempt

if TYPE_CHECKING:
    from prefect_runpod.flows.run.cost_record import CostRecord

__all__ = ["fetch_provider_bill"]


def fetch_provider_bill(provider: PodProvider | None, record: CostRecord) -> None:
    """Fill each pod's bill from its provider into ``record`` where the provider has one
    (``Capability.BILL``: RunPod's REST billing) and the bill has the pod's records;
    otherwise say why in the attempt's ``billing_note``. Never raises."""
    for attempt in record.attempts:
        _fetch_bill(provider, record.flow_run_id, attempt)


def _fetch_bill(provider: PodProvider | None, run_id: str, a: PodAttempt) -> None:
    if not provider_supports(a.provider, Capability.BILL):
        a.billing_note = ""
        return
    if a.pod_id is None or a.created_at is None:
        return
    who = provider_class(a.provider).display_name
    if provider is None or not provider.supports(Capability.BILL):
        a.billing_note = f"no {who} credentials here to ask its billing API"
        return
    ended = a.end.ended_at if a.end and a.end.ended_at else datetime.now(UTC)
    try:
        bill = provider.fetch_bill(a.pod_id, a.created_at, ended)  # type: ignore[attr-defined]
    except Exception as exc:  # billing is beside the record, never in its way
        a.billing_note = f"{who}'s billing did not answer ({error_text(exc)})"[:300]
        return
    if bill is None:
        a.billing_note = (
            f"{who} has no billing record yet (billing lags); run `prefect-runpod cost "
            f"{run_id} --reconcile` later"
        )
        return
    a.provider_usd, a.provider_billed_seconds = bill.usd, bill.billed_seconds
    a.provider_gpu_usd, a.provider_cpu_usd = bill.gpu_usd, bill.cpu_usd
    a.provider_disk_usd = bill.disk_usd
    a.billing_note = bill.note
    a.difference_usd = round_usd(a.usd - bill.usd)
