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
from typing import Any

from pydantic import Field

from prefect_runpod.blocks.api_outbox import Held, fresh_client, outbox
from prefect_runpod.blocks.costs import round_usd
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import EndedBy, PodEnd, PodProvider, end_command
from prefect_runpod.blocks.provider_registry import (
    provider_class,
    provider_names,
)
from prefect_runpod.blocks.secret_mask import redact, redact_data
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER
from prefect_runpod.flows.run.attempts import AttemptField, LastAttemptView, PodAttempt

__all__ = [
    "COST_ARTIFACT_KEY",
    "CostRecord",
    "attempt_state_line",
    "latest_record",
    "merge_end",
    "publish_record",
    "record_pod_end",
]

COST_ARTIFACT_KEY = "finetune-costs"
_log = logging.getLogger("prefect_runpod.costs")


def _as_recorded(record: CostRecord, end: PodEnd | None) -> PodEnd | None:
    """The last pod's end as this version of the record has it (recorded then)."""
    return end.model_copy(update={"recorded_at": record.recorded_at}) if end else None


class CostRecord(LastAttemptView):
    """One run's cost, as its ``finetune-costs`` artifact holds it: a row per pod attempt.

    Attributes:
        flow_run_id: the run.
        attempts: every pod the run rented (``PodAttempt``: the pod, its end, our
            estimate, the provider's bill), in order.
        output_dir: where the run keeps ``run-report.json`` (on the run's machine).
        max_cost_usd: the budget, if any.
        published_bytes / published_to: what the pod published itself (bytes that did not
            cross the gateway) and where, when the run published.
        stage_seconds: seconds per stage (over every attempt).
        recorded_by: who wrote this version (``flow``, ``hook``, ``reaper``, ``cli``,
            ``cost --reconcile``).
        recorded_at: when.
        carried_from: the run this one continues (``finetune --resume-from RUN_ID``):
            its attempts are this record's first ones, each ``carried_from`` it; None
            for a run that started afresh.
        continued_by: the run that continued this one from its checkpoint, once one did.

    Views of the last attempt, under the names the table always had: ``pod_id``,
    ``pod_name``, ``provider``, ``gpu_type``, ``cost_per_hr`` (USD/h), ``created_at``
    (billing starts), ``end`` (``end.confirmed`` False while it may still bill; its
    ``recorded_at`` is the record's), ``billed_seconds`` / ``usd`` (our estimate, create
    → confirmed end, to now while it may still bill), ``runpod_usd`` /
    ``runpod_billed_seconds`` (the provider's own bill: RunPod's REST billing, parts too),
    ``difference_usd`` (``usd - runpod_usd``) and ``billing_note`` (why the bill is
    missing, when it is).
    """

    pod_id = AttemptField[str | None]("pod_id", None)
    pod_name = AttemptField[str]("pod_name", "")
    provider = AttemptField[str]("provider", DEFAULT_PROVIDER)
    gpu_type = AttemptField[str]("gpu_type", "-")
    cost_per_hr = AttemptField[float]("cost_per_hr", 0.0)
    created_at = AttemptField[datetime | None]("created_at", None)
    end = AttemptField[PodEnd | None]("end", None, shown=_as_recorded)
    billed_seconds = AttemptField[float]("billed_seconds", 0.0)
    usd = AttemptField[float]("usd", 0.0)
    runpod_usd = AttemptField[float | None]("provider_usd", None)
    runpod_billed_seconds = AttemptField[float | None]("provider_billed_seconds", None)
    runpod_gpu_usd = AttemptField[float | None]("provider_gpu_usd", None)
    runpod_cpu_usd = AttemptField[float | None]("provider_cpu_usd", None)
    runpod_disk_usd = AttemptField[float | None]("provider_disk_usd", None)
    difference_usd = AttemptField[float | None]("difference_usd", None)
    billing_note = AttemptField[str]("billing_note", "")

    flow_run_id: str
    output_dir: str | None = None
    max_cost_usd: float | None = None
    published_bytes: int | None = None
    published_to: str = ""
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    recorded_by: str = "flow"
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    carried_from: str | None = None
    continued_by: str | None = None

    def attempt_of(self, pod_id: str) -> PodAttempt | None:
        """The attempt of pod ``pod_id``, or None."""
        return next((a for a in self.attempts if a.pod_id == pod_id), None)

    @property
    def total_usd(self) -> float:
        """Our estimate over every pod of the run, carried ones included, USD."""
        return round_usd(sum(a.usd for a in self.attempts))

    @property
    def total_billed_seconds(self) -> float:
        """Billed seconds over every pod of the run, carried ones included."""
        return round(sum(a.billed_seconds for a in self.attempts), 3)

    @property
    def own_attempts(self) -> list[PodAttempt]:
        """The pods this run rented itself (not ``carried_from`` another run's record):
        what totals over many runs sum, so each pod counts once."""
        return [a for a in self.attempts if a.carried_from is None]

    @property
    def provider_display(self) -> str:
        """The provider in a sentence (``RunPod``), or its name when not registered here."""
        known = self.provider in provider_names()
        return str(provider_class(self.provider).display_name) if known else self.provider

    @property
    def may_still_bill(self) -> bool:
        """True while a pod of the run exists and its end is not confirmed."""
        return not all(a.confirmed for a in self.attempts)

    def state_line(self) -> str:
        """One line: ``ended by the flow at …, confirmed`` / ``may still be billing: …``,
        of the first pod that may still bill, else of the last; ``; continued by RUN`` once
        another run continued this one."""
        pending = [a for a in self.attempts if not a.confirmed]
        line = attempt_state_line(
            pending[0] if pending else self.attempts[-1] if self.attempts else None
        )
        return line + (f"; continued by {self.continued_by}" if self.continued_by else "")

    def settle(self, now: datetime | None = None) -> None:
        """Recompute each attempt's estimate: create → its confirmed end (or ``now`` while
        the pod may still be billing), and the difference with the provider's bill."""
        for attempt in self.attempts:
            attempt.settle(now or datetime.now(UTC))

    def to_rows(self) -> list[dict[str, Any]]:
        """The artifact's table: a row per pod attempt, a column per fact, so the Prefect
        UI can sort and compare runs. Numbers stay numbers (``null`` when not known) and
        every unit is in its column's name: ``cost_per_hr_usd_per_h``, ``billed_s``,
        ``usd``, ``published_bytes``, times as ISO-8601 ``…_utc``; each stage's seconds
        in its own ``stage_<name>_s`` column. ``from_rows`` reads it back whole.

        Returns:
            One row per attempt (one for a run with one pod), each a dict of
            str/float/int/bool/None.
        """
        return [self._row(a) for a in self.attempts or [PodAttempt()]]

    def _row(self, a: PodAttempt) -> dict[str, Any]:
        end = a.end or PodEnd(pod_id=a.pod_id or "-")
        row: dict[str, Any] = {
            "flow_run_id": self.flow_run_id,
            "attempt": a.number,
            "state": attempt_state_line(a),
            "pod_id": a.pod_id,
            "pod_name": a.pod_name,
            "provider": a.provider,
            "gpu_type": a.gpu_type,
            "gpu_count": a.gpu_count,
            "data_center": a.data_center,
            "cost_per_hr_usd_per_h": a.cost_per_hr,
            "billed_s": a.billed_seconds,
            "usd": a.usd,
            "runpod_usd": a.provider_usd,
            "runpod_billed_s": a.provider_billed_seconds,
            **{f"runpod_{p}_usd": getattr(a, f"provider_{p}_usd") for p in ("gpu", "cpu", "disk")},
            "difference_usd": a.difference_usd,
            "billing_note": a.billing_note,
            "max_cost_usd": self.max_cost_usd,
            "created_at_utc": _iso(a.created_at),
            "ready_at_utc": _iso(a.ready_at),
            "ended_at_utc": _iso(end.ended_at),
            "end_confirmed": end.confirmed,
            "ended_by": end.ended_by.value,
            "ended_by_inferred": end.inferred,
            "end_layer": end.layer,
            "end_cause": end.cause,
            "end_detail": end.detail,
            "end_recorded_at_utc": _iso(a.end.recorded_at) if a.end else None,
            "resumed_from": a.resumed_from,
            "steps_lost": a.steps_lost,
            "attempt_carried_from": a.carried_from,
            "carried_from": self.carried_from,
            "continued_by": self.continued_by,
            "published_bytes": self.published_bytes,
            "published_to": self.published_to,
            "output_dir": self.output_dir,
            "recorded_by": self.recorded_by,
            "recorded_at_utc": _iso(self.recorded_at),
        }
        for stage, seconds in self.stage_seconds.items():
            row[f"{_STAGE_PREFIX}{stage}{_STAGE_SUFFIX}"] = seconds
        return row

    @classmethod
    def from_artifact(cls, artifact: Any) -> CostRecord | None:
        """The record a ``finetune-costs`` artifact holds (its table as JSON text or as
        data); None when the table is not a cost record (see ``from_rows``)."""
        data = artifact.data
        rows: Any = json.loads(data) if isinstance(data, str) else data
        try:
            return cls.from_rows(list(rows or []))
        except (ValueError, TypeError):
            return None

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> CostRecord:
        """Read a record back from its table (see ``to_rows``): an older one (one row, no
        ``attempt`` column) as one attempt, its ``lease`` column ignored (``ended_by: lease`` reads).

        Raises:
            ValueError: the table is not a cost record (rows with a flow_run_id and the
                attempts 1, 2, … in order).
        """
        good = rows and all(isinstance(r, dict) and "flow_run_id" in r for r in rows)
        numbers = [r.get("attempt", 1) for r in rows] if good else []
        if not good or numbers != list(range(1, len(rows) + 1)):
            raise ValueError("not a cost record: expected one row per attempt with a flow_run_id")
        row = rows[-1]
        recorded_at = _when(row.get("recorded_at_utc")) or datetime.now(UTC)
        return cls(
            flow_run_id=str(row["flow_run_id"]),
            attempts=[_attempt_of(r, recorded_at) for r in rows],
            output_dir=row.get("output_dir"),
            max_cost_usd=row.get("max_cost_usd"),
            published_bytes=row.get("published_bytes"),
            published_to=row.get("published_to") or "",
            stage_seconds={
                key[len(_STAGE_PREFIX) : -len(_STAGE_SUFFIX)]: float(value)
                for key, value in row.items()
                if key.startswith(_STAGE_PREFIX) and key.endswith(_STAGE_SUFFIX)
            },
            recorded_by=str(row.get("recorded_by") or "flow"),
            recorded_at=recorded_at,
            carried_from=row.get("carried_from"),
            continued_by=row.get("continued_by"),
        )


