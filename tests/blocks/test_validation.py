"""The one validation layer (blocks/validation/): each rule as a plain function, and the
places that share it (the spec block, the dead-man settings) agreeing with it."""

from __future__ import annotations

import math
import os

import pytest
from pydantic import ValidationError

from prefect_runpod.blocks import validation as v
from prefect_runpod.blocks.exceptions import SpecError


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0, -1, 100_001, True, "2", None])
def test_budget_refuses_nonsense_and_says_what_to_give(bad):
    with pytest.raises(SpecError) as info:
        v.check_number("max_cost_usd", bad)
    text = str(info.value)
    assert text.startswith("max_cost_usd (--max-cost-usd) must be a finite number of USD")
    assert "e.g. --max-cost-usd 2" in text and "\n" not in text


def test_numbers_in_range_pass_and_optional_none_is_none():
    assert v.check_number("max_cost_usd", 2) == 2.0
    assert v.check_number("max_cost_usd", None, optional=True) is None
    assert v.check_number("parity_tolerance", 0) == 0.0
    with pytest.raises(SpecError, match="below 1"):
        v.check_number("parity_tolerance", 1)
    assert v.check_number("local_cost_per_hr", 0.22) == pytest.approx(0.22)


def test_every_rule_names_a_unit_or_a_fraction_and_an_example():
    for rule in v.NUMBER_RULES.values():
        assert rule.unit in ("USD", "USD/h", "s", ""), rule
        assert rule.example and float(rule.example) and rule.fits(float(rule.example)), rule


def test_constrained_type_carries_the_rule_into_pydantic_models():
    from prefect_runpod.blocks.provider import DeadmanConfig

    with pytest.raises(ValidationError) as info:
        DeadmanConfig(heartbeat_stale_seconds=math.nan)
    assert "heartbeat_stale_seconds (--heartbeat-stale-seconds) must be a finite" in str(info.value)
    with pytest.raises(ValidationError, match="pod_lifetime_seconds"):
        DeadmanConfig(lifetime_seconds=-5)
    assert DeadmanConfig(heartbeat_stale_seconds=2).heartbeat_stale_seconds == 2.0


def test_one_name_prefix_limit_for_preflight_and_the_spec_block():
    from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec

    longest = "p" * v.NAME_PREFIX_MAX_CHARS
    assert v.NAME_PREFIX_MAX_CHARS == 23
    assert v.check_name_prefix(longest) == longest
    assert RunPodPodSpec(name_prefix=longest).pod_name("0" * 36)  # fits RunPod's 60
    for bad in (longest + "p", "Prft", "9lives", "", "a_b", "prft\n"):
        with pytest.raises(SpecError, match="1-23 lowercase letters"):
            v.check_name_prefix(bad)
        with pytest.raises(ValidationError, match="1-23 lowercase letters"):
            RunPodPodSpec(name_prefix=bad)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("not-a-url", "must start with http:// or https://"),
        ("ftp://hub.example", "must start with http:// or https://"),
        ("https://", "names no host"),
        ("https://user:pw@hub.example", "carries credentials"),
        ("https://hub.example:99999", "invalid port"),
        ("https://hub example", "is not a URL"),
        ("https://hub.example\n", "is not a URL"),
        ("http://[::1", "is not a URL"),  # urlsplit's own ValueError, not a traceback
    ],
)
def test_urls_are_well_formed(url, problem):
    with pytest.raises(SpecError, match=problem):
        v.check_url(url, "hf_endpoint")


def test_a_url_is_returned_without_its_trailing_slash():
    assert v.check_url("https://hub.example:8443/mirror/", "hf_endpoint") == (
        "https://hub.example:8443/mirror"
    )


def test_a_url_holding_a_token_is_not_repeated():
    token = "hf_" + "Q" * 34
    with pytest.raises(SpecError) as info:
        v.check_url(f"ftp://x/{token}", "hf_endpoint")
    assert token not in str(info.value) and "<hidden>" in str(info.value)


def test_output_dir_must_be_a_writable_directory(tmp_path):
    assert v.check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(SpecError, match="is a file, not a directory"):
        v.check_output_dir(a_file)
    with pytest.raises(SpecError, match=r"lies under .*file, which is a file"):
        v.check_output_dir(a_file / "sub")
    with pytest.raises(SpecError, match="is not writable"):
        v.check_output_dir("/proc/prefect-runpod-out")
    assert not list(tmp_path.glob(".prefect-runpod-probe-*")), "the probe file is removed"


def test_env_names_and_a_token_given_as_the_name():
    assert v.check_env_name("HF_TOKEN") == "HF_TOKEN"
    with pytest.raises(SpecError, match="not an environment variable name"):
        v.check_env_name("1BAD")
    token = "hf_" + "a1" * 17
    with pytest.raises(SpecError) as info:
        v.check_env_name(token)
    assert "looks like a token itself" in str(info.value) and token not in str(info.value)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("hf_" + "aB3" * 12, "a Hugging Face token"),
        ("api_org_" + "x" * 30, "a Hugging Face org API token"),
        ("rpa_" + "A1" * 16, "a RunPod API key"),
        ("rps_" + "z9" * 16, "a RunPod S3 secret key"),
        ("AKIA" + "ABCDEFGHIJKLMNOP", "an AWS access key id"),
        ("ghp_" + "a" * 36, "a GitHub token"),
        ("github_pat_" + "a_" * 15, "a GitHub token"),
        ("sk-proj-" + "x" * 30, "an OpenAI-style API key"),
        ("xoxb-1234567890-abc", "a Slack token"),
        ("AIza" + "B" * 35, "a Google API key"),
    ],
)
def test_token_shapes_are_found_inside_text(text, what):
    assert v.find_token_shape(f"key = '{text}' # note") == what


