"""The ``train`` stage: launch the job detached on the pod, follow its log, stop it on
cancel / runtime cap / budget, and report (docs/architecture.md#the-training-run).

The pod side is ``blocks/pod_side/launcher.py`` (already on the pod in ``tools_dir``).
Everything here talks to it through a console's ``run(command)``, so a dropped SSH
channel costs nothing: training runs in its own session on the pod, and the log is
read by byte offset, which advances only when an answer arrived whole. After a drop
the follower reconnects and asks again from the same offset, so no line is lost and
none is repeated.

The core (``launch_training``, ``LogFollower``, ``follow_training``, ``kill_training``)
is plain Python; the ``train`` task adds Prefect logs and artifacts only.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO, cast
from uuid import UUID

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.reconnect import (
    DEFAULT_RECONNECT_BUDGET_SECONDS,
    ReconnectPolicy,
)
from prefect_runpod.blocks.exceptions import BudgetExceededError, TrainingError
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import watch_for
from prefect_runpod.blocks.transfer import pod_tools
from prefect_runpod.tasks.models import TrainReport
from prefect_runpod.tasks.train_log import (
    LogCoalescer,
    Progress,
    error_line,
    parse_metrics,
    parse_progress,
)
from prefect_runpod.tasks.train_remote import (
    LogChunk,
    LogFollower,
    kill_training,
    launch_training,
    sleep_in_steps,
)

__all__ = [
    "LogChunk",
    "LogFollower",
    "Progress",
    "follow_training",
    "kill_training",
    "launch_training",
    "missing_outputs",
    "parse_metrics",
    "parse_progress",
    "terminal_progress_bar",
    "train",
]


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
    on_progress: Callable[[Progress], None] | None = None,
    on_metrics: Callable[[dict[str, float]], None] | None = None,
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

    def _text(text: str) -> None:
        progress = parse_progress(text)
        if progress is not None and on_progress is not None:
            on_progress(progress)
        found = parse_metrics(text)
        if found:
            metrics.update(found)
            if on_metrics is not None:
                on_metrics(found)

    follower = LogFollower(
        console,
        run_dir,
        tools_dir,
        python=python,
        on_line=on_line,
        on_text=_text,
        heartbeat_path=heartbeat_path,
        tail_lines=tail_lines,
        pod_id=pod_id,
        sleep=sleep,
        clock=clock,
        reconnect_budget_seconds=reconnect_budget_seconds,
    )
    started = clock()
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
            sleep_in_steps(poll_interval_seconds, sleep)
    except BaseException:
        _kill_quietly(follower, kill_grace_seconds)
        raise

    if stop_reason:
        killed = _kill_quietly(follower, kill_grace_seconds)
        with contextlib.suppress(TrainingError):
            chunk = follower.drain()
        exit_code = (killed or {}).get("exit_code")
    else:
        exit_code = chunk.exit_code if chunk else None
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
    error: TrainingError | BudgetExceededError | None = None
    if stop_reason:
        error = BudgetExceededError(
            f"pod {pod_id}: training stopped: {stop_reason}; the process group was killed "
            f"(exit {exit_code}) after {report.seconds:.0f} s.\nLast log lines:\n"
            f"{_last_lines_message(follower.tail)}\nRaise the cap or resume from a checkpoint.",
            pod_id=pod_id,
            stage="train",
        )
    elif chunk is None or chunk.state == "lost" or exit_code is None:
        error = TrainingError(
            f"pod {pod_id}: the training process ended without an exit code (killed with its "
            f"supervisor?) after {report.seconds:.0f} s: {_cause(follower.tail)}.\n"
            "Last log lines:\n"
            f"{_last_lines_message(follower.tail)}\nSee {run_dir}/train.log on the pod.",
            pod_id=pod_id,
            stage="train",
        )
    elif exit_code != 0:
        error = TrainingError(
            f"pod {pod_id}: training exited with code {exit_code} after {report.seconds:.0f} s: "
            f"{_cause(follower.tail)}.\nLast log lines:\n{_last_lines_message(follower.tail)}\n"
            f"Fix the job and rerun; the full log is {run_dir}/train.log on the pod.",
            pod_id=pod_id,
            stage="train",
        )
    if error is not None:
        error.report = report
        raise error
    return report


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


def terminal_progress_bar(
    stream: TextIO | None = None,
    width: int = 20,
    *,
    pod_id: str | None = None,
    step_percent: int = 10,
    tty: bool | None = None,
) -> Callable[[Progress], None]:
    """A training-progress callback for the terminal, e.g. ``abc123 training
    [##########..........]  50% step 50/100``.

    On a terminal (``tty``) it is ONE line that updates in place (``\\r``, then the
    rest of the line cleared) at each whole percent, ended with a newline at 100 %. Else
    (a file, a pipe, CI logs) it writes whole lines that only go forwards: the first
    progress seen, then one each time the whole percent has moved ``step_percent`` on,
    and 100 % once.

    Args:
        stream: where to write (default ``sys.stderr``, looked up at each line).
        width: bar width in characters (20: one ``#`` per 5 %).
        pod_id: the pod, named at the start of each line (``training [...]`` without it).
        step_percent: the least progress, in whole percent, between two plain lines.
        tty: redraw one line in place; default: whether the stream is a terminal.

    Returns:
        The callback, for ``train(..., on_progress=...)``.
    """
    label = f"{pod_id} training" if pod_id else "training"
    shown = {"percent": -step_percent, "drawn": -1}

    def _show(progress: Progress) -> None:
        out = stream or sys.stderr
        percent = int(progress.percent)
        redraw = tty if tty is not None else bool(getattr(out, "isatty", lambda: False)())
        if redraw:
            if percent <= shown["drawn"]:
                return
            shown["drawn"] = percent
        else:
            if percent < shown["percent"] + step_percent and percent < 100:
                return
            if percent <= shown["percent"]:
                return
            shown["percent"] = percent
        filled = percent * width // 100
        counter = f" {progress.unit} {progress.step}/{progress.total}" if progress.total else ""
        line = f"{label} [{'#' * filled}{'.' * (width - filled)}] {percent:3d}%{counter}"
        if redraw:
            out.write(f"\r{line}\x1b[K" + ("\n" if percent >= 100 else ""))
        else:
            out.write(f"{line}\n")
        out.flush()

    return _show


def _tools_dir(handle: PodHandle, tools_dir: str | None) -> str:
    return tools_dir or pod_tools.tools_dir(handle)


@task(name="train", cache_policy=NO_CACHE, retries=0)
def train(
    handle: PodHandle,
    private_key: SecretStr,
    run_dir: str,
    command: str,
    python: str = "python3",
    max_runtime_seconds: float | None = None,
    *,
    tools_dir: str | None = None,
    cwd: str | None = None,
    should_stop: Callable[[], str | None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    heartbeat_path: str | None = None,
    poll_interval_seconds: float = 1.0,
    kill_grace_seconds: float = 30.0,
    console: ConsoleLike | None = None,
    secret_env: dict[str, SecretStr] | None = None,
    expected_outputs: dict[str, str] | None = None,
    reconnect: ReconnectPolicy | None = None,
    local_log_path: str | None = None,
    log_interval_seconds: float = 10.0,
) -> TrainReport:
    """Launch ``command`` detached on the pod, follow its log, and report.

    Progress goes to the ``train-progress`` progress artifact (updated as progress lines
    arrive) and to ``on_progress``; metrics to the ``train-metrics`` table artifact (last
    value of each); the log's own lines reach Prefect's log coalesced, one record per
    ``log_interval_seconds`` at most (``tasks.train_log.LogCoalescer``; JSON record lines
    are left out, their numbers are in the artifacts), marked ``train_log`` so a console
    can leave them out. Every line is also appended to ``local_log_path``. On
    cancellation, the runtime cap or ``should_stop`` the remote process group is killed
    before the error propagates.

    Args:
        handle: the pod.
        private_key: the SSH key (unwrapped only inside the console).
        run_dir: the pod-side run directory (``<run_dir>/bundle`` holds the job).
        command: the training command line (``{python}`` is replaced by ``python``);
            never put secrets in it, they belong in the pod's env.
        python: the pod interpreter for the pod-side tools (and ``{python}``).
        max_runtime_seconds: runtime cap; None for none.
        tools_dir: where ``launcher.py`` is on the pod, default the pod tools folder
            (``pod_tools.tools_dir(handle)``).
        cwd: the job's working directory, default ``<run_dir>/bundle``.
        should_stop: returns a reason to stop (budget) or None; polled each step.
        on_progress: e.g. ``terminal_progress_bar(pod_id=handle.pod_id)`` for progress
            lines in the terminal.
        heartbeat_path: the dead-man heartbeat file (default ``<run_dir>/heartbeat``).
        poll_interval_seconds: log poll period (slept in ≤ 1 s steps).
        kill_grace_seconds: SIGTERM → SIGKILL grace on the pod.
        console: an open console to reuse; by default one is opened and closed here.
        secret_env: secrets the job needs in its environment (``HF_TOKEN`` for a gated
            model): exported in the console hidden (``set_secret_env``), so the detached
            job inherits them while no command line, log or transcript shows them.
        expected_outputs: paths (relative to ``cwd``) the job must leave behind, each
            with the ``bundle.toml`` field that declares it (``{"outputs": "outputs"}``):
            a job that exits 0 without one fails here, naming what is missing.
        reconnect: the run's reconnect policy: the console waits out a gateway outage
            (backoff, the provider asked before each retry) and the log reads, the
            launch and the kill path keep trying for its one budget.
        local_log_path: a local file that receives every log line as it is read (the
            run keeps ``<output_dir>/train.log`` so: ``prefect-runpod logs`` reads it
            once the pod is gone); None for none.
        log_interval_seconds: the least time between two log records of training
            lines, in seconds.

    Returns:
        The ``TrainReport`` of a run that exited 0 and wrote its declared outputs.

    Raises:
        TrainingError: launch refused, non-zero exit, process lost, pod unreachable,
            declared outputs missing.
        BudgetExceededError: runtime cap or ``should_stop``.
        ConsoleConnectError: the console could not be opened.

    Example:
        ```python
        @flow
        def finetune(handle, key):
            report = train(handle, key, "/workspace/run", "{python} -u train.py",
                           max_runtime_seconds=3600,
                           on_progress=terminal_progress_bar(pod_id=handle.pod_id))
        ```
    """
    from prefect.artifacts import (
        create_progress_artifact,
        create_table_artifact,
        update_progress_artifact,
    )
    from prefect.logging import get_run_logger

    from prefect_runpod.blocks.console.session import PodConsole

    logger = get_run_logger()
    pod = handle.pod_id
    tools = _tools_dir(handle, tools_dir)
    command = command.replace("{python}", python)
    own_console = console is None
    live: Any = (
        console
        if console is not None
        else PodConsole.for_pod(handle, private_key, reconnect=reconnect)
    )
    budget = reconnect.budget_seconds if reconnect else DEFAULT_RECONNECT_BUDGET_SECONDS
    artifact_id = cast(
        UUID,
        create_progress_artifact(
            0.0, key="train-progress", description=f"Training on pod {pod}: {command}"
        ),
    )  # sync context: the UUID itself, not a coroutine
    shown = {"percent": -1}

    def _on_progress(progress: Progress) -> None:
        percent = int(progress.percent)
        if percent != shown["percent"]:
            shown["percent"] = percent
            update_progress_artifact(artifact_id, float(percent))
        if on_progress is not None:
            on_progress(progress)

    def _record(lines: list[str]) -> None:
        logger.info(
            "%s | %s", pod, "\n".join(lines), extra={"train_log": True, "train_lines": len(lines)}
        )

    coalescer = LogCoalescer(_record, interval_seconds=log_interval_seconds)
    copy = open(local_log_path, "a", encoding="utf-8") if local_log_path else None  # noqa: SIM115

    def _on_line(line: str) -> None:
        if copy is not None:
            copy.write(line + "\n")
            copy.flush()
        coalescer.add(line)

    def _should_stop() -> str | None:
        coalescer.tick()  # polled every step: a quiet job's last lines still go out
        return should_stop() if should_stop is not None else None

    def _publish_metrics(report: TrainReport | None) -> None:
        if report is not None and report.metrics:
            rows = [{"metric": k, "value": v} for k, v in sorted(report.metrics.items())]
            create_table_artifact(rows, key="train-metrics", description=f"Pod {pod}: last values")

    try:
        if own_console:
            live.connect()
        for name, value in (secret_env or {}).items():
            live.set_secret_env(name, value)
        started = launch_training(
            live,
            run_dir,
            tools,
            command,
            python=python,
            cwd=cwd,
            pod_id=pod,
            reconnect_budget_seconds=budget,
        )
        logger.info(
            "%s: training started (pid %s) in %s: %s", pod, started["pid"], run_dir, command
        )
        fault_point("train_running")  # tests: the job runs, its log not yet followed
        report = follow_training(
            live, run_dir, tools, command=command, python=python,
            max_runtime_seconds=max_runtime_seconds, should_stop=_should_stop,
            on_line=_on_line, on_progress=_on_progress,
            poll_interval_seconds=poll_interval_seconds, kill_grace_seconds=kill_grace_seconds,
            heartbeat_path=heartbeat_path, pod_id=pod, reconnect_budget_seconds=budget,
        )  # fmt: skip
        missing = missing_outputs(live, cwd or f"{run_dir}/bundle", expected_outputs or {})
        if missing:
            raise TrainingError(
                f"pod {pod}: training exited 0 but did not write {', '.join(missing)}, "
                "declared in bundle.toml: make the job write them there, or fix bundle.toml. "
                f"The full log is {run_dir}/train.log on the pod.",
                report=report,
                pod_id=pod,
                stage="train",
            )
    except (TrainingError, BudgetExceededError) as exc:
        _publish_metrics(getattr(exc, "report", None))
        raise
    finally:
        coalescer.flush()
        if copy is not None:
            copy.close()
        if own_console:
            live.close()
    update_progress_artifact(artifact_id, 100.0)
    _publish_metrics(report)
    logger.info(
        "%s: training exited 0 after %.0f s (%d log bytes, %d reconnects)",
        pod, report.seconds, report.log_bytes, report.reconnects,
    )  # fmt: skip
    return report
