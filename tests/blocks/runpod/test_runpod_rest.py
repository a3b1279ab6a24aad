"""The REST v2 client (``runpod.rest.RestApi``) against the emulator's v2: the create
body as we build it, the rate budget and 429s on injected clocks, problem objects and
410s classified, the account's SSH keys never shrunk, the log stream resumed."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
import requests
from pydantic import SecretStr, ValidationError

from prefect_runpod.blocks.exceptions import AccountKeysError, RunPodAPIError, SpecError
from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.runpod.account_keys import ensure_account_key, fingerprint
from prefect_runpod.blocks.runpod.api import PodCreate
from prefect_runpod.blocks.runpod.errors import ErrorKind, FailoverAction, classify_exception
from prefect_runpod.blocks.runpod.ratelimit import RateBudget, parse_policy, parse_rate_limit
from prefect_runpod.blocks.runpod.rest import RestApi, resolve_base_url
from prefect_runpod.blocks.runpod.v2_models import CreatePodRequest, GpuRequest
from tests.emulators.runpod_api import RunPodEmulator

GPU = "NVIDIA GeForce RTX 4090"
BASE = {"name": "prft-x", "image": "img:1", "gpu_type_id": GPU, "gpu_count": 2}


class FakeClock:
    """Monotonic seconds that move only when something sleeps; threads sleeping at the
    same time wake together (the clock moves to the latest wake), as real time would."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self._lock = threading.Lock()
        self._read = threading.local()

    def __call__(self) -> float:
        self._read.at = self.now  # a sleep counts from this thread's last look
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            start = getattr(self._read, "at", self.now)
            self.now = max(self.now, start + seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def api(runpod_emulator: RunPodEmulator, clock: FakeClock) -> Iterator[RestApi]:
    """A v2 client of the emulator whose rate budget and the emulator's windows share
    one fake clock."""
    runpod_emulator.v2.rate_clock = clock
    client = RestApi(
        SecretStr(runpod_emulator.api_key),
        base_url=runpod_emulator.base_url,
        budget=RateBudget(clock=clock, sleep=clock.sleep),
    )
    yield client
    client.close()


class TestTheCreateBody:
    def test_a_body_without_gpu_count_cannot_be_built(self) -> None:
        """Issue 23's example: RunPod answers a create without ``gpu.count`` as if no
        machine were free (runpod-mcp PR #77), so such a body is impossible to send."""
        with pytest.raises(ValidationError, match="count"):
            GpuRequest(id=GPU)  # type: ignore[call-arg]
        with pytest.raises(ValidationError, match="count"):
            CreatePodRequest.model_validate(
                {"name": "p", "image": "i", "gpu": {"id": GPU}, "disk": 20}
            )
        with pytest.raises(ValidationError):
            PodCreate(name="p", image="i", gpu_type_id=GPU)  # type: ignore[call-arg]
        body = CreatePodRequest.from_create(PodCreate(**BASE)).body()
        assert body["gpu"] == {"id": GPU, "count": 2}

    def test_an_unknown_field_cannot_be_set(self) -> None:
        with pytest.raises(ValidationError, match="terminateAfter"):
            CreatePodRequest.model_validate(
                {"name": "p", "image": "i", "gpu": {"id": GPU, "count": 1}, "disk": 20,
                 "terminateAfter": "2026-12-01T00:00:00Z"}
            )  # fmt: skip

    def test_the_cuda_floor_is_min_cuda_version_and_a_set_is_allowed_versions(self) -> None:
        floor = CreatePodRequest.from_create(
            PodCreate(**BASE, cuda_versions=["12.6", "12.8", "13.0"], cuda_floor=True)
        ).body()
        assert floor["gpu"] == {"id": GPU, "count": 2, "minCudaVersion": "12.6"}
        exact = CreatePodRequest.from_create(
            PodCreate(**BASE, cuda_versions=["12.4", "12.8"], cuda_floor=False)
        ).body()
        assert exact["gpu"] == {"id": GPU, "count": 2, "allowedCudaVersions": ["12.4", "12.8"]}
        with pytest.raises(ValidationError, match="exclusive"):
            GpuRequest(id=GPU, count=1, minCudaVersion="12.1", allowedCudaVersions=["12.8"])

    def test_ssh_ports_env_cloud_and_data_centre(self) -> None:
        body = CreatePodRequest.from_create(
            PodCreate(
                **BASE,
                cloud="COMMUNITY",
                data_center_id="EU-RO-1",
                env={"A": "b"},
                ports=["8888/http"],
                volume_gb=20,
                volume_mount_path="/workspace",
            )
        ).body()
        assert body["startSsh"] is True and body["ports"] == ["8888/http", "22/tcp"]
        assert (body["env"], body["cloud"], body["dataCenterIds"]) == (
            {"A": "b"},
            "COMMUNITY",
            ["EU-RO-1"],
        )
        assert body["mounts"] == {"persistent": {"size": 20, "path": "/workspace"}}
        no_ip = CreatePodRequest.from_create(PodCreate(**BASE, public_ip=False, ports=[])).body()
        assert no_ip["ports"] == [] and "dataCenterIds" not in no_ip and "mounts" not in no_ip

    @pytest.mark.parametrize(
        ("fields", "match"),
        [({"cloud": "ALL"}, "one cloud"), ({"volume_gb": 5}, "at least 10 GB")],
    )
    def test_what_v2_cannot_express_is_refused_before_sending(self, fields, match) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(SpecError, match=match):
            CreatePodRequest.from_create(PodCreate(**{**BASE, **fields}))


class TestBaseUrl:
    def test_one_base_without_a_path(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("RUNPOD_API_BASE_URL", raising=False)
        monkeypatch.delenv("RUNPOD_REST_BASE_URL", raising=False)
        assert resolve_base_url() == "https://api.runpod.io"
        monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:8/")
        assert resolve_base_url() == "http://127.0.0.1:8"
        assert resolve_base_url("http://10.0.0.1:9") == "http://10.0.0.1:9"
        for bad in ("https://api.runpod.io/v2", "https://api.runpod.io/graphql"):
            with pytest.raises(SpecError, match="has a path"):
                resolve_base_url(bad)

    def test_the_old_rest_variable_only_warns(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("RUNPOD_API_BASE_URL", raising=False)
        monkeypatch.setenv("RUNPOD_REST_BASE_URL", "https://rest.runpod.io/v1")
        with pytest.warns(DeprecationWarning, match="RUNPOD_REST_BASE_URL is obsolete"):
            assert resolve_base_url() == "https://api.runpod.io"


class TestRateBudget:
    def test_the_headers_parse(self) -> None:
        value = '"minute";r=0;t=12, "hour";r=2800;t=1812, "day";r=49500;t=45012'
        assert parse_rate_limit(value) == {
            "minute": (0, 12.0),
            "hour": (2800, 1812.0),
            "day": (49500, 45012.0),
        }
        assert parse_policy('"minute";q=60;w=60')["minute"] == (60, 60.0)
        assert parse_rate_limit("not a structured field ;;") == {}

    def test_a_429_saying_t_12_waits_12_seconds_and_succeeds(
        self,
        runpod_emulator: RunPodEmulator,
        api: RestApi,
        clock: FakeClock,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Issue 23's example: another client spent the minute 48 s ago; RunPod answers
        ``RateLimit: "minute";r=0;t=12``; the client waits 12 s (injected clock) and the
        same call then succeeds."""
        runpod_emulator.v2.quota = {"minute": (1, 60.0)}
        runpod_emulator.v2._windows = {"minute": (clock.now - 48.0, 1)}
        with caplog.at_level(logging.WARNING, logger="prefect_runpod.runpod"):
            keys = api.get_account_keys()
        assert keys == [k for k in runpod_emulator.pub_key.splitlines() if k]
        assert clock.slept == [12.0] and runpod_emulator.v2.answered_429 == 1
        assert "429" in caplog.text and "waiting 12 s" in caplog.text

    def test_the_budget_spaces_requests_so_no_429_comes(
        self, runpod_emulator: RunPodEmulator, api: RestApi, clock: FakeClock
    ) -> None:
        runpod_emulator.v2.quota = {"minute": (10, 60.0)}
        for _ in range(25):
            api.get_account_keys()
        assert runpod_emulator.v2.answered_429 == 0
        assert clock.now - 1000.0 >= 120.0  # 25 requests at 10 a minute: two resets

    def test_two_clients_of_one_account_share_its_budget(
        self, runpod_emulator: RunPodEmulator, api: RestApi, clock: FakeClock
    ) -> None:
        """Two runs in one process, one account: their requests count against one
        budget (``budget_for``: one per base URL and key), so together they stay under
        the quota."""
        from prefect_runpod.blocks.runpod.ratelimit import budget_for

        runpod_emulator.v2.quota = {"minute": (8, 60.0)}
        key = SecretStr(runpod_emulator.api_key)
        shared = budget_for(runpod_emulator.base_url, runpod_emulator.api_key)
        shared.clock, shared.sleep = clock, clock.sleep
        runs = [RestApi(key, base_url=runpod_emulator.base_url) for _ in range(2)]
        assert runs[0].budget is runs[1].budget is shared
        for n in range(20):
            runs[n % 2].get_account_keys()
        assert runpod_emulator.v2.answered_429 == 0 and shared.waited_seconds >= 60
        for run in runs:
            run.close()


class TestProblems:
    def test_every_answer_carries_the_rate_headers(self, runpod_emulator: RunPodEmulator) -> None:
        answer = requests.get(
            f"{runpod_emulator.base_url}/v2/pods",
            headers={"Authorization": f"Bearer {runpod_emulator.api_key}"},
            timeout=30,
        )
        assert answer.json() == {"pods": []}
        assert parse_rate_limit(answer.headers["RateLimit"])["minute"][0] > 0
        assert "minute" in parse_policy(answer.headers["RateLimit-Policy"])

    @pytest.mark.parametrize(
        ("status", "detail", "kind", "action"),
        [
            (401, "missing bearer token", ErrorKind.AUTH, FailoverAction.STOP),
            (403, "access denied", ErrorKind.AUTH, FailoverAction.STOP),
            (404, "pod not found", ErrorKind.NOT_FOUND, FailoverAction.GONE),
            (409, "pod belongs to a cluster", ErrorKind.STATE_CONFLICT, FailoverAction.STOP),
            (
                400,
                "There are no longer any instances available with the requested "
                "specifications. Please refresh and try again.",
                ErrorKind.CAPACITY,
                FailoverAction.NEXT_OPTION,
            ),
            (400, "minCudaVersion and allowedCudaVersions", ErrorKind.INVALID_REQUEST, FailoverAction.STOP),
            (422, "Request validation failed.", ErrorKind.INVALID_REQUEST, FailoverAction.STOP),
            (429, "rate limit exceeded", ErrorKind.RATE_LIMITED, FailoverAction.RETRY),
            (502, "upstream unavailable", ErrorKind.TRANSIENT, FailoverAction.RETRY),
            (402, "insufficient balance", ErrorKind.NO_BALANCE, FailoverAction.STOP),
        ],
    )  # fmt: skip
    def test_each_status_is_one_decision(self, status, detail, kind, action) -> None:  # type: ignore[no-untyped-def]
        exc = RunPodAPIError("x", status=status, detail=detail, errors=["$: e"])
        classified = classify_exception(exc)
        assert (classified.kind, classified.action) == (kind, action)
        assert detail in classified.message and "$: e" in classified.message

    def test_an_unknown_field_is_refused_by_name(self, runpod_emulator: RunPodEmulator) -> None:
        answer = requests.post(
            f"{runpod_emulator.base_url}/v2/pods",
            json={"name": "p", "image": "i", "gpu": {"id": GPU, "count": 1}, "bogus": 1},
            headers={"Authorization": f"Bearer {runpod_emulator.api_key}"},
            timeout=30,
        )
        assert answer.status_code == 422
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.json()["errors"] == ["$: additional properties 'bogus' not allowed"]
        assert runpod_emulator.take_violations()  # the request broke the contract
        assert runpod_emulator.pods == {}

    @pytest.mark.parametrize(
        "gpu", [{"id": GPU}, {"id": "NVIDIA RTX 4090", "count": 1}], ids=["no-count", "inexact-id"]
    )
    def test_a_create_without_count_or_with_an_inexact_id_is_answered_no_capacity(
        self, runpod_emulator: RunPodEmulator, gpu: dict
    ) -> None:
        answer = requests.post(
            f"{runpod_emulator.base_url}/v2/pods",
            json={"name": "p", "image": "i", "gpu": gpu},
            headers={"Authorization": f"Bearer {runpod_emulator.api_key}"},
            timeout=30,
        )
        assert answer.status_code == 400
        assert answer.json()["detail"].startswith("There are no longer any instances available")
        assert runpod_emulator.pods == {}

    def test_retired_apis_answer_410_and_the_message_names_the_setting(self, tmp_path) -> None:  # type: ignore[no-untyped-def]
        emu = RunPodEmulator(api_key="k", home=tmp_path / "pods", retire={"graphql"}).start()
        try:
            auth = {"Authorization": "Bearer k"}
            v1 = requests.get(f"{emu.base_url}/v1/pods", headers=auth, timeout=30)
            graphql = requests.post(
                f"{emu.base_url}/graphql",
                json={"query": "{ myself { id } }"},
                headers=auth,
                timeout=30,
            )
            assert (v1.status_code, graphql.status_code) == (410, 410)
            for path, body in (("GET /v1/pods", v1.json()), ("POST /graphql", graphql.json())):
                exc = RunPodAPIError("x", status=410, detail=body["detail"], operation=path)
                classified = classify_exception(exc)
                assert classified.kind is ErrorKind.RETIRED
                assert "api='v2'" in classified.message
            assert (
                "REST v1"
                in classify_exception(
                    RunPodAPIError("x", status=410, operation="GET /v1/pods")
                ).message
            )
        finally:
            emu.stop()


class TestAccountKeys:
    @staticmethod
    def _three(emu: RunPodEmulator) -> list[str]:
        keys = [generate_keypair(f"someone-{n}").public_key for n in range(3)]
        emu.pub_key = "\n".join(keys)
        return keys

    def test_three_keys_kept_and_ours_added_once(
        self, runpod_emulator: RunPodEmulator, api: RestApi
    ) -> None:
        theirs = self._three(runpod_emulator)
        ours = generate_keypair("ours").public_key
        assert ensure_account_key(api, ours, add=True, where="ssh.runpod.io") is True
        assert api.get_account_keys() == [*theirs, ours]
        assert ensure_account_key(api, ours, add=True, where="ssh.runpod.io") is False
        assert runpod_emulator.key_writes == [[*theirs, ours]]  # one write, a superset

    def test_missing_and_not_allowed_writes_nothing(
        self, runpod_emulator: RunPodEmulator, api: RestApi
    ) -> None:
        self._three(runpod_emulator)
        with pytest.raises(SpecError, match="add_to_account"):
            ensure_account_key(api, generate_keypair().public_key, add=False, where="gw")
        assert runpod_emulator.key_writes == []

    @pytest.mark.parametrize("shrunk", [[], "one"], ids=["empty", "drops-two"])
    def test_a_shrinking_write_is_refused_unsent(
        self, runpod_emulator: RunPodEmulator, api: RestApi, shrunk
    ) -> None:  # type: ignore[no-untyped-def]
        theirs = self._three(runpod_emulator)
        keys = theirs[:1] if shrunk == "one" else []
        with pytest.raises(AccountKeysError) as info:
            api.put_account_keys(keys, replacing=theirs)
        assert runpod_emulator.key_writes == [] and api.get_account_keys() == theirs
        if keys:
            assert info.value.missing == [fingerprint(k) for k in theirs[1:]]

    def test_two_adders_at_the_same_moment_lose_no_key(
        self, runpod_emulator: RunPodEmulator, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Both read the same three keys, then both writes land before either reads back
        (the emulator's barrier, by count): the later write drops the earlier adder's key;
        that adder sees it gone, restores the union once and warns with its fingerprint."""
        theirs = self._three(runpod_emulator)
        runpod_emulator.faults.ssh_keys_barrier = 2
        adders = [generate_keypair(f"adder-{n}").public_key for n in range(2)]
        clients = [
            RestApi(SecretStr(runpod_emulator.api_key), base_url=runpod_emulator.base_url)
            for _ in adders
        ]
        errors: list[BaseException] = []

        def add(client: RestApi, key: str) -> None:
            try:
                ensure_account_key(client, key, add=True, where="gw")
            except BaseException as exc:  # reported below
                errors.append(exc)

        with caplog.at_level(logging.WARNING, logger="prefect_runpod.runpod"):
            threads = [
                threading.Thread(target=add, args=pair)
                for pair in zip(clients, adders, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert errors == []
        final = runpod_emulator.pub_key.splitlines()
        assert sorted(final) == sorted([*theirs, *adders])
        writes = runpod_emulator.key_writes
        assert all(set(theirs) <= set(write) for write in writes)  # the three never left
        assert len(writes) == 3  # two adds and one restore
        dropped = next(k for k in adders if k not in writes[1])
        assert "restoring them once" in caplog.text and fingerprint(dropped) in caplog.text
        for client in clients:
            client.close()


@pytest.mark.slow
class TestLogs:
    def test_both_sources_and_a_cut_stream_resumed_from_the_last_event(
        self, runpod_emulator: RunPodEmulator, api: RestApi
    ) -> None:
        created = api.create_pod(
            PodCreate(
                name=f"prft-{uuid.uuid4()}", image="img:1", gpu_type_id=GPU, gpu_count=1,
                env={"PUBLIC_KEY": generate_keypair().public_key},
            )
        )  # fmt: skip
        try:
            for n in range(4):
                runpod_emulator.write_log(created.id, f"step {n}")
            runpod_emulator.v2.log_idle_close_seconds = 0.2
            whole = list(api.pod_logs(created.id, idle_seconds=10))
            assert {line.source for line in whole} == {"system", "container"}
            assert [x.line for x in whole if x.source == "system"][0] == "Pulling image img:1"
            system = list(api.pod_logs(created.id, source="system", idle_seconds=10))
            assert {line.source for line in system} == {"system"}
            runpod_emulator.faults.log_cut_after_events = 2
            resumed = list(api.pod_logs(created.id, idle_seconds=10))
            ids = [x.id for x in resumed]
            assert ids[: len(whole)] == [x.id for x in whole] and len(set(ids)) == len(ids)
            after = list(api.pod_logs(created.id, last_event_id=whole[2].id, idle_seconds=10))
            assert [x.id for x in after][: len(whole) - 3] == [x.id for x in whole[3:]]
            logs = [r for r in runpod_emulator.requests if r["operation"] == "getPodLogs"]
            assert len(logs) == 5  # the cut stream was asked again once
        finally:
            api.terminate_pod(created.id)
            assert api.get_pod(created.id) is None


class TestStaleConnections:
    """A pooled connection the server closed after its last answer (a log stream's, say)
    fails the next request before any answer (``RemoteProtocolError``): a GET or DELETE
    is asked once more on a fresh connection; a POST never is (it may have been done)."""

    @staticmethod
    def _api(answers: list[object]) -> tuple[RestApi, list[str]]:
        import httpx

        seen: list[str] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(f"{request.method} {request.url.path}")
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[return-value]

        key = SecretStr(f"rpa_{uuid.uuid4().hex}")
        return RestApi(
            key, base_url="http://runpod.test", transport=httpx.MockTransport(handler)
        ), seen

    def test_an_idempotent_call_is_asked_once_more(self) -> None:
        import httpx

        closed = httpx.RemoteProtocolError("Server disconnected without sending a response.")
        api, seen = self._api([closed, httpx.Response(200, json={"pods": []})])
        assert api.list_pods() == []
        assert seen == ["GET /v2/pods", "GET /v2/pods"]

    def test_a_create_is_never_sent_twice(self) -> None:
        import httpx

        closed = httpx.RemoteProtocolError("Server disconnected without sending a response.")
        api, seen = self._api([closed])
        with pytest.raises(httpx.RemoteProtocolError):
            api.create_pod(PodCreate(**BASE))
        assert seen == ["POST /v2/pods"]
        assert classify_exception(closed).action is FailoverAction.RESOLVE  # read, never re-create
