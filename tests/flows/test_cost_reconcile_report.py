"""``prefect-runpod cost RUN --reconcile`` after a Prefect API outage: the run ended its
pod and kept the confirmed end in ``run-report.json``, but its ``finetune-costs`` record
in Prefect stayed at the first version (no end, "may still be billing") and its state at
Running. Before: reconcile asked the local pod, found a tombstone of a terminate call it
did not recognise, inferred "ended by deadman" from the Running state and wrote that over
the correct report. Runs and records go through the session's Prefect test server."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prefect_runpod.blocks.local_pod.registry import PodTombstone, write_tombstone
from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.cost_record import CostRecord, latest_record, publish_record
from prefect_runpod.flows.run.report import RunReport


def _running_run() -> str:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="outage-finetune")
    def ghost(provider: str = "local") -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(ghost, parameters={"provider": "local"}, state=Running())
    return str(run.id)


def _tombstone(pod_id: str, created: datetime, ended: datetime) -> None:
    write_tombstone(
        Path(os.environ["PREFECT_RUNPOD_HOME"]),
        PodTombstone(pod_id=pod_id, name=f"prft-{pod_id}", created_at=created.isoformat(),
                     ended_at=ended.isoformat(), by="terminate", layer="terminate"),
    )  # fmt: skip


def _stale_record(run_id: str, pod_id: str, created: datetime, out: Path) -> CostRecord:
    """The record the run wrote before the outage: the pod rented, no end yet."""
    attempt = PodAttempt(pod_id=pod_id, provider="local", cost_per_hr=0.36, created_at=created)
    record = CostRecord(flow_run_id=run_id, attempts=[attempt], output_dir=str(out))
    record.settle()
    publish_record(record)
    return record


def test_reconcile_keeps_the_confirmed_end_of_run_report_json(
    prefect_server, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    run_id, pod_id = _running_run(), f"lp{uuid.uuid4().hex[:12]}"
    created = datetime.now(UTC) - timedelta(minutes=5)
    ended = created + timedelta(seconds=42)
    _tombstone(pod_id, created, ended + timedelta(seconds=1))
    _stale_record(run_id, pod_id, created, tmp_path)
    flows_end = PodEnd(pod_id=pod_id, ended_by=EndedBy.FLOW, confirmed=True, ended_at=ended,
                       layer="terminate (the run's finally)")  # fmt: skip
    report = RunReport(flow_run_id=run_id, provider="local", output_dir=str(tmp_path),
                       attempts=[PodAttempt(pod_id=pod_id, provider="local", cost_per_hr=0.36,
                                            created_at=created, end=flows_end)])  # fmt: skip
    (tmp_path / "run-report.json").write_text(json.dumps(report.to_json_dict(), indent=2))

    assert main(["cost", run_id, "--reconcile"]) == 0
    capsys.readouterr()
    record = latest_record(run_id)
    assert record is not None and record.end is not None
    assert (record.end.ended_by, record.end.confirmed, record.end.inferred) == (
        EndedBy.FLOW,
        True,
        False,
    )
    assert record.end.ended_at == ended
    kept = RunReport.model_validate_json((tmp_path / "run-report.json").read_text())
    assert kept.pod_end is not None and kept.pod_end.ended_by is EndedBy.FLOW
    assert kept.pod_end.ended_at == ended


def test_a_terminate_calls_tombstone_is_not_read_as_the_deadman(
    prefect_server, tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """No report to read (another machine's run): the local pod's tombstone says a
    terminate call ended it; the run's Running state no longer makes that the dead-man."""
    run_id, pod_id = _running_run(), f"lp{uuid.uuid4().hex[:12]}"
    created = datetime.now(UTC) - timedelta(minutes=5)
    ended = created + timedelta(seconds=42)
    _tombstone(pod_id, created, ended)
    _stale_record(run_id, pod_id, created, tmp_path / "elsewhere")

    assert main(["cost", run_id, "--reconcile"]) == 0
    capsys.readouterr()
    record = latest_record(run_id)
    assert record is not None and record.end is not None and record.end.confirmed
    assert record.end.ended_by is not EndedBy.DEADMAN
    assert (record.end.ended_by, record.end.inferred, record.end.ended_at) == (
        EndedBy.OUTSIDE,
        False,
        ended,
    )
