"""Records written by an earlier version still read: a ``run-report.json`` and two
``finetune-costs`` tables (a local pod at a pretend price, an emulated RunPod pod with
RunPod's bill) as the demo wrote them before runs kept a list of pod attempts
(``tests/data/legacy/``). The report's keys and the table's columns of a run today may
only add to theirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.flows.run.cost_record import COST_ARTIFACT_KEY, CostRecord
from prefect_runpod.flows.run.report import RunReport

LEGACY = Path(__file__).resolve().parents[2] / "data" / "legacy"


def _rows(name: str) -> list[dict[str, Any]]:
    return list(json.loads((LEGACY / f"finetune-costs-{name}.json").read_text()))


def test_an_old_run_report_reads_and_keeps_every_key() -> None:
    data = json.loads((LEGACY / "run-report-local.json").read_text())
    report = RunReport.model_validate(data)
    assert report.pod_id == data["pod_id"] and report.terminated is True
    assert report.pod_end is not None and report.pod_end.ended_by.value == "flow"
    assert report.cost.usd == data["cost"]["usd"]
    assert report.passed is True
    again = report.to_json_dict()
    # every key but the lease, which no provider ever honoured (RunPod's terminateAfter)
    assert set(data) - {"lease"} <= set(again) and "lease" not in again
    for key in ("pod_id", "pod_name", "provider", "terminated", "ssh_command"):
        assert again[key] == data[key], key
    assert again["cost"]["usd"] == data["cost"]["usd"]
    assert again["pod"]["pod_id"] == data["pod"]["pod_id"]


@pytest.mark.parametrize("name", ["local", "runpod"])
def test_an_old_cost_table_reads_back(name: str) -> None:
    rows = _rows(name)
    record = CostRecord.from_rows(rows)
    row = rows[0]
    assert record.pod_id == row["pod_id"] and record.provider == name
    assert record.usd == row["usd"] and record.billed_seconds == row["billed_s"]
    assert record.runpod_usd == row["runpod_usd"]
    assert record.end is not None and record.end.confirmed
    assert not record.may_still_bill
    assert set(row) - {"lease"} <= set(record.to_rows()[0])  # the lease column is dropped


def _publish_for_a_new_run(rows: list[dict[str, Any]]) -> str:
    """The stored table as the ``finetune-costs`` artifact of a fresh flow run."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    @flow(name="legacy-record-holder")
    def holder() -> None:
        return None

    state = holder(return_state=True)
    run_id = str(state.state_details.flow_run_id)
    data = [dict(rows[0], flow_run_id=run_id)]
    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(key=COST_ARTIFACT_KEY, type="table", data=data, flow_run_id=run_id)  # type: ignore[arg-type]
        )
    return run_id


@pytest.mark.parametrize("name", ["local", "runpod"])
def test_cost_and_reconcile_read_a_record_written_before(
    name: str, prefect_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect_runpod.flows.cli import main

    rows = _rows(name)
    run_id = _publish_for_a_new_run(rows)
    assert main(["cost", run_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    (run,) = shown["runs"]
    assert run["pod_id"] == rows[0]["pod_id"] and run["usd"] == rows[0]["usd"]
    assert shown["totals"]["usd"] == rows[0]["usd"]
    assert main(["cost", run_id]) == 0
    table = capsys.readouterr().out
    assert rows[0]["pod_id"] in table and f"{rows[0]['usd']:.6f}" in table
    # Confirmed, with its bill when the provider has one: nothing left to complete.
    assert main(["cost", run_id, "--reconcile"]) == 0
    captured = capsys.readouterr()
    assert rows[0]["pod_id"] in captured.out and "may still be billing" not in captured.out


@pytest.mark.slow
def test_the_demo_writes_every_key_and_column_it_wrote_before(
    prefect_server: Any, tmp_path: Path
) -> None:
    from prefect_runpod.flows.finetune import finetune
    from prefect_runpod.flows.run.cost_record import latest_record

    state = finetune(output_dir=str(tmp_path), local_cost_per_hr=0.22, return_state=True)
    assert state.is_completed(), state.message
    report = json.loads((tmp_path / "run-report.json").read_text())
    before = json.loads((LEGACY / "run-report-local.json").read_text())
    # every key but the lease, gone on purpose: no provider ever honoured it
    assert set(before) - set(report) == {"lease"}, "run-report.json lost keys"
    assert set(before["cost"]) - set(report["cost"]) == set()
    (attempt,) = report["attempts"]  # one pod: the single-pod keys are its views
    assert attempt["number"] == 1 and attempt["pod_id"] == report["pod_id"]
    assert attempt["ready_at"] is not None and attempt["end"] == report["pod_end"]
    stages = {s["name"]: s["attempt"] for s in report["stages"]}
    assert stages["preflight"] is None and stages["train"] == stages["terminate"] == 1
    record = latest_record(report["flow_run_id"])
    assert record is not None
    columns = set(record.to_rows()[0])
    assert set(_rows("local")[0]) - columns == {"lease"}, "finetune-costs lost columns"
