"""Every run's cost, known: the run's cost record and where it lives (docs/architecture.md#what-a-run-cost).

The record of truth is the ``finetune-costs`` table artifact of the run's flow run,
written through the Prefect client with that ``flow_run_id``: by the run itself (when
the pod is on record, and at its end), and by whoever else ends the run's pod — its
crash hook, the reaper, ``prefect-runpod terminate`` — or completes the record later
(``prefect-runpod cost RUN_ID --reconcile``). Each writes a new version; the latest is
the record. ``run-report.json`` is rewritten too, but only when it can be reached from
where the writer runs (the reaper may run far from the run's output dir).

A record holds the pod's end (who, when, confirmed: ``PodEnd``), our estimate
(price × seconds from create to the confirmed end, ``blocks/costs.py``), and RunPod's
own bill beside it when its billing API has the pod's records.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_runpod.blocks.costs import round_usd, settle
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import Capability, EndedBy, PodEnd, PodProvider, end_command
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.secret_mask import error_text, redact, redact_data
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER

__all__ = [
    "COST_ARTIFACT_KEY",
    "CostRecord",
    "fetch_provider_bill",
    "latest_record",
    "merge_end",
    "publish_record",
    "record_pod_end",
    "rewrite_report",
]

COST_ARTIFACT_KEY = "finetune-costs"
_log = logging.getLogger("prefect_runpod.costs")


class CostRecord(BaseModel):
    """One run's cost, as its ``finetune-costs`` artifact holds it.

    Attributes:
        flow_run_id: the run.
        pod_id / pod_name / provider: its pod.
        output_dir: where the run keeps ``run-report.json`` (on the run's machine).
        gpu_type: the GPU type rented (``cpu`` for a local pod), ``-`` when not known.
        cost_per_hr: USD/h.
        created_at: when the provider returned the pod id (billing starts).
        end: how and when the pod ended; ``end.confirmed`` False while it may still bill.
        billed_seconds / usd: our estimate, from create to the confirmed end (to now while
            the pod may still be billing).
        max_cost_usd: the budget, if any.
        lease: RunPod's ``terminateAfter`` (or the local pod's) as sent, ``absent`` when
            the provider did not take it, ``-`` when none was asked.
        runpod_usd / runpod_billed_seconds: RunPod's own bill (REST billing), once known.
        difference_usd: ``usd - runpod_usd``, once RunPod's bill is known.
        billing_note: why RunPod's bill is missing, when it is.
        published_bytes / published_to: what the pod published itself (bytes that did not
            cross the gateway) and where, when the run published.
        stage_seconds: seconds per stage.
        recorded_by: who wrote this version (``flow``, ``hook``, ``reaper``, ``cli``,
            ``cost --reconcile``).
        recorded_at: when.
    """

    flow_run_id: str
    pod_id: str | None = None
    pod_name: str = ""
    provider: str = DEFAULT_PROVIDER
    output_dir: str | None = None
    gpu_type: str = "-"
    cost_per_hr: float = 0.0
    created_at: datetime | None = None
    end: PodEnd | None = None
    billed_seconds: float = 0.0
    usd: float = 0.0
    max_cost_usd: float | None = None
    lease: str = "-"
    runpod_usd: float | None = None
    runpod_billed_seconds: float | None = None
    difference_usd: float | None = None
    billing_note: str = ""
    published_bytes: int | None = None
    published_to: str = ""
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    recorded_by: str = "flow"
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def may_still_bill(self) -> bool:
        """True while a pod exists and its end is not confirmed."""
        return self.pod_id is not None and not (self.end is not None and self.end.confirmed)

    def state_line(self) -> str:
        """One line: ``ended by the flow at …, confirmed`` / ``may still be billing: …``."""
        if self.pod_id is None:
            return "no pod was created"
        end = self.end
        if end is None or not end.confirmed:
            return (
                f"pod {self.pod_id} may still be billing: end it with "
                f"`{end_command(self.provider, self.pod_id)}`"
            )
        at = end.ended_at.isoformat() if end.ended_at else "?"
        how = f", {end.layer}" if end.layer else ""
        guessed = " (inferred)" if end.inferred else ""
        return f"ended by {end.ended_by.value}{guessed} at {at}{how}, confirmed"

    def settle(self, now: datetime | None = None) -> None:
        """Recompute our estimate: create → the confirmed end (or ``now`` while the pod may
        still be billing), and the difference with RunPod's bill."""
        if self.created_at is None:
            return
        end = self.end.ended_at if self.end is not None and self.end.confirmed else None
        bill = settle(self.cost_per_hr, self.created_at, end or now or datetime.now(UTC))
        self.billed_seconds, self.usd = bill.billed_seconds, bill.usd
        if self.runpod_usd is not None:
            self.difference_usd = round_usd(self.usd - self.runpod_usd)

    def to_rows(self) -> list[dict[str, Any]]:
        """The artifact's table: ONE row, a column per fact, so the Prefect UI can sort
        and compare runs. Numbers stay numbers (``null`` when not known) and every unit is
        in its column's name: ``cost_per_hr_usd_per_h``, ``billed_s``, ``usd``,
        ``published_bytes``, times as ISO-8601 ``…_utc``; each stage's seconds in its
        own ``stage_<name>_s`` column. ``from_rows`` reads it back whole.

        Returns:
            ``[row]``, ``row`` a dict of str/float/int/bool/None.
        """
        end = self.end or PodEnd(pod_id=self.pod_id or "-")
        row: dict[str, Any] = {
            "flow_run_id": self.flow_run_id,
            "state": self.state_line(),
            "pod_id": self.pod_id,
            "pod_name": self.pod_name,
            "provider": self.provider,
            "gpu_type": self.gpu_type,
            "cost_per_hr_usd_per_h": self.cost_per_hr,
            "billed_s": self.billed_seconds,
            "usd": self.usd,
            "runpod_usd": self.runpod_usd,
            "runpod_billed_s": self.runpod_billed_seconds,
            "difference_usd": self.difference_usd,
            "billing_note": self.billing_note,
            "max_cost_usd": self.max_cost_usd,
            "created_at_utc": _iso(self.created_at),
            "ended_at_utc": _iso(end.ended_at),
            "end_confirmed": end.confirmed,
            "ended_by": end.ended_by.value,
            "ended_by_inferred": end.inferred,
            "end_layer": end.layer,
            "end_cause": end.cause,
            "end_detail": end.detail,
            "lease": self.lease,
            "published_bytes": self.published_bytes,
            "published_to": self.published_to,
            "output_dir": self.output_dir,
            "recorded_by": self.recorded_by,
            "recorded_at_utc": _iso(self.recorded_at),
        }
        for stage, seconds in self.stage_seconds.items():
            row[f"{_STAGE_PREFIX}{stage}{_STAGE_SUFFIX}"] = seconds
        return [row]

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> CostRecord:
        """Read a record back from its table (see ``to_rows``).

        Raises:
            ValueError: the table is not a cost record (not one row with a flow_run_id).
        """
        if len(rows) != 1 or not isinstance(rows[0], dict) or "flow_run_id" not in rows[0]:
            raise ValueError("not a cost record: expected one row with a flow_run_id")
        row = rows[0]
        pod_id = row.get("pod_id")
        end = None
        if pod_id is not None:
            end = PodEnd(
                pod_id=pod_id,
                ended_by=EndedBy(row.get("ended_by") or "unknown"),
                confirmed=bool(row.get("end_confirmed")),
                ended_at=_when(row.get("ended_at_utc")),
                layer=row.get("end_layer") or "",
                cause=row.get("end_cause"),
                inferred=bool(row.get("ended_by_inferred")),
                detail=row.get("end_detail") or "",
                recorded_at=_when(row.get("recorded_at_utc")) or datetime.now(UTC),
            )
        return cls(
            flow_run_id=str(row["flow_run_id"]),
            pod_id=pod_id,
            pod_name=row.get("pod_name") or "",
            provider=row.get("provider") or DEFAULT_PROVIDER,
            output_dir=row.get("output_dir"),
            gpu_type=str(row.get("gpu_type") or "-"),
            cost_per_hr=float(row.get("cost_per_hr_usd_per_h") or 0.0),
            created_at=_when(row.get("created_at_utc")),
            end=end,
            billed_seconds=float(row.get("billed_s") or 0.0),
            usd=float(row.get("usd") or 0.0),
            max_cost_usd=row.get("max_cost_usd"),
            lease=str(row.get("lease") or "-"),
            published_bytes=row.get("published_bytes"),
            published_to=row.get("published_to") or "",
            runpod_usd=row.get("runpod_usd"),
            runpod_billed_seconds=row.get("runpod_billed_s"),
            difference_usd=row.get("difference_usd"),
            billing_note=row.get("billing_note") or "",
            stage_seconds={
                key[len(_STAGE_PREFIX) : -len(_STAGE_SUFFIX)]: float(value)
                for key, value in row.items()
                if key.startswith(_STAGE_PREFIX) and key.endswith(_STAGE_SUFFIX)
            },
            recorded_by=str(row.get("recorded_by") or "flow"),
            recorded_at=_when(row.get("recorded_at_utc")) or datetime.now(UTC),
        )


