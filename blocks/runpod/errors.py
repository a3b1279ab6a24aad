"""Classify RunPod's error answers into what the provider does next: the one error map,
for both APIs.

**REST v2** answers errors as RFC 9457 problem objects (``application/problem+json``:
``title``, ``status``, ``detail``, ``errors[]``; ``rest.RestApi`` raises them as
``RunPodAPIError``), classified by status first and ``detail`` second
(``classify_problem``):

=================================================================  ===============
answer                                                              action
=================================================================  ===============
401 / 403 (the key)                                                 STOP
402 (no balance)                                                    STOP
404 (the pod is not there)                                          GONE
409 (the pod's state forbids it)                                    STOP
410 Gone (a retired API: the message names it and the setting)      STOP
400 ``There are no longer any instances available…``               NEXT_OPTION
any other 400 / 422 (our request: ``detail`` and ``errors[]`` kept)  STOP
429 (still limited after the waits ``RestApi`` made)               RETRY
5xx, and the network before the request went out                   RETRY
the network after it went out (timeout/dropped answer)             RESOLVE
=================================================================  ===============

RESOLVE means "it may have been carried out": a create is then resolved by reading
(get by id, list by name), never by creating again; any other call is simply retried.
A 400 is capacity only by its text, which is safe because the GPU ids are confirmed in
the catalog first and ``gpu.count`` is always sent (RunPod answers a missing count or an
inexact id with the same text: runpod-mcp PR #77, runpodctl PR #260).

**GraphQL** (the ``runpod`` SDK's fallback): RunPod's GraphQL API answers most failures with HTTP 200 and an ``errors`` array; the
``runpod`` SDK (1.12) turns that into ``runpod.error.QueryError(errors[0].message)``,
an HTTP 401 into ``AuthenticationError``, a non-JSON body (a proxy's 5xx page) into
``requests``' ``JSONDecodeError``, a body with neither ``errors`` nor ``data`` into a
``KeyError`` in its helpers, and lets network errors through raw. The SDK hides the
HTTP status of everything but a 401 (a GraphQL validation error arrives with HTTP 400
as a plain ``QueryError``), so this module — the one place that does it — classifies
by exception type first and RunPod's message text second, to one ``FailoverAction``:

===============================================================  ===============
answer                                                            action
===============================================================  ===============
``There are no longer any instances available…``                  NEXT_OPTION
``There are not enough free GPUs on the host machine…``           RECREATE
``Something went wrong…`` / INTERNAL_SERVER_ERROR / 5xx / network  RETRY
HTTP 401 (``Unauthorized request, please check your API key.``)  STOP
``No GPU found with the specified ID`` (the SDK, client side)     STOP
GraphQL syntax / validation error (an invalid id, an unknown field) STOP
a JSON answer with neither ``errors`` nor ``data`` (``KeyError``)    STOP
``pod not found to terminate`` / ``Cluster not found``            GONE
a header the HTTP library refused (a key with a newline)          STOP
anything else                                                     STOP
===============================================================  ===============

A refused header (``SecretShapeError`` from the client, or ``requests``'
``InvalidHeader`` raw) is the key's shape, not the network: it is never retried, and
its message never quotes the header.

Sources: the SDK's ``runpod.api.graphql`` and ``runpod.api.ctl_commands``; the strings as
reported in runpod/runpod-python#168 and #239, mlabonne/llm-autoeval#3, and dstack's
RunPod backend (``pod not found to terminate``). Unknown answers stop rather than
loop, so an unrecognised failure never keeps spending.

Pure functions: no network, no Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from prefect_runpod.blocks.exceptions import (
    AccountKeysError,
    CapacityError,
    ProviderAuthError,
    ProviderError,
    ProviderTransientError,
    RunPodAPIError,
    SecretShapeError,
    SpecError,
)
from prefect_runpod.blocks.secret_mask import is_header_error, refused_headers

__all__ = [
    "CAPACITY_MESSAGE",
    "REFUSED_KEY_HEADER",
    "HOST_GPUS_BUSY_MESSAGE",
    "NOT_FOUND_TO_TERMINATE_MESSAGE",
    "SOMETHING_WENT_WRONG_MESSAGE",
    "UNAUTHORIZED_MESSAGE",
    "UNKNOWN_GPU_MESSAGE",
    "ErrorKind",
    "FailoverAction",
    "RunPodErrorClass",
    "classify_exception",
    "classify_message",
    "classify_problem",
    "to_provider_error",
]

REFUSED_KEY_HEADER = refused_headers(
    "RunPod's API", "the RunPod API key (RUNPOD_API_KEY or the RunPodCredentials block's api_key)"
)
"""Wraps every call that sends the API key (the SDK's GraphQL calls and every REST v2
request): a header the HTTP library refuses becomes ``SecretShapeError``, without the
header."""

CAPACITY_MESSAGE = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
"""RunPod's answer to a create when no machine of that GPU type/cloud is free."""

