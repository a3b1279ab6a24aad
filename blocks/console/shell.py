"""The shell behind a ``PodConsole``: it frames commands, sets the shell up and keeps it
that way, and finds its way back after a timeout (docs/architecture.md#the-console).

The console owns its session. Login scripts print banners, ``cd``, activate conda,
set ``PROMPT_COMMAND``, ask the terminal where the cursor is and read the answer from
typed input; commands activate venvs, rewrite ``PS1``, switch line editing on, leave
the tty raw or ``exec`` another shell. None of that may change a command's output or
exit code, and none may make a healthy shell look dead:

- every command is framed by start and end markers (``shell_lines.command_line``), so
  prompts, banners and echoes around it are never output, whatever ``PS1`` is;
- after login the setup line's report is checked (echo off, history off, line editing
  off); when login scripts swallowed or undid it, it is typed again, and when it never
  holds, ``ConsoleConnectError`` names what the scripts did;
- after a command, a tty left raw (bare line ends) or with echo on (the typed frame
  came back) is set up again before the next command, and logged once;
- ``exec PROGRAM`` is announced by the console's DEBUG trap: the new shell is set up
  like a fresh login and the command reports exit code 0;
- a timeout sends Ctrl-C and a sync line; a shell that does not answer is resynced
  before the next command, and the console opens a fresh session itself when that
  fails (see ``PodConsole``).
"""

from __future__ import annotations

import logging
import secrets as _secrets
import time
from collections import deque
from collections.abc import Callable

from prefect_runpod.blocks.console.channel import ChannelIO
from prefect_runpod.blocks.console.shell_lines import (
    END_TAG,
    EXEC_TAG,
    LINE_CLEAR,
    START_TAG,
    SYNC_TAG,
    SetupReport,
    command_line,
    end_pattern,
    marker,
    parse_setup_report,
    session_setup_line,
    short,
    sync_line,
)
from prefect_runpod.blocks.console.terminal_text import TerminalDecoder
from prefect_runpod.blocks.exceptions import ConsoleConnectError

__all__ = ["ShellSession", "TERMINAL_HEIGHT", "TERMINAL_WIDTH", "log"]

log = logging.getLogger("prefect_runpod.console")

TERMINAL_WIDTH = 250
TERMINAL_HEIGHT = 50
_SETUP_ATTEMPT_SECONDS = 3.0
"""How long one setup line may go unanswered before it is typed again (a login script
may have read it as input, or bash is still starting on a busy machine)."""
_INTERRUPT_GRACE_SECONDS = 10.0
_NOISE_LINES = 12


