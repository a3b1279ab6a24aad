"""Device resolution (field guide: env var → config → auto-detect, CPU fallback, no
float64 on MPS)."""

from __future__ import annotations

import pytest

from prefect_runpod.tasks.device import resolve_device, safe_float_dtype


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
    ("device", "wanted", "expected"),
    [
        ("mps", "float64", "float32"),
        ("mps", "double", "float32"),
        ("mps", "bfloat16", "bfloat16"),
        ("cuda:0", "float64", "float64"),
        ("cpu", "float64", "float64"),
    ],
)
def test_safe_float_dtype_never_float64_on_mps(device, wanted, expected):
    assert safe_float_dtype(device, wanted) == expected
