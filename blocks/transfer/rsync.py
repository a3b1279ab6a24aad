"""The ``rsync`` transfer method: ``rsync`` over the OpenSSH client to a pod's direct-TCP
sshd (docs/architecture.md#transfers-and-integrity).

Direct mode only (RunPod's gateway serves neither exec nor rsync), with ``rsync`` on
both ends. The OpenSSH client gets the pod's host key in a known_hosts file of its own
(``StrictHostKeyChecking=yes``; a key not recorded yet is accepted once, as the sftp
method does) and the run's key in a 0600 file, both in a private temporary folder
removed when the transfer ends; nothing else of the user's ssh setup is read
(:mod:`.openssh_login`). The login starts as the transfer does (``connecting``), so its
round trips overlap the hashing of the local tree; rsync shares that connection, and so
do the pod's next transfers in this process while it stays open.

Only the files the destination does not already hold with the same digests cross:
the destination's manifest is read first. A file that changed in place travels as
rsync's delta against the old copy (``--ignore-times``: the manifest, not size and
mtime, decided that it differs); an interrupted file waits in ``.rsync.part``
(``--partial-dir``, transfer scratch that no manifest lists) and the next attempt —
after a dropped connection, or a rerun — continues from it (after a dropped upload,
once the pod's receiving rsync has exited and kept it: ``_wait_receiver_gone``). Files are read through
links (``-L``: a file entry never passes through an in-tree link, which travels as a
link), empty directories travel with their modes, links are made by the verify step,
file modes and times are kept (``-p -t``; owners are not: the pod's user owns what
lands). ``--info=progress2`` feeds the progress callback, ``--stats`` says how much
file content was sent after the delta (``Literal data``). Every transfer ends with the
one verify step of all methods (:mod:`.verify`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import ConsoleError, SpecError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import (
    MethodConfig,
    MethodOptions,
    PodLink,
    ProgressCallback,
    TransferHooks,
)
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.openssh_login import (
    MASTER_IDLE_SECONDS,
    OpenSshLogin,
    ssh_login,
)
from prefect_runpod.blocks.transfer.pod_tools import PodLanding, pod_manifest
from prefect_runpod.blocks.transfer.sftp_session import direct_endpoint
from prefect_runpod.blocks.transfer.verify import (
    VerifyStep,
    already_here,
    local_tree_manifest,
    verify_resending_once,
)

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint

__all__ = ["PARTIAL_DIR", "RsyncMethod", "RsyncOptions"]

PARTIAL_DIR = ".rsync.part"
"""Where an interrupted file waits, in its folder on the receiving side (a name the
manifest leaves out as transfer scratch)."""
IO_TIMEOUT_SECONDS = 300
"""rsync gives up after this long without data (``--timeout``)."""
RECEIVER_EXIT_WAIT_SECONDS = 30.0
"""After a dropped upload, how long the pod's receiving rsync may take to notice and keep
what arrived in its partial dir before the next attempt starts without it."""
_DROPPED = {10, 12, 30, 35, 255}  # socket I/O, stream, timeouts, ssh: the link went
_REFUSED = ("Permission denied", "Host key verification failed", "IDENTIFICATION HAS CHANGED")
_PROGRESS = re.compile(rb"^\s*([\d,]+)\s+\d+%")
_LITERAL = re.compile(rb"Literal data: ([\d,]+) bytes")
_TAIL_BYTES = 64 * 1024


@dataclass
class RsyncOptions(MethodOptions):
    """Tuning of the ``rsync`` method.

    Attributes:
        local_exe: rsync on this machine.
        ssh_exe: the OpenSSH client on this machine.
        pod_exe: rsync on the pod.
        max_reconnects: dropped connections survived (each resumes) before giving up.
        keep_connection_seconds: how long the transfer's SSH connection stays open,
            unused, for the pod's next transfers in this process to share (s); 0
            closes it when the transfer ends.
    """

    local_exe: str = "rsync"
    ssh_exe: str = "ssh"
    pod_exe: str = "rsync"
    max_reconnects: int = 3
    keep_connection_seconds: int = MASTER_IDLE_SECONDS


def _remote(endpoint: SSHEndpoint, path: str) -> str:
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    return f"{endpoint.user}@{host}:{path.rstrip('/')}/"


def _run(argv: list[str], on_bytes: Callable[[int], None]) -> tuple[int, bytes, str]:
    """Run rsync; ``on_bytes`` gets each ``--info=progress2`` count. Returns the exit
    code, the tail of its output (the ``--stats`` block) and its error output."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "LC_ALL": "C"},
        )
        assert proc.stdout is not None
        tail = partial = b""
        try:
            while chunk := os.read(proc.stdout.fileno(), 65536):
                *lines, partial = re.split(rb"[\r\n]", partial + chunk)
                for line in lines:
                    match = _PROGRESS.match(line)
                    if match:
                        on_bytes(int(match.group(1).replace(b",", b"")))
                tail = (tail + chunk)[-_TAIL_BYTES:]
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return code, tail, err.read().decode(errors="replace")


