"""Which files of a bundle go to the pod (docs/architecture.md#what-a-bundle-uploads).

A bundle is uploaded whole, minus:

- the built-in excludes :data:`BUILTIN_EXCLUDES` (``__pycache__/``, ``.git/``, ``*.pyc``:
  caches and history a job never needs, and which a bundle installed from a wheel
  carries);
- what its ``.prefectrunpodignore`` (:data:`IGNORE_FILE`, gitignore syntax, read by
  ``pathspec``) leaves out; a ``!pattern`` line can take a built-in exclude back, and as
  in git a file inside an excluded folder cannot be taken back;
- the run's own output folder when it lies inside the bundle.

What remains is scanned before anything is rented: a file that looks like a secret
(:data:`SECRET_RULES`: by its path, or by the first :data:`SCAN_BYTES` bytes of its
content) stops the run, naming each file and why, unless the run allows that file
explicitly (``allow_secret_files`` / ``--allow-secret-file PATH``, gitignore patterns
too). Symbolic links (to files, to directories, dangling) and empty directories are
listed as the transfer will see them, never followed by the scan; whether a link may
leave the bundle is the transfer manifest's rule (``blocks/pod_side/manifest.py``).
A path that cannot travel stops the run too, each one named: a special file (a FIFO, a
socket, a device: no bytes to copy), or a name that is not valid UTF-8 or holds a
newline, NUL or another control character.

Plain functions, no Prefect: ``select_bundle_files`` is what preflight calls.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec
from pydantic import BaseModel, Field

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_side.manifest import is_transfer_scratch
from prefect_runpod.blocks.validation import TOKEN_SHAPES, file_name_problem, shown_name

__all__ = [
    "BUILTIN_EXCLUDES",
    "IGNORE_FILE",
    "SCAN_BYTES",
    "SECRET_RULES",
    "BundleFiles",
    "SecretRule",
    "find_secret_files",
    "refuse_untravellable",
    "select_bundle_files",
]

IGNORE_FILE = ".prefectrunpodignore"
"""The bundle's ignore file, at its root, in gitignore syntax."""
BUILTIN_EXCLUDES: tuple[str, ...] = ("__pycache__/", ".git/", "*.pyc")
"""Left out of every upload unless the ignore file takes them back with ``!``."""
SCAN_BYTES = 64 * 1024
"""How much of each file the secret scan reads (a secret sits near the top of the files
that hold one; a large checkpoint is not read through)."""


@dataclass(frozen=True)
class SecretRule:
    """One way a file can look like a secret.

    Attributes:
        what: what such a file is, for the message (``a dotenv file``).
        paths: gitignore patterns of file paths that hold secrets by their nature.
        content: a regex over the first ``SCAN_BYTES`` bytes, or None.
        exempt: gitignore patterns a path rule does not apply to (``.env.example``).
    """

    what: str
    paths: tuple[str, ...] = ()
    content: re.Pattern[bytes] | None = None
    exempt: tuple[str, ...] = ()

    def matches(self, rel_path: str, head: bytes | None) -> bool:
        """True when the file at ``rel_path`` whose first bytes are ``head`` (None: not
        read, e.g. a link) looks like this kind of secret."""
        by_path = bool(self.paths) and _spec(self.paths).match_file(rel_path)
        if by_path and not (self.exempt and _spec(self.exempt).match_file(rel_path)):
            return True
        return bool(self.content is not None and head and self.content.search(head))


@functools.lru_cache(maxsize=64)
def _compiled(patterns: tuple[str, ...]) -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines(list(patterns))


def _spec(patterns: Iterable[str]) -> pathspec.GitIgnoreSpec:
    return _compiled(tuple(patterns))


