"""The ``runpod`` pool type: found through the entry point, its job variables with
defaults and descriptions, Prefect's default command."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from prefect_runpod.flows.worker.config import POD_FIELDS

ROOT = Path(__file__).resolve().parents[3]


def test_the_worker_registers_through_its_own_collections_entry_point() -> None:
    from prefect.plugins import load_prefect_collections
    from prefect.workers.base import BaseWorker

    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert entry["prefect.collections"]["prefect_runpod_worker"] == "prefect_runpod.flows.worker"
    load_prefect_collections()
    worker = BaseWorker.get_worker_class_from_type("runpod")
    assert worker is not None and worker.__name__ == "RunPodWorker"


def test_every_job_variable_has_a_default_and_a_description() -> None:
    from prefect_runpod.flows.worker import RunPodWorker

    template = RunPodWorker.get_default_base_job_template()
    variables = template["variables"]["properties"]
    wanted = {
        "provider", "image", "gpu_type_ids", "gpu_count", "cloud_type", "data_center_ids",
        "container_disk_gb", "allowed_cuda_versions", "env", "runpod_credentials_block",
        "ssh_key_block", "runpod_spec_block", "max_usd_per_hour", "max_runtime_seconds",
        "heartbeat_stale_seconds", "pod_lifetime_seconds", "name_prefix", "command",
        "prefect_api_url_for_pod",
    }  # fmt: skip
    assert wanted <= set(variables), wanted - set(variables)
    for name in POD_FIELDS:
        assert "default" in variables[name], name
        assert len(variables[name]["description"]) > 20, name
    assert variables["provider"]["default"] == "local"
    assert set(variables["provider"]["enum"]) == {"local", "runpod"}
    assert variables["name_prefix"]["default"] == "prft"
    job = template["job_configuration"]
    assert set(job) >= set(POD_FIELDS) | {"command", "env"}
    assert job["max_runtime_seconds"] == "{{ max_runtime_seconds }}"


def test_the_default_command_is_prefects_own() -> None:
    from prefect.workers.base import BaseJobConfiguration

    from prefect_runpod.flows.worker.pod_run import PREFECT_DEFAULT_COMMAND

    assert BaseJobConfiguration._base_flow_run_command() == PREFECT_DEFAULT_COMMAND


@pytest.mark.parametrize(
    ("command", "uploaded", "expected"),
    [
        (None, True, "/v/bin/python -m prefect.engine"),
        ("prefect flow-run execute", False, "/v/bin/python -m prefect flow-run execute"),
        ("python my_runner.py", True, "python my_runner.py"),
    ],
)
def test_the_pod_runs_prefect_with_its_venv_python(
    command: str | None, uploaded: bool, expected: str
) -> None:
    from prefect_runpod.flows.worker.pod_run import pod_command

    assert pod_command(command, "/v/bin/python", code_uploaded=uploaded) == expected


def test_local_code_is_a_working_directory_that_exists_here(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from prefect_runpod.flows.worker.pod_run import local_code_dir

    step = "prefect.deployments.steps.set_working_directory"
    here = SimpleNamespace(pull_steps=[{step: {"directory": str(tmp_path)}}])
    assert local_code_dir(here) == tmp_path
    gone = SimpleNamespace(pull_steps=[{step: {"directory": str(tmp_path / "nope")}}])
    assert local_code_dir(gone) is None
    clone = {"prefect.deployments.steps.git_clone": {"repository": "https://x/y.git"}}
    assert local_code_dir(SimpleNamespace(pull_steps=[clone])) is None
    assert local_code_dir(None) is None
