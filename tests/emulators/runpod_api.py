"""A loopback emulator of RunPod's GraphQL API, for the real ``runpod`` SDK.

``POST <base>/graphql`` with ``{"query": …}``, parsed and validated by graphql-core
against ``runpod_schema.graphql`` (the subset served): a syntax error or unknown field
is a GraphQL error (HTTP 400), as RunPod answers. Answers keep RunPod's shapes
(reference: runpod-python 1.12 and RunPod's GraphQL docs): HTTP 200 with ``errors`` and
``data: {op: null}`` on failure, 401 for a bad key (Bearer header or ``?api_key=``),
``runtime: null`` until booted, ``podHostId`` = ``<podId>-<8 hex>``, ``podTerminate`` a
scalar, ``gpuTypes(input:{id})`` → ``[]`` for an unknown id.

Each created pod is backed by a real local pod (``LocalPodProvider``): the emulator
reports its SSH port in ``runtime.ports`` (public in ``direct`` mode) and its workspace
as ``volumeMountPath``; the pod id and ``podHostId`` are the local pod's. RunPod's
gateway is a raw TCP forwarder on ``gateway_port`` that routes each connection to the
newest booted pod (the gateway's routing by user needs decryption; tests hold one pod).

Faults are set through ``emulator.faults`` (Python) or ``POST /admin/faults`` (JSON);
``GET /admin/requests`` returns the request log, in which the key is redacted.
``emulator.ended`` records how and when each pod left: through ``podTerminate``, or
removed from inside (its local pod ended on its own, as ``runpodctl remove pod`` does);
``emulator.links`` lists the gateway's connections (bytes carried, cut or not).

Run standalone: ``python -m tests.emulators.runpod_api --port 8911 --api-key KEY``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from graphql import GraphQLError, build_schema, execute, parse, validate
from graphql.language import OperationDefinitionNode

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.runpod.errors import (
    CAPACITY_MESSAGE,
    HOST_GPUS_BUSY_MESSAGE,
    NOT_FOUND_TO_TERMINATE_MESSAGE,
    SOMETHING_WENT_WRONG_MESSAGE,
)

__all__ = ["DEFAULT_GPU_TYPES", "Faults", "GatewayLink", "PodEnd", "RunPodEmulator"]

SCHEMA = build_schema((Path(__file__).with_name("runpod_schema.graphql")).read_text())

DEFAULT_GPU_TYPES: dict[str, dict[str, Any]] = {
    "NVIDIA GeForce RTX 3090": {
        "displayName": "RTX 3090",
        "memoryInGb": 24,
        "securePrice": 0.22,
        "communityPrice": 0.22,
    },
    "NVIDIA GeForce RTX 4090": {
        "displayName": "RTX 4090",
        "memoryInGb": 24,
        "securePrice": 0.69,
        "communityPrice": 0.34,
    },
    "NVIDIA RTX A5000": {
        "displayName": "RTX A5000",
        "memoryInGb": 24,
        "securePrice": 0.27,
        "communityPrice": 0.16,
    },
    "NVIDIA A100 80GB PCIe": {
        "displayName": "A100 PCIe",
        "memoryInGb": 80,
        "securePrice": 1.64,
        "communityPrice": 1.19,
    },
}
_SECRET_IN_QUERY = re.compile(r"(api_key=)[^&\s]+")


@dataclass
class Faults:
    """Faults to inject; each counter is consumed as requests arrive.

    Attributes:
        capacity_first_n: the next N creates answer RunPod's capacity error.
        capacity_gpu_types: creates for these GPU type ids always answer it.
        create_errors: messages the next creates answer, one each (any RunPod text).
        something_wrong: op name (or ``*``) → N answers of ``Something went wrong…``
            (``INTERNAL_SERVER_ERROR``, HTTP 200).
        http_5xx: op name (or ``*``) → N answers of HTTP 502 with an HTML body.
        slow_boot_seconds: ``runtime`` stays null this long after create.
        terminate_fail_n: the next N ``podTerminate`` answer ``Something went wrong…``.
        terminate_ignored: ``podTerminate`` answers OK but the pod stays (a stuck host).
        resume_gpus_busy: ``podResume`` answers "not enough free GPUs on the host".
        drop_next_connection_after_bytes: when > 0, the gateway cuts the first SSH
            connection (accepted from now on) that has carried this many bytes, both
            directions together: a dropped link at a chosen point, by volume, never by
            time. Shorter connections (a host-key probe) pass untouched; one cut, then
            the fault is spent (reset to 0).
        refuse_connections_until: while ``time.monotonic()`` is before this, the
            gateway closes every connection it accepts at once, as a restarting proxy
            does (set it with ``RunPodEmulator.refuse_connections_for``); each one is
            counted in ``RunPodEmulator.refused_connections``.
    """

    capacity_first_n: int = 0
    capacity_gpu_types: set[str] = field(default_factory=set)
    create_errors: list[str] = field(default_factory=list)
    something_wrong: dict[str, int] = field(default_factory=dict)
    http_5xx: dict[str, int] = field(default_factory=dict)
    slow_boot_seconds: float = 0.0
    terminate_fail_n: int = 0
    terminate_ignored: bool = False
    resume_gpus_busy: bool = False
    drop_next_connection_after_bytes: int = 0
    refuse_connections_until: float = 0.0

    def take(self, table: dict[str, int], op: str) -> bool:
        """Consume one count for ``op`` (or ``*``); True when a fault fires."""
        for key in (op, "*"):
            if table.get(key, 0) > 0:
                table[key] -= 1
                return True
        return False


@dataclass
class _Pod:
    pod_id: str
    name: str
    pod_host_id: str
    gpu_type_id: str
    cost_per_hr: float
    spec: dict[str, Any]
    env: dict[str, str]
    created: float
    port: int
    workdir: str
    status: str = "RUNNING"


@dataclass
class PodEnd:
    """How a pod left the emulator.

    Attributes:
        pod_id: the pod.
        how: ``podTerminate`` (through the API) or ``removed-from-inside`` (its local pod
            ended on its own: ``runpodctl remove pod $RUNPOD_POD_ID`` from the pod, i.e.
            the dead-man switch), or ``vanished`` (``vanish``).
        at: when the emulator confirmed it, epoch seconds.
    """

    pod_id: str
    how: str
    at: float


@dataclass
class GatewayLink:
    """One connection through the gateway (both directions).

    Attributes:
        pod_id: the pod it was routed to.
        relayed_bytes: bytes carried so far, both directions together.
        drop_after_bytes: the link is cut once it has carried this many bytes; 0: never.
        dropped: True once the gateway cut it.
    """

    pod_id: str
    relayed_bytes: int = 0
    drop_after_bytes: int = 0
    dropped: bool = False


class RunPodEmulator:
    """RunPod's GraphQL API on ``127.0.0.1``, backed by real local pods.

    Args:
        api_key: the one key accepted.
        home: the local pods' home directory.
        mode: ``gateway`` (pods reachable through ``gateway_port`` only) or ``direct``
            (22/tcp also reported on a public IP, the local pod allowing exec/SFTP).
        pub_key: the account's SSH public keys (``myself { pubKey }``), newline-separated.
        gpu_types: the GPU catalogue (id → fields); ``DEFAULT_GPU_TYPES`` by default.
        port: the HTTP port (0 = a free one).
    """

    def __init__(
        self,
        *,
        api_key: str,
        home: Path,
        mode: str = "gateway",
        pub_key: str = "",
        gpu_types: dict[str, dict[str, Any]] | None = None,
        port: int = 0,
    ) -> None:
        self.api_key = api_key
        self.mode = mode
        self.pub_key = pub_key
        self.gpu_types = dict(gpu_types or DEFAULT_GPU_TYPES)
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.pods: dict[str, _Pod] = {}
        self.ended: dict[str, PodEnd] = {}
        self.links: list[GatewayLink] = []
        self.refused_connections = 0
        self._terminating: set[str] = set()
        self.local = LocalPodProvider(home=home, mode=mode)  # type: ignore[arg-type]
        self._lock = threading.RLock()
        self._http = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._http.daemon_threads = True
        self._gw = socket.create_server(("127.0.0.1", 0))
        self._gw.settimeout(0.1)
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        self._closed = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the value for ``RUNPOD_API_BASE_URL``."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def gateway_port(self) -> int:
        """The loopback port standing in for ``ssh.runpod.io:22``."""
        return int(self._gw.getsockname()[1])

    def start(self) -> RunPodEmulator:
        """Serve HTTP and the gateway forwarder in background threads."""
        for target in (lambda: self._http.serve_forever(poll_interval=0.05), self._gateway_loop):
            thread = threading.Thread(target=target, daemon=True, name="runpod-emulator")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[str]:
        """Stop serving; terminate every pod still alive. Returns their ids (leftovers)."""
        leftovers = sorted(set(self.pods) | {h.pod_id for h in self.local.list("")})
        for pod_id in leftovers:
            self.local.terminate(pod_id)
        self.pods.clear()
        self._closed.set()
        self._http.shutdown()
        self._http.server_close()
        self._gw.close()
        for sock in list(self._open):
            _close(sock)
        for thread in self._threads:
            thread.join(timeout=5)
        return leftovers

    def __enter__(self) -> RunPodEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state helpers for tests --------------------------------------------------------

    def refuse_connections_for(self, seconds: float) -> None:
        """From now on, for ``seconds``, the gateway accepts connections and closes them
        at once (see ``Faults.refuse_connections_until``)."""
        with self._lock:
            self.faults.refuse_connections_until = time.monotonic() + seconds

    def vanish(self, pod_id: str) -> None:
        """The pod disappears (its host lost it): the local pod ends, ``pod`` → null."""
        with self._lock:
            pod = self.pods.pop(pod_id, None)
            if pod is not None:
                self.ended[pod_id] = PodEnd(pod_id, "vanished", time.time())
        if pod is not None:
            self.local.terminate(pod_id)

    def live_pod_ids(self) -> list[str]:
        """Ids of pods not terminated (reconciled with the local pods)."""
        with self._lock:
            self._reconcile()
            return list(self.pods)

    def log_text(self) -> str:
        """The whole request log as one string (for secret-sentinel checks)."""
        return json.dumps(self.requests)

    def _reconcile(self) -> None:
        """Drop pods whose local pod ended on its own (``runpodctl remove pod``), and
        record them as removed from inside."""
        for pod_id in list(self.pods):
            if pod_id not in self._terminating and self.local.get(pod_id) is None:
                self.pods.pop(pod_id, None)
                self.ended[pod_id] = PodEnd(pod_id, "removed-from-inside", time.time())

    # -- GraphQL ------------------------------------------------------------------------

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        """Answer one HTTP request: ``(status, content type, body)``."""
        url = urlparse(path)
        entry: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(),
            "path": _SECRET_IN_QUERY.sub(r"\1***", path),
            "authorization": "Bearer ***" if headers.get("authorization") else None,
        }
        with self._lock:
            self.requests.append(entry)
        key = parse_qs(url.query).get("api_key", [None])[0]
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            key = auth[len("Bearer ") :]
        if key != self.api_key:
            entry["status"] = 401
            return 401, "application/json", b'{"error":"Unauthorized"}'
        try:
            query = json.loads(body or b"{}").get("query", "")
        except (json.JSONDecodeError, AttributeError):
            query = ""
        entry["query"] = query
        try:
            document = parse(query)
        except GraphQLError as exc:
            entry["status"] = 400
            return _json(400, {"errors": [_with_code(exc.formatted, "GRAPHQL_PARSE_FAILED")]})
        errors = validate(SCHEMA, document)
        if errors:
            entry["status"] = 400
            return _json(
                400,
                {"errors": [_with_code(e.formatted, "GRAPHQL_VALIDATION_FAILED") for e in errors]},
            )
        ops = _top_fields(document)
        entry["operation"] = ",".join(ops)
        with self._lock:
            fire_5xx = any(self.faults.take(self.faults.http_5xx, op) for op in ops)
        if fire_5xx:
            entry["status"] = 502
            return 502, "text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        result = execute(SCHEMA, document, root_value=_Root(self))
        payload = result.formatted
        entry["status"] = 200
        if result.errors:
            entry["errors"] = [e["message"] for e in payload["errors"]]
        return _json(200, payload)

    def _maybe_something_wrong(self, op: str) -> None:
        with self._lock:
            fire = self.faults.take(self.faults.something_wrong, op)
        if fire:
            raise GraphQLError(
                SOMETHING_WENT_WRONG_MESSAGE, extensions={"code": "INTERNAL_SERVER_ERROR"}
            )

    def pod_dict(self, pod: _Pod) -> dict[str, Any]:
        """A pod as RunPod's ``Pod`` type answers it."""
        now = time.time()
        booted = now - pod.created >= self.faults.slow_boot_seconds
        runtime = None
        if booted and pod.status == "RUNNING":
            runtime = {
                "uptimeInSeconds": int(now - pod.created - self.faults.slow_boot_seconds),
                "ports": [
                    {
                        "ip": "127.0.0.1",
                        "isIpPublic": self.mode == "direct",
                        "privatePort": 22,
                        "publicPort": pod.port,
                        "type": "tcp",
                    }
                ],
                "gpus": [{"id": f"GPU-{pod.pod_id}", "gpuUtilPercent": 0, "memoryUtilPercent": 0}],
                "container": {"cpuPercent": 0, "memoryPercent": 0},
            }
        gpu = self.gpu_types.get(pod.gpu_type_id, {})
        return {
            **pod.spec,
            "id": pod.pod_id,
            "name": pod.name,
            "costPerHr": pod.cost_per_hr,
            "desiredStatus": pod.status,
            "dockerId": None,
            "env": [f"{k}={v}" for k, v in pod.env.items()],
            "lastStatusChange": f"Rented by User: {time.ctime(pod.created)}",
            "machineId": pod.pod_host_id.rsplit("-", 1)[1],
            "podType": "RESERVED",
            "port": None,
            "uptimeSeconds": int(now - pod.created),
            "volumeMountPath": pod.workdir,
            "runtime": runtime,
            "machine": {
                "podHostId": pod.pod_host_id,
                "gpuTypeId": pod.gpu_type_id,
                "gpuDisplayName": gpu.get("displayName"),
            },
        }

    def deploy(self, data: dict[str, Any]) -> dict[str, Any]:
        """``podFindAndDeployOnDemand``: faults first, then a real local pod."""
        self._maybe_something_wrong("podFindAndDeployOnDemand")
        gpu_id = data.get("gpuTypeId") or ""
        with self._lock:
            message = None
            if self.faults.create_errors:
                message = self.faults.create_errors.pop(0)
            elif self.faults.capacity_first_n > 0:
                self.faults.capacity_first_n -= 1
                message = CAPACITY_MESSAGE
            elif gpu_id in self.faults.capacity_gpu_types:
                message = CAPACITY_MESSAGE
        if message:
            raise GraphQLError(message)
        if gpu_id not in self.gpu_types:
            raise GraphQLError(
                SOMETHING_WENT_WRONG_MESSAGE, extensions={"code": "INTERNAL_SERVER_ERROR"}
            )
        env = {e["key"]: e["value"] for e in data.get("env") or []}
        public_key = env.get("PUBLIC_KEY") or (self.pub_key.splitlines() or [""])[0]
        public_key = public_key or generate_keypair().public_key
        handle = self.local.create(PodRequest(public_key=public_key, env=env), data["name"])
        handle = self.local.wait_ready(handle, timeout_seconds=60)
        gpu = self.gpu_types[gpu_id]
        price = (
            gpu["communityPrice"] if data.get("cloudType") == "COMMUNITY" else gpu["securePrice"]
        )
        count = int(data.get("gpuCount") or 1)
        spec = {
            "containerDiskInGb": data.get("containerDiskInGb"),
            "gpuCount": count,
            "imageName": data.get("imageName"),
            "dockerArgs": data.get("dockerArgs") or "",
            "memoryInGb": 31.0 * count,
            "ports": data.get("ports"),
            "vcpuCount": 8.0 * count,
            "volumeInGb": float(data.get("volumeInGb") or 0),
        }
        assert handle.ssh is not None and handle.pod_host_id
        pod = _Pod(
            pod_id=handle.pod_id,
            name=data["name"],
            pod_host_id=handle.pod_host_id,
            gpu_type_id=gpu_id,
            cost_per_hr=round(price * count, 4),
            spec=spec,
            env=env,
            created=time.time(),
            port=handle.ssh.port,
            workdir=handle.workdir,
        )
        with self._lock:
            self.pods[pod.pod_id] = pod
        return self.pod_dict(pod)

    def terminate(self, pod_id: str) -> None:
        """``podTerminate``: ends the local pod, then the pod reads back as null."""
        self._maybe_something_wrong("podTerminate")
        with self._lock:
            self._reconcile()
            if self.faults.terminate_fail_n > 0:
                self.faults.terminate_fail_n -= 1
                raise GraphQLError(
                    SOMETHING_WENT_WRONG_MESSAGE, extensions={"code": "INTERNAL_SERVER_ERROR"}
                )
            if pod_id not in self.pods:
                raise GraphQLError(NOT_FOUND_TO_TERMINATE_MESSAGE)
            if self.faults.terminate_ignored:
                return None
            self._terminating.add(pod_id)
        try:
            self.local.terminate(pod_id)
        finally:
            with self._lock:
                self._terminating.discard(pod_id)
                if self.local.get(pod_id) is None and self.pods.pop(pod_id, None) is not None:
                    self.ended[pod_id] = PodEnd(pod_id, "podTerminate", time.time())
        return None

    # -- the gateway forwarder ----------------------------------------------------------

    def _gateway_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._gw.accept()
            except TimeoutError:
                continue  # wake up to notice stop()
            except OSError:
                return
            with self._lock:
                refusing = time.monotonic() < self.faults.refuse_connections_until
                if refusing:
                    self.refused_connections += 1
            if refusing:
                _close(client)
                continue
            with self._lock:
                self._reconcile()
                booted = [p for p in self.pods.values() if self.pod_dict(p)["runtime"]]
                newest = max(booted, key=lambda p: p.created) if booted else None
                link = None
                if newest is not None:
                    link = GatewayLink(
                        newest.pod_id, drop_after_bytes=self.faults.drop_next_connection_after_bytes
                    )
                    self.links.append(link)
            if newest is None or link is None:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", newest.port), timeout=5)
            except OSError:
                _close(client)
                continue
            for a, b in ((client, upstream), (upstream, client)):
                self._open.update((a, b))
                threading.Thread(target=self._pump, args=(a, b, link), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: GatewayLink) -> None:
        try:
            src.settimeout(None)
            while chunk := src.recv(65536):
                with self._lock:
                    limit = link.drop_after_bytes
                    armed = self.faults.drop_next_connection_after_bytes > 0
                    if armed and limit and link.relayed_bytes + len(chunk) >= limit:
                        link.dropped = True  # one cut, then the fault is spent
                        self.faults.drop_next_connection_after_bytes = 0
                    if not link.dropped:
                        link.relayed_bytes += len(chunk)
                if link.dropped:
                    break  # the link drops mid-stream: nothing more is relayed
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                self._open.discard(sock)
                _close(sock)


