"""The same flow on (emulated) RunPod over REST v2 with GraphQL and v1 retired, the
budget cap, and the secret sentinel across every place a token could leak."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from prefect_runpod.blocks.faults import release_marker
from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.flows.finetune import finetune
from prefect_runpod.tasks.models import STAGES
from tests.fixtures.flow_env import server_env, start_cli, wait_for_fault
from tests.fixtures.leaks import files_holding, proc_cmdlines

pytestmark = pytest.mark.slow


def test_flow_runs_on_emulated_runpod_over_rest_v2(
    prefect_server, runpod_emulator, tmp_path, monkeypatch
):
    """Issue 3: nothing but credentials changes; cost comes from RunPod's ``cost``. Issue
    23: the demo passes with the emulator's GraphQL and REST v1 answering 410 Gone, every
    call over REST v2."""
    keypair = generate_keypair("runpod-e2e")
    key_file = tmp_path / "id_ed25519_runpod"
    key_file.write_text(keypair.private_key.get_secret_value())
    key_file.chmod(0o600)
    runpod_emulator.pub_key = keypair.public_key  # the account-level key RunPod injects
    monkeypatch.setenv("RUNPOD_API_KEY", runpod_emulator.api_key)
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(key_file))
    monkeypatch.setenv("RUNPOD_SSH_GATEWAY_HOST", "127.0.0.1")
    monkeypatch.setenv("RUNPOD_SSH_GATEWAY_PORT", str(runpod_emulator.gateway_port))

    state = finetune(provider="runpod", output_dir=str(tmp_path / "out"), return_state=True)
    assert state.is_completed(), state.message
    report = state.result()
    assert [s["name"] for s in report["stages"]][1:] == list(STAGES)
    assert all(s["state"] in ("Completed", "Skipped") for s in report["stages"])
    assert report["provider"] == "runpod" and report["terminated"]
    assert report["provision_attempts"], "every create attempt is recorded"
    cost = report["cost"]
    assert cost["cost_per_hr"] == pytest.approx(0.22)
    assert cost["usd"] == pytest.approx(0.22 * cost["billed_seconds"] / 3600, abs=1e-8)
    # As recorded: seconds to the millisecond, USD to 1e-8 from those seconds.
    assert cost["billed_seconds"] == round(cost["billed_seconds"], 3)
    assert cost["usd"] == round(cost["cost_per_hr"] * cost["billed_seconds"] / 3600, 8)
    assert runpod_emulator.retired == {"graphql", "v1"}
    ops = {r.get("operation") for r in runpod_emulator.requests}
    assert {"createPod", "getPod", "deletePod", "getSshKeys", "listGpuTypes"} <= ops
    assert all(r.get("path", "").startswith("/v2/") for r in runpod_emulator.requests), ops
    # The fixture's teardown fails the test if the emulator still holds a pod.


def test_budget_cap_ends_the_run_and_the_pod(prefect_server, tmp_path):
    """A low max_cost_usd at a real price (0.22 USD/h) ends the run with the pod gone,
    and USD = price × confirmed billed seconds."""
    state = finetune(
        output_dir=str(tmp_path),
        local_cost_per_hr=0.22,
        max_cost_usd=1e-7,
        return_state=True,
    )
    assert state.is_failed()
    assert "max_cost_usd" in (state.message or "")
    report = json.loads((tmp_path / "run-report.json").read_text())
    assert report["terminated"] is True
    assert LocalPodProvider().get(report["pod_id"]) is None
    failed = [s for s in report["stages"] if s["state"] == "Failed"]
    assert failed and "BudgetExceededError" in failed[0]["reason"]
    cost = report["cost"]
    assert cost["billed_seconds"] > 0
    assert cost["usd"] == pytest.approx(0.22 * cost["billed_seconds"] / 3600, abs=1e-8)
    # As recorded: seconds to the millisecond, USD to 1e-8 from those seconds.
    assert cost["billed_seconds"] == round(cost["billed_seconds"], 3)
    assert cost["usd"] == round(cost["cost_per_hr"] * cost["billed_seconds"] / 3600, 8)


def test_hf_token_sentinel_never_leaks(prefect_server, hf_hub, tmp_path):
    """The token is used locally and on the pod (hf_auth) yet appears in no Prefect log,
    artifact or result, no run report, no process's argv, no pod shell history and no
    emulator request log. The run is stopped by SIGTERM mid-run, so the crash path is
    checked too."""
    sentinel = hf_hub.tokens["classic"].get_secret_value()
    faults = tmp_path / "faults"
    out = tmp_path / "out"
    env = server_env(
        HF_TOKEN=sentinel,
        PREFECT_RUNPOD_FAULTS="upload:pause",
        PREFECT_RUNPOD_FAULT_DIR=str(faults),
    )
    proc = start_cli(
        [
            "finetune",
            "--model-id",
            "t/public",
            "--hf-endpoint",
            hf_hub.endpoint,
            "--output-dir",
            str(out),
        ],
        env,
    )
    try:
        wait_for_fault(proc, faults, "upload")
        report = json.loads((out / "run-report.json").read_text())
        pod_id = report["pod_id"]
        pod_dir = LocalPodProvider().home / "pods" / pod_id
        # While the pod lives (hf_auth already ran on it): argv of every process, and
        # every file the pod's shell could have written (history included).
        assert sentinel not in proc_cmdlines()
        assert files_holding(sentinel.encode(), pod_dir) == [], "the token is in a pod file"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sentinel not in output
    final = json.loads((out / "run-report.json").read_text())
    assert final["terminated"] is True
    hf_stage = next(s for s in final["stages"] if s["name"] == "hf_auth")
    assert hf_stage["state"] == "Completed"
    assert [d["where"] for d in final["hf"]] == ["local", "pod"]
    assert files_holding(sentinel.encode(), out) == []
    assert sentinel not in hf_hub.hub.log_text()
    assert sentinel not in _prefect_records(final["flow_run_id"])


def _prefect_records(run_id: str) -> str:
    """Everything the Prefect server holds about a run, as one string: logs, artifacts,
    parameters, the state message, and the events about it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.events.filters import EventFilter, EventRelatedFilter

    async def read() -> str:
        async with get_client() as client:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            arts = await client.read_artifacts(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
            )
            run = await client.read_flow_run(run_id)
            deadline = time.monotonic() + 180  # the server stores events a little later
            while True:
                page = await client.read_events(
                    filter=EventFilter(
                        related=EventRelatedFilter(id=[f"prefect.flow-run.{run_id}"])
                    ),
                    limit=50,
                )
                if page.events or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            events = list(page.events)
            for _ in range(40):  # the server pages 50 at a time
                if page.next_page is None:
                    break
                page = await client.read_events_page(page.next_page)
                events.extend(page.events)
        assert logs, "the run's logs reached the server"
        assert events, "the run's events reached the server"
        return json.dumps(
            {
                "logs": [log.message for log in logs],
                "artifacts": [a.data for a in arts],
                "params": run.parameters,
                "state": run.state.message if run.state else "",
                "events": [e.model_dump(mode="json") for e in events],
            },
            default=str,
        )

    return asyncio.run(read())


