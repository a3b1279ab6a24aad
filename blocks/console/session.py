"""PodConsole: run commands on a pod through a PTY-only SSH gateway (docs/architecture.md#the-console).

RunPod's proxied gateway (``ssh.runpod.io``) offers an interactive PTY shell and
nothing else: no exec channel, no SFTP. This module drives that shell on paramiko's
``invoke_shell(term="xterm")`` (``run_remote(pod, key, commands, per_command_timeout)
-> (output, exit_code)`` is the one-call form) and makes it exact:

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
- A line typed into a tty in canonical mode is cut at 4096 bytes (observed: a long
  heredoc typed whole arrives truncated). A long or multi-line command is sent
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

from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.console.channel import PtyStream
from prefect_runpod.blocks.console.connection import STAGE_STEP_TIMEOUT_SECONDS, ConsoleConnection
from prefect_runpod.blocks.console.shell import ShellSession
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
from prefect_runpod.blocks.console.ssh import exec_command
from prefect_runpod.blocks.console.terminal_text import clean_output
from prefect_runpod.blocks.exceptions import (
    CommandTimeoutError,
    ConsoleConnectError,
    ConsoleError,
    SpecError,
)
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.secret_mask import register

__all__ = ["CommandResult", "PodConsole", "PtyStream", "run_remote"]

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


class PodConsole(ConsoleConnection):
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
            timeout_seconds: the deadline; past it Ctrl-C is sent, and the shell's answer
                waited for as long again at most (10 s at most).
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
            # a quick command's Ctrl-C waits no longer than the command itself did
            answered, more = shell.interrupt(grace_seconds=timeout_seconds)
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
            the last command run (0 when ``commands`` is empty): the ``run_remote``
            contract.

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

    def set_secret_env(self, name: str, value: SecretStr, *, mask: bool = True) -> None:
        """Export ``name=value`` in the pod's shell without the value ever being part
        of a command line: ``read -rs NAME`` reads it from typed input (echo off), then
        ``export NAME``. The value never reaches the transcript, shell history or any
        process's argv, and (``mask``, the default) is masked from now on; a value that
        is kept off command lines but is not itself a secret (the Prefect API URL the
        pod reports to) passes ``mask=False``, so the errors that name it stay readable.
        ``reconnect()`` sets it again.

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
        if mask:
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
        deadline = time.monotonic() + STAGE_STEP_TIMEOUT_SECONDS
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
                    f"within {STAGE_STEP_TIMEOUT_SECONDS:g} s; the console will resync",
                    pod_id=self._pod_id,
                )
            raw += self._io.recv(0.5)

    # -- internals -------------------------------------------------------------------

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


def run_remote(
    pod: PodHandle,
    key: SecretStr | Path,
    commands: Sequence[str],
    per_command_timeout: float = 60.0,
) -> tuple[str, int]:
    """The console in one call: run ``commands`` in one PTY session on ``pod``,
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
