"""RunPod's REST v2 in the RunPod emulator: ``/v2/...`` on the same port as GraphQL, over
the same pods, gateway and ledger (``runpod_api.RunPodEmulator``).

What it does as RunPod's v2 OpenAPI schema (2.0.0) and RunPod's observed behaviour say:

- wrapped lists (``{"pods": [...]}``, ``{"gpus": [...]}``, ``{"keys": [...]}``), 201 on
  create, 204 on delete, 404 problem for an unknown pod;
- errors as RFC 9457 problem objects (``application/problem+json``: ``title``,
  ``status``, ``detail``, ``errors[]``);
- ``RateLimit`` / ``RateLimit-Policy`` headers on every authenticated answer and a 429
  with ``Retry-After`` past the quota (``quota``: per window, on ``rate_clock``);
- a request that breaks the contract — an unknown body field above all — answered 422
  with one ``errors`` line per violation, naming the field;
- **the capacity answer for a create without ``gpu.count`` or with a GPU id that is not
  exactly one of the catalog's** (400, ``There are no longer any instances available…``).
  This mirrors what RunPod's server was observed to do (runpod/runpod-mcp PR #77,
  runpodctl PR #260), not the schema, which gives ``count`` a default of 1;
- a pod that appears in ``GET /v2/pods`` only ``faults.list_delay_seconds`` after its
  create (it is readable by id at once);
- ``GET /v2/pods/{id}/logs`` as Server-Sent Events (``source`` container/system,
  ``tail``, ``since``, ``Last-Event-ID``; each ``id`` the line's RFC 3339 timestamp),
  following new lines while the pod lives and ending the stream after
  ``log_idle_close_seconds`` without one;
- no ``terminateAfter``: v2 has no such field (an unknown field, 422).

Every request and answer is checked against the schema made strict
(``runpod_contract``): the violations land in ``RunPodEmulator.violations``, which the
test fixture requires to be empty.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

import http_sf

from prefect_runpod.blocks.runpod.errors import CAPACITY_MESSAGE, SOMETHING_WENT_WRONG_MESSAGE
from tests.emulators.runpod_billing import BillingQueryError

if TYPE_CHECKING:
    from tests.emulators.runpod_api import RunPodEmulator
    from tests.emulators.runpod_state import EmulatedPod

__all__ = ["Answer", "V2Api", "v2_status"]

DEFAULT_QUOTA = {"minute": (6000, 60.0), "hour": (300000, 3600.0), "day": (5000000, 86400.0)}
"""Quota per window: ``(requests, seconds)``. Far above RunPod's (60 a minute) so the
ordinary tests never wait; rate tests set their own."""
HOST_CUDA = "12.8"
"""The CUDA version every emulated host reports."""
PROBLEM = "application/problem+json"


@dataclass
class Answer:
    """One answer: status, headers, body; ``stream`` (SSE) instead of a body; ``drop``
    closes the connection without answering."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: Iterator[bytes] | None = None
    drop: bool = False


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> Answer:
    """An RFC 9457 problem answer."""
    payload: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors:
        payload["errors"] = errors
    return Answer(status, {"Content-Type": PROBLEM}, json.dumps(payload).encode())


def _json(status: int, payload: Any) -> Answer:
    return Answer(status, {"Content-Type": "application/json"}, json.dumps(payload).encode())


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def v2_status(pod: EmulatedPod, booted: bool) -> str:
    """A pod's v2 status: STARTING until booted, then its own (GraphQL's DEAD → ERROR)."""
    if pod.status == "RUNNING":
        return "RUNNING" if booted else "STARTING"
    return "ERROR" if pod.status in ("DEAD", "ERROR") else pod.status


_ACTIONS = {
    "RUNNING": ["stop", "restart", "terminate"],
    "STARTING": ["terminate"],
    "EXITED": ["start", "terminate"],
    "ERROR": ["terminate"],
    "TERMINATED": [],
}

