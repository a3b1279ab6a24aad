"""A Hugging Face model repo as a publish destination: ``hf:ORG/REPO[@BRANCH]``
(docs/architecture.md#publish-from-the-pod). The pod commits with ``huggingface_hub``;
the Hub's own records (LFS sha256 and size, or a regular file's git blob id) are read
back at the new commit and must equal the pod-side manifest."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.huggingface import DEFAULT_HF_ENDPOINT
from prefect_runpod.blocks.publish.base import PublishKind, PublishTarget

if TYPE_CHECKING:
    from prefect_runpod.blocks.console import ConsoleLike
    from prefect_runpod.blocks.transfer.models import ManifestEntry
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = ["HubPublish"]

# A branch name git and the Hub both accept: no "..", no "@{", no trailing "/" or ".lock",
# no spaces or control characters (git-check-ref-format, kept strict).
_BRANCH_RE = re.compile(r"(?!.*\.\.)(?!.*@\{)(?!.*//)[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")


class HubPublish(PublishKind):
    """``hf:ORG/REPO[@BRANCH]``: a Hub model repo, private unless ``--publish-public``."""

    kind = "hf"
    form = "hf:ORG/REPO[@BRANCH]"
    where = "hub"
    how = "the Hub's LFS sha256 / git blob id per file (paths-info)"
    client_requirement = "huggingface_hub>=0.24"
    """``create_commit``, ``get_paths_info`` and ``create_branch(exist_ok=True)`` are all
    in huggingface_hub 0.24."""
    client_module = "huggingface_hub"
    needs_hub_write = True

    @classmethod
    def parse(
        cls, text: str, rest: str | None, *, public: bool, s3_target_block: str | None
    ) -> PublishTarget:
        """``hf:ORG/REPO[@BRANCH]``; repo ids pass the validation layer's
        ``check_repo_id`` and ``huggingface_hub``'s own, stricter ``validate_repo_id``."""
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        publish = v.label("publish")
        repo_id, at, branch = (rest or "").partition("@")
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
            spec=text, kind=cls.kind, repo_id=repo_id, revision=branch or None, private=not public
        )

    @classmethod
    def location(cls, target: PublishTarget, *, s3: S3Target | None, key_prefix: str) -> str:
        """``hf://ORG/REPO``."""
        return f"hf://{target.repo_id}"

    @classmethod
    def verified_location(cls, target: str, revision: str | None) -> str:
        """``hf://ORG/REPO@<commit id>``."""
        return f"{target}@{revision}"

    @classmethod
    def asset(
        cls, target: PublishTarget, *, key_prefix: str, hf_endpoint: str | None, s3: S3Target | None
    ) -> tuple[str, str]:
        """``hf://ORG/REPO``, and the repo's page on the Hub."""
        web = f"{(hf_endpoint or DEFAULT_HF_ENDPOINT).rstrip('/')}/{target.repo_id}"
        return cls.location(target, s3=s3, key_prefix=key_prefix), web

    @classmethod
    def branch(cls, target: PublishTarget) -> str | None:
        """The branch the commit went to (``main`` unless one was named)."""
        return target.branch

    @classmethod
    def export_secrets(
        cls, console: ConsoleLike, *, hf_token: SecretStr | None, s3: S3Target | None
    ) -> None:
        """The write token, as ``HF_TOKEN``."""
        if hf_token is not None:
            console.set_secret_env("HF_TOKEN", hf_token)

    @classmethod
    def publisher_arguments(
        cls, target: PublishTarget, *, hf_endpoint: str | None, s3: S3Target | None, key_prefix: str
    ) -> list[str]:
        """The repo, the endpoint (Xet only against huggingface.co), the branch, public."""
        endpoint = (hf_endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
        parts = ["--repo-id", str(target.repo_id), "--endpoint", endpoint]
        parts += ["--xet", "auto" if endpoint == DEFAULT_HF_ENDPOINT else "off"]
        if target.revision:
            parts += ["--branch", target.revision]
        if not target.private:
            parts.append("--public")
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
        """``get_paths_info`` at the new commit (``blocks.huggingface.hub_file_records``)."""
        from prefect_runpod.blocks.huggingface import hub_file_records

        return hub_file_records(
            str(target.repo_id),
            paths,
            revision=str(revision or target.branch),
            token=hf_token,
            endpoint=hf_endpoint,
        )

    @classmethod
    def check_record(
        cls, entry: ManifestEntry, record: dict[str, Any]
    ) -> tuple[str, str | None, str | None]:
        """An LFS file: ``lfs_sha256`` and ``lfs_size``; a regular file: its ``blob_id``
        (git's object id) against the manifest's ``git_sha1``, and its ``size``."""
        if record.get("lfs_sha256"):
            remote = record["lfs_sha256"]
            if record.get("lfs_size") != entry.size_bytes:
                return "lfs", remote, f"size {entry.size_bytes} != {record.get('lfs_size')}"
            if remote != entry.sha256:
                return "lfs", remote, f"sha256 {entry.sha256} != {remote}"
            return "lfs", remote, None
        remote = record.get("blob_id")
        if record.get("size") != entry.size_bytes:
            return "regular", remote, f"size {entry.size_bytes} != {record.get('size')}"
        if entry.git_sha1 is None:
            return "regular", remote, "the pod's manifest has no git blob id to compare"
        if remote != entry.git_sha1:
            return "regular", remote, f"git blob id {entry.git_sha1} != {remote}"
        return "regular", remote, None