@pytest.mark.parametrize(
    "text", ["hf_hub_download", "meta-llama/Llama-3.2-1B", "risk-assessment", "AKIA", "task-1"]
)
def test_ordinary_text_is_not_a_token(text):
    assert v.find_token_shape(text) is None


def test_a_token_in_any_parameter_is_refused_without_repeating_it():
    token = "hf_" + "T" * 34
    with pytest.raises(SpecError) as info:
        v.refuse_secret_values({"model_id": "org/m", "gpu_type_ids": ["x", f"a {token}"]})
    text = str(info.value)
    assert "gpu_type_ids (--gpu-type)" in text and "Hugging Face token" in text
    assert token not in text and "rotate" in text
    v.refuse_secret_values({"model_id": "org/m", "bundle": "/srv/bundles/x"})


@pytest.mark.parametrize("odd", ["\n", " ", "\t", "\r\n"])
def test_a_token_with_whitespace_inside_is_still_a_token_in_a_parameter(odd):
    """Issue 21: the shape of a token never hides it (a copy-paste that split it)."""
    head, tail = "hf_" + "T" * 10, "U" * 24
    with pytest.raises(SpecError, match="concurrency_limit.*a Hugging Face token") as info:
        v.refuse_secret_values({"concurrency_limit": f"{head}{odd}{tail}"})
    assert head not in str(info.value) and tail not in str(info.value)


def test_options_of_the_other_provider_are_refused():
    v.check_provider_options("local", {"local_mode": "direct", "gpu_type_ids": []})
    v.check_provider_options("runpod", {"gpu_type_ids": ["NVIDIA GeForce RTX 3090"]})
    with pytest.raises(
        SpecError, match=r"gpu_type_ids \(--gpu-type\) applies only to --provider runpod"
    ):
        v.check_provider_options("local", {"gpu_type_ids": ["X"]})
    with pytest.raises(SpecError, match=r"local_cost_per_hr .* only to --provider local"):
        v.check_provider_options("runpod", {"local_cost_per_hr": 0.0})
    with pytest.raises(SpecError, match="is not one of: local, runpod"):
        v.check_provider_options("aws", {})


def test_secret_env_names_are_one_rule_for_blocks_and_pods():
    from prefect_runpod.blocks.runpod.blocks import validate_env

    for name in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "db_password", "WANDB_API_KEY"):
        assert v.SECRET_ENV_NAME.fullmatch(name)
        with pytest.raises(SpecError, match="looks like a secret"):
            validate_env({name: "x"})
    assert validate_env({"PUBLIC_KEY": "ssh-ed25519 AAAA", "EPOCHS": "3"})
    with pytest.raises(SpecError, match="looks like a token"):
        validate_env({"NOTE": "rpa_" + "Z" * 30})


def test_block_names_follow_prefect_rules():
    assert v.check_block_name("my-spec-2", "runpod_spec_block") == "my-spec-2"
    for bad in ("My_Spec", "", "spec/x", "a b", "-lead\n"):
        with pytest.raises(
            SpecError, match=r"runpod_spec_block \(--runpod-spec\) .* not a block name"
        ):
            v.check_block_name(bad, "runpod_spec_block")


@pytest.mark.slow
def test_a_missing_block_is_named_with_the_saved_ones_listed(prefect_server):
    from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec

    RunPodPodSpec(gpu_type_ids=["NVIDIA RTX A5000"], max_usd_per_hour=0.3).save(
        "capped-a5000", overwrite=True
    )
    loaded = v.load_block(RunPodPodSpec, "capped-a5000", "runpod_spec_block")
    assert loaded.max_usd_per_hour == pytest.approx(0.3)
    with pytest.raises(SpecError) as info:
        v.load_block(RunPodPodSpec, "capped-a500", "runpod_spec_block")
    text = str(info.value)
    assert (
        "no RunPodPodSpec block is named 'capped-a500' (runpod_spec_block (--runpod-spec))" in text
    )
    assert "saved RunPodPodSpec blocks: " in text and "capped-a5000" in text
    assert v.saved_block_names(RunPodPodSpec) == sorted(v.saved_block_names(RunPodPodSpec))


def test_the_module_is_light():
    """Blocks, the daemon's siblings and the CLI import it before Prefect is needed."""
    import subprocess
    import sys

    code = (
        "import sys, prefect_runpod.blocks.validation as v; "
        "print('prefect' in sys.modules, 'prefect_runpod.blocks.runpod.blocks' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.stdout.split() == ["False", "False"], out.stderr
