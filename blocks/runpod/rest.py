"""``RestApi``: RunPod's REST v2 (``{base}/v2``) on httpx, filling in ``RunPodApi``.

Every call RunPod's v2 OpenAPI schema (2.0.0) documents for a pod orchestrator:

=========================================  ====================================  =====
call                                       v2                                    ok
=========================================  ====================================  =====
create                                     ``POST /v2/pods``                     201
get / terminate                            ``GET`` / ``DELETE /v2/pods/{id}``    200 / 204
list                                       ``GET /v2/pods`` → ``{"pods": […]}``  200
logs                                       ``GET /v2/pods/{id}/logs`` (SSE)      200
account SSH keys                           ``GET`` / ``PUT /v2/account/ssh-keys``  200
catalog                                    ``GET /v2/catalog/gpus``              200
billing                                    ``GET /v2/billing/pods?podId=…``      200
=========================================  ====================================  =====

Authentication is ``Authorization: Bearer <key>``; the key is unwrapped only when the
httpx client is built, never logged or put in a message. Every request first asks the
account's process-wide ``RateBudget`` (``ratelimit``), and every answer's
``RateLimit`` headers feed it; a 429 is waited out as its headers say (``t`` of the spent
window, else ``Retry-After``; logged), up to ``max_429_waits`` times. Any other error
status raises ``RunPodAPIError`` with RunPod's problem object; network failures raise
httpx's own exceptions. Neither is retried here: ``runpod.errors`` classifies them and
the provider decides (a create whose answer was lost is resolved by reading, never by
creating again).

Where RunPod is: one base URL without a path (``RunPodCredentials.api_base_url``, else
``$RUNPOD_API_BASE_URL``, else ``https://api.runpod.io``); v2 is ``{base}/v2``.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import RunPodAPIError, SpecError
from prefect_runpod.blocks.runpod.account_keys import check_superset
from prefect_runpod.blocks.runpod.api import ApiName, LogLine, PodCreate, PodRecord
from prefect_runpod.blocks.runpod.billing import RunPodBill, parse_v2_records, summarise
from prefect_runpod.blocks.runpod.catalog import GpuAvailability, parse_catalog
from prefect_runpod.blocks.runpod.errors import REFUSED_KEY_HEADER
from prefect_runpod.blocks.runpod.ratelimit import RateBudget, budget_for
from prefect_runpod.blocks.runpod.v2_models import CreatePodRequest, Problem, SshKeys, V2Pod
from prefect_runpod.blocks.secret_mask import register
from prefect_runpod.blocks.validation import check_pod_id, check_url, utc_timestamp

__all__ = [
    "API_BASE_ENV",
    "DEFAULT_API_BASE_URL",
    "OBSOLETE_REST_ENV",
    "RestApi",
    "resolve_base_url",
]

logger = logging.getLogger("prefect_runpod.runpod")

DEFAULT_API_BASE_URL = "https://api.runpod.io"
API_BASE_ENV = "RUNPOD_API_BASE_URL"
"""Where RunPod is (no path): REST v2 at ``{base}/v2``; the ``runpod`` SDK reads the same
variable for GraphQL, at the same base."""
OBSOLETE_REST_ENV = "RUNPOD_REST_BASE_URL"
"""REST v1's base, retired with v1 on 2026-11-15: read only to warn that it is ignored."""

_TIMEOUT_SECONDS = 30.0
_IDEMPOTENT = frozenset({"GET", "DELETE"})
_LOG_IDLE_SECONDS = 60.0


def resolve_base_url(explicit: str | None = None) -> str:
    """RunPod's API base: ``explicit``, else ``$RUNPOD_API_BASE_URL``, else
    ``https://api.runpod.io``; warns once when ``$RUNPOD_REST_BASE_URL`` is set.

    Raises:
        SpecError: not an http(s) URL, or one with a path (``…/v2`` and the like: give the
            base only).
    """
    if os.environ.get(OBSOLETE_REST_ENV):
        warnings.warn(
            f"{OBSOLETE_REST_ENV} is obsolete and ignored: RunPod retired REST v1 on "
            f"2026-11-15; set {API_BASE_ENV} (a base URL without a path) instead",
            DeprecationWarning,
            stacklevel=2,
        )
    base = check_url(explicit or os.environ.get(API_BASE_ENV) or DEFAULT_API_BASE_URL, API_BASE_ENV)
    if urlsplit(base).path not in ("", "/") or urlsplit(base).query:
        raise SpecError(
            f"RunPod's API base URL {base!r} has a path; give the base only "
            f"(e.g. {DEFAULT_API_BASE_URL}): REST v2 is <base>/v2, GraphQL beside it"
        )
    return base.rstrip("/")


