"""The pod's ``launcher.py``, driven through a console: start, read by offset, kill.

The byte offset advances only when a ``read`` answer arrived whole, so after an SSH
drop the follower reconnects and asks again from the same offset: no line lost, none
repeated (docs/architecture.md#the-training-run). Plain Python over a console, so the
``train`` task (``tasks/train.py``) and anything else that runs a detached job on a pod
(the cockpit's ``logs``, a worker) use it without importing a stage.
"""

from __future__ import annotations

import base64
import shlex
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect_runpod.blocks.console import ConsoleLike
from prefect_runpod.blocks.console.reconnect import DEFAULT_RECONNECT_BUDGET_SECONDS
from prefect_runpod.blocks.console.terminal_text import last_json_object, strip_ansi
from prefect_runpod.blocks.exceptions import ConsoleError, TrainingError
from prefect_runpod.blocks.pod_watch import watch_for

__all__ = [
    "LogChunk",
    "LogFollower",
    "kill_training",
    "launch_training",
    "sleep_in_steps",
]

_MAX_SLEEP_SECONDS = 1.0
_MAX_PENDING_BYTES = 1 << 20  # a "line" longer than this is emitted in pieces
_MAX_GARBLED_ANSWERS = 3


@dataclass(frozen=True)
class LogChunk:
    """One ``launcher.py read`` answer.

    Attributes:
        offset / next_offset: byte range of the log this answer covers.
        data: the log bytes (whole lines unless the process ended).
        running: the process (group) was alive when the pod looked.
        exit_code: the recorded exit code, None while running or when lost.
        state: ``absent``, ``running``, ``exited`` or ``lost``.
        log_bytes: the log's size when read.
    """

    offset: int
    next_offset: int
    data: bytes
    running: bool
    exit_code: int | None
    state: str
    log_bytes: int


def _json_answer(output: str, key: str) -> dict[str, Any] | None:
    """The last line of ``output`` that is a JSON object holding ``key``."""
    return last_json_object(output, lambda obj: key in obj)


def sleep_in_steps(seconds: float, sleep: Callable[[float], None]) -> None:
    """Sleep ``seconds`` in steps of at most 1 s, so signals are handled at once."""
    end = time.monotonic() + max(0.0, seconds)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        sleep(min(_MAX_SLEEP_SECONDS, left))


