"""The ``train`` task inside a flow on a real Prefect server and a real local pod:
logs, the ``train-progress`` and ``train-metrics`` artifacts, the terminal bar."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from prefect import flow

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import TrainingError
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.tasks.train import terminal_progress_bar, train

pytestmark = pytest.mark.slow

JOB = """
import json, sys
for step in range(1, 5):
    print(json.dumps({"progress": step / 4, "step": step, "total": 4, "loss": 1.0 / step}))
print("eval_accuracy=0.75")
sys.exit(int(sys.argv[1]))
"""


async def _artifacts(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        return await client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )


async def _log_messages(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


def _prepare(handle, keypair) -> str:
    run_dir = f"{handle.workdir}/run"
    bundle = Path(run_dir) / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "job.py").write_text(JOB)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        bootstrap_pod_tools(console, handle)
    return run_dir


def test_train_task_reports_progress_metrics_and_logs(prefect_server, local_pod) -> None:
    _, handle, keypair = local_pod
    run_dir = _prepare(handle, keypair)
    screen = io.StringIO()

    @flow
    def job_flow():
        return train(
            handle, keypair.private_key, run_dir, "{python} -u job.py 0",
            max_runtime_seconds=300, on_progress=terminal_progress_bar(screen),
            poll_interval_seconds=0.2,
        )  # fmt: skip

    state = job_flow(return_state=True)
    assert state.is_completed(), state.message
    report = state.result()
    assert report.exit_code == 0
    assert report.metrics == pytest.approx({"loss": 0.25, "eval_accuracy": 0.75})
    assert report.command == "python3 -u job.py 0"
    flow_run_id = state.state_details.flow_run_id
    artifacts = {a.key: a for a in asyncio.run(_artifacts(flow_run_id)) if a.key}
    assert artifacts["train-progress"].type == "progress"
    assert float(artifacts["train-progress"].data) == 100.0
    assert artifacts["train-metrics"].type == "table"
    assert "eval_accuracy" in str(artifacts["train-metrics"].data)
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs go to the server in batches: send what is queued
    messages = asyncio.run(_log_messages(flow_run_id))
    assert any(m == f"{handle.pod_id} | eval_accuracy=0.75" for m in messages)
    assert screen.getvalue().splitlines()[-1] == "training [####################] 100% step 4/4"


def test_train_task_failure_raises_with_the_log_tail(prefect_server, local_pod) -> None:
    _, handle, keypair = local_pod
    run_dir = _prepare(handle, keypair)

    @flow
    def job_flow():
        return train(handle, keypair.private_key, run_dir, "{python} -u job.py 5",
                     poll_interval_seconds=0.2)  # fmt: skip

    state = job_flow(return_state=True)
    assert state.is_failed()
    with pytest.raises(TrainingError, match="exited with code 5") as err:
        state.result()
    assert "eval_accuracy=0.75" in str(err.value) and handle.pod_id in str(err.value)
    artifacts = {a.key for a in asyncio.run(_artifacts(state.state_details.flow_run_id))}
    assert {"train-progress", "train-metrics"} <= artifacts
