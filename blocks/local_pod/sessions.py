"""One SSH session of a local pod: the pod process it runs, bridged to the channel
(docs/architecture.md#the-local-pod-blockslocal_pod).

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
would (:class:`CookedRelay`), as a gateway that is not 8-bit clean might. A pod
process's environment is built from scratch (:func:`build_pod_env`).

Imported by the daemon only: standard library, asyncssh and the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import struct
import termios
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh

from prefect_runpod.blocks.exceptions import GATEWAY_PTY_ERROR  # imports nothing: stays light
from prefect_runpod.blocks.faults import FAULTS_ENV, parse_faults  # stdlib only
from prefect_runpod.blocks.local_pod.registry import INIT_PID_VAR, MARKER_VAR, PodPaths

if TYPE_CHECKING:
    from prefect_runpod.blocks.local_pod.daemon import PodConfig, PodDaemon

__all__ = ["CookedRelay", "Session", "build_pod_env"]

log = logging.getLogger("local_pod_daemon")

_READ_CHUNK_BYTES = 65536
_BATCH_BYTES = 256 * 1024


_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HUP_GRACE_SECONDS = 2.0


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


class Session:
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