_ROUTES = [
    ("POST", "/v2/pods", "createPod"),
    ("GET", "/v2/pods", "listPods"),
    ("GET", "/v2/pods/{id}/logs", "getPodLogs"),
    ("GET", "/v2/pods/{id}", "getPod"),
    ("DELETE", "/v2/pods/{id}", "deletePod"),
    ("GET", "/v2/account/ssh-keys", "getSshKeys"),
    ("PUT", "/v2/account/ssh-keys", "updateSshKeys"),
    ("GET", "/v2/catalog/gpus", "listGpuTypes"),
    ("GET", "/v2/billing/pods", "listPodBilling"),
]
POD_SCOPED = frozenset({"getPod", "deletePod"})
"""What a pod's own key may do over v2, on its own pod only."""


def route(method: str, path: str) -> tuple[str, str | None] | None:
    """``(operation id, pod id)`` of a v2 request, or None."""
    parts = path.rstrip("/").split("/")
    for verb, pattern, op in _ROUTES:
        want = pattern.split("/")
        if verb != method or len(want) != len(parts):
            continue
        if all(w == p or w == "{id}" for w, p in zip(want, parts, strict=True)):
            pod_id = parts[want.index("{id}")] if "{id}" in want else None
            return op, pod_id
    return None


class V2Api:
    """The v2 routes of one emulator (see the module docstring).

    Attributes:
        quota: window → ``(requests, seconds)``.
        rate_clock: the clock the rate windows run on (monotonic s; tests inject one).
        log_idle_close_seconds: a log stream with nothing new for this long ends.
    """

    def __init__(self, emu: RunPodEmulator) -> None:
        self.emu = emu
        self.quota: dict[str, tuple[int, float]] = dict(DEFAULT_QUOTA)
        self.rate_clock: Callable[[], float] = time.monotonic
        self.log_idle_close_seconds = 1.0
        self.answered_429 = 0
        self._windows: dict[str, tuple[float, int]] = {}
        self._reads: threading.Barrier | None = None
        self._writes: threading.Barrier | None = None
        self._pending: list[list[str]] = []

    # -- rate limit ---------------------------------------------------------------------

    def _rate(self) -> tuple[bool, dict[str, str], float]:
        """Count one request: ``(allowed, headers, retry after s)``."""
        now = self.rate_clock()
        allowed, retry = True, 0.0
        states = {}
        for name, (quota, window) in self.quota.items():
            start, count = self._windows.get(name, (now, 0))
            if now >= start + window:
                start, count = now, 0
            states[name] = (start, count, quota, window)
            if count >= quota:
                allowed = False
                retry = max(retry, start + window - now)
        if allowed:
            for name, (start, count, quota, window) in states.items():
                self._windows[name] = (start, count + 1)
                states[name] = (start, count + 1, quota, window)
        limit = [
            (name, {"r": max(0, quota - count), "t": max(0, math.ceil(start + window - now))})
            for name, (start, count, quota, window) in states.items()
        ]
        policy = [(name, {"q": q, "w": int(w)}) for name, (_, _, q, w) in states.items()]
        headers = {
            "RateLimit": http_sf.ser(limit),
            "RateLimit-Policy": http_sf.ser(policy),
        }
        return allowed, headers, retry

    # -- dispatch -----------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        """Answer one v2 request (rate headers on every authenticated answer)."""
        url = urlparse(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        auth = headers.get("authorization", "")
        key = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        accepted, scope = self.emu._scope(key)
        found = route(method, url.path)
        if not accepted:
            return problem(401, "Unauthorized", "missing or invalid bearer token")
        with self.emu._lock:
            allowed, rate_headers, retry = self._rate()
        if not allowed:
            self.answered_429 += 1
            window = "minute"
            answer = problem(
                429, "Too Many Requests", f"rate limit exceeded for the {window} window"
            )
            answer.headers.update(rate_headers, **{"Retry-After": str(max(1, math.ceil(retry)))})
            return answer
        answer = self._dispatch(method, url.path, found, scope, query, headers, body)
        answer.headers.update(rate_headers)
        return answer

    def _dispatch(
        self,
        method: str,
        path: str,
        found: tuple[str, str | None] | None,
        scope: str | None,
        query: dict[str, str],
        headers: dict[str, str],
        body: bytes,
    ) -> Answer:
        if found is None:
            return problem(404, "Not Found", f"no route {method} {path}")
        op, pod_id = found
        if scope is not None and (op not in POD_SCOPED or pod_id != scope):
            return problem(403, "Forbidden", "a pod's key acts on its own pod only")
        violations = self.emu.check_request(method, path + _query_text(query), headers, body)
        if violations:  # as RunPod words them: "$.gpu: additional properties 'x' not allowed"
            errors = [line.split(" ", 2)[-1] for line in violations]
            return problem(422, "Unprocessable Entity", "Request validation failed.", errors)
        with self.emu._lock:
            if self.emu.faults.take(self.emu.faults.http_5xx, op):
                return problem(502, "Bad Gateway", "upstream unavailable")
            if self.emu.faults.take(self.emu.faults.something_wrong, op):
                return problem(500, "Internal Server Error", SOMETHING_WENT_WRONG_MESSAGE)
        data = json.loads(body) if body else None
        handler = getattr(self, f"_{op}")
        return handler(pod_id=pod_id, query=query, headers=headers, data=data)

    # -- pods ---------------------------------------------------------------------------

    def pod_json(self, pod: EmulatedPod) -> dict[str, Any]:
        """A pod as REST v2's ``Pod`` (every required field, nothing the schema lacks)."""
        emu = self.emu
        now = time.time()
        booted = now - pod.created >= emu.faults.slow_boot_seconds
        status = v2_status(pod, booted and pod.boot_failure != "image_pull")
        running = status == "RUNNING"
        v2 = pod.v2 or {}
        ports = list(v2.get("ports") or ["22/tcp"])
        gateway = emu.gateway_port
        proxy = {
            "host": "127.0.0.1",
            "port": gateway,
            "username": pod.pod_host_id,
            "command": f"ssh {pod.pod_host_id}@127.0.0.1 -p {gateway}",
        }
        direct = None
        if pod.boot_failure == "no_ssh":  # the container runs, its SSH never appears
            proxy = None
        elif running and emu.mode == "direct" and "22/tcp" in ports:
            direct = {
                "host": "127.0.0.1",
                "port": pod.port,
                "username": "root",
                "command": f"ssh root@127.0.0.1 -p {pod.port}",
            }
        runtime = None
        if running:
            runtime = {
                "uptime": int(now - pod.created - emu.faults.slow_boot_seconds),
                "gpus": [{"util": 0, "memoryUtil": 0}],
                "cpu": {"util": 0},
                "memory": {"util": 0},
                "ports": [{"private": 22, "public": pod.port, "type": "tcp", "ip": "127.0.0.1"}],
            }
        mounts: dict[str, Any] = {}
        if v2.get("volume_gb"):  # the volume's path on the emulated host: the local pod's
            mounts["persistent"] = {"size": v2["volume_gb"], "path": pod.workdir}
        return {
            "id": pod.pod_id,
            "name": pod.name,
            "status": status,
            "actions": _ACTIONS[status],
            "image": v2.get("image") or pod.spec.get("imageName") or "",
            "args": "",
            "disk": int(v2.get("disk") or pod.spec.get("containerDiskInGb") or 20),
            "mounts": mounts,
            "ports": ports,
            "env": dict(pod.env),
            "registry": None,
            "cloud": v2.get("cloud") or "SECURE",
            "dataCenterId": v2.get("data_center") or "US-TX-3",
            "cudaVersion": HOST_CUDA,
            "ssh": {"proxy": proxy, "direct": direct},
            "template": None,
            "cost": 0.0 if status in ("EXITED", "TERMINATED") else pod.cost_per_hr,
            "locked": False,
            "runtime": runtime,
            "createdAt": _iso(pod.created),
            "startedAt": _iso(pod.created + emu.faults.slow_boot_seconds) if running else None,
            "globalNetworking": {"enabled": False},
            "gpu": {"id": pod.gpu_type_id, "count": int(pod.spec.get("gpuCount") or 1)},
        }

    def _createPod(self, data: dict[str, Any], **_: Any) -> Answer:
        emu = self.emu
        gpu = data.get("gpu")
        if not isinstance(gpu, dict):
            return problem(400, "Bad Request", "exactly one of gpu or cpu must be set")
        if gpu.get("minCudaVersion") and gpu.get("allowedCudaVersions"):
            return problem(
                400, "Bad Request", "minCudaVersion and allowedCudaVersions are mutually exclusive"
            )
        gpu_id = gpu.get("id") or ""
        with emu._lock:
            message = None
            if emu.faults.create_errors:
                message = emu.faults.create_errors.pop(0)
            elif emu.faults.capacity_first_n > 0:
                emu.faults.capacity_first_n -= 1
                message = CAPACITY_MESSAGE
            elif gpu_id in emu.faults.capacity_gpu_types:
                message = CAPACITY_MESSAGE
        if message:
            return problem(400, "Bad Request", message)
        if "count" not in gpu or gpu_id not in emu.gpu_types or not _cuda_fits(gpu):
            return problem(400, "Bad Request", CAPACITY_MESSAGE)  # as RunPod: see docstring
        with emu._lock:
            lost = emu.faults.create_answer_lost > 0
            if lost:
                emu.faults.create_answer_lost -= 1
        pod = emu.spawn(
            name=data["name"],
            gpu_id=gpu_id,
            count=int(gpu["count"]),
            cloud=data.get("cloud") or "SECURE",
            env=dict(data.get("env") or {}),
            spec={
                "containerDiskInGb": data.get("disk"),
                "imageName": data.get("image"),
                "ports": ",".join(data.get("ports") or []),
            },
            v2={
                "image": data.get("image"),
                "ports": list(data.get("ports") or []),
                "disk": data.get("disk") or 20,
                "cloud": data.get("cloud") or "SECURE",
                "data_center": (data.get("dataCenterIds") or [None])[0],
                "volume_gb": ((data.get("mounts") or {}).get("persistent") or {}).get("size"),
            },
        )
        if lost:
            return Answer(0, drop=True)
        with emu._lock:
            return _json(201, self.pod_json(pod))

    def _getPod(self, pod_id: str, **_: Any) -> Answer:
        with self.emu._lock:
            self.emu._reconcile()
            pod = self.emu.pods.get(pod_id)
            if pod is None:
                return problem(404, "Not Found", "pod not found")
            return _json(200, self.pod_json(pod))

    def _listPods(self, **_: Any) -> Answer:
        now = time.time()
        with self.emu._lock:
            self.emu._reconcile()
            pods = [self.pod_json(p) for p in self.emu.pods.values() if now >= p.listed_at]
        return _json(200, {"pods": pods})

    def _deletePod(self, pod_id: str, headers: dict[str, str], **_: Any) -> Answer:
        emu = self.emu
        with emu._lock:
            emu._reconcile()
            if emu.faults.terminate_errors:
                return problem(400, "Bad Request", emu.faults.terminate_errors.pop(0))
            if emu.faults.terminate_fail_n > 0:
                emu.faults.terminate_fail_n -= 1
                return problem(500, "Internal Server Error", SOMETHING_WENT_WRONG_MESSAGE)
            if pod_id not in emu.pods:
                return problem(404, "Not Found", "pod not found")
            if emu.faults.terminate_ignored:
                return Answer(204)
        scope = emu._scope(_bearer(headers))[1]
        emu.end_pod(pod_id, "DELETE /v2/pods (pod key)" if scope else "DELETE /v2/pods")
        return Answer(204)

    # -- account, catalog, billing --------------------------------------------------------

    def _getSshKeys(self, **_: Any) -> Answer:
        emu = self.emu
        with emu._lock:
            if emu.faults.ssh_keys_barrier > 1:
                count, emu.faults.ssh_keys_barrier = emu.faults.ssh_keys_barrier, 0
                self._reads = threading.Barrier(count)
                self._writes = threading.Barrier(count, action=self._land_writes)
            reads = self._reads
        if reads is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                reads.wait(timeout=120)
            with emu._lock:
                if self._reads is reads:
                    self._reads = None
        with emu._lock:
            return _json(200, {"keys": [k for k in emu.pub_key.splitlines() if k.strip()]})

    def _land_writes(self) -> None:
        """The held writes, applied in arrival order (the barrier's action)."""
        with self.emu._lock:
            for keys in self._pending:
                self.emu.pub_key = "\n".join(keys)
                self.emu.key_writes.append(list(keys))
            self._pending = []

    def _updateSshKeys(self, data: dict[str, Any], **_: Any) -> Answer:
        keys = list(data["keys"])
        with self.emu._lock:
            writes = self._writes
            if writes is None:
                self.emu.pub_key = "\n".join(keys)
                self.emu.key_writes.append(keys)
            else:
                self._pending.append(keys)
        if writes is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                writes.wait(timeout=120)
            with self.emu._lock:
                if self._writes is writes:
                    self._writes = None
        return _json(200, {"keys": keys})

    def _listGpuTypes(self, query: dict[str, str], **_: Any) -> Answer:
        return _json(200, self.emu.catalog(query))

    def _listPodBilling(self, query: dict[str, str], **_: Any) -> Answer:
        with self.emu._lock:
            self.emu._reconcile()
            try:
                return _json(200, self.emu.ledger.v2(query))
            except BillingQueryError as exc:
                return problem(400, "Bad Request", str(exc))

    # -- logs ---------------------------------------------------------------------------

    def _getPodLogs(
        self, pod_id: str, query: dict[str, str], headers: dict[str, str], **_: Any
    ) -> Answer:
        emu = self.emu
        with emu._lock:
            pod = emu.pods.get(pod_id)
            if pod is None:
                return problem(404, "Not Found", "pod not found")
            emu.sync_container_log(pod)
            cut = emu.faults.log_cut_after_events
            emu.faults.log_cut_after_events = 0
        cursor = headers.get("last-event-id") or None
        since = query.get("since")
        source = query.get("source")
        tail = int(query.get("tail") or 100)
        answer = Answer(
            200,
            {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            stream=self._events(pod, cursor, since, source, tail, cut),
        )
        return answer

    def _events(
        self,
        pod: EmulatedPod,
        cursor: str | None,
        since: str | None,
        source: str | None,
        tail: int,
        cut: int,
    ) -> Iterator[bytes]:
        """The SSE stream: the backlog after the cursor (or the last ``tail`` lines), then
        new lines while the pod lives; a cut stream stops without its closing chunk."""
        emu = self.emu
        with emu._lock:
            lines = [e for e in pod.logs if not source or e.source == source]
        if cursor:
            lines = [e for e in lines if e.id > cursor]
        elif since:
            lines = [e for e in lines if e.id >= since]
        else:
            lines = lines[-tail:] if tail else []
        sent, last, idle_since = 0, cursor or "", time.monotonic()
        while True:
            for event in lines:
                data = {"ts": event.id, "source": event.source, "line": event.line}
                yield f"id: {event.id}\ndata: {json.dumps(data)}\n\n".encode()
                sent, last, idle_since = sent + 1, event.id, time.monotonic()
                if cut and sent >= cut:
                    raise ConnectionAbortedError("log stream cut (fault)")
            with emu._lock:
                alive = pod.pod_id in emu.pods
                if alive:
                    emu.sync_container_log(pod)
                lines = [e for e in pod.logs if e.id > last and (not source or e.source == source)]
            if not lines and (
                not alive or time.monotonic() - idle_since > self.log_idle_close_seconds
            ):
                return
            if not lines:
                time.sleep(0.05)


def _bearer(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None


def _query_text(query: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return f"?{urlencode(query)}" if query else ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _cuda_fits(gpu: dict[str, Any]) -> bool:
    """Whether the emulated hosts (CUDA ``HOST_CUDA``) fit the create's CUDA constraint
    (a version no machine reports is a capacity error, as RunPod's schema says)."""
    floor, allowed = gpu.get("minCudaVersion"), gpu.get("allowedCudaVersions") or []
    if floor and _version(floor) > _version(HOST_CUDA):
        return False
    return not allowed or HOST_CUDA in allowed


def log_stamp(last: str | None) -> str:
    """A fresh, strictly increasing RFC 3339 timestamp (microseconds) for a log line."""
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if last and stamp <= last:
        moment = datetime.strptime(last, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        stamp = (moment + timedelta(microseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp
