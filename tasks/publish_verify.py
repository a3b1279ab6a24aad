"""The publish stage's pure parts (docs/architecture.md#publish-from-the-pod): the
command's deadline (:func:`timeout_for`), the publisher's answer in the console output
(:func:`parse_publish_output`), and the check of what the destination recorded against
the pod-side manifest (:func:`verify_published`, each record checked by its publish
kind). The command line that runs the pod-side publisher (:func:`publisher_command`,
never a secret in it) is ``blocks.publish``'s, named here too.

:mod:`prefect_runpod.tasks.publish` runs them on the pod and reads the records back.
"""

from __future__ import annotations

from typing import Any

from prefect_runpod.blocks.console.terminal_text import last_json_object
from prefect_runpod.blocks.publish.base import publish_kind, publisher_command
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.tasks.models import PublishedFile

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

    Each file's record is checked by its kind (``PublishKind.check_record``): on the Hub
    (``hub_file_records``) an LFS file must carry ``lfs_sha256`` = the manifest's sha256
    and ``lfs_size`` = its size, a regular file's ``blob_id`` (git's object id) must
    equal the manifest's ``git_sha1`` and its ``size`` the size; on S3
    (``s3_object_records``) the object's ``sha256`` metadata and its ``ContentLength``.

    Args:
        manifest: computed on the pod before the upload.
        records: path → the destination's record.
        kind: the publish kind (``hf``, ``s3``).

    Returns:
        ``(files, problems)``: one :class:`PublishedFile` per file of the manifest
        (directories and links are not published), and ``(path, why)`` for each file
        that is missing or differs.
    """
    checker = publish_kind(kind)
    files: list[PublishedFile] = []
    problems: list[tuple[str, str]] = []
    for entry in manifest.files:
        record = records.get(entry.path)
        storage, remote, why = checker.check_record(entry, record or {})
        if record is None:  # how the kind would store it; nothing there to compare
            remote, why = None, "missing at the destination"
        if why is not None:
            problems.append((entry.path, why))
        files.append(
            PublishedFile(
                path=entry.path,
                size_bytes=entry.size_bytes,
                sha256=entry.sha256,
                git_sha1=entry.git_sha1,
                storage=storage,
                remote_id=remote,
                verified=why is None,
            )
        )
    return files, problems


def parse_publish_output(output: str) -> dict[str, Any] | None:
    """The publisher's result line (the last JSON object with ``kind ==
    "publish_result"``) in console output; None when it printed none."""
    return last_json_object(output, lambda obj: obj.get("kind") == _RESULT_KIND)
