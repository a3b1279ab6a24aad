"""A secret's shape, and its masking wherever text leaves the process
(docs/secrets.md#masking, docs/architecture.md#secrets-masked-whatever-their-shape).

Two rules, in this one module:

- **Shape.** A key or token never holds whitespace or a control character; one that
  does (a copy-paste that brought a newline along, a space, a tab) is refused where
  it is read, before any call, by :func:`check_secret`, with one sentence naming the
  variable or block field and the problem (``RUNPOD_API_KEY ends with a newline:
  remove it``) and never the value or any part of it. One trailing newline is
  unambiguous: it is stripped, and said (a WARNING record: the run's log inside a
  Prefect run, the terminal outside one).
- **Masking, whatever the shape.** Every secret this process reads is registered once
  (:func:`register`) — as given, whitespace-stripped, escaped the ways libraries quote
  it (``\\n``, JSON, URL), without an ``Authorization`` scheme word, and each run of it
  between whitespace of at least ``MIN_FORM_CHARS`` characters — and :func:`redact`
  replaces each form with ``***``, the way CI systems mask their secrets. It is used
  for our errors' messages (``exceptions.RunPodFlowError``), every log record
  (:class:`RedactingFilter` on every handler, Prefect's API handler included), the run
  report, artifacts and the CLI's output (:func:`redacted_output`).

HTTP libraries quote the header they refuse (``requests``' ``InvalidHeader: … 'Bearer
rpa_…\\n'``, h11/httpx ``LocalProtocolError: Illegal header value b'Bearer hf_…'``,
``http.client``'s ``Invalid header value``); :func:`is_header_error` knows them and
:class:`refused_headers` turns them into ``SecretShapeError`` without the header text,
at each client boundary.

Standard library only: ``blocks/exceptions.py`` (imported by the light local-pod
daemon) uses :func:`redact`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import ContextDecorator
from typing import Any, TextIO, TypeVar
from urllib.parse import quote

__all__ = [
    "MIN_FORM_CHARS",
    "REDACTED",
    "RedactingFilter",
    "check_prefect_api_key",
    "check_secret",
    "error_text",
    "install_log_filter",
    "is_header_error",
    "masked_error",
    "redact",
    "redact_data",
    "redacted_output",
    "refused_headers",
    "register",
    "shape_problem",
]

REDACTED = "***"
"""What a secret is replaced with."""

MIN_FORM_CHARS = 6
"""Forms shorter than this are not masked: masking them would garble ordinary text, and
no key or token is that short."""

_LOG = logging.getLogger("prefect_runpod.secrets")
_BREAKS = re.compile(r"[\s\x00-\x1f\x7f]+")
_SCHEME = re.compile(r"(?i)^(bearer|basic|token)\s+")
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space"}
_HEADER_ERRORS = {"InvalidHeader", "LocalProtocolError", "InvalidHeaderError"}

_lock = threading.Lock()
_forms: set[str] = set()
_pattern: re.Pattern[str] | None = None

T = TypeVar("T")


def _forms_of(value: str) -> set[str]:
    """Every form a secret may take in text: as given, stripped, escaped, without its
    scheme word, and its runs between whitespace or control characters."""
    out = {value, value.strip()}
    bare = _SCHEME.sub("", value.strip())  # never the scheme word itself ("Bearer")
    for text in {value, bare}:
        out.add(text)
        out.add(text.encode("unicode_escape").decode("ascii"))
        out.add(json.dumps(text)[1:-1])
        out.add(repr(text)[1:-1])
        out.add(quote(text, safe=""))
    out.update(_BREAKS.split(bare))
    return {form for form in out if len(form) >= MIN_FORM_CHARS}


def register(value: Any) -> None:
    """Mask ``value`` from now on, in every form (see the module docstring).

    Args:
        value: the secret as read (``str``, or anything with ``get_secret_value()``
            such as pydantic's ``SecretStr``); None or an empty value does nothing.
    """
    global _pattern
    if value is not None and hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if not isinstance(value, str) or not value:
        return
    new = _forms_of(value) - _forms
    if not new:
        return
    with _lock:
        _forms.update(new)
        ordered = sorted(_forms, key=len, reverse=True)  # a longer form wins at a position
        _pattern = re.compile("|".join(re.escape(form) for form in ordered))
    install_log_filter()


def redact(text: str) -> str:
    """``text`` with every registered secret, in every form, replaced by ``***``."""
    pattern = _pattern
    if pattern is None or not isinstance(text, str):
        return text
    return pattern.sub(REDACTED, text)


def redact_data(data: T) -> T:
    """``data`` (JSON-like: dicts, lists, tuples, strings) with every string redacted."""
    if isinstance(data, str):
        return redact(data)  # type: ignore[return-value]
    if isinstance(data, dict):
        return {redact_data(k): redact_data(v) for k, v in data.items()}  # type: ignore[return-value]
    if isinstance(data, list):
        return [redact_data(v) for v in data]  # type: ignore[return-value]
    if isinstance(data, tuple):
        return tuple(redact_data(v) for v in data)  # type: ignore[return-value]
    return data


def _name(char: str) -> str:
    if char in _NAMES:
        return _NAMES[char]
    kind = "whitespace" if char.isspace() else "control"
    return f"a {kind} character (U+{ord(char):04X})"


def _odd(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("C")


def shape_problem(value: str) -> str | None:
    """What is wrong with a secret's shape, in words without the value (``ends with a
    newline``, ``has a tab inside it``, ``starts with a space``), or None when it holds
    no whitespace and no control character."""
    odd = [i for i, char in enumerate(value) if _odd(char)]
    if not odd:
        return None
    if odd[0] == 0:
        return f"starts with {_name(value[0])}"
    inner = [i for i in odd if i < len(value.rstrip())]
    if inner:
        return f"has {_name(value[inner[0]])} inside it"
    return f"ends with {_name(value[-1])}"


def check_secret(
    value: str, what: str, *, strip_newline: bool = True, fix: str = "remove it"
) -> str:
    """A secret as read, checked for its shape (and registered for masking, whatever it
    is).

    Args:
        value: the secret.
        what: where it came from, as a person names it (``RUNPOD_API_KEY``,
            ``the api_key of the RunPodCredentials block 'team'``).
        strip_newline: strip one trailing newline (``\\n`` or ``\\r\\n``) and say so,
            instead of refusing it; False where the value is used elsewhere as it is
            (``PREFECT_API_KEY``, which Prefect's own client sends).
        fix: what the person does about it (default ``remove it``).

    Returns:
        The value, its one trailing newline stripped when allowed.

    Raises:
        SecretShapeError: whitespace or a control character at its start, inside it or at
            its end; the message names ``what`` and the problem, never the value.
    """
    from prefect_runpod.blocks.exceptions import SecretShapeError

    register(value)
    trimmed = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else ""
    if strip_newline and trimmed and shape_problem(trimmed) is None:
        _say(f"{what} ends with a newline: stripped it (the value is not shown)")
        return trimmed
    problem = shape_problem(value)
    if problem is not None:
        raise SecretShapeError(
            f"{what} {problem}: {fix} (a key or token never holds whitespace or control "
            "characters; the value is not shown)"
        )
    return value


def check_prefect_api_key() -> None:
    """``PREFECT_API_KEY`` (Prefect's setting ``api.key``), registered for masking and
    checked for its shape. A trailing newline is refused rather than stripped: Prefect's
    own client sends the key as it is set.

    Raises:
        SecretShapeError: the key holds whitespace or a control character.
    """
    from prefect.settings import get_current_settings

    key = get_current_settings().api.key
    if key is not None and key.get_secret_value():
        fix = "remove it where it is set (the environment or the Prefect profile)"
        check_secret(key.get_secret_value(), "PREFECT_API_KEY", strip_newline=False, fix=fix)


def _say(note: str) -> None:
    """A WARNING record: to the run's log inside a Prefect flow or task run (it reaches
    the API and the terminal), else to ``prefect_runpod.secrets`` (the terminal)."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.logging import get_run_logger

        if FlowRunContext.get() is not None or TaskRunContext.get() is not None:
            get_run_logger().warning(note)
            return
    except Exception:  # noqa: BLE001 - no Prefect here (a light process): the terminal
        pass
    _LOG.warning(note)


def is_header_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is an HTTP library refusing a header
    it was asked to send, with the header's value in its message: ``requests``'
    ``InvalidHeader``, h11/httpcore/httpx ``LocalProtocolError``, ``http.client``'s
    ``ValueError('Invalid header value …')``. Our own errors (``RunPodFlowError``)
    never are: their text is redacted and names the problem. The chain is followed as a
    traceback shows it (the cause, else the context unless suppressed)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = {cls.__name__ for cls in type(current).__mro__}
        if "RunPodFlowError" in names:
            return False
        if names & _HEADER_ERRORS:
            return True
        if isinstance(current, ValueError) and "header" in str(current).lower():
            return True
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__
    return False


def error_text(exc: BaseException) -> str:
    """``Type: message`` for an exception that becomes our error text: redacted, and for
    a refused header without its message at all."""
    name = type(exc).__name__
    if is_header_error(exc):
        return f"{name}: the HTTP library refused a request header (its value is not shown)"
    return f"{name}: {redact(str(exc))}"


def masked_error(exc: BaseException) -> BaseException:
    """``exc`` itself when its text holds no secret; else our ``RunPodFlowError`` with
    ``error_text(exc)`` (its pod and stage kept), to raise ``from None`` where an error
    leaves the flow: Prefect copies the text into state messages, events and results."""
    if not isinstance(exc, Exception) or (
        not is_header_error(exc) and redact(str(exc)) == str(exc)
    ):
        return exc
    from prefect_runpod.blocks.exceptions import RunPodFlowError

    return RunPodFlowError(
        error_text(exc), pod_id=getattr(exc, "pod_id", None), stage=getattr(exc, "stage", None)
    )


class refused_headers(ContextDecorator):  # noqa: N801 - used as a decorator and a with-block
    """Turn an HTTP library's refused header into ``SecretShapeError`` (raised ``from
    None``, so no traceback quotes the header), at a client boundary.

    Args:
        service: who was being called (``RunPod's API``, ``the Hugging Face Hub``).
        secret: the secret the header was made from, and where it is set (``the API key
            (RUNPOD_API_KEY or the RunPodCredentials block's api_key)``).
    """

    def __init__(self, service: str, secret: str) -> None:
        self.service = service
        self.secret = secret

    def __enter__(self) -> refused_headers:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, Exception) or not is_header_error(exc):
            return
        from prefect_runpod.blocks.exceptions import SecretShapeError

        raise SecretShapeError(
            f"{self.service}: the HTTP library refused the Authorization header made from "
            f"{self.secret}: it holds whitespace or a control character; remove it (the "
            "value is not shown). Nothing was sent."
        ) from None


