"""The ``s3`` transfer method: boto3 to a user bucket or a RunPod network volume.

A RunPod network volume speaks S3 (runpod docs, storage/s3-api): endpoint
``https://s3api-<dc>.runpod.io/``, ``region_name`` = the datacenter id, bucket = the
volume id, keys = file paths, and ``/workspace/x`` on a pod is ``s3://<volume>/x``.
Its limits shape this module: PutObject only under 500 MB (larger files go
multipart), parts at most 500 MB, no DeleteObjects (single deletes only), and the
first listing of a large tree may fail with "The same next token was received twice"
(retried).

Each object carries its sha256 and git blob id as user metadata; a download re-hashes what
arrived and compares with the expected manifest; a mismatch is fetched once more,
then ``ChecksumMismatchError`` names the file. On a network volume the pod-side
manifest is computed by ``manifest.py`` on the pod's own view of the files.

``s3_upload_dir`` / ``s3_download_dir`` work on a bucket alone
(:mod:`prefect_runpod.blocks.transfer.s3_objects`); ``S3Method`` is the
``TransferMethod`` that moves a pod folder through the volume it lives on.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect.filesystems import WritableFileSystem
from pydantic import Field, SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.transfer.base import MethodConfig, PodLink, ProgressCallback
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pod_tools import PodLanding, pod_manifest
from prefect_runpod.blocks.transfer.s3_objects import (
    check_s3_target,
    s3_download_dir,
    s3_object_records,
    s3_upload_dir,
)

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


class S3Target(WritableFileSystem):
    """A bucket, or a RunPod network volume through its S3 API; also a Prefect result
    storage (``read_path`` / ``write_path``: ``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK=
    runpod-s3-target/NAME``), so a flow run on a pod keeps its return value readable.

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

    def _object_key(self, path: str) -> str:
        prefix = self.prefix.strip("/")
        return f"{prefix}/{path.lstrip('/')}" if prefix else path.lstrip("/")

    async def read_path(self, path: str) -> bytes:
        """The object ``<prefix>/<path>``'s bytes (Prefect's result store reads so).

        Raises:
            botocore's ``ClientError``: no such object, or the bucket refused.
        """
        import anyio.to_thread

        def read() -> bytes:
            answer = self.get_client().get_object(Bucket=self.bucket, Key=self._object_key(path))
            return bytes(answer["Body"].read())

        return await anyio.to_thread.run_sync(read)

    async def write_path(self, path: str, content: bytes) -> None:
        """Write ``content`` to the object ``<prefix>/<path>`` (Prefect's result store
        writes so).

        Raises:
            botocore's ``ClientError``: the bucket refused.
        """
        import anyio.to_thread

        def write() -> None:
            key = self._object_key(path)
            self.get_client().put_object(Bucket=self.bucket, Key=key, Body=content)

        await anyio.to_thread.run_sync(write)

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
        """Upload the files through the network volume — those the pod does not
        already hold, verified — make the empty directories and in-tree links on the
        pod through the console, and verify on the pod; a file the pod sees differently
        is uploaded once more.

        Raises:
            SpecError: no target, or ``remote_root`` is not under the volume's mount.
            ChecksumMismatchError: a file seen by the pod differs after one re-upload.
            TransferError: as ``s3_upload_dir``.
        """
        target = self._target(pod)
        key_prefix = _volume_prefix(target, pod.handle, remote_root)
        landing = PodLanding(pod.console, pod.handle, remote_root, source)

        def send(files: Manifest, again: bool) -> None:
            done = source.total_bytes - files.total_bytes

            def progress(up: int, _total: int) -> None:
                if on_progress:
                    on_progress(done + up, source.total_bytes)

            s3_upload_dir(target, local_root, key_prefix, files, None if again else progress)

        return landing.send_missing(
            send,
            method="s3",
            next_step="the network volume may serve a stale copy: rerun, or use method 'pty'",
        )

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
