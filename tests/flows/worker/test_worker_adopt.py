"""A restarted ``runpod`` worker adopts the live pods a stopped one left (found by name
and infrastructure id) before their dead-man limit, and two workers on one pool never run
one flow run twice: real ``prefect worker start`` processes on the local pod."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flows.worker.test_worker_e2e import (
    FINAL,
    _deploy,
    _env,
    _logs,
    _prefect,
    _run,
    _wait,
    _wait_for_log,
    _wait_for_record,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def adopt_pool(prefect_server: None) -> str:
    done = _prefect("work-pool", "create", "adopt-pool", "--type", "runpod")
    assert done.returncode == 0, done.stdout + done.stderr
    return "adopt-pool"


class Workers:
    """``prefect worker start --type runpod`` processes this test starts (each ended)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, pool: str, name: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.folder / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool,
                 "--type", "runpod", "--name", name, "--prefetch-seconds", "5"],
                env=_env() | {"PREFECT_WORKER_QUERY_SECONDS": "1",
                              "PREFECT_LOGGING_LEVEL": "INFO"} | (env or {}),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc, log

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def test_a_restarted_worker_adopts_its_pod_and_the_flow_completes(
    adopt_pool: str, workers: Workers
) -> None:
    """SIGKILL the worker while its flow runs on its pod; a worker started again within
    the dead-man's limit (30 s) takes the pod over: the flow, which runs past that limit
    from the kill, Completes and its pod is gone."""
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    first, first_log = workers.start(adopt_pool, "adopt-first")
    deployment_id = _deploy(adopt_pool, name="adopted", heartbeat_stale_seconds=30)
    flow_run_id = _run(deployment_id, seed="adopt", rounds=3, linger_seconds=40)
    _wait_for_log(flow_run_id, "digest ")  # the flow runs on its pod
    run = _wait(flow_run_id, {"RUNNING"}, first_log)
    pod_id = run.infrastructure_pid
    assert pod_id and LocalPodProvider().get(pod_id) is not None
    first.send_signal(signal.SIGKILL)  # the worker process alone: no teardown at all
    first.wait(timeout=30)
    _, second_log = workers.start(adopt_pool, "adopt-second")
    run = _wait(flow_run_id, FINAL, second_log, deadline_s=180)
    assert run.state.type.value == "COMPLETED", (run.state, second_log.read_text()[-4000:])
    assert run.infrastructure_pid == pod_id
    assert _wait_for_log(flow_run_id, f"adopted pod {pod_id} ")
    record = _wait_for_record(flow_run_id)
    assert record.pod_id == pod_id and record.recorded_by == "worker"
    assert LocalPodProvider().status(pod_id).gone


def test_two_workers_on_one_pool_never_run_one_flow_run_twice(
    adopt_pool: str, workers: Workers
) -> None:
    """Prefect's claim (the Pending proposal only one worker wins) is the lock: with two
    workers polling one pool, each of three flow runs gets exactly one pod."""
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.flows.run.cost_record import latest_record

    _, log_a = workers.start(adopt_pool, "twin-a")
    _, log_b = workers.start(adopt_pool, "twin-b")
    deployment_id = _deploy(adopt_pool, name="twins")
    flow_run_ids = [_run(deployment_id, seed=f"twin{i}", rounds=2) for i in range(3)]
    runs = [_wait(flow_run_id, FINAL, log_a) for flow_run_id in flow_run_ids]
    assert [run.state.type.value for run in runs] == ["COMPLETED"] * 3, (
        [run.state for run in runs],
        log_b.read_text()[-3000:],
    )
    pods = {run.infrastructure_pid for run in runs}
    assert len(pods) == 3 and None not in pods
    for run in runs:
        _wait_for_log(str(run.id), f"pod {run.infrastructure_pid} (prft-{run.id}) created: ")
        created = [m for m in _logs(str(run.id)) if m.startswith("pod ") and ") created: " in m]
        assert len(created) == 1, created
        record = _wait_for_record(str(run.id))
        assert [a.pod_id for a in record.attempts] == [run.infrastructure_pid]
        assert LocalPodProvider().status(run.infrastructure_pid).gone
        assert latest_record(str(run.id)) is not None


