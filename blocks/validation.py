"""The one validation layer for what a person or a pipeline asks of prefect-runpod
(docs/architecture.md#input-validation).

The CLI, the fine-tune flow's parameters, the blocks, the reaper and every later
command check their input here, so a limit is written once and cannot disagree between
two entry points. Everything is a plain function (or a pydantic type built from one)
that raises ``SpecError`` with one sentence: what was wrong and what to do. None of it
rents, writes or sends anything; only :func:`load_block` and :func:`saved_block_names`
talk to the Prefect API.

Sections: numbers (:data:`NUMBER_RULES`, :func:`check_number`, :func:`constrained`),
names, places (URLs, the output dir), options of the other provider, secrets (token
shapes, no token in a parameter), saved blocks (:func:`load_block`). Matches are
whole-string (``re.fullmatch``), never prefix matches.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast
from urllib.parse import urlsplit

from pydantic import AfterValidator

from prefect_runpod.blocks.exceptions import SpecError

if TYPE_CHECKING:
    from prefect.blocks.core import Block

__all__ = [
    "FLOW_RUN_ID_CHARS",
    "NAME_PREFIX_MAX_CHARS",
    "NUMBER_RULES",
    "OPTIONS",
    "POD_NAME_MAX_CHARS",
    "PROVIDER_OPTIONS",
    "SECRET_ENV_NAME",
    "TOKEN_SHAPES",
    "NumberRule",
    "TokenShape",
    "check_block_name",
    "check_choice",
    "check_env_name",
    "check_flow_run_id",
    "check_limit_name",
    "check_name_prefix",
    "check_number",
    "check_output_dir",
    "check_pod_id",
    "check_provider_options",
    "check_repo_id",
    "check_url",
    "check_utc_timestamp",
    "constrained",
    "find_token_shape",
    "is_env_name",
    "label",
    "load_block",
    "pydantic_reason",
    "refuse_secret_values",
    "saved_block_names",
    "utc_timestamp",
]

B = TypeVar("B", bound="Block")

OPTIONS: dict[str, str] = {
    "bundle": "--bundle", "provider": "--provider", "model_id": "--model-id",
    "hf_endpoint": "--hf-endpoint", "hf_credentials_block": "--hf-credentials",
    "hf_token_secret": "--hf-token-secret", "hf_token_env": "--hf-token-env",
    "transfer_method": "--transfer", "follow_links": "--follow-links",
    "max_cost_usd": "--max-cost-usd",
    "max_runtime_seconds": "--max-runtime-seconds", "parity_tolerance": "--parity-tolerance",
    "name_prefix": "--name-prefix", "local_mode": "--local-mode",
    "local_cost_per_hr": "--local-cost-per-hr", "local_image": "--local-image",
    "output_dir": "--output-dir",
    "concurrency_limit": "--concurrency-limit",
    "heartbeat_stale_seconds": "--heartbeat-stale-seconds",
    "pod_lifetime_seconds": "--pod-lifetime-seconds",
    "reconnect_budget_seconds": "--reconnect-budget-seconds",
    "runpod_credentials_block": "--runpod-credentials", "runpod_spec_block": "--runpod-spec",
    "ssh_key_block": "--ssh-key", "s3_target_block": "--s3-target",
    "gpu_type_ids": "--gpu-type", "allow_secret_files": "--allow-secret-file",
    "ttl_seconds": "--ttl-seconds", "publish": "--publish",
    "publish_public": "--publish-public", "download": "--download",
    "pod_poll_seconds": "--pod-poll-seconds",
    "terminate_timeout_seconds": "--terminate-timeout-seconds", "run_id": "RUN_ID",
    "pod_id": "POD_ID",
    "pty_framing": "--pty-framing", "pty_streams": "--pty-streams",
}  # fmt: skip
"""Each run parameter and the ``prefect-runpod`` option that sets it, so a message names
both: a CLI user and a deployment's caller each recognise their own spelling."""


def label(name: str) -> str:
    """``max_cost_usd (--max-cost-usd)``: a parameter with its CLI option, or the bare
    name when the CLI has no option for it."""
    option = OPTIONS.get(name)
    return f"{name} ({option})" if option else name


# --- numbers ---------------------------------------------------------------------------

