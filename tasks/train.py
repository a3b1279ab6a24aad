"""The ``train`` stage: launch the job detached on the pod, follow its log, stop it on
cancel / runtime cap / budget, and report (docs/architecture.md#the-training-run).

The pod side is ``blocks/pod_side/launcher.py`` (already on the pod in ``tools_dir``).
Everything here talks to it through a console's ``run(command)``, so a dropped SSH
channel costs nothing: training runs in its own session on the pod, and the log is
read by byte offset, which advances only when an answer arrived whole. After a drop
the follower reconnects and asks again from the same offset, so no line is lost and
none is repeated.

The core (``launch_training``, ``LogFollower``, ``kill_training`` in
``blocks/console/launcher_client.py``; ``follow_training`` in ``tasks/train_follow.py``) is plain
Python; the ``train`` task adds Prefect logs and artifacts only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.launcher_client import (
    LogChunk,
    LogFollower,
    kill_training,
    launch_training,
)
from prefect_runpod.blocks.console.reconnect import (
    DEFAULT_RECONNECT_BUDGET_SECONDS,
    ReconnectPolicy,
)
from prefect_runpod.blocks.exceptions import BudgetExceededError, TrainingError
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.held_artifacts import hold_artifact, update_held_progress
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer import pod_tools
from prefect_runpod.tasks.models import TrainReport
from prefect_runpod.tasks.pod_io import borrowed_console
from prefect_runpod.tasks.train_follow import follow_training, full_log_place, missing_outputs
from prefect_runpod.tasks.train_log import (
    LogCoalescer,
    Progress,
    parse_metrics,
    parse_progress,
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


class _TrainOutputs:
    """What a followed training run sends to Prefect: progress to the ``train-progress``
    progress artifact (updated as progress lines arrive) and to the caller's
    ``on_progress``; metrics to the ``train-metrics`` table artifact (last value of
    each); the log's own lines to Prefect's log coalesced, one record per
    ``log_interval_seconds`` at most (``tasks.train_log.LogCoalescer``; JSON record
    lines are left out, their numbers are in the artifacts), marked ``train_log`` so a
    console can leave them out; and the log's bytes, undecoded, to ``local_log_path`` when
    given (the pod's ``train.log`` byte for byte)."""

    def __init__(
        self,
        logger: Any,
        pod: str,
        command: str,
        on_progress: Callable[[Progress], None] | None,
        should_stop: Callable[[], str | None] | None,
        local_log_path: str | None,
        log_interval_seconds: float,
    ) -> None:
        self.logger, self.pod = logger, pod
        self._on_progress, self._should_stop = on_progress, should_stop
        # held, never awaited: the follow loop never waits on the Prefect API
        self.progress = hold_artifact(
            "train-progress", "progress", 0.0, f"Training on pod {pod}: {command}"
        )
        self._shown = -1
        self.coalescer = LogCoalescer(self._record, interval_seconds=log_interval_seconds)
        self.copy_path = local_log_path
        self.copy = open(local_log_path, "ab") if local_log_path else None  # noqa: SIM115

    def on_progress(self, progress: Progress) -> None:
        percent = int(progress.percent)
        if percent != self._shown:
            self._shown = percent
            update_held_progress(self.progress, float(percent))
        if self._on_progress is not None:
            self._on_progress(progress)

    def _record(self, lines: list[str]) -> None:
        self.logger.info(
            "%s | %s",
            self.pod,
            "\n".join(lines),
            extra={"train_log": True, "train_lines": len(lines)},
        )

    def on_bytes(self, data: bytes) -> None:
        """The log's bytes, as the pod has them, appended to the local copy."""
        if self.copy is not None:
            self.copy.write(data)
            self.copy.flush()

    def on_line(self, line: str) -> None:
        self.coalescer.add(line)

    def should_stop(self) -> str | None:
        self.coalescer.tick()  # polled every step: a quiet job's last lines still go out
        return self._should_stop() if self._should_stop is not None else None

    def publish_metrics(self, report: TrainReport | None) -> None:
        if report is not None and report.metrics:
            rows = [{"metric": k, "value": v} for k, v in sorted(report.metrics.items())]
            hold_artifact("train-metrics", "table", rows, f"Pod {self.pod}: last values")
        outbox().flush()  # in Prefect before the stage ends, unless the API is down

    def close(self) -> None:
        """The last coalesced lines out, the local copy closed."""
        self.coalescer.flush()
        if self.copy is not None:
            self.copy.close()

    def finished(self, report: TrainReport) -> None:
        """A run that exited 0: progress at 100 %, its metrics table, one log line."""
        fault_point("train_finished")  # a test takes the Prefect API down here
        update_held_progress(self.progress, 100.0)
        self.publish_metrics(report)
        self.logger.info(
            "%s: training exited 0 after %.0f s (%d log bytes, %d reconnects)",
            self.pod, report.seconds, report.log_bytes, report.reconnects,
        )  # fmt: skip


def _launch_and_follow(
    live: Any,
    out: _TrainOutputs,
    run_dir: str,
    tools: str,
    command: str,
    *,
    python: str,
    cwd: str | None,
    max_runtime_seconds: float | None,
    heartbeat_path: str | None,
    poll_interval_seconds: float,
    kill_grace_seconds: float,
    expected_outputs: dict[str, str],
    connect: bool,
    secret_env: dict[str, SecretStr] | None,
    reconnect_budget_seconds: float,
) -> TrainReport:
    """Launch the job on the console (connected first when ``connect``, with the job's
    secrets exported hidden), follow it to its end, and check that it left its declared
    outputs (``TrainingError`` naming what is missing)."""
    pod = out.pod
    if connect:
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
        reconnect_budget_seconds=reconnect_budget_seconds,
    )
    out.logger.info(
        "%s: training started (pid %s) in %s: %s", pod, started["pid"], run_dir, command
    )
    fault_point("train_running")  # tests: the job runs, its log not yet followed
    report = follow_training(
        live, run_dir, tools, command=command, python=python,
        max_runtime_seconds=max_runtime_seconds, should_stop=out.should_stop,
        on_line=out.on_line, on_bytes=out.on_bytes, log_copy=out.copy_path,
        on_progress=out.on_progress,
        poll_interval_seconds=poll_interval_seconds, kill_grace_seconds=kill_grace_seconds,
        heartbeat_path=heartbeat_path, pod_id=pod,
        reconnect_budget_seconds=reconnect_budget_seconds,
    )  # fmt: skip
    missing = missing_outputs(live, cwd or f"{run_dir}/bundle", expected_outputs)
    if missing:
        raise TrainingError(
            f"pod {pod}: training exited 0 but did not write {', '.join(missing)}, "
            "declared in bundle.toml: make the job write them there, or fix bundle.toml. "
            f"The full log is {full_log_place(run_dir, pod, out.copy_path)}.",
            report=report,
            pod_id=pod,
            stage="train",
        )
    return report


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

    Progress, metrics and the log's lines reach Prefect as ``_TrainOutputs`` says. On
    cancellation, the runtime cap or ``should_stop`` the remote process group is killed
    before the error propagates. A runnable example: docs/reference/task-train.md.

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
        heartbeat_path / poll_interval_seconds / kill_grace_seconds: as for
            ``follow_training`` (heartbeat file; poll period, s; SIGTERM → SIGKILL grace, s).
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
        local_log_path: a local file that gets the log's bytes undecoded, the pod's
            ``train.log`` byte for byte (``<output_dir>/train.log``: ``logs`` reads it
            once the pod is gone, failure messages name it); None for none.
        log_interval_seconds: the least time between two log records of training
            lines, in seconds.

    Returns:
        The ``TrainReport`` of a run that exited 0 and wrote its declared outputs.

    Raises:
        TrainingError: launch refused, non-zero exit, process lost, pod unreachable,
            declared outputs missing.
        BudgetExceededError: runtime cap or ``should_stop``.
        ConsoleConnectError: the console could not be opened.
    """
    from prefect.logging import get_run_logger

    command = command.replace("{python}", python)
    with borrowed_console(handle, private_key, console, reconnect) as live:
        out = _TrainOutputs(
            get_run_logger(), handle.pod_id, command, on_progress, should_stop, local_log_path,
            log_interval_seconds,
        )  # fmt: skip
        try:
            report = _launch_and_follow(
                live, out, run_dir, _tools_dir(handle, tools_dir), command, python=python,
                cwd=cwd, max_runtime_seconds=max_runtime_seconds, heartbeat_path=heartbeat_path,
                poll_interval_seconds=poll_interval_seconds, kill_grace_seconds=kill_grace_seconds,
                expected_outputs=expected_outputs or {}, connect=console is None,
                secret_env=secret_env, reconnect_budget_seconds=reconnect.budget_seconds
                if reconnect else DEFAULT_RECONNECT_BUDGET_SECONDS,
            )  # fmt: skip
        except (TrainingError, BudgetExceededError) as exc:
            out.publish_metrics(getattr(exc, "report", None))
            raise
        finally:
            out.close()
    out.finished(report)
    return report
