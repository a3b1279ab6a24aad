"""Opening a paramiko SSH connection to a pod with its host key pinned, and running
one command on an exec channel where the server allows it.

Host keys (docs/architecture.md#the-console): a key recorded in the endpoint (one OpenSSH line) must match
the server's, else the connection is refused before authenticating; with none
recorded, the key seen is accepted and handed to the caller to record (trust on first
use). No SSH agent and no key files from ``~/.ssh`` are used: only the key given.

RunPod's proxied gateway refuses exec channels: a session without a PTY gets
``Error: Your SSH client doesn't support PTY`` (RunPod docs; vscode-remote-release
#10790). ``exec_command`` turns that, or a refused channel request, into
``ExecRefusedError`` so a caller can fall back to the PTY console.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Callable

import paramiko
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import (
    GATEWAY_PTY_ERROR,
    CommandTimeoutError,
    ConsoleConnectError,
    ExecRefusedError,
    SpecError,
)
from prefect_runpod.blocks.keys import load_private_key
from prefect_runpod.blocks.pod_handle import SSHEndpoint

__all__ = ["exec_command", "fingerprint", "host_key_line", "open_ssh_client"]

_PTY_REFUSAL = GATEWAY_PTY_ERROR.removeprefix("Error: ").encode()
"""The text RunPod's gateway answers an exec request with, matched without its
``Error: `` prefix so that the sentence alone is recognised too."""

_EXEC_READ_BYTES = 1 << 20


class _TransportAtDebug(logging.Filter):
    """paramiko's transport thread logs a failure it then hands to the caller (``Error
    reading SSH protocol banner``, a reset) at ERROR, its traceback as lines of text,
    which would reach the terminal; the console reports the same failure itself in one
    sentence. Such records are lowered to DEBUG: only a handler that asks for debug
    output (``--verbose`` logging) still shows them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


logging.getLogger("paramiko.transport").addFilter(_TransportAtDebug())


def host_key_line(key: paramiko.PKey) -> str:
    """A public key as one OpenSSH line without comment (``ssh-ed25519 AAAA…``)."""
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(line: str) -> str:
    """OpenSSH's fingerprint of a public-key line: ``ssh-ed25519 SHA256:…``."""
    try:
        kind, blob = line.split()[:2]
        digest = hashlib.sha256(base64.b64decode(blob)).digest()
    except ValueError:
        return "unreadable key"
    return f"{kind} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko when the server's key is not the recorded one (or none is)."""

    def __init__(
        self, pinned: str | None, on_new: Callable[[str], None], refuse: Callable[[str], Exception]
    ):
        self._pinned = pinned
        self._on_new = on_new
        self._refuse = refuse

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        seen = host_key_line(key)
        if self._pinned:
            raise self._refuse(seen)
        self._on_new(seen)


class _GcmFirstTransport(paramiko.Transport):
    """A paramiko transport that offers AES-GCM before AES-CTR + HMAC.

    Both are standard (RFC 5647 / OpenSSH); GCM authenticates and encrypts in one pass,
    which measured about 2.5x faster than CTR plus a separate HMAC in paramiko's packet
    loop. Servers without GCM still negotiate CTR.
    """

    _preferred_ciphers = tuple(
        sorted(paramiko.Transport._preferred_ciphers, key=lambda name: "-gcm@" not in name)
    )