_DAY_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class NumberRule:
    """The unit and range of one numeric input.

    Attributes:
        name: the parameter (``max_cost_usd``); :func:`label` adds its CLI option.
        unit: ``USD``, ``USD/h``, ``s`` or ``""`` (a plain fraction).
        meaning: what the number is, for the message (``the budget cap``).
        example: a sensible value, shown in the message.
        gt / ge / lt / le: the bounds (None for none); every value must also be finite.
        whole: only whole numbers (a count).
    """

    name: str
    unit: str
    meaning: str
    example: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    whole: bool = False

    def describe(self) -> str:
        """``a finite number of USD above 0 and at most 100000``."""
        unit = {"s": " of seconds", "USD": " of USD", "USD/h": " of USD per hour"}.get(
            self.unit, ""
        )
        parts = []
        if self.gt is not None:
            parts.append(f"above {_num(self.gt)}")
        if self.ge is not None:
            parts.append(f"at least {_num(self.ge)}")
        if self.lt is not None:
            parts.append(f"below {_num(self.lt)}")
        if self.le is not None:
            parts.append(f"at most {_num(self.le)}")
        kind = "a whole number" if self.whole else "a finite number"
        return f"{kind}{unit}" + (f" {' and '.join(parts)}" if parts else "")

    def fits(self, value: float) -> bool:
        """True when ``value`` (finite) lies inside the bounds."""
        return not (
            (self.whole and not float(value).is_integer())
            or (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
        )


def _num(value: float) -> str:
    """``2592000`` rather than ``2.592e+06``; fractions as ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _rules(*rules: NumberRule) -> dict[str, NumberRule]:
    return {r.name: r for r in rules}


NUMBER_RULES: dict[str, NumberRule] = _rules(
    NumberRule("max_cost_usd", "USD", "the budget cap", "2", gt=0, le=100_000),
    NumberRule("max_runtime_seconds", "s", "the training runtime cap", "3600", gt=0, le=30 * _DAY_SECONDS),
    NumberRule("parity_tolerance", "", "the allowed accuracy gap, a fraction", "0.02", ge=0, lt=1),
    NumberRule("local_cost_per_hr", "USD/h", "the local pod's pretend price", "0.22", ge=0, le=1000),
    NumberRule("heartbeat_stale_seconds", "s", "how old the flow's heartbeat may get before the pod removes itself", "900", gt=0, le=30 * _DAY_SECONDS),
    NumberRule("pod_lifetime_seconds", "s", "the hard cap on the pod's life", "21600", gt=0, le=30 * _DAY_SECONDS),
    NumberRule("check_interval_seconds", "s", "how often the pod-side watchdog looks", "30", gt=0, le=_DAY_SECONDS),
    NumberRule("reconnect_budget_seconds", "s", "how long a stage waits for the pod's SSH to come back", "120", gt=0, le=_DAY_SECONDS),
    NumberRule("ttl_seconds", "s", "the age after which the reaper ends any pod (default: the pod's recorded lifetime plus a grace)", "22200", gt=0, le=365 * _DAY_SECONDS),
    NumberRule("pod_poll_seconds", "s", "how often the run asks the provider whether its pod still lives", "10", gt=0, le=3600),
    NumberRule("terminate_timeout_seconds", "s", "how long terminate waits for the provider to confirm the pod gone", "120", gt=0, le=3600),
    NumberRule("stale_running_seconds", "s", "the silence after which a running flow counts as dead", "900", gt=0, le=365 * _DAY_SECONDS),
    NumberRule("grace_seconds", "s", "how long a pod of an unknown run is spared", "60", ge=0, le=_DAY_SECONDS),
    NumberRule("max_usd_per_hour", "USD/h", "the highest price per hour to rent at", "0.5", ge=0, le=1000),
    NumberRule("pty_streams", "", "how many PTY sessions a pty transfer stripes over", "4", ge=1, le=16, whole=True),
    NumberRule("max_seconds", "s", "how long `logs --follow` follows", "3600", gt=0, le=30 * _DAY_SECONDS),
)  # fmt: skip
"""Every numeric input of a run, the reaper and the blocks, with its unit and range."""


def check_number(name: str, value: Any, *, optional: bool = False) -> float | None:
    """Check one numeric input against its rule in :data:`NUMBER_RULES`.

    Args:
        name: the rule's name (``max_cost_usd``).
        value: the value as given (a float, an int; anything else is refused).
        optional: None is accepted (and returned) when True.

    Returns:
        The value as a float (None when optional and None).

    Raises:
        SpecError: NaN, an infinity, a boolean, a non-number, or a value out of range;
            the message names the parameter and its option, the range and an example.
        KeyError: ``name`` has no rule (a programming error, not bad input).
    """
    rule = NUMBER_RULES[name]
    if value is None and optional:
        return None
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number is None or not math.isfinite(number) or not rule.fits(number):
        option = OPTIONS.get(name)
        example = f"{option} {rule.example}" if option else f"{name}={rule.example}"
        raise SpecError(
            f"{label(name)} must be {rule.describe()}, got {value!r}: give {rule.meaning}, "
            f"e.g. {example}."
        )
    return number


def constrained(name: str, *, optional: bool = False) -> Any:
    """A pydantic type that applies :func:`check_number` with rule ``name``, for models
    and blocks (``heartbeat_stale_seconds: constrained("heartbeat_stale_seconds")``).

    A failing value raises pydantic's ``ValidationError`` whose text is the rule's
    sentence.
    """
    NUMBER_RULES[name]  # fail at import for an unknown rule
    base: Any = float | None if optional else float
    return Annotated[base, AfterValidator(lambda v: check_number(name, v, optional=optional))]


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices`` (``pty_framing`` in auto, raw, base64).

    Returns:
        The value.

    Raises:
        SpecError: anything else; the message names the parameter, its option and the
            choices.
    """
    allowed = tuple(choices)
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"{label(name)} {value!r} is not one of: {', '.join(allowed)}.")
    return value