_STAGE_PREFIX, _STAGE_SUFFIX = "stage_", "_s"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _when(text: Any) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


_VAGUE = (EndedBy.OUTSIDE, EndedBy.UNKNOWN)


def merge_end(older: PodEnd | None, newer: PodEnd | None) -> PodEnd | None:
    """The end a record keeps when two writers saw it: a confirmed end wins over an
    unconfirmed one. Two confirmed ends are one end seen twice: it keeps the earlier
    time (billing stopped then) and the writer that knows who did it (``cli`` over the
    run's own ``outside``), of two that know, the earlier."""
    if newer is None:
        return older
    if older is None or not older.confirmed:
        return newer
    if not newer.confirmed:
        return older
    pair = sorted((older, newer), key=lambda e: e.ended_at or datetime.max.replace(tzinfo=UTC))
    first, second = pair
    who = second if first.ended_by in _VAGUE and second.ended_by not in _VAGUE else first
    return who.model_copy(
        update={
            "ended_at": first.ended_at or second.ended_at,
            "cause": who.cause or first.cause or second.cause,
        }
    )


def latest_record(flow_run_id: str) -> CostRecord | None:
    """The run's latest ``finetune-costs`` record, through the Prefect API; None when the
    run has none (or its latest table is not a cost record)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[COST_ARTIFACT_KEY]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),  # type: ignore[list-item]
            ),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    if not found:
        return None
    data = found[0].data
    rows: Any = json.loads(data) if isinstance(data, str) else data
    try:
        return CostRecord.from_rows(list(rows or []))
    except (ValueError, TypeError):
        return None


def publish_record(record: CostRecord) -> None:
    """Write ``record`` as a new version of the run's ``finetune-costs`` artifact, with
    the run's ``flow_run_id`` (from any process)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    description = (
        f"Cost of run {record.flow_run_id} on pod {record.pod_id or '-'}: "
        f"{record.usd:.6f} USD (ours)"
        + (f", {record.runpod_usd:.6f} USD (RunPod)" if record.runpod_usd is not None else "")
        + f"; {record.state_line()}"
    )
    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(
                key=COST_ARTIFACT_KEY,
                type="table",
                data=redact_data(record.to_rows()),
                description=redact(description),
                flow_run_id=record.flow_run_id,  # type: ignore[arg-type]
            )
        )


