"""The ``publish`` stage: the pod ships its verified outputs straight to the Hugging Face
Hub (or an S3 target), and the destination's own records are checked against the
pod-side manifest — no model byte crosses the gateway (docs/architecture.md#publish-from-the-pod).

1. ``manifest.py`` describes the outputs on the pod (size, sha256, git blob id);
   only that JSON comes back through the console. The transfers' link rule holds: a
   link leaving the outputs, or dangling, is refused before anything is sent, unless
   ``follow_links`` (then what it points at is published). The Hub and S3 hold files
   only, so in-tree links and empty directories are named in the log and not
   published.
2. Fault point ``publish_upload`` (tests tamper with a file here, after its manifest).
3. The token (or S3 key) is exported hidden (``set_secret_env``), and
   ``blocks/pod_side/publisher.py`` uploads with ``huggingface_hub`` / ``boto3``.
4. From the flow's machine, what the destination recorded is read back —
   ``get_paths_info`` at the new commit (LFS sha256 + size, or the git blob id of a
   regular file), or each object's ``sha256`` metadata and size on S3 — and
   :func:`verify_published` compares it with the manifest. A difference is a
   ``ChecksumMismatchError`` naming the file.

:func:`verify_published`, :func:`publisher_command` and :func:`parse_publish_output` are
pure (:mod:`prefect_runpod.tasks.publish_verify`); :func:`publish_on_pod` does the work
on a console; :func:`publish_task` makes the
Prefect task that materialises the model's asset (``hf://ORG/REPO`` or the S3 URI), and
:func:`publish` — what the flow calls — names the asset and runs it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from prefect.cache_policies import NO_CACHE
from prefect.states import State
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import (
    ChecksumMismatchError,
    ConsoleError,
    PublishError,
)
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.publish.base import publish_kind
from prefect_runpod.blocks.secret_mask import error_text
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.models import PublishReport, PublishTarget
from prefect_runpod.tasks.publish_verify import parse_publish_output, timeout_for, verify_published

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
    from prefect_runpod.blocks.console.session import PodConsole

log = logging.getLogger("prefect_runpod.publish")

__all__ = ["publish", "publish_on_pod", "publish_task"]


def _outputs_manifest(
    console: PodConsole,
    handle: PodHandle,
    outputs_dir: str,
    manifest_python: str,
    follow_links: bool,
) -> Manifest:
    """The pod-side manifest of the outputs to publish; what the destination cannot hold
    (empty directories, in-tree links) is named in a warning.

    Raises:
        SpecError: links that leave the outputs or dangle (from ``pod_manifest``).
        PublishError: the outputs hold no file.
    """
    from prefect_runpod.blocks.transfer.pod_tools import pod_manifest

    manifest = Manifest.from_dict(
        pod_manifest(
            console, handle, outputs_dir, python=manifest_python, follow_links=follow_links
        )
    )
    skipped = [e for e in manifest.entries if e.kind != "file"]
    if skipped:
        _logger().warning(
            "%s: the destination holds files only; not published: %s",
            handle.pod_id,
            ", ".join(
                f"{e.path} -> {e.target}" if e.kind == "link" else f"{e.path}/ (empty)"
                for e in skipped
            ),
        )
    if not manifest.files:
        raise PublishError(
            f"{handle.pod_id}: {outputs_dir} holds no files to publish; check the bundle's "
            "outputs folder",
            pod_id=handle.pod_id,
            stage="publish",
            retryable=False,
        )
    return manifest


def _publisher_failed(
    handle: PodHandle, where: str, answer: dict[str, Any] | None, output: str, exit_code: int
) -> PublishError:
    """The error for a publisher that failed or printed no result: the destination's
    status and message, and whether a rerun can help."""
    tail = "\n".join(output.strip().splitlines()[-6:])
    status = (answer or {}).get("status")
    why = (answer or {}).get(
        "error"
    ) or f"the publisher printed no result (exit {exit_code}): {tail}"
    retryable = bool((answer or {}).get("retryable", True))
    step = (
        "check the token's write access or the S3 key (the answer above) and rerun"
        if not retryable
        else "rerun: files already at the destination are not sent again"
    )
    return PublishError(
        f"{handle.pod_id}: publishing to {where} failed"
        f"{f' (HTTP {status})' if status else ''}: {why}; {step}",
        pod_id=handle.pod_id,
        stage="publish",
        status=status,
        retryable=retryable,
    )


def publish_on_pod(
    console: PodConsole,
    handle: PodHandle,
    target: PublishTarget,
    outputs_dir: str,
    *,
    tools_dir: str,
    python: str,
    hf_token: SecretStr | None = None,
    hf_endpoint: str | None = None,
    s3: S3Target | None = None,
    key_prefix: str = "",
    manifest_python: str = "python3",
    follow_links: bool = False,
) -> PublishReport:
    """Publish ``outputs_dir`` from the pod and verify it at the destination.

    Args:
        console: an open console to the pod (``run``, ``set_secret_env``, and
            ``open_stream`` for the manifest).
        handle: the pod.
        target: where to publish.
        outputs_dir: the pod folder to publish (the bundle's outputs).
        tools_dir: the pod tools folder (``manifest.py``, ``publisher.py``).
        python: the publish Python (the env stage's ``publish_python``).
        hf_token: the write token (Hub), exported hidden as ``HF_TOKEN``.
        hf_endpoint: the Hub base URL.
        s3: the ``S3Target`` for ``s3``; its key is exported hidden.
        key_prefix: the S3 key prefix (inside ``s3.prefix``).
        manifest_python: the interpreter that runs ``manifest.py``.
        follow_links: publish what links leaving ``outputs_dir`` point at instead of
            refusing them.

    Returns:
        The verified :class:`PublishReport`.

    Raises:
        SpecError: the outputs hold links that leave them or dangle (each named;
            nothing was sent).
        PublishError: the publisher failed (the destination's status and message, and
            whether a rerun can help).
        ChecksumMismatchError: a file at the destination differs from the pod's
            manifest (``path`` names it).
    """
    started = time.monotonic()
    manifest = _outputs_manifest(console, handle, outputs_dir, manifest_python, follow_links)
    fault_point("publish_upload")
    paths = [e.path for e in manifest.files]
    kind = publish_kind(target.kind)
    prefix = s3.key_for("", key_prefix) if s3 is not None else ""
    deadline = timeout_for(manifest.total_bytes)
    command = kind.pod_command(
        target,
        python=python,
        tools_dir=tools_dir,
        root=outputs_dir,
        paths=paths,
        hf_endpoint=hf_endpoint,
        s3=s3,
        key_prefix=prefix,
        deadline_seconds=deadline - 30,
    )
    kind.export_secrets(console, hf_token=hf_token, s3=s3)
    result = console.run(command, timeout_seconds=deadline, check=False)
    answer = parse_publish_output(result.output)
    where = kind.location(target, s3=s3, key_prefix=prefix)
    if answer is None or not answer.get("ok"):
        raise _publisher_failed(handle, where, answer, result.output, result.exit_code)
    revision = answer.get("revision")
    records = _read_back(handle, target, paths, answer, hf_token, hf_endpoint, s3)
    files, problems = verify_published(manifest, records, target.kind)
    if problems:
        path, why = problems[0]
        raise ChecksumMismatchError(
            f"{handle.pod_id}: {path} at {where}{f'@{revision}' if revision else ''} does "
            f"not match the pod's manifest ({why}); it changed on the pod after its manifest "
            "or was damaged on the way — do not use this revision, rerun the publish",
            path=path,
            pod_id=handle.pod_id,
            stage="publish",
        )
    return PublishReport(
        target=where,
        kind=target.kind,
        revision=revision,
        branch=kind.branch(target),
        url=answer.get("commit_url") or where,
        files=files,
        bytes=manifest.total_bytes,
        verified=True,
        seconds=round(time.monotonic() - started, 3),
        attempts=int(answer.get("attempts") or 1),
    )


def _read_back(
    handle: PodHandle,
    target: PublishTarget,
    paths: list[str],
    answer: dict[str, Any],
    token: SecretStr | None,
    endpoint: str | None,
    s3: S3Target | None,
) -> dict[str, dict[str, Any]]:
    """The destination's records of the published files, read from this machine by the
    target's kind.

    Raises:
        PublishError: they could not be read: nothing is verified.
    """
    kind = publish_kind(target.kind)
    try:
        return kind.read_back(
            target,
            paths,
            revision=answer.get("revision"),
            answer=answer,
            hf_token=token,
            hf_endpoint=endpoint,
            s3=s3,
        )
    except Exception as exc:  # the read-back is the proof: without it nothing is verified
        raise PublishError(
            f"{handle.pod_id}: the upload finished but reading it back from "
            f"{kind.location(target, s3=s3, key_prefix='')} failed ({error_text(exc)[:300]}); "
            "nothing is verified — rerun the publish",
            pod_id=handle.pod_id,
            stage="publish",
        ) from exc


def _logger() -> Any:
    """The task run's logger inside Prefect, this module's outside it."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return log


def _retry_transient(task: Any, task_run: Any, state: State) -> bool:
    """Retry after a dropped console or a transient publish failure; never after a
    mismatch or a refusal."""
    try:
        state.result()
    except ChecksumMismatchError:
        return False
    except PublishError as exc:
        return exc.retryable
    except ConsoleError:
        return True
    except Exception:  # noqa: BLE001
        return False
    return False


def publish_task(asset: str, *, url: str | None = None, description: str | None = None) -> Any:
    """The ``publish`` Prefect task, materialising the model's asset (``asset`` is its
    key: ``hf://ORG/REPO`` or the S3 URI), so the UI shows the run → model lineage.

    The task takes the arguments of :func:`publish_on_pod` except the console (it opens
    one to ``handle`` with ``private_key`` first) and returns the ``PublishReport``.
    On success the asset's materialisation event carries the revision, the file count
    and the bytes.

    Args:
        asset: the asset key.
        url: a page to visit (the repo's web page).
        description: shown on the asset.
    """
    from prefect.assets import Asset, AssetProperties, materialize

    def publish(
        handle: PodHandle,
        private_key: SecretStr,
        target: PublishTarget,
        outputs_dir: str,
        **kw: Any,
    ) -> PublishReport:
        from prefect import get_run_logger
        from prefect.assets import add_asset_metadata
        from prefect.context import AssetContext

        from prefect_runpod.blocks.console.session import PodConsole

        logger = get_run_logger()
        reconnect = kw.pop("reconnect", None)
        with PodConsole.for_pod(handle, private_key, reconnect=reconnect) as console:
            report = publish_on_pod(console, handle, target, outputs_dir, **kw)
        logger.info(
            "%s: published %d files (%d bytes) to %s%s in %.1f s, %d attempt(s), every file "
            "verified at the destination",
            handle.pod_id,
            len(report.files),
            report.bytes,
            report.target,
            f"@{report.revision}" if report.revision else "",
            report.seconds,
            report.attempts,
        )
        if AssetContext.get() is not None:  # None when called as .fn() outside Prefect
            add_asset_metadata(
                asset,
                {
                    "revision": report.revision,
                    "url": report.url,
                    "files": len(report.files),
                    "bytes": report.bytes,
                    "verified": report.verified,
                    "pod_id": handle.pod_id,
                },
            )
        return report

    props = AssetProperties(name=asset, url=url, description=description)
    return materialize(
        Asset(key=asset, properties=props),
        by="prefect-runpod",
        name="publish",
        cache_policy=NO_CACHE,
        retries=1,
        retry_delay_seconds=5,
        retry_condition_fn=_retry_transient,
    )(publish)


def publish(
    target: PublishTarget,
    handle: PodHandle,
    private_key: SecretStr,
    outputs_dir: str,
    *,
    run_id: str,
    tools_dir: str,
    python: str | None,
    hf_token: SecretStr | None = None,
    hf_endpoint: str | None = None,
    s3: S3Target | None = None,
    follow_links: bool = False,
    reconnect: ReconnectPolicy | None = None,
) -> PublishReport:
    """The ``publish`` stage: run :func:`publish_task` for ``target``, with the asset named
    ``hf://ORG/REPO`` (its page on the Hub as the asset's URL) or the S3 URI, and the S3
    keys under ``s3_prefix_for(target, run_id)``.

    Args:
        target: where to publish.
        handle / private_key: the pod and its SSH key.
        outputs_dir: the pod folder to publish.
        run_id: the flow run id (the default S3 prefix, the asset's description).
        tools_dir: the pod tools folder.
        python: the env stage's ``publish_python`` (``python3`` when None).
        hf_token / hf_endpoint / s3 / follow_links: as for :func:`publish_on_pod`.
        reconnect: the run's reconnect policy, for opening the console (a publish that
            dropped mid-way is retried by the task, files already there not sent again).

    Returns:
        The verified :class:`PublishReport`.

    Raises:
        PublishError, ChecksumMismatchError: as :func:`publish_on_pod`.
    """
    kind = publish_kind(target.kind)
    prefix = kind.key_prefix(target, run_id)
    key, web = kind.asset(target, key_prefix=prefix, hf_endpoint=hf_endpoint, s3=s3)
    stage = publish_task(key, url=web, description=f"fine-tuned by prefect-runpod run {run_id}")
    return stage(  # type: ignore[no-any-return]
        handle,
        private_key,
        target,
        outputs_dir,
        tools_dir=tools_dir,
        python=python or "python3",
        hf_token=hf_token,
        hf_endpoint=hf_endpoint,
        s3=s3,
        key_prefix=prefix,
        follow_links=follow_links,
        reconnect=reconnect,
    )
