"""Checksum: re-hash the downloaded tree locally and compare with the pod's manifest,
and report what was verified where (docs/architecture.md#publish-from-the-pod).

``verify_manifest`` is the plain function: every file is hashed again, every empty
directory must be a directory, every link a link with the same target. The
``checksum`` task adds the ``checksum-manifest`` table artifact (one row per entry:
path, kind, bytes, sha256, its status locally and at the publish destination)
and raises ``ChecksumMismatchError`` naming the first entry that differs. Nothing
mismatched is ever accepted.
``verification_records`` sums up each place — the local download, the Hub, S3 — for
the ``RunReport``; ``extra_entries`` names what the local folder holds beside the run's
outputs (an earlier run's files, kept with ``overwrite``), so no count claims them.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_runpod.blocks.exceptions import ChecksumMismatchError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.publish.base import publish_kind
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.tasks.models import PublishReport, VerificationRecord

__all__ = [
    "checksum",
    "extra_entries",
    "manifest_rows",
    "verification_records",
    "verify_manifest",
]


def verify_manifest(local_dir: Path, expected: Manifest) -> tuple[Manifest, list[tuple[str, str]]]:
    """Check the tree of ``expected`` under ``local_dir``: files re-hashed, empty
    directories and links (never followed) compared by kind and target.

    Returns:
        ``(local_manifest, problems)``; ``problems`` lists ``(path, why)`` (missing
        entries are listed, not raised).
    """
    paths = [e.path for e in expected.entries]
    present = [p for p in paths if os.path.lexists(Path(local_dir).joinpath(*p.split("/")))]
    local = mf.compute_manifest(str(local_dir), present)
    problems = mf.compare_manifests(expected.as_dict(), local)
    return Manifest.from_dict(local), problems


_EXTRA = "extra: not from this run, not verified"


def extra_entries(local_dir: Path, expected: Manifest) -> list[str]:
    """The entries under ``local_dir`` (files, links, empty directories; links never
    followed, transfer scratch left out) that ``expected`` does not list, sorted: what an
    earlier run left in a reused output folder."""
    if not Path(local_dir).is_dir():
        return []
    items, problems = mf.scan_tree(str(local_dir))
    listed = {e.path for e in expected.entries}
    found = [rel for rel, _kind, _target in items] + [rel for rel, _why in problems]
    return sorted(rel for rel in found if rel not in listed)


def manifest_rows(
    expected: Manifest | None,
    problems: list[tuple[str, str]],
    published: PublishReport | None = None,
) -> list[dict[str, object]]:
    """Rows of the ``checksum-manifest`` table: path, kind (``file``, ``dir``, or
    ``link -> target``), size_bytes, sha256, ``local`` (the downloaded copy:
    ``ok``, ``MISMATCH: …`` or ``not downloaded``) and, when the run published,
    ``destination`` (``ok (lfs)``, ``ok (regular)``, ``ok (s3)``)."""
    bad = dict(problems)
    local = {e.path: e for e in expected.entries} if expected is not None else {}
    remote = {f.path: f for f in published.files} if published is not None else {}
    rows: list[dict[str, object]] = []
    for path in sorted(set(local) | set(remote)):
        entry, sent = local.get(path), remote.get(path)
        row: dict[str, object] = {
            "path": path,
            "kind": (f"link -> {entry.target}" if entry.kind == "link" else entry.kind)
            if entry
            else "file",
            "size_bytes": entry.size_bytes if entry else sent.size_bytes if sent else 0,
            "sha256": entry.sha256 if entry else sent.sha256 if sent else "",
            "local": (f"MISMATCH: {bad[path]}" if path in bad else "ok")
            if entry
            else "not downloaded",
        }
        if published is not None:
            row["destination"] = (
                f"{'ok' if sent.verified else 'MISMATCH'} ({sent.storage})" if sent else "-"
            )
        rows.append(row)
    return rows


def verification_records(
    local_dir: Path | None,
    local: Manifest | None,
    published: PublishReport | None,
    extra: list[str] | None = None,
) -> list[VerificationRecord]:
    """One record per place the outputs were verified: the local download (re-hashed
    here; ``extra`` names what else that folder holds) and the publish destination (its
    own records read back). Pure."""
    records = []
    if local is not None and local_dir is not None:
        records.append(
            VerificationRecord(
                where="local",
                location=str(local_dir),
                files=len(local.files),
                bytes=local.total_bytes,
                verified=True,
                how="sha256 re-hashed on this machine",
                extra=list(extra or []),
            )
        )
    if published is not None:
        kind = publish_kind(published.kind)
        records.append(
            VerificationRecord(
                where=kind.where,
                location=kind.verified_location(published.target, published.revision),
                files=len(published.files),
                bytes=published.bytes,
                verified=published.verified,
                how=kind.how,
            )
        )
    return records


@task(name="checksum", cache_policy=NO_CACHE, retries=0)
def checksum(
    local_dir: Path,
    pod_manifest: Manifest | None,
    pod_id: str | None = None,
    published: PublishReport | None = None,
) -> Manifest | None:
    """Verify the downloaded tree against the manifest computed on the pod, and table
    what was verified where.

    Args:
        local_dir: where the outputs were downloaded.
        pod_manifest: the download's pod-side manifest; None when nothing was downloaded.
        pod_id: the pod, named in errors.
        published: the publish stage's report, already verified at its destination.

    Returns:
        The local manifest (equal to ``pod_manifest`` entry for entry), or None when
        nothing was downloaded.

    Raises:
        ChecksumMismatchError: a file is missing or differs (``path`` names it).
    """
    from prefect.logging import get_run_logger

    from prefect_runpod.blocks.api_outbox import outbox
    from prefect_runpod.blocks.held_artifacts import hold_artifact

    local, problems = (
        (None, []) if pod_manifest is None else verify_manifest(Path(local_dir), pod_manifest)
    )
    extra = extra_entries(Path(local_dir), pod_manifest) if pod_manifest is not None else []
    places = verification_records(
        Path(local_dir), local if not problems else None, published, extra
    )
    where = ", ".join(f"{r.where}: {r.files} files" for r in places) or "nothing"
    if pod_manifest is not None:
        verdict = "all verified" if not problems else f"{len(problems)} MISMATCHED"
        shape = len(pod_manifest.entries) - len(pod_manifest.files)
        summary = (
            f"{len(pod_manifest.files)} files, {pod_manifest.total_bytes} bytes, {verdict} "
            f"(sha256){f', {shape} dirs/links' if shape else ''}; verified at {where}"
        )
    else:
        summary = f"nothing downloaded; verified at {where}"
    if extra:
        summary += f"; {len(extra)} more in the folder not from this run"
    rows = manifest_rows(pod_manifest, problems, published)
    for path in extra:  # the table's columns, as manifest_rows names them
        rows.append(dict(path=path, kind="-", size_bytes=0, sha256="", local=_EXTRA))
    hold_artifact("checksum-manifest", "table", rows, summary)
    outbox().flush()  # in Prefect before the stage ends, unless the API is down
    if problems:
        path, why = problems[0]
        raise ChecksumMismatchError(
            f"{path} in {local_dir} does not match the pod's copy ({why}); "
            "download it again before using the checkpoint",
            path=path,
            pod_id=pod_id,
            stage="checksum",
        )
    logger = get_run_logger()
    if extra:
        logger.warning(
            "checksum: %s also holds %d entr%s this run did not bring (not verified): %s",
            local_dir,
            len(extra),
            "y" if len(extra) == 1 else "ies",
            ", ".join(extra[:20]) + (f" and {len(extra) - 20} more" if len(extra) > 20 else ""),
        )
    for place in places:
        logger.info(
            "checksum: %s: %d files (%d bytes) verified at %s (%s)",
            place.where,
            place.files,
            place.bytes,
            place.location,
            place.how,
        )
    return local
