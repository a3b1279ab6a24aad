"""The ``sftp`` transfer method: paramiko SFTP to a pod's direct-TCP sshd, with resume
and verification.

Direct mode only (RunPod's gateway refuses SFTP). Files land as ``<name>.part`` and
are renamed once whole; a reconnect resumes a ``.part`` after checking its prefix
hashes on both ends (the pod side through ``manifest.py --prefix-bytes`` over exec).
The pod's manifest is computed by exec of ``manifest.py`` on the pod's disk, the
local one by the same module imported here. ``sftp_upload`` / ``sftp_download`` work on
an endpoint; ``SftpMethod`` is the ``TransferMethod`` that finds the pod's direct
endpoint. Both answer with a ``MethodResult``. The connection they run on is
:mod:`prefect_runpod.blocks.transfer.sftp_session`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import MethodConfig, PodLink, ProgressCallback
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.sftp_session import (
    SftpSession,
    connect_direct,
    direct_endpoint,
    remote_size,
    with_reconnect,
)
from prefect_runpod.blocks.transfer.verify import (
    VerifyStep,
    already_here,
    local_tree_manifest,
    structure_entries,
    verify_resending_once,
)

__all__ = [
    "SftpMethod",
    "SftpSession",
    "connect_direct",
    "direct_endpoint",
    "sftp_download",
    "sftp_upload",
]

READ_BYTES = 1024 * 1024


def _put_file(
    s: SftpSession,
    e: dict[str, Any],
    remote_root: str,
    local_path: Path,
    state: dict[str, int],
    total: int,
    on_progress: ProgressCallback | None,
    pod: str,
) -> None:
    """Send one file of an upload to ``<remote_root>/<path>.part``, resuming a ``.part``
    whose prefix hashes match, then rename it into place."""
    rel = e["path"]
    remote = f"{remote_root}/{rel}"
    part = remote + mf.PART_SUFFIX
    s.makedirs(remote.rsplit("/", 1)[0])
    offset = remote_size(s.sftp, part) or 0
    if 0 < offset <= e["size_bytes"]:
        theirs = s.manifest(remote_root, [rel + mf.PART_SUFFIX], offset)["entries"][0]
        if theirs["sha256"] != mf.entry_for(str(local_path), rel, offset)["sha256"]:
            offset = 0
    else:
        offset = 0
    with open(local_path, "rb") as src, s.sftp.open(part, "r+" if offset else "w") as dst:
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
            state["sent"] += len(buf)
            if on_progress:
                on_progress(state["done"], total)
    s.sftp.posix_rename(part, remote)


def _get_file(
    s: SftpSession,
    e: dict[str, Any],
    remote_root: str,
    local_root: Path,
    state: dict[str, Any],
    total: int,
    on_progress: ProgressCallback | None,
) -> None:
    """Fetch one file of a download into ``<local_root>/<path>.part``, resuming a
    ``.part`` whose prefix hashes match, then rename it into place."""
    rel = e["path"]
    dest = local_root.joinpath(*rel.split("/"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = Path(str(dest) + mf.PART_SUFFIX)
    offset = part.stat().st_size if part.is_file() else 0
    if 0 < offset <= e["size_bytes"]:
        theirs = s.manifest(remote_root, [rel], offset)["entries"][0]
        if theirs["sha256"] != mf.hash_file(str(part), offset)[1]:
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
            state["sent"] += len(buf)
            if on_progress:
                on_progress(state["done"], total)
    part.replace(dest)


def _move_and_verify(
    move: Callable[[dict[str, Any]], None],
    files: list[dict[str, Any]],
    todo: list[dict[str, Any]],
    check: VerifyStep,
    state: dict[str, Any],
    source: Manifest,
    pod: str,
) -> MethodResult:
    """``move`` each of ``todo`` (entries of ``files``), then the verify step (``check``:
    expected manifest, measure, direction), moving those that differ once more;
    ``state`` counts done and sent bytes and retries. Returns the ``MethodResult``."""
    expected, measure, direction = check
    total = sum(e["size_bytes"] for e in files)
    state["done"] = total - sum(e["size_bytes"] for e in todo)

    def resend(bad: set[str]) -> None:
        again = [e for e in files if e["path"] in bad]
        state["retries"] += len(again)
        for e in again:
            move(e)

    for e in todo:
        move(e)
    dest = verify_resending_once(
        expected, measure, resend, method="sftp", direction=direction, pod=pod
    )
    return MethodResult(
        bytes=total,
        sent_bytes=state["sent"],
        retries=state["retries"],
        source_manifest=source,
        dest_manifest=Manifest.from_dict(dest),
    )


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
    structure = structure_entries(expected)
    every_path = [e["path"] for e in expected["entries"]]
    total = sum(e["size_bytes"] for e in entries)
    state = {"done": 0, "retries": 0, "sent": 0}
    opener = session_factory or (lambda: SftpSession(endpoint, private_key, tools_dir, python))

    def local_of(rel: str) -> Path:
        return local_root if single else local_root.joinpath(*rel.split("/"))

    def work(s: SftpSession) -> MethodResult:
        s.makedirs(remote_root)
        state["done"] = 0
        have = {}
        memo = f"{tools_dir}/known-{secrets.token_hex(8)}.json"  # see pod_tools.PodLanding
        present = [
            e["path"]
            for e in entries
            if remote_size(s.sftp, f"{remote_root}/{e['path']}") == e["size_bytes"]
        ]
        if present:
            found = s.manifest(remote_root, present, save_known=memo)
            have = {x["path"]: x for x in found["entries"]}
        todo = [e for e in entries if have.get(e["path"], {}).get("sha256") != e["sha256"]]

        def landed() -> dict[str, Any]:
            return s.manifest(remote_root, every_path, structure=structure, use_known=memo)

        def put(e: dict[str, Any]) -> None:
            _put_file(s, e, remote_root, local_of(e["path"]), state, total, on_progress, pod)

        check: VerifyStep = (expected, landed, "upload")
        return _move_and_verify(put, entries, todo, check, state, source, pod)

    return with_reconnect(work, opener, max_reconnects, pod)


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
    state: dict[str, Any] = {"source": None, "retries": 0, "sent": 0}
    local_root.mkdir(parents=True, exist_ok=True)

    def work(s: SftpSession) -> MethodResult:
        if state["source"] is None:
            state["source"] = s.manifest(remote_root, follow_links=follow_links)
        src = state["source"]
        files = mf.file_entries(src)
        total = sum(e["size_bytes"] for e in files)
        known: dict[str, Any] = {}  # files here hashed once: kept ones are not re-read
        there = already_here(local_root, files, known)
        todo = [e for e in files if e["path"] not in there]
        check: VerifyStep = (
            src,
            lambda: local_tree_manifest(local_root, src, pod, known),
            "download",
        )

        def get(e: dict[str, Any]) -> None:
            _get_file(s, e, remote_root, local_root, state, total, on_progress)

        return _move_and_verify(get, files, todo, check, state, Manifest.from_dict(src), pod)

    return with_reconnect(work, opener, max_reconnects, pod)


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
