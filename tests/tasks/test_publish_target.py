"""The publish target and the download choice (issue 17, items 1 and 5): parsed and
refused before anything is rented, and the stage order that puts ``publish`` between
``eval_parity`` and ``download`` everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.flows.cli import build_parser
from prefect_runpod.flows.finetune import demo_bundle
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import STAGES
from prefect_runpod.tasks.preflight import validate_settings
from prefect_runpod.tasks.publish_target import (
    asset_key,
    check_download_choice,
    parse_publish_target,
    s3_prefix_for,
)

ROOT = Path(__file__).resolve().parents[2]


class TestParsePublishTarget:
    def test_hub_repo_private_by_default(self) -> None:
        target = parse_publish_target("hf:demo/tiny-classifier")
        assert target is not None
        assert (target.kind, target.repo_id, target.revision, target.private) == (
            "hf",
            "demo/tiny-classifier",
            None,
            True,
        )
        assert target.branch == "main"
        assert asset_key(target) == "hf://demo/tiny-classifier"

    def test_branch_and_public(self) -> None:
        target = parse_publish_target("hf:demo/tiny@exp/lr-3e-4", public=True)
        assert target is not None
        assert target.revision == "exp/lr-3e-4" and target.branch == "exp/lr-3e-4"
        assert target.private is False

    def test_s3_needs_the_s3_target_block_and_defaults_its_prefix(self) -> None:
        with pytest.raises(SpecError, match="--s3-target"):
            parse_publish_target("s3")
        target = parse_publish_target("s3", s3_target_block="vol")
        assert target is not None and target.prefix is None
        assert s3_prefix_for(target, "run-1") == "prefect-runpod/run-1"
        named = parse_publish_target("s3:models/tickets/", s3_target_block="vol")
        assert named is not None and named.prefix == "models/tickets"
        assert s3_prefix_for(named, "run-1") == "models/tickets"
        assert asset_key(named, bucket_uri="s3://b/models/tickets/") == "s3://b/models/tickets"

    def test_nothing_to_publish(self) -> None:
        assert parse_publish_target(None) is None
        assert parse_publish_target("  ") is None

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            ("hf:tiny", "must name the namespace and the repo"),
            ("hf:", "names no repo"),
            ("hf:a/b/c", "must name the namespace"),
            ("hf:demo/bad--name", "Cannot have -- or"),
            ("hf:demo/-dash", "is not a Hugging Face repo id"),
            ("hf:demo/ok@a..b", "not a branch name"),
            ("hf:demo/ok@exp.lock", "may not end with"),
            ("hf:demo/ok@", "not a branch name"),
            ("s3:", "empty prefix"),
            ("s3:../up", "no '..'"),
            ("gs:bucket", "is not one of"),
            ("demo/tiny", "is not one of"),
        ],
    )
    def test_bad_targets_name_the_problem(self, spec: str, message: str) -> None:
        with pytest.raises(SpecError, match=re.escape(message)):
            parse_publish_target(spec, s3_target_block="vol")

    def test_public_without_a_hub_target(self) -> None:
        with pytest.raises(SpecError, match="needs --publish hf:ORG/REPO"):
            parse_publish_target(None, public=True)
        with pytest.raises(SpecError, match="bucket's policy"):
            parse_publish_target("s3", public=True, s3_target_block="vol")


class TestDownloadChoice:
    def test_none_needs_a_publish_target(self) -> None:
        with pytest.raises(SpecError, match="publish it"):
            check_download_choice("none", None)
        target = parse_publish_target("hf:demo/x")
        assert check_download_choice("none", target) == "none"
        assert check_download_choice("eval", None) == "eval"

    def test_unknown_choice(self) -> None:
        with pytest.raises(SpecError, match="is not one of: all, eval, none"):
            check_download_choice("some", None)


def _settings(**kw: object):  # type: ignore[no-untyped-def]
    base: dict[str, object] = {
        "bundle": demo_bundle(),
        "provider": "local",
        "model_id": None,
        "transfer_method": "auto",
        "max_cost_usd": None,
        "max_runtime_seconds": 60.0,
        "name_prefix": "prft",
        "output_dir": "/tmp/x",
        "parity_tolerance": 0.02,
    }
    base.update(kw)
    return validate_settings(**base)  # type: ignore[arg-type]


def test_validate_settings_carries_the_target_and_refuses_before_spend() -> None:
    settings = _settings(publish="hf:demo/tiny-classifier", download="none")
    assert settings.publish is not None and settings.publish.repo_id == "demo/tiny-classifier"
    assert settings.download == "none"
    with pytest.raises(SpecError, match="--download none leaves the model only on the pod"):
        _settings(download="none")
    with pytest.raises(SpecError, match="--s3-target"):
        _settings(publish="s3")


def test_publish_sits_between_eval_parity_and_download_everywhere() -> None:
    assert STAGES.index("publish") == STAGES.index("eval_parity") + 1
    assert STAGES.index("download") == STAGES.index("publish") + 1
    order = ", ".join(("preflight", *STAGES))
    assert [s.name for s in RunReport().stages] == ["preflight", *STAGES]
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert order in doc
    assert "## Publish from the pod" in doc
    assert ", ".join(STAGES) in " ".join((build_parser().description or "").split())


def test_cli_takes_publish_and_download() -> None:
    args = build_parser().parse_args(
        ["finetune", "--publish", "hf:demo/tiny-classifier", "--download", "none"]
    )
    assert (args.publish, args.download, args.publish_public) == (
        "hf:demo/tiny-classifier",
        "none",
        False,
    )
    assert build_parser().parse_args(["finetune"]).download == "all"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["finetune", "--download", "half"])