SECRET_RULES: tuple[SecretRule, ...] = (
    SecretRule(
        "a dotenv file",
        paths=(".env", ".env.*", "*.env"),
        exempt=(".env.example", ".env.sample", ".env.template", ".env.dist"),
    ),
    SecretRule(
        "a private key",
        content=re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    ),
    SecretRule(
        "AWS credentials",
        paths=("**/.aws/credentials",),
        content=re.compile(rb"(?im)^[ \t]*aws_secret_access_key[ \t]*[=:]"),
    ),
    SecretRule(
        "a Google Cloud credentials file",
        paths=("application_default_credentials.json", "**/gcloud/credentials.db"),
        content=re.compile(rb'"type"\s*:\s*"(?:service_account|authorized_user)"'),
    ),
    SecretRule("Azure CLI credentials", paths=("**/.azure/accessTokens.json", "**/.azure/msal_token_cache.*")),
    SecretRule(
        "a password file (netrc, pgpass, git credentials)",
        paths=(".netrc", "_netrc", ".pgpass", ".git-credentials"),
    ),
    SecretRule(
        "a registry login (docker, npm, PyPI)",
        paths=("**/.docker/config.json", ".npmrc", ".pypirc"),
    ),
    SecretRule("a Kubernetes config", paths=("**/.kube/config",), content=re.compile(rb"client-key-data:")),
    SecretRule("a saved Hugging Face login", paths=("**/huggingface/token", "**/.huggingface/token")),
    *(SecretRule(shape.what, content=shape.pattern) for shape in TOKEN_SHAPES),
)  # fmt: skip
"""Every rule of the secret scan. Path patterns are gitignore patterns over the path
inside the bundle; content patterns see the first ``SCAN_BYTES`` bytes."""


class BundleFiles(BaseModel):
    """The files of a bundle that an upload sends.

    Attributes:
        root: the bundle directory (absolute).
        files: relative POSIX paths, sorted: files, links and empty directories.
        total_bytes: their total size in bytes.
        ignored_files: how many files the excludes and the ignore file left out.
        allowed_secrets: secret-looking files sent anyway because the run allowed them.
    """

    root: str
    files: list[str] = Field(default_factory=list)
    total_bytes: int = Field(default=0, ge=0)
    ignored_files: int = Field(default=0, ge=0)
    allowed_secrets: list[str] = Field(default_factory=list)


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(BUILTIN_EXCLUDES)
    ignore = root / IGNORE_FILE
    if ignore.is_file() and not ignore.is_symlink():
        try:
            lines += ignore.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{ignore} cannot be read ({exc}): fix or remove it.") from None
    try:
        return _spec(lines)
    except ValueError as exc:  # pathspec's pattern errors are ValueErrors
        raise SpecError(f"{ignore} has a line gitignore cannot read ({exc}): fix it.") from None


def _walk(
    root: Path, ignore: pathspec.GitIgnoreSpec, skip: Sequence[Path]
) -> tuple[list[str], int]:
    """(kept relative paths, count of files left out), links not followed: what the
    transfer manifest describes — regular files, symbolic links (to a file, to a
    directory, or dangling: the manifest's rule decides whether each may travel) and
    empty directories."""
    kept: list[str] = []
    ignored = 0
    skip_real = {os.path.realpath(p) for p in skip}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for name in sorted(dirnames):
            full = os.path.join(dirpath, name)
            link = os.path.islink(full)
            pattern = f"{prefix}{name}" if link else f"{prefix}{name}/"
            if ignore.match_file(pattern) or os.path.realpath(full) in skip_real:
                dirnames.remove(name)
                ignored += sum(len(f) for _, _, f in os.walk(full)) if not link else 1
            elif link:
                kept.append(f"{prefix}{name}")  # a link to a directory: never entered
        for name in filenames:
            rel = f"{prefix}{name}"
            full = os.path.join(dirpath, name)
            if is_transfer_scratch(name):
                continue
            if ignore.match_file(rel):
                ignored += 1
                continue
            kept.append(rel)
        if prefix and not [n for n in os.listdir(dirpath) if not is_transfer_scratch(n)]:
            kept.append(prefix.rstrip("/"))  # an empty directory travels too
    kept.sort()
    return kept, ignored


