"""Objects in an S3 bucket or a RunPod network volume, through boto3: a tree uploaded
with each file's digests as object metadata (:func:`s3_upload_dir`), downloaded and
verified against its manifest (:func:`s3_download_dir`), the objects' own records read
back without downloading (:func:`s3_object_records`), and the bucket checked before
anything is rented (:func:`check_s3_target`).

The bucket is an ``S3Target`` (:mod:`prefect_runpod.blocks.transfer.s3`, which also
holds the ``s3`` transfer method built on these).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import ProgressCallback
from prefect_runpod.blocks.transfer.models import Manifest, ManifestEntry, MethodResult
from prefect_runpod.blocks.transfer.verify import local_tree_manifest, verify_resending_once

if TYPE_CHECKING:
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["check_s3_target", "s3_download_dir", "s3_object_records", "s3_upload_dir"]


def _digest_metadata(entry: ManifestEntry) -> dict[str, str]:
    """The user metadata an object carries: the file's sha256 and git blob id."""
    meta = {"sha256": entry.sha256}
    if entry.git_sha1:
        meta["git_sha1"] = entry.git_sha1
    return meta


def s3_upload_dir(
    target: S3Target,
    local_dir: Path,
    key_prefix: str,
    source: Manifest | None = None,
    on_progress: ProgressCallback | None = None,
) -> list[str]:
    """Upload every file of ``source`` (a manifest of ``local_dir``) under ``key_prefix``,
    each object carrying its sha256 and git blob id as user metadata (directory and link
    entries are not objects: ``S3Method`` makes them on the pod).

    Args:
        target: the bucket or network volume.
        local_dir: the local tree (or single file).
        key_prefix: object keys start with ``target.prefix`` / ``key_prefix``.
        source: the files to send; default ``Manifest.compute(local_dir)``.
        on_progress: ``(done_bytes, total_bytes)`` after each file.

    Returns:
        The object keys written, in ``source`` order.

    Raises:
        TransferError: S3 refused an upload (the file and the S3 error named).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if source is None:
        source = Manifest.compute(local_dir)
    client, config = target.get_client(), target.transfer_config()
    single = local_dir.is_file()
    total = source.total_bytes
    done = 0
    keys = []
    for e in source.files:
        path = local_dir if single else local_dir.joinpath(*e.path.split("/"))
        key = target.key_for(e.path, key_prefix)
        try:
            client.upload_file(
                str(path),
                target.bucket,
                key,
                Config=config,
                ExtraArgs={"Metadata": _digest_metadata(e)},
            )
        except (BotoCoreError, ClientError) as exc:
            raise TransferError(
                f"uploading {e.path} to s3://{target.bucket}/{key} failed: "
                f"{exc}; check the bucket, key and quota"
            ) from exc
        keys.append(key)
        done += e.size_bytes
        if on_progress:
            on_progress(done, total)
    return keys


def check_s3_target(target: S3Target) -> None:
    """Make sure the bucket answers with these credentials (``HeadBucket``), before
    anything is rented.

    Raises:
        SpecError: naming the bucket and the endpoint, when it is missing, refused or
            unreachable.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    where = f"s3://{target.bucket} at {target.endpoint_url or 'AWS'}"
    try:
        target.get_client().head_bucket(Bucket=target.bucket)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        raise SpecError(
            f"the S3 target {where} answered {status} "
            f"({exc.response.get('Error', {}).get('Code', '?')}): check the bucket name "
            "(for a RunPod network volume, its id) and the S3 key of the S3Target block"
        ) from exc
    except (BotoCoreError, ValueError) as exc:
        raise SpecError(
            f"cannot reach the S3 target {where} ({type(exc).__name__}: {exc}); check the "
            "endpoint URL and the network"
        ) from exc