class LogFollower:
    """Follows ``<run_dir>/train.log`` on the pod through a console, by byte offset.

    Each complete line (ended by ``\\n`` or ``\\r\\n``) goes to ``on_line`` exactly once,
    ANSI escapes removed. ``\\r`` redraws (tqdm) go to ``on_text`` for progress parsing;
    of a burst of redraws only the last one still on screen reaches ``on_line``.
    Every segment (lines and redraws) goes to ``on_text``. The log's bytes as read, in
    order, each byte once (a copy that is the pod's log byte for byte), go to
    ``on_bytes``. Each read refreshes the heartbeat file (the dead-man switch's sign of
    life).

    Args:
        console: a ``PodConsole`` (or any ``ConsoleLike``: ``run`` and ``reconnect`` are used).
        run_dir: the pod-side run directory.
        tools_dir: the pod directory holding ``launcher.py``.
        python: the pod interpreter that runs ``launcher.py``.
        on_line / on_text: callbacks taking one ``str``.
        on_bytes: a callback taking the ``bytes`` of each read, undecoded.
        heartbeat_path: file whose mtime each read refreshes; default
            ``<run_dir>/heartbeat``; ``""`` for none.
        max_bytes: log bytes per read.
        command_timeout_seconds: deadline of one console command.
        reconnect_budget_seconds: how long to keep reconnecting after a drop before
            giving up with ``TrainingError`` (the run's one reconnect budget; the
            console's own policy waits out each refusal and asks the provider whether
            the pod still lives).
        tail_lines: how many last lines to keep for reports and errors.
        pod_id: named in error messages.
        sleep / clock: injectable for tests.
    """

    def __init__(
        self,
        console: ConsoleLike,
        run_dir: str,
        tools_dir: str,
        *,
        python: str = "python3",
        on_line: Callable[[str], None] | None = None,
        on_text: Callable[[str], None] | None = None,
        on_bytes: Callable[[bytes], None] | None = None,
        heartbeat_path: str | None = None,
        max_bytes: int = 65536,
        command_timeout_seconds: float = 60.0,
        reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS,
        tail_lines: int = 50,
        pod_id: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.run_dir = run_dir
        self.tools_dir = tools_dir.rstrip("/")
        self.python = python
        self.on_line = on_line
        self.on_text = on_text
        self.on_bytes = on_bytes
        self.heartbeat_path = f"{run_dir}/heartbeat" if heartbeat_path is None else heartbeat_path
        self.max_bytes = max_bytes
        self.command_timeout_seconds = command_timeout_seconds
        self.reconnect_budget_seconds = reconnect_budget_seconds
        self.pod_id = pod_id
        self.sleep = sleep
        self.clock = clock
        self.offset = 0
        self.reconnects = 0
        self.tail: deque[str] = deque(maxlen=max(1, tail_lines))
        self.in_command = False
        self._pending = b""

    # -- the console, with reconnects ------------------------------------------------
    def launcher_command(self, action: str, *args: str) -> str:
        """The shell command running ``launcher.py ACTION --run-dir RUN_DIR ARGS…``."""
        parts = [self.python, f"{self.tools_dir}/launcher.py", action, "--run-dir", self.run_dir]
        return " ".join(shlex.quote(p) for p in [*parts, *args])

    def call(self, command: str, key: str, timeout_seconds: float | None = None) -> dict[str, Any]:
        """Run ``command`` and return its JSON answer (the object holding ``key``).

        Reconnects after a ``ConsoleError`` (backoff up to 5 s) until
        ``reconnect_budget_seconds`` pass, counted from when the command that got no
        answer was sent (the command asks only for state, so asking again is safe); each
        command and each reconnect is bounded by what is left of that budget. When this process watches the pod's liveness
        (``pod_watch.watch_for``), the provider is asked first, after each failure and
        before each reconnect: a pod that is gone stops the wait at once, and one whose
        SSH stayed down for the whole budget while the provider says it runs is
        terminated and counted lost (``PodWatch.unreachable``).

        Raises:
            PodGoneError: the provider says the pod is gone (terminated outside, exited,
                host lost).
            TrainingError: the pod stayed unreachable (without a liveness watch), or
                ``launcher.py`` gave no JSON answer three times in a row.
        """
        first_failure: float | None = None
        garbled = 0
        delay = 0.5
        watch = watch_for(self.pod_id)
        budget = self.reconnect_budget_seconds
        while True:
            if watch is not None:
                watch.raise_if_lost()
            sent = self.clock()
            try:
                self.in_command = True
                result = self.console.run(
                    command, timeout_seconds=self._deadline(timeout_seconds, first_failure, sent)
                )
                self.in_command = False
            except ConsoleError as exc:
                self.in_command = False
                if watch is not None:
                    watch.check_now()  # a pod that is gone: no reconnect window at all
                now = self.clock()
                # the outage began when the command that got no answer was sent
                first_failure = sent if first_failure is None else first_failure
                if now - first_failure >= budget:
                    if watch is not None:
                        raise watch.unreachable(now - first_failure) from exc
                    raise TrainingError(
                        f"pod {self.pod_id}: the console stayed down for "
                        f"{now - first_failure:.0f} s ({exc}); training may still run on the "
                        "pod until its dead-man switch removes it; terminate the pod, or open "
                        f"a shell on it and read the log in {self.run_dir}",
                        pod_id=self.pod_id,
                        stage="train",
                    ) from exc
                sleep_in_steps(
                    min(delay, max(0.0, budget - (self.clock() - first_failure))), self.sleep
                )
                delay = min(5.0, delay * 2)
                try:  # the console's own wait counts from the same first failure
                    self.console.reconnect(spent_seconds=self.clock() - first_failure)
                    self.reconnects += 1
                except ConsoleError:
                    pass
                continue
            answer = _json_answer(getattr(result, "output", "") or "", key)
            if answer is not None:
                return answer
            garbled += 1
            if garbled >= _MAX_GARBLED_ANSWERS:
                output = (getattr(result, "output", "") or "")[-800:]
                raise TrainingError(
                    f"pod {self.pod_id}: launcher.py gave no answer to {command!r} (exit "
                    f"{getattr(result, 'exit_code', None)}): {output!r}; check that "
                    f"{self.tools_dir}/launcher.py exists and {self.python} runs it",
                    pod_id=self.pod_id,
                    stage="train",
                )

    def _deadline(self, asked: float | None, first_failure: float | None, now: float) -> float:
        """A command's deadline: the one asked for (a start, a kill), else the default
        command timeout, for a state query never more than half the reconnect budget (a
        frozen pod answers nothing: its silence, and the console's wait for the Ctrl-C
        after it, as long again at most, count against the budget); during an outage, at
        most half of what is left of the budget (at least 1 s)."""
        budget = self.reconnect_budget_seconds
        deadline = asked or min(self.command_timeout_seconds, max(1.0, budget / 2))
        if first_failure is None:
            return deadline
        return min(deadline, max(1.0, (budget - (now - first_failure)) / 2))

    # -- reading ---------------------------------------------------------------------
    def read_once(self) -> LogChunk:
        """One read from the current offset; emits what it got; advances the offset."""
        args = ["--offset", str(self.offset), "--max-bytes", str(self.max_bytes)]
        if self.heartbeat_path:
            args += ["--heartbeat", self.heartbeat_path]
        answer = self.call(self.launcher_command("read", *args), "next_offset")
        if int(answer["offset"]) != self.offset:
            raise TrainingError(
                f"pod {self.pod_id}: launcher.py answered for offset {answer['offset']}, "
                f"asked {self.offset}",
                pod_id=self.pod_id,
                stage="train",
            )
        data = base64.b64decode(answer.get("data_b64") or "")
        chunk = LogChunk(
            offset=self.offset,
            next_offset=int(answer["next_offset"]),
            data=data,
            running=bool(answer.get("running")),
            exit_code=answer.get("exit_code"),
            state=str(answer.get("state", "")),
            log_bytes=int(answer.get("log_bytes") or 0),
        )
        self.offset = chunk.next_offset
        if data and self.on_bytes is not None:
            self.on_bytes(data)
        final = not chunk.running and chunk.next_offset >= chunk.log_bytes
        self._feed(data, final=final)
        return chunk

    def drain(self) -> LogChunk:
        """Read until the offset reaches the log's end; return the last answer."""
        while True:
            chunk = self.read_once()
            if chunk.next_offset >= chunk.log_bytes or not chunk.data:
                return chunk

    def _emit(self, text: str) -> None:
        self.tail.append(text)
        if self.on_line is not None:
            self.on_line(text)

    def _feed(self, data: bytes, *, final: bool) -> None:
        """Split ``pending + data`` into segments; hold an unfinished last one."""
        buf = self._pending + data
        segments: list[tuple[str, bool]] = []  # (text, is_redraw)
        start = 0
        i = 0
        while i < len(buf):
            byte = buf[i]
            if byte == 0x0A:
                segments.append((buf[start:i].decode("utf-8", "replace"), False))
                start = i + 1
            elif byte == 0x0D:
                if i + 1 == len(buf) and not final:
                    break  # a lone trailing \r: wait to see whether \n follows
                crlf = i + 1 < len(buf) and buf[i + 1] == 0x0A
                segments.append((buf[start:i].decode("utf-8", "replace"), not crlf))
                i += 1 if crlf else 0
                start = i + 1
            i += 1
        self._pending = buf[start:]
        if (final and self._pending) or len(self._pending) > _MAX_PENDING_BYTES:
            segments.append((self._pending.decode("utf-8", "replace"), False))
            self._pending = b""
        for index, (raw, is_redraw) in enumerate(segments):
            text = strip_ansi(raw)
            if self.on_text is not None and (text or not is_redraw):
                self.on_text(text)
            if not is_redraw:
                self._emit(text)
            elif text.strip() and index + 1 == len(segments):
                self._emit(text)  # the redraw still on screen at the end of this read


def launch_training(
    console: ConsoleLike,
    run_dir: str,
    tools_dir: str,
    command: str,
    *,
    python: str = "python3",
    cwd: str | None = None,
    timeout_seconds: float = 60.0,
    pod_id: str | None = None,
    reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS,
) -> dict[str, Any]:
    """Start ``command`` detached on the pod through ``launcher.py start``.

    Args:
        console: the pod's console.
        run_dir: the pod-side run directory.
        tools_dir: the pod directory holding ``launcher.py``.
        command: one shell command line, run by ``/bin/sh -c`` in ``cwd``. No secrets:
            it is written to ``train.cmd``; secrets reach the job through the pod's env.
        python: the pod interpreter that runs ``launcher.py``.
        cwd: the working directory, default ``<run_dir>/bundle``.
        timeout_seconds: deadline of the start command.
        pod_id: named in error messages.
        reconnect_budget_seconds: as for ``LogFollower``.

    Returns:
        ``{"pid": …, "pgid": …, "supervisor_pid": …}`` as the pod reported it.

    Raises:
        TrainingError: the launcher refused (a run already going, no such cwd), or
            the pod could not be reached (see ``LogFollower.call``).
    """
    follower = LogFollower(
        console,
        run_dir,
        tools_dir,
        python=python,
        pod_id=pod_id,
        reconnect_budget_seconds=reconnect_budget_seconds,
    )
    workdir = cwd or f"{run_dir}/bundle"
    start = follower.launcher_command("start", "--cwd", workdir, "--", command)
    answer: dict[str, Any] | None
    try:
        output = console.run(start, timeout_seconds=timeout_seconds).output or ""
        answer = _json_answer(output, "pid") or _json_answer(output, "error")
    except ConsoleError:
        # The start may or may not have happened: look before starting again.
        state = follower.call(follower.launcher_command("status"), "state")
        if state["state"] == "absent":
            answer = follower.call(start, "pid", timeout_seconds)
        else:
            answer = {"pid": state.get("pid"), "pgid": state.get("pgid")}
    if not answer or answer.get("error") or not answer.get("pid"):
        detail = (answer or {}).get("error", "no answer from launcher.py")
        raise TrainingError(
            f"pod {pod_id}: could not start training in {run_dir}: {detail}; check that the "
            f"bundle is in {workdir} and that no other run is going there",
            pod_id=pod_id,
            stage="train",
        )
    return answer


def kill_training(
    console: ConsoleLike,
    run_dir: str,
    tools_dir: str,
    *,
    python: str = "python3",
    grace_seconds: float = 30.0,
    pod_id: str | None = None,
    reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS,
) -> dict[str, Any]:
    """SIGTERM the training's process group, SIGKILL it after ``grace_seconds``; an
    unreachable pod is retried for ``reconnect_budget_seconds`` (the run's budget).

    Returns:
        The pod's answer: ``state``, ``exit_code`` (143 after SIGTERM, 137 after
        SIGKILL unless the job chose its own), ``signals`` sent.

    Raises:
        TrainingError: the pod could not be reached (see ``LogFollower.call``).
    """
    follower = LogFollower(
        console,
        run_dir,
        tools_dir,
        python=python,
        pod_id=pod_id,
        reconnect_budget_seconds=reconnect_budget_seconds,
    )
    command = follower.launcher_command("kill", "--grace-seconds", f"{grace_seconds:g}")
    return follower.call(command, "state", grace_seconds + 30.0)
