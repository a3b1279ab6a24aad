"""Following a training run through a console: the real launcher on this machine,
reached through ``LocalShellConsole`` (a stand-in for the SSH transport only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import BudgetExceededError, TrainingError
from prefect_runpod.tasks.train import (
    LogFollower,
    Progress,
    follow_training,
    launch_training,
    missing_outputs,
)
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.train import LAUNCHER, LocalShellConsole, write_job

TOOLS = str(LAUNCHER.parent)
PY = os.environ.get("PYTHON", "") or __import__("sys").executable

NUMBERED_JOB = """
import os, sys
gate = {gate!r}
for i in range(1, {n} + 1):
    print(f"line {{i}}", flush=True)
    if i == {n} // 2:
        while not os.path.exists(gate):  # a named point: the test drops the channel here
            import time; time.sleep(0.02)
"""


def numbered_job(run_dir: Path, n: int) -> tuple[str, Path]:
    gate = run_dir / "gate"
    return write_job(run_dir, NUMBERED_JOB.format(gate=str(gate), n=n)), gate


def _wait_for_log(run_dir: Path, text: bytes) -> None:
    """Until the job has written ``text`` to its log (a slow start must not race a cap)."""
    log = run_dir / "train.log"
    wait_until(f"{text!r} in the log", lambda: log.exists() and text in log.read_bytes(), 120)


def follow(console, run_dir: Path, **kw):
    kw.setdefault("poll_interval_seconds", 0.05)
    kw.setdefault("kill_grace_seconds", 2.0)
    return follow_training(console, str(run_dir), TOOLS, python=PY, pod_id="pod-t", **kw)


@pytest.mark.slow
class TestExactlyOnce:
    def test_lines_survive_lost_answers_and_dead_channels(
        self, train_run_dir: Path, shell_console: LocalShellConsole
    ):
        command, gate = numbered_job(train_run_dir, 400)
        # The 2nd read runs on the pod but its answer is lost, and the channel dies
        # again at the gate (mid-run): the follower must reconnect each time.
        shell_console.lose_answer("launcher.py read", 2)
        lines: list[str] = []

        def on_line(text: str) -> None:
            lines.append(text)
            if text == "line 200":
                shell_console.disconnect()
                gate.touch()

        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        report = follow(shell_console, train_run_dir, on_line=on_line)
        assert lines == [f"line {i}" for i in range(1, 401)]
        assert report.exit_code == 0
        assert report.reconnects == shell_console.reconnects == 2
        assert report.log_bytes == (train_run_dir / "train.log").stat().st_size
        assert report.last_log_lines[-1] == "line 400"

    def test_lines_longer_than_a_read_are_joined(self, train_run_dir: Path, shell_console):
        command, gate = numbered_job(train_run_dir, 12)
        gate.touch()
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        lines: list[str] = []
        follower = LogFollower(
            shell_console, str(train_run_dir), TOOLS, python=PY, on_line=lines.append,
            max_bytes=5,
        )  # fmt: skip
        while True:
            chunk = follower.read_once()
            if not chunk.running and chunk.next_offset >= chunk.log_bytes:
                break
        assert lines == [f"line {i}" for i in range(1, 13)]
        assert (train_run_dir / "heartbeat").exists()


@pytest.mark.slow
def test_a_binary_log_is_copied_byte_for_byte_and_failures_name_the_copy(
    train_run_dir: Path, shell_console: LocalShellConsole
):
    # 300 KiB that is no text at all (invalid UTF-8, NUL, CR, ANSI), then a failure.
    command = write_job(
        train_run_dir,
        """
        import os, sys
        out = sys.stdout.buffer
        out.write(b"step 1\\r\\x1b[31mred\\x1b[0m \\xff\\xfe\\x00\\n")
        out.write(os.urandom(300 * 1024))
        out.write(b"\\nValueError: bad batch\\n")
        out.flush()
        sys.exit(3)
        """,
    )
    copy = train_run_dir.parent / "copy-train.log"
    got: list[bytes] = []
    launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
    with pytest.raises(TrainingError) as err:
        follow(shell_console, train_run_dir, on_bytes=got.append, log_copy=str(copy))
    pod_log = (train_run_dir / "train.log").read_bytes()
    assert len(pod_log) > 300 * 1024 and b"".join(got) == pod_log
    message = str(err.value)
    assert f"the full log is {copy} (the pod's log, byte for byte)" in message
    assert "on the pod" not in message


@pytest.mark.slow
class TestProgressAndMetrics:
    def test_redraws_feed_progress_and_only_the_last_reaches_the_log(
        self, train_run_dir: Path, shell_console
    ):
        command = write_job(
            train_run_dir,
            r"""
            import sys
            for i in range(1, 11):
                sys.stdout.write(f"\r{i*10:3d}%|{'#'*i:10s}| {i}/10 [00:01<00:01, loss={1/i:.3f}]")
            sys.stdout.write("\n")
            print('{"progress": 1.0, "eval_accuracy": 0.875}')
            print("done\r")
            """,
        )
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        lines: list[str] = []
        seen: list[Progress] = []
        report = follow(shell_console, train_run_dir, on_line=lines.append, on_progress=seen.append)
        assert [p.step for p in seen if p.step][-1] == 10
        assert seen[-1].fraction == 1.0
        assert lines[0].startswith("100%|##########| 10/10")
        assert lines[1:] == ['{"progress": 1.0, "eval_accuracy": 0.875}', "done"]
        assert report.metrics == pytest.approx({"loss": 0.1, "eval_accuracy": 0.875})


@pytest.mark.slow
class TestEndings:
    def test_nonzero_exit_raises_with_the_last_lines(self, train_run_dir: Path, shell_console):
        command = write_job(
            train_run_dir,
            """
            import sys
            print("loading")
            print("CUDA out of memory", file=sys.stderr)
            sys.exit(3)
            """,
        )
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        with pytest.raises(TrainingError, match=r"pod pod-t: training exited with code 3") as err:
            follow(shell_console, train_run_dir)
        # The first line (a stage's reason, a state message's headline) names the cause.
        first = str(err.value).splitlines()[0]
        assert first.startswith("pod pod-t: training exited with code 3 after ")
        assert first.endswith(": CUDA out of memory.")
        assert err.value.report.exit_code == 3  # type: ignore[attr-defined]

    def test_missing_declared_outputs_are_named(self, train_run_dir: Path, shell_console):
        bundle = train_run_dir / "bundle"
        (bundle / "outputs").mkdir()
        expected = {"outputs": "outputs", "outputs/eval_train.jsonl": "train_eval_jsonl"}
        assert missing_outputs(shell_console, str(bundle), expected) == [
            "outputs/eval_train.jsonl (train_eval_jsonl)"
        ]
        (bundle / "outputs" / "eval_train.jsonl").write_text("{}\n")
        assert missing_outputs(shell_console, str(bundle), expected) == []
        assert missing_outputs(shell_console, str(bundle), {}) == []

    def test_runtime_cap_kills_the_process_group(self, train_run_dir: Path, shell_console):
        command = write_job(
            train_run_dir,
            """
            import time
            print("working", flush=True)
            time.sleep(600)
            """,
        )
        started = launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        _wait_for_log(train_run_dir, b"working\n")  # the cap counts from here, not the job
        with pytest.raises(BudgetExceededError, match="runtime cap of 0.5 s") as err:
            follow(shell_console, train_run_dir, max_runtime_seconds=0.5)
        assert err.value.report.exit_code == 143  # type: ignore[attr-defined]
        assert "working" in str(err.value)
        with pytest.raises(ProcessLookupError):
            os.killpg(started["pgid"], 0)

    def test_an_unfinished_last_line_neither_spins_nor_blocks_the_cap(
        self, train_run_dir: Path, shell_console
    ):
        command = write_job(
            train_run_dir,
            "import sys, time\nsys.stdout.write('epoch 1/3 halfway'); sys.stdout.flush()\n"
            "time.sleep(600)\n",
        )
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        _wait_for_log(train_run_dir, b"epoch 1/3 halfway")
        with pytest.raises(BudgetExceededError, match="runtime cap") as err:
            follow(shell_console, train_run_dir, max_runtime_seconds=1.0, poll_interval_seconds=0.2)
        assert "epoch 1/3 halfway" in str(err.value)  # the tail, read once the run ended
        assert sum("launcher.py read" in c for c in shell_console.calls) < 30

    def test_should_stop_reason_ends_the_run(self, train_run_dir: Path, shell_console):
        command = write_job(
            train_run_dir, "import time\nprint('go', flush=True)\ntime.sleep(600)\n"
        )
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        lines: list[str] = []

        def budget() -> str | None:
            return "projected spend 1.20 USD > max_cost_usd 1.00" if lines else None

        with pytest.raises(BudgetExceededError, match=r"projected spend 1.20 USD"):
            follow(shell_console, train_run_dir, should_stop=budget, on_line=lines.append)
        assert (train_run_dir / "train.exit").read_text().strip() == "143"

    def test_cancellation_kills_the_remote_run_and_propagates(
        self, train_run_dir: Path, shell_console
    ):
        command = write_job(
            train_run_dir, "import time\nprint('go', flush=True)\ntime.sleep(600)\n"
        )
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)

        def interrupt(_line: str) -> None:
            raise KeyboardInterrupt  # what a SIGINT / Prefect's TerminationSignal does

        with pytest.raises(KeyboardInterrupt):
            follow(shell_console, train_run_dir, on_line=interrupt)
        assert (train_run_dir / "train.exit").read_text().strip() == "143"

    def test_a_second_launch_in_a_busy_run_dir_is_refused(self, train_run_dir: Path, shell_console):
        command = write_job(train_run_dir, "import time\ntime.sleep(600)\n")
        launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        with pytest.raises(TrainingError, match="already runs"):
            launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)

    def test_launch_answer_lost_does_not_start_twice(self, train_run_dir: Path, shell_console):
        command, gate = numbered_job(train_run_dir, 4)
        shell_console.lose_answer("launcher.py start", 1)
        started = launch_training(shell_console, str(train_run_dir), TOOLS, command, python=PY)
        assert started["pid"] == int((train_run_dir / "train.pid").read_text())
        assert sum("launcher.py start" in c for c in shell_console.calls) == 1
        gate.touch()
        assert follow(shell_console, train_run_dir).exit_code == 0


FILLS_THE_DISK = """
import sys
print("step 1 loss 0.5", flush=True)
with open("checkpoint.bin", "wb") as fh:
    while True:  # until ENOSPC: the traceback cannot even reach the full log
        fh.write(b"\\0" * 65536)
        fh.flush()
"""


@pytest.mark.slow
def test_a_pod_disk_that_fills_during_training_is_named(tiny_disk: Path) -> None:
    """Issue 24: it used to read "the training process ended without an exit code (killed
    with its supervisor?)", with "No space left on device" nowhere."""
    run_dir = tiny_disk / "run"
    (run_dir / "bundle").mkdir(parents=True)
    console = LocalShellConsole()
    command = write_job(run_dir, FILLS_THE_DISK)
    launch_training(console, str(run_dir), TOOLS, command, python=PY)
    try:
        with pytest.raises(TrainingError) as err:
            follow(console, run_dir)
    finally:
        __import__("subprocess").run(
            [PY, str(LAUNCHER), "kill", "--run-dir", str(run_dir), "--grace-seconds", "1"],
            capture_output=True,
        )
    first = str(err.value).splitlines()[0]
    assert first.startswith("pod pod-t: the pod's disk is full (0 B free of 1.0 MiB on "), first
    assert f"{tiny_disk}: No space left on device)" in first
    assert "killed with its supervisor" not in str(err.value)
