"""The OpenSSH client's login to a pod's direct-TCP sshd, as the rsync method runs it
(docs/architecture.md#transfers-and-integrity).

``ssh_login`` writes the run's key to a 0600 file and the pod's pinned host key to a
known_hosts file of its own, in a private temporary folder removed (with both) when the
block ends; nothing of the user's ssh setup is read (``-F /dev/null``).

A login can open its connection ahead of the command that needs it
(``OpenSshLogin.start_master``: OpenSSH's own connection sharing, ``ControlMaster``), so
that the TCP connect, key exchange and authentication — several round trips, about
0.15 s on loopback and more across a WAN — run while the caller is still hashing the
local tree. The connection then stays open for the pod's next transfers in this process
(an upload, then downloads of checkpoints and results), which share it instead of
logging in again: one per endpoint, user, pinned host key and key, closed by OpenSSH
after ``MASTER_IDLE_SECONDS`` (or the caller's ``idle_seconds``) without a transfer, when the pod goes away (the keepalives
fail), after a dropped transfer (``stop_master``), or when this process exits. Only the
control socket outlives the block, in a private folder of this process; the key file
does not (the connection is already authenticated). A command that asks for the line
shares the connection once it is up; a master that failed, or did not come up in time,
is dropped and the command logs in on its own, so sharing never changes what succeeds
or what an error says.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import SSHEndpoint

__all__ = [
    "CIPHERS",
    "MASTER_IDLE_SECONDS",
    "MASTER_READY_SECONDS",
    "OpenSshLogin",
    "close_shared_connections",
    "ssh_login",
]

CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-gcm@openssh.com,aes128-ctr"
"""Preferred in this order: AES-GCM is one pass where the CPU has AES instructions."""
MASTER_READY_SECONDS = 20.0
"""How long a command waits for a shared connection still logging in (also the master's
``ConnectTimeout``) before it logs in on its own."""
MASTER_IDLE_SECONDS = 300
"""By default, a shared connection no transfer has used for this long is closed
(``ControlPersist``)."""
_MASTER_STOP_SECONDS = 5.0
_POLL_SECONDS = 0.005
# A unix socket's path holds 104-108 bytes: past this (a deep TMPDIR) a master could not
# listen, so none is started.
_MAX_SOCKET_PATH_BYTES = 100


@dataclass
class _Master:
    """One shared connection: its control socket, and the ssh that logs in (it leaves
    the connection to a background process of its own once logged in, and exits)."""

    socket: Path
    ssh_exe: str
    target: str
    login: subprocess.Popen[bytes] | None = None


class _Masters:
    """This process's shared connections, by login (a salted digest of the endpoint,
    user, host-key policy, pinned host key and key); their sockets live in one private
    folder, removed with them at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_login: dict[str, _Master] = {}
        self._folder: Path | None = None
        self._owner = os.getpid()  # the process that made the folder and the masters

    def socket_for(self, name: str) -> Path:
        if self._folder is None or not self._folder.is_dir():
            if self._folder is None:
                atexit.register(self.close_all)
            self._folder = Path(tempfile.mkdtemp(prefix="prefect-runpod-cm-"))
            self._owner = os.getpid()
        return self._folder / name

    def close(self, name: str) -> None:
        """Close one shared connection (idempotent)."""
        with self.lock:
            master = self.by_login.pop(name, None)
        if master is None:
            return
        login = master.login
        if login is not None and login.poll() is None:
            login.terminate()  # still logging in: nothing runs in the background yet
            try:
                login.wait(timeout=_MASTER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                login.kill()
                login.wait()
        if master.socket.exists():  # ask the master to end (``ssh -O exit``)
            ask = ["-F", "/dev/null", "-S", str(master.socket), "-O", "exit", master.target]
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [master.ssh_exe, *ask],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=_MASTER_STOP_SECONDS,
                )
        with contextlib.suppress(FileNotFoundError):
            master.socket.unlink()

    def close_all(self) -> None:
        """Close every shared connection and remove the sockets' folder (at exit). A
        forked child only forgets them: they are its parent's."""
        if self._owner != os.getpid():
            self.by_login.clear()
            return
        for name in list(self.by_login):
            self.close(name)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


_MASTERS = _Masters()
_SALT = os.urandom(16)


def close_shared_connections() -> None:
    """Close every connection this process keeps open for later logins (each pod's
    next transfer then logs in afresh); also done when the process exits."""
    _MASTERS.close_all()


