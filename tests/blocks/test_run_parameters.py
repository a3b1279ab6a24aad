"""One declaration per run parameter (``blocks/validation/parameters.py``): the flow's
signature and docs, the deployment's parameter schema, the CLI's options, the error
labels, the number rules and the preflight defaults all agree with it, and importing it
costs neither Prefect nor paramiko."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.validation import parameters as run_parameters
from prefect_runpod.blocks.validation.parameters import FINETUNE_PARAMETERS

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy"


def _schema(flow_fn: Any) -> dict[str, Any]:
    from prefect.utilities.callables import parameter_schema

    return dict(parameter_schema(flow_fn).model_dump())


def _without_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(schema))
    for prop in out["properties"].values():
        prop.pop("description", None)
    return out


@pytest.mark.parametrize("which", ["finetune", "reaper"])
def test_the_deployments_parameter_schema_is_what_it_was(which: str) -> None:
    """Names, positions, types, enums and defaults as before; only the descriptions may
    change (the flow's docs now come from the table), and none may be missing. A
    parameter added since comes after them all, with a default (nothing required)."""
    from prefect_runpod.flows.finetune import finetune
    from prefect_runpod.flows.reaper import reaper

    flow = {"finetune": finetune, "reaper": reaper}[which]
    before = json.loads((LEGACY / f"{which}-parameter-schema.json").read_text())
    deployed = flow.to_deployment(f"schema-{which}")._parameter_openapi_schema.model_dump()
    now, then = _without_descriptions(deployed), _without_descriptions(before)
    added = {k: v for k, v in now["properties"].items() if k not in then["properties"]}
    last = max(v["position"] for v in then["properties"].values())
    assert all(v["position"] > last and "default" in v for v in added.values()), added
    now["properties"] = {k: v for k, v in now["properties"].items() if k not in added}
    assert now == then
    if which == "finetune":
        assert all(p.get("description") for p in deployed["properties"].values())


def test_the_flow_signature_is_the_table() -> None:
    from prefect_runpod.flows.finetune import finetune

    signature = inspect.signature(finetune.fn).parameters
    assert list(signature) == [p.name for p in FINETUNE_PARAMETERS]
    for p in FINETUNE_PARAMETERS:
        written = str(signature[p.name].annotation).replace("'", '"')
        assert written == p.annotation, p.name
        assert signature[p.name].default == p.default, p.name


def test_the_flow_docs_are_the_help_texts() -> None:
    from prefect_runpod.flows.finetune import finetune

    props = _schema(finetune.fn)["properties"]
    for p in FINETUNE_PARAMETERS:
        assert " ".join(props[p.name]["description"].split()) == " ".join(p.help.split())
    assert "Returns:" in (finetune.fn.__doc__ or "") and "Raises:" in (finetune.fn.__doc__ or "")


def test_every_default_is_a_named_constant() -> None:
    named = {
        name: getattr(run_parameters, name)
        for name in run_parameters.__all__
        if name.startswith("DEFAULT_")
    }
    for p in FINETUNE_PARAMETERS:
        if p.default not in (None, False):
            assert p.default in named.values(), p.name


def test_the_cli_options_come_from_the_table() -> None:
    from prefect_runpod.flows.cli import build_parser
    from prefect_runpod.flows.cli.launch import finetune_params

    assert finetune_params(build_parser().parse_args(["finetune"])) == run_parameters.defaults()
    argv = ["finetune", "--max-cost-usd", "2", "--pty-streams", "3", "--publish-public"]
    argv += ["--gpu-type", "A", "--gpu-type", "B", "--download", "eval", "--local-mode", "direct"]
    params = finetune_params(build_parser().parse_args(argv))
    assert params["max_cost_usd"] == 2.0 and params["pty_streams"] == 3
    assert params["publish_public"] is True and params["gpu_type_ids"] == ["A", "B"]
    assert (params["download"], params["local_mode"]) == ("eval", "direct")
    for p in FINETUNE_PARAMETERS:
        assert v.label(p.name) == f"{p.name} ({p.option})"


def test_the_number_rules_are_the_declared_ones() -> None:
    for p in run_parameters.number_parameters():
        rule = v.NUMBER_RULES[p.name]
        assert (rule.unit, rule.meaning, rule.example) == (p.unit, p.meaning, p.example)
        assert (rule.gt, rule.ge, rule.lt, rule.le, rule.whole) == (p.gt, p.ge, p.lt, p.le, p.whole)


def test_run_settings_default_as_the_table_does() -> None:
    from prefect_runpod.tasks.preflight import RunSettings

    for name, field in RunSettings.model_fields.items():
        if not field.is_required() and name in run_parameters.defaults():
            assert field.default == run_parameters.parameter(name).default, name


def test_validate_settings_takes_only_the_flows_parameters(tmp_path: Path) -> None:
    from prefect_runpod.flows.finetune import demo_bundle
    from prefect_runpod.tasks.preflight import validate_settings

    with pytest.raises(TypeError, match="hf_token"):
        validate_settings(bundle=demo_bundle(), output_dir=tmp_path, hf_token="x")
    settings = validate_settings(bundle=demo_bundle(), output_dir=tmp_path, parity_warn_only=True)
    assert settings.terminate_timeout_seconds == run_parameters.DEFAULT_TERMINATE_TIMEOUT_SECONDS


def test_importing_the_table_costs_neither_prefect_nor_paramiko() -> None:
    code = (
        "import sys; import prefect_runpod.blocks.validation.parameters as p; "
        "p.FINETUNE_PARAMETERS[0].cli_help; "
        "print(sorted(m for m in ('prefect', 'paramiko') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
