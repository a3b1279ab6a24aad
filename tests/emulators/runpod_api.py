"""A loopback emulator of RunPod's APIs: GraphQL for the real ``runpod`` SDK, and REST
v2 (``/v2/...`` on the same port, ``runpod_v2``) for prefect-runpod's own client.

``POST <base>/graphql`` with ``{"query": …}``, parsed and validated by graphql-core
against ``runpod_schema.graphql`` (the subset served): a syntax error or unknown field
is a GraphQL error (HTTP 400), as RunPod answers. Answers keep RunPod's shapes
(reference: runpod-python 1.12 and RunPod's GraphQL docs): HTTP 200 with ``errors`` and
``data: {op: null}`` on failure, 401 for a bad key (Bearer header or ``?api_key=``),
``runtime: null`` until booted, ``podHostId`` = ``<podId>-<8 hex>``, ``podTerminate`` a
scalar, ``gpuTypes(input:{id})`` → ``[]`` for an unknown id.

Each created pod is backed by a real local pod (``LocalPodProvider``): the emulator
reports its SSH port in ``runtime.ports`` (public in ``direct`` mode) and its workspace
as ``volumeMountPath``; the pod id (``[a-z0-9]``, 14 characters, no hyphen) and
``podHostId`` (``<id>-<8 hex>``) are the local pod's. RunPod's gateway is an SSH server
of its own on ``gateway_port`` (``runpod_gateway.SSHGateway``) that routes each login to
the pod its user names, so several emulated pods can be used at once.

Like a real pod, each one gets a pod-scoped ``RUNPOD_API_KEY`` (accepted for that pod's
``pod``, ``podStop`` and ``podTerminate`` only) and, in ``RUNPOD_API_BASE_URL``, an HTTPS
address of this API whose certificate a throwaway CA signed: a CA bundle that trusts it
sits where pip's ``certifi`` would (``~/.local/lib/python3.X/site-packages/certifi``),
unless ``faults.pod_ca_bundle`` is off (an image where TLS verification fails).
A GraphQL create's ``terminateAfter`` is accepted and ignored, as RunPod did (it never
fired: runpodctl removed its flags on 2026-08-26); REST v2 has no such field. No pod
ends on a deadline here.

Billing: ``emulator.ledger`` (``runpod_billing.Ledger``) bills each pod to the
millisecond; ``GET /v2/billing/pods`` answers from it. REST v1 (``/v1/...``) answers
410 Gone, as RunPod's has since 2026-11-15; ``retired`` (``--retire graphql``) makes
GraphQL answer 410 too. Every v2 request and answer is checked against RunPod's schema,
strict (``runpod_contract``); what breaks it is kept in ``violations``.

A host failure: ``emulator.fail_host(pod_id, "ERROR"|"EXITED")`` kills the pod's container
(its local pod's daemon) and leaves the pod listed in that state, billed until terminated.
Faults are set through ``emulator.faults`` (Python) or ``POST /admin/faults`` (JSON);
``GET /admin/requests`` returns the request log, in which the key is redacted.
``emulator.ended`` records how and when each pod left: ``podTerminate`` (the account's
key), ``podTerminate (pod key)`` (from inside, with the pod's own key),
``removed-from-inside`` (its local pod ended on its own, as ``runpodctl pod delete``
does) or ``vanished``; ``emulator.links`` lists the gateway's
sessions (bytes relayed, cut or not).

Run standalone: ``python -m tests.emulators.runpod_api --port 8911 --api-key KEY
[--retire graphql,v1]``.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from graphql import GraphQLError, build_schema, execute, parse, validate
from graphql.language import OperationDefinitionNode

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import PodPaths
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.blocks.runpod.errors import (
    CAPACITY_MESSAGE,
    NOT_FOUND_TO_TERMINATE_MESSAGE,
    SOMETHING_WENT_WRONG_MESSAGE,
)
from tests.emulators.runpod_billing import Ledger
from tests.emulators.runpod_gateway import GatewayLink, Route, SSHGateway
from tests.emulators.runpod_resolvers import Root
from tests.emulators.runpod_state import DEFAULT_GPU_TYPES, EmulatedPod, Faults, LogEvent, PodEnd
from tests.emulators.runpod_v2 import HOST_CUDA, Answer, V2Api, log_stamp, problem
from tests.emulators.tls import make_loopback_ca

__all__ = ["BOOT_LOG", "DEFAULT_GPU_TYPES", "Faults", "GatewayLink", "PodEnd", "RunPodEmulator"]

BOOT_LOG = {
    "": "Pulling image {image}\nImage {image} pulled\nContainer started",
    "image_pull": "Pulling image {image}\nError response from daemon: pull access denied for "
    "{image}, repository does not exist or may require 'docker login'\nBack-off pulling "
    "image {image}",
    "no_ssh": "Pulling image {image}\nImage {image} pulled\nContainer started\nSSH not "
    "started: the account has no SSH public key registered",
}
"""A pod's ``system`` log lines at boot, by ``Faults.boot_failure`` (the emulator's own
wording)."""

_SDL = (Path(__file__).with_name("runpod_schema.graphql")).read_text()
SCHEMA = build_schema(_SDL)
POD_SCOPED_OPS = frozenset({"pod", "podStop", "podTerminate"})
"""What a pod's own ``RUNPOD_API_KEY`` may ask, and only about its pod."""

