"""Checksum: re-hash the downloaded files locally and compare with the pod's manifest.

``verify_manifest`` is the plain function; the ``checksum`` task adds the
``checksum-manifest`` table artifact (one row per file: path, bytes, md5, sha256,
status) and raises ``ChecksumMismatchError`` naming the first file that differs.
Nothing mismatched is ever accepted.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_runpod.blocks.exceptions import ChecksumMismatchError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest

__all__ = ["checksum", "manifest_rows", "verify_manifest"]


def verify_manifest(local_dir: Path, expected: Manifest) -> tuple[Manifest, list[tuple[str, str]]]:
    """Hash the files of ``expected`` under ``local_dir``.

    Returns:
        ``(local_manifest, problems)``; ``problems`` lists ``(path, why)`` (missing
        files are listed, not raised).
    """
    paths = [e.path for e in expected.entries]
    present = [p for p in paths if Path(local_dir).joinpath(*p.split("/")).is_file()]
    local = mf.compute_manifest(str(local_dir), present)
    problems = mf.compare_manifests(expected.as_dict(), local)
    return Manifest.from_dict(local), problems


def manifest_rows(expected: Manifest, problems: list[tuple[str, str]]) -> list[dict[str, object]]:
    """Rows of the ``checksum-manifest`` table: path, size_bytes, md5, sha256, status."""
    bad = dict(problems)
    return [
        {
            "path": e.path,
            "size_bytes": e.size_bytes,
            "md5": e.md5,
            "sha256": e.sha256,
            "status": f"MISMATCH: {bad[e.path]}" if e.path in bad else "ok",
        }
        for e in expected.entries
    ]


@task(name="checksum", cache_policy=NO_CACHE, retries=0)
def checksum(local_dir: Path, pod_manifest: Manifest, pod_id: str | None = None) -> Manifest:
    """Verify the downloaded tree against the manifest computed on the pod.

    Returns:
        The local manifest (equal to ``pod_manifest`` entry for entry).

    Raises:
        ChecksumMismatchError: a file is missing or differs (``path`` names it).
    """
    from prefect.artifacts import create_table_artifact
    from prefect.logging import get_run_logger

    local, problems = verify_manifest(Path(local_dir), pod_manifest)
    create_table_artifact(
        manifest_rows(pod_manifest, problems),
        key="checksum-manifest",
        description=f"{len(pod_manifest.entries)} files, {pod_manifest.total_bytes} bytes, "
        f"{'all verified' if not problems else f'{len(problems)} MISMATCHED'} (md5 + sha256)",
    )
    if problems:
        path, why = problems[0]
        raise ChecksumMismatchError(
            f"{path} in {local_dir} does not match the pod's copy ({why}); "
            "download it again before using the checkpoint",
            path=path,
            pod_id=pod_id,
            stage="checksum",
        )
    get_run_logger().info("checksum: %d files verified (md5 + sha256)", len(local.entries))
    return local
