"""The local pod's daemon: one process per pod serving SSH on loopback (docs/architecture.md#pod-providers).

Run as ``python -m prefect_runpod.blocks.local_pod.daemon --home HOME --pod-id ID``
by ``LocalPodProvider.create``, in its own session, so that like a real pod it
outlives the process that made it. It reads ``pod.json`` from the pod directory,
listens with asyncssh on ``127.0.0.1`` (a free port, the pod's ed25519 host key,
public-key auth for the pod's user only), then writes the registry entry.

Sessions, as on RunPod (see the RunPod SSH docs, ``pods/configuration/use-ssh``):

* **gateway** mode, like ``ssh.runpod.io``: a PTY is required. A session without one
  gets ``Error: Your SSH client doesn't support PTY`` on stderr and exit status 1;
  no SFTP subsystem; a command sent with a PTY lands in the interactive shell as
  typed input.
* **direct** mode, like a pod's own sshd on an exposed 22/tcp: commands run with
  ``bash -c`` (with or without PTY) and SFTP is served.

A PTY session gets a real bash on a real kernel pseudo-terminal (canonical line
limit 4096 bytes, ``stty raw -echo`` works), bridged byte for byte to the channel —
unless the named fault point ``gateway_relay`` says ``cooked``
(``PREFECT_RUNPOD_FAULTS=gateway_relay:cooked`` in the environment that creates the
pod): then the bridge relays bytes the way a cooked terminal path in front of the pod
would (:class:`CookedRelay`), as a gateway that is not 8-bit clean might.
On SIGTERM the daemon ends the pod: it kills every process carrying
``RUNPOD_POD_ID=<pod_id>``, removes the pod directory and the registry entry, exits.
When ``pod.json`` holds ``terminate_after`` the daemon ends the pod by itself at that
moment: the local pod's lease, like RunPod's ``terminateAfter``, which covers a pod
whose flow died before its dead-man switch was armed. Before the directory goes, it
leaves a tombstone (``registry.write_tombstone``) saying when and how the pod ended
(``ending.json``, written by whoever asked: the ``runpodctl`` stand-in, the provider's
terminate), with the dead-man's recorded attempts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import struct
import sys
import termios
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncssh

from prefect_runpod.blocks.exceptions import GATEWAY_PTY_ERROR  # imports nothing: stays light
from prefect_runpod.blocks.faults import FAULTS_ENV, parse_faults  # stdlib only
from prefect_runpod.blocks.local_pod.registry import (
    ENDING_FILE,
    INIT_PID_VAR,
    MARKER_VAR,
    PodPaths,
    PodRecord,
    PodTombstone,
    kill_marked,
    read_deadman_attempts,
    remove_record,
    write_record,
    write_tombstone,
)

__all__ = ["CookedRelay", "PodConfig", "PublicKeyLogins", "build_pod_env", "main"]

_READ_CHUNK_BYTES = 65536
_BATCH_BYTES = 256 * 1024
_WINDOW_BYTES = 8 * 1024 * 1024  # per-channel receive window: uploads need a wide one
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HUP_GRACE_SECONDS = 2.0

log = logging.getLogger("local_pod_daemon")


@dataclass
class PodConfig:
    """What the provider asks of the daemon (``pod.json`` in the pod directory)."""

    pod_id: str
    name: str
    mode: str
    user: str
    pod_host_id: str
    host_key: str
    public_key: str
    cost_per_hr: float
    gpu_type: str
    created_at: str
    env: dict[str, str] = field(default_factory=dict)
    image: str = "plain"
    path_first: list[str] = field(default_factory=list)
    lifetime_seconds: float | None = None
    terminate_after: str | None = None

    @classmethod
    def load(cls, path: Path) -> PodConfig:
        """Read ``pod.json``."""
        return cls(**json.loads(path.read_text()))


def build_pod_env(
    config: PodConfig, paths: PodPaths, port: int, term: str | None, cwd: Path
) -> dict[str, str]:
    """The environment of a process started in the pod, built from scratch so nothing
    of the host's (virtualenv, tokens) leaks in.

    Mirrors RunPod's pod variables (``RUNPOD_POD_ID``, ``RUNPOD_POD_HOSTNAME``,
    ``RUNPOD_GPU_COUNT``, ``RUNPOD_CPU_COUNT``, ``PUBLIC_KEY``, ``PWD``; in direct mode
    also ``RUNPOD_PUBLIC_IP``/``RUNPOD_TCP_PORT_22``), then adds ``config.env``.
    ``RUNPOD_POD_ID`` is the marker terminate looks for, so it always wins.
    ``PIP_REQUIRE_VIRTUALENV=1`` keeps pip out of the host's base Python. The image
    profile's ``path_first`` folders come before the pod's own ``bin`` on ``PATH``.
    """
    env = {
        "HOME": str(paths.home),
        "USER": "root" if os.getuid() == 0 else os.environ.get("USER", "user"),
        "LOGNAME": "root" if os.getuid() == 0 else os.environ.get("LOGNAME", "user"),
        "SHELL": "/bin/bash",
        "PATH": ":".join([*config.path_first, str(paths.bin), _SYSTEM_PATH]),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PWD": str(cwd),
        "TERM": term or "dumb",
        "RUNPOD_POD_HOSTNAME": config.pod_host_id,
        "RUNPOD_GPU_COUNT": "0",
        "RUNPOD_CPU_COUNT": str(os.cpu_count() or 1),
        "PUBLIC_KEY": config.public_key,
        # The pod's python3 is the host's base interpreter: pip may install only into
        # a venv (the env stage makes a pod venv), never into the host's Python.
        "PIP_REQUIRE_VIRTUALENV": "1",
    }
    if config.mode == "direct":
        env["RUNPOD_PUBLIC_IP"] = "127.0.0.1"
        env["RUNPOD_TCP_PORT_22"] = str(port)
    env.update(config.env)
    env[MARKER_VAR] = config.pod_id
    # The daemon is the pod's PID 1: a dead-man's last resort stops every process of the
    # pod but this one, as on a container it spares PID 1.
    env[INIT_PID_VAR] = str(os.getpid())
    return env


class CookedRelay:
    """The bytes of a PTY session as a cooked terminal path between the client and the
    pod's tty relays them (the ``gateway_relay:cooked`` fault): on the way in, CR
    becomes LF (``ICRNL``), and NUL and the flow-control keys ^S/^Q vanish (``IXON``);
    on the way out, LF becomes CR LF (``ONLCR``). Text and base64 survive it; raw
    binary does not, which is what the ``pty`` transfer's probe must notice."""

    @staticmethod
    def inbound(data: bytes) -> bytes:
        """Client → pod."""
        return data.replace(b"\r", b"\n").translate(None, b"\x00\x11\x13")

    @staticmethod
    def outbound(data: bytes) -> bytes:
        """Pod → client."""
        return data.replace(b"\n", b"\r\n")


