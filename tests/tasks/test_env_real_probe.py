"""The planner on a probe captured from a real GPU pod image (an NVIDIA H200 with
driver 580.159.04 / CUDA 13.0 and torch 2.11.0+cu130 in /opt/torch/.venv), not a
hand-written fixture: ``tests/data/probe_h200_cu130.json`` is ``probe.py``'s output."""

from __future__ import annotations

from pathlib import Path

from prefect_runpod.tasks.env import parse_probe_output
from prefect_runpod.tasks.env_plan import plan_env

PROBE = (Path(__file__).resolve().parents[1] / "data" / "probe_h200_cu130.json").read_text()


def test_the_real_probe_parses():
    report = parse_probe_output(PROBE)
    assert (report.driver_version, report.driver_cuda) == ("580.159.04", "13.0")
    assert report.gpu_name == "NVIDIA H200" and report.vram_mib and report.vram_mib > 140_000
    with_torch = [p for p in report.pythons if p.torch]
    assert [p.path for p in with_torch] == ["/opt/torch/.venv/bin/python"]
    assert with_torch[0].cuda_available is True and with_torch[0].transformers_torch_ok is True


def test_training_runs_on_the_python_that_has_torch_and_keeps_its_torch():
    plan = plan_env(parse_probe_output(PROBE), ["transformers>=5.1", "peft>=0.13"], venv="/w/venv")
    assert plan.commands[0].startswith("/opt/torch/.venv/bin/python -m venv --system-site-packages")
    assert plan.wheel_index is None  # torch 2.11 already clears transformers' 2.5 floor
    assert not any("download.pytorch.org" in c for c in plan.commands)


def test_a_newer_torch_comes_from_the_index_the_driver_allows():
    plan = plan_env(parse_probe_output(PROBE), ["torch>=2.12"], venv="/w/venv")
    assert plan.wheel_index == "cu130"
    assert any("https://download.pytorch.org/whl/cu130" in c for c in plan.commands)