@contextlib.contextmanager
def _labels_answer_503(worker_name: str) -> Iterator[None]:
    """The session server's SQLite database fails the write of the labels Prefect's
    base worker gives a flow run it submits, for worker ``worker_name`` only, the way the
    server answers 503 Service Unavailable: a trigger whose blob is over SQLite's length
    limit (``SQLITE_TOOBIG``, a DB-API error the server marks retryable, as it marks
    the ``SQLITE_BUSY_SNAPSHOT`` this PATCH's read-then-write meets on a busy machine).
    The trigger is dropped on the way out."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    assert url is not None and url.get_secret_value().startswith("sqlite+aiosqlite:///")
    path = url.get_secret_value().removeprefix("sqlite+aiosqlite:///")
    name = f"labels_503_{worker_name.replace('-', '_')}"
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
        db.execute(
            f"CREATE TRIGGER {name} BEFORE UPDATE OF labels ON flow_run "
            f"WHEN json_extract(NEW.labels, '$.\"prefect.worker.name\"') = '{worker_name}' "
            "BEGIN SELECT zeroblob(2000000000); END"
        )
        db.commit()
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER {name}")
            db.commit()


def test_a_503_on_the_labels_prefect_gives_a_submitted_run_does_not_crash_it(
    adopt_pool: str, workers: Workers
) -> None:
    """Before the pod is rented Prefect's base worker PATCHes the run's labels; the
    session server answers 503 every time (its client's one retry included): the run
    still gets its pod and completes, and the worker says once that it went on without
    them. Before, the run was Crashed with "Failed to submit flow run to infrastructure:
    ... 503 Service Unavailable" (a loaded machine's suite, two workers on one pool)."""
    with _labels_answer_503("labels-503"):
        _, log = workers.start(adopt_pool, "labels-503", {"PREFECT_CLIENT_MAX_RETRIES": "1"})
        deployment_id = _deploy(adopt_pool, name="labels-503")
        flow_run_id = _run(deployment_id, seed="labels", rounds=2)
        run = _wait(flow_run_id, FINAL, log)
    assert run.state.type.value == "COMPLETED", (run.state, log.read_text()[-3000:])
    warned = [
        line for line in log.read_text().splitlines() if "without this worker's labels" in line
    ]
    assert len(warned) == 1 and "503 Service Unavailable" in warned[0], warned
    assert "prefect.worker.name" not in (run.labels or {})


def test_a_worker_left_down_has_its_pod_end_itself_and_the_run_crashed(
    adopt_pool: str, workers: Workers
) -> None:
    """SIGKILL the worker while its flow runs and start none again: the pod's dead-man
    (a 20 s heartbeat limit) stops the flow process first, whose engine marks the run
    Crashed, then ends the pod; nothing is left running."""
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    first, first_log = workers.start(adopt_pool, "left-down")
    deployment_id = _deploy(adopt_pool, name="left-down", heartbeat_stale_seconds=20)
    flow_run_id = _run(deployment_id, seed="down", rounds=3, linger_seconds=600)
    _wait_for_log(flow_run_id, "digest ")  # the flow runs on its pod
    run = _wait(flow_run_id, {"RUNNING"}, first_log)
    pod_id = run.infrastructure_pid
    provider = LocalPodProvider()
    assert pod_id and provider.get(pod_id) is not None
    first.send_signal(signal.SIGKILL)  # the worker process alone: no teardown at all
    first.wait(timeout=30)
    run = _wait(flow_run_id, FINAL, first_log, deadline_s=180)
    assert run.state.type.value == "CRASHED", run.state
    wait_gone = time.monotonic() + 60
    while not provider.status(pod_id).gone and time.monotonic() < wait_gone:
        time.sleep(0.5)
    tombstone = provider.ended(pod_id)
    assert tombstone is not None and tombstone.by == "deadman", tombstone
    stops = [a for a in tombstone.attempts if a.get("layer") == "stop the run's process first"]
    assert [a["ok"] for a in stops if a["ok"] is not None] == [True], tombstone.attempts
    assert provider.status(pod_id).gone