def _relay_fault() -> type[CookedRelay] | None:
    """The relay the ``gateway_relay`` fault point asks for, or None (byte for byte)."""
    actions = parse_faults(os.environ.get(FAULTS_ENV, ""), "gateway_relay")
    return CookedRelay if "cooked" in actions else None


# --- file-descriptor plumbing -------------------------------------------------------


async def _wait_fd(fd: int, *, writable: bool = False) -> None:
    """Wait until ``fd`` is readable (or writable)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if writable:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)


async def _read_fd(fd: int) -> bytes:
    """Read what ``fd`` has (up to ``_BATCH_BYTES``, so the channel gets few large
    packets rather than many 4 KiB ones); ``b""`` at end of file (EIO on a PTY
    master whose slave side is closed everywhere)."""
    while True:
        try:
            data = os.read(fd, _READ_CHUNK_BYTES)
        except BlockingIOError:
            await _wait_fd(fd)
            continue
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise
        if not data:
            return b""
        chunks, total = [data], len(data)
        while total < _BATCH_BYTES:
            try:
                more = os.read(fd, _READ_CHUNK_BYTES)
            except OSError:  # empty for now, or closed: the next call finds out
                break
            if not more:
                break
            chunks.append(more)
            total += len(more)
        return b"".join(chunks)


async def _write_fd(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking ``fd``, waiting while it is full."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await _wait_fd(fd, writable=True)


def _drain_now(fd: int) -> bytes:
    """What ``fd`` holds right now, without waiting."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK_BYTES)
        except OSError:  # EAGAIN (empty) or EIO (slave closed)
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_pid(pid: int) -> int:
    """Reap child ``pid``; return its exit status (128 + N when killed by signal N)."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return 255
            if done == pid:
                code = os.waitstatus_to_exitcode(status)
                return 128 - code if code < 0 else code
            if pidfd is not None:
                await _wait_fd(pidfd)
            else:
                await asyncio.sleep(0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _set_winsize(fd: int, size: tuple[int, int, int, int]) -> None:
    width, height, pixwidth, pixheight = size
    if width and height:
        packed = struct.pack("HHHH", height, width, pixwidth, pixheight)
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, packed)


def _signal_number(name: str) -> int | None:
    try:
        return int(getattr(signal, "SIG" + name.upper().removeprefix("SIG")))
    except (AttributeError, ValueError):
        return None


# --- sessions -----------------------------------------------------------------------


class _Session:
    """One SSH session (an asyncssh ``SSHServerProcess``) bridged to a pod process."""

    def __init__(self, daemon: PodDaemon, process: asyncssh.SSHServerProcess) -> None:
        self.daemon = daemon
        self.process = process
        self.pid: int | None = None
        self._fds: set[int] = set()
        self._relay = _relay_fault()

    def _close(self, fd: int) -> None:
        """Close ``fd`` once (a second close could hit a reused number)."""
        if fd in self._fds:
            self._fds.discard(fd)
            os.close(fd)

    async def run(self) -> None:
        process = self.process
        config = self.daemon.config
        pty_wanted = process.get_terminal_type() is not None
        try:
            if not pty_wanted and config.mode == "gateway":
                process.stderr.write((GATEWAY_PTY_ERROR + "\n").encode())
                process.exit(1)
                return
            if pty_wanted:
                status = await self._run_pty()
            else:
                status = await self._run_pipes()
            if status is not None:
                process.exit(status)
        except (asyncssh.Error, BrokenPipeError, ConnectionError) as exc:
            log.info("%s: session ended: %s", config.pod_id, exc)
        finally:
            self._hang_up()

    def _argv(self) -> tuple[list[str], bool]:
        """The program to run and whether the command must be typed into it."""
        command = self.process.command
        interactive = [
            "bash",
            "--noprofile",
            "--rcfile",
            str(self.daemon.paths.home / ".bashrc"),
            "-i",
        ]
        if command is None:
            if self.process.get_terminal_type() is None:
                return ["bash", "--noprofile", "--norc", "-s"], False
            return interactive, False
        if self.daemon.config.mode == "gateway":
            # RunPod's gateway: remote commands arrive in the shell as typed input.
            return interactive, True
        return ["bash", "-c", command], False

    def _env(self, term: str | None) -> dict[str, str]:
        paths = self.daemon.paths
        return build_pod_env(self.daemon.config, paths, self.daemon.port, term, paths.workspace)

    async def _run_pty(self) -> int | None:
        argv, type_command = self._argv()
        env = self._env(self.process.get_terminal_type())
        master, slave = os.openpty()
        self._fds.add(master)
        slave_name = os.ttyname(slave)
        os.close(slave)
        os.set_blocking(master, False)
        _set_winsize(master, self.process.term_size)
        try:
            self.pid = os.posix_spawn(
                self.daemon.bash,
                argv,
                env,
                setsid=True,  # new session: the tty opened next becomes its controlling tty
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, slave_name, os.O_RDWR, 0),
                    (os.POSIX_SPAWN_DUP2, 0, 1),
                    (os.POSIX_SPAWN_DUP2, 0, 2),
                ],
            )
            if type_command:
                await _write_fd(master, (self.process.command or "").encode() + b"\n")
            return await self._bridge(master, master, None)
        finally:
            self._close(master)

    async def _run_pipes(self) -> int | None:
        argv, _ = self._argv()
        env = self._env(None)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.pid = os.posix_spawn(
                self.daemon.bash,
                argv,
                env,
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, in_r, 0),
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ],
            )
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
            self._fds.add(fd)
        try:
            return await self._bridge(in_w, out_r, err_r)
        finally:
            for fd in (in_w, out_r, err_r):
                self._close(fd)

    async def _bridge(self, in_fd: int, out_fd: int, err_fd: int | None) -> int | None:
        """Pump channel→``in_fd`` and ``out_fd``/``err_fd``→channel until the process
        exits (PTY) or exits and closes its output (pipes, as sshd does). Returns the
        exit status, or None when the channel closed first."""
        assert self.pid is not None
        is_pty = err_fd is None
        pumps = [asyncio.create_task(self._pump_out(out_fd, self.process.stdout))]
        if err_fd is not None:
            pumps.append(asyncio.create_task(self._pump_out(err_fd, self.process.stderr)))
        feeder = asyncio.create_task(self._pump_in(in_fd, is_pty))
        exited = asyncio.create_task(_wait_pid(self.pid))
        closed = asyncio.create_task(self.process.channel.wait_closed())
        try:
            if is_pty:
                await asyncio.wait({exited, closed}, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    # Everything the shell wrote before exiting is in the master already.
                    for pump in pumps:
                        pump.cancel()
                    await asyncio.gather(*pumps, return_exceptions=True)
                    tail = _drain_now(out_fd)
                    if tail:
                        self.process.stdout.write(tail)
            else:
                waiting: set[asyncio.Task[Any]] = {exited, *pumps}
                while waiting and not closed.done():
                    done, _ = await asyncio.wait(
                        waiting | {closed}, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiting -= done
            if not exited.done():
                return None
            self.pid = None
            with contextlib.suppress(asyncssh.Error, BrokenPipeError, ConnectionError):
                await self.process.stdout.drain()
            return exited.result()
        finally:
            tasks = [*pumps, feeder, closed, exited]
            for task in tasks:
                task.cancel()
            # Let each task unregister its fd before the caller closes it.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _pump_out(self, fd: int, stream: asyncssh.SSHWriter) -> None:
        pty = self.process.get_terminal_type() is not None
        relay = self._relay if pty and stream is self.process.stdout else None
        while True:
            data = await _read_fd(fd)
            if not data:
                return
            stream.write(relay.outbound(data) if relay else data)
            await stream.drain()

    async def _pump_in(self, fd: int, is_pty: bool) -> None:
        stdin = self.process.stdin
        while True:
            try:
                data = await stdin.read(_READ_CHUNK_BYTES)
            except asyncssh.TerminalSizeChanged as exc:
                if is_pty:
                    _set_winsize(fd, (exc.width, exc.height, exc.pixwidth, exc.pixheight))
                continue
            except asyncssh.SignalReceived as exc:
                signum = _signal_number(exc.signal)
                if signum is not None and self.pid is not None:
                    with contextlib.suppress(OSError):
                        pgrp = os.tcgetpgrp(fd) if is_pty else self.pid
                        os.killpg(pgrp, signum)
                continue
            except asyncssh.BreakReceived:
                continue
            if not data:
                if not is_pty:
                    self._close(fd)  # the process sees end of input
                return
            if is_pty and self._relay is not None:
                data = self._relay.inbound(data)
            await _write_fd(fd, data)

    def _hang_up(self) -> None:
        """The channel is gone while the process runs: SIGHUP its session (sshd does
        the same), then make sure it is reaped."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGHUP)
        self.daemon.spawn_background(self._reap_later(pid))

    @staticmethod
    async def _reap_later(pid: int) -> None:
        try:
            await asyncio.wait_for(_wait_pid(pid), _HUP_GRACE_SECONDS)
        except TimeoutError:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            await _wait_pid(pid)


