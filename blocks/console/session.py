"""PodConsole: run commands on a pod through a PTY-only SSH gateway (docs/architecture.md#the-console).

RunPod's proxied gateway (``ssh.runpod.io``) offers an interactive PTY shell and
nothing else: no exec channel, no SFTP. This module drives that shell the way the
field guide's ``run_remote(pod, key, commands, per_command_timeout) -> (output,
exit_code)`` wrapper does, on paramiko's ``invoke_shell(term="xterm")``, and makes it
exact:

- Every command is typed as one framed line (``shell_lines.command_line``): its output
  is what the shell prints between a start and an end marker carrying a per-session
  nonce, and the end marker carries its exit code. The markers are typed in quoted
  pieces, so no echoed text ever contains them; the pod's own prompt, banners and
  rc output are never mistaken for output.
- The console owns its session (``shell.ShellSession``): the setup is verified after
  login and typed again when login scripts swallowed it; a command that changes the
  prompt, line editing, shell options or the tty, or ``exec``-s another shell, leaves
  the next command exact.
- Output is read while input is written (a PTY deadlocks if a client only writes),
  cleaned by ``terminal_text`` (escapes, ``\\r`` redraws, cursor queries answered) and
  streamed line by line.
- A line typed into a tty in canonical mode is cut at 4096 bytes (observed: the real
  cause of the field guide's truncated heredoc). A long or multi-line command is sent
  as base64 pieces appended to a temporary file, checked by sha256 and then sourced.
- A command past its deadline gets Ctrl-C and ``CommandTimeoutError``; a shell that
  then stays silent is replaced by a fresh session before the next command.
- Secrets are read with ``read -r`` from typed input (echo off), never from a command
  line, and are masked (``***``) in every output, transcript and error.
- ``open_stream`` gives a command the raw tty (``stty raw -echo``) for byte-exact,
  fast transfers (``PtyStream``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import paramiko
from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.console.channel import ChannelIO, PtyStream
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.console.shell import (
    TERMINAL_HEIGHT,
    TERMINAL_WIDTH,
    ShellSession,
    log,
)
from prefect_runpod.blocks.console.shell_lines import (
    END_TAG,
    MAX_LINE_BYTES,
    READY_TAG,
    marker,
    needs_staging,
    short,
    staging_lines,
    stream_line,
    tail,
)
from prefect_runpod.blocks.console.ssh import exec_command, open_ssh_client
from prefect_runpod.blocks.console.terminal_text import clean_output
from prefect_runpod.blocks.exceptions import (
    CommandTimeoutError,
    ConsoleConnectError,
    ConsoleError,
    SpecError,
)
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.secret_mask import redact, register

__all__ = ["CommandResult", "PodConsole", "PtyStream", "run_remote"]

_STAGE_STEP_TIMEOUT_SECONDS = 30.0
_SECRET_TIMEOUT_SECONDS = 30.0
_TRANSCRIPT_MAX_CHARS = 4_000_000
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_BAD_RE = re.compile(r"[\x00-\x1f\x7f]")


class CommandResult(BaseModel):
    """One console command's result.

    Attributes:
        command: the command as typed (secrets masked).
        output: what it printed (stdout and stderr merged by the tty), cleaned, lines
            joined by ``\\n``, secrets masked.
        exit_code: its exit status (``$?``); 0 for an ``exec`` that replaced the shell.
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
        reconnect: how to wait when the pod's SSH refuses or drops connections
            (``ReconnectPolicy``: one budget, backoff, the provider asked before each
            retry); None: one attempt, as before a pod is ready.

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
        reconnect: ReconnectPolicy | None = None,
    ) -> None:
        self._endpoint = endpoint
        self.reconnect_policy = reconnect
        self._private_key = private_key
        self._pod_id = pod_id
        self._connect_timeout_seconds = connect_timeout_seconds
        self._window_bytes = window_bytes
        for secret in secrets:  # masked from now on, here and everywhere (secret_mask)
            register(secret)
        self._secret_env: dict[str, SecretStr] = {}
        self._on_host_key = on_host_key
        self._pinned_host_key = endpoint.host_key
        self._client: paramiko.SSHClient | None = None
        self._io: ChannelIO | None = None
        self._shell: ShellSession | None = None
        self._opened_once = False  # the first command opens the session by itself
        self._reopen_after_drop = False  # a dropped session reopens on the next command
        self._staged = 0
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
        """Open the SSH session and the PTY shell, and set the shell up; with a
        reconnect policy, refusals and timeouts are waited out (backoff, the provider
        asked before each retry) for up to its budget.

        Raises:
            ConsoleConnectError: connection refused or timed out (past the budget), host
                key not the pinned one, key refused, PTY shell refused, or the shell
                never held the setup (the message says what the login scripts did).
            PodGoneError: (with a policy) the provider says the pod no longer lives.
        """
        if self._io is not None:
            return
        if self.reconnect_policy is None:
            self._open()
        else:
            self.reconnect_policy.call(
                self._open, pod_id=self._pod_id, what=f"SSH at {self._where()}"
            )

    def _open(self) -> None:
        """One attempt at ``connect``."""
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
            channel.get_pty(term="xterm", width=TERMINAL_WIDTH, height=TERMINAL_HEIGHT)
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
        self._stream = None
        self._shell = ShellSession(
            self._io,
            where=self._where(),
            pod_id=self._pod_id,
            record=self._record,
            redact=self._redact,
        )
        try:
            self._shell.establish(deadline)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the shell and the SSH connection (idempotent)."""
        io, client = self._io, self._client
        self._io, self._client, self._stream, self._shell = None, None, None, None
        self._reopen_after_drop = False
        if io is not None:
            io.close()
        if client is not None:
            client.close()

    def reconnect(self) -> None:
        """Open a fresh session (after a drop) and export again every variable given
        to ``set_secret_env``. Commands that were running are not re-run.

        Raises:
            ConsoleConnectError, PodGoneError: as ``connect``.
        """
        self.close()
        self.connect()
        assert self._shell is not None
        for name, value in self._secret_env.items():
            self._apply_secret(self._shell, name, value.get_secret_value())

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
        """Run one shell command and wait for its end.

        Args:
            command: any shell text, of any length, single- or multi-line. It runs in the
                session's shell, so ``cd`` and ``export`` persist; prompts, line editing,
                shell options and tty modes are put back after it (the console owns the
                session), and an ``exec`` of another shell is followed by setting the new
                one up.
            timeout_seconds: the deadline; past it Ctrl-C is sent.
            on_line: called with each finished output line (secrets masked) as it arrives.
            check: raise ``ConsoleError`` when the exit code is not 0.

        Returns:
            A ``CommandResult``.

        Raises:
            CommandTimeoutError: the deadline passed (carries the output so far).
            ConsoleError: ``check`` and a non-zero exit code (message has the last lines).
            ConsoleConnectError: the channel or connection dropped (the next command opens
                a fresh session by itself).
        """
        started = time.monotonic()
        shell = self._ready()
        shown = self._redact(command)
        self._record(f"$ {shown}")
        body = self._stage(command) if needs_staging(command) else command
        seq = shell.send_command(body)
        code, lines = shell.read_command(seq, started + timeout_seconds, on_line, shown=shown)
        if code is None:
            answered, more = shell.interrupt()
            self._record(f"[timeout; Ctrl-C; {'shell back' if answered else 'no answer yet'}]")
            lines += [line for line in more if line]
            output = "\n".join(lines)
            raise CommandTimeoutError(
                f"{self._where()}: `{short(shown)}` passed its {timeout_seconds:g} s deadline; "
                f"Ctrl-C sent ({'shell back' if answered else 'no answer yet'}). "
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
        register(raw)
        self._secret_env[name] = value
        self._apply_secret(self._ready(), name, raw)

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
        shell = self._ready()
        shown = self._redact(command)
        self._record(f"$ [stream] {shown}")
        body = self._stage(command) if needs_staging(command) else command
        # Input may be sent only once the tty is raw (random bytes in canonical mode
        # would be line-edited, or end the shell with a Ctrl-D), so the line prints a
        # ready marker just before the command starts.
        seq = shell.next_seq()
        early = bytearray()  # the command may answer while its line is still being sent
        shell.type_line(
            stream_line(body, shell.nonce, seq, raw=raw, shell=shell.shell), early.extend
        )
        end = marker(END_TAG, shell.nonce, seq).encode()
        rest = self._await_ready(
            shell, marker(READY_TAG, shell.nonce, seq).encode(), end, shown, early
        )
        assert self._io is not None
        self._stream = PtyStream(self._io, end, self._end_stream, pod_id=self._pod_id)
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
                f"{self._where()}: the console is not connected yet (open it first)",
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

    def _await_ready(
        self, shell: ShellSession, ready: bytes, end: bytes, shown: str, raw: bytearray
    ) -> bytes:
        """Read raw bytes (after ``raw``, what came while the line was typed) up to the
        stream's ready marker; return what follows it.

        Raises:
            ConsoleError: the stream's end marker came instead (the command did not
                start), or nothing came within 30 s (a resync is then due).
        """
        assert self._io is not None
        deadline = time.monotonic() + _STAGE_STEP_TIMEOUT_SECONDS
        ready_line = re.compile(re.escape(ready) + rb"\r*\n")
        while True:
            found = ready_line.search(raw)
            if found is not None:
                shell.restart_decoding()
                return bytes(raw[found.end() :])
            if re.search(re.escape(end) + rb":\d+\r*\n", raw):
                shell.restart_decoding()
                seen = clean_output(bytes(raw)).replace(shell.nonce, "…")
                raise ConsoleError(
                    f"{self._where()}: the stream command `{short(shown)}` did not start: "
                    f"{tail(seen)}",
                    pod_id=self._pod_id,
                )
            if time.monotonic() > deadline:
                shell.needs_resync = True
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

    def _ready(self) -> ShellSession:
        """The session's shell, ready for a command: opened on first use, reopened after
        a drop, resynced after a timeout (a fresh session when the shell stays silent),
        and set up again after a drift the last command left."""
        if self._io is None and (not self._opened_once or self._reopen_after_drop):
            # A fresh console connects on first use. After a drop, the command in flight
            # raised ConsoleConnectError (it may or may not have run); the next command
            # opens a fresh session (secrets exported again) instead of failing too.
            if self._reopen_after_drop:
                self.reconnect()
            else:
                self.connect()
        shell = self._shell
        if shell is None:
            raise ConsoleConnectError(
                f"{self._where()}: the console is not connected (closed, or the pod never "
                f"answered); open a new one, or check the pod with `{self._endpoint.ssh_command()}`",
                pod_id=self._pod_id,
                retryable=False,
            )
        if self._stream is not None:
            raise ConsoleError(
                f"{self._where()}: a stream is open; call its finish() first",
                pod_id=self._pod_id,
            )
        if shell.needs_resync and not shell.resync():
            log.warning(
                "%s: the shell did not answer Ctrl-C (a command still holds the tty); "
                "opening a fresh session",
                self._where(),
            )
            self.reconnect()
            shell = self._shell
            assert shell is not None
        if shell.needs_setup:
            reason, shell.needs_setup = shell.needs_setup, None
            shell.establish(time.monotonic() + self._connect_timeout_seconds, reason)
        return shell

    def _checked(self, shell: ShellSession, command: str, what: str) -> None:
        """Run an internal command and require exit code 0 (secrets never in it)."""
        seq = shell.send_command(command)
        deadline = time.monotonic() + _STAGE_STEP_TIMEOUT_SECONDS
        code, lines = shell.read_command(seq, deadline, None, shown=command)
        if code != 0:
            if code is None:
                shell.interrupt()
            raise ConsoleError(
                f"{self._where()}: {what} failed (exit {code}): {tail(chr(10).join(lines))}. "
                "Next: check the pod's /tmp is writable and has space, then retry",
                pod_id=self._pod_id,
            )

    def _stage(self, command: str) -> str:
        """Send a long or multi-line command as a verified temporary file; return the
        short command that sources it and removes it, keeping its exit code."""
        shell = self._shell
        assert shell is not None
        self._staged += 1
        setup, run_line = staging_lines(command, f"/tmp/.prx_{shell.nonce}_{self._staged}")
        for line in setup:
            self._checked(shell, line, "sending the command through a temporary file")
        return run_line

    def _apply_secret(self, shell: ShellSession, name: str, raw: str) -> None:
        assert self._io is not None
        self._record(f"$ set_secret_env {name}")
        # A sane tty with echo off: the value is read as one line and never shown.
        self._checked(shell, "stty sane -echo", "turning echo off")
        seq = shell.send_command(f"IFS= read -r {name} && export {name}")
        self._io.send(raw.encode() + b"\n", shell.feed)
        deadline = time.monotonic() + _SECRET_TIMEOUT_SECONDS
        code, lines = shell.read_command(seq, deadline, None, shown=f"read {name}")
        if code != 0:
            if code is None:
                shell.interrupt()
            raise ConsoleError(
                f"{self._where()}: setting {name} failed (exit {code}): "
                f"{tail(chr(10).join(lines))}. Next: try again in a fresh session",
                pod_id=self._pod_id,
            )

    def _end_stream(self, rest: bytes, exit_code: int | None) -> None:
        """Called by the stream when it is done: bytes after its end marker go back to
        the line model, which starts afresh (raw bytes may have left it mid-sequence)."""
        self._stream = None
        shell = self._shell
        if shell is None:
            return
        if exit_code is None:
            shell.needs_resync = True
        else:
            self._record(f"[exit {exit_code}]")
        shell.restart_decoding(rest)

    def _dropped(self, exc: BaseException | None) -> ConsoleConnectError:
        self.close()
        self._reopen_after_drop = True
        reason = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        return ConsoleConnectError(
            f"{self._where()}: the SSH session dropped{reason}; the next command opens a "
            "fresh session by itself: re-run this one if it is safe to repeat (detached "
            "jobs keep running)",
            pod_id=self._pod_id,
        )

    def _where(self) -> str:
        ep = self._endpoint
        pod = f"pod {self._pod_id}" if self._pod_id else "pod"
        return f"{pod} ({ep.user}@{ep.host}:{ep.port})"

    def _redact(self, text: str) -> str:
        return redact(text)

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
