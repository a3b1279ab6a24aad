"""Following a launched training job to its end (docs/architecture.md#the-training-run):
its log read by byte offset, its progress and metrics picked out of the lines, the job
stopped on the runtime cap, a stop reason or any exception, and the report or the error
it ended with. Plain Python, no Prefect: the ``train`` task
(:mod:`prefect_runpod.tasks.train`) adds Prefect's logs and artifacts.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.launcher_client import (
    LogChunk,
    LogFollower,
    kill_training,
    sleep_in_steps,
)
from prefect_runpod.blocks.console.reconnect import DEFAULT_RECONNECT_BUDGET_SECONDS
from prefect_runpod.blocks.exceptions import BudgetExceededError, TrainingError
from prefect_runpod.blocks.interrupts import raise_if_stopped
from prefect_runpod.blocks.pod_watch import watch_for
from prefect_runpod.blocks.sizes import human_bytes
from prefect_runpod.tasks.models import TrainReport
from prefect_runpod.tasks.train_log import Progress, error_line, parse_metrics, parse_progress

__all__ = ["follow_training", "missing_outputs", "pod_disk_full"]

FULL_BELOW_BYTES = 1 << 20
"""A pod filesystem with less free space than this (1 MiB) counts as full."""


def pod_disk_full(console: ConsoleLike, path: str) -> str | None:
    """Whether the pod's filesystem holding ``path`` is full (``df -Pk``): a phrase for
    the error, e.g. ``0 B free of 1.0 MiB on /workspace: No space left on device``, or
    None when it has room (``FULL_BELOW_BYTES`` or more free) or cannot be asked (a pod
    gone or unreachable: that fault has its own sentence). Never raises."""
    try:
        answer = console.run(f"df -Pk -- {shlex.quote(path)}", timeout_seconds=10)
    except Exception:  # noqa: BLE001 - a probe only: the failure keeps its own message
        return None
    for fields in reversed([line.split() for line in (answer.output or "").splitlines()]):
        if len(fields) >= 6 and fields[1].isdigit() and fields[3].isdigit():
            size, free = int(fields[1]) * 1024, int(fields[3]) * 1024
            if free >= FULL_BELOW_BYTES:
                return None
            where = " ".join(fields[5:])
            return f"{human_bytes(free)} free of {human_bytes(size)} on {where}: No space left on device"
    return None


def _last_lines_message(tail: deque[str] | list[str]) -> str:
    lines = list(tail)[-20:]
    return "\n".join(f"    {line}" for line in lines) if lines else "    (the log is empty)"


def _cause(tail: deque[str] | list[str]) -> str:
    """The log's error line (``tasks.train_log.error_line``), for the first line of a
    failure: a stage summary and a Prefect state message show that line first."""
    return error_line(list(tail)) or "the log is empty"


_MISSING = "__prefect_runpod_missing__"


def missing_outputs(console: ConsoleLike, workdir: str, expected: dict[str, str]) -> list[str]:
    """Which of the job's declared outputs do not exist on the pod.

    Args:
        console: the pod's console.
        workdir: the job's working directory (the pod-side bundle).
        expected: relative path -> the ``bundle.toml`` field that declares it.

    Returns:
        ``"<path> (<field>)"`` for each missing one, in ``expected``'s order.
    """
    if not expected:
        return []
    quoted = " ".join(shlex.quote(p) for p in expected)
    answer = console.run(
        f'cd {shlex.quote(workdir)} && for p in {quoted}; do [ -e "$p" ] || '
        f"printf '{_MISSING} %s\\n' \"$p\"; done; true",
        timeout_seconds=60,
    )
    gone = {
        line.split(" ", 1)[1].strip()
        for line in (answer.output or "").splitlines()
        if line.startswith(f"{_MISSING} ")
    }
    return [f"{path} ({field})" for path, field in expected.items() if path in gone]


def follow_training(
    console: ConsoleLike,
    run_dir: str,
    tools_dir: str,
    *,
    command: str = "",
    python: str = "python3",
    max_runtime_seconds: float | None = None,
    should_stop: Callable[[], str | None] | None = None,
    on_line: Callable[[str], None] | None = None,
    on_bytes: Callable[[bytes], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_metrics: Callable[[dict[str, float]], None] | None = None,
    log_copy: str | None = None,
    poll_interval_seconds: float = 1.0,
    kill_grace_seconds: float = 30.0,
    heartbeat_path: str | None = None,
    tail_lines: int = 50,
    reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS,
    pod_id: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> TrainReport:
    """Follow a launched training run to its end and report it.

    Polls ``launcher.py read`` every ``poll_interval_seconds`` (sleeping in steps of
    at most 1 s, so SIGTERM / cancellation land at once), streams lines to
    ``on_line``, progress to ``on_progress`` and each line's metrics to ``on_metrics``.
    On the runtime cap, on ``should_stop()`` returning a reason, or on any exception
    (cancellation included) it kills the remote process group first.

    Args:
        console, run_dir, tools_dir, python: as for ``launch_training``.
        command: recorded in the report.
        on_bytes / log_copy: the log's bytes as read, undecoded (``LogFollower``), and
            the local file they are kept in, named in failure messages (or None).
        max_runtime_seconds: runtime cap from the start of following; None for none.
        should_stop: returns a reason to stop (e.g. the budget is spent) or None.
        kill_grace_seconds: SIGTERM → SIGKILL grace on the pod.
        heartbeat_path: the dead-man heartbeat refreshed at each poll (default
            ``<run_dir>/heartbeat``).
        reconnect_budget_seconds: how long the log reads and the kill path keep
            reconnecting after a drop (the run's one reconnect budget).

    Returns:
        ``TrainReport`` of a run that exited 0.

    Raises:
        TrainingError: non-zero exit, the process vanished, or the pod stayed
            unreachable; the message carries the last log lines.
        BudgetExceededError: the runtime cap passed or ``should_stop`` gave a reason.
        Both carry the partial ``TrainReport`` as ``.report``.
    """
    metrics: dict[str, float] = {}
    follower = LogFollower(
        console,
        run_dir,
        tools_dir,
        python=python,
        on_line=on_line,
        on_text=_text_reader(metrics, on_progress, on_metrics),
        on_bytes=on_bytes,
        heartbeat_path=heartbeat_path,
        tail_lines=tail_lines,
        pod_id=pod_id,
        sleep=sleep,
        clock=clock,
        reconnect_budget_seconds=reconnect_budget_seconds,
    )
    started = clock()
    chunk, stop_reason = _poll_until_done(
        follower,
        started,
        max_runtime_seconds=max_runtime_seconds,
        should_stop=should_stop,
        poll_interval_seconds=poll_interval_seconds,
        kill_grace_seconds=kill_grace_seconds,
        sleep=sleep,
        clock=clock,
    )
    exit_code = chunk.exit_code if chunk else None
    if stop_reason:
        exit_code = (_kill_quietly(follower, kill_grace_seconds) or {}).get("exit_code")
        with contextlib.suppress(TrainingError):
            chunk = follower.drain()
    report = TrainReport(
        command=command,
        run_dir=run_dir,
        exit_code=exit_code,
        seconds=round(clock() - started, 3),
        last_log_lines=list(follower.tail),
        metrics=metrics,
        log_bytes=follower.offset,
        reconnects=follower.reconnects,
    )
    _raise_if_failed(report, follower, stop_reason, chunk, pod_id, log_copy)
    return report


def _raise_if_failed(
    report: TrainReport,
    follower: LogFollower,
    stop_reason: str | None,
    chunk: LogChunk | None,
    pod_id: str | None,
    log_copy: str | None,
) -> None:
    """Raise the followed run's error (``_outcome_error``) carrying ``report``; for a
    failed or lost run the pod's disk is asked first, so a full one is said."""
    code = report.exit_code
    failed = not stop_reason and (chunk is None or chunk.state == "lost" or code != 0)
    disk = pod_disk_full(follower.console, report.run_dir) if failed else None
    error = _outcome_error(
        report, stop_reason, chunk, follower.tail, pod_id, log_copy=log_copy, disk=disk
    )
    if error is not None:
        error.report = report
        raise error


def _text_reader(
    metrics: dict[str, float],
    on_progress: Callable[[Progress], None] | None,
    on_metrics: Callable[[dict[str, float]], None] | None,
) -> Callable[[str], None]:
    """What to do with each piece of log text: progress to ``on_progress``, metrics
    into ``metrics`` and to ``on_metrics``."""

    def _text(text: str) -> None:
        progress = parse_progress(text)
        if progress is not None and on_progress is not None:
            on_progress(progress)
        found = parse_metrics(text)
        if found:
            metrics.update(found)
            if on_metrics is not None:
                on_metrics(found)

    return _text


def _poll_until_done(
    follower: LogFollower,
    started: float,
    *,
    max_runtime_seconds: float | None,
    should_stop: Callable[[], str | None] | None,
    poll_interval_seconds: float,
    kill_grace_seconds: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> tuple[LogChunk | None, str | None]:
    """Read the log until the job ends or a reason to stop it comes: ``(last chunk,
    stop reason or None)``. Any exception (cancellation included) kills the job first."""
    stop_reason: str | None = None
    chunk: LogChunk | None = None
    try:
        while True:
            chunk = follower.read_once()
            if not chunk.running:
                if chunk.next_offset < chunk.log_bytes:
                    chunk = follower.drain()
                break
            if max_runtime_seconds is not None and clock() - started >= max_runtime_seconds:
                stop_reason = f"runtime cap of {max_runtime_seconds:g} s reached"
            elif should_stop is not None:
                stop_reason = should_stop()
            if stop_reason:
                break
            if chunk.data and chunk.next_offset < chunk.log_bytes:
                continue  # more whole lines waiting: read on before sleeping
            raise_if_stopped()  # a Ctrl-C the garbage collector dropped is raised here
            sleep_in_steps(poll_interval_seconds, sleep)
    except BaseException:
        _kill_quietly(follower, kill_grace_seconds)
        raise
    return chunk, stop_reason


def full_log_place(run_dir: str, pod_id: str | None, log_copy: str | None) -> str:
    """Where a failed run's whole training log is, for its messages: the run's own copy
    (``log_copy``, the pod's log byte for byte, kept after the pod is gone), else the
    pod's file while the pod lives."""
    if log_copy:
        return f"{log_copy} (the pod's log, byte for byte)"
    return f"{run_dir}/train.log on pod {pod_id} while it lives"


def _outcome_error(
    report: TrainReport,
    stop_reason: str | None,
    chunk: LogChunk | None,
    tail: deque[str],
    pod_id: str | None,
    log_copy: str | None = None,
    disk: str | None = None,
) -> TrainingError | BudgetExceededError | None:
    """The error a followed run ends with (a stop, a lost process, a non-zero exit), its
    message carrying the log's last lines and where the whole log is (``log_copy``, the
    run's own copy, which outlives the pod), and leading with the pod's full disk when
    ``disk`` says so (``pod_disk_full``); None for a run that exited 0."""
    exit_code = report.exit_code
    full_log = full_log_place(report.run_dir, pod_id, log_copy)
    if disk and (chunk is None or chunk.state == "lost" or exit_code is None):
        return TrainingError(
            f"pod {pod_id}: the pod's disk is full ({disk}); the training process ended "
            f"without recording an exit code after {report.seconds:.0f} s: {_cause(tail)}.\n"
            f"Last log lines:\n{_last_lines_message(tail)}\nFree space on the pod (a larger "
            f"volume, fewer checkpoints kept) and rerun; the full log is {full_log}.",
            pod_id=pod_id,
            stage="train",
        )
    if disk and exit_code != 0:
        return TrainingError(
            f"pod {pod_id}: the pod's disk is full ({disk}); training exited with code "
            f"{exit_code} after {report.seconds:.0f} s: {_cause(tail)}.\nLast log lines:\n"
            f"{_last_lines_message(tail)}\nFree space on the pod (a larger volume, fewer "
            f"checkpoints kept) and rerun; the full log is {full_log}.",
            pod_id=pod_id,
            stage="train",
        )
    if stop_reason:
        return BudgetExceededError(
            f"pod {pod_id}: training stopped: {stop_reason}; the process group was killed "
            f"(exit {exit_code}) after {report.seconds:.0f} s.\nLast log lines:\n"
            f"{_last_lines_message(tail)}\nRaise the cap or resume from a checkpoint.",
            pod_id=pod_id,
            stage="train",
        )
    if chunk is None or chunk.state == "lost" or exit_code is None:
        return TrainingError(
            f"pod {pod_id}: the training process ended without an exit code (killed with its "
            f"supervisor?) after {report.seconds:.0f} s: {_cause(tail)}.\n"
            "Last log lines:\n"
            f"{_last_lines_message(tail)}\nThe full log is {full_log}.",
            pod_id=pod_id,
            stage="train",
        )
    if exit_code != 0:
        return TrainingError(
            f"pod {pod_id}: training exited with code {exit_code} after {report.seconds:.0f} s: "
            f"{_cause(tail)}.\nLast log lines:\n{_last_lines_message(tail)}\n"
            f"Fix the job and rerun; the full log is {full_log}.",
            pod_id=pod_id,
            stage="train",
        )
    return None


def _kill_quietly(follower: LogFollower, grace_seconds: float) -> dict[str, Any] | None:
    """Kill the remote run; never raises (the caller is already failing). Nothing to
    kill on a pod that is gone: no reconnect window is waited out for it."""
    watch = watch_for(follower.pod_id)
    if watch is not None and watch.lost is not None:
        return None
    try:
        if follower.in_command:  # interrupted mid-command: the shell is in an unknown state
            follower.console.reconnect()
            follower.in_command = False
        return kill_training(
            follower.console,
            follower.run_dir,
            follower.tools_dir,
            python=follower.python,
            grace_seconds=grace_seconds,
            pod_id=follower.pod_id,
            reconnect_budget_seconds=follower.reconnect_budget_seconds,
        )
    except Exception:  # noqa: BLE001 - best effort; the pod is terminated after this anyway
        return None
