"""Token shapes of the services a fine-tune touches (:data:`TOKEN_SHAPES`), the
environment variable names that hold secrets (:data:`SECRET_ENV_NAME`), and the rule
that no token travels in a run parameter (:func:`refuse_secret_values`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation.options import label

__all__ = [
    "SECRET_ENV_NAME",
    "TOKEN_SHAPES",
    "TokenShape",
    "find_token_shape",
    "refuse_secret_values",
]


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