def open_ssh_client(
    endpoint: SSHEndpoint,
    private_key: SecretStr,
    *,
    pinned_host_key: str | None,
    on_new_host_key: Callable[[str], None] = lambda line: None,
    timeout_seconds: float = 30.0,
    where: str = "pod",
    pod_id: str | None = None,
) -> paramiko.SSHClient:
    """Connect and authenticate with ``private_key``.

    Args:
        endpoint: host, port, user.
        private_key: the client key (OpenSSH/PEM text).
        pinned_host_key: the expected server key (OpenSSH line), or None to accept the
            key seen and pass it to ``on_new_host_key``.
        timeout_seconds: TCP connect, banner and auth deadline each.
        where: how messages name the pod (``pod abc (root@host:22)``).

    Returns:
        A connected ``paramiko.SSHClient`` (the caller closes it).

    Raises:
        SpecError: the pinned key or the private key cannot be read.
        ConsoleConnectError: refused, unreachable, timed out, host key changed, or the
            client key was refused.
    """
    pkey = load_private_key(private_key)
    client = paramiko.SSHClient()

    def refuse(seen: str) -> ConsoleConnectError:
        return ConsoleConnectError(
            f"{where}: the server's host key ({fingerprint(seen)}) is not the pinned one "
            f"({fingerprint(pinned_host_key or '')}); refusing to connect. If the pod was "
            "re-created on purpose, clear the recorded host key; otherwise do not connect",
            pod_id=pod_id,
            retryable=False,
        )

    if pinned_host_key:
        try:
            kind, blob = pinned_host_key.split()[:2]
            key = paramiko.PKey.from_type_string(kind, base64.b64decode(blob))
        except (ValueError, paramiko.SSHException) as exc:
            raise SpecError(
                f"{where}: the pinned host key is not an OpenSSH public-key line ({exc}); "
                "record it again"
            ) from exc
        known_name = endpoint.host if endpoint.port == 22 else f"[{endpoint.host}]:{endpoint.port}"
        # Also makes paramiko ask the server for this key type first.
        client.get_host_keys().add(known_name, kind, key)
    client.set_missing_host_key_policy(_HostKeyPolicy(pinned_host_key, on_new_host_key, refuse))
    try:
        client.connect(
            endpoint.host,
            port=endpoint.port,
            username=endpoint.user,
            pkey=pkey,
            timeout=timeout_seconds,
            banner_timeout=timeout_seconds,
            auth_timeout=timeout_seconds,
            allow_agent=False,
            look_for_keys=False,
            transport_factory=_GcmFirstTransport,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise refuse(host_key_line(exc.key)) from exc
    except ConsoleConnectError:
        client.close()
        raise
    except paramiko.AuthenticationException as exc:
        client.close()
        raise ConsoleConnectError(
            f"{where}: the SSH key was refused for user {endpoint.user!r}; add its public key "
            "to the pod (RunPod: account Settings → SSH public keys, or the PUBLIC_KEY env) "
            "and retry",
            pod_id=pod_id,
            retryable=False,
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        raise ConsoleConnectError(
            f"{where}: could not connect ({type(exc).__name__}: {exc}); check the pod is "
            "running and its SSH endpoint, then retry",
            pod_id=pod_id,
        ) from exc
    return client


def exec_command(
    client: paramiko.SSHClient,
    command: str,
    *,
    timeout_seconds: float = 60.0,
    where: str = "pod",
    pod_id: str | None = None,
) -> tuple[bytes, bytes, int]:
    """Run ``command`` on an exec channel (no PTY): a direct-mode pod's full sshd.

    Returns:
        ``(stdout, stderr, exit_code)``, bytes as sent.

    Raises:
        ExecRefusedError: the server refused the exec channel, or answered as RunPod's
            gateway does (``Error: Your SSH client doesn't support PTY``).
        CommandTimeoutError: no exit status within ``timeout_seconds`` (channel closed).
        ConsoleConnectError: the connection dropped.
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise ConsoleConnectError(f"{where}: not connected; reconnect first", pod_id=pod_id)
    refused = (
        f"{where}: the server refused a command without a PTY (a PTY-only gateway such as "
        "ssh.runpod.io); use the PTY console (PodConsole.run), or expose 22/tcp for "
        "direct SSH"
    )
    try:
        channel = transport.open_session(timeout=timeout_seconds)
        channel.exec_command(command)
    except paramiko.SSHException as exc:
        raise ExecRefusedError(f"{refused} ({exc})", pod_id=pod_id) from exc
    deadline = time.monotonic() + timeout_seconds
    out, err = bytearray(), bytearray()
    try:
        # Read to EOF, not merely to the exit status: OpenSSH may send exit-status
        # before the last of the child's output has left its pipe.
        while not (
            channel.exit_status_ready()
            and (channel.eof_received or channel.closed)
            and not channel.recv_ready()
            and not channel.recv_stderr_ready()
        ):
            if time.monotonic() > deadline:
                raise CommandTimeoutError(
                    f"{where}: `{command[:120]}` passed its {timeout_seconds:g} s deadline "
                    "(exec channel closed)",
                    command=command,
                    output=out.decode(errors="replace"),
                    timeout_seconds=timeout_seconds,
                    pod_id=pod_id,
                )
            if channel.recv_ready():
                out += channel.recv(_EXEC_READ_BYTES)
            elif channel.recv_stderr_ready():
                err += channel.recv_stderr(_EXEC_READ_BYTES)
            elif channel.closed and not channel.exit_status_ready():
                raise ConsoleConnectError(
                    f"{where}: the exec channel closed without an exit status; reconnect and retry",
                    pod_id=pod_id,
                )
            else:
                channel.status_event.wait(0.05)
        code = channel.recv_exit_status()
    finally:
        channel.close()
    if code != 0 and _PTY_REFUSAL in bytes(out + err):
        raise ExecRefusedError(refused, pod_id=pod_id)
    return bytes(out), bytes(err), code
