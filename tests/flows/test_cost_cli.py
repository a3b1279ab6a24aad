"""``prefect-runpod cost RUN --reconcile`` (issue 23 §6, §8): RunPod's bill in REST v2's
parts beside our estimate, a local pod that says it has no bill, and a run whose pod
ended while Prefect still says Running: reported with the command that fixes it, and
marked Crashed with the cause when asked. Runs and records are made through the Prefect
API of the session's test server; RunPod's billing is the emulator's ledger."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.run.cost_record import CostRecord, latest_record, publish_record
from prefect_runpod.flows.run.crashed import run_state_type

pytestmark = pytest.mark.slow


def _running_run(provider: str) -> str:
    """A flow run left Running, as a SIGKILLed script run stays on a self-hosted server."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="ghost-finetune")
    def ghost(provider: str = "local") -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(ghost, parameters={"provider": provider}, state=Running())
    return str(run.id)


def _ended_record(run_id: str, provider: str, pod_id: str, start: datetime) -> CostRecord:
    end = PodEnd(pod_id=pod_id, ended_by=EndedBy.DEADMAN, confirmed=True,
                 ended_at=start + timedelta(minutes=10), layer="runpodctl pod delete")  # fmt: skip
    record = CostRecord(flow_run_id=run_id, pod_id=pod_id, pod_name=f"prft-{run_id}",
                        provider=provider, cost_per_hr=0.36, created_at=start, end=end)  # fmt: skip
    record.settle()
    publish_record(record)
    return record


def test_a_local_run_has_no_bill_and_a_stale_running_state_gets_its_fix(
    prefect_server, capsys
) -> None:  # type: ignore[no-untyped-def]
    """Before: ``cost RUN --reconcile`` printed the same table and said nothing, and the
    run said Running forever."""
    run_id = _running_run("local")
    _ended_record(run_id, "local", "localpod000001", datetime.now(UTC) - timedelta(hours=1))
    assert main(["cost", run_id, "--reconcile"]) == 0
    err = capsys.readouterr().err
    assert f"run {run_id}: the local pod has no bill to reconcile" in err
    fix = f"prefect-runpod cost {run_id} --reconcile --mark-crashed"
    assert f"run {run_id} still says RUNNING in Prefect" in err and f"`{fix}`" in err
    assert run_state_type(run_id) == "RUNNING"  # only reported, not changed
    assert main(fix.split()[1:]) == 0
    assert f"run {run_id}: marked Crashed" in capsys.readouterr().err
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state  # type: ignore[arg-type]
    assert state is not None and state.type.value == "CRASHED"
    assert "pod localpod000001 ended" in (state.message or "")
    assert "process was killed" in (state.message or "")


def test_runpods_bill_shows_its_v2_parts_beside_our_estimate(
    prefect_server, runpod_env, capsys
) -> None:  # type: ignore[no-untyped-def]
    emu = runpod_env
    run_id = _running_run("runpod")
    pod_id = uuid.uuid4().hex[:14]
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    emu.ledger.open(pod_id, "NVIDIA GeForce RTX 3090", 0.36, start.timestamp())
    emu.ledger.close(pod_id, (start + timedelta(minutes=10)).timestamp())
    _ended_record(run_id, "runpod", pod_id, start)
    assert main(["cost", run_id, "--reconcile", "--provider", "runpod"]) == 0
    out = capsys.readouterr().out
    record = latest_record(run_id)
    assert record is not None and record.runpod_usd == pytest.approx(0.06)
    assert (record.runpod_gpu_usd, record.runpod_cpu_usd, record.runpod_disk_usd) == (
        pytest.approx(0.06), 0.0, 0.0,
    )  # fmt: skip
    assert f"run {run_id}: RunPod billed 0.060000 USD (GPU 0.060000, CPU 0.000000, disk " in out
    assert "; ours 0.060000 USD, difference +0.000000" in out
    assert [r["path"] for r in emu.requests if r["path"].startswith("/v1")] == []
