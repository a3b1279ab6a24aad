"""The session behind a ``PodConsole``: the SSH connection and its PTY shell
(docs/architecture.md#the-console).

``ConsoleConnection`` opens the connection with host-key checking (pinned, or trust on
first use), asks for the PTY and sets the shell up (``shell.ShellSession``); it keeps
the shell ready for the next command — opened on first use, reopened after a drop with
every secret exported again, resynced after a timeout, set up again after a drift —
and keeps the transcript, with secrets masked. ``PodConsole``
(:mod:`prefect_runpod.blocks.console.session`) adds the commands on top.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

import paramiko
from pydantic import SecretStr

from prefect_runpod.blocks.console.channel import ChannelIO, PtyStream
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.console.shell import (
    TERMINAL_HEIGHT,
    TERMINAL_WIDTH,
    ShellSession,
    log,
)
from prefect_runpod.blocks.console.shell_lines import tail
from prefect_runpod.blocks.console.ssh import open_ssh_client
from prefect_runpod.blocks.exceptions import ConsoleConnectError, ConsoleError
from prefect_runpod.blocks.pod_handle import SSHEndpoint
from prefect_runpod.blocks.secret_mask import redact, register

__all__ = ["STAGE_STEP_TIMEOUT_SECONDS", "ConsoleConnection"]

STAGE_STEP_TIMEOUT_SECONDS = 30.0
"""The deadline of one internal step (a staging line, a stream's start), in seconds."""
_SECRET_TIMEOUT_SECONDS = 30.0
_TRANSCRIPT_MAX_CHARS = 4_000_000


class ConsoleConnection:
    """The SSH connection and PTY shell of one console, kept ready for the next command
    (arguments as ``PodConsole``)."""

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

    @property
    def host_key(self) -> str | None:
        """The server's host key (OpenSSH line): pinned, or recorded on first use."""
        return self._pinned_host_key

    @property
    def transcript(self) -> str:
        """Everything seen in this console, cleaned and with secrets masked: typed
        commands as ``$ <command>``, their output, ``[exit N]``."""
        return "\n".join(self._transcript)

    def connect(self, *, spent_seconds: float = 0.0) -> None:
        """Open the SSH session and the PTY shell, and set the shell up; with a
        reconnect policy, refusals and timeouts are waited out (backoff, the provider
        asked before each retry) for up to its budget less ``spent_seconds`` (an outage
        a caller has waited out already), each attempt bounded by what is left of it.

        Raises:
            ConsoleConnectError: connection refused or timed out (past the budget), host
                key not the pinned one, key refused, PTY shell refused, or the shell
                never held the setup (the message says what the login scripts did).
            PodGoneError: (with a policy) the provider says the pod no longer lives.
        """
        if self._io is not None:
            return
        policy = self.reconnect_policy
        if policy is None:
            self._open()
            return
        started = policy.clock() - max(0.0, spent_seconds)

        def attempt() -> None:  # never longer than what is left of the budget
            self._open(min(self._connect_timeout_seconds, policy.left(started)))

        policy.call(attempt, pod_id=self._pod_id, what=f"SSH at {self._where()}", since=started)

    def _open(self, timeout_seconds: float | None = None) -> None:
        """One attempt at ``connect``, each step within ``timeout_seconds`` (default the
        console's connect timeout)."""
        timeout = timeout_seconds or self._connect_timeout_seconds
        deadline = time.monotonic() + timeout
        client = open_ssh_client(
            self._endpoint,
            self._private_key,
            pinned_host_key=self._pinned_host_key,
            on_new_host_key=self._record_host_key,
            timeout_seconds=timeout,
            where=self._where(),
            pod_id=self._pod_id,
        )
        try:
            transport = client.get_transport()
            assert transport is not None
            transport.set_keepalive(15)
            channel = transport.open_session(window_size=self._window_bytes, timeout=timeout)
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

    def reconnect(self, *, spent_seconds: float = 0.0) -> None:
        """Open a fresh session (after a drop) and export again every variable given
        to ``set_secret_env``. Commands that were running are not re-run.
        ``spent_seconds``: how much of the reconnect budget the outage has used already
        (a caller that waited since its first failure): the wait gets only the rest.

        Raises:
            ConsoleConnectError, PodGoneError: as ``connect``.
        """
        self.close()
        self.connect(spent_seconds=spent_seconds)
        assert self._shell is not None
        for name, value in self._secret_env.items():
            self._apply_secret(self._shell, name, value.get_secret_value())

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
        deadline = time.monotonic() + STAGE_STEP_TIMEOUT_SECONDS
        code, lines = shell.read_command(seq, deadline, None, shown=command)
        if code != 0:
            if code is None:
                shell.interrupt()
            raise ConsoleError(
                f"{self._where()}: {what} failed (exit {code}): {tail(chr(10).join(lines))}. "
                "Next: check the pod's /tmp is writable and has space, then retry",
                pod_id=self._pod_id,
            )

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
