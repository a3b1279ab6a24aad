"""Quiet by default: the training log coalesced into few records, one terminal line that
updates on a TTY, transfer progress at a bounded rate, and the console's verbosity."""

from __future__ import annotations

import io
import logging

from prefect_runpod.blocks.provider import PodEnd
from prefect_runpod.flows.run.logs import WAY_IN, ConsoleFilter, QuietTaskEngine, stage_logger
from prefect_runpod.flows.run.report import RunReport, render_summary
from prefect_runpod.tasks.models import StageState
from prefect_runpod.tasks.pod_io import progress_logger
from prefect_runpod.tasks.train import terminal_progress_bar
from prefect_runpod.tasks.train_log import LogCoalescer, Progress, is_record_line


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_chatty_job_makes_one_record_per_interval_without_its_json_lines():
    clock, records = _Clock(), []
    coalescer = LogCoalescer(records.append, interval_seconds=10.0, max_lines=1000, clock=clock)
    for step in range(300):  # 30 lines a second for 10 s, each with its JSON twin
        clock.now = step / 30
        coalescer.add(f"step {step}/300 loss=0.5")
        coalescer.add(f'{{"step": {step}, "total": 300, "loss": 0.5}}')
    coalescer.add("")
    assert records == []  # not yet 10 s since the first line
    clock.now = 10.0
    coalescer.tick()
    coalescer.flush()
    assert len(records) == 1 and len(records[0]) == 300
    assert all(not line.startswith("{") for line in records[0])
    coalescer.add("done")
    coalescer.flush()
    assert records[-1] == ["done"] and coalescer.records == 2


def test_a_batch_is_capped_in_lines():
    records: list[list[str]] = []
    coalescer = LogCoalescer(records.append, max_lines=3, clock=_Clock())
    for i in range(7):
        coalescer.add(f"line {i}")
    coalescer.flush()
    assert [len(r) for r in records] == [3, 3, 1]


def test_record_lines_are_whole_json_objects_only():
    assert is_record_line('{"loss": 0.3, "step": 4}')
    assert is_record_line("{'loss': 0.3}")  # Hugging Face Trainer's dict lines
    assert not is_record_line("epoch 1 {not json}")
    assert not is_record_line("loss=0.3")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_progress_is_one_line_that_updates():
    screen = _Tty()
    show = terminal_progress_bar(screen, pod_id="pod1")
    for step in range(0, 101):
        show(Progress(step / 100, step, 100))
    out = screen.getvalue()
    assert out.count("\n") == 1 and out.endswith("100% step 100/100\x1b[K\n")
    assert 90 <= out.count("\r") <= 101  # each whole percent redrawn in place, once
    assert out.split("\r")[-1].startswith("pod1 training [####################]")


def test_a_quick_transfer_logs_no_progress_and_a_long_one_every_interval():
    clock, lines = _Clock(), []

    class _Logger:
        def info(self, fmt: str, *args: object) -> None:
            lines.append(fmt % args)

    log = progress_logger(_Logger(), "upload to pod1", interval_seconds=10.0, clock=clock)
    for done in range(0, 101, 10):  # the whole transfer within a second
        clock.now = done / 100
        log(done, 100)
    assert lines == []
    log = progress_logger(_Logger(), "upload to pod1", interval_seconds=10.0, clock=clock)
    for second in range(0, 35):
        clock.now = 1 + second
        log(second, 100)
    assert lines == [
        "upload to pod1: 10/100 bytes (10%)",
        "upload to pod1: 20/100 bytes (20%)",
        "upload to pod1: 30/100 bytes (30%)",
    ]


def _record(msg: str, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_the_console_shows_what_its_verbosity_asks():
    train = _record("pod1 | step 1", train_log=True)
    stage = _record("stage upload Completed")
    warning = _record("the guardian did not start", logging.WARNING)
    assert [ConsoleFilter("normal").filter(r) for r in (train, stage, warning)] == [
        False,
        True,
        True,
    ]
    assert [ConsoleFilter("quiet").filter(r) for r in (train, stage, warning)] == [
        False,
        False,
        True,
    ]
    assert all(ConsoleFilter("verbose").filter(r) for r in (train, stage, warning))


def test_quiet_keeps_the_line_that_says_how_to_get_into_the_pod():
    """``--quiet`` dropped ``pod … is up; get in with: ssh …`` with every INFO record."""
    way_in = _record("pod p1 is up; get in with: ssh -tt …", **WAY_IN)
    assert all(ConsoleFilter(v).filter(way_in) for v in ("quiet", "normal", "verbose"))
    assert not ConsoleFilter("quiet").filter(_record("stage upload Completed"))


def test_the_summary_names_the_way_in_only_while_the_pod_lives():
    report = RunReport(flow_run_id="r1", pod_name="prft-r1", provider="local")
    report.pod_id, report.ssh_command = "p1", "ssh -tt -i /runs/r1/pod-ssh-key -p 2222 u@h"
    assert "get in with  ssh -tt -i /runs/r1/pod-ssh-key -p 2222 u@h" in render_summary(report)
    report.pod_end = PodEnd(pod_id="p1", confirmed=True)  # the pod is confirmed gone
    assert report.terminated
    assert "get in with" not in render_summary(report)


def test_only_a_completed_tasks_engine_record_is_left_out():
    quiet = QuietTaskEngine()
    assert not quiet.filter(_record("Finished in state Completed()"))
    assert quiet.filter(_record("Finished in state Failed('boom')", logging.ERROR))
    assert quiet.filter(_record("uploaded 9 files"))
    # a stage stopped by a cancel in Prefect: its own line says so; the engine's crash not
    cancel = (
        "Execution was interrupted by an unexpected exception: CancelRequested: a cancel in Prefect"
    )
    assert not quiet.filter(_record(f"Crash detected! {cancel}", logging.ERROR))
    assert not quiet.filter(_record(f"Finished in state Crashed('{cancel}')", logging.ERROR))
    other = "Execution was interrupted by an unexpected exception: MemoryError: "
    assert quiet.filter(_record(f"Crash detected! {other}", logging.ERROR))


def test_a_stage_logs_once_at_its_end_with_seconds_and_reason():
    report = RunReport(flow_run_id="r", pod_name="p", provider="local")
    seen: list[tuple[int, str]] = []

    class _Logger:
        def debug(self, fmt: str, *args: object) -> None:
            seen.append((logging.DEBUG, fmt % args))

        def info(self, fmt: str, *args: object) -> None:
            seen.append((logging.INFO, fmt % args))

    on_stage = stage_logger(_Logger(), report)
    on_stage("hf_auth", StageState.RUNNING)
    report.stage("hf_auth").seconds = 0.01
    report.stage("hf_auth").reason = "no model id"
    on_stage("hf_auth", StageState.SKIPPED)
    assert [level for level, _ in seen] == [logging.DEBUG, logging.INFO]
    assert seen[1][1] == "stage hf_auth     Skipped     0.01 s: no model id"
