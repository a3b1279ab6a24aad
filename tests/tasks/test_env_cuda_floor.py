"""The CUDA floor sent as RunPod's allowedCudaVersions comes from the bundle's
requirements before any pod exists (docs/architecture.md#env-fix-and-hugging-face-diagnosis)."""

from __future__ import annotations

import pytest

from prefect_runpod.blocks.exceptions import EnvError
from prefect_runpod.tasks.env_plan import cuda_floor_for_requirements


@pytest.mark.parametrize(
    ("requirements", "expected_first"),
    [
        ([], None),  # no torch needed: any host
        (["requests>=2"], None),
        (["transformers>=4.46", "peft>=0.13"], None),  # torch 2.6 exists on cu118: any host
        (["torch>=2.8"], "12.6"),  # cu118 ends at torch 2.7.x
        (["torch>=2.9"], "12.6"),
    ],
)
def test_floor_from_requirements(requirements, expected_first):
    floor = cuda_floor_for_requirements(requirements)
    if expected_first is None:
        assert floor == []
    else:
        assert floor[0] == expected_first
        assert "11.8" not in floor


def test_torch_that_no_index_offers_is_refused_before_renting():
    with pytest.raises(EnvError, match="no PyTorch CUDA index"):
        cuda_floor_for_requirements(["torch>=9.0"])


def test_bad_requirement_is_named():
    with pytest.raises(EnvError, match="not valid"):
        cuda_floor_for_requirements(["torch>=>2"])
