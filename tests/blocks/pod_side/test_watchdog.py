"""The pod-side dead-man switch, run as the plain script it is on the pod."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.train import WATCHDOG


def run_watchdog(run_dir: Path, *args: str, env: dict | None = None, timeout: float = 60.0):
    return subprocess.run(
        [sys.executable, str(WATCHDOG), "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def marker_command(marker: Path) -> str:
    """A remove command that records the pod id it was asked to remove."""
    return f'echo "removed $RUNPOD_POD_ID" >> {marker}'


def wait_for(predicate, timeout_seconds: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def pod_env() -> dict:
    return {**os.environ, "RUNPOD_POD_ID": "pod-test-1"}


class TestDecide:
    """The rule itself, as a pure function (times in epoch seconds)."""

    @pytest.fixture(scope="class")
    def decide(self):
        spec = importlib.util.spec_from_file_location("pod_side_watchdog", WATCHDOG)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.decide

    @pytest.mark.parametrize(
        ("now", "started", "origin", "heartbeat", "expected"),
        [
            (100.0, 100.0, 100.0, None, None),  # just armed
            (159.0, 100.0, 100.0, 150.0, None),  # fresh heartbeat
            (170.0, 100.0, 100.0, 105.0, "heartbeat stale"),  # heartbeat 65 s old
            (170.0, 100.0, 100.0, None, "no heartbeat yet"),  # never beat, 70 s since start
            (120.0, 100.0, 100.0, 10.0, None),  # an old leftover counts from the start
            (1100.0, 100.0, 50.0, 1099.0, "lifetime cap"),  # fresh beat, but too old a pod
        ],
    )
    def test_table(self, decide, now, started, origin, heartbeat, expected):
        reason = decide(now, started, origin, heartbeat, 60.0, 1000.0)
        if expected is None:
            assert reason is None
        else:
            assert expected in reason


class TestWatchdog:
    def test_stale_heartbeat_removes_the_pod(self, tmp_path: Path, pod_env: dict):
        marker = tmp_path / "removed.txt"
        (tmp_path / "heartbeat").touch()
        os.utime(tmp_path / "heartbeat", (time.time() - 100, time.time() - 100))
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.2",
            "--remove-command",
            marker_command(marker),
            env=pod_env,
        )
        assert done.returncode == 0
        assert marker.read_text() == "removed pod-test-1\n"
        log = (tmp_path / "watchdog.log").read_text()
        assert "heartbeat stale" in log and "remove command succeeded" in log

    def test_lifetime_cap_removes_the_pod_despite_a_fresh_heartbeat(
        self, tmp_path: Path, pod_env: dict
    ):
        marker = tmp_path / "removed.txt"
        heartbeat = tmp_path / "heartbeat"
        proc = subprocess.Popen(
            [sys.executable, str(WATCHDOG), "--run-dir", str(tmp_path),
             "--heartbeat-stale-seconds", "3600", "--lifetime-seconds", "1",
             "--check-interval-seconds", "0.2", "--remove-command", marker_command(marker)],
            env=pod_env,
        )  # fmt: skip
        try:
            while proc.poll() is None:
                heartbeat.touch()
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        assert proc.returncode == 0
        assert "lifetime cap" in (tmp_path / "watchdog.log").read_text()
        assert marker.read_text() == "removed pod-test-1\n"

    def test_lifetime_counts_from_the_first_start(self, tmp_path: Path, pod_env: dict):
        """A restarted watchdog must not grant the pod a new lifetime."""
        marker = tmp_path / "removed.txt"
        (tmp_path / "watchdog.start").write_text(f"{time.time() - 7200:.3f}\n")
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "3600",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.2",
            "--remove-command",
            marker_command(marker),
            env=pod_env,
        )
        assert done.returncode == 0 and marker.exists()
        assert "lifetime cap" in (tmp_path / "watchdog.log").read_text()

    def test_failed_removal_is_retried(self, tmp_path: Path, pod_env: dict):
        counter = tmp_path / "attempts"
        command = (
            f"echo x >> {counter}; "
            f'test "$(wc -l < {counter})" -ge 2 || {{ echo "api down" >&2; exit 1; }}'
        )
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "0.1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.1",
            "--remove-command",
            command,
            env=pod_env,
        )
        assert done.returncode == 0
        assert counter.read_text().count("x") == 2
        log = (tmp_path / "watchdog.log").read_text()
        assert "exited 1: api down" in log and "will retry" in log

    def test_default_command_is_runpodctl_remove_pod(self, tmp_path: Path, pod_env: dict):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "runpodctl"
        shim.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/runpodctl-args\n')
        shim.chmod(0o755)
        env = {**pod_env, "PATH": f"{bin_dir}:{pod_env['PATH']}"}
        done = run_watchdog(
            tmp_path,
            "--heartbeat-stale-seconds",
            "0.1",
            "--lifetime-seconds",
            "3600",
            "--check-interval-seconds",
            "0.1",
            env=env,
        )
        assert done.returncode == 0
        assert (tmp_path / "runpodctl-args").read_text() == "remove pod pod-test-1\n"

    def test_refuses_to_start_without_a_way_to_remove_the_pod(self, tmp_path: Path):
        env = {k: v for k, v in os.environ.items() if k != "RUNPOD_POD_ID"}
        done = run_watchdog(
            tmp_path, "--heartbeat-stale-seconds", "1", "--lifetime-seconds", "10", env=env
        )
        assert done.returncode == 2 and "RUNPOD_POD_ID is not set" in done.stderr

    def test_detach_runs_one_instance_and_stops_on_sigterm(self, tmp_path: Path, pod_env: dict):
        marker = tmp_path / "removed.txt"
        args = (
            "--heartbeat-stale-seconds", "3600", "--lifetime-seconds", "3600",
            "--check-interval-seconds", "0.2", "--remove-command", marker_command(marker),
            "--detach",
        )  # fmt: skip
        first = run_watchdog(tmp_path, *args, env=pod_env)
        pid = json.loads(first.stdout)["pid"]
        try:
            second = json.loads(run_watchdog(tmp_path, *args, env=pod_env).stdout)
            assert second == {"pid": pid, "already_running": True}
            assert os.getsid(pid) != os.getsid(0)  # its own session: an SSH drop cannot reach it
        finally:
            os.kill(pid, signal.SIGTERM)
        log = tmp_path / "watchdog.log"
        wait_for(lambda: "stopped by SIGTERM" in log.read_text(), what="the watchdog to stop")
        assert not marker.exists()