def _answers(path: Path) -> bool:
    """Whether a master listens on the control socket ``path`` (a stale file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(os.fsdecode(path))
        except OSError:
            return False
    return True


class OpenSshLogin:
    """The ssh command line for one endpoint, and optionally a shared connection.

    Attributes:
        command: the ``ssh`` command as one string (``rsync -e``), logging in by itself.
        folder: the private folder (0700) holding the key and known_hosts; the caller
            may keep its own scratch files there.
    """

    def __init__(self, command: str, folder: Path, target: str, ssh_exe: str, name: str) -> None:
        self.command = command
        self.folder = folder
        self._target = target
        self._ssh_exe = ssh_exe
        self._name = name

    def start_master(self, idle_seconds: int = MASTER_IDLE_SECONDS) -> None:
        """Start logging in now, in the background (``ssh -M -N``), for later commands to
        share (``command_line``); OpenSSH closes the connection once it has not been used
        for ``idle_seconds`` (at least 1). Does nothing when a shared connection for
        this login is open or opening, or when the socket's path would be too long (a
        deep ``TMPDIR``)."""
        with _MASTERS.lock:
            master = _MASTERS.by_login.get(self._name)
            if master is not None:
                opening = master.login is not None and master.login.poll() is None
                if opening or _answers(master.socket):
                    return
            sock = _MASTERS.socket_for(self._name)
            if len(os.fsencode(sock)) > _MAX_SOCKET_PATH_BYTES:
                return
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()  # a master that died without removing it
            argv = [*shlex.split(self.command), "-M", "-N", "-S", str(sock)]
            argv += ["-o", f"ControlPersist={max(1, idle_seconds)}s"]
            argv += ["-o", f"ConnectTimeout={MASTER_READY_SECONDS:g}"]
            login = subprocess.Popen(
                [*argv, self._target],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # a failed master is replaced, and that login reports
                start_new_session=True,  # the background master ignores the caller's Ctrl-C
            )
            _MASTERS.by_login[self._name] = _Master(sock, self._ssh_exe, self._target, login)

    def command_line(self, wait_seconds: float = MASTER_READY_SECONDS) -> str:
        """The ssh command for the next command: over the shared connection when it is
        up (waiting up to ``wait_seconds`` for one still logging in), else ``command``
        (none, or it failed or was too slow: it is closed)."""
        master = _MASTERS.by_login.get(self._name)
        if master is None:
            return self.command
        deadline = time.monotonic() + wait_seconds
        while True:
            login = master.login
            done = login is None or login.poll() is not None
            # The login exits 0 once the connection runs in the background; a master
            # that ended since leaves no socket, or one that nobody answers.
            if done and (login is None or login.returncode == 0) and _answers(master.socket):
                break
            if done or time.monotonic() >= deadline:
                self.stop_master()
                return self.command
            time.sleep(_POLL_SECONDS)
        share = ["-S", str(master.socket), "-o", "ControlMaster=no"]
        return f"{self.command} " + shlex.join(share)

    def stop_master(self) -> None:
        """Close the shared connection (idempotent): after a drop, the next command logs
        in afresh instead of waiting on a connection that may be dead."""
        _MASTERS.close(self._name)


@contextlib.contextmanager
def ssh_login(
    endpoint: SSHEndpoint, private_key: SecretStr, ssh_exe: str = "ssh"
) -> Iterator[OpenSshLogin]:
    """The OpenSSH client's login to ``endpoint``, valid inside the block.

    The key is written to a 0600 file and the pinned host key (``endpoint.host_key``)
    to a known_hosts file, in a private temporary folder that is removed, with both,
    when the block ends (a shared connection stays open for the endpoint's next logins
    in this process, see the module's docstring). The command reads no ssh
    config (``-F /dev/null``), offers only that key, never prompts, keeps the link alive
    and prefers AES-GCM.

    Yields:
        An ``OpenSshLogin`` (``command``, ``folder``; ``start_master`` to connect early,
        the connection then shared with the endpoint's later logins in this process).
    """
    folder = Path(tempfile.mkdtemp(prefix="prefect-runpod-ssh-"))
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
        target = f"{endpoint.user}@{endpoint.host}"
        # The shared connection's name: a keyed digest (this process's salt) of what the
        # login reaches and with what; the key itself never leaves the 0600 file.
        same = "\0".join([target, str(endpoint.port), strict, endpoint.host_key or "", text])
        share = hashlib.blake2b(same.encode(), key=_SALT, digest_size=8).hexdigest()
        yield OpenSshLogin(shlex.join(argv), folder, target, ssh_exe, share)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