_SECRET_IN_QUERY = re.compile(r"(api_key=)[^&\s]+")


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
        retire: APIs that answer 410 Gone besides REST v1 (``{"graphql"}``).
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
        retire: set[str] | None = None,
    ) -> None:
        self.api_key = api_key
        self.retired = {"v1", *(retire or set())}
        """APIs answering 410 Gone: REST v1 always (RunPod retired it on 2026-11-15)."""
        self.violations: list[str] = []
        """Breaks of RunPod's v2 contract (strict) by a request or an answer."""
        self.validate_contract = True
        self.key_writes: list[list[str]] = []
        """Every list ``PUT /v2/account/ssh-keys`` received, in order."""
        self.mode = mode
        self.pub_key = pub_key
        self.gpu_types = dict(gpu_types or DEFAULT_GPU_TYPES)
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.pods: dict[str, EmulatedPod] = {}
        self.ended: dict[str, PodEnd] = {}
        self.refused_connections = 0
        self.clock = time.time
        """The emulator's clock (epoch seconds): billing follows it."""
        self.ledger = Ledger(clock=lambda: self.clock())
        self._terminating: set[str] = set()
        self._failed_hosts: set[str] = set()
        self.local = LocalPodProvider(home=home, mode=mode, start_timeout_seconds=120.0)  # type: ignore[arg-type]
        self._lock = threading.RLock()
        self._http = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._http.daemon_threads = True
        self._ca = make_loopback_ca("RunPod emulator test CA")
        self._https = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._https.daemon_threads = True
        self._https.socket = self._ca.server_context(Path(home) / ".tls").wrap_socket(
            self._https.socket, server_side=True
        )
        self.gateway = SSHGateway(self._route, self._take_drop, self._drop_spent, self._refusing)
        self.v2 = V2Api(self)
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the value for ``RUNPOD_API_BASE_URL``."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def rest_base_url(self) -> str:
        """REST v1's old base (``<base>/v1``): it answers 410 Gone, as RunPod's does."""
        return f"{self.base_url}/v1"

    @property
    def tls_base_url(self) -> str:
        """This API over HTTPS (a throwaway CA's certificate): what pods are given."""
        return f"https://127.0.0.1:{self._https.server_address[1]}"

    @property
    def gateway_port(self) -> int:
        """The loopback port standing in for ``ssh.runpod.io:22``."""
        return self.gateway.port

    @property
    def links(self) -> list[GatewayLink]:
        """The gateway's sessions so far."""
        return self.gateway.links

    def start(self) -> RunPodEmulator:
        """Serve HTTP, HTTPS and the gateway in background threads.

        The strict contract is built first (once per process, seconds of CPU on a busy
        machine), so the first REST v2 request is not the one that waits for it."""
        if self.validate_contract:
            from tests.emulators.runpod_contract import contract

            contract()
        self.gateway.start()
        for target in (
            lambda: self._http.serve_forever(poll_interval=0.05),
            lambda: self._https.serve_forever(poll_interval=0.05),
        ):
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
        for server in (self._http, self._https):
            server.shutdown()
            server.server_close()
        self.gateway.stop()
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

    def refuse_next_connections(self, count: int) -> None:
        """The gateway accepts the next ``count`` connections and closes them at once,
        then serves again (see ``Faults.refuse_next_connections``)."""
        with self._lock:
            self.faults.refuse_next_connections = count

    def _refusing(self) -> bool:
        """True while ``refuse_connections_for`` is in force, or for each of the
        connections ``refuse_next_connections`` counts (each refusal counted)."""
        with self._lock:
            refusing = time.monotonic() < self.faults.refuse_connections_until
            if not refusing and self.faults.refuse_next_connections > 0:
                self.faults.refuse_next_connections -= 1
                refusing = True
            if refusing:
                self.refused_connections += 1
            return refusing

    def vanish(self, pod_id: str) -> None:
        """The pod disappears (its host lost it): the local pod ends, ``pod`` → null."""
        with self._lock:
            if pod_id in self.pods and self.pods[pod_id].hollow:
                self._end(pod_id, "vanished", self.clock())
                return
            known = pod_id in self.pods
            if known:
                self._terminating.add(pod_id)
        if known:
            self._end_local(pod_id, "vanished")

    def fail_host(self, pod_id: str, status: str = "ERROR") -> None:
        """The pod's host fails under it, as a real host failure does: its container
        (the local pod's daemon, and with it the job) dies at once, RunPod reports the
        pod ``status`` (``ERROR``: the host lost; ``EXITED``: the container stopped) with
        no runtime, and the pod stays listed and billed until it is terminated."""
        import contextlib
        import os
        import signal

        from prefect_runpod.blocks.local_pod.registry import read_record

        assert status in ("ERROR", "EXITED"), status
        with self._lock:
            pod = self.pods[pod_id]
            pod.status = status
            self._failed_hosts.add(pod_id)
        record = read_record(self.local.home, pod_id)
        if record is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)

    def _end_local(self, pod_id: str, how: str) -> None:
        """End the pod's local pod, then record how (the pod is marked terminating)."""
        try:
            self.local.terminate(pod_id)
        finally:
            with self._lock:
                self._terminating.discard(pod_id)
                self._end(pod_id, how, self.clock())

    def live_pod_ids(self) -> list[str]:
        """Ids of pods not terminated (reconciled with the local pods)."""
        with self._lock:
            self._reconcile()
            return list(self.pods)

    def first_call_naming(self, pod_id: str) -> datetime | None:
        """When the first request (GraphQL or REST v2) made with the account's key that
        names ``pod_id`` arrived, or None. The id exists only from the create's answer
        on, so whoever sent that request had read the answer by then."""
        with self._lock:
            times = [
                datetime.fromisoformat(e["time"])
                for e in self.requests
                if e.get("scope") == "account"
                and (pod_id in e.get("query", "") or pod_id in e.get("path", ""))
            ]
        return min(times, default=None)

    def log_text(self) -> str:
        """The whole request log as one string (for secret-sentinel checks)."""
        return json.dumps(self.requests)

    def check_request(
        self, method: str, url: str, headers: dict[str, str], body: bytes
    ) -> list[str]:
        """The strict contract's violations by one v2 request (recorded)."""
        if not self.validate_contract:
            return []
        from tests.emulators.runpod_contract import check_request

        found = check_request(method, url, headers, body)
        with self._lock:
            self.violations += found
        return found

    def check_answer(
        self, method: str, url: str, request_headers: dict[str, str], answer: Answer
    ) -> None:
        """Record the strict contract's violations by one v2 answer (a stream's headers
        only: the schema gives its body as a string)."""
        if not self.validate_contract or answer.drop:
            return
        from tests.emulators.runpod_contract import check_response

        body = b": a stream of events\n" if answer.stream is not None else answer.body
        found = check_response(method, url, request_headers, answer.status, answer.headers, body)
        with self._lock:
            self.violations += found

    def take_violations(self) -> list[str]:
        """The violations so far, cleared (for tests that break the contract on purpose)."""
        with self._lock:
            found, self.violations = self.violations, []
        return found

    def _end(self, pod_id: str, how: str, at: float) -> None:
        """Record that ``pod_id`` left (billing stops at ``at``). Call with the lock held."""
        if self.pods.pop(pod_id, None) is not None:
            self.ended[pod_id] = PodEnd(pod_id, how, at)
            self.ledger.close(pod_id, at)

    def _reconcile(self) -> None:
        """Drop pods whose local pod ended on its own (``runpodctl pod delete``), and
        record them as removed from inside, at the moment the local pod recorded."""
        for pod_id, pod in list(self.pods.items()):
            if pod.hollow or pod_id in self._failed_hosts:
                continue
            if pod_id not in self._terminating and self.local.get(pod_id) is None:
                tomb = self.local.ended(pod_id)
                at = datetime.fromisoformat(tomb.ended_at).timestamp() if tomb else self.clock()
                self._end(pod_id, "removed-from-inside", at)

    # -- the gateway --------------------------------------------------------------------

    def _route(self, user: str) -> Route | None:
        """Where the gateway sends a login as ``user``: the running, booted pod whose
        ``podHostId`` it is."""
        with self._lock:
            self._reconcile()
            for pod in self.pods.values():
                if pod.boot_failure or pod.hollow:
                    continue
                if pod.pod_host_id == user and self.pod_dict(pod)["runtime"]:
                    keys = [k for k in self.pub_key.splitlines() if k.strip()]
                    if pod.env.get("PUBLIC_KEY"):
                        keys.append(pod.env["PUBLIC_KEY"])
                    return Route(pod.pod_id, pod.port, pod.pod_host_id, tuple(keys))
        return None

    def _take_drop(self) -> int:
        """The drop fault for the session starting now (spent when it fires)."""
        with self._lock:
            return self.faults.drop_next_connection_after_bytes

    def _drop_spent(self) -> None:
        with self._lock:
            self.faults.drop_next_connection_after_bytes = 0

    # -- GraphQL ------------------------------------------------------------------------

    def _scope(self, key: str | None) -> tuple[bool, str | None]:
        """``(accepted, pod_id)``: the account's key (pod_id None), or a pod's own key."""
        if key == self.api_key:
            return True, None
        with self._lock:
            for pod in self.pods.values():
                if key and key == pod.pod_key:
                    return True, pod.pod_id
        return False, None

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        """Answer one GraphQL request: ``(status, content type, body)``."""
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
        if "graphql" in self.retired:
            entry["status"] = 410
            return _gone("RunPod's GraphQL API is retired; use REST v2 at /v2")
        accepted, scope = self._scope(key)
        if not accepted:
            entry["status"] = 401
            return 401, "application/json", b'{"error":"Unauthorized"}'
        entry["scope"] = "pod" if scope else "account"
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
                {
                    "errors": [
                        _with_code(_as_runpod_says(e.formatted), "GRAPHQL_VALIDATION_FAILED")
                        for e in errors
                    ]
                },
            )
        ops = _top_fields(document)
        entry["operation"] = ",".join(ops)
        if scope is not None and not set(ops) <= POD_SCOPED_OPS:
            entry["status"] = 401
            return 401, "application/json", b'{"error":"Unauthorized"}'
        with self._lock:
            fire_5xx = any(self.faults.take(self.faults.http_5xx, op) for op in ops)
            empty = any(self.faults.take(self.faults.empty_answers, op) for op in ops)
        if empty:
            entry["status"] = 200
            return _json(200, {})
        if fire_5xx:
            entry["status"] = 502
            return 502, "text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>"
        result = execute(SCHEMA, document, root_value=Root(self, scope))
        payload = result.formatted
        entry["status"] = 200
        if result.errors:
            entry["errors"] = [e["message"] for e in payload["errors"]]
        return _json(200, payload)

    def handle_v2(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        """Answer one REST v2 request (``runpod_v2``), logged and checked against the
        contract both ways."""
        from tests.emulators.runpod_v2 import route

        found = route(method, urlparse(path).path)
        entry: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(),
            "method": method,
            "path": urlparse(path).path,
            "operation": found[0] if found else "v2",
            "authorization": "Bearer ***" if headers.get("authorization") else None,
        }
        auth = headers.get("authorization", "")
        accepted, scope = self._scope(
            auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        )
        if accepted:
            entry["scope"] = "pod" if scope else "account"
        if entry["operation"] == "createPod":
            try:
                entry["body"] = json.loads(body or b"null")
            except ValueError:
                entry["body"] = None
        with self._lock:
            self.requests.append(entry)
        answer = self.v2.handle(method, path, headers, body)
        entry["status"] = answer.status
        self.check_answer(method, path, headers, answer)
        return answer

    def catalog(self, query: dict[str, str]) -> dict[str, Any]:
        """REST v2 ``/v2/catalog/gpus`` from the GPU catalogue, in the schema's shape: per
        GPU its prices per GPU-hour and ``maxCount`` per cloud and, with
        ``include=AVAILABILITY``, ``availability`` (a GPU's ``availability`` field,
        ``HIGH`` by default) overall, per data center and per CUDA version."""
        gpus = []
        for gpu_id, gpu in self.gpu_types.items():
            item: dict[str, Any] = {
                "id": gpu_id,
                "name": gpu.get("displayName", gpu_id),
                "pool": None,
                "manufacturer": "NVIDIA",
                "memory": int(gpu.get("memoryInGb") or 0),
                "secure": True,
                "community": True,
                "price": {"secure": gpu["securePrice"], "community": gpu["communityPrice"]},
                "maxCount": {"secure": 8, "community": 8},
            }
            if "AVAILABILITY" in query.get("include", "").upper().split(","):
                level = gpu.get("availability", "HIGH")
                item["availability"] = level
                item["dataCenters"] = [
                    {"id": "US-TX-3", "name": "US Texas 3", "availability": level}
                ]
                item["cudaVersions"] = [{"version": HOST_CUDA, "available": level != "NONE"}]
            gpus.append(item)
        return {"gpus": gpus}

    def _maybe_something_wrong(self, op: str) -> None:
        with self._lock:
            fire = self.faults.take(self.faults.something_wrong, op)
        if fire:
            raise GraphQLError(
                SOMETHING_WENT_WRONG_MESSAGE, extensions={"code": "INTERNAL_SERVER_ERROR"}
            )

    def pod_dict(self, pod: EmulatedPod) -> dict[str, Any]:
        """A pod as RunPod's ``Pod`` type answers it."""
        now = time.time()
        booted = now - pod.created >= self.faults.slow_boot_seconds
        booted = booted and pod.boot_failure != "image_pull"
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
        count = int(data.get("gpuCount") or 1)
        pod = self.spawn(
            name=data["name"],
            gpu_id=gpu_id,
            count=count,
            cloud=data.get("cloudType") or "SECURE",
            env=env,
            spec={
                "containerDiskInGb": data.get("containerDiskInGb"),
                "imageName": data.get("imageName"),
                "dockerArgs": data.get("dockerArgs") or "",
                "ports": data.get("ports"),
                "volumeInGb": float(data.get("volumeInGb") or 0),
            },
        )
        with self._lock:
            return self.pod_dict(pod)

    def spawn(
        self,
        *,
        name: str,
        gpu_id: str,
        count: int,
        cloud: str,
        env: dict[str, str],
        spec: dict[str, Any],
        v2: dict[str, Any] | None = None,
    ) -> EmulatedPod:
        """A real local pod behind a new emulated pod (either API's create), billed from
        now; its system log says it pulled the image and started (with
        ``faults.gpu_count``'s GPUs when that is set)."""
        count = self.faults.gpu_count or count
        public_key = env.get("PUBLIC_KEY") or (self.pub_key.splitlines() or [""])[0]
        public_key = public_key or generate_keypair().public_key
        pod_key = f"rpa_pod_{secrets.token_hex(16)}"
        inside = dict(env, RUNPOD_API_KEY=pod_key, RUNPOD_API_BASE_URL=self.tls_base_url)
        if self.faults.pod_faults:
            inside["PREFECT_RUNPOD_POD_FAULTS"] = self.faults.pod_faults
        handle = self.local.create(PodRequest(public_key=public_key, env=inside), name)
        handle = self.local.wait_ready(handle, timeout_seconds=180)
        paths = PodPaths.of(self.local.home, handle.pod_id)
        with open(paths.authorized_keys, "a") as fh:  # the gateway logs in with its own key
            fh.write(self.gateway.client_public_key + "\n")
        if self.faults.pod_ca_bundle:  # where `pip install --user certifi` would put it
            minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
            bundle = paths.home / ".local" / "lib" / minor / "site-packages" / "certifi"
            bundle.mkdir(parents=True, exist_ok=True)
            (bundle / "cacert.pem").write_bytes(self._ca.ca_pem)
        gpu = self.gpu_types[gpu_id]
        price = gpu["communityPrice"] if cloud == "COMMUNITY" else gpu["securePrice"]
        full_spec = {
            "gpuCount": count,
            "memoryInGb": 31.0 * count,
            "vcpuCount": 8.0 * count,
            "dockerArgs": "",
            "volumeInGb": 0.0,
            **spec,
        }
        assert handle.ssh is not None and handle.pod_host_id
        created = self.clock()
        pod = EmulatedPod(
            pod_id=handle.pod_id,
            name=name,
            pod_host_id=handle.pod_host_id,
            gpu_type_id=gpu_id,
            cost_per_hr=round(price * count, 4),
            spec=full_spec,
            env=env,
            created=created,
            port=handle.ssh.port,
            workdir=handle.workdir,
            pod_key=pod_key,
            v2=dict(v2 or {}),
            listed_at=time.time() + self.faults.list_delay_seconds,
        )
        image = full_spec.get("imageName") or "image"
        pod.boot_failure = self.faults.boot_failure
        for line in BOOT_LOG[pod.boot_failure].format(image=image).splitlines():
            self._log(pod, "system", line)
        with self._lock:
            self.pods[pod.pod_id] = pod
            self.ledger.open(pod.pod_id, gpu_id, pod.cost_per_hr, pod.created)
        return pod

    def hollow_pod(self, name: str, gpu_id: str = "NVIDIA GeForce RTX 3090") -> str:
        """A running pod with no local pod behind it (no SSH), billed from now: for tests
        of many pods that only list, read and terminate them. Returns its id."""
        from prefect_runpod.blocks.local_pod.registry import new_pod_host_id, new_pod_id

        pod_id = new_pod_id()
        gpu = self.gpu_types[gpu_id]
        pod = EmulatedPod(
            pod_id=pod_id,
            name=name,
            pod_host_id=new_pod_host_id(pod_id),
            gpu_type_id=gpu_id,
            cost_per_hr=gpu["securePrice"],
            spec={"gpuCount": 1, "imageName": "hollow", "containerDiskInGb": 20},
            env={},
            created=self.clock(),
            port=1,
            workdir="/workspace",
            hollow=True,
        )
        with self._lock:
            self.pods[pod_id] = pod
            self.ledger.open(pod_id, gpu_id, pod.cost_per_hr, pod.created)
        return pod_id

    def _log(self, pod: EmulatedPod, source: str, line: str) -> None:
        last = pod.logs[-1].id if pod.logs else None
        pod.logs.append(LogEvent(log_stamp(last), source, line))

    def write_log(self, pod_id: str, line: str, source: str = "container") -> None:
        """Add one line to a pod's log stream (for tests)."""
        with self._lock:
            self._log(self.pods[pod_id], source, line)

    def sync_container_log(self, pod: EmulatedPod) -> None:
        """Take the local pod's new stdout/stderr lines into its container log. Call with
        the lock held."""
        path = PodPaths.of(self.local.home, pod.pod_id).log
        try:
            with open(path, "rb") as fh:
                fh.seek(pod.log_offset)
                data = fh.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        pod.log_offset += len(complete)
        for raw in complete.splitlines():
            self._log(pod, "container", raw.decode(errors="replace"))

    def end_pod(self, pod_id: str, how: str) -> None:
        """End a pod now (its local pod too) and record how; billing stops."""
        with self._lock:
            if pod_id not in self.pods:
                return
            if self.pods[pod_id].hollow:
                self._end(pod_id, how, self.clock())
                return
            self._terminating.add(pod_id)
        try:
            self.local.terminate(pod_id)
        finally:
            with self._lock:
                self._terminating.discard(pod_id)
                if self.local.get(pod_id) is None:
                    self._end(pod_id, how, self.clock())

    def terminate(self, pod_id: str, scope: str | None = None) -> None:
        """``podTerminate``: ends the local pod, then the pod reads back as null."""
        self._maybe_something_wrong("podTerminate")
        with self._lock:
            self._reconcile()
            if self.faults.terminate_errors:
                raise GraphQLError(self.faults.terminate_errors.pop(0))
            if self.faults.terminate_fail_n > 0:
                self.faults.terminate_fail_n -= 1
                raise GraphQLError(
                    SOMETHING_WENT_WRONG_MESSAGE, extensions={"code": "INTERNAL_SERVER_ERROR"}
                )
            if scope is not None and scope != pod_id:
                raise GraphQLError("Unauthorized: a pod's key acts on its own pod only")
            if pod_id not in self.pods:
                raise GraphQLError(NOT_FOUND_TO_TERMINATE_MESSAGE)
            if self.faults.terminate_ignored:
                return None
        self.end_pod(pod_id, "podTerminate (pod key)" if scope else "podTerminate")
        return None