def test_publish_write_token_sentinel_never_leaks(prefect_server, hf_hub, tmp_path):
    """Publishing from the pod (issue 17): the write token is used in preflight, typed
    hidden into the pod and used there by the publisher, yet appears in no process's
    argv or pod file while the pod lives (checked after the publish, paused at the next
    stage), and in no Prefect log, artifact, event, parameter or result, no run report
    and no Hub request log afterwards."""
    sentinel = hf_hub.tokens["write"].get_secret_value()
    faults = tmp_path / "faults"
    out = tmp_path / "out"
    env = server_env(
        HF_TOKEN=sentinel,
        PREFECT_RUNPOD_FAULTS="download:pause",
        PREFECT_RUNPOD_FAULT_DIR=str(faults),
    )
    proc = start_cli(
        [
            "finetune",
            "--publish",
            "hf:alice/sentinel-model",
            "--download",
            "none",
            "--hf-endpoint",
            hf_hub.endpoint,
            "--output-dir",
            str(out),
        ],
        env,
    )
    try:
        wait_for_fault(proc, faults, "download")
        report = json.loads((out / "run-report.json").read_text())
        pod_dir = LocalPodProvider().home / "pods" / report["pod_id"]
        assert sentinel not in proc_cmdlines()
        assert files_holding(sentinel.encode(), pod_dir) == [], "the token is in a pod file"
        release_marker(faults, "download")
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert sentinel not in output
    final = json.loads((out / "run-report.json").read_text())
    assert final["publish"]["verified"] and final["terminated"]
    assert any(r["path"].endswith("/commit/main") for r in hf_hub.hub.requests)
    assert files_holding(sentinel.encode(), out) == []
    assert sentinel not in hf_hub.hub.log_text()
    assert sentinel not in _prefect_records(final["flow_run_id"])


