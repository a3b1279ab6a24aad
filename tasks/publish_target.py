"""Publish targets and the download choice, parsed and checked before anything is
rented (docs/architecture.md#publish-from-the-pod).

Plain functions with no I/O, called by the one pre-rent check
(``tasks.preflight.validate_settings``), so the CLI, the flow's parameters and the
deployments all refuse the same bad input with the same sentence, in the validation
layer's words (``blocks/validation/``: parameter names with their CLI options):

- :func:`parse_publish_target` turns ``hf:ORG/REPO[@BRANCH]`` or ``s3[:PREFIX]`` into a
  :class:`~prefect_runpod.tasks.models.PublishTarget`, through the kind the value
  starts with (``blocks.publish``: each kind parses its own form);
- :func:`check_download_choice` accepts ``all``, ``eval`` or ``none`` (``none`` only
  when the model goes somewhere else first);
- :func:`s3_prefix_for` and :func:`asset_key` name where a target's files land.
"""

from __future__ import annotations

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.publish.base import publish_forms, publish_kind, publish_kind_names
from prefect_runpod.blocks.validation.parameters import literal_choices, parameter
from prefect_runpod.tasks.models import PublishTarget

__all__ = [
    "DOWNLOAD_CHOICES",
    "asset_key",
    "check_download_choice",
    "parse_publish_target",
    "s3_prefix_for",
]

DOWNLOAD_CHOICES: tuple[str, ...] = literal_choices(parameter("download")) or ()
"""What the ``download`` stage brings home: every output, only the eval files, nothing
(the ``download`` parameter's choices)."""


def parse_publish_target(
    spec: str | None, *, public: bool = False, s3_target_block: str | None = None
) -> PublishTarget | None:
    """Parse a ``--publish`` value: the kind it starts with (``blocks.publish``'s
    registry) parses the rest. Pure.

    Args:
        spec: ``hf:ORG/REPO``, ``hf:ORG/REPO@BRANCH``, ``s3`` or ``s3:PREFIX`` (or a
            registered kind's own form); None or "" for no publishing.
        public: create the Hub repo public (``--publish-public``); repos are private
            otherwise.
        s3_target_block: the saved ``S3Target`` block (``--s3-target``), the one way to
            name a bucket; required for ``s3``.

    Returns:
        The :class:`PublishTarget`, or None when nothing is published.

    Raises:
        SpecError: one sentence naming the parameter, the bad part and what to write.
    """
    if spec is None or not spec.strip():
        if public:
            raise SpecError(
                f"{v.label('publish_public')}: --publish-public makes a Hub repo public: it "
                "needs --publish hf:ORG/REPO."
            )
        return None
    text = spec.strip()
    name, sep, rest = text.partition(":")
    if name not in publish_kind_names():
        raise SpecError(f"{v.label('publish')} {spec!r} is not one of: {publish_forms()}.")
    kind = publish_kind(name)
    return kind.parse(text, rest if sep else None, public=public, s3_target_block=s3_target_block)


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
    """The key prefix a target's files land under (for ``s3``: inside the
    ``S3Target``'s own prefix, the one given, else ``prefect-runpod/<flow_run_id>``)."""
    return publish_kind(target.kind).key_prefix(target, flow_run_id)


def asset_key(target: PublishTarget, *, bucket_uri: str | None = None) -> str:
    """The Prefect asset key of a published model: ``hf://ORG/REPO``, or the S3 URI
    (``bucket_uri``, e.g. ``s3://bucket/prefix``) for an ``s3`` target.

    Raises:
        SpecError: a target whose kind writes into a bucket, without ``bucket_uri``.
    """
    kind = publish_kind(target.kind)
    if not kind.uses_s3_target:
        return kind.location(target, s3=None, key_prefix="")
    if not bucket_uri:
        raise SpecError("an s3 target's asset key needs the bucket URI")
    return bucket_uri.rstrip("/")