def _hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


class RestApi:
    """RunPod's REST v2 (see the module docstring).

    Args:
        api_key: the account's key.
        base_url: RunPod's base (see ``resolve_base_url``).
        timeout_seconds: per request (connect, read, write), s.
        budget: the rate budget; the account's process-wide one by default.
        max_429_waits: how many 429s in a row one call waits out before raising.
        transport: an httpx transport (tests).
    """

    name: ApiName = "v2"

    def __init__(
        self,
        api_key: SecretStr,
        *,
        base_url: str | None = None,
        timeout_seconds: float = _TIMEOUT_SECONDS,
        budget: RateBudget | None = None,
        max_429_waits: int = 5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self._api_key = api_key
        register(api_key)
        self.budget = budget or budget_for(self.base_url, api_key.get_secret_value())
        self.max_429_waits = max_429_waits
        self._http = httpx.Client(
            base_url=f"{self.base_url}/v2",
            headers={"Authorization": f"Bearer {api_key.get_secret_value()}"},
            timeout=timeout_seconds,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"RestApi(base_url={self.base_url!r}, api_key=SecretStr('**********'))"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- transport ----------------------------------------------------------------------

    @REFUSED_KEY_HEADER
    def _send(self, send: Callable[[], httpx.Response], what: str) -> httpx.Response:
        """One request through the rate budget, 429s waited out, errors raised."""
        waits = 0
        while True:
            self.budget.before_request(what)
            response = send()
            self.budget.after_response(response.headers)
            if response.status_code == 429 and waits < self.max_429_waits:
                waits += 1
                self.budget.wait_429(response.headers, what)
                continue
            if response.status_code >= 400:
                raise _problem(response, what)
            return response

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call; an idempotent one (GET, DELETE) whose pooled connection the server had
        closed (``RemoteProtocolError`` before any answer) is sent once more on a fresh
        connection, as a browser does. Anything else is raised as it came."""
        what = f"{method} /v2{path}"
        try:
            return self._send(lambda: self._http.request(method, path, **kwargs), what)
        except httpx.RemoteProtocolError as exc:
            if method not in _IDEMPOTENT:
                raise
            logger.info(
                "%s: the connection closed before an answer (%s); asking once more", what, exc
            )
            return self._send(lambda: self._http.request(method, path, **kwargs), what)

    # -- pods ---------------------------------------------------------------------------

    def create_pod(self, create: PodCreate) -> PodRecord:
        """``POST /v2/pods`` with the body ``CreatePodRequest.from_create`` builds.

        Raises:
            SpecError: a create v2 cannot express (see ``CreatePodRequest.from_create``).
            RunPodAPIError / httpx errors: as RunPod answered (never retried here).
        """
        body = CreatePodRequest.from_create(create).body()
        answer = self._call("POST", "/pods", json=body)
        return V2Pod.model_validate(answer.json()).record()

    def get_pod(self, pod_id: str) -> PodRecord | None:
        """``GET /v2/pods/{id}``; None on 404."""
        try:
            answer = self._call("GET", f"/pods/{check_pod_id(pod_id)}")
        except RunPodAPIError as exc:
            if exc.status == 404:
                return None
            raise
        return V2Pod.model_validate(answer.json()).record()

    def list_pods(self) -> list[PodRecord]:
        """``GET /v2/pods`` (one request, the account's pods; cluster pods left out)."""
        pods = self._call("GET", "/pods").json().get("pods") or []
        return [V2Pod.model_validate(p).record() for p in pods]

    def terminate_pod(self, pod_id: str) -> None:
        """``DELETE /v2/pods/{id}`` (204); a 404 raises (``classify_exception``: gone)."""
        self._call("DELETE", f"/pods/{check_pod_id(pod_id)}")

    # -- account ------------------------------------------------------------------------

    def get_account_keys(self) -> list[str]:
        """``GET /v2/account/ssh-keys``."""
        return SshKeys.model_validate(self._call("GET", "/account/ssh-keys").json()).keys

    def put_account_keys(self, keys: list[str], *, replacing: list[str]) -> list[str]:
        """``PUT /v2/account/ssh-keys`` after ``account_keys.check_superset``.

        Raises:
            AccountKeysError: the list is empty or drops a key of ``replacing`` (unsent).
        """
        check_superset(keys, replacing)
        answer = self._call("PUT", "/account/ssh-keys", json={"keys": keys})
        return SshKeys.model_validate(answer.json()).keys

    # -- catalog and billing --------------------------------------------------------------

    def gpu_catalog(self, gpu_count: int = 1) -> dict[str, GpuAvailability]:
        """``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N``."""
        params = {"include": "AVAILABILITY", "product": "POD", "count": gpu_count}
        return parse_catalog(self._call("GET", "/catalog/gpus", params=params).json())

    def gpu_offers(self, gpu_type_ids: list[str], gpu_count: int) -> dict[str, GpuAvailability]:
        """The catalog's entries for ``gpu_type_ids`` (one request); unknown ids absent."""
        catalog = self.gpu_catalog(gpu_count)
        return {gpu: catalog[gpu] for gpu in gpu_type_ids if gpu in catalog}

    def pod_bill(self, pod_id: str, created_at: datetime, ended_at: datetime) -> RunPodBill | None:
        """``GET /v2/billing/pods?podId=&bucketSize=hour&startTime=&endTime=``.

        The window is sent already on hour boundaries (RunPod snaps ``startTime`` down
        and ``endTime`` up to the bucket; aligned values are not widened): from the
        hour the pod was created in to the end of the hour it ended in.

        Returns:
            The bill, or None while RunPod has no record of the pod (billing lags).
        """
        start = _hour_floor(created_at)
        end = _hour_floor(ended_at) + timedelta(hours=1)
        params = {
            "podId": check_pod_id(pod_id),
            "bucketSize": "hour",
            "startTime": utc_timestamp(start),
            "endTime": utc_timestamp(end),
        }
        records = parse_v2_records(self._call("GET", "/billing/pods", params=params).json(), pod_id)
        return summarise(records, pod_id, "v2") if records else None

    # -- logs ---------------------------------------------------------------------------

    def pod_logs(
        self,
        pod_id: str,
        *,
        source: Literal["container", "system"] | None = None,
        tail: int | None = None,
        last_event_id: str | None = None,
        idle_seconds: float | None = None,
        max_resumes: int = 3,
    ) -> Iterator[LogLine]:
        """``GET /v2/pods/{id}/logs`` as Server-Sent Events (httpx-sse), one ``LogLine``
        per event. A stream that drops is resumed with ``Last-Event-ID`` (the last id
        seen: RunPod's resume cursor), up to ``max_resumes`` times in a row without a
        new line; the iteration ends when RunPod closes the stream or sends nothing for
        ``idle_seconds`` (60 s when None).

        Raises:
            RunPodAPIError: RunPod refused the stream (404 for an unknown pod …).
        """
        from httpx_sse import connect_sse

        check_pod_id(pod_id)
        cursor, resumes = last_event_id, 0
        idle = _LOG_IDLE_SECONDS if idle_seconds is None else idle_seconds
        timeout = httpx.Timeout(self._http.timeout.connect, read=idle)
        while True:
            params: dict[str, Any] = {}
            if source:
                params["source"] = source
            if tail is not None and cursor is None:
                params["tail"] = tail
            headers = {"Last-Event-ID": cursor} if cursor else {}
            what = f"GET /v2/pods/{pod_id}/logs"
            self.budget.before_request(what)
            progressed = False
            try:
                with REFUSED_KEY_HEADER, connect_sse(
                    self._http, "GET", f"/pods/{pod_id}/logs", params=params,
                    headers=headers, timeout=timeout,
                ) as events:  # fmt: skip
                    self.budget.after_response(events.response.headers)
                    if events.response.status_code >= 400:
                        events.response.read()
                        raise _problem(events.response, what)
                    for event in events.iter_sse():
                        if not event.data:
                            continue
                        data = json.loads(event.data)
                        cursor = event.id or data.get("ts") or cursor
                        progressed = True
                        yield LogLine(id=cursor or "", **data)
                return
            except httpx.ReadTimeout:
                return
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                resumes = 0 if progressed else resumes + 1
                if resumes > max_resumes:
                    raise
                logger.info("%s: log stream dropped (%s); resuming after %s", pod_id, exc, cursor)


def _problem(response: httpx.Response, what: str) -> RunPodAPIError:
    """``RunPodAPIError`` from an error answer (its problem object when it has one)."""
    try:
        problem = Problem.model_validate(response.json())
    except (ValueError, TypeError):
        problem = Problem(title=response.reason_phrase, detail=response.text[:200])
    status = response.status_code
    retry = response.headers.get("Retry-After")
    text = f"HTTP {status} {problem.title}: {problem.detail}".rstrip(": ")
    if problem.errors:
        text += " (" + "; ".join(problem.errors) + ")"
    return RunPodAPIError(
        f"{what}: {text}",
        status=status,
        title=problem.title,
        detail=problem.detail,
        errors=problem.errors,
        operation=what,
        retry_after_seconds=float(retry) if retry and retry.isdigit() else None,
    )
