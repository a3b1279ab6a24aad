"""PodConsole: run commands on a pod through a PTY-only SSH gateway (docs/architecture.md#the-console).

RunPod's proxied gateway (``ssh.runpod.io``) offers an interactive PTY shell and
nothing else: no exec channel, no SFTP. This module drives that shell the way the
field guide's ``run_remote(pod, key, commands, per_command_timeout) -> (output,
exit_code)`` wrapper does, on paramiko's ``invoke_shell(term="xterm")``, and makes it
exact:

- The session turns tty echo, shell history and line editing off and sets ``PS1`` to
  a per-session sentinel ``__PRX_<nonce>:<$?>``. Every command is typed as one line,
  and the prompt bash prints when it is done carries its exit code, so no second
  line is typed that a stdin-reading command could swallow. The sentinel is typed in
  quoted pieces, so no echoed text ever contains it; the pod's own (coloured) prompt
  is never matched.
- Output is read while input is written (a PTY deadlocks if a client only writes),
  cleaned by ``terminal_text`` (escapes, ``\\r`` redraws, cursor queries answered) and
  streamed line by line.
- A line typed into a tty in canonical mode is cut at 4096 bytes (observed: the real
  cause of the field guide's truncated heredoc). A long or multi-line command is sent
  as base64 pieces appended to a temporary file, checked by sha256 and then sourced.
- A command past its deadline gets Ctrl-C and ``CommandTimeoutError``.
- Secrets are read with ``read -rs`` from typed input, never from a command line, and
  are masked (``***``) in every output, transcript and error.
- ``open_stream`` gives a command the raw tty (``stty raw -echo``) for byte-exact,
  fast transfers (``PtyStream``).
"""

from __future__ import annotations

import re
import secrets as _secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import paramiko
from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.console.channel import ChannelIO, PtyStream
from prefect_runpod.blocks.console.shell_lines import (
    MAX_LINE_BYTES,
    PROMPT_TAG,
    READY_TAG,
    SYNC_TAG,
    needs_staging,
    session_setup_line,
    short,
    staging_lines,
    stream_line,
    sync_line,
    tail,
)
from prefect_runpod.blocks.console.ssh import exec_command, open_ssh_client
from prefect_runpod.blocks.console.terminal_text import TerminalDecoder, clean_output, redact
from prefect_runpod.blocks.exceptions import (
    CommandTimeoutError,
    ConsoleConnectError,
    ConsoleError,
    SpecError,
)
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint

__all__ = ["CommandResult", "PodConsole", "PtyStream", "run_remote"]

_STAGE_STEP_TIMEOUT_SECONDS = 30.0
_INTERRUPT_GRACE_SECONDS = 10.0
_SECRET_TIMEOUT_SECONDS = 30.0
_TERMINAL_WIDTH = 250
_TERMINAL_HEIGHT = 50
_TRANSCRIPT_MAX_CHARS = 4_000_000
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_BAD_RE = re.compile(r"[\x00-\x1f\x7f]")


class CommandResult(BaseModel):
    """One console command's result.

    Attributes:
        command: the command as typed (secrets masked).
        output: what it printed (stdout and stderr merged by the tty), cleaned, lines
            joined by ``\\n``, secrets masked.
        exit_code: its exit status (``$?``); 130 after Ctrl-C.
        seconds: wall time from typing it to its prompt.
    """

    command: str
    output: str
    exit_code: int
    seconds: float