HOST_GPUS_BUSY_MESSAGE = "There are not enough free GPUs on the host machine to start this pod."
"""RunPod's answer to ``podResume`` when the pod's host gave its GPUs away."""

SOMETHING_WENT_WRONG_MESSAGE = "Something went wrong. Please try again later or contact support."
"""RunPod's generic server-side failure (``extensions.code=INTERNAL_SERVER_ERROR``)."""

UNAUTHORIZED_MESSAGE = "Unauthorized request, please check your API key."
"""What the SDK raises (``AuthenticationError``) on HTTP 401."""

UNKNOWN_GPU_MESSAGE = (
    "No GPU found with the specified ID, run runpod.get_gpus() to get a list of all GPUs"
)
"""What the SDK raises (``ValueError``) when ``gpuTypes(input:{id})`` returns ``[]``."""

NOT_FOUND_TO_TERMINATE_MESSAGE = "pod not found to terminate"
"""RunPod's answer to ``podTerminate`` for a pod that no longer exists."""

_CAPACITY_MARKERS = (
    "there are no longer any instances available",
    "this machine does not have the resources to deploy this pod",
)
_HOST_BUSY_MARKERS = ("not enough free gpus on the host",)
_TRANSIENT_MARKERS = ("something went wrong", "internal server error", "try again later")
_NOT_FOUND_MARKERS = ("pod not found", "cluster not found")
_INVALID_MARKERS = (
    "syntax error",
    "cannot query field",
    "is not defined by type",
    "unknown argument",
    "expected value of type",
    "expected type",
    "must have a selection",
    "must not have a selection",
)


class FailoverAction(StrEnum):
    """What the provider does after an error."""

    NEXT_OPTION = "next_option"
    """Try the next GPU type / data center; this one has no capacity."""
    RETRY = "retry"
    """Same request again after a backoff (server or network trouble)."""
    RECREATE = "recreate"
    """Create a fresh pod; never resume one whose host lost its GPUs."""
    STOP = "stop"
    """Give up at once: retrying cannot help (bad key, bad input, unknown answer)."""
    GONE = "gone"
    """The pod does not exist: for terminate, that is success."""
    RESOLVE = "resolve"
    """The request may have been carried out (its answer was lost): read before doing
    anything else; a create is never sent again."""


class ErrorKind(StrEnum):
    """What went wrong, in a word (used in attempt lines: ``<gpu>/<cloud>: <kind>``)."""

    CAPACITY = "capacity"
    HOST_GPUS_BUSY = "host_gpus_busy"
    TRANSIENT = "transient"
    AUTH = "auth"
    UNKNOWN_GPU = "unknown_gpu"
    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    BAD_SECRET = "bad_secret"
    STATE_CONFLICT = "state_conflict"
    RETIRED = "retired"
    NO_BALANCE = "no_balance"
    RATE_LIMITED = "rate_limited"
    ANSWER_LOST = "answer_lost"
    UNKNOWN = "unknown"


