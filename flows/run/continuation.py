"""A run continued by another: ``finetune --resume-from RUN_ID`` goes on with a run whose
own process died, as new attempts of the same record
(docs/architecture.md#resuming-from-a-checkpoint).

The run that continues (``carry_run``, in ``preflight``, before anything is rented)
takes the old run's pod attempts into its own record as its attempts 1..k, each
``carried_from`` the old flow run (its end confirmed first: a pod still there refuses
the resume, so at most one pod of a run lives at a time), and its own pods are the
attempts k+1.. (``<prefix>-<flow_run_id>-a<n>``). The old record gets ``continued_by``
(``mark_continued``), written as the other out-of-run record writes are: read, merged and
written as one write of the process's outbox. Totals over many runs sum each record's
``own_attempts`` only (``counted_pods``), so a carried pod is shown twice, counted once;
a run's own total is the sum over every attempt, carried ones included.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.provider import EndedBy, PodCause, PodEnd, PodProvider, end_command
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.cost_record import (
    COST_ARTIFACT_KEY,
    CostRecord,
    latest_record,
    merge_end,
    publish_record,
)
from prefect_runpod.flows.run.crashed import mark_crashed, run_state

__all__ = [
    "carried_attempts",
    "carry_run",
    "confirm_gone",
    "continued_run_id",
    "counted_pods",
    "end_of_gone_pod",
    "mark_continued",
]

_log = logging.getLogger("prefect_runpod.flows")

_WITNESSES = {"deadman": EndedBy.DEADMAN, "lease": EndedBy.LEASE, "terminate": EndedBy.OUTSIDE}
"""Who a local pod's tombstone may name (``lease`` only in one an older release left): a
``terminate`` call is not the dead-man, whatever the run's state says."""


def end_of_gone_pod(
    record: PodAttempt,
    ended_at: datetime | None,
    witness: str | None,
    layer: str | None,
    run_state: str,
) -> PodEnd:
    """The confirmed end of a pod its provider no longer knows: at the time the provider
    recorded (``ended_at``: the local pod's tombstone), else create + the seconds RunPod
    billed, else now (an upper bound, said so); by the provider's ``witness`` (the
    dead-man), or — when no one left a record — inferred from the run's Prefect state
    ``run_state``: a run that died (still Running, or Crashed) had its pod ended by its
    dead-man. Pure but for ``now``."""
    assert record.pod_id is not None
    detail = "the provider no longer knows the pod"
    when = ended_at
    if when is None and record.created_at and record.provider_billed_seconds is not None:
        when = record.created_at + timedelta(seconds=record.provider_billed_seconds)
        detail += "; ended at create + the time RunPod billed"
    if when is None:
        when = datetime.now(UTC)
        detail += "; end not known, counted to now (an upper bound)"
    by = _WITNESSES.get(witness or "")
    inferred = by is None
    if by is None:
        died = run_state in ("RUNNING", "CRASHED", "PENDING")
        by = EndedBy.DEADMAN if died else EndedBy.OUTSIDE
        detail += f"; no witness left a record, so inferred from the run ({run_state})"
    return PodEnd(
        pod_id=record.pod_id,
        ended_by=by,
        confirmed=True,
        ended_at=when,
        layer=layer or "",
        cause="terminated_outside",
        inferred=inferred,
        detail=detail,
    )