def attempt_state_line(a: PodAttempt | None) -> str:
    """One pod attempt's state in a line: ``ended by the flow at …, confirmed``, ``pod …
    may still be billing: end it with …`` or ``no pod was created``."""
    if a is None or a.pod_id is None:
        return "no pod was created"
    end = a.end
    if end is None or not end.confirmed:
        return (
            f"pod {a.pod_id} may still be billing: end it with "
            f"`{end_command(a.provider, a.pod_id)}`"
        )
    at = end.ended_at.isoformat() if end.ended_at else "?"
    how = f", {end.layer}" if end.layer else ""
    guessed = " (inferred)" if end.inferred else ""
    return f"ended by {end.ended_by.value}{guessed} at {at}{how}, confirmed"


def _attempt_of(row: dict[str, Any], recorded_at: datetime) -> PodAttempt:
    """One row of the table as the attempt it records."""
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
            recorded_at=_when(row.get("end_recorded_at_utc")) or recorded_at,
        )
    return PodAttempt(
        number=int(row.get("attempt") or 1),
        pod_id=pod_id,
        pod_name=row.get("pod_name") or "",
        provider=row.get("provider") or DEFAULT_PROVIDER,
        gpu_type=str(row.get("gpu_type") or "-"),
        **{k: row.get(k) for k in ("gpu_count", "data_center", "difference_usd")},  # as named
        **{k: row.get(k) for k in ("resumed_from", "steps_lost")},
        carried_from=row.get("attempt_carried_from"),
        cost_per_hr=float(row.get("cost_per_hr_usd_per_h") or 0.0),
        created_at=_when(row.get("created_at_utc")),
        ready_at=_when(row.get("ready_at_utc")),
        end=end,
        billed_seconds=float(row.get("billed_s") or 0.0),
        usd=float(row.get("usd") or 0.0),
        provider_usd=row.get("runpod_usd"),
        provider_billed_seconds=row.get("runpod_billed_s"),
        **{f"provider_{p}_usd": row.get(f"runpod_{p}_usd") for p in ("gpu", "cpu", "disk")},
        billing_note=row.get("billing_note") or "",
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
    run has none (or its latest table is not a cost record).

    Raises:
        Whatever the Prefect client raises when the API cannot be reached (at once: a
        client of its own, not the flow engine's, which retries for a minute).
    """
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    with fresh_client() as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[COST_ARTIFACT_KEY]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),  # type: ignore[list-item]
            ),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    return CostRecord.from_artifact(found[0]) if found else None


def publish_record(record: CostRecord, *, hold: bool = False) -> Held | None:
    """Write ``record`` as a new version of the run's ``finetune-costs`` artifact, with
    the run's ``flow_run_id`` (from any process).

    Args:
        record: the record.
        hold: queue the write in the process's outbox (``blocks.api_outbox``) and return
            at once: the run itself, which must go on through an outage of the API.
            Otherwise it is written now (a command, a hook, the reaper).

    Returns:
        The held write (``hold``), else None.

    Raises:
        Whatever the Prefect client raises (not with ``hold``).
    """
    from prefect.client.schemas.actions import ArtifactCreate

    pods = ", ".join(a.pod_id for a in record.attempts if a.pod_id) or "-"
    billed = [a.provider_usd for a in record.attempts if a.provider_usd is not None]
    theirs = f", {sum(billed):.6f} USD ({record.provider_display})" if billed else ""
    description = (
        f"Cost of run {record.flow_run_id} on pod {pods}: {record.total_usd:.6f} USD (ours)"
        f"{theirs}; {record.state_line()}"
    )
    create = ArtifactCreate(
        key=COST_ARTIFACT_KEY,
        type="table",
        data=redact_data(record.to_rows()),
        description=redact(description),
        flow_run_id=record.flow_run_id,  # type: ignore[arg-type]
    )
    if hold:
        return outbox().put(
            f"the {COST_ARTIFACT_KEY} record", lambda client: client.create_artifact(create)
        )
    with fresh_client() as client:
        client.create_artifact(create)
    return None


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
    reachable), for the writers outside the run (hooks, reaper, guardian, worker, CLI).
    Read, merge and write are one write of the process's outbox (``blocks.api_outbox``):
    held through an outage of the Prefect API, done once it answers. A confirmed end
    also deletes the pod's key kept beside the run's outputs (``forget_pod_access``).

    Args:
        flow_run_id: the pod's run (from its name ``<prefix>-<flow_run_id>``).
        end: the end as this writer saw it.
        recorded_by: ``hook``, ``reaper``, ``cli`` …
        handle: the pod as this writer found it (price, create time) when the run has no
            record yet.
        provider: to ask RunPod's billing.

    Returns:
        The record written; None while it is held (an outage) or when it could not be.
    """

    def complete(_client: Any) -> CostRecord | None:  # an outage raises: done again later
        from prefect_runpod.flows.run.names import forget_pod_access
        from prefect_runpod.flows.run.report_file import rewrite_report

        record = latest_record(flow_run_id)
        attempt = record.attempt_of(end.pod_id) if record is not None else None
        if attempt is None and handle is None:
            _log.warning("run %s: no cost record of pod %s to complete", flow_run_id, end.pod_id)
            return None
        if record is None:
            record = CostRecord(flow_run_id=flow_run_id)
        if attempt is None:
            assert handle is not None
            attempt = PodAttempt.of(handle, len(record.attempts) + 1).model_copy(
                update={"handle": None}
            )
            record.attempts.append(attempt)
        attempt.end = merge_end(attempt.end, end)
        record.recorded_by = recorded_by
        record.recorded_at = datetime.now(UTC)
        record.settle()
        if record.end is not None and record.end.confirmed:
            forget_pod_access(record.output_dir, record.pod_id)  # the pod is confirmed gone
        from prefect_runpod.flows.run.provider_bill import fetch_provider_bill

        fetch_provider_bill(provider, record)
        publish_record(record)
        rewrite_report(record)
        return record

    held = outbox().put(f"the {COST_ARTIFACT_KEY} record of pod {end.pod_id}'s end", complete)
    if outbox().wait_for(held):
        return held.result if isinstance(held.result, CostRecord) else None
    why = held.error or "held until the Prefect API answers"
    _log.warning("run %s: the cost record of pod %s's end: %s", flow_run_id, end.pod_id, why)
    return None
