"""Publish targets and the download choice, parsed and checked before anything is
rented (docs/architecture.md#publish-from-the-pod).

Plain functions with no I/O, called by the one pre-rent check
(``tasks.preflight.validate_settings``), so the CLI, the flow's parameters and the
deployments all refuse the same bad input with the same sentence, in the validation
layer's words (``blocks/validation/``: parameter names with their CLI options):

- :func:`parse_publish_target` turns ``hf:ORG/REPO[@BRANCH]`` or ``s3[:PREFIX]`` into a
  :class:`~prefect_runpod.tasks.models.PublishTarget` (repo ids pass the layer's
  ``check_repo_id`` and ``huggingface_hub``'s own, stricter ``validate_repo_id``);
- :func:`check_download_choice` accepts ``all``, ``eval`` or ``none`` (``none`` only
  when the model goes somewhere else first);
- :func:`s3_prefix_for` and :func:`asset_key` name where a target's files land.
"""

from __future__ import annotations

import re

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.tasks.models import PublishTarget

__all__ = [
    "DOWNLOAD_CHOICES",
    "asset_key",
    "check_download_choice",
    "parse_publish_target",
    "s3_prefix_for",
]

DOWNLOAD_CHOICES = ("all", "eval", "none")
"""What the ``download`` stage brings home: every output, only the eval files, nothing."""

_FORMS = "hf:ORG/REPO[@BRANCH] or s3[:PREFIX]"
# A branch name git and the Hub both accept: no "..", no "@{", no trailing "/" or ".lock",
# no spaces or control characters (git-check-ref-format, kept strict).
_BRANCH_RE = re.compile(r"(?!.*\.\.)(?!.*@\{)(?!.*//)[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")
_PREFIX_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/=-]{0,199}")


def parse_publish_target(
    spec: str | None, *, public: bool = False, s3_target_block: str | None = None
) -> PublishTarget | None:
    """Parse a ``--publish`` value. Pure.

    Args:
        spec: ``hf:ORG/REPO``, ``hf:ORG/REPO@BRANCH``, ``s3`` or ``s3:PREFIX``; None or
            "" for no publishing.
        public: create the Hub repo public (``--publish-public``); repos are private
            otherwise.
        s3_target_block: the saved ``S3Target`` block (``--s3-target``), the one way to
            name a bucket; required for ``s3``.

    Returns:
        The :class:`PublishTarget`, or None when nothing is published.

    Raises:
        SpecError: one sentence naming the parameter, the bad part and what to write.
    """
    publish = v.label("publish")
    if spec is None or not spec.strip():
        if public:
            raise SpecError(
                f"{v.label('publish_public')}: --publish-public makes a Hub repo public: it "
                "needs --publish hf:ORG/REPO."
            )
        return None
    text = spec.strip()
    kind, sep, rest = text.partition(":")
    if kind == "hf":
        return _hub_target(text, rest if sep else "", public)
    if kind != "s3":
        raise SpecError(f"{publish} {spec!r} is not one of: {_FORMS}.")
    if public:
        raise SpecError(
            f"{v.label('publish_public')} applies to a Hub repo; who can read an S3 object "
            "is the bucket's policy: drop --publish-public."
        )
    if not s3_target_block:
        raise SpecError(
            f"{publish} s3 writes into the saved S3Target named by --s3-target "
            "(s3_target_block): save one and pass --s3-target NAME."
        )
    prefix = rest.strip("/") if sep else None
    if sep and not prefix:
        raise SpecError(f"{publish} {spec!r} has an empty prefix: write s3 or s3:PREFIX.")
    if prefix is not None and not _PREFIX_RE.fullmatch(prefix):
        raise SpecError(
            f"{publish}: the S3 prefix {prefix!r} may hold letters, digits and . _ / = - "
            "(no '..'), up to 200 characters."
        )
    return PublishTarget(spec=text, kind="s3", prefix=prefix, s3_target_block=s3_target_block)


def _hub_target(text: str, rest: str, public: bool) -> PublishTarget:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    publish = v.label("publish")
    repo_id, at, branch = rest.partition("@")
    if not repo_id:
        raise SpecError(f"{publish} {text!r} names no repo: write hf:ORG/REPO[@BRANCH].")
    if repo_id.count("/") != 1:
        raise SpecError(
            f"{publish} {text!r} must name the namespace and the repo, hf:ORG/REPO (ORG is "
            "your user name or an organisation you can write to)."
        )
    v.check_repo_id(repo_id, "publish")
    try:
        validate_repo_id(repo_id)  # the Hub's own rules: no '--', no '..', no '.git' end
    except HFValidationError as exc:
        raise SpecError(f"{publish} {text!r}: {exc}") from exc
    if at and not _BRANCH_RE.fullmatch(branch):
        raise SpecError(
            f"{publish}: the branch {branch!r} in {text!r} is not a branch name git accepts "
            "(letters, digits, . _ / -, no '..')."
        )
    if branch.endswith((".lock", "/", ".")):
        raise SpecError(
            f"{publish}: the branch {branch!r} in {text!r} may not end with '.lock', '/' or '.'."
        )
    return PublishTarget(
        spec=text, kind="hf", repo_id=repo_id, revision=branch or None, private=not public
    )


def check_download_choice(download: str, target: PublishTarget | None) -> str:
    """Check ``--download``. Pure.

    Args:
        download: ``all``, ``eval`` or ``none``.
        target: the parsed publish target, or None.

    Returns:
        ``download`` unchanged.

    Raises:
        SpecError: an unknown choice, or ``none`` without a publish target (the pod is
            terminated at the end, so the model would be lost).
    """
    if download not in DOWNLOAD_CHOICES:
        raise SpecError(
            f"{v.label('download')} {download!r} is not one of: {', '.join(DOWNLOAD_CHOICES)}."
        )
    if download == "none" and target is None:
        raise SpecError(
            f"{v.label('download')}: --download none leaves the model only on the pod, which "
            "the run terminates: publish it (--publish hf:ORG/REPO or s3) or download all/eval."
        )
    return download


def s3_prefix_for(target: PublishTarget, flow_run_id: str) -> str:
    """The key prefix an ``s3`` target writes under (inside the ``S3Target``'s own
    prefix): the one given, else ``prefect-runpod/<flow_run_id>``."""
    return target.prefix or f"prefect-runpod/{flow_run_id}"


def asset_key(target: PublishTarget, *, bucket_uri: str | None = None) -> str:
    """The Prefect asset key of a published model: ``hf://ORG/REPO``, or the S3 URI
    (``bucket_uri``, e.g. ``s3://bucket/prefix``) for an ``s3`` target.

    Raises:
        SpecError: an ``s3`` target without ``bucket_uri``.
    """
    if target.kind == "hf":
        return f"hf://{target.repo_id}"
    if not bucket_uri:
        raise SpecError("an s3 target's asset key needs the bucket URI")
    return bucket_uri.rstrip("/")
