"""The end of a fine-tune run: terminate its pod (unless kept), record who ended it and
when, settle the cost, publish the run's ``finetune-costs`` record and write
``run-report.json``, so the summary, the report, the artifact and the Prefect state all
say the same (docs/architecture.md#what-a-run-cost).

A pod whose end is not confirmed makes the run fail: ``end_run`` returns the
``TerminateError`` (naming the pod, "may still be billing" and the command that ends
it) for the flow to raise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.api_outbox import is_outage, outbox
from prefect_runpod.blocks.exceptions import TerminateError
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import (
    EndedBy,
    PodEnd,
    PodProvider,
    PodStatus,
    TerminateResult,
    end_command,
)
from prefect_runpod.blocks.secret_mask import error_text, redact
from prefect_runpod.flows.run.cost_record import (
    CostRecord,
    latest_record,
    merge_end,
    publish_record,
)
from prefect_runpod.flows.run.ledger import run_stage
from prefect_runpod.flows.run.names import forget_pod_access
from prefect_runpod.flows.run.provider_bill import fetch_provider_bill
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import StageState
from prefect_runpod.tasks.terminate import terminate

__all__ = ["end_run", "flow_end", "record_cost", "record_of", "write_report"]

_log = logging.getLogger("prefect_runpod.flows")

_WITNESSES = {"deadman": EndedBy.DEADMAN, "lease": EndedBy.LEASE, "flow": EndedBy.FLOW}
"""Who ended a pod the run found gone: a local pod's tombstone names the dead-man
(``lease`` only in one an older release left); ``flow`` is the run's own pod watch,
which terminated a pod that stayed unreachable; anything else ended it outside the run."""


def flow_end(result: TerminateResult, lost: PodStatus | None) -> PodEnd:
    """The end the run's own terminate found: ended by the run (layer 1), or, when the
    pod was already gone, by whoever ended it outside the run, billed until the first
    confirmation that it was gone.

    Args:
        result: the confirmed terminate.
        lost: what the liveness watch saw when the pod went away under the run, if it did.
    """
    if not result.already_gone:
        return result.end(
            EndedBy.FLOW,
            "terminate (the run's finally)",
            cause=lost.cause.value if lost is not None else None,
            detail=lost.provider_status if lost is not None else "",
        )
    seen = [result.confirmed_at]
    if lost is not None:
        seen.append(lost.ended_at or lost.observed_at)
    by = _WITNESSES.get((lost.ended_by if lost else None) or "", EndedBy.OUTSIDE)
    return PodEnd(
        pod_id=result.pod_id,
        ended_by=by,
        confirmed=True,
        ended_at=min(seen),
        layer=(lost.ended_layer if lost else None) or "",
        cause=lost.cause.value if lost is not None else "terminated_outside",
        detail=(lost.provider_status if lost else "gone before the run's terminate"),
    )


def record_of(report: RunReport, *, recorded_by: str = "flow") -> CostRecord:
    """The run's cost record as its report has it now (its attempts without the handles
    and ssh lines, which the table does not keep)."""
    return CostRecord(
        flow_run_id=report.flow_run_id,
        attempts=[
            a.model_copy(update={"handle": None, "ssh_command": None}) for a in report.attempts
        ],
        output_dir=report.output_dir,
        max_cost_usd=report.cost.max_cost_usd,
        published_bytes=report.publish.bytes if report.publish is not None else None,
        published_to=report.publish.target if report.publish is not None else "",
        stage_seconds=dict(report.cost.stage_seconds),
        recorded_by=recorded_by,
        carried_from=report.carried_from,
        continued_by=report.continued_by,
    )


def _merge_with_api(record: CostRecord) -> None:
    """Another writer (the CLI's terminate, a hook) may have recorded a pod's end first:
    keep, pod by pod, whichever confirmed end came first, and a bill already known."""
    try:
        earlier = latest_record(record.flow_run_id)
    except Exception as exc:  # the record is still written below; say why it is alone
        if not is_outage(exc):  # an outage: the outbox says so, once
            _log.warning("could not read the run's earlier cost record: %s", exc)
        return
    if earlier is not None:  # a run that continued this one said so in its record
        record.continued_by = record.continued_by or earlier.continued_by
    for attempt in record.attempts if earlier is not None else []:
        seen = earlier.attempt_of(attempt.pod_id) if attempt.pod_id else None  # type: ignore[union-attr]
        if seen is None:
            continue
        attempt.end = merge_end(seen.end, attempt.end)
        if attempt.provider_usd is None and seen.provider_usd is not None:
            attempt.provider_usd = seen.provider_usd
            attempt.provider_billed_seconds = seen.provider_billed_seconds
            attempt.provider_gpu_usd = seen.provider_gpu_usd
            attempt.provider_cpu_usd = seen.provider_cpu_usd
            attempt.provider_disk_usd = seen.provider_disk_usd


def record_cost(report: RunReport, provider: PodProvider | None, *, final: bool) -> None:
    """Settle and publish the run's record; at the end (``final``) also merge what other
    writers recorded and ask the provider's billing; then mirror it into the report. The
    write is held in the process's outbox (``blocks.api_outbox``): an outage of the
    Prefect API never stops the run here."""
    record = record_of(report)
    if final:
        _merge_with_api(record)
    record.settle()
    if final and not record.may_still_bill:
        fetch_provider_bill(provider, record)
    publish_record(record, hold=True)  # held through an outage of the Prefect API
    report.apply_cost_record(record)


def end_run(
    report: RunReport,
    provider: PodProvider | None,
    watch: PodWatch | None,
    *,
    keep_pod_on_failure: bool,
    terminate_timeout_seconds: float,
    on_stage: Any,
    attempt: int | None = None,
    keep_reason: str | None = None,
) -> TerminateError | None:
    """Terminate (unless kept), record the pod's end and the cost, publish, write.

    ``attempt`` is the pod attempt whose pod this ends (its ``terminate`` stage is that
    attempt's); None when the run ends before any pod attempt began. ``keep_reason``
    keeps the pod whatever the run's outcome (outputs that could not travel are on it):
    the ``terminate`` stage is Skipped with that reason.

    Returns:
        The ``TerminateError`` the run must fail with when its pod may still be billing
        (terminate not confirmed), else None. A pod kept on purpose after a failure is
        no error of its own: the run already failed, and the record says it bills.
    """
    failed = report.stopped_short
    unconfirmed: TerminateError | None = None
    lost = watch.lost if watch is not None else None
    # the last attempt carried from a continued run's record: this run rented no pod
    carried = bool(report.attempts) and report.attempts[-1].carried_from is not None
    kept = keep_reason, (keep_reason or "")[:300]  # the stage's reason, the end's detail
    if keep_reason is None and keep_pod_on_failure and failed:
        kept = "kept for inspection (keep_pod_on_failure)", "kept for inspection"
    if report.pod_id and provider is not None and not carried:
        if kept[0] is not None:
            stage = report.stage("terminate")
            stage.attempt, stage.state = attempt, StageState.SKIPPED
            stage.reason = (
                f"{kept[0]}; billing until "
                f"`{end_command(report.provider, report.pod_id)}` or the dead-man switch ends it"
            )
            report.pod_end = PodEnd(pod_id=report.pod_id, detail=kept[1])
        else:
            try:
                with run_stage(report, "terminate", on_stage, attempt=attempt):
                    result = terminate(provider, report.pod_id, terminate_timeout_seconds)
                report.pod_end = flow_end(result, lost)
                forget_pod_access(report.output_dir, report.pod_id)  # confirmed gone
            except BaseException as exc:  # never mask the run's own error
                _log.error("%s: terminate failed: %s", report.pod_id, exc)
                command = end_command(report.provider, report.pod_id)
                before = f"; the run had failed first: {report.error}" if report.error else ""
                unconfirmed = TerminateError(
                    f"pod {report.pod_id} may still be billing: its terminate was not "
                    f"confirmed ({_first_line(exc)}). End it with `{command}`{before}",
                    pod_id=report.pod_id,
                    stage="terminate",
                )
                report.pod_end = PodEnd(
                    pod_id=report.pod_id,
                    detail=f"terminate not confirmed: {redact(str(exc))}"[:300],
                )
                report.error = str(unconfirmed)
    elif report.pod_id is None or carried:
        report.stage("terminate").state = StageState.SKIPPED
        report.stage("terminate").reason = "no pod was created"
    if report.pod is not None:
        record_cost(report, provider, final=True)
    try:
        from prefect_runpod.flows.run.artifacts import publish_model_link

        publish_model_link(report)
    except Exception as exc:
        _log.warning("could not publish the model link: %s", exc)
    write_report(report)
    outbox().flush()  # the records in Prefect before the run returns, unless it is down
    return unconfirmed


def _first_line(exc: BaseException) -> str:
    lines = error_text(exc).split(": ", 1)[-1].strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def write_report(report: RunReport) -> None:
    """``<output_dir>/run-report.json``; a directory that cannot be written is logged,
    never raised (the report is still the flow's result)."""
    if not report.output_dir:
        return
    path = Path(report.output_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / "run-report.json").write_text(json.dumps(report.to_json_dict(), indent=2))
    except OSError as exc:  # preflight refuses such a dir; never mask the run's own error
        _log.warning(
            "could not write %s (%s); the report is still the flow's result",
            path / "run-report.json",
            exc.strerror or exc,
        )
