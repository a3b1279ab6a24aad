"""Text that must survive being a path, a shell command or a file name on the pod:
empty path strings, control characters in commands, file names that cannot travel,
unknown keys of a table (with the nearest known one), pip requirement specifiers
(read by ``packaging``, the parser pip itself uses)."""

from __future__ import annotations

import difflib
import os
import unicodedata
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.options import label

__all__ = [
    "check_command",
    "check_inside_path",
    "check_path_text",
    "check_requirement",
    "check_table_keys",
    "control_character",
    "file_name_problem",
    "shown_name",
]

_ALLOWED_IN_COMMANDS = frozenset("\t\n")
"""Whitespace a shell command may hold (a TOML multi-line string); every other C0/C1
control character, DEL included, is refused."""


def control_character(text: str, allowed: Iterable[str] = ()) -> str | None:
    """The first control character of ``text`` as a person reads it (``NUL, U+0000``),
    or None when there is none (``allowed`` ones aside)."""
    keep = set(allowed)
    for char in text:
        if unicodedata.category(char) == "Cc" and char not in keep:
            name = _CONTROL_NAMES.get(ord(char), "a control character")
            return f"{name}, U+{ord(char):04X}"
    return None


_CONTROL_NAMES = {0: "NUL", 8: "backspace", 10: "a newline", 13: "a carriage return", 27: "ESC"}


def check_path_text(name: str, value: Any) -> Any:
    """A path given as text must not be empty or blank (``--bundle ''`` would otherwise
    mean the current folder, or the default) nor hold a control character (a newline
    splits the one-line messages and summaries that show the path, and a gitignore
    pattern in two; an escape sequence rewrites the terminal that shows it).

    Args:
        name: the parameter (``bundle``); the message adds its CLI option.
        value: the value as given (None and non-strings pass: the caller's default).

    Returns:
        The value.

    Raises:
        SpecError: an empty or blank string, or one with a control character.
    """
    if isinstance(value, str) and not value.strip():
        raise SpecError(
            f"{label(name)} is an empty path: give a path, or leave the option out for its default."
        )
    found = control_character(value) if isinstance(value, str) else None
    if found:
        raise SpecError(
            f"{label(name)} {value!r} holds a control character ({found}): give the path "
            "without it."
        )
    return value


def check_inside_path(name: str, value: str) -> str:
    """A relative path (or gitignore pattern) inside a folder: not empty, not absolute,
    no ``..`` part.

    Raises:
        SpecError: the first of those that does not hold, naming the value.
    """
    check_path_text(name, value)
    path = PurePosixPath(value.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or value.startswith("~"):
        raise SpecError(
            f"{label(name)} {value!r} is outside the bundle: give a path relative to the "
            "bundle's root (a gitignore pattern such as data/token.txt)."
        )
    return value


def check_command(what: str, command: str) -> str:
    """A shell command from ``bundle.toml`` holds no control character but tab and
    newline: a NUL would cut the command that is logged short of the one that runs, an
    escape sequence would rewrite the terminal that shows it.

    Raises:
        ValueError: the character named (raised inside pydantic validators).
    """
    found = control_character(command, _ALLOWED_IN_COMMANDS)
    if found:
        raise ValueError(
            f"the {what} command holds a control character ({found}): remove it from bundle.toml"
        )
    return command


def check_requirement(text: str) -> str:
    """One pip requirement specifier (PEP 508: ``torch>=2.1``, ``peft[extra]==0.11``),
    read by ``packaging.requirements.Requirement`` as pip reads it.

    Raises:
        ValueError: anything else, with packaging's own reason.
    """
    from packaging.requirements import InvalidRequirement, Requirement  # 40 ms: bundles only

    try:
        Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        example = "'name @ URL'" if "://" in text else "'torch>=2.1'"
        raise ValueError(
            f"requirement {text!r} is not a pip requirement specifier ({reason}): write it "
            f"as pip takes it, e.g. {example}"
        ) from None
    return text


def check_table_keys(
    keys: Iterable[str], known: Iterable[str], table: str, file: object = None
) -> None:
    """Every key of a table is one the reader knows; an unknown one is named with the
    nearest known key (``difflib``) when one is close.

    Args:
        keys: the table's keys.
        known: the keys it may hold (one table, so a new key is one entry there).
        table: the table, for the message (``[job]``).
        file: the file that holds it, for the message, or None.

    Raises:
        SpecError: the first unknown key.
    """
    allowed = sorted(known)
    for key in keys:
        if key in allowed:
            continue
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(allowed)}."
        where = f"{file}: " if file is not None else ""
        raise SpecError(f"{where}unknown key {key!r} in {table}: {hint} Fix the file.")


def file_name_problem(rel: str) -> str | None:
    """Why a bundle path cannot travel to a pod by name, or None: not valid UTF-8 (the
    transfer and the pod's manifest speak UTF-8), a newline, NUL or another control
    character (a listing could not be read back line by line)."""
    try:
        os.fsencode(rel).decode("utf-8")
    except UnicodeDecodeError:
        return "its name is not valid UTF-8"
    found = control_character(rel)
    if found is None:
        return None
    return f"its name holds {'a newline' if found.startswith('a newline') else found}"


def shown_name(rel: str) -> str:
    """A path as a message can show it, quoted, every byte that is no printable UTF-8
    escaped (``'data/caf\\xe9.txt'``, ``'a\\nb.txt'``)."""
    raw = os.fsencode(rel)
    try:
        return repr(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "'" + repr(raw)[2:-1] + "'"
