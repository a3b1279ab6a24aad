"""The env stage for real: probe.py on this machine, pip against a loopback PEP 503
index of tiny wheels (no internet), a pod venv, a re-probe, and the verdict.

The "image" is a venv made from the system Python (its own packages play the image's
site-packages); a fake ``nvidia-smi`` on PATH plays the driver when a test needs one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.tasks.env import fix_env, parse_probe_output, probe_env
from tests.emulators.wheel_index import WheelIndex
from tests.fixtures.hf import ShellConsole

PROBE = Path(__file__).resolve().parents[2] / "blocks" / "pod_side" / "probe.py"
BASE_PYTHON = shutil.which("python3.11") or "/usr/bin/python3"

pytestmark = pytest.mark.slow


def _has_system_pip() -> bool:
    proc = subprocess.run([BASE_PYTHON, "-m", "pip", "--version"], capture_output=True)
    return proc.returncode == 0


needs_pip = pytest.mark.skipif(not _has_system_pip(), reason="the system Python has no pip")

FAKE_SMI = """#!/bin/sh
if [ "$1" = "" ]; then
cat <<'EOF'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
EOF
else
echo "{driver}, NVIDIA RTX A4000, 16376"
fi
"""


@pytest.fixture(scope="module")
def wheel_index():
    with WheelIndex() as index:
        yield index


def _console(tmp_path: Path, image_bin: Path, smi: tuple[str, str] | None) -> ShellConsole:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi:
        script = bin_dir / "nvidia-smi"
        script.write_text(FAKE_SMI.format(driver=smi[0], cuda=smi[1]))
        script.chmod(0o755)
    path = [str(image_bin), str(bin_dir), "/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(
        PATH=os.pathsep.join(path),
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_CACHE_DIR="1",
        HOME=str(tmp_path),
    )
    return ShellConsole(cwd=str(tmp_path), base_env=env)


def _image(tmp_path: Path, index: WheelIndex, console: ShellConsole, torch: str, tf: str) -> Path:
    """A Python with an old torch and a given transformers, like a RunPod image."""
    image = tmp_path / "image"
    subprocess.run(
        [BASE_PYTHON, "-m", "venv", "--system-site-packages", "--without-pip", str(image)],
        check=True,
    )
    py = image / "bin" / "python"
    console.run(
        f"{py} -m pip install -q --index-url {index.torch_base}/cpu torch=={torch}",
        timeout_seconds=300,
    )
    console.run(
        f"{py} -m pip install -q --index-url {index.simple_url} transformers=={tf}",
        timeout_seconds=300,
    )
    return image


def test_probe_reports_the_transformers_torch_gate(tmp_path, wheel_index):
    console = _console(tmp_path, tmp_path / "image" / "bin", ("535.183.01", "12.2"))
    if not _has_system_pip():
        pytest.skip("the system Python has no pip")
    _image(tmp_path, wheel_index, console, "2.1.0+cpu", "5.2.0")
    report = probe_env(console, str(PROBE), runner=sys.executable, disk_path=str(tmp_path))
    first = report.pythons[0]
    assert first.path == str(tmp_path / "image" / "bin" / "python")
    assert (first.torch, first.torch_cuda, first.cuda_available) == ("2.1.0+cpu", None, False)
    assert first.transformers == "5.2.0" and first.transformers_torch_ok is False
    assert (report.driver_version, report.driver_cuda) == ("535.183.01", "12.2")
    assert report.gpu_name == "NVIDIA RTX A4000" and report.vram_mib == 16376
    assert report.free_disk_bytes and report.free_disk_bytes > 0


def test_probe_without_gpu_and_with_a_broken_python(tmp_path):
    broken = tmp_path / "python3.99"
    broken.write_text("#!/bin/sh\necho 'boom' >&2\nexit 3\n")
    broken.chmod(0o755)
    out = subprocess.run(
        [sys.executable, str(PROBE), "--python", str(broken), "--disk-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    report = parse_probe_output(out.stdout)
    assert report.driver_cuda is None and report.gpu_name is None
    assert report.pythons[0].path == str(broken) and report.pythons[0].version is None
    with pytest.raises(EnvError, match="no report"):
        parse_probe_output("Traceback: nothing here")


@needs_pip
def test_an_old_torch_image_is_fixed_on_a_cpu_pod(tmp_path, wheel_index):
    """torch 2.1 + transformers 5.2 (torch disabled) → the plan raises torch from the cpu
    index into a pod venv, and the re-probe proves transformers sees torch again."""
    console = _console(tmp_path, tmp_path / "image" / "bin", None)
    _image(tmp_path, wheel_index, console, "2.1.0+cpu", "5.2.0")
    venv = tmp_path / "pod-venv"
    plan = fix_env(
        console,
        ["transformers>=5.1"],
        str(PROBE),
        venv=str(venv),
        runner=sys.executable,
        disk_path=str(tmp_path),
        torch_index_base=wheel_index.torch_base,
        pip_index_url=wheel_index.simple_url,
    )
    assert plan.verified and plan.wheel_index == "cpu" and plan.python == f"{venv}/bin/python"
    assert plan.before is not None and plan.before.pythons[0].transformers_torch_ok is False
    after = next(p for p in plan.after.pythons if p.path == plan.python)
    assert after.torch and after.torch.endswith("+cpu") and after.transformers_torch_ok is True
    assert any(r.startswith("/whl/cpu/torch/") for r in wheel_index.requests)
    # the image itself was not touched
    image_probe = next(p for p in plan.after.pythons if p.path.startswith(str(tmp_path / "image")))
    assert image_probe.torch == "2.1.0+cpu"


@needs_pip
def test_cuda_plan_is_refused_when_torch_cannot_see_the_gpu(tmp_path, wheel_index):
    """Driver CUDA 11.8 → cu118 wheel installed; its torch reports no CUDA, so the
    verification fails instead of reporting success."""
    console = _console(tmp_path, tmp_path / "image" / "bin", ("520.61.05", "11.8"))
    _image(tmp_path, wheel_index, console, "2.1.0+cpu", "4.46.3")
    with pytest.raises(EnvError, match=r"reports no CUDA although the driver supports CUDA 11.8"):
        fix_env(
            console,
            ["transformers>=5.1"],
            str(PROBE),
            venv=str(tmp_path / "v"),
            runner=sys.executable,
            torch_index_base=wheel_index.torch_base,
            pip_index_url=wheel_index.simple_url,
        )
    assert any(r.startswith("/whl/cu118/torch/torch-2.7.1") for r in wheel_index.requests)


def test_too_old_driver_installs_nothing(tmp_path, wheel_index):
    console = _console(tmp_path, tmp_path / "nothing", ("515.65.01", "11.7"))
    seen = len(wheel_index.requests)
    with pytest.raises(EnvError, match="too old"):
        fix_env(
            console,
            ["torch>=2.4"],
            str(PROBE),
            venv=str(tmp_path / "v"),
            runner=sys.executable,
            torch_index_base=wheel_index.torch_base,
            pip_index_url=wheel_index.simple_url,
        )
    assert len(wheel_index.requests) == seen and not (tmp_path / "v").exists()


@needs_pip
def test_env_task_through_the_local_pod_console(runpod_home, wheel_index):
    """The @task body on a LocalPod (PTY gateway): probe, pod venv, pip from the
    loopback index, re-probe — and the host's interpreters stay as they were."""
    from prefect.logging import disable_run_logger

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.tasks.env import env
    from tests.fixtures.local_pod import start_pod

    provider = LocalPodProvider(home=runpod_home, mode="gateway", start_timeout_seconds=120.0)
    pin = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PATH": "/usr/bin:/bin"}
    handle, keypair = start_pod(provider, env=pin)
    try:
        tools = Path(handle.workdir) / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROBE, tools / "probe.py")
        with disable_run_logger():
            plan = env.fn(
                handle,
                keypair.private_key,
                ["torch>=2.5", "transformers>=5.1"],
                str(tools),
                torch_index_base=wheel_index.torch_base,
                pip_index_url=wheel_index.simple_url,
            )
        assert plan.verified and plan.wheel_index == "cpu"
        assert plan.python == f"{tools}/venv/bin/python"
        after = next(p for p in plan.after.pythons if p.path == plan.python)
        assert after.torch and after.torch.endswith("+cpu") and after.transformers_torch_ok
    finally:
        provider.terminate(handle.pod_id)
    host = subprocess.run([BASE_PYTHON, "-c", "import torch"], capture_output=True)
    assert host.returncode != 0  # nothing was installed into the host's Python


