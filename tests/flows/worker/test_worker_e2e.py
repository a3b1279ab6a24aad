"""The ``runpod`` worker end to end: the real ``prefect worker start`` process, the pool
made by ``prefect work-pool create --type runpod``, examples/any-flow deployed with its
code local, run on the local pod against the Prefect test server."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "any-flow"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}

pytestmark = pytest.mark.slow

API_KEY = "pnb_" + secrets.token_hex(16)
"""The worker's Prefect API key (the test server ignores it): handed to each pod hidden,
it must show up in no file, command line, job variable or log."""


def _env() -> dict[str, str]:
    from prefect.settings import get_current_settings

    env = os.environ.copy()
    env["PREFECT_API_URL"] = str(get_current_settings().api.url)
    return env


def _prefect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def runpod_pool(prefect_server: None) -> str:
    """A pool made the way a user makes one."""
    done = _prefect("work-pool", "create", "any-flow-pool", "--type", "runpod")
    assert done.returncode == 0, done.stdout + done.stderr
    return "any-flow-pool"


@pytest.fixture(scope="module")
def worker(runpod_pool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``prefect worker start --pool any-flow-pool --type runpod``, stopped at the end;
    yields its log file."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", runpod_pool,
             "--type", "runpod", "--prefetch-seconds", "5"],
            env=_env() | {"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_LOGGING_LEVEL": "INFO",
                          "PREFECT_API_KEY": API_KEY},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _deploy(pool: str, **job_variables: Any) -> str:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from deploy import deploy  # examples/any-flow/deploy.py
    finally:
        sys.path.remove(str(EXAMPLE))
    return deploy(pool, **job_variables)


def _run(deployment_id: str, **parameters: Any) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
    return str(run.id)


def _wait(flow_run_id: str, states: set[str], log: Path, deadline_s: float = 240.0) -> Any:
    from prefect.client.orchestration import get_client

    end = time.monotonic() + deadline_s
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            if run.state is not None and run.state.type.value in states:
                return run
            if time.monotonic() > end:
                pytest.fail(
                    f"run {flow_run_id} is {run.state}; worker log:\n{log.read_text()[-4000:]}"
                )
            time.sleep(0.5)


def _logs(flow_run_id: str) -> list[str]:
    """Every log message the server holds for the flow run, oldest first (read a page of
    200 at a time). A process ships its log lines in batches, so a line logged just now
    may not be here yet: wait for it with ``_wait_for_log``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    found: list[str] = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),  # type: ignore[list-item]
                limit=200,
                offset=len(found),
            )
            found += [entry.message for entry in page]
            if len(page) < 200:
                return found


def test_any_flow_completes_on_its_own_pod(worker: Path, runpod_pool: str) -> None:
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.flows.run.cost_record import latest_record

    deployment_id = _deploy(runpod_pool)
    flow_run_id = _run(deployment_id, seed="pod", rounds=10)
    run = _wait(flow_run_id, FINAL, worker)
    assert run.state.type.value == "COMPLETED", (run.state, worker.read_text()[-4000:])
    pod_id = run.infrastructure_pid
    assert pod_id, "the pod id is the run's infrastructure id"
    digest_line = _wait_for_log(flow_run_id, "digest ")
    assert "/prefect-runpod/" + flow_run_id + "/code/result.txt" in digest_line[0]
    record = _wait_for_record(flow_run_id)  # written once the pod's end is confirmed
    provider = LocalPodProvider()
    assert provider.get(pod_id) is None and provider.status(pod_id).gone
    assert record.pod_id == pod_id and record.end is not None and record.end.confirmed
    assert record.recorded_by == "worker"
    assert latest_record(flow_run_id) is not None


def _wait_for_log(flow_run_id: str, start: str) -> list[str]:
    """The flow run's log messages that start with ``start``, once the server holds at
    least one (each process ships its lines in batches; at most 60 s)."""
    end = time.monotonic() + 60
    while True:
        messages = _logs(flow_run_id)
        found = [m for m in messages if m.startswith(start)]
        if found:
            return found
        if time.monotonic() > end:
            pytest.fail(f"no log line of the flow run starts with {start!r}: {messages}")
        time.sleep(0.5)


