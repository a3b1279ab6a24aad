"""Download: the checkpoint back from the pod, verified end to end (docs/architecture.md#transfers-and-integrity).

The work is ``prefect_runpod.blocks.transfer.download_dir``; the source manifest is
computed on the pod, the destination manifest re-read from the local disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer.base import MethodOptions
from prefect_runpod.blocks.transfer.dispatch import download_dir
from prefect_runpod.blocks.transfer.models import TransferReport
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.upload import borrowed_console, progress_logger

__all__ = ["download"]


@task(name="download", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def download(
    handle: PodHandle,
    private_key: SecretStr,
    remote_dir: str,
    local_dir: Path,
    method: str = "auto",
    s3: S3Target | None = None,
    options: MethodOptions | None = None,
    console: Any = None,
) -> TransferReport:
    """Download ``remote_dir`` (relative to the pod's workdir unless absolute) into
    ``local_dir``; a task retry resumes from the verified ``.part`` files.

    Returns:
        The verified ``TransferReport``.

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: the folder is missing on the pod, or the connection kept dropping.
    """
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    with borrowed_console(handle, private_key, console) as live:
        report = download_dir(
            live,
            handle,
            remote_dir,
            Path(local_dir),
            method=method,
            private_key=private_key,
            s3=s3,
            options=options,
            on_progress=progress_logger(logger, f"download from {handle.pod_id}"),
        )
    logger.info(
        "downloaded %d bytes by %s in %.1f s, %d retries, verified",
        report.bytes,
        report.method,
        report.seconds,
        report.retries,
    )
    return report
