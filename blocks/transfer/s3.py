"""The ``s3`` transfer method: boto3 to a user bucket or a RunPod network volume.

A RunPod network volume speaks S3 (runpod docs, storage/s3-api): endpoint
``https://s3api-<dc>.runpod.io/``, ``region_name`` = the datacenter id, bucket = the
volume id, keys = file paths, and ``/workspace/x`` on a pod is ``s3://<volume>/x``.
Its limits shape this module: PutObject only under 500 MB (larger files go
multipart), parts at most 500 MB, no DeleteObjects (single deletes only), and the
first listing of a large tree may fail with "The same next token was received twice"
(retried).

Each object carries its sha256, md5 and git blob id as user metadata; a download re-hashes what
arrived and compares with the expected manifest; a mismatch is fetched once more,
then ``ChecksumMismatchError`` names the file. On a network volume the pod-side
manifest is computed by ``manifest.py`` on the pod's own view of the files.

``s3_upload_dir`` / ``s3_download_dir`` work on a bucket alone; ``S3Method`` is the
``TransferMethod`` that moves a pod folder through the volume it lives on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, SpecError, TransferError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import MethodConfig, PodLink, ProgressCallback
from prefect_runpod.blocks.transfer.models import Manifest, ManifestEntry, MethodResult
from prefect_runpod.blocks.transfer.pod_tools import pod_manifest

if TYPE_CHECKING:
    from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = [
    "MAX_PART_BYTES",
    "S3Method",
    "S3Target",
    "check_s3_target",
    "s3_download_dir",
    "s3_object_records",
    "s3_upload_dir",
]

MAX_PART_BYTES = 500 * 1000 * 1000
"""RunPod's S3 API: the largest PutObject and the largest multipart part (500 MB)."""
_NO_TARGET = "transfer method 's3' needs an S3Target (bucket or network volume)"
_NOT_A_VOLUME = (
    "transfer method 's3' moves files through a RunPod network volume the pod sees under "
    "S3Target.volume_mount_path; {bucket} has none (a plain bucket): transfer with pty or "
    "sftp, and ship outputs into the bucket from the pod with --publish s3"
)


class S3Target(Block):
    """A bucket, or a RunPod network volume through its S3 API.

    Attributes:
        bucket: the bucket name (for a network volume: its id).
        endpoint_url: ``https://s3api-<dc>.runpod.io/`` for a volume; None for AWS.
        region_name: the region (for a volume: the datacenter id, e.g. ``EU-RO-1``).
        access_key_id / secret_access_key: the S3 key (RunPod: ``user_…`` / ``rps_…``,
            separate from the API key).
        prefix: key prefix for a user bucket.
        volume_mount_path: where the volume appears on the pod (``/workspace``); None
            for a user bucket the pod cannot see.
        multipart_threshold_bytes / part_bytes: multipart above this size, in parts of
            this size (both ≤ 500 MB for RunPod).
    """

    _block_type_name = "RunPod S3 Target"
    _description = "A bucket or a RunPod network volume (S3 API) for moving files to pods."

    _documentation_url = "https://docs.runpod.io/storage/s3-api"  # type: ignore[assignment]

    bucket: str = Field(description="Bucket name; for a RunPod network volume, the volume's id.")
    endpoint_url: str | None = Field(
        default=None,
        title="Endpoint URL",
        description="S3 endpoint, e.g. https://s3api-eu-ro-1.runpod.io/ for a volume; empty for AWS.",
    )
    region_name: str | None = Field(
        default=None,
        description="Region; for a RunPod network volume, its datacenter id (e.g. EU-RO-1).",
    )
    access_key_id: str | None = Field(
        default=None,
        title="Access key ID",
        description="S3 access key id (RunPod: user_…, separate from the API key).",
    )
    secret_access_key: SecretStr | None = Field(
        default=None, description="S3 secret key (RunPod: rps_…); never logged."
    )
    prefix: str = Field(default="", description="Key prefix for objects in a user bucket.")
    volume_mount_path: str | None = Field(
        default=None,
        description="Where the volume appears on the pod (/workspace); empty for a user bucket.",
    )
    multipart_threshold_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        le=MAX_PART_BYTES,
        description="Files above this many bytes go up in parts (RunPod allows ≤ 500 MB).",
    )
    part_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        le=MAX_PART_BYTES,
        description="Size of each multipart part in bytes (RunPod allows ≤ 500 MB).",
    )

    def get_client(self) -> Any:
        """A boto3 S3 client for this target (the secret is unwrapped only here, and
        registered for masking: ``blocks.secret_mask``)."""
        import boto3
        from botocore.config import Config

        from prefect_runpod.blocks.secret_mask import register

        register(self.secret_access_key)

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region_name,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=(
                self.secret_access_key.get_secret_value() if self.secret_access_key else None
            ),
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}
            ),
        )

    def transfer_config(self) -> Any:
        """boto3's ``TransferConfig`` honouring the 500 MB limits."""
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold_bytes,
            multipart_chunksize=self.part_bytes,
            max_concurrency=4,
        )

    def key_for(self, rel: str, key_prefix: str = "") -> str:
        """The object key of relative path ``rel`` under ``prefix``/``key_prefix``."""
        parts = [p.strip("/") for p in (self.prefix, key_prefix, rel) if p.strip("/")]
        return "/".join(parts)


