"""The ``PublishKind`` protocol: one kind of place the pod publishes the outputs to, and
the registry that finds a kind by the name a ``--publish`` value starts with
(docs/architecture.md#publish-from-the-pod).

Like the transfer methods (``blocks/transfer/base.py``), the publish stage and its
checks do what every destination shares — the pod-side manifest, the command's
deadline and answer, the check of every file against the manifest — and hand what
differs to the kind: how the value is parsed, what is checked before renting, which
client the pod needs, which secrets it gets, the command it runs, how the destination's
records are read back and what a record must say. A kind is a class of class methods
(no state); adding one is a class and one ``register_publish_kind`` call.
"""

from __future__ import annotations

import importlib
import shlex
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, SecretStr

from prefect_runpod.blocks.exceptions import SpecError

if TYPE_CHECKING:
    from prefect_runpod.blocks.console import ConsoleLike
    from prefect_runpod.blocks.transfer.models import ManifestEntry
    from prefect_runpod.blocks.transfer.s3 import S3Target

__all__ = [
    "PublishKind",
    "PublishTarget",
    "publish_forms",
    "publish_kind",
    "publish_kind_names",
    "publisher_command",
    "register_publish_kind",
    "unregister_publish_kind",
]


class PublishTarget(BaseModel):
    """Where the outputs are published from the pod (``--publish``).

    Attributes:
        spec: the text as given (``hf:demo/tiny-classifier@main``).
        kind: the ``PublishKind``'s name (``hf``: a Hugging Face model repo; ``s3``: the
            run's ``S3Target``).
        repo_id: ``ORG/REPO`` for ``hf``.
        revision: the branch to commit to for ``hf``; None means the repo's ``main``.
        private: a repo created by the run is private unless this is False.
        prefix: for ``s3``, the key prefix under the ``S3Target``'s own prefix; None
            means ``prefect-runpod/<flow_run_id>``.
        s3_target_block: the saved ``S3Target`` block for ``s3``.
    """

    spec: str
    kind: str
    repo_id: str | None = None
    revision: str | None = None
    private: bool = True
    prefix: str | None = None
    s3_target_block: str | None = None

    @property
    def branch(self) -> str:
        """The branch a Hub commit goes to (``main`` unless one was named)."""
        return self.revision or "main"


