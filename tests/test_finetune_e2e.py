"""End to end: the demo fine-tune on the local pod under a real Prefect server."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import find_marked_pids
from prefect_runpod.flows.finetune import finetune
from prefect_runpod.tasks.models import STAGES
from tests.fixtures.flow_env import server_env

pytestmark = pytest.mark.slow


def _assert_pod_gone(pod_id: str) -> None:
    provider = LocalPodProvider()
    assert provider.get(pod_id) is None
    assert find_marked_pids(pod_id) == []
    assert not any(pod_id in p.name for p in (provider.home / "pods").glob("*"))


def test_demo_flow_passes_every_stage_and_leaves_nothing(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    state = finetune(output_dir=str(tmp_path), return_state=True)
    assert state.is_completed(), state.message
    report = state.result()
    names = [s["name"] for s in report["stages"]]
    assert names == ["preflight", *STAGES]
    for stage in report["stages"]:
        assert stage["state"] in ("Completed", "Skipped"), stage
        if stage["state"] == "Skipped":
            assert stage["reason"]
    assert report["passed"] is True
    assert report["terminated"] is True
    assert report["parity"]["verdict"] == "pass"

    # The downloaded checkpoint hashes to what the pod-side manifest says.
    pod_side = {e["path"]: e for e in report["download"]["source_manifest"]["entries"]}
    assert pod_side, "the download carried no files"
    for rel, entry in pod_side.items():
        data = (tmp_path / "outputs" / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["size_bytes"]
    assert json.loads((tmp_path / "run-report.json").read_text())["pod_id"] == report["pod_id"]

    async def artifact_keys() -> set[str]:
        async with get_client() as client:
            flow_run_id = state.state_details.flow_run_id
            arts = await client.read_artifacts(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            return {a.key for a in arts if a.key}

    import asyncio

    keys = asyncio.run(artifact_keys())
    assert {"finetune-costs", "checksum-manifest", "eval-parity"} <= keys
    _assert_pod_gone(report["pod_id"])


def test_failure_in_train_still_terminates_the_pod(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_RUNPOD_FAULTS", "train:raise")
    state = finetune(output_dir=str(tmp_path), return_state=True)
    assert state.is_failed()
    assert "fault injected at train" in (state.message or "")
    report = json.loads((tmp_path / "run-report.json").read_text())
    train = next(s for s in report["stages"] if s["name"] == "train")
    assert train["state"] == "Failed" and "fault injected" in train["reason"]
    assert report["terminated"] is True
    assert report["passed"] is False
    _assert_pod_gone(report["pod_id"])


def test_sigkilled_flow_leaves_a_pod_the_registry_lists_and_terminates(prefect_server, tmp_path):
    env = server_env(PREFECT_RUNPOD_FAULTS="upload:sigkill")
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.finetune", "--output-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    report = json.loads((tmp_path / "run-report.json").read_text())
    pod_id = report["pod_id"]
    provider = LocalPodProvider()
    handle = provider.get(pod_id)
    assert handle is not None, "a SIGKILLed flow's pod must still be listed"
    assert handle.name == report["pod_name"]
    assert any(h.pod_id == pod_id for h in provider.list("prft-"))
    result = provider.terminate(pod_id)
    assert result.pod_id == pod_id and not result.already_gone
    _assert_pod_gone(pod_id)


def test_cli_json_report(prefect_server, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_runpod.flows.cli",
            "finetune",
            "--json",
            "--output-dir",
            str(tmp_path),
            "--local-cost-per-hr",
            "0.22",
        ],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert [s["name"] for s in data["stages"]][1:] == list(STAGES)
    assert all(s["state"] in ("Completed", "Skipped") for s in data["stages"])
    assert data["pod_id"] and data["terminated"]
    cost = data["cost"]
    assert cost["cost_per_hr"] == pytest.approx(0.22)
    assert cost["usd"] == pytest.approx(0.22 * cost["billed_seconds"] / 3600, abs=1e-8)
    # As recorded: seconds to the millisecond, USD to 1e-8 from those seconds.
    assert cost["billed_seconds"] == round(cost["billed_seconds"], 3)
    assert cost["usd"] == round(cost["cost_per_hr"] * cost["billed_seconds"] / 3600, 8)
    assert data["manifest"]["entries"]
    assert data["parity"]["verdict"] == "pass"
    # The terminal shows training as whole lines naming the pod, forwards, ending at 100 %.
    bars = re.findall(
        rf"^{re.escape(data['pod_id'])} training \[([#.]{{20}})\] +(\d+)%", proc.stderr, re.M
    )
    assert bars, proc.stderr[-3000:]
    percents = [int(p) for _, p in bars]
    assert percents == sorted(set(percents)) and percents[-1] == 100
    assert all(bar.count("#") == int(p) // 5 for bar, p in bars)


def test_direct_mode_pod_runs_every_stage_over_rsync(prefect_server, tmp_path):
    """A pod with direct SSH (exec + SFTP) and rsync: auto picks rsync for every transfer;
    the transfers' shared SSH connection ends with the pod, not 300 s later."""

    def masters() -> set[str]:  # shared rsync connections (OpenSSH ControlMasters) alive
        pattern = r"-M -N -S \S*prefect-runpod-cm-"
        found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
        return set(found.stdout.split())

    before = masters()  # other work's on this machine
    state = finetune(local_mode="direct", output_dir=str(tmp_path), return_state=True)
    assert state.is_completed(), state.message
    report = state.result()
    assert report["upload"]["method"] == "rsync" and report["download"]["method"] == "rsync"
    assert report["passed"] and report["terminated"]
    _assert_pod_gone(report["pod_id"])
    assert masters() <= before
