"""Places a run reaches: an ``http(s)`` URL without credentials (:func:`check_url`), an
output directory this process can write in (:func:`check_output_dir`) and one that holds
no earlier run's files unless overwriting was asked for (:func:`check_output_dir_unused`)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.options import label
from prefect_runpod.blocks.validation.secrets import find_token_shape

__all__ = [
    "check_output_dir",
    "check_output_dir_unused",
    "check_url",
]

_URL_TEXT = re.compile(r"[!-~]+")  # printable ASCII, no spaces


def check_url(url: Any, name: str, *, example: str = "https://huggingface.co") -> str:
    """An ``http(s)://host[:port][/path]`` URL without credentials in it.

    Returns:
        The URL without trailing slashes.

    Raises:
        SpecError: not a string, another scheme, no host, a bad port, spaces or control
            characters, or ``user:password@`` inside (credentials belong in a block).
    """
    problem = None
    if not isinstance(url, str) or not _URL_TEXT.fullmatch(url):
        problem = "is not a URL"
    else:
        try:
            parts = urlsplit(url)
        except ValueError:  # an unclosed IPv6 bracket: 'http://[::1'
            parts = None
        try:
            port_ok = parts is None or parts.port is None or 0 < parts.port < 65536
        except ValueError:
            port_ok = False
        if parts is None:
            problem = "is not a URL"
        elif parts.scheme not in ("http", "https"):
            problem = "must start with http:// or https://"
        elif not parts.hostname:
            problem = "names no host"
        elif parts.username is not None or parts.password is not None:
            problem = "carries credentials (user:password@); put them in a block instead"
        elif not port_ok:
            problem = "has an invalid port"
    if problem:
        shown = url if isinstance(url, str) and not find_token_shape(url) else "<hidden>"
        raise SpecError(f"{label(name)} {shown!r} {problem}: give a URL like {example}.")
    return url.rstrip("/")


def check_output_dir(path: Any, name: str = "output_dir") -> Path:
    """A directory this process can create files in (it need not exist yet).

    The nearest existing folder on the way is probed by creating and removing one
    temporary file, so permissions, read-only mounts and quotas all count.

    Returns:
        The absolute path (``~`` expanded).

    Raises:
        SpecError: it (or a folder on the way) is a file, or nothing can be written there.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise SpecError(f"{label(name)} {path!r} is not a path: give a directory.")
    target = Path(path).expanduser().resolve()
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "is a file" if probe == target else f"lies under {probe}, which is a file"
        raise SpecError(f"{label(name)} {target} {where}, not a directory: give a directory.")
    try:
        fd, scratch = tempfile.mkstemp(dir=probe, prefix=".prefect-runpod-probe-")
        os.close(fd)
        os.unlink(scratch)
    except OSError as exc:
        raise SpecError(
            f"{label(name)} {target} is not writable ({exc.strerror} in {probe}): choose a "
            "directory you can write to."
        ) from None
    return target


def check_output_dir_unused(path: Path, *, overwrite: bool, name: str = "output_dir") -> None:
    """Refuse an output directory that already holds something, unless ``overwrite``:
    a run writing over an earlier run's ``model.json``, with that run's other files left
    beside the new ones, loses the earlier model without a word.

    Args:
        path: the absolute output directory (it need not exist).
        overwrite: the run may write over what is there (``--overwrite``).

    Raises:
        SpecError: ``path`` is a directory with entries in it and ``overwrite`` is off
            (a few named, with the two ways out).
    """
    if overwrite or not path.is_dir():
        return
    names = sorted(os.listdir(path))
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise SpecError(
        f"{label(name)} {path} is not empty ({shown}): give a new or empty folder, or "
        f"pass {label('overwrite')} to write over what is there."
    )
