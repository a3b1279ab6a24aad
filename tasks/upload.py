"""Upload: the bundle to the pod, verified end to end (docs/architecture.md#transfers-and-integrity).

The work is ``prefect_runpod.blocks.transfer.upload_dir``; this task opens (or reuses)
a console, logs progress, and returns the ``TransferReport`` whose manifests go into
the RunReport and the ``checksum-manifest`` artifact. The console it borrows or opens
and its progress lines come from ``tasks/pod_io.py``, as the download's do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer.base import MethodOptions, ProgressCallback
from prefect_runpod.blocks.transfer.dispatch import check_pod_end, upload_dir
from prefect_runpod.blocks.transfer.models import TransferReport
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.pod_io import borrowed_console, progress_logger, retry_unless_final

__all__ = ["check_upload_method", "upload"]


def check_upload_method(
    handle: PodHandle,
    private_key: SecretStr,
    method: str = "auto",
    s3: S3Target | None = None,
    console: Any = None,
    reconnect: ReconnectPolicy | None = None,
) -> str:
    """Right after the pod is ready, before anything is uploaded: can the transfer
    method work with this pod as it is (``dispatch.check_pod_end``)? The console waits
    out a gateway outage (``reconnect``).

    Returns:
        The method the upload and the downloads will use.

    Raises:
        SpecError: naming the pod and why (no direct endpoint for ``sftp``, no
            ``runpodctl`` on the pod, …); the flow then terminates the pod.
    """
    with borrowed_console(handle, private_key, console, reconnect) as live:
        return check_pod_end(live, handle, method, s3=s3, private_key=private_key)


@task(
    name="upload",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_unless_final,
)
def upload(
    handle: PodHandle,
    private_key: SecretStr,
    local_dir: Path,
    remote_dir: str,
    method: str = "auto",
    s3: S3Target | None = None,
    options: MethodOptions | None = None,
    console: Any = None,
    paths: list[str] | None = None,
    follow_links: bool = False,
    reconnect: ReconnectPolicy | None = None,
    on_progress: ProgressCallback | None = None,
) -> TransferReport:
    """Upload the tree ``local_dir`` to ``remote_dir`` on the pod (relative to its
    workdir): files, empty directories and in-tree links (``follow_links`` copies what
    links leaving the tree point at instead of refusing them).

    ``paths`` limits the upload to those entries (preflight's selection of the bundle:
    ignore file, built-in excludes, secret scan); None sends the whole tree.

    A gateway that refuses or drops connections is waited out (``reconnect``: one
    budget, backoff, the provider asked before each retry) and the transfer resumes
    from the last verified chunk; a retry of the task resumes the same way: verified
    files are skipped and partial ones continue from their last verified byte.

    ``on_progress`` (``(done_bytes, total_bytes)``, e.g. a ``TransferProgress``) sees
    each confirmed chunk, so a caller knows how far a transfer that stopped got.

    Returns:
        The verified ``TransferReport``.

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: disk full on the pod (file named), connection lost for good.
        SpecError: the method cannot work on this pod, or links leave the tree or
            dangle (each named, nothing moved).
    """
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    with borrowed_console(handle, private_key, console, reconnect) as live:
        report = upload_dir(
            live,
            handle,
            Path(local_dir),
            remote_dir,
            method=method,
            private_key=private_key,
            s3=s3,
            options=options,
            follow_links=follow_links,
            on_progress=progress_logger(logger, f"upload to {handle.pod_id}", also=on_progress),
            paths=paths,
        )
    logger.info(
        "uploaded %d files, %d bytes by %s in %.1f s (%.1f MiB/s), %d retries, verified",
        len(report.source_manifest.entries) if report.source_manifest else 0,
        report.bytes,
        report.method,
        report.seconds,
        report.bytes / max(report.seconds, 1e-6) / 2**20,
        report.retries,
    )
    return report