class RsyncMethod:
    """The ``rsync`` ``TransferMethod``: rsync over OpenSSH to the pod's direct-TCP
    sshd. ``auto`` prefers it to ``sftp`` when both ends have rsync (on the benchmark,
    benchmarks/README.md, it uploads as fast as sftp, downloads 2-3 x faster, and
    sends only the changed part of a file rewritten in place).

    Args:
        private_key: the run's SSH key; required to transfer.
        options: the executables and reconnects; default ``RsyncOptions()``.
        hooks: fault points (``progress`` is called as bytes are confirmed).
        follow_links: downloads read links that leave the pod's tree through.
    """

    auto_priority: int | None = 25

    def __init__(
        self,
        private_key: SecretStr | None = None,
        options: RsyncOptions | None = None,
        hooks: TransferHooks | None = None,
        *,
        follow_links: bool = False,
    ):
        self.private_key = private_key
        self.options = options or RsyncOptions()
        self.hooks = hooks or TransferHooks()
        self.follow_links = follow_links
        self._early: tuple[SSHEndpoint, OpenSshLogin] | None = None

    @classmethod
    def from_config(cls, config: MethodConfig) -> RsyncMethod:
        """The method with the caller's key, ``RsyncOptions`` (if any), hooks and link
        choice."""
        return cls(
            config.private_key,
            config.options_for(RsyncOptions),
            config.hooks,
            follow_links=config.follow_links,
        )

    def unavailable(self, handle: PodHandle) -> str | None:
        """A message when the pod has no direct-TCP endpoint, or this machine lacks
        rsync or the OpenSSH client; else None (the pod's rsync: ``pod_unavailable``)."""
        if direct_endpoint(handle) is None:
            return (
                f"pod {handle.pod_id} has no direct-TCP SSH endpoint, so rsync cannot work "
                "(RunPod's gateway serves neither exec nor rsync); expose 22/tcp or use "
                "method 'pty'"
            )
        for exe in (self.options.local_exe, self.options.ssh_exe):
            if shutil.which(exe) is None:
                return (
                    f"{exe!r} is not on this machine's PATH, so the rsync method cannot "
                    "run: install rsync and the OpenSSH client, or use method 'sftp'"
                )
        return None

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """``unavailable``, then whether the pod has rsync on its PATH."""
        reason = self.unavailable(pod.handle)
        if reason is not None:
            return reason
        exe = shlex.quote(self.options.pod_exe)
        found = pod.console.run(f"command -v {exe} >/dev/null", timeout_seconds=30, check=False)
        if found.exit_code != 0:
            return (
                f"pod {pod.pod_id} has no {self.options.pod_exe!r} on its PATH, so rsync "
                "cannot run there: use an image with rsync, or method 'sftp'"
            )
        return None

    @contextlib.contextmanager
    def connecting(self, handle: PodHandle, console: PodConsole) -> Iterator[None]:
        """Log in to the pod's direct sshd in the background for the block's transfer
        (``OpenSshLogin.start_master``), so the connection's round trips overlap the
        caller's hashing and listing instead of following them; a connection an earlier
        transfer left open is used as it is, and this one stays open for
        ``keep_connection_seconds``. Without a key or direct endpoint it does
        nothing (the transfer then raises as usual)."""
        endpoint = direct_endpoint(handle)
        if self.private_key is None or endpoint is None:
            yield
            return
        endpoint = _pinned(endpoint, handle, console)
        keep = self.options.keep_connection_seconds
        with ssh_login(endpoint, self.private_key, self.options.ssh_exe) as login:
            login.start_master(keep)
            self._early = (endpoint, login)
            try:
                yield
            finally:
                self._early = None
                if keep <= 0:
                    login.stop_master()

    def _endpoint(self, pod: PodLink) -> tuple[SSHEndpoint, SecretStr]:
        endpoint = direct_endpoint(pod.handle)
        if self.private_key is None or endpoint is None:
            raise SpecError(
                "the rsync method needs private_key and a direct endpoint", pod_id=pod.pod_id
            )
        return _pinned(endpoint, pod.handle, pod.console), self.private_key

    def _login(
        self, endpoint: SSHEndpoint, key: SecretStr
    ) -> contextlib.AbstractContextManager[OpenSshLogin]:
        """The login opened early by ``connecting`` for this endpoint, else a new one."""
        early = self._early
        if early is not None and early[0] == endpoint:
            return contextlib.nullcontext(early[1])
        return ssh_login(endpoint, key, self.options.ssh_exe)

    def _rsync(
        self,
        pod: PodLink,
        paths: list[str],
        source: str,
        dest: str,
        progress: Callable[[int], None],
        *,
        mkdir: str | None = None,
        ignore_times: bool = True,
    ) -> tuple[int, int]:
        """Move ``paths`` (relative to ``source``) to ``dest`` with rsync, resuming
        after each dropped connection. Returns ``(literal bytes sent, reconnects)``.

        Raises:
            TransferError: the pod refused the login or the host key, has no rsync,
                refused a write (the reason named), or the link dropped more than
                ``max_reconnects`` times.
        """
        endpoint, key = self._endpoint(pod)
        opts, sent, reconnects = self.options, 0, 0
        with self._login(endpoint, key) as login:
            listing = login.folder / "files"
            listing.write_bytes(b"".join(p.encode() + b"\0" for p in paths))
            argv = [opts.local_exe, "-s", "-L", "-p", "-t", f"--partial-dir={PARTIAL_DIR}"]
            argv += ["--from0", f"--files-from={listing}", "--info=progress2", "--stats"]
            argv += [f"--timeout={IO_TIMEOUT_SECONDS}"]
            # An upload's receiver is the pod's rsync: its pid (the shell's, kept by exec)
            # lets the next attempt after a drop wait for it to keep its partial file.
            pid_file = f"/tmp/prefect-runpod-rsync-{os.urandom(6).hex()}.pid"
            if mkdir is not None:
                argv.append(
                    f"--rsync-path=mkdir -p {shlex.quote(mkdir)} && echo $$ > {pid_file} "
                    f"&& exec {opts.pod_exe}"
                )
            try:
                while True:
                    # After a drop, files that arrived keep their size and time: only the
                    # first run must not trust them (the manifest said they differ).
                    again = ["-I"] if ignore_times and not reconnects else []
                    ssh = ["-e", login.command_line()]
                    code, out, err = _run([*argv, *ssh, *again, source, dest], progress)
                    sent += sum(int(m.replace(b",", b"")) for m in _LITERAL.findall(out))
                    if code == 0:
                        return sent, reconnects
                    refused = next((r for r in _REFUSED if r in err), None)
                    if code not in _DROPPED or refused or reconnects >= opts.max_reconnects:
                        break
                    reconnects += 1
                    login.stop_master()  # the next attempt logs in afresh
                    if mkdir is not None:
                        _wait_receiver_gone(pod, pid_file, RECEIVER_EXIT_WAIT_SECONDS)
            finally:
                if mkdir is not None:
                    _wait_receiver_gone(pod, pid_file, 0.0)  # its pid file removed
        raise TransferError(self._failure(pod, code, err, refused, reconnects), pod_id=pod.pod_id)

    def _failure(self, pod: PodLink, code: int, err: str, refused: str | None, drops: int) -> str:
        where = f"rsync with pod {pod.pod_id}"
        last = err.strip().splitlines()[-3:]
        said = " / ".join(last) or "no message"
        if refused:
            return f"{where}: the pod refused the connection ({said}); check the key and host key"
        if "command not found" in err or code == 127:
            return f"{where}: the pod has no rsync ({said}); use method 'sftp'"
        if code in _DROPPED:
            return (
                f"{where} dropped {drops + 1} times (exit {code}: {said}); check the pod is "
                "running and rerun — partial files resume"
            )
        return (
            f"{where} failed (exit {code}: {said}); free space on the pod if it is full, and rerun"
        )

    def _progress(
        self, base: int, total: int, on_progress: ProgressCallback | None
    ) -> Callable[[int], None]:
        shown = [base]

        def report(moved: int) -> None:
            shown[0] = min(total, max(shown[0], base + moved))
            if on_progress:
                on_progress(shown[0], total)
            self.hooks.progress(shown[0])

        return report

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """rsync the files of ``source`` the pod does not already hold (verified) into
        ``remote_root``, then verify on the pod (``manifest.py``, which also makes the
        links); a file that differs is sent once more.

        Raises:
            SpecError: no private key or no direct endpoint.
            ChecksumMismatchError: a file still differs after the resend (named).
            TransferError: as ``_rsync``.
        """
        endpoint, _ = self._endpoint(pod)
        landing = PodLanding(pod.console, pod.handle, remote_root, source)
        there = landing.in_place()
        base = local_root.parent if local_root.is_file() else local_root
        ends = (f"{base}/", _remote(endpoint, remote_root))
        check: VerifyStep = (source.as_dict(), landing.landed, "upload")
        return self._move(pod, source, there, ends, check, on_progress, mkdir=remote_root)

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """rsync the tree ``remote_root`` (the pod computes its manifest first) into
        ``local_root``: the files not already here with the same digests; empty
        directories and in-tree links are made here; verified against the pod's
        manifest, a file that differs fetched once more.

        Raises:
            SpecError: no private key or no direct endpoint; links on the pod that
                leave the tree or dangle (each named; read through with
                ``follow_links``).
            ChecksumMismatchError: a file still differs after the refetch (named).
            TransferError: as ``_rsync``; the folder is missing on the pod.
        """
        endpoint, _ = self._endpoint(pod)
        found = pod_manifest(pod.console, pod.handle, remote_root, follow_links=self.follow_links)
        source = Manifest.from_dict(found)
        local_root.mkdir(parents=True, exist_ok=True)
        known: dict[str, Any] = {}  # files here hashed once: kept ones are not re-read
        there = already_here(local_root, mf.file_entries(found), known)
        ends = (_remote(endpoint, remote_root), f"{local_root}/")
        check: VerifyStep = (
            found,
            lambda: local_tree_manifest(local_root, found, pod.pod_id, known),
            "download",
        )
        return self._move(pod, source, there, ends, check, on_progress)

    def _move(
        self,
        pod: PodLink,
        source: Manifest,
        there: set[str],
        ends: tuple[str, str],
        check: VerifyStep,
        on_progress: ProgressCallback | None,
        mkdir: str | None = None,
    ) -> MethodResult:
        """rsync the entries of ``source`` not in ``there`` (paths already in place)
        from ``ends[0]`` to ``ends[1]``, then the verify step (``check``: the expected
        manifest, what measures the destination, the direction), the paths that differ
        moved once more. Returns the ``MethodResult``; raises as ``_rsync`` and
        ``ChecksumMismatchError``."""
        expected, measure, direction = check
        state = {"sent": 0, "reconnects": 0, "retries": 0}

        def move(paths: set[str], progress: Callable[[int], None]) -> None:
            todo = [e.path for e in source.entries if e.path in paths and e.kind != "link"]
            if any(e.kind == "file" for e in source.subset(paths).entries):
                moved, drops = self._rsync(pod, todo, *ends, progress, mkdir=mkdir)
                state["sent"] += moved
                state["reconnects"] += drops

        def again(bad: set[str]) -> None:
            state["retries"] += len(bad)
            move(bad, lambda moved: None)

        done = sum(e.size_bytes for e in source.files if e.path in there)
        wanted = {e.path for e in source.entries} - there
        move(wanted, self._progress(done, source.total_bytes, on_progress))
        dest = verify_resending_once(
            expected, measure, again, method="rsync", direction=direction, pod=pod.pod_id
        )
        return MethodResult(
            bytes=source.total_bytes,
            sent_bytes=state["sent"],
            retries=state["retries"],
            reconnects=state["reconnects"],
            source_manifest=source,
            dest_manifest=Manifest.from_dict(dest),
        )


