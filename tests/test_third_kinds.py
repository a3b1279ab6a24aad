"""A provider and a publish kind defined only under tests/ (``tests/fixtures/third_kinds.py``)
run end to end with no change under flows/ or tasks/: the demo on the ``sandbox``
provider publishing to a ``dir:`` folder, then ``plan``, ``pods``, ``cost`` (with the
sandbox's own bill) and ``reaper --dry-run`` with it."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.registry import default_home
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.finetune import finetune
from tests.fixtures.third_kinds import SANDBOX_USD_PER_HR, SandboxProvider, read_json

pytestmark = pytest.mark.slow


def test_the_demo_runs_on_a_third_provider_and_publishes_to_a_third_kind(
    prefect_server: Any, third_kinds: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shelf = tmp_path / "shelf"
    out = tmp_path / "run"
    state = finetune(
        provider="sandbox", publish=f"dir:{shelf}", output_dir=str(out), return_state=True
    )
    assert state.is_completed(), state.message
    report = read_json(out / "run-report.json")
    assert report["provider"] == "sandbox" and report["passed"] and report["terminated"]
    assert report["pod"]["provider"] == "sandbox"
    assert SandboxProvider(home=default_home() / "sandbox").get(report["pod_id"]) is None
    # Published by the pod into the folder, each copy verified here.
    publish = report["publish"]
    assert publish["kind"] == "dir" and publish["verified"] and publish["files"]
    for sent in publish["files"]:
        copy = (shelf / sent["path"]).read_bytes()
        assert hashlib.sha256(copy).hexdigest() == sent["sha256"] and sent["storage"] == "file"
    assert {v["where"] for v in report["verified"]} == {"local", "dir"}
    # Priced at the sandbox's rate, and billed by the sandbox itself.
    cost = report["cost"]
    assert cost["cost_per_hr"] == SANDBOX_USD_PER_HR and cost["billed_seconds"] > 0
    assert cost["runpod_usd"] is not None and cost["billing_note"] == "the sandbox's own ledger"
    run_id = report["flow_run_id"]

    assert main(["cost", run_id, "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)["runs"]
    assert shown["provider"] == "sandbox" and shown["runpod_usd"] == cost["runpod_usd"]
    assert main(["cost", run_id, "--reconcile"]) == 0
    assert "sandbox" in capsys.readouterr().out

    code = main(["plan", "--provider", "sandbox", "--publish", f"dir:{shelf}", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0, plan
    assert plan["prices"][0]["usd_per_hr"] == SANDBOX_USD_PER_HR
    assert any("a local pod in gateway mode" in c["detail"] for c in plan["checks"])

    # A pod of no live run: listed by pods, and the reaper's dry run would end it.
    provider = SandboxProvider(home=default_home() / "sandbox", cost_per_hr=SANDBOX_USD_PER_HR)
    orphan = provider.create(
        PodRequest(public_key=generate_keypair().public_key), f"prft-{uuid.uuid4()}"
    )
    try:
        assert main(["pods", "--provider", "sandbox", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [p["pod_id"] for p in listed] == [orphan.pod_id]
        argv = ["reaper", "--provider", "sandbox", "--dry-run", "--ttl-seconds", "0.001"]
        assert main([*argv, "--json"]) == 0
        (decision,) = json.loads(capsys.readouterr().out)
        assert decision["pod_id"] == orphan.pod_id and decision["reap"] is True
        assert decision["terminated"] is False
        assert provider.get(orphan.pod_id) is not None, "a dry run ends nothing"
    finally:
        provider.terminate(orphan.pod_id)


def test_a_third_kind_is_refused_like_the_others_before_renting(
    third_kinds: None, tmp_path: Path
) -> None:
    """Its own parse rule, through the one validation path; and an option of another
    provider is refused for the sandbox as for any provider."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.flows.finetune import demo_bundle
    from prefect_runpod.tasks.preflight import validate_settings

    with pytest.raises(SpecError, match="needs an absolute folder"):
        validate_settings(bundle=demo_bundle(), output_dir=tmp_path, publish="dir:relative")
    with pytest.raises(SpecError, match="applies only to --provider local"):
        validate_settings(
            bundle=demo_bundle(), output_dir=tmp_path, provider="sandbox", local_mode="direct"
        )
    settings = validate_settings(
        bundle=demo_bundle(), output_dir=tmp_path, provider="sandbox", publish="dir:/tmp/x"
    )
    assert settings.provider == "sandbox" and settings.publish is not None
    assert settings.publish.kind == "dir"