def rewrite_report(record: CostRecord) -> bool:
    """Bring ``<output_dir>/run-report.json`` in line with ``record`` when it can be
    reached from here; True when it was rewritten."""
    from prefect_runpod.flows.run.report import RunReport

    if not record.output_dir:
        return False
    path = Path(record.output_dir) / "run-report.json"
    try:
        report = RunReport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return False
    if report.flow_run_id and report.flow_run_id != record.flow_run_id:
        return False
    report.apply_cost_record(record)
    try:
        path.write_text(json.dumps(report.to_json_dict(), indent=2))
    except OSError:
        return False
    return True


def fetch_provider_bill(provider: PodProvider | None, record: CostRecord) -> None:
    """Fill the provider's own bill into ``record`` when its provider has one
    (``Capability.BILL``: RunPod's REST billing) and the bill has the pod's records;
    otherwise say why in ``billing_note``. Never raises."""
    if not provider_supports(record.provider, Capability.BILL):
        record.billing_note = ""
        return
    if record.pod_id is None or record.created_at is None:
        return
    who = provider_class(record.provider).display_name
    if provider is None or not provider.supports(Capability.BILL):
        record.billing_note = f"no {who} credentials here to ask its billing API"
        return
    ended = record.end.ended_at if record.end and record.end.ended_at else datetime.now(UTC)
    try:
        bill = provider.fetch_bill(record.pod_id, record.created_at, ended)  # type: ignore[attr-defined]
    except Exception as exc:  # billing is beside the record, never in its way
        record.billing_note = f"{who}'s billing did not answer ({error_text(exc)})"[:300]
        return
    if bill is None:
        record.billing_note = (
            f"{who} has no billing record yet (billing lags); run `prefect-runpod cost "
            f"{record.flow_run_id} --reconcile` later"
        )
        return
    record.runpod_usd = bill.usd
    record.runpod_billed_seconds = bill.billed_seconds
    record.billing_note = bill.note
    if record.usd is not None:
        record.difference_usd = round_usd(record.usd - bill.usd)