def s3_object_records(target: S3Target, keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    """What the bucket holds for each object (``HeadObject``), nothing downloaded.

    Args:
        target: the bucket.
        keys: relative path → object key.

    Returns:
        relative path → ``{"size": bytes (ContentLength), "sha256": the object's
        ``sha256`` metadata or None, "key": the key}``; absent objects are left out.
        The ETag is never used: RunPod's S3 computes MD5 ETags late.

    Raises:
        TransferError: S3 failed for another reason than a missing object.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    client = target.get_client()
    out: dict[str, dict[str, Any]] = {}
    for rel, key in keys.items():
        try:
            head = client.head_object(Bucket=target.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                continue
            raise TransferError(f"reading s3://{target.bucket}/{key} back failed: {exc}") from exc
        except BotoCoreError as exc:
            raise TransferError(f"reading s3://{target.bucket}/{key} back failed: {exc}") from exc
        out[rel] = {
            "size": head.get("ContentLength"),
            "sha256": (head.get("Metadata") or {}).get("sha256"),
            "key": key,
        }
    return out


def _list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    from botocore.exceptions import ClientError

    for attempt in range(3):
        try:
            out = []
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                out.extend(page.get("Contents", []))
            return out
        except (ClientError, RuntimeError) as exc:  # RunPod: "same next token … twice"
            if attempt == 2 or "next token" not in str(exc):
                raise
            time.sleep(1.0 + attempt)
    return []


def s3_download_dir(
    target: S3Target,
    key_prefix: str,
    local_dir: Path,
    expected: Manifest | None = None,
    on_progress: ProgressCallback | None = None,
) -> MethodResult:
    """Download the objects under ``key_prefix`` into ``local_dir`` and verify them.

    Args:
        target: the bucket or network volume.
        key_prefix: as for ``s3_upload_dir``.
        local_dir: where the tree lands (created when missing).
        expected: the manifest to verify against (e.g. computed on the pod); default:
            the sha256 stored in each object's metadata at upload.
        on_progress: ``(done_bytes, total_bytes)`` after each file.

    Returns:
        ``MethodResult``: ``source_manifest`` is ``expected`` (or the one read from the
        objects' metadata), ``dest_manifest`` re-read from the local disk.

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: nothing under the prefix, or S3 failed.
    """
    client, config = target.get_client(), target.transfer_config()
    base = target.key_for("", key_prefix)
    prefix = base + "/" if base else ""
    wanted = expected.as_dict() if expected is not None else None
    if wanted is None:
        entries = []
        for obj in _list_objects(client, target.bucket, prefix):
            rel = obj["Key"][len(prefix) :]
            if not rel or rel.endswith("/"):
                continue  # RunPod lists empty directories too
            meta = client.head_object(Bucket=target.bucket, Key=obj["Key"]).get("Metadata", {})
            entries.append(
                {
                    "path": rel,
                    "size_bytes": obj["Size"],
                    "md5": meta.get("md5", ""),
                    "sha256": meta.get("sha256", ""),
                    "git_sha1": meta.get("git_sha1"),
                }
            )
        if not entries:
            raise TransferError(f"nothing under s3://{target.bucket}/{prefix}; check the prefix")
        wanted = {
            "root": f"s3://{target.bucket}/{prefix}",
            "entries": sorted(entries, key=lambda x: x["path"]),
        }
    total = sum(e["size_bytes"] for e in wanted["entries"])
    retries = sent = 0

    def fetch(todo: list[dict[str, Any]]) -> None:
        nonlocal sent
        sent += sum(e["size_bytes"] for e in todo)
        done = 0
        for e in todo:
            dest = local_dir.joinpath(*e["path"].split("/"))
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = Path(str(dest) + mf.PART_SUFFIX)
            client.download_file(target.bucket, prefix + e["path"], str(part), Config=config)
            os.replace(part, dest)
            done += e["size_bytes"]
            if on_progress:
                on_progress(done, total)

    def resend(bad: set[str]) -> None:
        nonlocal retries
        again = [e for e in mf.file_entries(wanted) if e["path"] in bad]
        retries += len(again)
        fetch(again)

    fetch(mf.file_entries(wanted))
    dest_manifest = verify_resending_once(
        wanted,
        lambda: local_tree_manifest(local_dir, wanted, None),
        resend,
        method="s3",
        direction="download",
        where=f"s3://{target.bucket}/{prefix}",
        next_step="the object changed or is damaged — re-upload it",
    )
    return MethodResult(
        bytes=total,
        sent_bytes=sent,
        retries=retries,
        source_manifest=Manifest.from_dict(wanted),
        dest_manifest=Manifest.from_dict(dest_manifest),
    )