_ACTIONS: dict[ErrorKind, FailoverAction] = {
    ErrorKind.CAPACITY: FailoverAction.NEXT_OPTION,
    ErrorKind.HOST_GPUS_BUSY: FailoverAction.RECREATE,
    ErrorKind.TRANSIENT: FailoverAction.RETRY,
    ErrorKind.AUTH: FailoverAction.STOP,
    ErrorKind.UNKNOWN_GPU: FailoverAction.STOP,
    ErrorKind.INVALID_REQUEST: FailoverAction.STOP,
    ErrorKind.NOT_FOUND: FailoverAction.GONE,
    ErrorKind.BAD_SECRET: FailoverAction.STOP,
    ErrorKind.STATE_CONFLICT: FailoverAction.STOP,
    ErrorKind.RETIRED: FailoverAction.STOP,
    ErrorKind.NO_BALANCE: FailoverAction.STOP,
    ErrorKind.RATE_LIMITED: FailoverAction.RETRY,
    ErrorKind.ANSWER_LOST: FailoverAction.RESOLVE,
    ErrorKind.UNKNOWN: FailoverAction.STOP,
}

RETIRED_APIS = {
    "v1": "REST v1 (retired by RunPod on 2026-11-15)",
    "graphql": "RunPod's GraphQL API (retired by RunPod)",
}
"""Which API a 410 Gone names, by the first part of the path asked."""


@dataclass(frozen=True)
class RunPodErrorClass:
    """One classified answer.

    Attributes:
        kind: what went wrong.
        action: what to do next.
        message: RunPod's (or the SDK's) text, verbatim; it never holds the API key.
    """

    kind: ErrorKind
    action: FailoverAction
    message: str


def classify_message(
    message: str, *, code: str | None = None, http_status: int | None = None
) -> RunPodErrorClass:
    """Classify one RunPod answer by its exact text.

    Args:
        message: ``errors[0].message`` of a GraphQL answer, or the SDK's error text.
        code: ``errors[0].extensions.code`` when known (``INTERNAL_SERVER_ERROR`` …).
        http_status: the HTTP status when known (401, 5xx …).

    Returns:
        A ``RunPodErrorClass``; unknown text gives ``ErrorKind.UNKNOWN`` / ``STOP``.
    """
    text = (message or "").lower()
    kind = ErrorKind.UNKNOWN
    if http_status == 401 or "unauthorized request" in text:
        kind = ErrorKind.AUTH
    elif any(m in text for m in _CAPACITY_MARKERS):
        kind = ErrorKind.CAPACITY
    elif any(m in text for m in _HOST_BUSY_MARKERS):
        kind = ErrorKind.HOST_GPUS_BUSY
    elif "no gpu found with the specified id" in text:
        kind = ErrorKind.UNKNOWN_GPU
    elif any(m in text for m in _NOT_FOUND_MARKERS) or code == "Cluster not found":
        kind = ErrorKind.NOT_FOUND
    elif (
        any(m in text for m in _TRANSIENT_MARKERS)
        or code == "INTERNAL_SERVER_ERROR"
        or (http_status is not None and 500 <= http_status <= 599)
        or http_status == 429
    ):
        kind = ErrorKind.TRANSIENT
    elif any(m in text for m in _INVALID_MARKERS) or (code or "").startswith("GRAPHQL_"):
        kind = ErrorKind.INVALID_REQUEST
    return RunPodErrorClass(kind=kind, action=_ACTIONS[kind], message=message)


