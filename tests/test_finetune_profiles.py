"""``prefect-runpod finetune --local-image P`` passes for every shipped image profile:
the whole demo run (every stage, through the CLI) on a pod whose login environment is
a real image's (#13). One lean run per profile; the console and transfer tests cover
the details. ``plain`` is the default pod, whose CLI run is
``tests/test_finetune_e2e.py::test_cli_json_report``."""

from __future__ import annotations

import json

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.flows.cli import main
from prefect_runpod.tasks.models import STAGES
from tests.fixtures.local_pod import IMAGE_PROFILES

pytestmark = pytest.mark.slow

_IMAGE_PYTHON = {
    "runpod-pytorch": "2.1.0+cu118",  # the image's python3 has torch; `python` has not
    "venv-python": "2.5.1+cpu",
}


@pytest.mark.parametrize("profile", [p for p in IMAGE_PROFILES if p != "plain"])
def test_the_demo_passes_on_every_image_profile(
    profile: str, prefect_server, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["finetune", "--local-image", profile, "--output-dir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    data = json.loads(out[out.index("{") :])
    assert code == 0, data.get("error")
    assert [s["name"] for s in data["stages"]] == ["preflight", *STAGES]
    assert all(s["state"] in ("Completed", "Skipped") for s in data["stages"]), data["stages"]
    assert data["passed"] and data["terminated"]
    assert data["download"]["verified"] and data["parity"]["verdict"] == "pass"
    pythons = data["env"]["before"]["pythons"]
    if profile in _IMAGE_PYTHON:
        assert any(p.get("torch") == _IMAGE_PYTHON[profile] for p in pythons), pythons
    assert LocalPodProvider().get(data["pod_id"]) is None
