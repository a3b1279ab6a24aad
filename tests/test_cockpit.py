"""The cockpit on served runs (real Prefect server): the demo under pseudo-terminals is
readable and quiet (its stderr lines and log records counted), and while its pod lives
``status``, ``pods``, ``logs``, ``ssh`` (under a pseudo-terminal) and ``reaper --dry-run``
see it; afterwards ``status``, ``logs`` and ``cost`` read what the run left. The same on
emulated RunPod through the real SDK and its gateway."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_runpod.blocks.faults import release_marker
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.cli.runs import key_path_for, live_pod, provider_for_run, read_run
from prefect_runpod.flows.cli.watch import _from_pod
from tests.fixtures.flow_env import server_env
from tests.fixtures.terminal import screen_lines, spawn_on_ptys

pytestmark = pytest.mark.slow

_CLI = [sys.executable, "-m", "prefect_runpod.flows.cli"]


def _wait_for(path: Path, child, timeout_seconds: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not path.exists():
        assert child.proc.poll() is None, bytes(child.err)[-3000:].decode(errors="replace")
        assert time.monotonic() < deadline, f"{path.name} never appeared: " + bytes(child.err)[
            -3000:
        ].decode(errors="replace")
        time.sleep(0.2)


def _json_of(capsys) -> object:
    return json.loads(capsys.readouterr().out)


def _log_records(flow_run_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )


def _ssh_under_a_pty(target: str, env: dict[str, str]) -> str:
    """``prefect-runpod ssh TARGET`` with a terminal on stdin/stdout: type a command and
    ``exit``; return what the terminal showed."""
    child = spawn_on_ptys([*_CLI, "ssh", target], env, stdin_tty=True)
    deadline = time.monotonic() + 180
    child.type("echo cockpit-$((6*7))\n")
    while b"cockpit-42" not in child.out and time.monotonic() < deadline:
        assert child.proc.poll() is None, bytes(child.err + child.out).decode(errors="replace")
        time.sleep(0.1)
    child.type("exit\n")
    assert child.wait(timeout=180) == 0, bytes(child.err).decode(errors="replace")
    return bytes(child.out).decode(errors="replace")


def _while_the_pod_lives(run_id: str, out: Path, env: dict[str, str], capsys) -> str:
    """status, pods, logs, ssh and reaper --dry-run against the paused run; its pod id."""
    assert main(["status", run_id, "--json"]) == 0
    row = _json_of(capsys)
    assert row["state"] == "Running" and row["stage"] == "train" and row["pod_live"] is True
    assert row["ssh_command"].startswith("ssh -tt -i ") and str(out) in row["ssh_command"]
    assert row["usd_so_far"] > 0 and row["gpu_type"] == "cpu"
    pod_id = row["pod_id"]

    assert main(["status", "--json"]) == 0
    assert run_id in [r["flow_run_id"] for r in _json_of(capsys)]

    assert main(["pods", "--json"]) == 0
    (pod,) = [p for p in _json_of(capsys) if p["pod_id"] == pod_id]
    assert pod["flow_run_id"] == run_id and pod["run_state"] == "Running"
    assert pod["usd_so_far"] > 0 and pod["age_seconds"] > 0 and "pod-ssh-key" in pod["ssh_command"]
    assert main(["pods"]) == 0
    table = capsys.readouterr().out
    assert "USD so far" in table and pod_id in table  # a header and the row

    assert main(["logs", run_id]) == 0
    read = capsys.readouterr()
    assert f"source: pod {pod_id} (live)" in read.err
    assert "training on 305 tickets" in read.out
    # --follow reads on until the job on the pod ends (the run itself is paused).
    assert main(["logs", run_id, "--follow", "--max-seconds", "600"]) == 0  # to the job's end
    followed = capsys.readouterr().out
    assert followed.startswith("training on 305 tickets") and "epoch 5/5" in followed

    shown = _ssh_under_a_pty(run_id, env)
    assert "cockpit-42" in shown and pod_id in shown  # the pod's own prompt
    # The line `ssh --print` shows works when pasted later (its pinned host key kept).
    assert main(["ssh", run_id, "--print"]) == 0
    printed = capsys.readouterr().out.strip()
    # One line everywhere: the run's own report, status and pods show the same one.
    report = json.loads((out / "run-report.json").read_text())
    assert row["ssh_command"] == pod["ssh_command"] == report["ssh_command"] == printed
    pasted = subprocess.run(
        shlex.split(printed),
        input="echo pasted-$((6*7))\nexit\n",
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert pasted.returncode == 0 and "pasted-42" in pasted.stdout, pasted.stderr[-2000:]

    assert main(["reaper", "--dry-run", "--json"]) == 0
    decisions = [d for d in _json_of(capsys) if d["pod_id"] == pod_id]
    assert decisions and decisions[0]["reap"] is False  # a live run's pod is kept
    return pod_id


def test_the_demo_under_a_terminal_is_quiet_and_the_cockpit_sees_it(
    prefect_server, tmp_path, capsys
):
    out, faults = tmp_path / "out", tmp_path / "faults"
    env = server_env(
        PREFECT_RUNPOD_FAULTS="train_running:pause", PREFECT_RUNPOD_FAULT_DIR=str(faults)
    )
    child = spawn_on_ptys(
        [*_CLI, "finetune", "--output-dir", str(out), "--local-cost-per-hr", "0.22"], env
    )
    try:
        _wait_for(faults / "train_running.reached", child)
        run_id = json.loads((out / "run-report.json").read_text())["flow_run_id"]
        report = json.loads((out / "run-report.json").read_text())
        assert report["ssh_command"], "run-report.json names the way in while the pod is up"
        pod_id = _while_the_pod_lives(run_id, out, env, capsys)
        live_view = read_run(run_id)
        assert live_view is not None
        handle = live_pod(live_view, provider_for_run(live_view))
        assert handle is not None and handle.pod_id == pod_id
        key = key_path_for(handle.provider, str(out))
        assert key == str(out / "pod-ssh-key")
        kept_key = tmp_path / "key-copy"  # the run deletes its own once the pod is gone
        kept_key.write_text(Path(key).read_text())
        release_marker(faults, "train_running").touch()
        assert child.wait(timeout=300) == 0, bytes(child.err)[-3000:].decode(errors="replace")
    finally:
        if child.proc.poll() is None:
            child.proc.kill()

    err, shown = screen_lines(child.err), screen_lines(child.out)
    records = _log_records(run_id)
    with capsys.disabled():  # the numbers the quiet-logs target is measured by (-s shows them)
        print(json.dumps({"demo_stderr_lines": len(err), "demo_log_records": len(records)}))
    assert len(err) <= 40, "\n".join(err)
    assert len(records) <= 30, [r.message[:80] for r in records]
    # Readable: one progress line (redrawn in place) at 100 %, no JSON record lines, no
    # traceback; every stage once; the summary names the run's page and the transfer.
    progress = [line for line in err if " training [" in line]
    assert len(progress) == 1 and progress[0].rstrip().endswith("100% step 100/100"), progress
    assert not [line for line in err if '{"epoch"' in line or "Traceback" in line]
    assert [line for line in err if re.search(r"stage \w+ +(Completed|Skipped)", line)]
    assert sum("stage train " in line for line in err) == 1
    summary = "\n".join(shown)
    assert re.search(r"^flow run +http://\S+/runs/flow-run/" + run_id, summary, re.M), summary
    assert re.search(r"^transfer +upload by pty .*download by pty", summary, re.M), summary
    assert "result       PASSED" in summary
    # The training log's lines reached Prefect coalesced, without its JSON record lines.
    train_lines = [r.message for r in records if r.message.startswith(f"{pod_id} | ")]
    assert 1 <= len(train_lines) <= 3 and '{"epoch"' not in "".join(train_lines)
    assert "training on 305 tickets" in train_lines[0]

    # Afterwards: status, logs and cost read what the run left.
    assert main(["status", run_id, "--json"]) == 0
    row = _json_of(capsys)
    assert row["state"] == "Completed" and row["pod_live"] is False and row["ssh_command"] is None
    assert "confirmed" in row["pod_end"] and row["url"].endswith(run_id)
    assert main(["logs", run_id]) == 0
    read = capsys.readouterr()
    assert f"source: {out / 'train.log'}" in read.err
    assert read.out == (out / "train.log").read_text() and "epoch 5/5" in read.out
    assert main(["ssh", run_id]) == 2
    assert "has no live pod" in capsys.readouterr().err
    # The pod is gone, and so is the private key that reached it.
    assert not (out / "pod-ssh-key").exists() and key_path_for(handle.provider, str(out)) is None
    # A follower whose pod went away under it (the run ends the pod right after
    # training) reads the rest from the run's own copy of the log, to its end, exit 0.
    follow = argparse.Namespace(follow=True, max_seconds=60.0)
    assert _from_pod(live_view, handle, str(kept_key), follow) == 0
    read = capsys.readouterr()
    assert f"pod {pod_id} stopped answering" in read.err
    assert read.out == (out / "train.log").read_text() and "epoch 5/5" in read.out
    assert main(["cost", run_id, "--json"]) == 0
    (record,) = _json_of(capsys)["runs"]
    assert record["gpu_type"] == "cpu" and record["usd"] > 0 and record["end"]["confirmed"]


def test_the_cockpit_on_emulated_runpod(prefect_server, runpod_env, tmp_path, capsys):
    """The same commands on a RunPod pod (real SDK, the emulator's PTY-only gateway):
    status and pods show its GPU and price, logs read it from the pod, ssh gets a shell
    through the gateway, cost has the GPU; nothing is left in the emulator."""
    key_file = tmp_path / "id_ed25519_runpod"  # the key runpod_env put on the account
    out, faults = tmp_path / "out", tmp_path / "faults"
    env = server_env(
        PREFECT_RUNPOD_FAULTS="train_running:pause", PREFECT_RUNPOD_FAULT_DIR=str(faults)
    )
    child = spawn_on_ptys(
        [*_CLI, "finetune", "--provider", "runpod", "--output-dir", str(out)], env
    )
    try:
        _wait_for(faults / "train_running.reached", child)
        run_id = json.loads((out / "run-report.json").read_text())["flow_run_id"]
        assert main(["status", run_id, "--json"]) == 0
        row = _json_of(capsys)
        assert (row["provider"], row["pod_live"]) == ("runpod", True)
        assert "RTX 3090" in row["gpu_type"]
        assert row["cost_per_hr_usd"] == 0.22 and str(key_file) in row["ssh_command"]
        # The key in use, as it is: the file RUNPOD_SSH_KEY_PATH names, never quoted.
        report = json.loads((out / "run-report.json").read_text())
        assert f" -i {key_file} " in report["ssh_command"] == row["ssh_command"]
        assert main(["pods", "--provider", "runpod", "--json"]) == 0
        (pod,) = _json_of(capsys)
        assert pod["pod_id"] == row["pod_id"] and pod["run_state"] == "Running"
        assert main(["logs", run_id]) == 0
        read = capsys.readouterr()
        assert f"source: pod {row['pod_id']} (live)" in read.err
        assert "training on 305 tickets" in read.out
        shown = _ssh_under_a_pty(run_id, env)
        assert "cockpit-42" in shown
        release_marker(faults, "train_running").touch()
        assert child.wait(timeout=300) == 0, bytes(child.err)[-3000:].decode(errors="replace")
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    assert main(["logs", run_id]) == 0
    assert f"source: {out / 'train.log'}" in capsys.readouterr().err
    assert main(["cost", run_id, "--json"]) == 0
    data = _json_of(capsys)
    assert "RTX 3090" in data["runs"][0]["gpu_type"]
    assert data["totals"]["runs"] == 1 and data["totals"]["usd"] > 0
    assert runpod_env.live_pod_ids() == []
