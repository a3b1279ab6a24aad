"""The env planner on real image/driver combinations (pure; no pod, no pip)."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.tasks.env_plan import (
    allowed_cuda_versions_for,
    plan_env,
    torch_floor_for_transformers,
    verify_env,
)
from prefect_runpod.tasks.models import EnvReport, PythonProbe

VENV = "/workspace/run/venv"


def image(
    torch=None,
    cuda_build=None,
    transformers=None,
    driver=None,
    driver_cuda=None,
    python="/usr/bin/python3",
    version="3.10.12",
    torch_ok=None,
) -> EnvReport:
    probe = PythonProbe(
        path=python,
        version=version,
        torch=torch,
        torch_cuda=cuda_build,
        cuda_available=(driver_cuda is not None) if torch else None,
        transformers=transformers,
        transformers_torch_ok=torch_ok,
    )
    return EnvReport(
        pythons=[probe],
        driver_version=driver,
        driver_cuda=driver_cuda,
        gpu_name="NVIDIA RTX A4000" if driver else None,
        vram_mib=16376 if driver else None,
        free_disk_bytes=20 << 30,
    )


RUNPOD_21 = dict(torch="2.1.0+cu118", cuda_build="11.8", transformers="4.46.3")


@pytest.mark.parametrize(
    ("version", "floor"),
    [
        ("4.46.3", None),
        ("4.51.3", None),
        ("4.52.0", "2.1"),
        ("4.57.1", "2.1"),
        ("5.0.0", "2.2"),
        ("5.1.0", "2.4"),
        ("5.14.2", "2.4"),
        ("5.15.0", "2.5"),
        ("5.19.9", "2.5"),
        ("5.20.0", "2.6"),
        ("5.24.0", "2.6"),
        (None, "2.6"),
    ],
)
def test_transformers_torch_floor(version, floor):
    assert torch_floor_for_transformers(version) == floor


# (report, requirements) → (wheel index, torch specifier or None, torch floor)
CASES = {
    "old image: 2.1+cu118, transformers>=5.1, driver 12.2": (
        image(**RUNPOD_21, driver="535.183.01", driver_cuda="12.2"),
        ["transformers>=5.1"],
        "cu118",
        ">=2.6,<2.8",
        "2.6",
    ),
    "2.1+cu118 image, transformers 5.1-5.14 on driver 12.2 → cu121": (
        image(**RUNPOD_21, driver="535.183.01", driver_cuda="12.2"),
        ["transformers>=5.1,<5.15"],
        "cu121",
        ">=2.4,<2.6",
        "2.4",
    ),
    "2.1+cu118 image, old driver 11.8": (
        image(**RUNPOD_21, driver="520.61.05", driver_cuda="11.8"),
        ["transformers==5.2.0", "peft"],
        "cu118",
        ">=2.4,<2.8",
        "2.4",
    ),
    "2.1+cu118 image keeps transformers 4.x": (
        image(**RUNPOD_21, driver="535.183.01", driver_cuda="12.2"),
        ["transformers>=4.40,<4.52", "peft>=0.13"],
        None,
        None,
        None,
    ),
    "cu124 image, transformers>=5.1 on driver 12.4": (
        image(
            torch="2.4.1+cu124",
            cuda_build="12.4",
            transformers="4.57.1",
            driver="550.54.15",
            driver_cuda="12.4",
        ),
        ["transformers>=5.1"],
        "cu124",
        ">=2.6,<2.7",
        "2.6",
    ),
    "cu124 image already fine for transformers 5.1-5.14": (
        image(
            torch="2.4.1+cu124",
            cuda_build="12.4",
            transformers="5.2.0",
            driver="550.54.15",
            driver_cuda="12.4",
        ),
        ["transformers>=5.1"],
        None,
        None,
        "2.4",
    ),
    "new driver 12.8 picks cu128 for torch>=2.8": (
        image(**RUNPOD_21, driver="570.124.06", driver_cuda="12.8"),
        ["torch>=2.8", "transformers"],
        "cu128",
        ">=2.8,<2.15",
        "2.8",
    ),
    "cpu-only pod, no torch, transformers only: nothing from a torch index": (
        image(python="/usr/bin/python3"),
        ["transformers>=5.1"],
        None,
        None,
        "2.6",
    ),
    "cpu-only pod, job needs torch: cpu index": (
        image(),
        ["torch>=2.5", "transformers>=4.40,<4.52"],
        "cpu",
        ">=2.5,<2.15",
        "2.5",
    ),
    "cpu-only pod with an old torch below the floor: cpu index": (
        image(torch="2.1.0+cpu", transformers="4.46.3"),
        ["transformers>=5.1"],
        "cpu",
        ">=2.6,<2.15",
        "2.6",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_planner_table(case):
    report, reqs, index, torch_spec, floor = CASES[case]
    plan = plan_env(
        report,
        reqs,
        venv=VENV,
        torch_index_base="https://idx/whl",
        pip_index_url="https://pypi.example/simple",
    )
    assert plan.wheel_index == index
    assert plan.torch_floor == floor
    assert plan.venv == VENV and plan.python == f"{VENV}/bin/python"
    assert plan.commands[0] == (
        "/usr/bin/python3 -m venv --system-site-packages --without-pip /workspace/run/venv"
    )
    torch_cmds = [c for c in plan.commands if "/whl/" in c]
    if index is None:
        assert torch_cmds == []
    else:
        (cmd,) = torch_cmds
        assert f"--index-url https://idx/whl/{index} " in cmd
        spec = cmd.rsplit(" ", 1)[1].strip("'")
        assert spec.startswith("torch")
        assert SpecifierSet(spec[len("torch") :]) == SpecifierSet(torch_spec)
    others = [r for r in reqs if not r.startswith("torch")]
    if others:
        assert "--index-url https://pypi.example/simple" in plan.commands[-1]
        assert all(r.split(">")[0].split("=")[0] in plan.commands[-1] for r in others)
    # torch never comes from the plain index (it would bring a driver-blind CUDA build)
    assert (
        "torch" not in plan.commands[-1].split("simple", 1)[-1] or plan.commands[-1] in torch_cmds
    )


def test_nothing_to_install_uses_the_python_with_torch():
    report = image(**RUNPOD_21, driver="535.183.01", driver_cuda="12.2")
    report.pythons.insert(0, PythonProbe(path="/usr/local/bin/python3.8", version="3.8.10"))
    plan = plan_env(report, [])
    assert plan.commands == [] and plan.python == "/usr/bin/python3" and plan.venv is None
    assert plan.wheel_index is None


@pytest.mark.parametrize(
    ("report", "reqs", "match"),
    [
        (
            image(**RUNPOD_21, driver="515.65.01", driver_cuda="11.7"),
            ["transformers>=5.1"],
            r"driver \(515.65.01, CUDA 11.7\) is too old",
        ),
        (
            image(**RUNPOD_21, driver="535.183.01", driver_cuda="12.2"),
            ["torch>=2.8"],
            r"too old for torch >=2.8.*12.6",
        ),
        (image(**RUNPOD_21), ["transformers>=>5"], "bad requirement"),
        (
            EnvReport(pythons=[PythonProbe(path="python3", error="exit 127")]),
            ["peft"],
            "no working Python",
        ),
    ],
)
def test_impossible_plans_raise_before_installing(report, reqs, match):
    with pytest.raises(EnvError, match=match):
        plan_env(report, reqs, venv=VENV)


@pytest.mark.parametrize(
    ("floor", "spec", "expected_first"),
    [
        (None, "", None),
        ("2.6", "", None),
        ("2.8", "", "12.6"),
        ("2.9", "", "12.6"),
        ("2.4", "<2.5", None),
        ("2.8", "==2.8.0", "12.6"),
    ],
)
def test_allowed_cuda_versions(floor, spec, expected_first):
    got = allowed_cuda_versions_for(floor, spec)
    assert (got[0] if got else None) == expected_first
    if got:
        assert got == sorted(got, key=lambda v: tuple(map(int, v.split("."))))


def test_plan_feeds_allowed_cuda_versions():
    plan = plan_env(image(), ["torch>=2.8"], venv=VENV)
    assert plan.allowed_cuda_versions[0] == "12.6" and "11.8" not in plan.allowed_cuda_versions


class TestVerify:
    def _plan(self, driver_cuda=None):
        report = image(
            torch="2.1.0+cpu",
            transformers="4.46.3",
            driver_cuda=driver_cuda,
            driver="550.54.15" if driver_cuda else None,
        )
        return plan_env(report, ["transformers>=5.1"], venv=VENV)

    def _after(self, torch, cuda_available, tf_ok, driver_cuda=None):
        return EnvReport(
            driver_cuda=driver_cuda,
            pythons=[
                PythonProbe(
                    path=f"{VENV}/bin/python",
                    version="3.10.12",
                    torch=torch,
                    torch_cuda=None,
                    cuda_available=cuda_available,
                    transformers="5.20.0",
                    transformers_torch_ok=tf_ok,
                    imports={"transformers": "5.20.0", "torch": torch},
                )
            ],
        )

    def test_verified(self):
        plan = verify_env(self._plan(), self._after("2.6.0+cpu", False, True))
        assert plan.verified and plan.after is not None

    @pytest.mark.parametrize(
        ("torch", "cuda", "tf_ok", "driver_cuda", "match"),
        [
            ("2.5.1+cpu", False, True, None, "below the floor 2.6"),
            ("2.6.0+cpu", False, False, None, "still disables torch"),
            (None, None, None, None, "torch does not import"),
            ("2.6.0+cu124", False, True, "12.4", "reports no CUDA"),
        ],
    )
    def test_not_verified(self, torch, cuda, tf_ok, driver_cuda, match):
        with pytest.raises(EnvError, match=match):
            verify_env(self._plan(driver_cuda), self._after(torch, cuda, tf_ok, driver_cuda))


class TestVenvImages:
    """#13: when the image's Python is itself a venv, the pod venv did not see the
    image's packages (transformers missing), and the re-probe still said verified."""

    def _venv_image(self) -> EnvReport:
        report = image(torch="2.5.1+cpu", transformers="4.57.1", python="/opt/venv/bin/python")
        report.pythons[0].in_venv = True
        report.pythons[0].site_packages = ["/opt/venv/lib/python3.10/site-packages"]
        return report

    def test_the_pod_venv_inherits_a_venv_images_packages(self) -> None:
        plan = plan_env(self._venv_image(), ["peft"], venv=VENV)
        assert plan.commands[0].startswith("/opt/venv/bin/python -m venv --system-site-packages")
        pth = plan.commands[1]
        assert f"{VENV}/lib/python3.10/site-packages/_prefect_runpod_parent.pth" in pth
        assert 'site.addsitedir("/opt/venv/lib/python3.10/site-packages")' in pth
        assert plan.must_import == ["peft", "torch", "transformers"]

    def test_a_plain_base_python_needs_no_pth(self) -> None:
        plan = plan_env(image(torch="2.5.1+cpu", transformers="4.57.1"), ["peft"], venv=VENV)
        assert not any(".pth" in c for c in plan.commands)

    def test_a_package_that_does_not_import_fails_the_fix(self) -> None:
        plan = plan_env(self._venv_image(), ["peft"], venv=VENV)
        after = EnvReport(
            pythons=[
                PythonProbe(
                    path=plan.python,
                    version="3.10.12",
                    torch="2.5.1+cpu",
                    peft="0.13.2",
                    imports={"peft": "0.13.2", "torch": "2.5.1+cpu", "transformers": None},
                    import_errors={"transformers": "ModuleNotFoundError('transformers')"},
                )
            ]
        )
        with pytest.raises(EnvError, match=r"transformers does not import with .*ModuleNotFound"):
            verify_env(plan, after)


def test_a_python_without_torch_reads_as_missing_not_none():
    """The demo's pod has no torch: the plan's note says so in words (it printed
    ``torch None``)."""
    report = EnvReport(pythons=[PythonProbe(path="/usr/bin/python3", version="3.11.7")])
    plan = plan_env(report, [])
    assert plan.notes[0] == "base python /usr/bin/python3 (3.11.7, torch missing)"
    assert not any("None" in note for note in plan.notes)
