"""Moving a directory to and from a pod, verified end to end (docs/architecture.md#transfers-and-integrity).

``upload_dir`` / ``download_dir`` pick a method from what the pod offers (or the
caller's choice), move the files, and return a ``TransferReport`` whose two manifests
(md5 + sha256 per file) were computed where the files were and where they landed.
A file that still differs after one retry raises ``ChecksumMismatchError`` naming it;
nothing mismatched is accepted.

Methods:
    ``pty``        framed chunks through the PodConsole (works through RunPod's PTY-only
                   gateway); see :mod:`prefect_runpod.blocks.transfer.pty`.
    ``sftp``       paramiko SFTP to a direct-TCP sshd; :mod:`.transfer_sftp`.
    ``s3``         boto3 to a bucket or a RunPod network volume's S3 API; :mod:`.transfer_s3`.
    ``runpodctl``  ``runpodctl send``/``receive`` (croc relay); :mod:`.transfer_runpodctl`.

Models: ``Manifest``/``TransferReport`` live in :mod:`.transfer_models` (re-exported
by ``prefect_runpod.tasks.models``); the per-method functions return plain dicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest, TransferReport
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools, remote_path
from prefect_runpod.blocks.transfer.pty import PtyOptions, TransferHooks, pty_download, pty_upload

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["METHODS", "download_dir", "pick_method", "upload_dir"]

METHODS = ("pty", "sftp", "s3", "runpodctl")


def _direct_endpoint(handle: PodHandle) -> SSHEndpoint | None:
    if handle.direct_ssh is not None:
        return handle.direct_ssh
    if handle.ssh is not None and handle.ssh.mode == "direct":
        return handle.ssh
    return None


def pick_method(handle: PodHandle, requested: str = "auto", s3: S3Target | None = None) -> str:
    """The transfer method for this pod.

    ``auto``: ``s3`` when a target is configured, ``sftp`` when the pod has a direct-TCP
    sshd, else ``pty`` (RunPod's gateway refuses SFTP and exec).

    Raises:
        SpecError: an unknown method, ``sftp`` without a direct endpoint, ``s3`` without
            a target.
    """
    if requested == "auto":
        if s3 is not None:
            return "s3"
        return "sftp" if _direct_endpoint(handle) is not None else "pty"
    if requested not in METHODS:
        raise SpecError(f"unknown transfer method {requested!r}; use auto, {', '.join(METHODS)}")
    if requested == "sftp" and _direct_endpoint(handle) is None:
        raise SpecError(
            f"pod {handle.pod_id} has no direct-TCP SSH endpoint, so sftp cannot work "
            "(RunPod's gateway refuses SFTP); expose 22/tcp or use method 'pty'",
            pod_id=handle.pod_id,
        )
    if requested == "s3" and s3 is None:
        raise SpecError("transfer method 's3' needs an S3Target (bucket or network volume)")
    return requested


def _report(
    direction: str,
    method: str,
    started: float,
    result: dict[str, Any],
    source: dict[str, Any],
    dest: dict[str, Any],
) -> TransferReport:
    problems = mf.compare_manifests(source, dest)
    return TransferReport(
        direction=direction,  # type: ignore[arg-type]
        method=method,
        bytes=result.get("bytes", sum(e["size_bytes"] for e in source["entries"])),
        seconds=time.monotonic() - started,
        retries=result.get("retries", 0) + result.get("reconnects", 0),
        source_manifest=Manifest.from_dict(source),
        dest_manifest=Manifest.from_dict(dest),
        verified=not problems,
    )


def upload_dir(
    console: PodConsole,
    handle: PodHandle,
    local_dir: Path,
    remote_dir: str,
    *,
    method: str = "auto",
    private_key: SecretStr | None = None,
    s3: S3Target | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    options: PtyOptions | None = None,
    hooks: TransferHooks | None = None,
) -> TransferReport:
    """Upload ``local_dir`` (a folder or one file) to ``remote_dir`` on the pod.

    Args:
        console: an open console to the pod (the pty method runs through it; the
            others use it to install tools and verify).
        handle: the pod; ``remote_dir`` is relative to ``handle.workdir`` unless absolute.
        method: ``auto`` or one of ``METHODS`` (see ``pick_method``).
        private_key: needed by ``sftp`` (a second SSH connection).
        s3: the bucket / network volume for ``s3``.
        on_progress: ``(done_bytes, total_bytes)``.

    Returns:
        A ``TransferReport`` with ``verified=True`` (source manifest computed locally,
        destination manifest on the pod's disk).

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: disk full on the pod (file named), connection lost for good.
        SpecError: method not possible for this pod.
    """
    started = time.monotonic()
    local_dir = Path(local_dir)
    if not local_dir.exists():
        raise SpecError(f"nothing to upload: {local_dir} does not exist")
    chosen = pick_method(handle, method, s3)
    remote = remote_path(handle, remote_dir)
    source = mf.compute_manifest(str(local_dir))
    tools = bootstrap_pod_tools(console, handle)
    pod = handle.pod_id
    if chosen == "pty":
        result = pty_upload(
            console.open_stream,
            tools,
            local_dir,
            remote,
            source,
            reconnect=console.reconnect,
            options=options,
            hooks=hooks,
            on_progress=on_progress,
            pod=pod,
        )
        dest = result["dest_manifest"]
    elif chosen == "sftp":
        from prefect_runpod.blocks.transfer.sftp import sftp_upload

        endpoint = _direct_endpoint(handle)
        if private_key is None or endpoint is None:
            raise SpecError("the sftp method needs private_key and a direct endpoint", pod_id=pod)
        result = sftp_upload(
            endpoint,
            private_key,
            local_dir,
            remote,
            source,
            tools_dir=tools,
            on_progress=on_progress,
            pod=pod,
        )
        dest = result["dest_manifest"]
    elif chosen == "s3":
        from prefect_runpod.blocks.transfer.s3 import s3_upload_to_pod

        assert s3 is not None
        result = s3_upload_to_pod(
            console, handle, s3, local_dir, remote, source, on_progress=on_progress
        )
        dest = result["dest_manifest"]
    else:
        from prefect_runpod.blocks.transfer.runpodctl import runpodctl_upload

        extra = (options or PtyOptions()).extra
        result = runpodctl_upload(
            console,
            handle,
            local_dir,
            remote,
            source,
            local_exe=extra.get("runpodctl_local", "runpodctl"),
            pod_exe=extra.get("runpodctl_pod", "runpodctl"),
        )
        dest = result["dest_manifest"]
    report = _report("upload", chosen, started, result, source, dest)
    if not report.verified:  # the methods raise first; this is the last guard
        raise TransferError(f"pod {pod}: upload of {local_dir} did not verify", pod_id=pod)
    return report


def download_dir(
    console: PodConsole,
    handle: PodHandle,
    remote_dir: str,
    local_dir: Path,
    *,
    method: str = "auto",
    private_key: SecretStr | None = None,
    s3: S3Target | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    options: PtyOptions | None = None,
    hooks: TransferHooks | None = None,
) -> TransferReport:
    """Download ``remote_dir`` from the pod into ``local_dir``; arguments as ``upload_dir``.

    Returns:
        A ``TransferReport`` with ``verified=True``: the source manifest was computed on
        the pod, the destination manifest re-read from the local disk.

    Raises:
        ChecksumMismatchError, TransferError, SpecError: as ``upload_dir``.
    """
    started = time.monotonic()
    local_dir = Path(local_dir)
    chosen = pick_method(handle, method, s3)
    remote = remote_path(handle, remote_dir)
    tools = bootstrap_pod_tools(console, handle)
    pod = handle.pod_id
    if chosen == "pty":
        result = pty_download(
            console.open_stream,
            tools,
            remote,
            local_dir,
            reconnect=console.reconnect,
            options=options,
            hooks=hooks,
            on_progress=on_progress,
            pod=pod,
        )
    elif chosen == "sftp":
        from prefect_runpod.blocks.transfer.sftp import sftp_download

        endpoint = _direct_endpoint(handle)
        if private_key is None or endpoint is None:
            raise SpecError("the sftp method needs private_key and a direct endpoint", pod_id=pod)
        result = sftp_download(
            endpoint,
            private_key,
            remote,
            local_dir,
            tools_dir=tools,
            on_progress=on_progress,
            pod=pod,
        )
    elif chosen == "s3":
        from prefect_runpod.blocks.transfer.s3 import s3_download_from_pod

        assert s3 is not None
        result = s3_download_from_pod(
            console, handle, s3, remote, local_dir, on_progress=on_progress
        )
    else:
        from prefect_runpod.blocks.transfer.runpodctl import runpodctl_download

        extra = (options or PtyOptions()).extra
        result = runpodctl_download(
            console,
            handle,
            remote,
            local_dir,
            local_exe=extra.get("runpodctl_local", "runpodctl"),
            pod_exe=extra.get("runpodctl_pod", "runpodctl"),
        )
    report = _report(
        "download", chosen, started, result, result["source_manifest"], result["dest_manifest"]
    )
    if not report.verified:
        raise TransferError(f"pod {pod}: download of {remote} did not verify", pod_id=pod)
    return report