def _wait_for_record(flow_run_id: str) -> Any:
    from prefect_runpod.flows.run.cost_record import latest_record

    end = time.monotonic() + 60
    while True:
        record = latest_record(flow_run_id)
        if record is not None and record.end is not None and record.end.confirmed:
            return record
        if time.monotonic() > end:
            pytest.fail(f"no confirmed cost record for {flow_run_id}: {record}")
        time.sleep(0.5)


def test_a_runpod_pod_is_refused_a_loopback_api_before_renting(
    worker: Path, runpod_pool: str
) -> None:
    from prefect.settings import get_current_settings

    deployment_id = _deploy(runpod_pool, name="refused", provider="runpod")
    flow_run_id = _run(deployment_id)
    run = _wait(flow_run_id, FINAL, worker)
    url = get_current_settings().api.url
    assert run.state.type.value == "CRASHED"
    assert run.state.message == (
        f"the Prefect API {url} is loopback, which a RunPod pod cannot reach: set the job "
        "variable prefect_api_url_for_pod to an address the pod can reach, or run the worker "
        "against Prefect Cloud"
    )
    assert not run.infrastructure_pid  # nothing was rented


def test_a_cancelled_run_has_its_pod_ended_and_is_cancelled(
    worker: Path, runpod_pool: str, runpod_home: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from tests.fixtures.leaks import files_holding, proc_cmdlines

    deployment_id = _deploy(runpod_pool)
    flow_run_id = _run(deployment_id, rounds=10, linger_seconds=600)
    _wait_for_log(flow_run_id, "digest ")  # the flow runs on its pod
    with get_client(sync_client=True) as client:
        running = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
        pod_id = running.infrastructure_pid
        assert pod_id and LocalPodProvider().get(pod_id) is not None
        # While the flow runs on its pod, the key it reports with is nowhere to be read.
        assert files_holding(API_KEY.encode(), runpod_home, worker.parent) == []
        assert API_KEY not in proc_cmdlines()
        assert API_KEY not in f"{running.job_variables} {running.parameters}"
        assert not [m for m in _logs(flow_run_id) if API_KEY in m]
        client.set_flow_run_state(flow_run_id, Cancelling())  # type: ignore[arg-type]
    run = _wait(flow_run_id, {"CANCELLED", "COMPLETED", "FAILED"}, worker, deadline_s=120)
    assert run.state.type.value == "CANCELLED", run.state
    record = _wait_for_record(flow_run_id)
    assert record.pod_id == pod_id and record.end.confirmed
    assert LocalPodProvider().status(pod_id).gone


def test_the_return_value_is_read_back_from_remote_result_storage(
    worker: Path, runpod_pool: str, moto_s3: dict[str, str]
) -> None:
    """The pool persists results to an S3 bucket (moto): the flow's return value, made on
    the pod, is read back by the client from the bucket."""
    from prefect.client.orchestration import get_client

    from tests.fixtures.transfer import moto_target

    target = moto_target(moto_s3, bucket_prefix="results")
    target.save("any-flow-results", overwrite=True)
    env = {
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": "runpod-s3-target/any-flow-results",
    }
    deployment_id = _deploy(runpod_pool, name="results-in-s3", env=env)
    flow_run_id = _run(deployment_id, seed="s3", rounds=3)
    run = _wait(flow_run_id, FINAL, worker)
    assert run.state.type.value == "COMPLETED", run.state
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
    value = state.result()
    assert value["digest"] == _digest("s3", 3)
    assert value["file"].endswith(f"/prefect-runpod/{flow_run_id}/code/result.txt")
    keys = target.get_client().list_objects_v2(Bucket=target.bucket).get("Contents", [])
    assert keys, "the result is an object in the bucket"


def _digest(seed: str, rounds: int) -> str:
    import hashlib

    value = seed.encode()
    for _ in range(rounds):
        value = hashlib.sha256(value).digest()
    return value.hex()


def test_a_process_that_dies_without_a_final_state_is_crashed_with_why(
    worker: Path, runpod_pool: str
) -> None:
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    command = "echo the job could not start >&2; exit 3"
    deployment_id = _deploy(runpod_pool, name="dies", command=command)
    flow_run_id = _run(deployment_id)
    run = _wait(flow_run_id, FINAL, worker)
    assert run.state.type.value == "CRASHED"
    assert run.state.message == (
        f"the flow process on pod {run.infrastructure_pid} exited with code 3 without a final "
        "state: the job could not start"
    )
    _wait_for_record(flow_run_id)
    assert LocalPodProvider().status(run.infrastructure_pid).gone


def test_the_runtime_cap_stops_the_flow_and_ends_its_pod(worker: Path, runpod_pool: str) -> None:
    from prefect.client.orchestration import get_client

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    deployment_id = _deploy(runpod_pool, name="capped", max_runtime_seconds=2)
    flow_run_id = _run(deployment_id, rounds=1, linger_seconds=600)
    cap = (
        "the flow run passed max_runtime_seconds=2 on its pod; the worker stopped it and "
        "ended the pod"
    )
    end = time.monotonic() + 240
    with get_client(sync_client=True) as client:
        while True:  # the stopped engine may say Crashed first; the worker's word is last
            run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
            if run.state is not None and run.state.message == cap:
                break
            if run.state is not None and run.state.type.value in {"COMPLETED", "CANCELLED"}:
                pytest.fail(f"the capped run ended {run.state}")
            if time.monotonic() > end:
                pytest.fail(
                    f"run {flow_run_id} is {run.state}; worker log:\n{worker.read_text()[-3000:]}"
                )
            time.sleep(0.5)
    assert run.state.type.value == "CRASHED"
    assert LocalPodProvider().status(run.infrastructure_pid).gone


def test_a_requirement_that_does_not_parse_is_refused_before_renting(
    worker: Path, runpod_pool: str
) -> None:
    deployment_id = _deploy(runpod_pool, name="bad-requirement", requirements=["tiny pkg >= 1"])
    flow_run_id = _run(deployment_id)
    run = _wait(flow_run_id, FINAL, worker)
    assert run.state.type.value == "CRASHED"
    assert run.state.message.startswith(
        "job variable requirements: requirement 'tiny pkg >= 1' is not a pip requirement "
        "specifier ("
    ), run.state.message
    assert run.state.message.endswith("; no pod was rented")
    assert not run.infrastructure_pid  # nothing was rented


NEEDS_PACKAGES = """
from prefect import flow, get_run_logger


@flow(name="needs-packages")
def needs_packages() -> str:
    import prft_tiny_job
    import prft_tiny_pull

    said = f"packages {prft_tiny_job.VALUE} {prft_tiny_pull.VALUE}"
    get_run_logger().info(said)
    return said
"""


def test_requirements_are_installed_on_the_pod_before_the_flow_starts(
    worker: Path, runpod_pool: str, tmp_path: Path
) -> None:
    """The ``requirements`` job variable and the deployment's ``pip_install_requirements``
    pull step (its file in the uploaded folder) are installed into the flow's Python on
    the pod: two tiny local wheels that exist nowhere else, which the flow imports."""
    from prefect.client.orchestration import get_client

    from prefect_runpod.blocks.local_pod.tiny_wheels import build_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    specs = {}
    for name in ("prft_tiny_job", "prft_tiny_pull"):
        file_name, data = build_wheel(name, "0.1", {f"{name}/__init__.py": f"VALUE = {name!r}\n"})
        (wheels / file_name).write_bytes(data)
        specs[name] = f"{name} @ {(wheels / file_name).as_uri()}"
    code = tmp_path / "code"
    code.mkdir()
    (code / "needs.py").write_text(NEEDS_PACKAGES)
    (code / "requirements.txt").write_text(specs["prft_tiny_pull"] + "\n")
    steps = [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(code)}},
        {"prefect.deployments.steps.pip_install_requirements": {"directory": str(code)}},
    ]
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(
            flow_id=client.create_flow_from_name("needs-packages"),
            name="needs-packages",
            entrypoint="needs.py:needs_packages",
            work_pool_name=runpod_pool,
            pull_steps=steps,
            job_variables={"requirements": [specs["prft_tiny_job"]]},
        )
    flow_run_id = _run(str(deployment_id))
    run = _wait(flow_run_id, FINAL, worker)
    assert run.state.type.value == "COMPLETED", (run.state, worker.read_text()[-4000:])
    assert _wait_for_log(flow_run_id, "packages ") == ["packages prft_tiny_job prft_tiny_pull"]
    installed = _wait_for_log(flow_run_id, f"installed on pod {run.infrastructure_pid}: ")
    assert installed == [
        f"installed on pod {run.infrastructure_pid}: {specs['prft_tiny_job']} requirements.txt"
    ]
    _wait_for_record(flow_run_id)