def classify_problem(
    status: int, detail: str = "", errors: list[str] | None = None, *, operation: str = ""
) -> RunPodErrorClass:
    """Classify one REST v2 problem object by its status, then its ``detail`` (see the
    module docstring's table).

    Args:
        status: the HTTP status.
        detail: the problem's ``detail``.
        errors: the problem's ``errors[]``, kept in the message for a 400/422.
        operation: what was asked (``POST /v2/pods``), for a 410's message.

    Returns:
        A ``RunPodErrorClass`` whose message holds RunPod's own words.
    """
    text = detail or ""
    lowered = text.lower()
    message = text + (f" ({'; '.join(errors)})" if errors else "")
    message = f"HTTP {status}: {message}" if message else f"HTTP {status}"
    if status in (401, 403):
        kind = ErrorKind.AUTH
    elif status == 402:
        kind = ErrorKind.NO_BALANCE
    elif status == 404:
        kind = ErrorKind.NOT_FOUND
    elif status == 409:
        kind = ErrorKind.STATE_CONFLICT
    elif status == 410:
        path = operation.split(" ", 1)[-1]
        first = path.strip("/").split("/")[0]
        name = RETIRED_APIS.get(first, "this API")
        kind = ErrorKind.RETIRED
        message = (
            f"{message}: {name} is gone; set api='v2' on the RunPodCredentials block (or "
            "RUNPOD_API_BASE_URL to RunPod's base URL without a path)"
        )
    elif status == 429:
        kind = ErrorKind.RATE_LIMITED
    elif status >= 500:
        kind = ErrorKind.TRANSIENT
    elif status == 400 and any(m in lowered for m in _CAPACITY_MARKERS):
        kind = ErrorKind.CAPACITY
    elif status == 400 and any(m in lowered for m in _HOST_BUSY_MARKERS):
        kind = ErrorKind.HOST_GPUS_BUSY
    elif status in (400, 422):
        kind = ErrorKind.INVALID_REQUEST
    else:
        kind = ErrorKind.UNKNOWN
    return RunPodErrorClass(kind=kind, action=_ACTIONS[kind], message=message)


def _classify_httpx(exc: BaseException) -> RunPodErrorClass | None:
    """httpx's network errors: before the request went out → RETRY; after → RESOLVE."""
    import httpx

    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        try:
            host = exc.request.url.netloc.decode() or "the RunPod API"
        except RuntimeError:  # raised without its request
            host = "the RunPod API"
        return RunPodErrorClass(
            ErrorKind.TRANSIENT,
            FailoverAction.RETRY,
            f"{name}: cannot reach {host} (network, DNS or proxy: {exc})",
        )
    if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return RunPodErrorClass(
            ErrorKind.ANSWER_LOST,
            FailoverAction.RESOLVE,
            f"{name}: RunPod's answer was lost ({exc or 'no answer'})",
        )
    return None


def classify_exception(exc: BaseException) -> RunPodErrorClass:
    """Classify an exception raised by a ``runpod`` SDK call, by its type first:

    - ``SecretShapeError``, or a header the HTTP library refused: the key's shape → stop
      (its message never quotes the header);
    - ``runpod.error.AuthenticationError``: HTTP 401 (or no key) → AUTH, stop;
    - ``runpod.error.QueryError``: RunPod's ``errors[0].message`` → by its text;
    - ``requests``' ``JSONDecodeError``: a non-JSON body (a proxy's 5xx page) → retry;
    - other ``requests`` errors and ``ConnectionError``/``TimeoutError``: the network → retry;
    - ``KeyError``: a JSON answer with neither ``errors`` nor ``data`` → stop;
    - ``ValueError`` (the SDK's unknown GPU id) and anything else → by its text.

    Args:
        exc: the exception.

    Returns:
        A ``RunPodErrorClass`` whose ``message`` is RunPod's (or the SDK's) own text.
    """
    import requests
    from runpod.error import AuthenticationError, QueryError

    name = type(exc).__name__
    if isinstance(exc, SecretShapeError):
        return RunPodErrorClass(ErrorKind.BAD_SECRET, FailoverAction.STOP, str(exc))
    if is_header_error(exc):
        return RunPodErrorClass(
            ErrorKind.BAD_SECRET,
            FailoverAction.STOP,
            f"{name}: the HTTP library refused the Authorization header made from the API "
            "key: it holds whitespace or a control character; fix RUNPOD_API_KEY or the "
            "RunPodCredentials block's api_key (the value is not shown). Nothing was sent.",
        )
    if isinstance(exc, RunPodAPIError):
        return classify_problem(exc.status, exc.detail, exc.errors, operation=exc.operation)
    lost = _classify_httpx(exc)
    if lost is not None:
        return lost
    if isinstance(exc, AccountKeysError):
        return RunPodErrorClass(ErrorKind.INVALID_REQUEST, FailoverAction.STOP, str(exc))
    if isinstance(exc, requests.exceptions.ReadTimeout | requests.exceptions.ChunkedEncodingError):
        return RunPodErrorClass(
            ErrorKind.ANSWER_LOST, FailoverAction.RESOLVE, f"{name}: RunPod's answer was lost"
        )
    if isinstance(exc, AuthenticationError):
        return classify_message(str(exc) or UNAUTHORIZED_MESSAGE, http_status=401)
    if isinstance(exc, QueryError):
        return classify_message(exc.message or str(exc))
    if isinstance(exc, requests.exceptions.JSONDecodeError):
        return RunPodErrorClass(
            ErrorKind.TRANSIENT,
            FailoverAction.RETRY,
            f"{name}: RunPod answered with a body that is not JSON (a proxy's error page?)",
        )
    if isinstance(exc, requests.exceptions.RequestException):
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if response is None:
            url = getattr(getattr(exc, "request", None), "url", None) or ""
            host = urlsplit(url).netloc or "the RunPod API"
            text = f"{name}: cannot reach {host} (network, DNS or proxy)"
        else:
            text = f"{name}: server error" + (f" (HTTP {status})" if status else "")
        return RunPodErrorClass(ErrorKind.TRANSIENT, FailoverAction.RETRY, text)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return RunPodErrorClass(ErrorKind.TRANSIENT, FailoverAction.RETRY, f"{name}: {exc}")
    if isinstance(exc, KeyError):
        return RunPodErrorClass(
            ErrorKind.UNKNOWN,
            FailoverAction.STOP,
            f"RunPod's answer held neither data nor errors (missing {exc}); a retired "
            "GraphQL API answers so: then set api='v2' on the RunPodCredentials block",
        )
    return classify_message(str(exc))


