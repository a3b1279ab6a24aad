#!/usr/bin/env python3
"""Publish a run's outputs from the pod itself: to a Hugging Face Hub repo with
``huggingface_hub``, or to an S3 bucket with ``boto3`` — so no model byte has to cross
the SSH gateway (docs/architecture.md#publish-from-the-pod).

Runs ON the pod, with the Python the env stage prepared for publishing (3.10 or newer,
with the client installed). It is the one pod-side script that uses a package outside
the standard library, and it imports it only inside the function of the target it
publishes to, so the module itself still parses and imports on Python 3.8.

Secrets come from the environment only — ``HF_TOKEN`` for the Hub,
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` for S3 (the flow exports them with
the console's hidden ``read -rs``) — and are never printed. Command line::

    python3 publisher.py hf --root DIR --repo-id ORG/REPO [--branch B] [--public]
        [--endpoint URL] [--xet off|auto] [--message TEXT] --files REL [REL …]
    python3 publisher.py s3 --root DIR --bucket B [--key-prefix P] [--endpoint-url U]
        [--region R] [--multipart-threshold-bytes N] [--part-bytes N] --files REL [REL …]

Both take ``--max-attempts`` (default 3) and ``--deadline-seconds`` (default 3600).

**Hub.** ``create_repo(exist_ok=True)`` (private unless ``--public``), the branch if one
is named (``create_branch(exist_ok=True)``), then one ``create_commit`` of exactly the
listed files. huggingface_hub re-sends a part or a file whose connection dropped
(``http_backoff``); when an attempt still fails with a network error or a 5xx the
commit is tried again, and the Hub's preupload and LFS batch answers skip every
object it already holds, so only what is missing travels again. ``--xet off`` sets
``HF_HUB_DISABLE_XET=1`` (the LFS path; a test Hub or a mirror serves only that).

**S3.** Each file is hashed (sha256) just before it is uploaded and the digest is
stored as the object's ``sha256`` metadata, never trusting an ETag (RunPod's S3
computes MD5 ETags late). An object already present with the same size and digest
is skipped, so a second attempt resumes.

Output: one JSON line per attempt (``{"kind": "publish_attempt", …}``) and a final
``{"kind": "publish_result", "ok": true, "revision": …, "commit_url": …, "files": N,
"bytes": N, "attempts": N}`` or ``{"kind": "publish_result", "ok": false, "status":
403, "error": "…", "retryable": false, …}``. Exit status 0 on success, 1 on failure,
2 on bad usage.
"""

import argparse
import json
import os
import signal
import sys
import time

try:  # on the pod the script's own folder holds manifest.py
    import manifest as _manifest  # type: ignore
except ImportError:  # imported as a package module by the flow's tests
    from prefect_runpod.blocks.pod_side import manifest as _manifest  # type: ignore

RESULT_KIND = "publish_result"
ATTEMPT_KIND = "publish_attempt"
_BACKOFF_SECONDS = (2.0, 5.0, 15.0, 30.0)


class Deadline(Exception):
    """The publisher's own deadline passed (SIGALRM)."""


class Refused(Exception):
    """The destination refused for good (a 4xx other than 408/429): no retry helps."""

    def __init__(self, message, status=None, error_code=None):
        Exception.__init__(self, message)
        self.status = status
        self.error_code = error_code


def emit(kind, **fields):
    """Print one JSON line (what the flow reads back)."""
    fields["kind"] = kind
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


def _status_of(exc):
    """HTTP status and ``X-Error-Code`` of a client exception (huggingface_hub's or
    botocore's), or ``(None, None)`` for a network error."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata") or {}
        return meta.get("HTTPStatusCode"), (response.get("Error") or {}).get("Code")
    if response is not None:
        headers = getattr(response, "headers", {}) or {}
        return getattr(response, "status_code", None), headers.get("X-Error-Code")
    cause = getattr(exc, "__cause__", None)
    if cause is not None and cause is not exc:
        return _status_of(cause)
    return None, None


def _final(status):
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def with_attempts(action, max_attempts, describe):
    """Run ``action(attempt)`` until it succeeds, a refusal is final, or the attempts
    run out; between attempts wait a little longer each time.

    Args:
        action: called with the attempt number (1, 2, …).
        max_attempts: at most this many calls.
        describe: the phase, named in each failed attempt's line.

    Returns:
        ``(result, attempts)``.

    Raises:
        Refused: the destination refused (4xx), or the last attempt failed.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return action(attempt), attempt
        except Deadline:
            raise
        except Exception as exc:  # noqa: BLE001 - classified right here
            status, code = _status_of(exc)
            message = "%s: %s" % (type(exc).__name__, str(exc).strip()[:600])
            retry = not _final(status) and attempt < max_attempts
            emit(
                ATTEMPT_KIND,
                phase=describe,
                attempt=attempt,
                ok=False,
                status=status,
                error=message,
                retry=retry,
            )
            if not retry:
                raise Refused(message, status, code) from exc
            time.sleep(_BACKOFF_SECONDS[min(attempt - 1, len(_BACKOFF_SECONDS) - 1)])


