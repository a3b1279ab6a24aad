"""The OpenSSH client's login to a pod's direct-TCP sshd, as the rsync method runs it
(docs/architecture.md#transfers-and-integrity).

``ssh_login`` writes the run's key to a 0600 file and the pod's pinned host key to a
known_hosts file of its own, in a private temporary folder removed (with both) when the
block ends; nothing of the user's ssh setup is read (``-F /dev/null``).

A login can open its connection ahead of the command that needs it
(``OpenSshLogin.start_master``: OpenSSH's own connection sharing, ``ControlMaster``), so
that the TCP connect, key exchange and authentication — several round trips, about
0.2 s on loopback and more across a WAN — run while the caller is still hashing the
local tree. A command that asks for the line later shares that connection once it is
up; a master that failed, or did not come up in time, is dropped and the command logs
in on its own, so sharing never changes what succeeds or what an error says.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import SSHEndpoint

__all__ = ["CIPHERS", "MASTER_READY_SECONDS", "OpenSshLogin", "ssh_login"]

CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-gcm@openssh.com,aes128-ctr"
"""Preferred in this order: AES-GCM is one pass where the CPU has AES instructions."""
MASTER_READY_SECONDS = 20.0
"""How long a command waits for a shared connection still logging in (also the master's
``ConnectTimeout``) before it logs in on its own."""
_MASTER_STOP_SECONDS = 5.0
_POLL_SECONDS = 0.005
# A unix socket's path holds 104-108 bytes: past this (a deep TMPDIR) a master could not
# listen, so none is started.
_MAX_SOCKET_PATH_BYTES = 100


class OpenSshLogin:
    """The ssh command line for one endpoint, and optionally a shared connection.

    Attributes:
        command: the ``ssh`` command as one string (``rsync -e``), logging in by itself.
        folder: the private folder (0700) holding the key, known_hosts and the
            connection's socket; the caller may keep its own scratch files there.
    """

    def __init__(self, command: str, folder: Path, target: str) -> None:
        self.command = command
        self.folder = folder
        self._target = target
        self._socket = folder / "cm"
        self._master: subprocess.Popen[bytes] | None = None

    def start_master(self) -> None:
        """Start logging in now, in the background (``ssh -M -N``), for later commands to
        share (``command_line``). Does nothing when the socket's path would be too long
        (a deep ``TMPDIR``) or a master already runs."""
        if self._master is not None or len(os.fsencode(self._socket)) > _MAX_SOCKET_PATH_BYTES:
            return
        argv = [*shlex.split(self.command), "-M", "-N", "-S", str(self._socket)]
        argv += ["-o", "ControlPersist=no", "-o", f"ConnectTimeout={MASTER_READY_SECONDS:g}"]
        self._master = subprocess.Popen(
            [*argv, self._target],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # a failed master is replaced, and that login reports
        )

    def command_line(self, wait_seconds: float = MASTER_READY_SECONDS) -> str:
        """The ssh command for the next command: over the shared connection when the
        master is logged in (waiting up to ``wait_seconds`` for one still logging in),
        else ``command`` (no master, or it exited or was too slow: it is stopped)."""
        master = self._master
        if master is None:
            return self.command
        deadline = time.monotonic() + wait_seconds
        while not self._socket.exists():  # ssh makes the socket once logged in
            if master.poll() is not None or time.monotonic() >= deadline:
                self.stop_master()
                return self.command
            time.sleep(_POLL_SECONDS)
        return f"{self.command} " + shlex.join(["-S", str(self._socket), "-o", "ControlMaster=no"])

    def stop_master(self) -> None:
        """Close the shared connection (idempotent): after a drop, the next command logs
        in afresh instead of waiting on a connection that may be dead."""
        master, self._master = self._master, None
        if master is None:
            return
        if master.poll() is None:
            master.terminate()
            try:
                master.wait(timeout=_MASTER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
        with contextlib.suppress(FileNotFoundError):
            self._socket.unlink()


@contextlib.contextmanager
def ssh_login(
    endpoint: SSHEndpoint, private_key: SecretStr, ssh_exe: str = "ssh"
) -> Iterator[OpenSshLogin]:
    """The OpenSSH client's login to ``endpoint``, valid inside the block.

    The key is written to a 0600 file and the pinned host key (``endpoint.host_key``)
    to a known_hosts file, in a private temporary folder that is removed, with both,
    when the block ends (a shared connection is closed first). The command reads no ssh
    config (``-F /dev/null``), offers only that key, never prompts, keeps the link alive
    and prefers AES-GCM.

    Yields:
        An ``OpenSshLogin`` (``command``, ``folder``; ``start_master`` to connect early).
    """
    folder = Path(tempfile.mkdtemp(prefix="prefect-runpod-ssh-"))
    login: OpenSshLogin | None = None
    try:
        key = folder / "key"
        text = private_key.get_secret_value()
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
        known = folder / "known_hosts"
        name = endpoint.host if endpoint.port == 22 else f"[{endpoint.host}]:{endpoint.port}"
        known.write_text(f"{name} {endpoint.host_key.strip()}\n" if endpoint.host_key else "")
        strict = "yes" if endpoint.host_key else "accept-new"
        argv = [ssh_exe, "-F", "/dev/null", "-i", str(key), "-p", str(endpoint.port)]
        for option in (
            "IdentitiesOnly=yes",
            "BatchMode=yes",
            f"UserKnownHostsFile={known}",
            "GlobalKnownHostsFile=/dev/null",
            f"StrictHostKeyChecking={strict}",
            "LogLevel=ERROR",
            "ServerAliveInterval=15",
            "ServerAliveCountMax=4",
            "Compression=no",
            f"Ciphers={CIPHERS}",
        ):
            argv += ["-o", option]
        login = OpenSshLogin(shlex.join(argv), folder, f"{endpoint.user}@{endpoint.host}")
        yield login
    finally:
        if login is not None:
            login.stop_master()
        shutil.rmtree(folder, ignore_errors=True)