class RedactingFilter(logging.Filter):
    """Redacts a log record's message, arguments, traceback and stack before any handler
    formats it (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _pattern is None:
            return True
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the handler's to report
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        raw = record.exc_text
        if record.exc_info and not raw:
            raw = logging.Formatter().formatException(record.exc_info)
        if raw and redact(raw) != raw:  # only then: a handler's own formatting stays
            record.exc_text, record.exc_info = redact(raw), None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_FILTER = RedactingFilter()


def install_log_filter() -> None:
    """Put the one ``RedactingFilter`` on every handler of every logger that exists now
    (the root's, Prefect's console and API handlers, any other); idempotent."""
    known: list[Any] = []
    for _ in range(5):  # another thread may add a logger while the dict is copied
        try:
            known = list(logging.Logger.manager.loggerDict.values())
            break
        except RuntimeError:
            continue
    for logger in [logging.getLogger(), *known]:
        for handler in getattr(logger, "handlers", []):
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)


class _RedactingStream:
    """A text stream that redacts what is written to it (everything else is the inner
    stream's)."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """Redact everything written to ``sys.stdout`` and ``sys.stderr`` inside the block
    (the CLI's output), and every log record (``install_log_filter``)."""
    install_log_filter()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _RedactingStream(saved[0]), _RedactingStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
