"""The publish stage's pure parts (docs/architecture.md#publish-from-the-pod): the
command line that runs the pod-side publisher (:func:`publisher_command`, never a
secret in it) and its deadline (:func:`timeout_for`), the publisher's answer in the
console output (:func:`parse_publish_output`), and the check of what the destination
recorded against the pod-side manifest (:func:`verify_published`).

:mod:`prefect_runpod.tasks.publish` runs them on the pod and reads the records back.
"""

from __future__ import annotations

import shlex
from typing import Any

from prefect_runpod.blocks.console.terminal_text import last_json_object
from prefect_runpod.blocks.huggingface import DEFAULT_HF_ENDPOINT
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.models import PublishedFile, PublishTarget

__all__ = ["parse_publish_output", "publisher_command", "timeout_for", "verify_published"]

_RESULT_KIND = "publish_result"


def timeout_for(total_bytes: int) -> float:
    """The publish command's deadline in seconds: 10 minutes plus 1 s per MiB (a pod's
    link to the Hub is far faster; this only bounds a stuck upload)."""
    return 600.0 + total_bytes / (1024 * 1024)


def verify_published(
    manifest: Manifest, records: dict[str, dict[str, Any]], kind: str
) -> tuple[list[PublishedFile], list[tuple[str, str]]]:
    """Compare what the destination recorded with the pod-side manifest. Pure.

    The Hub (``hub_file_records``): an LFS file must carry ``lfs_sha256`` = the
    manifest's sha256 and ``lfs_size`` = its size; a regular file's ``blob_id`` (git's
    object id) must equal the manifest's ``git_sha1`` and its ``size`` the size.
    S3 (``s3_object_records``): the object's ``sha256`` metadata and its
    ``ContentLength``.

    Args:
        manifest: computed on the pod before the upload.
        records: path → the destination's record.
        kind: ``hf`` or ``s3``.

    Returns:
        ``(files, problems)``: one :class:`PublishedFile` per file of the manifest
        (directories and links are not published), and ``(path, why)`` for each file
        that is missing or differs.
    """
    files: list[PublishedFile] = []
    problems: list[tuple[str, str]] = []
    for entry in manifest.files:
        record = records.get(entry.path)
        storage: str = "s3" if kind == "s3" else "regular"
        remote: str | None = None
        why: str | None = None
        if record is None:
            why = "missing at the destination"
        elif kind == "s3":
            remote = record.get("sha256")
            if record.get("size") != entry.size_bytes:
                why = f"size {entry.size_bytes} != {record.get('size')}"
            elif remote != entry.sha256:
                why = f"sha256 {entry.sha256} != {remote}"
        elif record.get("lfs_sha256"):
            storage, remote = "lfs", record["lfs_sha256"]
            if record.get("lfs_size") != entry.size_bytes:
                why = f"size {entry.size_bytes} != {record.get('lfs_size')}"
            elif remote != entry.sha256:
                why = f"sha256 {entry.sha256} != {remote}"
        else:
            remote = record.get("blob_id")
            if record.get("size") != entry.size_bytes:
                why = f"size {entry.size_bytes} != {record.get('size')}"
            elif entry.git_sha1 is None:
                why = "the pod's manifest has no git blob id to compare"
            elif remote != entry.git_sha1:
                why = f"git blob id {entry.git_sha1} != {remote}"
        if why is not None:
            problems.append((entry.path, why))
        files.append(
            PublishedFile(
                path=entry.path,
                size_bytes=entry.size_bytes,
                sha256=entry.sha256,
                git_sha1=entry.git_sha1,
                storage=storage,  # type: ignore[arg-type]
                remote_id=remote,
                verified=why is None,
            )
        )
    return files, problems


def publisher_command(
    python: str,
    script: str,
    target: PublishTarget,
    root: str,
    paths: list[str],
    *,
    hf_endpoint: str | None = None,
    s3: S3Target | None = None,
    key_prefix: str = "",
    deadline_seconds: float = 3600.0,
) -> str:
    """The command line that runs the pod-side publisher. Pure; it never holds a secret
    (those are in the shell's environment).

    Args:
        python: the publish Python on the pod (the env stage's ``publish_python``).
        script: ``publisher.py`` on the pod.
        target: where to publish.
        root: the pod folder the paths are relative to.
        paths: the files to publish (the manifest's).
        hf_endpoint: the Hub base URL; Xet is used only against huggingface.co.
        s3: the ``S3Target`` (bucket, endpoint, region, part sizes) for ``s3``.
        key_prefix: for ``s3``: the keys' prefix (the target's own prefix included).
        deadline_seconds: the publisher's own deadline.
    """
    parts = [python, script, target.kind, "--root", root]
    parts += ["--deadline-seconds", str(int(deadline_seconds))]
    if target.kind == "hf":
        endpoint = (hf_endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
        parts += ["--repo-id", str(target.repo_id), "--endpoint", endpoint]
        parts += ["--xet", "auto" if endpoint == DEFAULT_HF_ENDPOINT else "off"]
        if target.revision:
            parts += ["--branch", target.revision]
        if not target.private:
            parts.append("--public")
    else:
        assert s3 is not None
        parts += ["--bucket", s3.bucket, "--key-prefix", key_prefix]
        if s3.endpoint_url:
            parts += ["--endpoint-url", s3.endpoint_url]
        if s3.region_name:
            parts += ["--region", s3.region_name]
        parts += ["--multipart-threshold-bytes", str(s3.multipart_threshold_bytes)]
        parts += ["--part-bytes", str(s3.part_bytes)]
    parts += ["--files", *paths]
    return " ".join(shlex.quote(p) for p in parts)


def parse_publish_output(output: str) -> dict[str, Any] | None:
    """The publisher's result line (the last JSON object with ``kind ==
    "publish_result"``) in console output; None when it printed none."""
    return last_json_object(output, lambda obj: obj.get("kind") == _RESULT_KIND)
