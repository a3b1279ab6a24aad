"""The pod-side launcher, run as the plain script it is on the pod."""

from __future__ import annotations

import ast
import base64
import contextlib
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.train import LAUNCHER, WATCHDOG, launcher, write_job


def _find_python38() -> str | None:
    """A working Python 3.8 interpreter, if this machine has one."""
    candidates = [
        shutil.which("python3.8"),
        *map(str, Path.home().glob(".pyenv/versions/3.8*/bin/python")),
    ]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except OSError:
            continue
        if done.stdout.strip() == "True":
            return candidate
    return None


PY38 = _find_python38()


def wait_for(predicate, timeout_seconds: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_all(run_dir: Path) -> tuple[bytes, dict]:
    """Read the log to its end once the process has ended."""
    offset, data = 0, b""
    while True:
        answer = launcher("read", "--run-dir", str(run_dir), "--offset", str(offset))
        data += base64.b64decode(answer["data_b64"])
        offset = answer["next_offset"]
        if not answer["running"] and offset >= answer["log_bytes"]:
            return data, answer
        time.sleep(0.05)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


class TestPodSideScripts:
    @pytest.mark.parametrize("script", [LAUNCHER, WATCHDOG], ids=lambda p: p.name)
    def test_parses_as_python_38(self, script: Path):
        ast.parse(script.read_text(), feature_version=(3, 8))

    @pytest.mark.skipif(PY38 is None, reason="no Python 3.8 here")
    def test_runs_under_python_38(self, train_run_dir: Path):
        command = write_job(train_run_dir, "print('hello from the pod')\n")
        started = launcher(
            "start", "--run-dir", str(train_run_dir), "--", command, python=str(PY38)
        )
        assert started["pid"] == started["pgid"]
        data, answer = read_all(train_run_dir)
        assert data == b"hello from the pod\n"
        assert answer["exit_code"] == 0


@pytest.mark.slow
class TestStart:
    def test_records_log_pid_cmd_and_exit_code(self, train_run_dir: Path):
        command = write_job(
            train_run_dir,
            """
            import sys
            for i in range(1, 201):
                print(f"line {i}")
            print("to stderr", file=sys.stderr)
            sys.exit(3)
            """,
        )
        started = launcher("start", "--run-dir", str(train_run_dir), "--", command)
        data, answer = read_all(train_run_dir)
        lines = data.decode().splitlines()
        assert lines[:200] == [f"line {i}" for i in range(1, 201)]
        assert lines[200] == "to stderr"
        assert answer["exit_code"] == 3 and answer["state"] == "exited"
        assert (train_run_dir / "train.exit").read_text().strip() == "3"
        assert int((train_run_dir / "train.pid").read_text()) == started["pid"]
        assert (train_run_dir / "train.cmd").read_text().strip() == command

    def test_job_runs_in_its_own_session_with_unbuffered_python(self, train_run_dir: Path):
        command = write_job(
            train_run_dir,
            """
            import os, sys
            print(os.getsid(0), os.getpgid(0))
            print(os.environ.get("PYTHONUNBUFFERED"), sys.stdin.read() == "")
            """,
        )
        started = launcher("start", "--run-dir", str(train_run_dir), "--", command)
        data, _ = read_all(train_run_dir)
        leader = started["pid"]
        assert leader != os.getsid(0)
        assert data.decode().splitlines() == [f"{leader} {leader}", "1 True"]

    def test_refuses_a_second_run_while_one_runs(self, train_run_dir: Path):
        gate = train_run_dir / "gate"
        command = write_job(
            train_run_dir,
            f"""
            import os, time
            while not os.path.exists({str(gate)!r}):
                time.sleep(0.05)
            """,
        )
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        second = launcher("start", "--run-dir", str(train_run_dir), "--", command)
        assert "already runs" in second["error"]
        gate.touch()
        _, answer = read_all(train_run_dir)
        assert answer["exit_code"] == 0

    def test_reports_a_missing_working_directory(self, tmp_path: Path):
        answer = launcher("start", "--run-dir", str(tmp_path / "nowhere"), "--", "true")
        assert "does not exist" in answer["error"]

    def test_unknown_program_is_recorded_as_127(self, train_run_dir: Path):
        launcher("start", "--run-dir", str(train_run_dir), "--", "no-such-program-xyz", "--flag")
        data, answer = read_all(train_run_dir)
        assert answer["exit_code"] == 127
        assert b"cannot start no-such-program-xyz" in data


@pytest.mark.slow
class TestRead:
    def test_returns_only_whole_lines_while_running(self, train_run_dir: Path):
        gate = train_run_dir / "gate"
        command = write_job(
            train_run_dir,
            f"""
            import os, sys, time
            sys.stdout.write("first\\nhalf of a li")
            sys.stdout.flush()
            while not os.path.exists({str(gate)!r}):
                time.sleep(0.05)
            sys.stdout.write("ne\\nlast without newline")
            """,
        )
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        wait_for(
            lambda: (train_run_dir / "train.log").stat().st_size == len(b"first\nhalf of a li"),
            what="the partial line",
        )
        answer = launcher("read", "--run-dir", str(train_run_dir), "--offset", "0")
        assert answer["running"] is True
        assert base64.b64decode(answer["data_b64"]) == b"first\n"
        assert answer["next_offset"] == 6
        gate.touch()
        wait_for(lambda: (train_run_dir / "train.exit").exists(), what="the exit code")
        answer = launcher("read", "--run-dir", str(train_run_dir), "--offset", "6")
        assert base64.b64decode(answer["data_b64"]) == b"half of a line\nlast without newline"
        assert answer["running"] is False and answer["exit_code"] == 0

    def test_bytes_survive_untouched(self, train_run_dir: Path):
        payload = b"\x1b[31mred\x1b[0m\n 10%|#   | 1/10\r 20%|##  | 2/10\r\xff\xfe\x00bin\n"
        (train_run_dir / "bundle" / "payload.bin").write_bytes(payload)
        command = write_job(
            train_run_dir,
            "import sys; sys.stdout.buffer.write(open('payload.bin', 'rb').read())\n",
        )
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        data, _ = read_all(train_run_dir)
        assert data == payload

    def test_max_bytes_splits_at_line_ends_and_heartbeat_is_touched(self, train_run_dir: Path):
        command = write_job(train_run_dir, "for i in range(100): print(f'{i:04d}')\n")
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        wait_for(lambda: (train_run_dir / "train.exit").exists(), what="the exit code")
        heartbeat = train_run_dir / "heartbeat"
        answer = launcher(
            "read",
            "--run-dir",
            str(train_run_dir),
            "--offset",
            "10",
            "--max-bytes",
            "12",
            "--heartbeat",
            str(heartbeat),
        )
        assert base64.b64decode(answer["data_b64"]) == b"0002\n0003\n"
        assert answer["next_offset"] == 20
        assert heartbeat.exists()

    def test_status_of_an_unused_run_dir_is_absent(self, tmp_path: Path):
        answer = launcher("status", "--run-dir", str(tmp_path))
        assert answer["state"] == "absent" and answer["running"] is False


@pytest.mark.slow
class TestKill:
    def test_kills_the_whole_detached_process_group(self, train_run_dir: Path):
        command = write_job(
            train_run_dir,
            """
            import subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print("child", child.pid, flush=True)
            time.sleep(600)
            """,
        )
        started = launcher("start", "--run-dir", str(train_run_dir), "--", command)
        log = train_run_dir / "train.log"
        wait_for(lambda: log.exists() and b"child" in log.read_bytes(), what="the child pid")
        child_pid = int(log.read_text().split()[1])
        answer = launcher("kill", "--run-dir", str(train_run_dir), "--grace-seconds", "60")
        assert answer["signals"] == ["SIGTERM"]
        assert answer["exit_code"] == 143 and answer["state"] == "exited"
        assert pid_gone(started["pid"]) and pid_gone(child_pid)

    def test_escalates_to_sigkill_when_sigterm_is_ignored(self, train_run_dir: Path):
        command = write_job(
            train_run_dir,
            """
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("armored", flush=True)
            time.sleep(600)
            """,
        )
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        log = train_run_dir / "train.log"
        wait_for(lambda: log.exists() and b"armored" in log.read_bytes(), what="the job")
        answer = launcher("kill", "--run-dir", str(train_run_dir), "--grace-seconds", "0.5")
        assert answer["signals"] == ["SIGTERM", "SIGKILL"]
        assert answer["exit_code"] == 137

    def test_is_idempotent_on_an_ended_run(self, train_run_dir: Path):
        command = write_job(train_run_dir, "print('done')\n")
        launcher("start", "--run-dir", str(train_run_dir), "--", command)
        wait_for(lambda: (train_run_dir / "train.exit").exists(), what="the exit code")
        answer = launcher("kill", "--run-dir", str(train_run_dir))
        assert answer["signals"] == [] and answer["exit_code"] == 0


@pytest.mark.slow
class TestDetachment:
    def test_training_survives_the_hangup_of_the_launching_terminal(self, train_run_dir: Path):
        """An SSH drop hangs up the login shell's terminal; the job must live on."""
        gate = train_run_dir / "gate"
        command = write_job(
            train_run_dir,
            f"""
            import os, time
            print("started", flush=True)
            while not os.path.exists({str(gate)!r}):
                time.sleep(0.05)
            print("survived", flush=True)
            """,
        )
        pid, master = pty.fork()
        if pid == 0:  # a login-shell stand-in on its own terminal
            signal.signal(signal.SIGHUP, signal.SIG_DFL)  # even when run under nohup
            os.execv(
                "/bin/sh",
                [
                    "sh",
                    "-c",
                    f"{sys.executable} {LAUNCHER} start --run-dir {train_run_dir} "
                    f"-- '{command}'; sleep 600",
                ],
            )
        try:
            wait_for(lambda: (train_run_dir / "train.pid").exists(), what="the pid file")
            log = train_run_dir / "train.log"
            wait_for(lambda: log.exists() and b"started" in log.read_bytes(), what="the job")
        finally:
            os.close(master)  # the terminal goes away, as when the SSH channel drops
            os.killpg(pid, signal.SIGHUP)
            time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):  # the stand-in shell, not the job
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        gate.touch()
        data, answer = read_all(train_run_dir)
        assert data == b"started\nsurvived\n"
        assert answer["exit_code"] == 0


def test_launcher_cli_without_action_prints_usage():
    done = subprocess.run([sys.executable, str(LAUNCHER)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