# --- names -----------------------------------------------------------------------------

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
_UTC_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


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
    """``2026-04-15T00:00:00Z``: an aware datetime as the ISO-8601 UTC text RunPod's
    ``terminateAfter`` takes (runpodctl 2.x sends this form), to the second.

    Raises:
        ValueError: a naive datetime (its zone would be a guess).
    """
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {moment.isoformat()} has no timezone; use UTC-aware times")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_utc_timestamp(value: Any, name: str) -> str:
    """An ISO-8601 UTC timestamp to the second (``2026-04-15T00:00:00Z``), whole string,
    naming a real moment: safe to inline into GraphQL text.

    Raises:
        SpecError: otherwise.
    """
    problem = "is not an ISO-8601 UTC time like 2026-04-15T00:00:00Z"
    text = _whole(_UTC_TIMESTAMP, value, name, problem + ".")
    try:
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise SpecError(f"{label(name)} {text!r} {problem}: no such date.") from None
    return text


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


# --- places ----------------------------------------------------------------------------

_URL_TEXT = re.compile(r"[!-~]+")  # printable ASCII, no spaces


def check_url(url: Any, name: str) -> str:
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
        parts = urlsplit(url)
        try:
            port_ok = parts.port is None or 0 < parts.port < 65536
        except ValueError:
            port_ok = False
        if parts.scheme not in ("http", "https"):
            problem = "must start with http:// or https://"
        elif not parts.hostname:
            problem = "names no host"
        elif parts.username is not None or parts.password is not None:
            problem = "carries credentials (user:password@); put them in a block instead"
        elif not port_ok:
            problem = "has an invalid port"
    if problem:
        shown = url if isinstance(url, str) and not find_token_shape(url) else "<hidden>"
        raise SpecError(
            f"{label(name)} {shown!r} {problem}: give a URL like https://huggingface.co."
        )
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


# --- provider options ------------------------------------------------------------------

PROVIDER_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("local_mode", "local_cost_per_hr", "local_image"),
    "runpod": ("runpod_credentials_block", "runpod_spec_block", "ssh_key_block", "gpu_type_ids"),
}
"""The parameters that mean something for one provider only. Later provider-specific
options are added here, and :func:`check_provider_options` refuses them elsewhere."""


def check_provider_options(provider: str, given: Mapping[str, Any]) -> None:
    """Refuse options of the other provider (``--gpu-type`` with the local pod, say):
    silently ignoring them would run something other than what was asked.

    Args:
        provider: the chosen provider (``local`` or ``runpod``).
        given: parameter name -> value; None, ``""`` and ``[]`` count as not given.

    Raises:
        SpecError: an unknown provider, or an option of another provider was given.
    """
    if provider not in PROVIDER_OPTIONS:
        raise SpecError(
            f"{label('provider')} {provider!r} is not one of: {', '.join(PROVIDER_OPTIONS)}."
        )
    for other, names in PROVIDER_OPTIONS.items():
        if other == provider:
            continue
        for param in names:
            if given.get(param) not in (None, "", []):
                raise SpecError(
                    f"{label(param)} applies only to --provider {other}, and this run uses "
                    f"{provider}: drop it, or add --provider {other}."
                )


# --- secrets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenShape:
    """One service's token format.

    Attributes:
        what: the service's name for it, with its article (``a Hugging Face token``).
        pattern: a bytes regex finding one anywhere in a text.
    """

    what: str
    pattern: re.Pattern[bytes]


def _shape(what: str, pattern: bytes) -> TokenShape:
    return TokenShape(what, re.compile(pattern))