def _pinned(endpoint: SSHEndpoint, handle: PodHandle, console: PodConsole) -> SSHEndpoint:
    """``endpoint`` with the host key the console pinned, when it is the console's own
    endpoint and carries no key of its own."""
    if endpoint.host_key is None and handle.ssh == endpoint and console.host_key:
        return endpoint.model_copy(update={"host_key": console.host_key})
    return endpoint


def _wait_receiver_gone(pod: PodLink, pid_file: str, deadline_seconds: float) -> None:
    """Wait (at most ``deadline_seconds``) until the pod's rsync that received the last
    attempt, named by ``pid_file``, has exited, then remove ``pid_file``: only once it
    has exited is what arrived kept in its partial dir, for the next attempt to continue
    from. A receiver the client's drop reached late (a busy pod) would otherwise leave
    the next attempt to send the whole file again, and keep its partial file after it.
    Best effort: the next attempt starts anyway when the pod's console cannot tell."""
    ticks = int(deadline_seconds * 10)
    wait = (
        f"p=$(cat {pid_file} 2>/dev/null); n=0; "
        f'while [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ $n -lt {ticks} ]; '
        "do sleep 0.1; n=$((n+1)); done; rm -f " + pid_file
    )
    with contextlib.suppress(ConsoleError):
        pod.console.run(wait, timeout_seconds=deadline_seconds + 30.0, check=False)