def record_pod_end(
    flow_run_id: str,
    end: PodEnd,
    *,
    recorded_by: str,
    handle: PodHandle | None = None,
    provider: PodProvider | None = None,
) -> CostRecord | None:
    """Record who ended a run's pod, when, and whether it was confirmed, where the run's
    record picks it up: a new ``finetune-costs`` version (and ``run-report.json`` when
    reachable). For hooks, the reaper and the CLI, which may run in another process.

    Args:
        flow_run_id: the pod's run (from its name ``<prefix>-<flow_run_id>``).
        end: the end as this writer saw it.
        recorded_by: ``hook``, ``reaper``, ``cli`` …
        handle: the pod as this writer found it (price, create time) when the run has no
            record yet.
        provider: to ask RunPod's billing.

    Returns:
        The record written, or None when the Prefect API could not be reached (logged).
    """
    try:
        record = latest_record(flow_run_id)
    except Exception as exc:
        _log.warning("run %s: could not read its cost record (%s)", flow_run_id, exc)
        record = None
    if record is None:
        if handle is None:
            _log.warning("run %s has no cost record and no pod to build one from", flow_run_id)
            return None
        record = CostRecord(
            flow_run_id=flow_run_id,
            pod_id=handle.pod_id,
            pod_name=handle.name,
            provider=handle.provider,
            gpu_type=handle.gpu_type,
            cost_per_hr=handle.cost_per_hr,
            created_at=handle.created_at,
        )
    record.end = merge_end(record.end, end)
    record.recorded_by = recorded_by
    record.recorded_at = datetime.now(UTC)
    record.settle()
    fetch_provider_bill(provider, record)
    try:
        publish_record(record)
    except Exception as exc:
        _log.warning("run %s: could not write its cost record (%s)", flow_run_id, exc)
        return None
    rewrite_report(record)
    return record