class _Root:
    """Root resolvers (graphql-core calls ``root.<field>(info, **args)``)."""

    def __init__(self, emu: RunPodEmulator) -> None:
        self.emu = emu

    def myself(self, info: Any) -> dict[str, Any]:
        self.emu._maybe_something_wrong("myself")
        with self.emu._lock:
            self.emu._reconcile()
            pods = [self.emu.pod_dict(p) for p in self.emu.pods.values()]
        return {
            "id": "user_emulated",
            "pubKey": self.emu.pub_key,
            "pods": pods,
            "networkVolumes": [],
        }

    def pod(self, info: Any, input: dict[str, Any] | None = None) -> dict[str, Any] | None:
        self.emu._maybe_something_wrong("pod")
        with self.emu._lock:
            self.emu._reconcile()
            pod = self.emu.pods.get((input or {}).get("podId", ""))
            return self.emu.pod_dict(pod) if pod else None

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        self.emu._maybe_something_wrong("gpuTypes")
        wanted = (input or {}).get("id")
        out = []
        for gpu_id, gpu in self.emu.gpu_types.items():
            if wanted is not None and wanted != gpu_id:
                continue
            low = min(gpu["securePrice"], gpu["communityPrice"])
            out.append(
                {
                    **gpu,
                    "id": gpu_id,
                    "manufacturer": "Nvidia",
                    "cudaCores": 0,
                    "maxGpuCount": 8,
                    "secureCloud": True,
                    "communityCloud": True,
                    "lowestPrice": lambda info, input=None, low=low: {
                        "minimumBidPrice": round(low * 0.6, 3),
                        "uninterruptablePrice": low,
                    },
                }
            )
        return out

    def podFindAndDeployOnDemand(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return self.emu.deploy(input)

    def podTerminate(self, info: Any, input: dict[str, Any]) -> None:
        return self.emu.terminate(input["podId"])

    def podStop(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        with self.emu._lock:
            pod = self.emu.pods.get(input["podId"])
            if pod is None:
                raise GraphQLError("pod not found")
            pod.status = "EXITED"
            return self.emu.pod_dict(pod)

    def podResume(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        with self.emu._lock:
            pod = self.emu.pods.get(input["podId"])
            if pod is None:
                raise GraphQLError("pod not found")
            if self.emu.faults.resume_gpus_busy:
                raise GraphQLError(HOST_GPUS_BUSY_MESSAGE)
            pod.status = "RUNNING"
            return self.emu.pod_dict(pod)

    def updateUserSettings(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        with self.emu._lock:
            self.emu.pub_key = input.get("pubKey") or ""
            return {"id": "user_emulated", "pubKey": self.emu.pub_key}


def _top_fields(document: Any) -> list[str]:
    return [
        sel.name.value
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        for sel in d.selection_set.selections
        if hasattr(sel, "name")
    ]


def _with_code(error: dict[str, Any], code: str) -> dict[str, Any]:
    return {**error, "extensions": {"code": code}}


def _json(status: int, payload: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(payload).encode()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _handler_for(emu: RunPodEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet; the emulator keeps its own log
            pass

        def _reply(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/admin/requests"):
                self._reply(200, "application/json", emu.log_text().encode())
            elif self.path.startswith("/admin/pods"):
                self._reply(*_json(200, {"pods": emu.live_pod_ids()}))
            else:
                self._reply(404, "text/plain", b"not found")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/admin/faults"):
                with emu._lock:
                    for name, value in json.loads(body or b"{}").items():
                        current = getattr(emu.faults, name)
                        setattr(emu.faults, name, set(value) if isinstance(current, set) else value)
                self._reply(*_json(200, {"ok": True}))
            elif self.path.startswith("/admin/vanish/"):
                emu.vanish(self.path.rsplit("/", 1)[1])
                self._reply(*_json(200, {"ok": True}))
            elif urlparse(self.path).path == "/graphql":
                headers = {k.lower(): v for k, v in self.headers.items()}
                self._reply(*emu.handle(self.path, headers, body))
            else:
                self._reply(404, "text/plain", b"not found")

    return Handler


def main() -> None:
    """``python -m tests.emulators.runpod_api --port P``: serve until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="rpa_emulator")
    parser.add_argument("--home", default=None, help="local pods' home (default: a temp dir)")
    parser.add_argument("--mode", choices=["gateway", "direct"], default="gateway")
    args = parser.parse_args()
    import tempfile

    home = Path(args.home or tempfile.mkdtemp(prefix="runpod-emulator-"))
    emu = RunPodEmulator(api_key=args.api_key, home=home, mode=args.mode, port=args.port)
    emu.start()
    print(f"RUNPOD_API_BASE_URL={emu.base_url}  gateway=127.0.0.1:{emu.gateway_port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print(f"stopped; terminated leftovers: {emu.stop()}")


if __name__ == "__main__":
    main()
