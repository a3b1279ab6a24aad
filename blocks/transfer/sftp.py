"""The ``sftp`` transfer method: paramiko SFTP to a pod's direct-TCP sshd, with resume
and verification.

Direct mode only (RunPod's gateway refuses SFTP). Files land as ``<name>.part`` and
are renamed once whole; a reconnect resumes a ``.part`` after checking its prefix
hashes on both ends (the pod side through ``manifest.py --prefix-bytes`` over exec).
The pod's manifest is computed by exec of ``manifest.py`` on the pod's disk, the
local one by the same module imported here. ``sftp_upload`` / ``sftp_download`` work on
an endpoint; ``SftpMethod`` is the ``TransferMethod`` that finds the pod's direct
endpoint. Both answer with a ``MethodResult``.
"""

from __future__ import annotations

import base64
import json
import shlex
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
from pydantic import SecretStr

from prefect_runpod.blocks.console.ssh import open_ssh_client
from prefect_runpod.blocks.exceptions import (
    ChecksumMismatchError,
    SpecError,
    TransferError,
)
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import MethodConfig, PodLink, ProgressCallback
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult, tree_refusal

__all__ = [
    "SftpMethod",
    "SftpSession",
    "connect_direct",
    "direct_endpoint",
    "sftp_download",
    "sftp_upload",
]

WINDOW_BYTES = 8 * 1024 * 1024
READ_BYTES = 1024 * 1024
_DROPS = (paramiko.SSHException, OSError, EOFError)


def direct_endpoint(handle: PodHandle) -> SSHEndpoint | None:
    """The pod's direct-TCP sshd (``handle.direct_ssh``, or ``handle.ssh`` in direct
    mode), or None when it has only the gateway."""
    if handle.direct_ssh is not None:
        return handle.direct_ssh
    if handle.ssh is not None and handle.ssh.mode == "direct":
        return handle.ssh
    return None


def connect_direct(
    endpoint: SSHEndpoint, private_key: SecretStr, timeout_seconds: float = 30.0
) -> paramiko.SSHClient:
    """A paramiko client on a direct-mode endpoint, host key pinned when known.

    The connection itself is ``ssh_connect.open_ssh_client`` (one place for host-key
    pinning and the cipher choice).

    Raises:
        ConsoleConnectError: the connection or the login failed, or the host key differs.
    """
    where = f"{endpoint.user}@{endpoint.host}:{endpoint.port}"
    client = open_ssh_client(
        endpoint,
        private_key,
        pinned_host_key=endpoint.host_key,
        timeout_seconds=timeout_seconds,
        where=where,
    )
    transport = client.get_transport()
    assert transport is not None
    transport.default_window_size = WINDOW_BYTES
    transport.set_keepalive(15)
    return client


