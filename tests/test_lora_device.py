"""The LoRA example's device choice (examples/lora-sft/device.py): env var → request →
config → auto-detect, CPU fallback, bfloat16 on CUDA, no float64 on MPS. The module
ships in the bundle, so it is loaded from there, as the pod loads it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_DEVICE_PY = Path(__file__).resolve().parents[1] / "examples" / "lora-sft" / "device.py"
_spec = importlib.util.spec_from_file_location("lora_sft_device", _DEVICE_PY)
assert _spec is not None and _spec.loader is not None
device = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = device  # dataclasses look their module up there
_spec.loader.exec_module(device)
resolve_device, dtype_name = device.resolve_device, device.dtype_name


@pytest.mark.parametrize(
    ("env", "requested", "config", "cuda", "mps", "device", "reason", "warns"),
    [
        ({}, None, None, True, False, "cuda", "auto-detect", False),
        ({}, None, None, False, True, "mps", "auto-detect", False),
        ({}, None, None, False, False, "cpu", "auto-detect", False),
        ({}, None, None, True, True, "cuda", "auto-detect", False),
        ({"DEVICE": "cpu"}, "cuda", "mps", True, True, "cpu", "env DEVICE=cpu", False),
        ({"DEVICE": "auto"}, None, "mps", True, True, "mps", "config=mps", False),
        ({}, "cuda:1", "mps", True, True, "cuda:1", "requested=cuda:1", False),
        ({}, None, {"device": "MPS"}, True, True, "mps", "config=mps", False),
        ({}, None, {"device": "auto"}, False, True, "mps", "auto-detect", False),
        ({}, "cuda", None, False, True, "cpu", "requested=cuda", True),
        ({"DEVICE": "mps"}, None, None, True, False, "cpu", "env DEVICE=mps", True),
    ],
)
def test_resolution_order_and_fallback(env, requested, config, cuda, mps, device, reason, warns):
    got = resolve_device(
        requested, config=config, cuda_available=cuda, mps_available=mps, environ=env
    )
    assert (got.device, got.reason) == (device, reason)
    assert (got.warning is not None) == warns
    if warns:
        assert "not available" in got.warning


def test_custom_env_var_name():
    got = resolve_device(
        env_var="MY_DEVICE",
        environ={"MY_DEVICE": "mps", "DEVICE": "cpu"},
        cuda_available=False,
        mps_available=True,
    )
    assert got.device == "mps"
    assert got.kind == "mps"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "mps:0", "tpu"])
def test_unknown_device_is_refused(bad):
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(bad, cuda_available=True, mps_available=True, environ={})


@pytest.mark.parametrize(
    ("name", "wanted", "expected"),
    [
        ("mps", "float64", "float32"),
        ("mps", "double", "float32"),
        ("mps", "bfloat16", "bfloat16"),
        ("cuda:0", "float64", "float64"),
        ("cpu", "float64", "float64"),
    ],
)
def test_dtype_never_float64_on_mps(name, wanted, expected):
    assert dtype_name(name, wanted) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("cuda", "bfloat16"), ("cuda:1", "bfloat16"), ("mps", "float32"), ("cpu", "float32")],
)
def test_default_dtype_is_bfloat16_on_cuda_only(name, expected):
    """What the example used before the choice moved here: bfloat16 on a GPU, else float32."""
    assert dtype_name(name) == expected


def test_without_torch_or_hints_it_is_cpu(monkeypatch):
    monkeypatch.setattr(device, "_probe_torch", lambda: (False, False))
    got = resolve_device(environ={})
    assert (got.device, got.reason, got.warning) == ("cpu", "auto-detect", None)
