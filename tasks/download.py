"""Download: the checkpoint back from the pod, verified end to end (docs/architecture.md#transfers-and-integrity).

The work is ``prefect_runpod.blocks.transfer.download_dir``; the source manifest is
computed on the pod, the destination manifest re-read from the local disk. With
``only`` (``--download eval``) just those files travel: they are copied on the pod
into a staging folder first, so the transfer and its manifests cover nothing else
(docs/architecture.md#publish-from-the-pod). When the outputs hold links that cannot
travel (absolute, leaving the tree, dangling) and ``follow_links`` is off, everything else
still travels: the tree is staged on the pod without them (hard links, so nothing is
copied twice), that is downloaded and verified, and the report names what stayed
(``TransferReport.left_on_pod``; docs/architecture.md#transfers-and-integrity).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.exceptions import LinksRefusedError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer.base import MethodOptions, ProgressCallback
from prefect_runpod.blocks.transfer.dispatch import download_dir
from prefect_runpod.blocks.transfer.models import TransferReport
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.bundle import BundleSpec
from prefect_runpod.tasks.pod_io import borrowed_console, progress_logger, retry_unless_final

__all__ = ["download", "eval_files", "stage_files_command", "stage_travelling_command"]


def eval_files(bundle: BundleSpec) -> list[str]:
    """The bundle's eval JSONL files that lie under its outputs folder, relative to it:
    what ``--download eval`` brings home. Pure."""
    base = bundle.outputs.rstrip("/") + "/"
    paths = [bundle.train_eval_jsonl, bundle.standalone_eval_jsonl]
    return [p[len(base) :] for p in paths if p.startswith(base)]


def stage_files_command(remote_dir: str, paths: list[str], staging_dir: str) -> str:
    """The pod command that copies ``paths`` (relative to ``remote_dir``, those that
    exist) into ``staging_dir`` keeping their relative paths, after emptying it. Pure."""
    q = shlex.quote
    steps = [f"rm -rf {q(staging_dir)}", f"mkdir -p {q(staging_dir)}", f"cd {q(remote_dir)}"]
    for rel in paths:
        steps.append(f"{{ [ ! -f {q(rel)} ] || cp --parents -p -- {q(rel)} {q(staging_dir)}; }}")
    return "( " + " && ".join(steps) + " )"


def stage_travelling_command(remote_dir: str, left: list[str], staging_dir: str) -> str:
    """The pod command that makes ``staging_dir`` the tree ``remote_dir`` without the
    entries ``left`` (relative paths that cannot travel): hard links where the file system
    allows (no byte is copied), else a copy; links and modes kept. Pure."""
    q = shlex.quote
    copy = f"cp -al -- {q(remote_dir)} {q(staging_dir)}"
    fallback = f"{{ rm -rf {q(staging_dir)} && cp -a -- {q(remote_dir)} {q(staging_dir)}; }}"
    drop = " ".join(q(rel) for rel in left)
    return (
        f"( rm -rf {q(staging_dir)} && mkdir -p {q(staging_dir.rsplit('/', 1)[0] or '/')} && "
        f"{{ {copy} 2>/dev/null || {fallback}; }} && cd {q(staging_dir)} && rm -rf -- {drop} )"
    )


@task(
    name="download",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_unless_final,
)
def download(
    handle: PodHandle,
    private_key: SecretStr,
    remote_dir: str,
    local_dir: Path,
    method: str = "auto",
    s3: S3Target | None = None,
    options: MethodOptions | None = None,
    console: Any = None,
    only: list[str] | None = None,
    staging_dir: str | None = None,
    follow_links: bool = False,
    reconnect: ReconnectPolicy | None = None,
    on_progress: ProgressCallback | None = None,
) -> TransferReport:
    """Download the tree ``remote_dir`` (relative to the pod's workdir unless absolute)
    into ``local_dir`` (files, empty directories, in-tree links). A gateway outage is
    waited out (``reconnect``) and the transfer resumes from the last verified chunk;
    a task retry resumes from the verified ``.part`` files.

    Args:
        only: download just these paths (relative to ``remote_dir``; absent ones are
            skipped), through ``staging_dir`` on the pod.
        staging_dir: the pod folder ``only`` is copied into (required with ``only``),
            or the tree without the links that cannot travel is staged in.
        follow_links: copy what links leaving the tree point at instead of refusing
            them.

    ``on_progress`` (``(done_bytes, total_bytes)``, e.g. a ``TransferProgress``) sees
    each confirmed chunk, so a caller knows how far a transfer that stopped got.

    Returns:
        The verified ``TransferReport``; its ``left_on_pod`` names the links that
        could not travel (with ``staging_dir``, no ``only`` and no ``follow_links``).

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: the folder is missing on the pod, or the connection kept dropping.
        LinksRefusedError: links that cannot travel, and no ``staging_dir`` to bring
            the rest through (or ``only``).
    """
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    with borrowed_console(handle, private_key, console, reconnect) as live:
        if only is not None:
            assert staging_dir is not None, "only= needs a staging_dir"
            live.run(stage_files_command(remote_dir, only, staging_dir), check=True)
            remote_dir = staging_dir

        def fetch(source: str) -> TransferReport:
            return download_dir(
                live,
                handle,
                source,
                Path(local_dir),
                method=method,
                private_key=private_key,
                s3=s3,
                options=options,
                follow_links=follow_links,
                on_progress=progress_logger(
                    logger, f"download from {handle.pod_id}", also=on_progress
                ),
            )

        try:
            report = fetch(remote_dir)
        except LinksRefusedError as exc:
            left = dict(exc.problems)
            if only is not None or staging_dir is None or not left or "." in left:
                raise
            logger.warning(
                "%d link(s) in the outputs cannot travel and stay on pod %s: %s; "
                "downloading everything else",
                len(left),
                handle.pod_id,
                "; ".join(f"{path} ({why})" for path, why in list(left.items())[:20]),
            )
            live.run(stage_travelling_command(remote_dir, list(left), staging_dir), check=True)
            report = fetch(staging_dir)
            report.left_on_pod, report.left_in = left, remote_dir
    logger.info(
        "downloaded %d bytes by %s in %.1f s, %d retries, verified",
        report.bytes,
        report.method,
        report.seconds,
        report.retries,
    )
    return report