def test_gated_model_token_reaches_the_training_job_and_nowhere_else(
    prefect_server, hf_hub, tmp_path
):
    """The job downloads the model itself, so it needs HF_TOKEN in its environment: the
    token comes from a saved Prefect ``Secret`` block named by the run (never a
    parameter); the train and eval commands check they got exactly that token, while the
    report, the stored parameters and the logs never show it."""
    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client

    from tests.fixtures.demo_bundle import token_checking_bundle

    token = hf_hub.tokens["classic"].get_secret_value()
    Secret(value=token).save("hf-read-token", overwrite=True)
    bundle = token_checking_bundle(tmp_path / "bundle", token)
    # What the upload leaves behind: the ignore file's folder, caches; one dotenv file
    # is sent on purpose.
    (bundle / ".prefectrunpodignore").write_text("scratch/\n")
    (bundle / "scratch").mkdir()
    (bundle / "scratch" / "notes.txt").write_text("local only\n")
    (bundle / "__pycache__").mkdir()
    (bundle / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (bundle / ".env.ci").write_text("EPOCHS=3\n")
    state = finetune(
        bundle=str(bundle),
        model_id="t/accepted",
        hf_token_secret="hf-read-token",
        hf_endpoint=hf_hub.endpoint,
        output_dir=str(tmp_path / "out"),
        allow_secret_files=[".env.ci"],
        return_state=True,
    )
    assert state.is_completed(), state.message
    report = state.result()
    assert [d["cause"] for d in report["hf"]] == ["ok", "ok"]
    assert token not in json.dumps(report)
    sent = [e["path"] for e in report["upload"]["dest_manifest"]["entries"]]
    assert ".env.ci" in sent and "check_token.py" in sent and "bundle.toml" in sent
    assert not [p for p in sent if p.startswith(("scratch/", "__pycache__/"))], sent
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.parameters["hf_token_secret"] == "hf-read-token"
    assert token not in json.dumps(run.parameters, default=str)


def test_a_token_cannot_be_a_flow_parameter(prefect_server, hf_hub):
    """``finetune(hf_token=...)`` is refused by the call itself, before Prefect creates
    (and stores) a run: the flow has no parameter that takes a secret."""
    from prefect.exceptions import ParameterBindError

    with pytest.raises((ParameterBindError, TypeError), match="hf_token"):
        finetune(hf_token=hf_hub.tokens["classic"], return_state=True)


def test_listing_and_terminating_need_no_ssh_key(
    prefect_server, runpod_emulator, tmp_path, monkeypatch, capsys
):
    """Hooks, the reaper and ``prefect-runpod pods|terminate`` only list and terminate,
    so a machine without the SSH key (a reaper's worker) can still end pods."""
    from prefect_runpod.flows.cli import main

    monkeypatch.setenv("RUNPOD_API_KEY", runpod_emulator.api_key)
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(tmp_path / "no-such-key"))
    assert main(["pods", "--provider", "runpod"]) == 0
    assert "no live pods" in capsys.readouterr().err
    assert main(["terminate", "doesnotexist00", "--provider", "runpod"]) == 0
    assert "no such pod" in capsys.readouterr().out
    # The fine-tune itself does need the key, and says how to make one (bad usage: 2).
    assert main(["finetune", "--provider", "runpod", "--output-dir", str(tmp_path / "out")]) == 2
    assert "no SSH key for RunPod" in capsys.readouterr().err