def _digest_metadata(entry: ManifestEntry) -> dict[str, str]:
    """The user metadata an object carries: the file's sha256, md5 and git blob id."""
    meta = {"sha256": entry.sha256, "md5": entry.md5}
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
    each object carrying its sha256 and md5 as user metadata (directory and link
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
            the sha256/md5 stored in each object's metadata at upload.
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
    retries = 0
    todo = mf.file_entries(wanted)
    for attempt in range(2):
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
        made = mf.apply_structure(str(local_dir), wanted["entries"])
        if made:
            listed = "; ".join(f"{path} ({why})" for path, why in made[:20])
            raise TransferError(f"could not make {listed} under {local_dir}")
        dest_manifest = mf.compute_manifest(str(local_dir), [e["path"] for e in wanted["entries"]])
        problems = mf.compare_manifests(wanted, dest_manifest)
        if not problems:
            return MethodResult(
                bytes=total,
                retries=retries,
                source_manifest=Manifest.from_dict(wanted),
                dest_manifest=Manifest.from_dict(dest_manifest),
            )
        if attempt == 1:
            path, why = problems[0]
            raise ChecksumMismatchError(
                f"{path} from s3://{target.bucket}/{prefix} differs from its manifest after a "
                f"retry ({why}); the object changed or is damaged — re-upload it",
                path=path,
                stage="download",
            )
        bad = {p for p, _ in problems}
        todo = [e for e in mf.file_entries(wanted) if e["path"] in bad]
        retries += len(todo)
    raise AssertionError("unreachable")


def _volume_prefix(target: S3Target, handle: PodHandle, remote: str) -> str:
    mount = (target.volume_mount_path or "").rstrip("/")
    if not mount or not (remote == mount or remote.startswith(mount + "/")):
        raise SpecError(
            f"pod {handle.pod_id}: the s3 method moves files through a network volume, so "
            f"the pod folder must be under its mount ({target.volume_mount_path or 'unset'}), "
            f"not {remote}; set S3Target.volume_mount_path or use method 'pty'",
            pod_id=handle.pod_id,
        )
    return remote[len(mount) :].strip("/")


class S3Method:
    """The ``s3`` ``TransferMethod``: a pod folder on a network volume, moved through the
    volume's S3 API and verified by ``manifest.py`` on the pod's own view of the files.
    ``auto`` picks it first whenever a network volume (a target with a
    ``volume_mount_path``) is configured.

    Args:
        target: the bucket or network volume; without one the method is unavailable.
    """

    auto_priority: int | None = 30

    def __init__(self, target: S3Target | None = None, *, follow_links: bool = False):
        self.target = target
        self.follow_links = follow_links

    @classmethod
    def from_config(cls, config: MethodConfig) -> S3Method:
        """The method on the caller's ``S3Target``, with the caller's link choice."""
        return cls(config.s3, follow_links=config.follow_links)

    def unavailable(self, handle: PodHandle) -> str | None:
        """A message when no target is configured, or when it is a plain bucket the pod
        cannot see (no ``volume_mount_path``: only a network volume links S3 to the
        pod's disk; a plain bucket is for ``--publish s3``), else None."""
        if self.target is None:
            return _NO_TARGET
        if not self.target.volume_mount_path:
            return _NOT_A_VOLUME.format(bucket=self.target.bucket)
        return None

    def pod_unavailable(self, pod: PodLink) -> str | None:
        """Always None: the pod side is ``manifest.py``, one of the pod tools."""
        return None

    def _target(self, pod: PodLink) -> S3Target:
        if self.target is None:
            raise SpecError(_NO_TARGET, pod_id=pod.pod_id)
        return self.target

    def upload(
        self,
        pod: PodLink,
        local_root: Path,
        remote_root: str,
        source: Manifest,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Upload the files through the network volume, make the empty directories and
        in-tree links on the pod through the console, and verify on the pod; a file the
        pod sees differently is uploaded once more.

        Raises:
            SpecError: no target, or ``remote_root`` is not under the volume's mount.
            ChecksumMismatchError: a file seen by the pod differs after one re-upload.
            TransferError: as ``s3_upload_dir``.
        """
        target = self._target(pod)
        key_prefix = _volume_prefix(target, pod.handle, remote_root)
        s3_upload_dir(target, local_root, key_prefix, source, on_progress)
        expected = source.as_dict()
        paths = [e.path for e in source.entries]
        structure = [e for e in expected["entries"] if e.get("kind", "file") != "file"]
        for attempt in range(2):
            dest = pod_manifest(pod.console, pod.handle, remote_root, paths, structure=structure)
            problems = mf.compare_manifests(expected, dest)
            if not problems:
                return MethodResult(
                    bytes=source.total_bytes,
                    retries=attempt,
                    source_manifest=source,
                    dest_manifest=Manifest.from_dict(dest),
                )
            if attempt == 1:
                path, why = problems[0]
                raise ChecksumMismatchError(
                    f"{path} as seen on pod {pod.pod_id} differs after a re-upload ({why})",
                    path=path,
                    pod_id=pod.pod_id,
                    stage="upload",
                )
            bad = {p for p, _ in problems}
            again = source.model_copy(
                update={"entries": [e for e in source.entries if e.path in bad]}
            )
            s3_upload_dir(target, local_root, key_prefix, again)
        raise AssertionError("unreachable")

    def download(
        self,
        pod: PodLink,
        remote_root: str,
        local_root: Path,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MethodResult:
        """Download a pod folder that lives on the network volume, verified against the
        manifest the pod computes over its own tree (empty directories and in-tree links
        are made here).

        Raises:
            SpecError: as ``upload``; links on the pod that leave the tree or dangle
                (each named; with ``follow_links`` too: objects are found by their path
                on the volume, so this method cannot read through a link).
            ChecksumMismatchError, TransferError: as ``s3_download_dir``.
        """
        target = self._target(pod)
        key_prefix = _volume_prefix(target, pod.handle, remote_root)
        try:
            found = pod_manifest(pod.console, pod.handle, remote_root)
        except SpecError as exc:
            if not self.follow_links:
                raise
            raise SpecError(
                f"{exc}. The s3 method fetches objects by their path on the volume and "
                "cannot copy through a link: download with method 'pty' or 'sftp'",
                pod_id=pod.pod_id,
            ) from exc
        source = Manifest.from_dict(found)
        return s3_download_dir(target, key_prefix, local_root, source, on_progress)
