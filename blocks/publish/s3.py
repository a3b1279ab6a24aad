"""An S3 bucket as a publish destination: ``s3[:PREFIX]``, into the run's ``S3Target``
block (docs/architecture.md#publish-from-the-pod). The pod uploads with ``boto3``
(multipart above the block's threshold); each object's ``sha256`` metadata and size are
read back with ``HeadObject`` and must equal the pod-side manifest."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.publish.base import PublishKind, PublishTarget

if TYPE_CHECKING:
    from prefect_runpod.blocks.console import ConsoleLike
    from prefect_runpod.blocks.transfer.models import ManifestEntry
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["S3Publish"]

_PREFIX_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/=-]{0,199}")


class S3Publish(PublishKind):
    """``s3[:PREFIX]``: objects under the ``S3Target``'s prefix (and ``PREFIX``)."""

    kind = "s3"
    form = "s3[:PREFIX]"
    where = "s3"
    how = "each object's sha256 metadata and size (HeadObject, never the ETag)"
    client_requirement = "boto3>=1.28"
    client_module = "boto3"
    uses_s3_target = True

    @classmethod
    def parse(
        cls, text: str, rest: str | None, *, public: bool, s3_target_block: str | None
    ) -> PublishTarget:
        """``s3`` or ``s3:PREFIX``; the bucket is the saved ``S3Target`` (``--s3-target``)."""
        publish = v.label("publish")
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
        prefix = rest.strip("/") if rest is not None else None
        if rest is not None and not prefix:
            raise SpecError(f"{publish} {text!r} has an empty prefix: write s3 or s3:PREFIX.")
        if prefix is not None and not _PREFIX_RE.fullmatch(prefix):
            raise SpecError(
                f"{publish}: the S3 prefix {prefix!r} may hold letters, digits and . _ / = - "
                "(no '..'), up to 200 characters."
            )
        return PublishTarget(
            spec=text, kind=cls.kind, prefix=prefix, s3_target_block=s3_target_block
        )

    @classmethod
    def check_before_renting(cls, target: PublishTarget, *, s3: S3Target | None) -> None:
        """The bucket answers with the block's credentials (``HeadBucket``)."""
        from prefect_runpod.blocks.transfer.s3 import check_s3_target

        if s3 is None:
            raise SpecError(f"publishing to s3 needs the S3Target block {target.s3_target_block!r}")
        check_s3_target(s3)

    @classmethod
    def key_prefix(cls, target: PublishTarget, run_id: str) -> str:
        """The prefix given, else ``prefect-runpod/<flow_run_id>``."""
        return target.prefix or f"prefect-runpod/{run_id}"

    @classmethod
    def location(cls, target: PublishTarget, *, s3: S3Target | None, key_prefix: str) -> str:
        """``s3://BUCKET/PREFIX`` (``key_prefix`` with the block's own prefix)."""
        assert s3 is not None
        return f"s3://{s3.bucket}/{key_prefix}".rstrip("/")

    @classmethod
    def asset(
        cls, target: PublishTarget, *, key_prefix: str, hf_endpoint: str | None, s3: S3Target | None
    ) -> tuple[str, str]:
        """The S3 URI, as key and page alike."""
        assert s3 is not None
        uri = f"s3://{s3.bucket}/{s3.key_for('', key_prefix)}".rstrip("/")
        return uri, uri

    @classmethod
    def export_secrets(
        cls, console: ConsoleLike, *, hf_token: SecretStr | None, s3: S3Target | None
    ) -> None:
        """The block's key pair, as ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``."""
        assert s3 is not None
        if s3.access_key_id:
            console.set_secret_env("AWS_ACCESS_KEY_ID", SecretStr(s3.access_key_id))
        if s3.secret_access_key is not None:
            console.set_secret_env("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)

    @classmethod
    def publisher_arguments(
        cls, target: PublishTarget, *, hf_endpoint: str | None, s3: S3Target | None, key_prefix: str
    ) -> list[str]:
        """The bucket, the keys' prefix, the endpoint and region, the part sizes."""
        assert s3 is not None
        parts = ["--bucket", s3.bucket, "--key-prefix", key_prefix]
        if s3.endpoint_url:
            parts += ["--endpoint-url", s3.endpoint_url]
        if s3.region_name:
            parts += ["--region", s3.region_name]
        parts += ["--multipart-threshold-bytes", str(s3.multipart_threshold_bytes)]
        parts += ["--part-bytes", str(s3.part_bytes)]
        return parts

    @classmethod
    def read_back(
        cls,
        target: PublishTarget,
        paths: list[str],
        *,
        revision: str | None,
        answer: dict[str, Any],
        hf_token: SecretStr | None,
        hf_endpoint: str | None,
        s3: S3Target | None,
    ) -> dict[str, dict[str, Any]]:
        """``HeadObject`` of each key the publisher reported (``s3_object_records``)."""
        from prefect_runpod.blocks.transfer.s3 import s3_object_records

        assert s3 is not None
        keys = dict(answer.get("keys") or {})
        return s3_object_records(s3, {p: keys.get(p, "") for p in paths if keys.get(p)})

    @classmethod
    def check_record(
        cls, entry: ManifestEntry, record: dict[str, Any]
    ) -> tuple[str, str | None, str | None]:
        """The object's ``sha256`` metadata and its ``ContentLength``."""
        remote = record.get("sha256")
        if record.get("size") != entry.size_bytes:
            return "s3", remote, f"size {entry.size_bytes} != {record.get('size')}"
        if remote != entry.sha256:
            return "s3", remote, f"sha256 {entry.sha256} != {remote}"
        return "s3", remote, None
