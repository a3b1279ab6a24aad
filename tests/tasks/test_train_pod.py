"""The train stage and the dead-man switch on a real local pod, through the real
PTY console (the local pod's gateway mode: PTY only, like RunPod's SSH proxy)."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.tasks.train import follow_training, kill_training, launch_training

pytestmark = pytest.mark.slow

JOB = """
import os, sys, time
gate = "gate"
for i in range(1, {n} + 1):
    print(f"line {{i}}", flush=True)
    if i == {n} // 2:
        while not os.path.exists(gate):  # the test cuts the SSH link while we wait here
            time.sleep(0.02)
print('{{"progress": 1.0, "loss": 0.125}}')
"""


def _drop(console: PodConsole) -> None:
    """Cut the TCP connection under the console (the pod's shell gets SIGHUP)."""
    transport = console._client.get_transport()  # noqa: SLF001 - the test severs the real link
    assert transport is not None
    transport.close()


def _wait_until(predicate, timeout_seconds: float, what: str) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_ssh_drop_mid_training_loses_and_repeats_no_line(local_pod) -> None:
    _, handle, keypair = local_pod
    run_dir = f"{handle.workdir}/run"
    bundle = Path(run_dir) / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "job.py").write_text(JOB.format(n=300))
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        tools = bootstrap_pod_tools(console, handle)
        lines: list[str] = []

        def on_line(text: str) -> None:
            lines.append(text)
            if text == "line 150":
                _drop(console)
                (bundle / "gate").touch()

        launch_training(console, run_dir, tools, "python3 -u job.py", pod_id=handle.pod_id)
        report = follow_training(
            console, run_dir, tools, on_line=on_line, poll_interval_seconds=0.2,
            pod_id=handle.pod_id,
        )  # fmt: skip
    assert lines[:300] == [f"line {i}" for i in range(1, 301)]
    assert len(lines) == 301
    assert report.exit_code == 0 and report.reconnects >= 1
    assert report.metrics == {"loss": 0.125}
    assert (Path(run_dir) / "heartbeat").exists()


def test_kill_ends_a_detached_process_group_on_the_pod(local_pod) -> None:
    _, handle, keypair = local_pod
    run_dir = f"{handle.workdir}/run"
    bundle = Path(run_dir) / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "job.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        tools = bootstrap_pod_tools(console, handle)
        started = launch_training(console, run_dir, tools, "python3 -u job.py")
        log = Path(run_dir) / "train.log"
        _wait_until(lambda: b"child" in log.read_bytes(), 120, "the job's child")
        child = int(log.read_text().split()[1])
        console.reconnect()  # a fresh session: the job outlived the one that started it
        answer = kill_training(console, run_dir, tools, grace_seconds=60)  # ends at once
    assert answer["exit_code"] == 143 and answer["signals"] == ["SIGTERM"]
    assert _gone(started["pid"]) and _gone(child)


def test_watchdog_removes_the_pod_when_the_heartbeat_goes_stale(local_pod, tmp_path) -> None:
    provider, handle, keypair = local_pod
    watch_dir = tmp_path / "watch"  # outside the workspace, so its log outlives the pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        tools = bootstrap_pod_tools(console, handle)
        answer = console.run(
            f"python3 {tools}/watchdog.py --run-dir {shlex.quote(str(watch_dir))} "
            "--heartbeat-stale-seconds 2 --lifetime-seconds 3600 "
            "--check-interval-seconds 0.2 --detach",
            check=True,
        )
        assert json.loads(answer.output.strip().splitlines()[-1])["pid"] > 0
    _wait_until(lambda: provider.get(handle.pod_id) is None, 180, "the pod to remove itself")
    log = (watch_dir / "watchdog.log").read_text()
    assert "heartbeat stale" in log and f"runpodctl pod delete {handle.pod_id}" in log
    # The pod records who ended it and how, beyond its own directory (issue 14).
    status = provider.status(handle.pod_id)
    assert (status.ended_by, status.ended_layer) == ("deadman", "runpodctl pod delete")
    attempts = [json.loads(line) for line in (watch_dir / "deadman.jsonl").read_text().splitlines()]
    assert (attempts[-1]["layer"], attempts[-1]["ok"]) == ("runpodctl pod delete", None)


def test_watchdog_lifetime_cap_removes_a_cared_for_pod(local_pod, tmp_path) -> None:
    provider, handle, keypair = local_pod
    watch_dir = tmp_path / "watch"
    watch_dir.mkdir()
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        tools = bootstrap_pod_tools(console, handle)
        console.run(
            f"python3 {tools}/watchdog.py --run-dir {shlex.quote(str(watch_dir))} "
            "--heartbeat-stale-seconds 3600 --lifetime-seconds 2 "
            "--check-interval-seconds 0.2 --detach",
            check=True,
        )
    deadline = time.monotonic() + 180
    while provider.get(handle.pod_id) is not None and time.monotonic() < deadline:
        (watch_dir / "heartbeat").touch()  # the flow still cares: only the cap can act
        time.sleep(0.1)
    assert provider.get(handle.pod_id) is None
    assert "lifetime cap" in (watch_dir / "watchdog.log").read_text()