@needs_pip
def test_a_venv_image_keeps_its_packages_in_the_pod_venv(runpod_home, wheel_index):
    """#13: on an image whose Python is a venv (the ``venv-python`` profile: torch and
    transformers in /opt/venv), the pod venv the env stage made could not import
    transformers, and the re-probe said verified. Now the pod venv inherits the image
    venv's packages, and the re-probe imports each one with the pod venv's Python."""
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.tasks.env import apply_env_plan
    from prefect_runpod.tasks.env_plan import plan_env, verify_env
    from tests.fixtures.local_pod import start_pod

    provider = LocalPodProvider(home=runpod_home, start_timeout_seconds=120.0, image="venv-python")
    handle, keypair = start_pod(
        provider, env={"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
    )
    try:
        tools = Path(handle.workdir) / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROBE, tools / "probe.py")
        with PodConsole.for_pod(handle, keypair.private_key) as console:
            plan = fix_env(
                console,
                ["peft"],
                str(tools / "probe.py"),
                venv=str(tools / "venv"),
                pip_index_url=wheel_index.simple_url,
            )
            assert plan.verified and plan.python == f"{tools}/venv/bin/python"
            after = next(p for p in plan.after.pythons if p.path == plan.python)
            assert after.imports == {
                "peft": "0.13.2",
                "torch": "2.5.1+cpu",
                "transformers": "4.57.1",
            }
            # The same plan without the .pth (what the stage did before): the re-probe
            # now says what is missing instead of verified.
            bare = plan_env(
                plan.before,
                ["peft"],
                venv=str(tools / "venv2"),
                pip_index_url=wheel_index.simple_url,
            )
            bare.commands = [c for c in bare.commands if ".pth" not in c]
            apply_env_plan(console, bare)
            reprobe = probe_env(
                console,
                str(tools / "probe.py"),
                pythons=[bare.python or ""],
                require=bare.must_import,
            )
            with pytest.raises(EnvError, match=r"transformers does not import with .*venv2"):
                verify_env(bare, reprobe)
    finally:
        provider.terminate(handle.pod_id)