def publish_hub(args, files):
    """Create (or reuse) the repo and commit ``files`` in one commit.

    Returns:
        The result fields: ``revision``, ``commit_url``, ``private``, ``attempts``.
    """
    os.environ["HF_ENDPOINT"] = args.endpoint.rstrip("/")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if args.xet == "off":
        os.environ["HF_HUB_DISABLE_XET"] = "1"
    token = os.environ.get("HF_TOKEN") or None
    if not token:
        raise Refused(
            "HF_TOKEN is not set in the pod's shell; the flow exports it before publishing"
        )
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=args.endpoint.rstrip("/"), token=token)

    def prepare(attempt):
        url = api.create_repo(args.repo_id, private=not args.public, exist_ok=True)
        if args.branch and args.branch != "main":
            api.create_branch(args.repo_id, branch=args.branch, exist_ok=True)
        return str(url)

    with_attempts(prepare, args.max_attempts, "prepare")

    def commit(attempt):
        operations = [
            CommitOperationAdd(path_in_repo=rel, path_or_fileobj=os.path.join(args.root, rel))
            for rel in files
        ]
        emit(ATTEMPT_KIND, attempt=attempt, ok=None, phase="commit", files=len(files))
        return api.create_commit(
            args.repo_id,
            operations,
            commit_message=args.message,
            revision=args.branch or None,
        )

    info, attempts = with_attempts(commit, args.max_attempts, "commit")
    return {
        "revision": info.oid,
        "commit_url": info.commit_url,
        "private": not args.public,
        "attempts": attempts,
    }


def publish_s3(args, files):
    """Upload ``files`` under the key prefix, each with its sha256 as metadata.

    Returns:
        The result fields: ``keys`` (relative path → object key), ``attempts``.
    """
    key_id = os.environ.get("AWS_ACCESS_KEY_ID") or None
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY") or None
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=args.endpoint_url or None,
        region_name=args.region or None,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(
            retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}
        ),
    )
    config = TransferConfig(
        multipart_threshold=args.multipart_threshold_bytes,
        multipart_chunksize=args.part_bytes,
        max_concurrency=4,
    )
    keys = {}
    most = 0
    for rel in files:
        path = os.path.join(args.root, rel)
        key = "/".join(p for p in (args.key_prefix.strip("/"), rel) if p)

        def upload(attempt, path=path, key=key):
            size, sha = _manifest.hash_file(path)
            try:
                head = client.head_object(Bucket=args.bucket, Key=key)
                if (
                    head.get("ContentLength") == size
                    and (head.get("Metadata") or {}).get("sha256") == sha
                ):
                    return "present"
            except Exception:  # noqa: BLE001 - absent (404) or unreadable: upload it
                pass
            client.upload_file(
                path, args.bucket, key, ExtraArgs={"Metadata": {"sha256": sha}}, Config=config
            )
            return "uploaded"

        _, attempts = with_attempts(upload, args.max_attempts, rel)
        most = max(most, attempts)
        keys[rel] = key
    return {"keys": keys, "attempts": most or 1}


def build_parser():
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Publish outputs from the pod to the Hub or S3")
    sub = parser.add_subparsers(dest="target")
    for name in ("hf", "s3"):
        p = sub.add_parser(name)
        p.add_argument("--root", required=True, help="the folder the files are relative to")
        p.add_argument("--files", nargs="+", required=True, help="relative paths to publish")
        p.add_argument("--max-attempts", type=int, default=3)
        p.add_argument("--deadline-seconds", type=float, default=3600.0)
        if name == "hf":
            p.add_argument("--repo-id", required=True)
            p.add_argument("--branch", default=None)
            p.add_argument("--public", action="store_true")
            p.add_argument("--endpoint", default="https://huggingface.co")
            p.add_argument("--xet", choices=["auto", "off"], default="auto")
            p.add_argument("--message", default="Upload fine-tuned model (prefect-runpod)")
        else:
            p.add_argument("--bucket", required=True)
            p.add_argument("--key-prefix", default="")
            p.add_argument("--endpoint-url", default=None)
            p.add_argument("--region", default=None)
            p.add_argument("--multipart-threshold-bytes", type=int, default=64 * 1024 * 1024)
            p.add_argument("--part-bytes", type=int, default=64 * 1024 * 1024)
    return parser


def _on_alarm(signum, frame):
    raise Deadline()


def main(argv=None):
    """Publish, print the result line, return the exit status."""
    args = build_parser().parse_args(argv)
    if args.target is None:
        build_parser().print_usage(sys.stderr)
        return 2
    files = list(args.files)
    missing = [rel for rel in files if not os.path.isfile(os.path.join(args.root, rel))]
    if missing:
        emit(
            RESULT_KIND,
            ok=False,
            status=None,
            error="not on the pod: %s" % ", ".join(missing[:5]),
            retryable=False,
        )
        return 1
    total = sum(os.path.getsize(os.path.join(args.root, rel)) for rel in files)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(max(1, int(args.deadline_seconds)))
    started = time.time()
    try:
        fields = publish_hub(args, files) if args.target == "hf" else publish_s3(args, files)
    except Deadline:
        emit(
            RESULT_KIND,
            ok=False,
            status=None,
            retryable=True,
            error="the publisher's deadline of %ss passed" % args.deadline_seconds,
        )
        return 1
    except Refused as exc:
        emit(
            RESULT_KIND,
            ok=False,
            status=exc.status,
            error_code=exc.error_code,
            error=str(exc),
            retryable=not _final(exc.status),
        )
        return 1
    except ImportError as exc:
        emit(
            RESULT_KIND,
            ok=False,
            status=None,
            retryable=False,
            error="the publish client is missing on the pod: %s" % exc,
        )
        return 1
    finally:
        signal.alarm(0)
    fields.update(ok=True, files=len(files), bytes=total, seconds=round(time.time() - started, 3))
    emit(RESULT_KIND, **fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