class ShellSession:
    """One interactive shell on one PTY channel, framed and kept set up.

    Args:
        io: the channel (read while written).
        where: how messages name the pod (``pod abc (user@host:port)``).
        pod_id: named in errors.
        record: adds a line to the console's transcript.
        redact: masks secrets in text that leaves the console.
    """

    def __init__(
        self,
        io: ChannelIO,
        *,
        where: str,
        pod_id: str | None,
        record: Callable[[str], None],
        redact: Callable[[str], str],
    ) -> None:
        self.io = io
        self.nonce = _secrets.token_hex(8)
        self.shell = "bash"
        self.needs_setup: str | None = None  # why the shell must be set up again
        self.needs_resync = False  # a command's end marker is still due
        self.cursor_queries = 0
        self._where = where
        self._pod_id = pod_id
        self._record = record
        self._redact = redact
        self._seq = 0
        self._decoder = TerminalDecoder()
        self._lines: deque[str] = deque()
        self._bare_line_ends = 0
        self._bare_at_send = 0
        self._noise: deque[str] = deque(maxlen=_NOISE_LINES)

    # -- bytes -------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Decode arriving bytes into lines; answer cursor-position queries as a
        terminal would (``ESC[<row>;<col>R``)."""
        self._lines.extend(self._decoder.feed(data))
        self._bare_line_ends += self._decoder.take_bare_line_ends()
        for _ in range(self._decoder.take_cursor_queries()):
            self.cursor_queries += 1
            reply = f"\x1b[{TERMINAL_HEIGHT};{self._decoder.column + 1}R".encode()
            self.io.send(reply, self.feed)

    def restart_decoding(self, rest: bytes = b"") -> None:
        """Start the line model afresh (raw bytes may have left it mid-sequence)."""
        self._decoder = TerminalDecoder()
        self._lines.clear()
        if rest:
            self.feed(rest)

    def type_line(self, line: str, sink: Callable[[bytes], None] | None = None) -> None:
        """Type one line, after ``LINE_CLEAR`` (see ``shell_lines``). What arrives
        meanwhile goes to ``sink`` (default: the line model)."""
        self.io.send(LINE_CLEAR + line.encode() + b"\n", sink or self.feed)

    def next_seq(self) -> int:
        """A fresh command number for markers."""
        self._seq += 1
        return self._seq

    def _next_line(self, deadline: float) -> str | None:
        """The next finished output line, or None once ``deadline`` passes."""
        while not self._lines:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.feed(self.io.recv(min(remaining, 0.5)))
        return self._lines.popleft()

    def _aside(self, line: str) -> None:
        """A line that is no command's output (prompt, banner, echo): transcript only;
        echoes of the console's own typed lines are left out."""
        if self.nonce in line:
            return
        shown = self._redact(line)
        if shown.strip():
            self._noise.append(shown)
        self._record(shown)

    # -- setup -------------------------------------------------------------------------

    def establish(
        self, deadline: float, reason: str | None = None, *, end_seq: int | None = None
    ) -> tuple[SetupReport, int | None]:
        """Set the shell up (``shell_lines.session_setup_line``) and verify it; type the
        setup line again when it goes unanswered or does not hold.

        Args:
            deadline: ``time.monotonic()`` by which the setup must hold.
            reason: why (logged once with what was found); None for a first login,
                which is logged only when the setup had to be retried.
            end_seq: a command whose end marker may still arrive meanwhile (after an
                ``exec`` that failed); its exit code is returned.

        Returns:
            ``(report, exit code of end_seq or None)``.

        Raises:
            ConsoleConnectError: the setup never held; the message says what the login
                scripts did (cursor queries, what stayed wrong, their last output).
        """
        end_re = end_pattern(self.nonce, end_seq) if end_seq is not None else None
        end_code: int | None = None
        tokens: list[str] = []
        findings: list[str] = []
        queries_before = self.cursor_queries
        report: SetupReport | None = None
        while True:
            token = _secrets.token_hex(4)
            tokens.append(token)
            self.type_line(session_setup_line(self.nonce, token))
            wait_until = min(deadline, time.monotonic() + _SETUP_ATTEMPT_SECONDS)
            report = None
            while report is None:
                line = self._next_line(wait_until)
                if line is None:
                    break
                for known in tokens:
                    report = parse_setup_report(line, self.nonce, known)
                    if report is not None:
                        break
                if report is not None:
                    continue
                match = end_re.search(line) if end_re is not None else None
                if match is not None:
                    end_code = int(match.group(1))
                else:
                    self._aside(line)
            if report is not None and not report.problems:
                break
            findings.append(
                ", ".join(report.problems) + " after the setup line"
                if report is not None
                else f"no answer to the setup line within {_SETUP_ATTEMPT_SECONDS:g} s"
            )
            if time.monotonic() >= deadline:
                raise self._setup_failed(findings, self.cursor_queries - queries_before)
        self.shell = report.shell
        if reason is not None or findings:
            found = ", ".join(report.found) or "nothing amiss"
            retried = (
                f"; setup typed {len(tokens)} times ({'; '.join(findings)})" if findings else ""
            )
            # A login that needed the setup twice is how some images are (INFO); a shell
            # replaced or left disturbed by a command is worth a WARNING.
            log.log(
                logging.WARNING if reason is not None else logging.INFO,
                "%s: %s; set the %s shell up again (found: %s)%s",
                self._where,
                reason or "login scripts disturbed the console's setup",
                report.shell,
                found,
                retried,
            )
        return report, end_code

    def _setup_failed(self, findings: list[str], queries: int) -> ConsoleConnectError:
        what = []
        if queries:
            what.append(
                f"they asked for the cursor position {queries} time(s) (ESC[6n), "
                "reading the answer from typed input"
            )
        what.append("; ".join(dict.fromkeys(findings)))
        last = " | ".join(self._noise) or "(nothing)"
        return ConsoleConnectError(
            f"{self._where}: the shell never held the console's setup: {'; '.join(what)}. "
            f"Login output last seen: {last[-600:]}. Next: make the image's ~/.bashrc stop "
            "reading the terminal (or guard it with [ -t 0 ] checks), or use another image",
            pod_id=self._pod_id,
            retryable=False,
        )

    # -- commands ----------------------------------------------------------------------

    def send_command(self, body: str) -> int:
        """Type ``body`` framed as a new command; return its number for ``read_command``."""
        seq = self.next_seq()
        self._bare_at_send = self._bare_line_ends
        self.type_line(command_line(body, self.nonce, seq, self.shell))
        return seq

    def read_command(
        self,
        seq: int,
        deadline: float,
        on_line: Callable[[str], None] | None,
        *,
        shown: str,
    ) -> tuple[int | None, list[str]]:
        """Collect command ``seq``'s output up to its end marker.

        Returns:
            ``(exit code, output lines)``; the exit code is None when ``deadline``
            passed first. An ``exec`` that replaced the shell reports 0 (the new shell
            is set up before this returns).

        Raises:
            ConsoleConnectError: the new shell after an ``exec`` never held the setup.
            Whatever ``on_line`` raises (a resync is then due).
        """
        start = marker(START_TAG, self.nonce, seq)
        exec_mark = marker(EXEC_TAG, self.nonce, seq)
        end_re = end_pattern(self.nonce, seq)
        typed = f"{START_TAG} {self.nonce} {seq}"
        bare_before = self._bare_at_send
        echoed = False
        started = False
        out: list[str] = []
        while True:
            line = self._next_line(deadline)
            if line is None:
                return None, out
            if not started:
                if line.endswith(start):
                    started = True
                elif typed in line:
                    echoed = True  # the tty echoed the typed frame
                else:
                    self._aside(line)
                continue
            match = end_re.search(line)
            at_exec = len(line) - len(exec_mark) if line.endswith(exec_mark) else -1
            stop = at_exec if at_exec >= 0 else (match.start() if match else len(line))
            text = line[:stop]
            if (match is None and at_exec < 0) or text:
                self._emit(text, out, on_line)
            if at_exec >= 0:
                _, code = self.establish(
                    deadline + _INTERRUPT_GRACE_SECONDS,
                    f"`{short(shown)}` replaced the shell",
                    end_seq=seq,
                )
                return (0 if code is None else code), out
            if match is not None:
                if self._bare_line_ends > bare_before:
                    self.needs_setup = f"after `{short(shown)}` the tty was left raw"
                elif echoed:
                    self.needs_setup = f"after `{short(shown)}` the tty echoed typed input"
                return int(match.group(1)), out

    def _emit(self, text: str, out: list[str], on_line: Callable[[str], None] | None) -> None:
        shown = self._redact(text)
        out.append(shown)
        self._record(shown)
        if on_line is not None:
            try:
                on_line(shown)
            except BaseException:
                self.needs_resync = True  # the command's end marker is still due
                raise

    # -- getting back ------------------------------------------------------------------

    def interrupt(self, grace_seconds: float | None = None) -> tuple[bool, list[str]]:
        """Send Ctrl-C, then a sync line, and wait for its marker, for at most
        ``grace_seconds`` (never longer than the console's interrupt grace, 10 s).

        Returns:
            ``(answered, lines seen meanwhile)``; when the shell did not answer, a resync
            is due before the next command.
        """
        self.io.send(b"\x03", self.feed)
        answered, lines = self._sync(grace_seconds)
        self.needs_resync = not answered
        return answered, lines

    def resync(self) -> bool:
        """Get back to a known state before a command: Ctrl-C, a sane tty, a fresh sync
        marker. Returns whether the shell answered (False: it is stuck in something
        that ignores Ctrl-C and holds the tty)."""
        self.io.send(b"\x03", self.feed)
        answered, _ = self._sync()
        self.needs_resync = not answered
        return answered

    def _sync(self, grace_seconds: float | None = None) -> tuple[bool, list[str]]:
        token = _secrets.token_hex(6)
        self.type_line(sync_line(self.nonce, token))
        wanted = marker(SYNC_TAG, self.nonce, token)
        grace = _INTERRUPT_GRACE_SECONDS
        deadline = time.monotonic() + (
            grace if grace_seconds is None else min(grace, grace_seconds)
        )
        seen: list[str] = []
        while True:
            line = self._next_line(deadline)
            if line is None:
                return False, seen
            if line.endswith(wanted):
                return True, seen
            if END_TAG in line and self.nonce in line:
                continue  # a late end marker of the interrupted command
            if self.nonce not in line:
                seen.append(self._redact(line))
            self._aside(line)