def continued_run_id(value: str) -> str | None:
    """The flow run ``resume_from`` continues: the id itself, or the run whose
    ``run-report.json`` lies in the output dir named (or above the checkpoint folder
    named); None when no report says."""
    from prefect_runpod.blocks.validation.names import check_flow_run_id

    try:
        return check_flow_run_id(value, "resume_from")
    except SpecError:
        pass
    path = Path(value).expanduser().resolve()
    if (path.parent / f"{path.name}.manifest.json").is_file():  # one checkpoint folder
        path = path.parent.parent
    try:
        found = json.loads((path / "run-report.json").read_text()).get("flow_run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return str(found) if found else None


def carried_attempts(old: CostRecord, ends: dict[str, PodEnd] | None = None) -> list[PodAttempt]:
    """The old run's attempts as the first ones of the run that continues it: copies,
    each ``carried_from`` the run that rented its pod (the old run, or the one it had
    carried it from), with the confirmed ends in ``ends`` (pod id → end) merged in. Pure.

    Args:
        old: the continued run's latest record.
        ends: ends confirmed now for pods the old record had left unconfirmed.

    Returns:
        Attempts 1..k, in the old record's order and numbers.
    """
    out = []
    for a in old.attempts:
        copy = a.model_copy(deep=True, update={"handle": None, "ssh_command": None})
        copy.carried_from = a.carried_from or old.flow_run_id
        if a.pod_id is not None and a.pod_id in (ends or {}):
            copy.end = merge_end(copy.end, (ends or {})[a.pod_id])
            copy.settle(datetime.now(UTC))
        out.append(copy)
    return out


def counted_pods(records: list[CostRecord]) -> list[PodAttempt]:
    """The pods totals over ``records`` sum: each record's own (not carried) attempts
    that rented a pod, each pod once. Pure."""
    seen: dict[str, PodAttempt] = {}
    for record in records:
        for a in record.own_attempts:
            if a.pod_id is not None:
                seen.setdefault(a.pod_id, a)
    return list(seen.values())


def confirm_gone(old: CostRecord, provider: PodProvider, timeout: float) -> dict[str, PodEnd]:
    """The ends of the old run's pods its record left unconfirmed, confirmed now: gone
    (at the provider's time, by its witness), or EXITED / host lost and terminated here
    (within ``timeout`` seconds).

    Returns:
        Pod id → its confirmed end, for each pod the record had not confirmed.

    Raises:
        SpecError: a pod still runs or is starting, its provider cannot be asked, or it
            is another provider's than this run's (nothing is rented).
    """
    ends: dict[str, PodEnd] = {}
    for a in old.attempts:
        if a.confirmed or a.pod_id is None:
            continue
        why = f"resume_from {old.flow_run_id}: its pod {a.pod_id}"
        if a.provider != provider.provider_name:
            raise SpecError(
                f"{why} is a {a.provider} pod and this run's provider is {provider.provider_name}: "
                f"confirm its end first with `prefect-runpod cost {old.flow_run_id} "
                "--reconcile`; nothing was rented"
            )
        status = provider.status(a.pod_id)
        if status.cause is PodCause.TERMINATED_OUTSIDE:
            ends[a.pod_id] = end_of_gone_pod(
                a, status.ended_at, status.ended_by, status.ended_layer, run_state(old.flow_run_id)
            )
        elif status.gone:  # EXITED, host lost: ended here, confirmed, before anything new
            result = provider.terminate(a.pod_id, timeout_seconds=timeout)
            ends[a.pod_id] = result.end(
                EndedBy.FLOW, "terminate (the run that continued it)",
                cause=status.cause.value, detail=status.provider_status,
            )  # fmt: skip
        else:
            raise SpecError(
                f"{why} is still there ({status.provider_status}): a run has at most one pod "
                "alive, so wait for its dead-man switch to end it (heartbeat_stale_seconds) "
                f"or end it with `{end_command(a.provider, a.pod_id)}`; nothing was rented"
            )
    return ends


def mark_continued(old_id: str, new_id: str, ends: dict[str, PodEnd]) -> CostRecord | None:
    """Write ``continued_by`` = ``new_id`` into run ``old_id``'s record, with the pod ends
    confirmed for it (``ends``), bring its ``run-report.json`` in line when it can be
    reached, and set the old flow run Crashed when Prefect still says it is not over
    (``flows/run/crashed.mark_crashed``): read, merge and write as one write of the
    process's outbox (``blocks.api_outbox``), held through an outage of the Prefect API.

    Returns:
        The record written; None while it is held or when the run has no record.
    """

    def complete(_client: Any) -> CostRecord | None:  # an outage raises: done again later
        from prefect_runpod.flows.run.report_file import rewrite_report

        record = latest_record(old_id)
        if record is None:
            return None
        for a in record.attempts:
            if a.pod_id in ends:
                a.end = merge_end(a.end, ends[a.pod_id])
        record.continued_by = new_id
        record.recorded_by, record.recorded_at = "continued", datetime.now(UTC)
        record.settle()
        publish_record(record)
        rewrite_report(record)
        # Its process died (Prefect would show it Running forever): Crashed, naming who goes on.
        mark_crashed(
            old_id, f"the run's process died; flow run {new_id} continues it (--resume-from)"
        )
        return record

    held = outbox().put(f"the {COST_ARTIFACT_KEY} record of run {old_id} (continued)", complete)
    if outbox().wait_for(held):
        return held.result if isinstance(held.result, CostRecord) else None
    _log.warning("run %s: its continued_by: %s", old_id, held.error or "held until Prefect answers")
    return None


def carry_run(report: Any, value: str | None, provider: PodProvider, timeout: float) -> bool:
    """Make ``report``'s run a continuation of the run ``resume_from`` names: its
    attempts carried as this run's first ones (``carried_attempts``), ``carried_from``
    set, the old record marked ``continued_by`` this run (``mark_continued``).

    Args:
        report: the new run's ``RunReport`` (no pod attempt of its own yet).
        value: the ``resume_from`` parameter (a flow run id, an output dir, a
            checkpoint folder), or None.
        provider: this run's provider, to confirm the old pods' ends.
        timeout: seconds to wait for a terminate to be confirmed.

    Returns:
        True when the run continues another's record; False when there is none to
        continue (no ``resume_from``, or no record of the run it names: the run then has
        a record of its own, as a checkpoint copied from anywhere does).

    Raises:
        SpecError: a pod of the old run may still live (see ``confirm_gone``).
    """
    old_id = continued_run_id(value) if value is not None else None
    old = latest_record(old_id) if old_id and old_id != report.flow_run_id else None
    if old is None:
        if value is not None:
            _log.info("resume_from %s: no run record to continue; this run's record is its own", value)  # fmt: skip
        return False
    ends = confirm_gone(old, provider, timeout)
    report.attempts = carried_attempts(old, ends)
    report.carried_from = old.flow_run_id
    mark_continued(old.flow_run_id, report.flow_run_id, ends)
    _log.info(
        "continuing run %s: its %d pod attempt(s) carried into this run's record, this run's "
        "first pod is attempt %d",
        old.flow_run_id,
        len(report.attempts),
        len(report.attempts) + 1,
    )
    return True
