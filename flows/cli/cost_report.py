"""The body of ``prefect-runpod cost`` (its parser and input checks: :mod:`.cost`): read
the ``finetune-costs`` records from the Prefect API, complete them with ``--reconcile``
(``reconcile``: the pod's end from its provider, RunPod's bill), sum them (``totals``)
and show them. Imported only once the command's input passed, so the CLI's parser and
the other commands load none of the run's records.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from prefect_runpod.blocks.provider import Capability, PodCause, PodEnd, PodProvider
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.continuation import counted_pods, end_of_gone_pod
from prefect_runpod.flows.run.cost_record import (
    COST_ARTIFACT_KEY,
    CostRecord,
    attempt_state_line,
    latest_record,
    publish_record,
)
from prefect_runpod.flows.run.crashed import FINISHED_STATE_TYPES, run_state
from prefect_runpod.flows.run.provider_bill import fetch_provider_bill
from prefect_runpod.flows.run.report_file import merge_report_ends, rewrite_report

__all__ = ["reconcile", "show_costs", "totals"]


def _run_parameters(run_id: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return dict(client.read_flow_run(run_id).parameters or {})  # type: ignore[arg-type]


def reconcile(record: CostRecord, provider: PodProvider | None, run_state: str) -> CostRecord:
    """Complete ``record`` from what the provider and RunPod's billing say now (pure
    apart from those two calls; nothing is written here).

    A pod the provider no longer knows is ended: at the time its provider recorded (the
    local pod's tombstone), else create + the seconds RunPod billed, else now (an upper
    bound, said so). Who ended it: the provider's witness (the dead-man), or — when no one
    left a record — inferred from the run's state: a run that died (still Running, or
    Crashed) had its pod ended by the dead-man.

    Args:
        record: the run's latest record.
        provider: the pod's provider (None: the pod's state cannot be asked).
        run_state: the run's Prefect state type (``RUNNING``, ``CRASHED``…).

    Returns:
        The completed record (a copy), ``recorded_by`` = ``cost --reconcile``.
    """
    out = record.model_copy(deep=True)
    out.recorded_by, out.recorded_at = "cost --reconcile", datetime.now(UTC)
    for attempt in out.attempts:
        if attempt.pod_id is not None:
            _reconcile_attempt(out, attempt, provider, run_state)
    return out


def _reconcile_attempt(
    record: CostRecord, attempt: PodAttempt, provider: PodProvider | None, run_state: str
) -> None:
    """``reconcile`` for one pod of the run (changed in place)."""
    assert attempt.pod_id is not None
    status = None
    if not attempt.confirmed and provider is not None:
        status = provider.status(attempt.pod_id)
    fetch_provider_bill(provider, record)  # the bill, whenever it has the pod's records
    if status is not None and status.cause is PodCause.TERMINATED_OUTSIDE:
        attempt.end = end_of_gone_pod(
            attempt, status.ended_at, status.ended_by, status.ended_layer, run_state
        )
    elif status is not None:
        attempt.end = PodEnd(
            pod_id=attempt.pod_id,
            detail=f"still there at {status.observed_at.isoformat()}: {status.provider_status}; "
            "it may still be billing",
        )
    record.settle()
    if attempt.provider_usd is not None:
        fetch_provider_bill(provider, record)  # the window now ends at the confirmed end


def _provider_for(record: CostRecord, args: argparse.Namespace) -> PodProvider | None:
    from prefect_runpod.flows.run.providers import build_provider

    params = _run_parameters(record.flow_run_id)
    for name in ("runpod_credentials_block", "runpod_spec_block", "ssh_key_block"):
        given = getattr(args, name, None)
        if given:
            params[name] = given
    params["provider"] = args.provider or record.provider
    provider, _ = build_provider(params, need_ssh_key=False)
    return provider


def _recent_records(limit: int) -> list[CostRecord]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    seen: dict[str, CostRecord] = {}
    wanted = max(1, limit) * 8  # a run's record has a version per writer
    with get_client(sync_client=True) as client:
        for offset in range(0, wanted, _PAGE):
            page = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[COST_ARTIFACT_KEY])),
                sort=ArtifactSort.CREATED_DESC,
                limit=min(_PAGE, wanted - offset),
                offset=offset,
            )
            for artifact in page:
                record = CostRecord.from_artifact(artifact)
                if record is not None:
                    seen.setdefault(record.flow_run_id, record)
                if len(seen) >= limit:
                    return list(seen.values())
            if len(page) < min(_PAGE, wanted - offset):
                break
    return list(seen.values())


_PAGE = 200
"""The most artifacts the Prefect API returns per request (a larger limit is a 422)."""


def totals(records: list[CostRecord]) -> dict[str, Any]:
    """The totals of ``records``, each pod counted once: a pod carried into the record of
    the run that continued its run (``--resume-from``) is summed in its own run's record
    only (``flows.run.continuation.counted_pods``). Runs, pods, billed seconds, USD
    (ours), the providers' USD over the pods whose bill is known (and how many runs
    those are), and how many runs may still be billing."""
    pods = counted_pods(records)
    billed = [a for a in pods if a.provider_usd is not None]
    ids = {a.pod_id for a in billed}
    billed_runs = {r.flow_run_id for r in records for a in r.own_attempts if a.pod_id in ids}
    return {
        "runs": len(records),
        "pods": len(pods),
        "billed_seconds": round(sum(a.billed_seconds for a in pods), 3),
        "usd": round(sum(a.usd for a in pods), 8),
        "runpod_usd": round(sum(a.provider_usd or 0.0 for a in billed), 8) if billed else None,
        "runpod_billed_runs": len(billed_runs),
        "may_still_bill": sum(1 for r in records if r.may_still_bill),
    }


def _show(records: list[CostRecord], as_json: bool) -> None:
    total = totals(records)
    if as_json:
        runs = [r.model_dump(mode="json") for r in records]
        print(json.dumps({"runs": runs, "totals": total}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="finetune-costs", show_footer=True)
    footer = {
        "run": f"total: {total['runs']} runs, {total['pods']} pods",
        "billed s": f"{total['billed_seconds']:.1f}",
        "USD (ours)": f"{total['usd']:.6f}",
        "USD (RunPod)": "-"
        if total["runpod_usd"] is None
        else f"{total['runpod_usd']:.6f} ({total['runpod_billed_runs']} runs)",
        "end": f"{total['may_still_bill']} may still be billing" if total["may_still_bill"] else "",
    }
    columns = (
        "run",
        "pod",
        "GPU",
        "USD/h",
        "billed s",
        "USD (ours)",
        "USD (RunPod)",
        "difference",
        "end",
    )
    for column in columns:
        table.add_column(column, footer=footer.get(column, ""), overflow="fold")
    for r in records:
        for a in r.attempts or [PodAttempt()]:  # a row per pod of the run
            table.add_row(
                r.flow_run_id if a.number == 1 else f"  attempt {a.number}",
                f"{a.pod_id or '-'} ({a.provider})",
                a.gpu_type,
                f"{a.cost_per_hr:.3f}",
                f"{a.billed_seconds:.1f}",
                f"{a.usd:.6f}",
                "-" if a.provider_usd is None else f"{a.provider_usd:.6f}",
                "-" if a.difference_usd is None else f"{a.difference_usd:+.6f}",
                attempt_state_line(a)
                + (f"; carried from run {a.carried_from}, counted there" if a.carried_from else ""),
            )
    Console(width=200).print(table)


def show_costs(args: argparse.Namespace, run_id: str | None) -> int:
    """``cost`` once its input passed and the API is open: the record of ``run_id`` (or of
    the ``args.limit`` latest runs created since ``args.since_at``), completed first with
    ``args.reconcile``, shown as a table (or ``args.json``) with the providers' bills.

    Returns:
        The exit status: 1 when a record still says its pod may be billing, else 0.
    """
    if run_id is not None:
        record = latest_record(run_id)
        if record is None:
            from prefect_runpod.flows.cli.runs import require_run

            require_run(run_id)  # an unknown run is an error, as in every command
            print(f"run {run_id} has no {COST_ARTIFACT_KEY} record (no pod was ever recorded)")
            return 0
        records = [record]
    else:
        records = _recent_records(args.limit)
        since = getattr(args, "since_at", None)
        if since is not None:
            records = [r for r in records if r.created_at is not None and r.created_at >= since]
    if args.reconcile:
        records = [_reconciled(record, args) for record in records]
    _show(records, args.json)
    if not args.json:
        _show_bills(records)
    return 1 if any(r.may_still_bill for r in records) else 0


def _reconciled(record: CostRecord, args: argparse.Namespace) -> CostRecord:
    """One record through ``--reconcile``: completed when it can be, what it means said
    on stderr (a local pod's missing bill, a stale Running state and its fix)."""
    state = run_state(record.flow_run_id)
    merged = merge_report_ends(record)  # a confirmed end the run kept while Prefect was down
    done = (
        not merged
        and not record.may_still_bill
        and all(
            not provider_supports(a.provider, Capability.BILL) or a.provider_usd is not None
            for a in record.attempts
            if a.pod_id is not None
        )
    )
    if not done:
        record = reconcile(record, _provider_for(record, args), state)
        publish_record(record)
        rewritten = rewrite_report(record)
        print(
            f"run {record.flow_run_id}: {record.state_line()}"
            + ("; run-report.json rewritten" if rewritten else ""),
            file=sys.stderr,
        )
    unbilled = sorted(
        {a.provider for a in record.attempts if not provider_supports(a.provider, Capability.BILL)}
    )
    for name in unbilled:
        print(
            f"run {record.flow_run_id}: {provider_class(name).display_name} has no bill to "
            "reconcile (nothing is billed; our figure is its price × the billed seconds)",
            file=sys.stderr,
        )
    if (
        record.pod_id is not None
        and not record.may_still_bill
        and state not in FINISHED_STATE_TYPES
    ):
        _stale_running(record, state, mark=getattr(args, "mark_crashed", False))
    return record


def _stale_running(record: CostRecord, state: str, *, mark: bool) -> None:
    """Say that the run's Prefect state outlived its pod (or fix it with ``mark``)."""
    from prefect_runpod.flows.run.crashed import mark_crashed

    assert record.end is not None
    at = record.end.ended_at.isoformat() if record.end.ended_at else "?"
    cause = (
        f"the run's pod {record.pod_id} ended at {at} (by {record.end.ended_by.value}) while "
        f"Prefect still said {state}: its process was killed"
    )
    if mark and mark_crashed(record.flow_run_id, cause):
        print(f"run {record.flow_run_id}: marked Crashed ({cause})", file=sys.stderr)
        return
    print(
        f"run {record.flow_run_id} still says {state} in Prefect, but {cause.split(' while ')[0]}: "
        f"mark it Crashed with `prefect-runpod cost {record.flow_run_id} --reconcile "
        "--mark-crashed`",
        file=sys.stderr,
    )


def _show_bills(records: list[CostRecord]) -> None:
    """The provider's bill in its parts (RunPod's GPU, CPU and disk amounts), beside our
    estimate, for each pod that has one."""
    for r in records:
        for a in r.attempts:
            if a.provider_usd is None:
                continue
            parts = ", ".join(
                f"{name} {value:.6f}"
                for name, value in (
                    ("GPU", a.provider_gpu_usd),
                    ("CPU", a.provider_cpu_usd),
                    ("disk", a.provider_disk_usd),
                )
                if value is not None
            )
            pod = f" pod {a.pod_id}" if len(r.attempts) > 1 else ""
            print(
                f"run {r.flow_run_id}{pod}: RunPod billed {a.provider_usd:.6f} USD"
                + (f" ({parts})" if parts else "")
                + f"; ours {a.usd:.6f} USD"
                + (f", difference {a.difference_usd:+.6f}" if a.difference_usd is not None else "")
            )
