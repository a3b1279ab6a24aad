"""Upload: the bundle to the pod, verified end to end (docs/architecture.md#transfers-and-integrity).

The work is ``prefect_runpod.blocks.transfer.upload_dir``; this task opens (or reuses)
a console, logs progress, and returns the ``TransferReport`` whose manifests go into
the RunReport and the ``checksum-manifest`` artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer.base import MethodOptions
from prefect_runpod.blocks.transfer.dispatch import upload_dir
from prefect_runpod.blocks.transfer.models import TransferReport
from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["progress_logger", "upload"]


def progress_logger(logger: Any, what: str, step_fraction: float = 0.1) -> Any:
    """An ``on_progress(done_bytes, total_bytes)`` that logs every ``step_fraction``."""
    state = {"next": 0.0}

    def _log(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if frac >= state["next"]:
            logger.info("%s: %d/%d bytes (%.0f%%)", what, done, total, 100 * frac)
            state["next"] = frac + step_fraction

    return _log


@task(name="upload", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def upload(
    handle: PodHandle,
    private_key: SecretStr,
    local_dir: Path,
    remote_dir: str,
    method: str = "auto",
    s3: S3Target | None = None,
    options: MethodOptions | None = None,
    console: Any = None,
) -> TransferReport:
    """Upload ``local_dir`` to ``remote_dir`` on the pod (relative to its workdir).

    A retry of the task resumes: verified files are skipped and partial ones continue
    from their last verified byte.

    Returns:
        The verified ``TransferReport``.

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: disk full on the pod (file named), connection lost for good.
        SpecError: the method cannot work on this pod.
    """
    from prefect.logging import get_run_logger

    from prefect_runpod.blocks.console.session import PodConsole

    logger = get_run_logger()
    live = console if console is not None else PodConsole.for_pod(handle, private_key)
    try:
        report = upload_dir(
            live,
            handle,
            Path(local_dir),
            remote_dir,
            method=method,
            private_key=private_key,
            s3=s3,
            options=options,
            on_progress=progress_logger(logger, f"upload to {handle.pod_id}"),
        )
    finally:
        if console is None:
            live.close()
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