class PublicKeyLogins(asyncssh.SSHServer):
    """An asyncssh server that takes public-key logins only (no password, no keyboard
    interactive); ``validate_public_key`` says which. RunPod's gateway takes keys only."""

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True


class _PodSSHServer(PublicKeyLogins):
    """Public-key auth only, for the pod's user and its authorized keys."""

    def __init__(self, daemon: PodDaemon) -> None:
        self.daemon = daemon

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        ok = (
            username == self.daemon.config.user and key.public_data in self.daemon.authorized_keys()
        )
        if not ok:
            log.info("%s: refused key for user %r", self.daemon.config.pod_id, username)
        return ok


class PodDaemon:
    """Serves one pod until SIGTERM, then ends it."""

    def __init__(self, home: Path, pod_id: str) -> None:
        self.home = home
        self.paths = PodPaths.of(home, pod_id)
        self.config = PodConfig.load(self.paths.config)
        self.ending = {"by": "signal", "layer": "SIGTERM to the pod's daemon"}
        self.port = 0
        self.bash = shutil.which("bash") or "/bin/bash"
        self._stop = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()

    def authorized_keys(self) -> set[bytes]:
        """The authorised public keys, read at each login (a gateway in front of the pod
        may add its own key after the pod started)."""
        try:
            found = asyncssh.read_public_key_list(str(self.paths.authorized_keys))
        except (OSError, ValueError):
            return set()
        return {k.public_data for k in found}

    def spawn_background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task the daemon keeps a reference to until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        if self.config.terminate_after:
            lease = datetime.fromisoformat(self.config.terminate_after.replace("Z", "+00:00"))
            delay = max(0.0, (lease - datetime.now(UTC)).total_seconds())
            loop.call_later(delay, self._lease_ends)
        host_key = asyncssh.read_private_key(str(self.paths.host_key))
        server = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_factory=lambda: _PodSSHServer(self),
            server_host_keys=[host_key],
            process_factory=self._handle,
            sftp_factory=asyncssh.SFTPServer if self.config.mode == "direct" else None,
            encoding=None,
            line_editor=False,
            window=_WINDOW_BYTES,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_pty=True,
            keepalive_interval=0,
        )
        self.port = server.sockets[0].getsockname()[1]
        self.paths.pid_file.write_text(f"{os.getpid()}\n")
        write_record(
            self.home,
            PodRecord(
                pod_id=self.config.pod_id,
                name=self.config.name,
                pid=os.getpid(),
                port=self.port,
                mode=self.config.mode,
                user=self.config.user,
                pod_host_id=self.config.pod_host_id,
                host_key=self.config.host_key,
                workdir=str(self.paths.workspace),
                cost_per_hr=self.config.cost_per_hr,
                gpu_type=self.config.gpu_type,
                created_at=self.config.created_at,
                lifetime_seconds=self.config.lifetime_seconds,
                terminate_after=self.config.terminate_after,
            ),
        )
        log.info(
            "%s: listening on 127.0.0.1:%d (%s)", self.config.pod_id, self.port, self.config.mode
        )
        await self._stop.wait()
        log.info("%s: terminating", self.config.pod_id)
        server.close()
        self.end_pod()
        logging.shutdown()
        os._exit(0)  # the pod is gone; skip tearing down sessions whose processes are dead

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        await _Session(self, process).run()

    def _lease_ends(self) -> None:
        log.info("%s: terminate_after %s reached", self.config.pod_id, self.config.terminate_after)
        self.ending = {"by": "lease", "layer": "terminateAfter"}
        with contextlib.suppress(OSError):
            (self.paths.root / ENDING_FILE).unlink()
        self._stop.set()

    def _read_ending(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((self.paths.root / ENDING_FILE).read_text())
            if isinstance(data, dict) and data.get("by"):
                self.ending = {"by": str(data["by"]), "layer": str(data.get("layer") or "")}

    def end_pod(self) -> None:
        """Kill every process of the pod (the caller of ``runpodctl pod delete`` too),
        leave the tombstone, remove the pod directory and the registry entry."""
        self._read_ending()
        attempts = read_deadman_attempts(self.paths.workspace)
        leftovers = kill_marked(self.config.pod_id, timeout_seconds=10.0)
        if leftovers:
            log.error("%s: processes survived SIGKILL: %s", self.config.pod_id, leftovers)
        attempts = read_deadman_attempts(self.paths.workspace) or attempts
        with contextlib.suppress(OSError):
            write_tombstone(
                self.home,
                PodTombstone(
                    pod_id=self.config.pod_id,
                    name=self.config.name,
                    created_at=self.config.created_at,
                    ended_at=datetime.now(UTC).isoformat(),
                    by=self.ending["by"],
                    layer=self.ending["layer"],
                    attempts=attempts,
                ),
            )
        shutil.rmtree(self.paths.root, ignore_errors=True)
        remove_record(self.home, self.config.pod_id)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--home HOME --pod-id ID``; returns the exit status."""
    parser = argparse.ArgumentParser(description="Serve one local pod over SSH.")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--pod-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    daemon = PodDaemon(args.home, args.pod_id)
    # Pod processes start here (posix_spawn inherits the cwd), and SFTP resolves
    # relative paths from here: the workspace, as /workspace on a RunPod pod.
    os.chdir(daemon.paths.workspace)
    asyncio.run(daemon.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
