"""The env stage readies the publisher (issue 17, item 2): Python 3.10+ or refused with
the reason, the training Python reused when it has the client, otherwise a separate
publish venv — pip on a real pod, a ``.pth`` to this environment on the offline local
pod — proven by a second probe."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.tasks.env import fix_env
from prefect_runpod.tasks.models import EnvPlan, EnvReport, PythonProbe
from prefect_runpod.tasks.publish_env import plan_publish_tools, prepare_publish_tools
from tests.emulators.wheel_index import WheelIndex
from tests.fixtures.hf import ShellConsole

PROBE = Path(__file__).resolve().parents[2] / "blocks" / "pod_side" / "probe.py"
BASE_PYTHON = shutil.which("python3.11") or "/usr/bin/python3"


class TestPlan:
    def test_a_python_older_than_310_is_refused_with_the_reason(self) -> None:
        old = PythonProbe(path="/usr/bin/python3", version="3.8.10", huggingface_hub="0.20.3")
        with pytest.raises(
            EnvError, match=r"/usr/bin/python3 is 3\.8\.10, older than the 3\.10"
        ) as info:
            plan_publish_tools(old, "hf", provider="runpod", venv="/w/pv")
        assert "drop --publish" in str(info.value)

    def test_the_training_python_is_used_when_it_has_the_client(self) -> None:
        probe = PythonProbe(path="/usr/bin/python3.10", version="3.10.12", huggingface_hub="0.26.1")
        python, commands, notes = plan_publish_tools(probe, "hf", provider="runpod", venv="/w/pv")
        assert (python, commands) == ("/usr/bin/python3.10", [])
        assert "huggingface_hub 0.26.1" in notes[0]

    def test_too_old_a_client_is_replaced_in_its_own_venv(self) -> None:
        probe = PythonProbe(path="/usr/bin/python3", version="3.10.12", huggingface_hub="0.17.0")
        python, commands, _ = plan_publish_tools(
            probe, "hf", provider="runpod", venv="/w/pv", pip_index_url="http://idx/simple"
        )
        assert python == "/w/pv/bin/python"
        assert commands[0] == "/usr/bin/python3 -m venv --system-site-packages --without-pip /w/pv"
        assert commands[1].endswith("--index-url http://idx/simple 'huggingface_hub>=0.24'")

    def test_the_local_pod_borrows_this_environment(self) -> None:
        probe = PythonProbe(path="/usr/bin/python3.11", version="3.11.7")
        python, commands, notes = plan_publish_tools(
            probe,
            "s3",
            provider="local",
            venv="/w/pv",
            host_dirs=["/host/site-packages"],
            host_version=(3, 11),
        )
        assert python == "/w/pv/bin/python"
        assert "prefect-runpod-host.pth" in commands[1] and commands[1].endswith(
            "/host/site-packages"
        )
        assert "pip install" not in " ".join(commands)
        assert "rehearsal" in notes[0]
        with pytest.raises(EnvError, match="same minor version"):
            plan_publish_tools(probe, "hf", provider="local", venv="/w/pv", host_version=(3, 12))


def _console(tmp_path: Path, image_bin: Path) -> ShellConsole:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(
        PATH=os.pathsep.join([str(image_bin), "/usr/local/bin", "/usr/bin", "/bin"]),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        HOME=str(tmp_path),
    )
    return ShellConsole(cwd=str(tmp_path), base_env=env)


def test_env_refuses_an_image_whose_python_is_too_old(tmp_path: Path) -> None:
    """The probe sees only an old Python (like an old image's): env stops before
    training, with the reason."""
    image_bin = tmp_path / "image-bin"
    image_bin.mkdir()
    for name in ("python", "python3"):
        fake = image_bin / name
        fake.write_text('#!/bin/sh\necho \'PROBE_JSON {"version": "3.8.10"}\'\n')
        fake.chmod(0o755)
    console = _console(tmp_path, image_bin)
    plan = fix_env(console, [], str(PROBE), venv=str(tmp_path / "venv"), runner=sys.executable)
    assert plan.python == str(image_bin / "python")
    with pytest.raises(EnvError, match=r"is 3\.8\.10, older than the 3\.10"):
        prepare_publish_tools(
            console, plan, "hf", provider="runpod", venv=str(tmp_path / "pv"), probe_path=str(PROBE)
        )
    assert not (tmp_path / "pv").exists()  # nothing was made


def _base_python_without(module: str) -> str | None:
    """A system Python with pip and without ``module`` (like a bare image), or None."""
    for candidate in (shutil.which("python3.11"), "/usr/bin/python3.11", "/usr/bin/python3"):
        if not candidate or not Path(candidate).exists():
            continue
        has_pip = subprocess.run([candidate, "-m", "pip", "--version"], capture_output=True)
        lacks = subprocess.run([candidate, "-c", f"import {module}"], capture_output=True)
        if has_pip.returncode == 0 and lacks.returncode != 0:
            return candidate
    return None


@pytest.mark.slow
def test_a_real_pod_gets_the_client_installed_from_its_index(tmp_path: Path) -> None:
    """A real pod's path: a publish venv and pip from the (loopback) index, proven by a
    second probe; the training Python is left as it was."""
    base_python = _base_python_without("boto3")
    if base_python is None:
        pytest.skip("no system Python with pip and without boto3 here")
    console = _console(tmp_path, tmp_path / "none")
    version = subprocess.run(
        [base_python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    base = PythonProbe(path=base_python, version=version)
    plan = EnvPlan(python=base_python, before=EnvReport(pythons=[base]), verified=True)
    with WheelIndex(simple={"boto3": ["1.35.0"]}) as index:
        ready = prepare_publish_tools(
            console,
            plan,
            "s3",
            provider="runpod",
            venv=str(tmp_path / "pv"),
            probe_path=str(PROBE),
            pip_index_url=index.simple_url,
        )
        assert any(r.startswith("/simple/boto3/") for r in index.requests)
    assert ready.publish_python == f"{tmp_path}/pv/bin/python"
    assert ready.python == base_python
    assert any("pip install" in c and "boto3>=1.28" in c for c in ready.commands)
    assert ready.notes[-1].endswith("boto3 1.35.0")


def test_the_local_pod_rehearsal_sees_this_environments_client(tmp_path: Path) -> None:
    """The local pod's path, for real on this machine: the publish venv's Python imports
    huggingface_hub from this environment through the ``.pth``."""
    console = _console(tmp_path, tmp_path / "none")
    base = PythonProbe(path=BASE_PYTHON, version=".".join(map(str, sys.version_info[:3])))
    plan = EnvPlan(python=BASE_PYTHON, before=EnvReport(pythons=[base]), verified=True)
    if (
        subprocess.run(
            [BASE_PYTHON, "-c", "import huggingface_hub"], capture_output=True
        ).returncode
        == 0
    ):
        pytest.skip("the base Python already has huggingface_hub")
    ready = prepare_publish_tools(
        console, plan, "hf", provider="local", venv=str(tmp_path / "pv"), probe_path=str(PROBE)
    )
    assert ready.publish_python == f"{tmp_path}/pv/bin/python"
    out = subprocess.run(
        [ready.publish_python, "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.strip()
    assert ready.notes[-1].startswith(f"verified {ready.publish_python}: huggingface_hub")