def to_provider_error(
    classified: RunPodErrorClass,
    *,
    what: str,
    pod_id: str | None = None,
    attempts: list[str] | None = None,
) -> Exception:
    """The prefect-runpod exception for a classified answer, with a next step.

    Args:
        classified: the classified answer.
        what: the operation, for the message (``create pod prft-…``, ``terminate``).
        pod_id: the pod concerned, if any.
        attempts: the attempt lines so far (kept on ``CapacityError``).

    Returns:
        ``ProviderAuthError`` (401), ``CapacityError``, ``ProviderTransientError``,
        ``SecretShapeError`` (a refused header), ``SpecError`` (unknown GPU id, invalid
        request) or ``ProviderError``.
    """
    msg = classified.message
    kind = classified.kind
    if kind is ErrorKind.BAD_SECRET:
        return SecretShapeError(f"{what}: {msg}", pod_id=pod_id)
    if kind is ErrorKind.AUTH:
        said = msg if msg.startswith("HTTP ") else f"HTTP 401: {msg}"
        return ProviderAuthError(
            f"{what}: RunPod refused the API key ({said}). Nothing was created; check the "
            "RunPodCredentials block's api_key (RunPod console → Settings → API Keys).",
            pod_id=pod_id,
        )
    if kind is ErrorKind.CAPACITY:
        return CapacityError(
            f"{what}: no capacity ({msg}). Add GPU types, data centers or cloud ALL to the "
            "pod spec, or try again later.",
            pod_id=pod_id,
            attempts=attempts,
        )
    if kind is ErrorKind.NO_BALANCE:
        return ProviderError(
            f"{what}: RunPod refused for lack of balance ({msg}); add credit in the RunPod "
            "console → Billing. Nothing was created.",
            pod_id=pod_id,
        )
    if kind in (ErrorKind.TRANSIENT, ErrorKind.RATE_LIMITED, ErrorKind.ANSWER_LOST):
        return ProviderTransientError(
            f"{what}: RunPod had trouble ({msg}); retried with backoff and still failing. "
            "Check https://uptime.runpod.io and try again.",
            pod_id=pod_id,
        )
    if kind in (ErrorKind.UNKNOWN_GPU, ErrorKind.INVALID_REQUEST):
        return SpecError(f"{what}: RunPod rejected the request ({msg}).", pod_id=pod_id)
    return ProviderError(f"{what}: RunPod answered: {msg}", pod_id=pod_id)