class PodConsole:
    """An interactive PTY shell on a pod, driven like a person at a terminal.

    Args:
        endpoint: where to connect; ``endpoint.host_key`` (one OpenSSH line) is pinned
            when set, otherwise the key seen is accepted and reported (trust on first use).
        private_key: the client's private key (OpenSSH/PEM text).
        pod_id: named in error messages.
        connect_timeout_seconds: TCP, SSH handshake, auth and first-prompt deadline.
        window_bytes: the SSH channel window (large windows keep bulk reads fast).
        secrets: values masked (``***``) everywhere output leaves the console.
        on_host_key: called with the server's host-key line when none was pinned.

    Example:
        ```python
        with PodConsole.for_pod(handle, key) as console:
            result = console.run("nvidia-smi -L", timeout_seconds=30, check=True)
        ```
    """

    def __init__(
        self,
        endpoint: SSHEndpoint,
        private_key: SecretStr,
        *,
        pod_id: str | None = None,
        connect_timeout_seconds: float = 30.0,
        window_bytes: int = 8 * 1024 * 1024,
        secrets: Sequence[SecretStr] = (),
        on_host_key: Callable[[str], None] | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._private_key = private_key
        self._pod_id = pod_id
        self._connect_timeout_seconds = connect_timeout_seconds
        self._window_bytes = window_bytes
        self._secret_values = [s.get_secret_value() for s in secrets if s.get_secret_value()]
        self._secret_env: dict[str, SecretStr] = {}
        self._on_host_key = on_host_key
        self._pinned_host_key = endpoint.host_key
        self._client: paramiko.SSHClient | None = None
        self._io: ChannelIO | None = None
        self._opened_once = False  # the first command opens the session by itself
        self._reopen_after_drop = False  # a dropped session reopens on the next command
        self._decoder = TerminalDecoder()
        self._lines: deque[str] = deque()  # finished lines not yet consumed
        self._prompt_re = re.compile("")
        self._nonce = ""
        self._staged = 0
        self._needs_resync = False
        self._stream: PtyStream | None = None
        self._transcript: list[str] = []
        self._transcript_chars = 0

    @classmethod
    def for_pod(cls, handle: PodHandle, private_key: SecretStr, **kw: object) -> PodConsole:
        """A console for ``handle.ssh`` (the gateway endpoint), naming the pod in errors.

        Raises:
            ConsoleConnectError: when the handle has no SSH endpoint yet.
        """
        if handle.ssh is None:
            raise ConsoleConnectError(
                f"pod {handle.pod_id} has no SSH endpoint yet; wait for it to be ready "
                "(provider wait_ready) before opening a console",
                pod_id=handle.pod_id,
            )
        kw.setdefault("pod_id", handle.pod_id)
        return cls(handle.ssh, private_key, **kw)  # type: ignore[arg-type]

    # -- session ---------------------------------------------------------------------

    @property
    def host_key(self) -> str | None:
        """The server's host key (OpenSSH line): pinned, or recorded on first use."""
        return self._pinned_host_key

    @property
    def transcript(self) -> str:
        """Everything seen in this console, cleaned and with secrets masked: typed
        commands as ``$ <command>``, their output, ``[exit N]``."""
        return "\n".join(self._transcript)

    def connect(self) -> None:
        """Open the SSH session and the PTY shell, and set the shell up.

        Raises:
            ConsoleConnectError: connection refused or timed out, host key not the
                pinned one, key refused, PTY shell refused, or no prompt in time.
        """
        if self._io is not None:
            return
        deadline = time.monotonic() + self._connect_timeout_seconds
        client = open_ssh_client(
            self._endpoint,
            self._private_key,
            pinned_host_key=self._pinned_host_key,
            on_new_host_key=self._record_host_key,
            timeout_seconds=self._connect_timeout_seconds,
            where=self._where(),
            pod_id=self._pod_id,
        )
        try:
            transport = client.get_transport()
            assert transport is not None
            transport.set_keepalive(15)
            channel = transport.open_session(
                window_size=self._window_bytes, timeout=self._connect_timeout_seconds
            )
            channel.get_pty(term="xterm", width=_TERMINAL_WIDTH, height=_TERMINAL_HEIGHT)
            channel.invoke_shell()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise ConsoleConnectError(
                f"{self._where()}: the PTY shell was refused ({exc}); check the pod is running "
                f"and try `{self._endpoint.ssh_command()}` by hand",
                pod_id=self._pod_id,
            ) from exc
        self._client = client
        self._io = ChannelIO(channel, self._dropped)
        self._opened_once = True
        self._decoder = TerminalDecoder()
        self._lines.clear()
        self._stream = None
        self._nonce = _secrets.token_hex(8)
        self._prompt_re = re.compile(re.escape(PROMPT_TAG + self._nonce) + r":(\d+)")
        try:
            self._start_shell(deadline)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the shell and the SSH connection (idempotent)."""
        io, client = self._io, self._client
        self._io, self._client, self._stream = None, None, None
        self._reopen_after_drop = False
        if io is not None:
            io.close()
        if client is not None:
            client.close()

    def reconnect(self) -> None:
        """Open a fresh session (after a drop) and export again every variable given
        to ``set_secret_env``. Commands that were running are not re-run.

        Raises:
            ConsoleConnectError: as ``connect``.
        """
        self.close()
        self.connect()
        for name, value in self._secret_env.items():
            self._apply_secret(name, value.get_secret_value())

    def __enter__(self) -> PodConsole:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------

    def run(
        self,
        command: str,
        *,
        timeout_seconds: float = 60.0,
        on_line: Callable[[str], None] | None = None,
        check: bool = False,
    ) -> CommandResult:
        """Run one shell command and wait for its prompt.

        Args:
            command: any bash text, of any length, single- or multi-line. It runs in the
                session's shell, so ``cd`` and ``export`` persist.
            timeout_seconds: the deadline; past it Ctrl-C is sent.
            on_line: called with each finished output line (secrets masked) as it arrives.
            check: raise ``ConsoleError`` when the exit code is not 0.

        Returns:
            A ``CommandResult``.

        Raises:
            CommandTimeoutError: the deadline passed (carries the output so far).
            ConsoleError: ``check`` and a non-zero exit code (message has the last lines).
            ConsoleConnectError: the channel or connection dropped; call ``reconnect()``.
        """
        started = time.monotonic()
        self._ready()
        shown = self._redact(command)
        self._record(f"$ {shown}")
        line = self._stage(command) if needs_staging(command) else command
        self._type_line(line)
        code, lines = self._read_to_prompt(started + timeout_seconds, on_line, echo_of=line)
        if code is None:
            code, more = self._interrupt(on_line)
            lines += more
            output = "\n".join(lines)
            raise CommandTimeoutError(
                f"{self._where()}: `{short(shown)}` passed its {timeout_seconds:g} s deadline; "
                f"Ctrl-C sent ({'prompt back' if code is not None else 'no prompt yet'}). "
                f"Last output:\n{tail(output)}\nNext: raise the timeout or run it detached "
                "(nohup/setsid) and poll its log",
                command=shown,
                output=output,
                timeout_seconds=timeout_seconds,
                pod_id=self._pod_id,
            )
        self._record(f"[exit {code}]")
        result = CommandResult(
            command=shown,
            output="\n".join(lines),
            exit_code=code,
            seconds=time.monotonic() - started,
        )
        if check and code != 0:
            raise ConsoleError(
                f"{self._where()}: `{short(shown)}` exited with code {code}. Last output:\n"
                f"{tail(result.output)}\nNext: fix the command or the pod's environment "
                "and run it again",
                pod_id=self._pod_id,
            )
        return result

    def run_many(
        self, commands: Sequence[str], per_command_timeout: float = 60.0
    ) -> tuple[str, int]:
        """Run commands in order, stopping at the first non-zero exit code.

        Returns:
            ``(output, exit_code)``: the outputs joined by ``\\n`` and the exit code of
            the last command run (0 when ``commands`` is empty), as the field guide's
            ``run_remote`` contract.

        Raises:
            CommandTimeoutError, ConsoleConnectError: as ``run``.
        """
        outputs: list[str] = []
        code = 0
        for command in commands:
            result = self.run(command, timeout_seconds=per_command_timeout)
            if result.output:
                outputs.append(result.output)
            code = result.exit_code
            if code != 0:
                break
        return "\n".join(outputs), code

    def set_secret_env(self, name: str, value: SecretStr) -> None:
        """Export ``name=value`` in the pod's shell without the value ever being part
        of a command line: ``read -rs NAME`` reads it from typed input (echo off), then
        ``export NAME``. The value never reaches the transcript, shell history or any
        process's argv, and is masked from now on. ``reconnect()`` sets it again.

        Raises:
            SpecError: ``name`` is not a shell identifier, or the value has line breaks
                or control characters, or is longer than 3000 bytes.
            ConsoleError: the shell did not take it.
        """
        raw = value.get_secret_value()
        if not _NAME_RE.match(name):
            raise SpecError(f"{name!r} is not a shell variable name (letters, digits, _)")
        if _SECRET_BAD_RE.search(raw) or len(raw.encode()) > MAX_LINE_BYTES:
            raise SpecError(
                f"the value for {name} has line breaks or control characters or is longer "
                f"than {MAX_LINE_BYTES} bytes; pass such data as a file instead"
            )
        if raw and raw not in self._secret_values:
            self._secret_values.append(raw)
        self._secret_env[name] = value
        self._ready()
        self._apply_secret(name, raw)

    def open_stream(self, command: str, *, raw: bool = True) -> PtyStream:
        """Start ``command`` with the tty to itself, for byte streams (file transfer).

        With ``raw`` (default) the tty is put in raw mode first (``stty raw -echo
        -iexten``): bytes pass both ways unchanged, with no line-length limit and no
        signal keys; the tty is restored (``stty sane -echo``) when the command exits.
        Until ``finish()`` the console runs nothing else.

        Raises:
            ConsoleError: a stream is already open.
            ConsoleConnectError: as ``run``.
        """
        self._ready()
        shown = self._redact(command)
        self._record(f"$ [stream] {shown}")
        body = self._stage(command) if needs_staging(command) else command
        # Input may be sent only once the tty is raw (random bytes in canonical mode
        # would be line-edited, or end the shell with a Ctrl-D), so the line prints a
        # ready marker just before the command starts.
        self._type_line(stream_line(body, self._nonce, raw=raw))
        rest = self._await_ready((READY_TAG + self._nonce).encode(), shown)
        assert self._io is not None
        marker = (PROMPT_TAG + self._nonce).encode()
        self._stream = PtyStream(self._io, marker, self._end_stream, pod_id=self._pod_id)
        if rest:
            self._stream._feed(rest)
        return self._stream

    def exec_command(self, command: str, *, timeout_seconds: float = 60.0) -> CommandResult:
        """Run ``command`` on an SSH exec channel instead of the PTY shell (a direct-mode
        pod's full sshd: no tty, so no echo, line limit or escape codes to undo). It
        runs in a fresh non-interactive shell, not the console's.

        Returns:
            A ``CommandResult``; ``output`` is stdout then stderr, cleaned and masked.

        Raises:
            ExecRefusedError: a PTY-only gateway (RunPod's ``ssh.runpod.io``) refused it;
                use ``run`` instead.
            CommandTimeoutError: no exit status within ``timeout_seconds``.
            ConsoleConnectError: not connected, or the connection dropped.
        """
        if self._client is None:
            raise ConsoleConnectError(
                f"{self._where()}: the console is not connected; call connect()",
                pod_id=self._pod_id,
            )
        started = time.monotonic()
        shown = self._redact(command)
        self._record(f"$ [exec] {shown}")
        out, err, code = exec_command(
            self._client,
            command,
            timeout_seconds=timeout_seconds,
            where=self._where(),
            pod_id=self._pod_id,
        )
        text = "\n".join(t for t in (clean_output(out), clean_output(err)) if t)
        output = self._redact(text)
        for line in output.splitlines():
            self._record(line)
        self._record(f"[exit {code}]")
        return CommandResult(
            command=shown, output=output, exit_code=code, seconds=time.monotonic() - started
        )

    def _await_ready(self, ready: bytes, shown: str) -> bytes:
        """Read raw bytes up to the stream's ready marker; return what follows it.

        Raises:
            ConsoleError: the shell printed its prompt instead (the line did not run).
        """
        assert self._io is not None
        raw = bytearray()
        deadline = time.monotonic() + _STAGE_STEP_TIMEOUT_SECONDS
        prompt = (PROMPT_TAG + self._nonce).encode()
        while True:
            idx = raw.find(ready)
            end = raw.find(b"\n", idx) if idx >= 0 else -1
            if end >= 0:
                self._lines.clear()
                self._decoder = TerminalDecoder()
                return bytes(raw[end + 1 :])
            if idx < 0 and prompt in raw:
                self._feed(bytes(raw))
                code, lines = self._read_to_prompt(time.monotonic(), None)
                raise ConsoleError(
                    f"{self._where()}: the stream command `{short(shown)}` did not start "
                    f"(exit {code}): {tail(chr(10).join(lines))}",
                    pod_id=self._pod_id,
                )
            if time.monotonic() > deadline:
                self._needs_resync = True
                raise ConsoleError(
                    f"{self._where()}: the stream command `{short(shown)}` did not start "
                    f"within {_STAGE_STEP_TIMEOUT_SECONDS:g} s; the console will resync",
                    pod_id=self._pod_id,
                )
            raw += self._io.recv(0.5)

    # -- internals -------------------------------------------------------------------

    def _record_host_key(self, seen: str) -> None:
        """Trust on first use: pin the key seen for reconnects and report it."""
        self._pinned_host_key = seen
        if self._on_host_key is not None:
            self._on_host_key(seen)

    def _start_shell(self, deadline: float) -> None:
        """Set the shell up and sync on the first sentinel prompt; what came before
        (banner, the pod's coloured prompt) goes to the transcript only."""
        self._type_line(session_setup_line(self._nonce))
        code, _lines = self._read_to_prompt(deadline, None)
        if code is None:
            raise ConsoleConnectError(
                f"{self._where()}: the shell gave no prompt within "
                f"{self._connect_timeout_seconds:g} s after login; open it by hand "
                f"(`{self._endpoint.ssh_command()}`) to see what it prints",
                pod_id=self._pod_id,
            )

    def _ready(self) -> None:
        if self._io is None and (not self._opened_once or self._reopen_after_drop):
            # A fresh console connects on first use. After a drop, the command in flight
            # raised ConsoleConnectError (it may or may not have run); the next command
            # opens a fresh session (secrets exported again) instead of failing too.
            if self._reopen_after_drop:
                self.reconnect()
            else:
                self.connect()
        if self._io is None:
            raise ConsoleConnectError(
                f"{self._where()}: the console is not connected; call connect() or reconnect()",
                pod_id=self._pod_id,
            )
        if self._stream is not None:
            raise ConsoleError(
                f"{self._where()}: a stream is open; call its finish() first",
                pod_id=self._pod_id,
            )
        if self._needs_resync:
            self._resync()

    def _type_line(self, line: str) -> None:
        """Type one line; a leading Ctrl-U clears anything left in the tty's line buffer
        (e.g. a cursor-position answer nobody read)."""
        assert self._io is not None
        self._io.send(b"\x15" + line.encode() + b"\n", self._feed)

    def _feed(self, data: bytes) -> None:
        self._lines.extend(self._decoder.feed(data))
        for _ in range(self._decoder.take_cursor_queries()):
            assert self._io is not None
            reply = f"\x1b[{_TERMINAL_HEIGHT};{self._decoder.column + 1}R".encode()
            self._io.send(reply, self._feed)

    def _read_to_prompt(
        self,
        deadline: float,
        on_line: Callable[[str], None] | None,
        *,
        echo_of: str | None = None,
    ) -> tuple[int | None, list[str]]:
        """Collect output lines until the sentinel prompt; ``(None, lines)`` at the deadline."""
        assert self._io is not None
        out: list[str] = []
        while True:
            while self._lines:
                line = self._lines.popleft()
                match = self._prompt_re.search(line)
                text = line[: match.start()] if match else line
                if echo_of is not None:
                    if text == echo_of and match is None:
                        echo_of = None
                        continue  # an echo of the typed line (echo turned back on)
                    echo_of = None
                if match is None or text:
                    shown = self._redact(text)
                    out.append(shown)
                    self._record(shown)
                    if on_line is not None:
                        try:
                            on_line(shown)
                        except BaseException:
                            self._needs_resync = True  # the command's prompt is still due
                            raise
                if match is not None:
                    return int(match.group(1)), out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, out
            self._feed(self._io.recv(min(remaining, 0.5)))

    def _interrupt(self, on_line: Callable[[str], None] | None) -> tuple[int | None, list[str]]:
        """Send Ctrl-C and wait for the prompt; if it does not come, resync before the
        next command."""
        assert self._io is not None
        self._io.send(b"\x03", self._feed)
        code, lines = self._read_to_prompt(time.monotonic() + _INTERRUPT_GRACE_SECONDS, on_line)
        while lines and not lines[-1]:
            lines.pop()  # bash prints a line break after an interrupted job
        self._record(f"[timeout; Ctrl-C; exit {code}]")
        if code is None:
            self._needs_resync = True
        return code, lines

    def _resync(self) -> None:
        """Get back to a known prompt: Ctrl-C, sane tty, a fresh sync marker.

        Raises:
            ConsoleConnectError: the shell does not answer; call ``reconnect()``.
        """
        assert self._io is not None
        token = _secrets.token_hex(6)
        self._io.send(b"\x03", self._feed)
        self._type_line(sync_line(token))
        deadline = time.monotonic() + _INTERRUPT_GRACE_SECONDS
        seen = False
        while time.monotonic() < deadline:
            code, lines = self._read_to_prompt(deadline, None)
            seen = seen or any(f"{SYNC_TAG}{token}" in line for line in lines)
            if code is not None and seen:
                self._needs_resync = False
                return
        raise ConsoleConnectError(
            f"{self._where()}: the shell does not answer after Ctrl-C; call reconnect() "
            "(the pod keeps running)",
            pod_id=self._pod_id,
        )

    def _checked(self, line: str, what: str) -> None:
        """Type an internal line and require exit code 0 (secrets never in ``line``)."""
        self._type_line(line)
        deadline = time.monotonic() + _STAGE_STEP_TIMEOUT_SECONDS
        code, lines = self._read_to_prompt(deadline, None)
        if code != 0:
            if code is None:
                self._interrupt(None)
            raise ConsoleError(
                f"{self._where()}: {what} failed (exit {code}): {tail(chr(10).join(lines))}. "
                "Next: check the pod's /tmp is writable and has space, then retry",
                pod_id=self._pod_id,
            )

    def _stage(self, command: str) -> str:
        """Send a long or multi-line command as a verified temporary file; return the
        short line that sources it and removes it, keeping its exit code."""
        self._staged += 1
        setup, run_line = staging_lines(command, f"/tmp/.prx_{self._nonce}_{self._staged}")
        for line in setup:
            self._checked(line, "sending the command through a temporary file")
        return run_line

    def _apply_secret(self, name: str, raw: str) -> None:
        assert self._io is not None
        self._record(f"$ set_secret_env {name}")
        self._checked("stty -echo", "turning echo off")
        self._type_line(f"IFS= read -rs {name} && export {name}")
        self._io.send(raw.encode() + b"\n", self._feed)
        code, lines = self._read_to_prompt(time.monotonic() + _SECRET_TIMEOUT_SECONDS, None)
        if code != 0:
            if code is None:
                self._interrupt(None)
            raise ConsoleError(
                f"{self._where()}: setting {name} failed (exit {code}): "
                f"{tail(chr(10).join(lines))}. Next: reconnect() and try again",
                pod_id=self._pod_id,
            )

    def _end_stream(self, rest: bytes, exit_code: int | None) -> None:
        """Called by the stream when it is done: bytes after its sentinel go back to
        the line model, which starts afresh (raw bytes may have left it mid-sequence)."""
        self._stream = None
        self._decoder = TerminalDecoder()
        self._lines.clear()
        if exit_code is None:
            self._needs_resync = True
        else:
            self._record(f"[exit {exit_code}]")
        if rest:
            self._feed(rest)

    def _dropped(self, exc: BaseException | None) -> ConsoleConnectError:
        self.close()
        self._reopen_after_drop = True
        reason = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        return ConsoleConnectError(
            f"{self._where()}: the SSH session dropped{reason}; call reconnect() and re-run "
            "the command if it is safe to repeat (detached jobs keep running)",
            pod_id=self._pod_id,
        )

    def _where(self) -> str:
        ep = self._endpoint
        pod = f"pod {self._pod_id}" if self._pod_id else "pod"
        return f"{pod} ({ep.user}@{ep.host}:{ep.port})"

    def _redact(self, text: str) -> str:
        return redact(text, self._secret_values) if self._secret_values else text

    def _record(self, line: str) -> None:
        self._transcript.append(line)
        self._transcript_chars += len(line) + 1
        while self._transcript_chars > _TRANSCRIPT_MAX_CHARS and len(self._transcript) > 1:
            self._transcript_chars -= len(self._transcript.pop(0)) + 1


def run_remote(
    pod: PodHandle,
    key: SecretStr | Path,
    commands: Sequence[str],
    per_command_timeout: float = 60.0,
) -> tuple[str, int]:
    """The field guide's contract: run ``commands`` in one PTY session on ``pod``,
    stopping at the first failure.

    Args:
        pod: the pod; its ``ssh`` endpoint is used, host key pinned when recorded.
        key: the private key text, or a path to the key file.
        commands: shell commands, run in order in the same shell.
        per_command_timeout: seconds per command.

    Returns:
        ``(output, exit_code)`` as ``PodConsole.run_many``.

    Raises:
        SpecError: the key file cannot be read.
        ConsoleConnectError, CommandTimeoutError: as ``PodConsole.run``.
    """
    if isinstance(key, Path):
        try:
            key = SecretStr(key.read_text())
        except OSError as exc:
            raise SpecError(f"the SSH key file {key} cannot be read ({exc.strerror})") from exc
    with PodConsole.for_pod(pod, key) as console:
        return console.run_many(commands, per_command_timeout)
