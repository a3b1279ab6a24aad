"""A run is a sequence of pod attempts: the report, the cost record and the stage ledger
hold the list, a stage runs once per attempt, and the single-pod fields a reader knows
are views of the last attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.flows.cli.cost_report import totals
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.cost_record import CostRecord
from prefect_runpod.flows.run.ledger import run_stage
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import StageState

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _handle(pod_id: str, created_at: datetime) -> PodHandle:
    return PodHandle(
        pod_id=pod_id,
        name="prft-run",
        provider="runpod",
        gpu_type="NVIDIA A40",
        cost_per_hr=0.36,
        created_at=created_at,
    )


def _ended(pod_id: str, at: datetime, by: EndedBy = EndedBy.FLOW) -> PodEnd:
    return PodEnd(pod_id=pod_id, ended_by=by, confirmed=True, ended_at=at)


def _two_pods(second_confirmed: bool = True) -> list[PodAttempt]:
    first = PodAttempt.of(_handle("pod-a", T0), 1, data_center="EU-RO-1")
    first.end = _ended("pod-a", T0 + timedelta(hours=1), EndedBy.OUTSIDE)
    first.end.cause = "host_lost"
    second = PodAttempt.of(
        _handle("pod-b", T0 + timedelta(hours=1)),
        2,
        resumed_from="checkpoint-400",
        steps_lost=37,
    )
    if second_confirmed:
        second.end = _ended("pod-b", T0 + timedelta(hours=2))
    return [first, second]


def test_the_attempt_record_has_every_field_resume_fills() -> None:
    attempt = _two_pods()[0]
    for name in (
        "number",
        "pod_id",
        "pod_name",
        "provider",
        "gpu_type",
        "data_center",
        "created_at",
        "ready_at",
        "ended_at",
        "ended_by",
        "cause",
        "billed_seconds",
        "usd",
        "provider_usd",
        "resumed_from",
        "steps_lost",
    ):
        assert hasattr(attempt, name), name
    assert (attempt.ended_by, attempt.cause) == (EndedBy.OUTSIDE, "host_lost")
    assert attempt.ended_at == T0 + timedelta(hours=1)


def test_a_stage_runs_once_per_attempt_and_keeps_its_earlier_run() -> None:
    report = RunReport()
    with pytest.raises(ConnectionError), run_stage(report, "train", attempt=1):
        raise ConnectionError("the pod's host went away")
    first_seconds = report.cost.stage_seconds["train"]
    with run_stage(report, "train", attempt=2):
        pass
    train = report.stage("train")
    assert (train.state, train.attempt, train.reason) == (StageState.COMPLETED, 2, None)
    (earlier,) = report.earlier_stages
    assert (earlier.name, earlier.state, earlier.attempt) == ("train", StageState.FAILED, 1)
    assert "host went away" in (earlier.reason or "")
    assert report.cost.stage_seconds["train"] == pytest.approx(
        first_seconds + train.seconds, abs=0.002
    )


def test_the_reports_single_pod_fields_are_views_of_the_last_attempt() -> None:
    report = RunReport(flow_run_id="r1", pod_name="prft-run", attempts=_two_pods())
    assert report.pod_id == "pod-b" and report.pod is not None
    assert report.pod.pod_id == "pod-b"
    assert report.pod_end is not None and report.pod_end.ended_by is EndedBy.FLOW
    assert report.terminated is True
    data = report.to_json_dict()
    assert [a["pod_id"] for a in data["attempts"]] == ["pod-a", "pod-b"]
    assert data["pod_id"] == "pod-b" and data["terminated"] is True
    assert data["attempts"][1]["resumed_from"] == "checkpoint-400"
    again = RunReport.model_validate(data)
    assert [a.pod_id for a in again.attempts] == ["pod-a", "pod-b"]
    assert again.attempts[0].data_center == "EU-RO-1"


def test_a_run_is_terminated_only_when_every_pod_is_confirmed_gone() -> None:
    report = RunReport(attempts=_two_pods(second_confirmed=False))
    assert report.terminated is False
    assert "may still be billing" in report.end_line()


def test_the_cost_record_is_a_row_per_attempt_and_reads_back_whole() -> None:
    record = CostRecord(flow_run_id="r1", attempts=_two_pods())
    record.settle()
    rows = record.to_rows()
    assert [(r["attempt"], r["pod_id"]) for r in rows] == [(1, "pod-a"), (2, "pod-b")]
    assert rows[0]["end_cause"] == "host_lost" and rows[1]["steps_lost"] == 37
    assert rows[0]["usd"] == rows[1]["usd"] == pytest.approx(0.36)
    assert record.total_usd == pytest.approx(0.72) and record.usd == pytest.approx(0.36)
    back = CostRecord.from_rows(rows)
    assert [a.pod_id for a in back.attempts] == ["pod-a", "pod-b"]
    assert back.attempts[1].resumed_from == "checkpoint-400"
    assert back.total_usd == record.total_usd
    assert totals([back])["usd"] == pytest.approx(0.72)


def test_a_record_may_still_bill_while_any_pod_of_the_run_may() -> None:
    attempts = _two_pods()
    attempts[0].end = PodEnd(pod_id="pod-a", detail="terminate not confirmed")
    record = CostRecord(flow_run_id="r1", attempts=attempts)
    assert record.may_still_bill
    assert record.state_line().startswith("pod pod-a may still be billing")


def test_rows_out_of_order_are_not_a_cost_record() -> None:
    rows = CostRecord(flow_run_id="r1", attempts=_two_pods()).to_rows()
    with pytest.raises(ValueError, match="not a cost record"):
        CostRecord.from_rows(list(reversed(rows)))


def test_the_report_takes_each_pods_end_from_the_record_and_keeps_its_handle() -> None:
    report = RunReport(flow_run_id="r1", attempts=_two_pods(second_confirmed=False))
    record = CostRecord(flow_run_id="r1", attempts=[a.model_copy() for a in _two_pods()])
    for attempt in record.attempts:
        attempt.handle = None
    record.settle()
    report.apply_cost_record(record)
    assert report.terminated is True
    assert report.attempts[1].handle is not None
    assert report.cost.usd == pytest.approx(0.72)


def test_the_cost_table_shows_a_row_per_pod_and_the_runs_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from prefect_runpod.flows.cli.cost_report import _show

    record = CostRecord(flow_run_id="r1", attempts=_two_pods())
    record.settle()
    _show([record], as_json=False)
    table = capsys.readouterr().out
    assert "pod-a (runpod)" in table and "pod-b (runpod)" in table
    assert "attempt 2" in table
    assert "0.720000" in table  # the footer's total over both pods


def test_each_attempt_line_shows_its_pods_gpu_count_in_status_and_the_summary() -> None:
    """The GPU count a checkpoint must resume on is shown beside each pod: in the
    summary's attempt lines and in ``status RUN`` (read back from the cost table)."""
    from types import SimpleNamespace

    from prefect_runpod.flows.cli.watch import status_row
    from prefect_runpod.flows.run.attempts import attempt_line
    from prefect_runpod.flows.run.report import render_summary

    first, second = _two_pods()
    first.gpu_count, second.gpu_count = 2, 1
    assert attempt_line(first).startswith("pod-a (NVIDIA A40, 2 GPUs) ended by outside")
    assert attempt_line(second).startswith("pod-b (NVIDIA A40, 1 GPU) ended by flow")
    assert "(cpu, no GPU)" in attempt_line(PodAttempt(pod_id="p", gpu_type="cpu", gpu_count=0))
    assert attempt_line(PodAttempt(pod_id="p", gpu_type="NVIDIA A40")).startswith(
        "p (NVIDIA A40) "  # a record written before counts were kept: not guessed
    )
    summary = render_summary(RunReport(flow_run_id="r1", attempts=[first, second]))
    assert "attempt 1    pod-a (NVIDIA A40, 2 GPUs) " in summary
    assert "attempt 2    pod-b (NVIDIA A40, 1 GPU) " in summary
    record = CostRecord(flow_run_id="r1", attempts=[first, second])
    record.settle()
    back = CostRecord.from_rows(record.to_rows())
    assert [a.gpu_count for a in back.attempts] == [2, 1]
    view = SimpleNamespace(
        flow_run_id="r1", flow_run_name="n", state="COMPLETED", stage="-", provider="runpod",
        started_at=None, url=None, output_dir=None, live=False, record=back, parameters={},
    )  # fmt: skip
    shown = status_row(view, with_pod=False)["attempts"]
    assert shown.startswith("1: pod-a (NVIDIA A40, 2 GPUs) ")
    assert "; 2: pod-b (NVIDIA A40, 1 GPU) " in shown