def _top_fields(document: Any) -> list[str]:
    return [
        sel.name.value
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
        for sel in d.selection_set.selections
        if hasattr(sel, "name")
    ]


_UNKNOWN_INPUT_FIELD = re.compile(
    r"Expected value of type '(\w+)' not to include unknown field '(\w+)'"
)


def _as_runpod_says(error: dict[str, Any]) -> dict[str, Any]:
    """graphql-core words an unknown input field its own way; RunPod's server (graphql-js)
    answers ``Field "allowedCudaVersions" is not defined by type "PodResumeInput".``"""
    match = _UNKNOWN_INPUT_FIELD.search(error.get("message", ""))
    if match is None:
        return error
    return {
        **error,
        "message": f'Field "{match.group(2)}" is not defined by type "{match.group(1)}".',
    }


def _with_code(error: dict[str, Any], code: str) -> dict[str, Any]:
    return {**error, "extensions": {"code": code}}


def _json(status: int, payload: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(payload).encode()


def _gone(detail: str) -> tuple[int, str, bytes]:
    answer = problem(410, "Gone", detail)
    return answer.status, answer.headers["Content-Type"], answer.body


def _handler_for(emu: RunPodEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and chunked SSE a cut can break

        def log_message(self, *args: object) -> None:  # quiet; the emulator keeps its own log
            pass

        def _reply(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _headers(self) -> dict[str, str]:
            return {k.lower(): v for k, v in self.headers.items()}

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _v2(self, method: str, body: bytes = b"") -> None:
            answer = emu.handle_v2(method, self.path, self._headers(), body)
            if answer.drop:  # the pod exists; its create's answer never arrives
                self.close_connection = True
                return
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if answer.stream is None:
                if answer.status != 204:
                    self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            # The stream's connection is closed after it (a cut can break it): say so, so a
            # client never sends its next request on a connection about to close.
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for chunk in answer.stream:
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (ConnectionError, OSError):
                pass  # cut on purpose, or the client went away: no closing chunk
            self.close_connection = True

        def _gone_v1(self) -> bool:
            if self.path.startswith("/v1/") and "v1" in emu.retired:
                with emu._lock:
                    emu.requests.append(
                        {
                            "time": datetime.now(UTC).isoformat(),
                            "path": urlparse(self.path).path,
                            "operation": "v1",
                            "status": 410,
                        }
                    )
                self._reply(*_gone("REST v1 was retired on 2026-11-15; use REST v2 at /v2"))
                return True
            return False

        def do_GET(self) -> None:
            if self._gone_v1():
                return
            if self.path.startswith("/v2/"):
                self._v2("GET")
            elif self.path.startswith("/admin/requests"):
                self._reply(200, "application/json", emu.log_text().encode())
            elif self.path.startswith("/admin/pods"):
                self._reply(*_json(200, {"pods": emu.live_pod_ids()}))
            else:
                self._reply(404, "text/plain", b"not found")

        def do_DELETE(self) -> None:
            if self.path.startswith("/v2/"):
                self._v2("DELETE", self._body())
            else:
                self._reply(404, "text/plain", b"not found")

        def do_PUT(self) -> None:
            if self.path.startswith("/v2/"):
                self._v2("PUT", self._body())
            else:
                self._reply(404, "text/plain", b"not found")

        def do_POST(self) -> None:
            body = self._body()
            if self._gone_v1():
                return
            if self.path.startswith("/v2/"):
                self._v2("POST", body)
            elif self.path.startswith("/admin/faults"):
                with emu._lock:
                    for name, value in json.loads(body or b"{}").items():
                        current = getattr(emu.faults, name)
                        setattr(emu.faults, name, set(value) if isinstance(current, set) else value)
                self._reply(*_json(200, {"ok": True}))
            elif self.path.startswith("/admin/vanish/"):
                emu.vanish(self.path.rsplit("/", 1)[1])
                self._reply(*_json(200, {"ok": True}))
            elif urlparse(self.path).path == "/graphql":
                self._reply(*emu.handle(self.path, self._headers(), body))
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
    parser.add_argument(
        "--retire",
        default="",
        help="comma-separated APIs answering 410 Gone: graphql, v1 (v1 always is)",
    )
    args = parser.parse_args()
    import tempfile

    retire = {name.strip() for name in args.retire.split(",") if name.strip()}
    unknown = retire - {"graphql", "v1"}
    if unknown:
        parser.error(f"--retire: unknown API {', '.join(sorted(unknown))} (graphql, v1)")
    home = Path(args.home or tempfile.mkdtemp(prefix="runpod-emulator-"))
    emu = RunPodEmulator(
        api_key=args.api_key, home=home, mode=args.mode, port=args.port, retire=retire
    )
    emu.start()
    print(
        f"RUNPOD_API_BASE_URL={emu.base_url}  gateway=127.0.0.1:{emu.gateway_port}  "
        f"retired={','.join(sorted(emu.retired))}",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print(f"stopped; terminated leftovers: {emu.stop()}")


if __name__ == "__main__":
    main()