TOKEN_SHAPES: tuple[TokenShape, ...] = (
    _shape("a Hugging Face token", rb"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{20,}"),
    _shape("a Hugging Face org API token", rb"(?<![A-Za-z0-9_])api_org_[A-Za-z0-9]{20,}"),
    _shape("a RunPod API key", rb"(?<![A-Za-z0-9_])rpa_[A-Za-z0-9]{20,}"),
    _shape("a RunPod S3 secret key", rb"(?<![A-Za-z0-9_])rps_[A-Za-z0-9]{20,}"),
    _shape("an AWS access key id", rb"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])"),
    _shape(
        "a GitHub token", rb"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,})"
    ),
    _shape("an OpenAI-style API key", rb"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}"),
    _shape("a Slack token", rb"(?<![A-Za-z0-9_])xox[abposr]-[A-Za-z0-9-]{10,}"),
    _shape("a Google API key", rb"(?<![A-Za-z0-9_])AIza[0-9A-Za-z_-]{35}"),
)
"""Token formats of the services a fine-tune touches (Hugging Face, RunPod, AWS, GitHub,
OpenAI-compatible APIs, Slack, Google), as each service documents its prefixes."""

SECRET_ENV_NAME = re.compile(
    r".*(TOKEN|SECRET|PASSW|API_?KEY|PRIVATE_?KEY|ACCESS_?KEY|CREDENTIAL).*", re.IGNORECASE
)
"""Environment variable names that hold secrets (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``)."""


_BREAKS = re.compile(r"[\s\x00-\x1f\x7f]+")


def find_token_shape(data: str | bytes) -> str | None:
    """The kind of the first token found in ``data`` (``a Hugging Face token``), or None.
    Never returns the token itself."""
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
    for shape in TOKEN_SHAPES:
        if shape.pattern.search(raw):
            return shape.what
    return None


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item)


def refuse_secret_values(params: Mapping[str, Any]) -> None:
    """Refuse a run whose parameters carry a token: Prefect stores parameters as sent
    (API, database, UI), so a secret must reach a run as a block name or through the
    worker's environment, never as a value.

    Args:
        params: parameter name -> value (strings inside lists and dicts are searched).

    Raises:
        SpecError: naming the parameter and the kind of token, never the token — found
            whatever its shape (a stray newline or space inside it is looked through).
    """
    for param, value in params.items():
        for text in _strings(value):
            what = find_token_shape(text) or find_token_shape(_BREAKS.sub("", text))
            if what:
                raise SpecError(
                    f"parameter {label(param)} holds what looks like {what}; Prefect "
                    "stores run parameters in clear, so rotate that secret and give it to "
                    "the run through a block or the worker's environment (docs/secrets.md)."
                )


def pydantic_reason(exc: Exception) -> str:
    """``field: reason; …`` of a pydantic ``ValidationError`` (the sentences our
    validators raise, without pydantic's ``Value error,`` prefix), else ``str(exc)``."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for error in errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        msg = str(error.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or str(exc)


# --- saved blocks ----------------------------------------------------------------------


def saved_block_names(block_cls: type[Block]) -> list[str]:
    """The names of the saved blocks of ``block_cls``'s type on the Prefect API, sorted
    (empty when none is saved or the type is not registered)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            documents = client.read_block_documents_by_type(
                block_cls.get_block_type_slug(), include_secrets=False
            )
        except ObjectNotFound:
            return []
    return sorted(d.name for d in documents if d.name and not d.is_anonymous)


def load_block(block_cls: type[B], block_name: Any, name: str) -> B:
    """Load the saved block ``block_name`` of ``block_cls``; never fall back to anything.

    Args:
        block_cls: the block class (``RunPodPodSpec``).
        block_name: the name it was saved under.
        name: the parameter that named it (``runpod_spec_block``), for the message.

    Returns:
        The loaded block.

    Raises:
        SpecError: the name is malformed; no such block is saved (the message lists the
            saved blocks of that type); or the saved block no longer validates.
    """
    check_block_name(block_name, name)
    kind = block_cls.__name__
    try:
        return cast(B, block_cls.load(block_name))  # a sync caller gets the block itself
    except ValueError as exc:
        if "Unable to find block document" not in str(exc):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(
                f"the saved {kind} block {block_name!r} ({label(name)}) cannot be loaded "
                f"({first}): fix it in the Prefect UI or save it again."
            ) from None
    saved = saved_block_names(block_cls)
    listing = (
        f"saved {kind} blocks: {', '.join(saved)}" if saved else f"no {kind} block is saved yet"
    )
    raise SpecError(
        f"no {kind} block is named {block_name!r} ({label(name)}); {listing}: check the "
        f"name, or save one first (prefect block register -m prefect_runpod.blocks, then "
        f"{kind}(...).save({block_name!r}))."
    )
