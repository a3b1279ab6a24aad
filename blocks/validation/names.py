"""Whole-string (``re.fullmatch``) rules for names and ids: the pod-name prefix, saved
block names, Hugging Face repo ids, environment variable names, concurrency limits, pod
ids, flow run ids; and the UTC timestamps RunPod's REST v2 takes."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.options import label
from prefect_runpod.blocks.validation.secrets import find_token_shape

__all__ = [
    "FLOW_RUN_ID_CHARS",
    "NAME_PREFIX_MAX_CHARS",
    "POD_NAME_MAX_CHARS",
    "check_block_name",
    "check_env_name",
    "check_flow_run_id",
    "check_limit_name",
    "check_name_prefix",
    "check_pod_id",
    "check_repo_id",
    "is_env_name",
    "utc_timestamp",
]

POD_NAME_MAX_CHARS = 60
"""The longest pod name sent to RunPod (dstack notes 60 characters work)."""
FLOW_RUN_ID_CHARS = 36
"""A flow run id as it appears in a pod name: a UUID with hyphens."""
NAME_PREFIX_MAX_CHARS = POD_NAME_MAX_CHARS - FLOW_RUN_ID_CHARS - 1
"""23: ``<prefix>-<flow_run_id>`` must fit in a pod name."""

_NAME_PREFIX = re.compile(rf"[a-z][a-z0-9-]{{0,{NAME_PREFIX_MAX_CHARS - 1}}}")
_BLOCK_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_LIMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_POD_ID = re.compile(r"[a-z0-9]{1,64}")
"""A pod id as RunPod shapes it (``50qynxzilsxoey``): lowercase letters and digits, no
hyphen; local pods are given ids of the same shape."""
_FLOW_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _whole(pattern: re.Pattern[str], value: Any, name: str, problem: str) -> str:
    """``value`` when it is a string that ``pattern`` matches whole, else ``SpecError``
    ``<label> <value> <problem>``."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SpecError(f"{label(name)} {value!r} {problem}")
    return value


def check_name_prefix(prefix: Any, name: str = "name_prefix") -> str:
    """A pod-name prefix: a lowercase letter, then lowercase letters, digits or ``-``,
    at most :data:`NAME_PREFIX_MAX_CHARS` characters in all (pods are found and reaped
    by it, and ``<prefix>-<flow_run_id>`` must fit RunPod's name limit).

    Raises:
        SpecError: otherwise.
    """
    return _whole(
        _NAME_PREFIX,
        prefix,
        name,
        f"must be 1-{NAME_PREFIX_MAX_CHARS} lowercase letters, digits or '-', starting with "
        "a letter (pods are named <prefix>-<flow_run_id> and found by it): use e.g. 'prft'.",
    )


def check_block_name(block_name: Any, name: str) -> str:
    """A saved block's name as Prefect allows it: lowercase letters, digits and ``-``.

    Raises:
        SpecError: otherwise (an empty name included).
    """
    return _whole(
        _BLOCK_NAME,
        block_name,
        name,
        "is not a block name: Prefect block names are lowercase letters, digits and '-'; "
        "give the name the block was saved under.",
    )


def check_repo_id(repo_id: Any, name: str = "model_id") -> str:
    """A Hugging Face repo id: ``name`` or ``namespace/name`` (letters, digits, ``._-``).

    Raises:
        SpecError: otherwise.
    """
    problem = (
        "is not a Hugging Face repo id: use 'namespace/name' as on the model's page, "
        "e.g. 'meta-llama/Llama-3.2-1B'."
    )
    if isinstance(repo_id, str) and ".." in repo_id:
        raise SpecError(f"{label(name)} {repo_id!r} {problem}")
    return _whole(_REPO_ID, repo_id, name, problem)


def check_env_name(env_name: Any, name: str = "hf_token_env") -> str:
    """The name of an environment variable (POSIX: letters, digits, ``_``; not a digit
    first). A value that looks like a token is refused without repeating it.

    Raises:
        SpecError: otherwise.
    """
    if isinstance(env_name, str) and find_token_shape(env_name):
        raise SpecError(
            f"{label(name)} takes the NAME of an environment variable, and what was given "
            "looks like a token itself: export the token (export HF_TOKEN=...) and pass "
            "the variable's name, e.g. HF_TOKEN; rotate the token if it was typed in a shell."
        )
    return _whole(
        _ENV_NAME,
        env_name,
        name,
        "is not an environment variable name: use letters, digits and '_', not starting "
        "with a digit, e.g. HF_TOKEN.",
    )


def is_env_name(value: Any) -> bool:
    """True when ``value`` is a whole environment variable name (POSIX: letters, digits,
    ``_``, not a digit first); a trailing newline does not pass."""
    return isinstance(value, str) and _ENV_NAME.fullmatch(value) is not None


def check_pod_id(pod_id: Any, name: str = "pod_id") -> str:
    """A pod id as RunPod shapes it: lowercase letters and digits only, whole string.

    The ``runpod`` SDK pastes the id into GraphQL text unescaped, so anything else (a
    trailing newline, a quote, a hyphen) is refused before a request is sent.

    Raises:
        SpecError: otherwise, with the way to list the real ids.
    """
    return _whole(
        _POD_ID,
        pod_id,
        name,
        "is not a pod id: pod ids are lowercase letters and digits (e.g. 50qynxzilsxoey); "
        "`prefect-runpod pods` lists the live ones.",
    )


def check_flow_run_id(run_id: Any, name: str = "run_id") -> str:
    """A Prefect flow run id: a UUID in its usual lowercase form, whole string.

    Returns:
        The id in lowercase.

    Raises:
        SpecError: otherwise.
    """
    text = run_id.lower() if isinstance(run_id, str) else run_id
    return _whole(
        _FLOW_RUN_ID,
        text,
        name,
        "is not a flow run id: give the run's UUID as the Prefect UI or `prefect-runpod "
        "cost` shows it (e.g. 3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d).",
    )


def utc_timestamp(moment: datetime) -> str:
    """``2026-04-15T00:00:00Z``: an aware datetime as the RFC 3339 UTC text RunPod's
    REST v2 takes (billing's ``startTime`` / ``endTime``), to the second.

    Raises:
        ValueError: a naive datetime (its zone would be a guess).
    """
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {moment.isoformat()} has no timezone; use UTC-aware times")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_limit_name(limit: Any, name: str = "concurrency_limit") -> str:
    """A Prefect global concurrency limit name (letters, digits, ``._-``).

    Raises:
        SpecError: otherwise.
    """
    return _whole(
        _LIMIT_NAME,
        limit,
        name,
        "is not a concurrency limit name: use letters, digits, '.', '_' or '-', e.g. runpod-gpu.",
    )
