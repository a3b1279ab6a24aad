"""The ``runpod`` worker with provider ``runpod``, on emulated RunPod (REST v2, the SSH
gateway): the real ``prefect worker start`` process rents the pod through RunPod's API,
uploads examples/any-flow, runs it with the image's own Prefect, ends the pod and
records its cost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.keys import generate_keypair
from tests.flows.worker.test_worker_adopt import Workers
from tests.flows.worker.test_worker_e2e import (
    FINAL,
    _deploy,
    _prefect,
    _run,
    _wait,
    _wait_for_log,
    _wait_for_record,
)

pytestmark = pytest.mark.slow

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def emulated_workers(
    prefect_server: None, runpod_emulator: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workers]:
    """A worker whose environment reaches the emulator (its key, the gateway, the
    account's SSH key), as a user's would reach RunPod; stopped at the end."""
    keypair = generate_keypair("worker-runpod")
    key_file = tmp_path / "id_ed25519_runpod"
    key_file.write_text(keypair.private_key.get_secret_value())
    key_file.chmod(0o600)
    runpod_emulator.pub_key = keypair.public_key  # type: ignore[attr-defined]
    monkeypatch.setenv("RUNPOD_API_KEY", runpod_emulator.api_key)  # type: ignore[attr-defined]
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(key_file))
    monkeypatch.setenv("RUNPOD_SSH_GATEWAY_HOST", "127.0.0.1")
    monkeypatch.setenv("RUNPOD_SSH_GATEWAY_PORT", str(runpod_emulator.gateway_port))  # type: ignore[attr-defined]
    started = Workers(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def _completed_on_emulated_runpod(
    workers: Workers, name: str, path: str, seed: str, rounds: int, deadline_s: float
) -> tuple[Any, str]:
    """Deploy examples/any-flow to pool ``<name>-pool`` with provider ``runpod`` and a
    spec block whose env puts ``path`` on the pod's ``PATH``, run it through a worker
    named ``name``, and wait for it to be Completed: ``(flow run, its id)``."""
    from prefect.settings import get_current_settings

    from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec

    RunPodPodSpec(env={"PATH": path}).save(f"worker-{name}-spec", overwrite=True)
    done = _prefect("work-pool", "create", f"{name}-pool", "--type", "runpod", "--overwrite")
    assert done.returncode == 0, done.stdout + done.stderr
    _, log = workers.start(f"{name}-pool", name)
    deployment_id = _deploy(
        f"{name}-pool",
        name=f"on-{name}",
        provider="runpod",
        runpod_spec_block=f"worker-{name}-spec",
        prefect_api_url_for_pod=str(get_current_settings().api.url),
    )
    flow_run_id = _run(deployment_id, seed=seed, rounds=rounds)
    run = _wait(flow_run_id, FINAL, log, deadline_s=deadline_s)
    assert run.state.type.value == "COMPLETED", (run.state, log.read_text()[-4000:])
    return run, flow_run_id


def test_any_flow_completes_on_an_emulated_runpod_pod(
    emulated_workers: Workers, runpod_emulator: object
) -> None:
    """The image has a Prefect of the worker's minor version (its ``python3`` is first on
    the pod's ``PATH``, set by the spec block's env), so nothing is installed; the pod is
    reached through the gateway, the loopback API through ``prefect_api_url_for_pod``."""
    here = f"{Path(sys.executable).parent}:{_SYSTEM_PATH}"
    run, flow_run_id = _completed_on_emulated_runpod(
        emulated_workers, "emulated", here, seed="runpod", rounds=3, deadline_s=300
    )
    pod_id = run.infrastructure_pid
    record = _wait_for_record(flow_run_id)  # written once the pod's end is confirmed
    assert record.pod_id == pod_id and record.recorded_by == "worker"
    assert record.cost_per_hr == pytest.approx(0.22) and record.end.confirmed
    assert pod_id in runpod_emulator.ended, runpod_emulator.ended  # type: ignore[attr-defined]
    digest = _wait_for_log(flow_run_id, "digest ")
    assert f"/prefect-runpod/{flow_run_id}/code/result.txt" in digest[0]
    created = _wait_for_log(flow_run_id, f"pod {pod_id} (prft-{flow_run_id}) created: ")
    assert created[0].endswith(", 0.2200 USD/h"), created
    started = _wait_for_log(flow_run_id, f"flow process started on pod {pod_id} ")
    assert started[0].endswith(": python3 -m prefect.engine"), started


def test_any_flow_completes_on_an_image_without_prefect(
    emulated_workers: Workers, runpod_emulator: object
) -> None:
    """The image's ``python3`` (this machine's system Python, first on the pod's
    ``PATH``) has no Prefect: the worker makes a venv beside the image's packages, pip
    installs the worker's own Prefect version there (``prefect==<version>``, from the
    package index), and the flow's engine runs with that venv's Python."""
    bare = subprocess.run(
        ["env", f"PATH={_SYSTEM_PATH}", "python3", "-c", "import prefect"],
        capture_output=True, check=False,
    )  # fmt: skip
    if bare.returncode == 0:
        pytest.skip("this machine's system python3 has Prefect: no image without it here")
    run, flow_run_id = _completed_on_emulated_runpod(
        emulated_workers, "bare", _SYSTEM_PATH, seed="bare", rounds=2, deadline_s=600
    )
    pod_id = run.infrastructure_pid
    venv_python = f"/prefect-runpod/{flow_run_id}/venv/bin/python"
    started = _wait_for_log(flow_run_id, f"flow process started on pod {pod_id} ")
    assert started[0].endswith(f"{venv_python} -m prefect.engine"), started
    record = _wait_for_record(flow_run_id)
    assert record.pod_id == pod_id and record.end.confirmed
    assert pod_id in runpod_emulator.ended, runpod_emulator.ended  # type: ignore[attr-defined]