class PublishKind:
    """One kind of destination. Subclasses set the class attributes and override what
    differs; the defaults publish nothing secret and run ``publisher.py``.

    Attributes:
        kind: the name a ``--publish`` value starts with (``hf``, ``s3``).
        form: how a value of this kind is written, for messages (``s3[:PREFIX]``).
        where: the place in a ``VerificationRecord`` (``hub``, ``s3``).
        how: what was compared there, in words.
        client_requirement: the pip requirement of the client the pod-side publisher
            imports (``huggingface_hub>=0.24``), or None when the pod needs none.
        client_module: the env probe's field that shows that client (``boto3``).
        uses_s3_target: the kind writes into the run's ``S3Target`` block.
        needs_hub_write: the run's Hugging Face token must be allowed to write the repo
            (checked before renting).
    """

    kind: ClassVar[str]
    form: ClassVar[str]
    where: ClassVar[str]
    how: ClassVar[str] = ""
    client_requirement: ClassVar[str | None] = None
    client_module: ClassVar[str | None] = None
    uses_s3_target: ClassVar[bool] = False
    needs_hub_write: ClassVar[bool] = False

    @classmethod
    def parse(
        cls, text: str, rest: str | None, *, public: bool, s3_target_block: str | None
    ) -> PublishTarget:
        """The target ``text`` names (``rest``: what follows ``<kind>:``, None without
        a colon). Raises ``SpecError`` with one sentence naming the parameter."""
        raise NotImplementedError

    @classmethod
    def check_before_renting(cls, target: PublishTarget, *, s3: S3Target | None) -> None:
        """What can be checked of the destination before anything is rented (besides
        the Hub write check, ``needs_hub_write``). Raises ``SpecError``."""
        return None

    @classmethod
    def key_prefix(cls, target: PublishTarget, run_id: str) -> str:
        """The key prefix the files land under (``""`` where keys are not prefixed)."""
        return ""

    @classmethod
    def location(cls, target: PublishTarget, *, s3: S3Target | None, key_prefix: str) -> str:
        """The destination as a URI (``hf://ORG/REPO``, ``s3://BUCKET/PREFIX``)."""
        raise NotImplementedError

    @classmethod
    def verified_location(cls, target: str, revision: str | None) -> str:
        """Where the files were verified, for the run's record (``…@<revision>``)."""
        return target

    @classmethod
    def asset(
        cls, target: PublishTarget, *, key_prefix: str, hf_endpoint: str | None, s3: S3Target | None
    ) -> tuple[str, str]:
        """The Prefect asset's key and its web page, for the model's lineage."""
        where = cls.location(target, s3=s3, key_prefix=key_prefix)
        return where, where

    @classmethod
    def branch(cls, target: PublishTarget) -> str | None:
        """The branch committed to, where the destination has branches."""
        return None

    @classmethod
    def export_secrets(
        cls, console: ConsoleLike, *, hf_token: SecretStr | None, s3: S3Target | None
    ) -> None:
        """Hand the pod's shell what the client needs to write (hidden: ``set_secret_env``)."""
        return None

    @classmethod
    def publisher_arguments(
        cls, target: PublishTarget, *, hf_endpoint: str | None, s3: S3Target | None, key_prefix: str
    ) -> list[str]:
        """This kind's options of ``publisher.py`` (never a secret)."""
        return []

    @classmethod
    def pod_command(
        cls,
        target: PublishTarget,
        *,
        python: str,
        tools_dir: str,
        root: str,
        paths: list[str],
        hf_endpoint: str | None,
        s3: S3Target | None,
        key_prefix: str,
        deadline_seconds: float,
    ) -> str:
        """The command the pod runs; it prints one JSON line ``{"kind":
        "publish_result", "ok": …}`` (``revision``, ``keys``, ``attempts``, ``error``,
        ``status``, ``retryable`` as they apply). By default ``publisher.py``."""
        return publisher_command(
            python,
            f"{tools_dir.rstrip('/')}/publisher.py",
            target,
            root,
            paths,
            hf_endpoint=hf_endpoint,
            s3=s3,
            key_prefix=key_prefix,
            deadline_seconds=deadline_seconds,
        )

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
        """The destination's own record of each published file (path → record), read
        from this machine. May raise: the caller says nothing is verified."""
        raise NotImplementedError

    @classmethod
    def check_record(
        cls, entry: ManifestEntry, record: dict[str, Any]
    ) -> tuple[str, str | None, str | None]:
        """``(storage, remote_id, why)`` for one file: how the destination stores it,
        what it reported, and why it differs from the manifest's ``entry`` (None when
        it matches)."""
        raise NotImplementedError


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
        deadline_seconds: the publisher's own deadline, s.
    """
    parts = [python, script, target.kind, "--root", root]
    parts += ["--deadline-seconds", str(int(deadline_seconds))]
    kind = publish_kind(target.kind)
    parts += kind.publisher_arguments(target, hf_endpoint=hf_endpoint, s3=s3, key_prefix=key_prefix)
    parts += ["--files", *paths]
    return " ".join(shlex.quote(p) for p in parts)


_KINDS: dict[str, Any] = {
    "hf": "prefect_runpod.blocks.publish.hub:HubPublish",
    "s3": "prefect_runpod.blocks.publish.s3:S3Publish",
}
"""Kind name -> its class, or ``"module:Class"`` until first asked for."""


def publish_kind_names() -> tuple[str, ...]:
    """Every registered kind, the built-in ones first (``hf``, ``s3``)."""
    return tuple(_KINDS)


def publish_kind(name: str) -> type[PublishKind]:
    """The kind registered as ``name``, imported on first use.

    Raises:
        SpecError: no kind of that name.
    """
    found = _KINDS.get(name)
    if found is None:
        raise SpecError(f"publish kind {name!r} is not one of: {', '.join(publish_kind_names())}")
    if isinstance(found, str):
        module, _, attr = found.partition(":")
        found = getattr(importlib.import_module(module), attr)
        _KINDS[name] = found
    return found  # type: ignore[no-any-return]


def publish_forms() -> str:
    """How each registered kind is written, for messages (``hf:ORG/REPO[@BRANCH] or
    s3[:PREFIX]``)."""
    return " or ".join(publish_kind(name).form for name in publish_kind_names())


def register_publish_kind(cls: type[PublishKind], *, replace: bool = False) -> None:
    """Add a kind under its ``kind`` name.

    Raises:
        ValueError: the name is taken (and ``replace`` is False).
    """
    if cls.kind in _KINDS and not replace:
        raise ValueError(f"a publish kind named {cls.kind!r} is registered already")
    _KINDS[cls.kind] = cls


def unregister_publish_kind(name: str) -> None:
    """Remove the kind ``name`` (a no-op when it is not registered)."""
    _KINDS.pop(name, None)
