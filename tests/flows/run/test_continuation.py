"""A run continued by another (``finetune --resume-from RUN_ID``) as new attempts of the
same record (#25, item 4): the old attempts are carried into the new record, marked so;
the old record says who continued it; totals over runs count each pod once while a run's
own total sums every attempt, carried ones included. Plain functions, no Prefect."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.provider import EndedBy, PodCause, PodEnd
from prefect_runpod.flows.cli.cost_report import totals
from prefect_runpod.flows.run.attempts import PodAttempt, attempt_line
from prefect_runpod.flows.run.continuation import carried_attempts, counted_pods
from prefect_runpod.flows.run.cost_record import CostRecord
from prefect_runpod.flows.run.report import RunReport, render_summary
from tests.fixtures.fault_matrix import wait_until

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
OLD = "0b6e2f0e-5f43-4f7c-9b0e-8d5c1c1b2a3f"
NEW = "7d1c1a52-93a4-4f1e-a7a5-2b1f4f7e9c10"


def _pod(number: int, pod_id: str, seconds: float, *, confirmed: bool = True) -> PodAttempt:
    end = PodEnd(
        pod_id=pod_id,
        ended_by=EndedBy.DEADMAN if confirmed else EndedBy.UNKNOWN,
        confirmed=confirmed,
        ended_at=T0 + timedelta(seconds=seconds) if confirmed else None,
    )
    attempt = PodAttempt(
        number=number, pod_id=pod_id, pod_name=f"p-{pod_id}", provider="local",
        gpu_type="cpu", cost_per_hr=0.36, created_at=T0, end=end,
    )  # fmt: skip
    attempt.settle(T0 + timedelta(seconds=seconds))
    return attempt


def test_the_old_attempts_are_carried_as_the_first_ones_of_the_new_record() -> None:
    old = CostRecord(flow_run_id=OLD, attempts=[_pod(1, "pod-a", 36.0)])
    pending = _pod(2, "pod-b", 0.0, confirmed=False)
    pending.handle = None
    old.attempts.append(pending)
    gone = PodEnd(
        pod_id="pod-b",
        ended_by=EndedBy.DEADMAN,
        confirmed=True,
        ended_at=T0 + timedelta(seconds=72),
    )
    carried = carried_attempts(old, {"pod-b": gone})
    assert [(a.number, a.pod_id, a.carried_from) for a in carried] == [
        (1, "pod-a", OLD),
        (2, "pod-b", OLD),
    ]
    # the end confirmed for it now is merged in and its cost settled to that end
    assert carried[1].confirmed and carried[1].billed_seconds == pytest.approx(72.0)
    assert carried[1].usd == pytest.approx(0.36 * 72 / 3600, abs=1e-6)
    # the old record is untouched; a chain keeps the run that rented each pod
    assert old.attempts[1].end is not None and not old.attempts[1].end.confirmed
    assert old.attempts[0].carried_from is None
    third = CostRecord(flow_run_id=NEW, attempts=[*carried, _pod(3, "pod-c", 10.0)])
    again = carried_attempts(third)
    assert [a.carried_from for a in again] == [OLD, OLD, NEW]


def test_a_carried_pod_is_shown_in_both_records_and_counted_once() -> None:
    first = _pod(1, "pod-a", 36.0)
    old = CostRecord(flow_run_id=OLD, attempts=[first], continued_by=NEW)
    new = CostRecord(
        flow_run_id=NEW,
        attempts=[*carried_attempts(old), _pod(2, "pod-b", 72.0)],
        carried_from=OLD,
    )
    # the run's own total is the sum over all its attempts, the carried one included
    assert new.total_usd == pytest.approx(first.usd + new.attempts[1].usd, abs=1e-8)
    assert [a.pod_id for a in new.own_attempts] == ["pod-b"]
    # over both runs: two pods, not three
    assert [a.pod_id for a in counted_pods([new, old])] == ["pod-b", "pod-a"]
    total = totals([new, old])
    assert total["runs"] == 2 and total["pods"] == 2
    assert total["billed_seconds"] == pytest.approx(36.0 + 72.0)
    assert total["usd"] == pytest.approx(first.usd + new.attempts[1].usd, abs=1e-8)
    # without the old run's record (an older --since, a shorter --limit) it is not summed
    alone = totals([new])
    assert alone["pods"] == 1 and alone["usd"] == pytest.approx(new.attempts[1].usd)


def test_the_continuation_reads_back_from_the_table_and_is_said() -> None:
    old = CostRecord(flow_run_id=OLD, attempts=[_pod(1, "pod-a", 36.0)], continued_by=NEW)
    back = CostRecord.from_rows(old.to_rows())
    assert back.continued_by == NEW and back.carried_from is None
    assert back.state_line().endswith(f", confirmed; continued by {NEW}")
    new = CostRecord(
        flow_run_id=NEW,
        attempts=[*carried_attempts(old), _pod(2, "pod-b", 72.0)],
        carried_from=OLD,
    )
    rows = new.to_rows()
    assert [r["attempt_carried_from"] for r in rows] == [OLD, None]
    again = CostRecord.from_rows(rows)
    assert again.carried_from == OLD and again.continued_by is None
    assert [a.carried_from for a in again.attempts] == [OLD, None]
    assert attempt_line(again.attempts[0]).endswith(f"; carried from run {OLD}")
    assert "carried" not in attempt_line(again.attempts[1])


def test_the_summary_says_the_cost_is_the_sum_over_every_attempt() -> None:
    old = CostRecord(flow_run_id=OLD, attempts=[_pod(1, "pod-a", 36.0)])
    report = RunReport(flow_run_id=NEW, pod_name=f"p-{NEW}", provider="local", carried_from=OLD)
    report.attempts = [*carried_attempts(old), _pod(2, "pod-b", 72.0)]
    record = CostRecord(flow_run_id=NEW, attempts=report.attempts, carried_from=OLD)
    report.apply_cost_record(record)
    assert report.cost.usd == pytest.approx(record.total_usd)
    summary = render_summary(report)
    assert f"the sum over all 2 attempts, the 1 carried from run {OLD} included" in summary
    assert "attempt 1    pod-a (cpu) ended by deadman, 36.0 s billed" in summary


def test_a_pod_of_the_old_run_still_there_refuses_the_resume_and_a_lost_one_is_ended(
    local_provider,
) -> None:
    """Before anything is rented: a pod the old record left unconfirmed that still runs
    refuses the resume (a run has at most one pod alive), naming the command that ends
    it; one whose host was lost is terminated here and its end confirmed."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.local_pod.registry import read_record
    from prefect_runpod.flows.run.continuation import confirm_gone
    from tests.fixtures.local_pod import start_pod

    handle, _ = start_pod(local_provider)
    try:
        attempt = PodAttempt.of(handle, 1).model_copy(update={"handle": None})
        old = CostRecord(flow_run_id=OLD, attempts=[attempt])
        with pytest.raises(SpecError) as refused:
            confirm_gone(old, local_provider, 30.0)
        said = str(refused.value)
        assert f"its pod {handle.pod_id} is still there (daemon running)" in said
        assert f"prefect-runpod terminate --provider local {handle.pod_id}" in said
        assert "nothing was rented" in said

        record = read_record(local_provider.home, handle.pod_id)
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)  # its host is lost
        wait_until(
            "the pod's daemon to be seen dead",
            lambda: local_provider.status(handle.pod_id).cause is PodCause.HOST_LOST,
            30.0,
        )
        ends = confirm_gone(old, local_provider, 30.0)
        end = ends[handle.pod_id]
        assert end.confirmed and end.cause == "host_lost" and end.ended_by is EndedBy.FLOW
        assert local_provider.get(handle.pod_id) is None
    finally:
        local_provider.terminate(handle.pod_id)


def test_a_run_that_ends_before_renting_its_own_pod_leaves_the_carried_one_alone(
    local_provider,
) -> None:
    """The new run failed after carrying the old attempts and before its own pod was
    created: its end terminates nothing (the carried pod is the old run's, confirmed
    gone) and keeps the carried end as the old record has it."""
    from prefect_runpod.flows.run.end import end_run

    old = CostRecord(flow_run_id=OLD, attempts=[_pod(1, "gone0pod000001", 36.0)])
    report = RunReport(flow_run_id=NEW, pod_name=f"p-{NEW}", provider="local", carried_from=OLD)
    report.attempts = carried_attempts(old)
    before = report.attempts[0].model_copy(deep=True)
    assert end_run(
        report, local_provider, None, keep_pod_on_failure=False, terminate_timeout_seconds=5.0,
        on_stage=lambda *_: None,
    ) is None  # fmt: skip
    terminate = report.stage("terminate")
    assert terminate.state.value == "Skipped" and terminate.reason == "no pod was created"
    assert report.attempts == [before]
