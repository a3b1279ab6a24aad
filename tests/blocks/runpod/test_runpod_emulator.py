"""The RunPod emulator, driven by the real ``runpod`` SDK: RunPod's shapes, errors,
auth, validation, faults and the redacted request log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import requests
import runpod
from runpod.error import AuthenticationError, QueryError

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.runpod.errors import (
    CAPACITY_MESSAGE,
    NOT_FOUND_TO_TERMINATE_MESSAGE,
    UNKNOWN_GPU_MESSAGE,
)
from tests.emulators.runpod_api import RunPodEmulator

GPU = "NVIDIA GeForce RTX 3090"


@pytest.fixture
def runpod_api() -> str:
    """This module drives the emulator's GraphQL through the ``runpod`` SDK: the API the
    fallback speaks, kept served here (the package default, v2, retires it)."""
    return "graphql"


@pytest.fixture
def sdk(runpod_emulator: RunPodEmulator) -> Iterator[RunPodEmulator]:
    """The SDK's global key set to the emulator's (and restored)."""
    saved = runpod.api_key
    runpod.api_key = runpod_emulator.api_key
    try:
        yield runpod_emulator
    finally:
        runpod.api_key = saved


def _post(emu: RunPodEmulator, query: str, **kwargs) -> requests.Response:
    headers = kwargs.pop("headers", {"Authorization": f"Bearer {emu.api_key}"})
    return requests.post(
        f"{emu.base_url}/graphql", json={"query": query}, headers=headers, timeout=120, **kwargs
    )


class TestGpuTypes:
    def test_list_and_one(self, sdk: RunPodEmulator) -> None:
        ids = {g["id"] for g in runpod.get_gpus()}
        assert GPU in ids
        gpu = runpod.get_gpu(GPU)
        assert gpu["securePrice"] == 0.22
        assert gpu["lowestPrice"]["uninterruptablePrice"] == 0.22

    def test_unknown_id_is_an_empty_list_and_the_sdk_value_error(self, sdk: RunPodEmulator) -> None:
        body = _post(sdk, 'query { gpuTypes(input: {id: "NVIDIA H9000"}) { id } }').json()
        assert body == {"data": {"gpuTypes": []}}
        with pytest.raises(ValueError, match=re.escape(UNKNOWN_GPU_MESSAGE)):
            runpod.get_gpu("NVIDIA H9000")


@pytest.mark.slow
class TestPodLifecycle:
    def test_create_get_list_terminate_shapes(self, sdk: RunPodEmulator) -> None:
        sdk.faults.slow_boot_seconds = 10**6  # booting until the test says otherwise
        key = generate_keypair().public_key
        created = runpod.create_pod("prft-shapes", "img:1", GPU, env={"PUBLIC_KEY": key, "A": "b"})
        assert set(created) == {"id", "imageName", "env", "machineId", "machine"}
        pod_id = created["id"]
        assert re.fullmatch(rf"{re.escape(pod_id)}-[0-9a-f]{{8}}", created["machine"]["podHostId"])
        assert "A=b" in created["env"]
        pod = runpod.get_pod(pod_id)
        assert pod["desiredStatus"] == "RUNNING" and pod["runtime"] is None  # still booting
        assert pod["costPerHr"] == 0.22 and pod["name"] == "prft-shapes"
        sdk.faults.slow_boot_seconds = 0  # booted
        deadline = time.monotonic() + 120
        while runpod.get_pod(pod_id)["runtime"] is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        ports = runpod.get_pod(pod_id)["runtime"]["ports"]
        assert ports[0]["privatePort"] == 22 and ports[0]["type"] == "tcp"
        assert [p["id"] for p in runpod.get_pods()] == [pod_id]
        assert runpod.terminate_pod(pod_id) is None  # podTerminate is a scalar
        assert runpod.get_pod(pod_id) is None
        assert runpod.get_pods() == []
        assert sdk.local.list("") == []  # the backing local pod is gone too
        with pytest.raises(QueryError, match=NOT_FOUND_TO_TERMINATE_MESSAGE):
            runpod.terminate_pod(pod_id)

    def test_pod_host_id_query_and_vanish(self, sdk: RunPodEmulator) -> None:
        created = runpod.create_pod("prft-vanish", "img:1", GPU)
        body = _post(
            sdk,
            f'query {{ pod(input: {{podId: "{created["id"]}"}}) '
            "{ id machine { podHostId } } }",
        ).json()
        assert body["data"]["pod"]["machine"]["podHostId"] == created["machine"]["podHostId"]
        sdk.vanish(created["id"])
        assert runpod.get_pod(created["id"]) is None


class TestErrors:
    def test_bad_bearer_key_is_401(self, sdk: RunPodEmulator) -> None:
        with pytest.raises(AuthenticationError, match="check your API key"):
            runpod.get_gpus(api_key="rpa_wrong")
        assert _post(sdk, "query { myself { id } }", headers={}).status_code == 401

    def test_api_key_in_the_url_is_accepted_and_redacted(self, sdk: RunPodEmulator) -> None:
        answer = requests.post(
            f"{sdk.base_url}/graphql?api_key={sdk.api_key}",
            json={"query": "query { myself { id } }"},
            timeout=120,
        )
        assert answer.json()["data"]["myself"]["id"]
        assert sdk.api_key not in sdk.log_text()
        assert "api_key=***" in sdk.log_text()

    def test_log_never_holds_the_key(self, sdk: RunPodEmulator) -> None:
        runpod.get_gpus()
        assert sdk.requests and sdk.requests[-1]["authorization"] == "Bearer ***"
        assert sdk.api_key not in sdk.log_text()

    @pytest.mark.parametrize(
        ("query", "match"),
        [
            ("query { myself { id creditBalance } }", "Cannot query field 'creditBalance'"),
            ("query { myself { id ", "Syntax Error"),
            (
                'mutation { podResume(input: {podId: "x", gpuCount: 1, allowedCudaVersions: '
                '["12.8"]}) { id } }',
                "allowedCudaVersions",
            ),
        ],
    )
    def test_invalid_documents_are_graphql_errors(
        self, sdk: RunPodEmulator, query: str, match: str
    ) -> None:
        answer = _post(sdk, query)
        assert answer.status_code == 400
        assert match in answer.json()["errors"][0]["message"]
        with pytest.raises(QueryError):
            runpod.api.graphql.run_graphql_query(query)

    def test_error_shape_is_http_200_with_null_data(self, sdk: RunPodEmulator) -> None:
        sdk.faults.capacity_first_n = 1
        answer = _post(
            sdk,
            f'mutation {{ podFindAndDeployOnDemand(input: {{name: "x", '
            f'gpuTypeId: "{GPU}", cloudType: SECURE}}) {{ id }} }}',
        )
        assert answer.status_code == 200
        body = answer.json()
        assert body["data"] == {"podFindAndDeployOnDemand": None}
        assert body["errors"][0]["message"] == CAPACITY_MESSAGE
        assert body["errors"][0]["path"] == ["podFindAndDeployOnDemand"]
        assert sdk.pods == {}

    def test_faults_over_the_admin_endpoint(self, sdk: RunPodEmulator) -> None:
        requests.post(
            f"{sdk.base_url}/admin/faults",
            json={"http_5xx": {"gpuTypes": 1}, "something_wrong": {"myself": 1}},
            timeout=120,
        ).raise_for_status()
        with pytest.raises(requests.exceptions.JSONDecodeError):
            runpod.get_gpus()
        assert runpod.get_gpus()  # consumed
        with pytest.raises(QueryError, match="Something went wrong"):
            runpod.get_user()
        assert runpod.get_user()["id"]
        log = requests.get(f"{sdk.base_url}/admin/requests", timeout=120).json()
        assert [e["status"] for e in log] == [502, 200, 200, 200]


@pytest.mark.slow
def test_standalone_module(tmp_path, monkeypatch) -> None:
    """``python -m tests.emulators.runpod_api --port P``, driven by the real SDK, creates,
    lists and terminates RunPod-shaped pods (ids ``[a-z0-9]``, no hyphen; podHostId
    ``<id>-<8 hex>``), bills them over REST v2, and answers REST v1 410 Gone."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.emulators.runpod_api",
            "--port",
            "0",
            "--api-key",
            "k",
            "--home",
            str(tmp_path / "pods"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    saved = runpod.api_key
    try:
        assert proc.stdout is not None
        fields = dict(item.split("=", 1) for item in proc.stdout.readline().split())
        monkeypatch.setenv("RUNPOD_API_BASE_URL", fields["RUNPOD_API_BASE_URL"])
        runpod.api_key = "k"
        assert GPU in {g["id"] for g in runpod.get_gpus()}
        created = [runpod.create_pod(f"prft-standalone-{n}", "img:1", GPU) for n in range(2)]
        ids = [c["id"] for c in created]
        for c in created:
            assert re.fullmatch(r"[a-z0-9]{14}", c["id"]), c["id"]
            assert re.fullmatch(rf"{c['id']}-[0-9a-f]{{8}}", c["machine"]["podHostId"])
        assert sorted(p["id"] for p in runpod.get_pods()) == sorted(ids)
        for pod_id in ids:
            assert runpod.terminate_pod(pod_id) is None
        assert runpod.get_pods() == []
        base, auth = fields["RUNPOD_API_BASE_URL"], {"Authorization": "Bearer k"}
        bills = requests.get(
            f"{base}/v2/billing/pods",
            params={"lastN": 2, "bucketSize": "day"},
            headers=auth,
            timeout=120,  # a hang guard, sized for a busy machine
        ).json()
        assert sorted(b["podId"] for b in bills["records"]) == sorted(ids)
        assert all(b["totalAmount"] > 0 for b in bills["records"])
        gone = requests.get(f"{base}/v1/billing/pods", headers=auth, timeout=120)
        assert gone.status_code == 410 and "retired" in gone.json()["detail"]
    finally:
        runpod.api_key = saved
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_stop_and_resume_shapes(sdk: RunPodEmulator) -> None:
    """``podStop`` → EXITED; ``podResume`` on a host that gave its GPUs away answers
    RunPod's exact text (runpod/runpod-python#168)."""
    from prefect_runpod.blocks.runpod.errors import HOST_GPUS_BUSY_MESSAGE

    pod_id = runpod.create_pod("prft-stop", "img:1", GPU)["id"]
    try:
        assert runpod.stop_pod(pod_id) == {"id": pod_id, "desiredStatus": "EXITED"}
        sdk.faults.resume_gpus_busy = True
        with pytest.raises(QueryError, match=re.escape(HOST_GPUS_BUSY_MESSAGE)):
            runpod.resume_pod(pod_id, 1)
        sdk.faults.resume_gpus_busy = False
        assert runpod.resume_pod(pod_id, 1)["desiredStatus"] == "RUNNING"
    finally:
        runpod.terminate_pod(pod_id)