def _special_kind(path: str) -> str | None:
    """What a path is when it is neither a regular file, a folder nor a link (``a
    FIFO``, ``a socket``, ``a device``): such a file has no bytes to copy and cannot
    travel."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def refuse_untravellable(root: Path, files: Iterable[str]) -> None:
    """Refuse, naming each, the paths of ``files`` (relative to ``root``) that cannot
    travel to a pod: a special file (FIFO, socket, device), or a name that is not valid
    UTF-8 or holds a newline, NUL or another control character
    (``validation.file_name_problem``).

    Raises:
        SpecError: one sentence listing every such path and why.
    """
    found = []
    for rel in files:
        problem = file_name_problem(rel)
        if problem is not None:
            found.append(f"{shown_name(rel)} ({problem})")
            continue
        kind = _special_kind(os.path.join(root, *rel.split("/")))
        if kind is not None:
            found.append(f"{rel} ({kind})")
    if found:
        raise SpecError(
            f"the bundle {root} holds {len(found)} path(s) that cannot travel to a pod: "
            f"{'; '.join(found)}. Rename or remove them, or leave them out in {IGNORE_FILE}."
        )


def _regular_size(path: str) -> int:
    """The size in bytes of a regular file; 0 for a link or a directory (no bytes of
    their own travel)."""
    return os.path.getsize(path) if os.path.isfile(path) and not os.path.islink(path) else 0


def _head(path: str) -> bytes | None:
    """The first ``SCAN_BYTES`` of a regular file; None for a link (never followed)."""
    if os.path.islink(path):
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read(SCAN_BYTES)
    except OSError:
        return None


def find_secret_files(root: Path, files: Iterable[str]) -> list[tuple[str, str]]:
    """``(relative path, what it looks like)`` for each of ``files`` under ``root`` that a
    rule of :data:`SECRET_RULES` matches (the first matching rule names it)."""
    found = []
    for rel in files:
        head = _head(os.path.join(root, *rel.split("/")))
        for rule in SECRET_RULES:
            if rule.matches(rel, head):
                found.append((rel, rule.what))
                break
    return found


def select_bundle_files(
    root: str | Path,
    *,
    allow_secret_files: Sequence[str] = (),
    skip_dirs: Sequence[str | Path] = (),
) -> BundleFiles:
    """The files of the bundle at ``root`` an upload sends (see the module docstring).

    Args:
        root: the bundle directory.
        allow_secret_files: gitignore patterns of secret-looking files to send anyway.
        skip_dirs: folders never sent (the run's output folder, when inside the bundle).

    Returns:
        ``BundleFiles``: the paths, their total bytes, how many were left out.

    Raises:
        SpecError: the ignore file cannot be read, a path cannot travel (a special file,
            a name that is not UTF-8 or holds a control character), or files look like
            secrets and are not allowed (each named with the reason).
    """
    base = Path(root).resolve()
    files, ignored = _walk(base, _ignore_spec(base), [Path(p) for p in skip_dirs])
    refuse_untravellable(base, files)
    secrets = find_secret_files(base, files)
    allow = _spec(allow_secret_files) if allow_secret_files else None
    refused = [(p, why) for p, why in secrets if allow is None or not allow.match_file(p)]
    if refused:
        named = "; ".join(f"{path} ({why})" for path, why in refused)
        raise SpecError(
            f"the bundle {base} holds {len(refused)} file(s) that look like secrets and "
            f"would be copied to a rented pod: {named}. Leave them out in {IGNORE_FILE}, "
            "or send one on purpose with --allow-secret-file PATH (allow_secret_files)."
        )
    total = sum(_regular_size(os.path.join(base, *p.split("/"))) for p in files)
    return BundleFiles(
        root=str(base),
        files=files,
        total_bytes=total,
        ignored_files=ignored,
        allowed_secrets=[p for p, _ in secrets],
    )