class SftpSession:
    """One SSH connection with an SFTP channel and exec for ``manifest.py``."""

    def __init__(
        self, endpoint: SSHEndpoint, private_key: SecretStr, tools_dir: str, python: str = "python3"
    ):
        self.endpoint, self.private_key = endpoint, private_key
        self.tools_dir, self.python = tools_dir, python
        self.client = connect_direct(endpoint, private_key)
        transport = self.client.get_transport()
        assert transport is not None
        sftp = paramiko.SFTPClient.from_transport(transport, window_size=WINDOW_BYTES)
        assert sftp is not None
        self.sftp = sftp
        self._install_manifest()

    def _install_manifest(self) -> None:
        local = Path(mf.__file__)
        self.makedirs(self.tools_dir)
        target = f"{self.tools_dir}/manifest.py"
        try:
            if self.sftp.stat(target).st_size == local.stat().st_size:
                return
        except OSError:
            pass
        self.sftp.put(str(local), target + ".tmp")
        self.sftp.posix_rename(target + ".tmp", target)

    def makedirs(self, path: str) -> None:
        """``mkdir -p`` over SFTP."""
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if not sub:
                continue
            try:
                if stat.S_ISDIR(self.sftp.stat(sub).st_mode or 0):
                    continue
            except OSError:
                self.sftp.mkdir(sub)

    def manifest(
        self,
        root: str,
        paths: list[str] | None = None,
        prefix_bytes: int | None = None,
        *,
        follow_links: bool = False,
        structure: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The pod's manifest of ``root`` (``manifest.py`` over exec), after making the
        directory and link entries of ``structure`` when given.

        Raises:
            SpecError: the tree holds links that leave it or dangle (each named).
            TransferError: the script failed (e.g. the folder is missing), or the
                ``structure`` entries could not be made."""
        cmd = f"{shlex.quote(self.python)} {shlex.quote(self.tools_dir + '/manifest.py')} {shlex.quote(root)}"
        if prefix_bytes is not None:
            cmd += f" --prefix-bytes {prefix_bytes}"
        if follow_links:
            cmd += " --follow-links"
        if structure:
            blob = base64.b64encode(json.dumps(structure).encode()).decode("ascii")
            cmd += f" --apply-b64 {blob}"
        if paths is not None:
            cmd += " --files " + " ".join(shlex.quote(p) for p in paths) if paths else " --files"
        _, stdout, stderr = self.client.exec_command(cmd, timeout=600)
        out = stdout.read()
        code = stdout.channel.recv_exit_status()
        if code == 3:
            answer: dict[str, Any] = json.loads(out)
            problems = answer.get("problems") or []
            if structure:
                listed = "; ".join(f"{path} ({why})" for path, why in problems[:20])
                raise TransferError(f"could not make {listed} under {root} on the pod")
            raise SpecError(tree_refusal(f"the pod's {root}", problems))
        if code != 0:
            raise TransferError(
                f"manifest of {root} on the pod failed: "
                f"{stderr.read().decode(errors='replace').strip()}"
            )
        result: dict[str, Any] = json.loads(out)
        return result

    def close(self) -> None:
        """Close SFTP and SSH."""
        try:
            self.sftp.close()
        finally:
            self.client.close()


def _remote_size(sftp: paramiko.SFTPClient, path: str) -> int | None:
    try:
        return sftp.stat(path).st_size
    except OSError:
        return None


def _with_reconnect(
    work: Callable[[SftpSession], MethodResult],
    open_session: Callable[[], SftpSession],
    max_reconnects: int,
    pod: str,
) -> MethodResult:
    reconnects = 0
    while True:
        session = None
        try:
            session = open_session()
            result = work(session)
            return result.model_copy(update={"reconnects": reconnects})
        except _DROPS as exc:
            reconnects += 1
            if reconnects > max_reconnects:
                raise TransferError(
                    f"sftp transfer with pod {pod} dropped {reconnects} times (last: {exc}); "
                    "check the pod is running and rerun — partial files resume",
                    pod_id=pod,
                ) from exc
        finally:
            if session is not None:
                session.close()


def sftp_upload(
    endpoint: SSHEndpoint,
    private_key: SecretStr,
    local_root: Path,
    remote_root: str,
    source: Manifest,
    *,
    tools_dir: str,
    python: str = "python3",
    on_progress: ProgressCallback | None = None,
    max_reconnects: int = 3,
    pod: str = "?",
    session_factory: Callable[[], SftpSession] | None = None,
) -> MethodResult:
    """Upload ``source``'s files (a manifest of ``local_root``) to ``remote_root``.

    Args:
        endpoint: the pod's direct-TCP sshd.
        private_key: the SSH key.
        local_root: the local tree (or single file) ``source`` describes.
        remote_root: the absolute pod folder.
        source: ``Manifest.compute(local_root)``.
        tools_dir: the pod tools folder (``manifest.py`` is copied there if missing).
        python: the pod's interpreter.
        on_progress: ``(done_bytes, total_bytes)`` as bytes are written.
        max_reconnects: dropped connections survived before giving up.
        pod: the pod id, for messages.
        session_factory: opens an ``SftpSession`` (tests inject drops); default a new
            one on ``endpoint``.

    Returns:
        ``MethodResult`` with ``dest_manifest`` computed on the pod.

    Raises:
        ChecksumMismatchError: a file still differs after one retry (named).
        TransferError: the connection kept dropping or a write failed (file named).
    """
    single = local_root.is_file()
    expected = source.as_dict()
    entries = mf.file_entries(expected)
    structure = [e for e in expected["entries"] if e.get("kind", "file") != "file"]
    every_path = [e["path"] for e in expected["entries"]]
    total = sum(e["size_bytes"] for e in entries)
    state = {"done": 0, "retries": 0}
    opener = session_factory or (lambda: SftpSession(endpoint, private_key, tools_dir, python))

    def local_of(rel: str) -> Path:
        return local_root if single else local_root.joinpath(*rel.split("/"))

    def put_file(s: SftpSession, e: dict[str, Any]) -> None:
        rel = e["path"]
        remote = f"{remote_root}/{rel}"
        part = remote + mf.PART_SUFFIX
        s.makedirs(remote.rsplit("/", 1)[0])
        offset = _remote_size(s.sftp, part) or 0
        if 0 < offset <= e["size_bytes"]:
            theirs = s.manifest(remote_root, [rel + mf.PART_SUFFIX], offset)["entries"][0]
            if theirs["sha256"] != mf.entry_for(str(local_of(rel)), rel, offset)["sha256"]:
                offset = 0
        else:
            offset = 0
        with open(local_of(rel), "rb") as src, s.sftp.open(part, "r+" if offset else "w") as dst:
            dst.set_pipelined(True)
            if offset:
                dst.truncate(offset)
                dst.seek(offset)
                src.seek(offset)
            state["done"] += offset
            while True:
                buf = src.read(READ_BYTES)
                if not buf:
                    break
                try:
                    dst.write(buf)
                except OSError as exc:
                    raise TransferError(
                        f"pod {pod}: writing {rel} failed ({exc}); free space "
                        "on the pod's volume and rerun",
                        pod_id=pod,
                    ) from exc
                state["done"] += len(buf)
                if on_progress:
                    on_progress(state["done"], total)
        s.sftp.posix_rename(part, remote)

    def work(s: SftpSession) -> MethodResult:
        s.makedirs(remote_root)
        state["done"] = 0
        have = {}
        present = [
            e["path"]
            for e in entries
            if _remote_size(s.sftp, f"{remote_root}/{e['path']}") == e["size_bytes"]
        ]
        if present:
            have = {x["path"]: x for x in s.manifest(remote_root, present)["entries"]}
        todo = [e for e in entries if have.get(e["path"], {}).get("sha256") != e["sha256"]]
        state["done"] = total - sum(e["size_bytes"] for e in todo)
        for attempt in range(2):
            for e in todo:
                put_file(s, e)
            dest = s.manifest(remote_root, every_path, structure=structure)
            problems = mf.compare_manifests(expected, dest)
            if not problems:
                return MethodResult(
                    bytes=total,
                    retries=state["retries"],
                    source_manifest=source,
                    dest_manifest=Manifest.from_dict(dest),
                )
            if attempt == 1:
                path, why = problems[0]
                raise ChecksumMismatchError(
                    f"{path} on pod {pod} differs from the local file after a retry ({why}); "
                    "rerun, on a new pod if it repeats",
                    path=path,
                    pod_id=pod,
                    stage="upload",
                )
            bad = {p for p, _ in problems}
            todo = [e for e in entries if e["path"] in bad]
            state["retries"] += len(todo)
        raise AssertionError("unreachable")

    return _with_reconnect(work, opener, max_reconnects, pod)


def sftp_download(
    endpoint: SSHEndpoint,
    private_key: SecretStr,
    remote_root: str,
    local_root: Path,
    *,
    tools_dir: str,
    python: str = "python3",
    on_progress: ProgressCallback | None = None,
    max_reconnects: int = 3,
    pod: str = "?",
    session_factory: Callable[[], SftpSession] | None = None,
    follow_links: bool = False,
) -> MethodResult:
    """Download the tree ``remote_root`` into ``local_root`` over SFTP (files; empty
    directories and in-tree links are made here last); arguments as ``sftp_upload``,
    and ``follow_links`` reads links that leave the tree through instead of refusing
    them.

    Returns:
        ``MethodResult`` with ``source_manifest`` computed on the pod and
        ``dest_manifest`` re-read from the local disk.

    Raises:
        SpecError: links on the pod that leave the tree or dangle (each named).
        ChecksumMismatchError: a file still differs after one retry (named).
        TransferError: the folder is missing on the pod, or the connection kept dropping.
    """
    opener = session_factory or (lambda: SftpSession(endpoint, private_key, tools_dir, python))
    state: dict[str, Any] = {"source": None, "retries": 0}
    local_root.mkdir(parents=True, exist_ok=True)

    def get_file(s: SftpSession, e: dict[str, Any], total: int) -> None:
        rel = e["path"]
        dest = local_root.joinpath(*rel.split("/"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = Path(str(dest) + mf.PART_SUFFIX)
        offset = part.stat().st_size if part.is_file() else 0
        if 0 < offset <= e["size_bytes"]:
            theirs = s.manifest(remote_root, [rel], offset)["entries"][0]
            if theirs["sha256"] != mf.hash_file(str(part), offset)[2]:
                offset = 0
        else:
            offset = 0
        with (
            s.sftp.open(f"{remote_root}/{rel}", "r") as src,
            open(part, "r+b" if offset else "wb") as out,
        ):
            out.truncate(offset)
            out.seek(offset)
            src.seek(offset)
            src.prefetch(e["size_bytes"] - offset)
            state["done"] += offset
            while True:
                buf = src.read(READ_BYTES)
                if not buf:
                    break
                out.write(buf)
                state["done"] += len(buf)
                if on_progress:
                    on_progress(state["done"], total)
        part.replace(dest)

    def work(s: SftpSession) -> MethodResult:
        if state["source"] is None:
            state["source"] = s.manifest(remote_root, follow_links=follow_links)
        src = state["source"]
        files = mf.file_entries(src)
        total = sum(e["size_bytes"] for e in files)
        paths = [e["path"] for e in src["entries"]]
        have = {
            x["path"]: x
            for x in mf.compute_manifest(
                str(local_root),
                [e["path"] for e in files if local_root.joinpath(*e["path"].split("/")).is_file()],
            )["entries"]
        }
        todo = [e for e in files if have.get(e["path"], {}).get("sha256") != e["sha256"]]
        state["done"] = total - sum(e["size_bytes"] for e in todo)
        for attempt in range(2):
            for e in todo:
                get_file(s, e, total)
            made = mf.apply_structure(str(local_root), src["entries"])
            if made:
                listed = "; ".join(f"{path} ({why})" for path, why in made[:20])
                raise TransferError(f"could not make {listed} under {local_root}", pod_id=pod)
            dest = mf.compute_manifest(str(local_root), paths)
            problems = mf.compare_manifests(src, dest)
            if not problems:
                return MethodResult(
                    bytes=total,
                    retries=state["retries"],
                    source_manifest=Manifest.from_dict(src),
                    dest_manifest=Manifest.from_dict(dest),
                )
            if attempt == 1:
                path, why = problems[0]
                raise ChecksumMismatchError(
                    f"{path} from pod {pod} differs after a retry ({why}); rerun the download",
                    path=path,
                    pod_id=pod,
                    stage="download",
                )
            bad = {p for p, _ in problems}
            todo = [e for e in files if e["path"] in bad]
            state["retries"] += len(todo)
        raise AssertionError("unreachable")

    return _with_reconnect(work, opener, max_reconnects, pod)


class SftpMethod:
    """The ``sftp`` ``TransferMethod``: a second SSH connection to the pod's direct-TCP
    sshd. Preferred by ``auto`` over ``pty`` whenever the pod has one.

    Args:
        private_key: the SSH key for the second connection; required to transfer.
        python: the pod's interpreter (runs ``manifest.py``).
    """

    auto_priority: int | None = 20

    def __init__(
        self,
        private_key: SecretStr | None = None,
        python: str = "python3",
        *,
        follow_links: bool = False,
    ):
        self.private_key = private_key
        self.python = python
        self.follow_links = follow_links

    @classmethod
    def from_config(cls, config: MethodConfig) -> SftpMethod:
        """The method with the caller's private key and link choice."""
        return cls(config.private_key, follow_links=config.follow_links)

    def unavailable(self, handle: PodHandle) -> str | None:
        """A message when the pod has no direct-TCP endpoint (RunPod's gateway refuses
        SFTP), else None."""
        if direct_endpoint(handle) is not None:
            return None
        return (
            f"pod {handle.pod_id} has no direct-TCP SSH endpoint, so sftp cannot work "
            "(RunPod's gateway refuses SFTP); expose 22/tcp or use method 'pty'"
        )

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """Whether the running pod's handle has a direct endpoint (``unavailable``)."""
        return self.unavailable(pod.handle)

    def _endpoint(self, pod: PodLink) -> tuple[SSHEndpoint, SecretStr]:
        endpoint = direct_endpoint(pod.handle)
        if self.private_key is None or endpoint is None:
            raise SpecError(
                "the sftp method needs private_key and a direct endpoint", pod_id=pod.pod_id
            )
        return endpoint, self.private_key

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """``sftp_upload`` to the pod's direct endpoint.

        Raises:
            SpecError: no private key or no direct endpoint.
            ChecksumMismatchError, TransferError: as ``sftp_upload``.
        """
        endpoint, key = self._endpoint(pod)
        return sftp_upload(
            endpoint,
            key,
            local_root,
            remote_root,
            source,
            tools_dir=pod.tools_dir,
            python=self.python,
            on_progress=on_progress,
            pod=pod.pod_id,
        )

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """``sftp_download`` from the pod's direct endpoint.

        Raises:
            SpecError: no private key or no direct endpoint.
            ChecksumMismatchError, TransferError: as ``sftp_download``.
        """
        endpoint, key = self._endpoint(pod)
        return sftp_download(
            endpoint,
            key,
            remote_root,
            local_root,
            tools_dir=pod.tools_dir,
            python=self.python,
            on_progress=on_progress,
            pod=pod.pod_id,
            follow_links=self.follow_links,
        )
