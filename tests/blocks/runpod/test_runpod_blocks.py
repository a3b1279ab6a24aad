"""The RunPod blocks: descriptions (BlockStandardTestSuite-style), validation that
fails before any request, secrets that never show, and the SSH key helpers."""

from __future__ import annotations

import re

import pytest
from prefect.blocks.core import Block
from pydantic import SecretStr, ValidationError

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.runpod.blocks import (
    DEFAULT_IMAGE,
    RunPodCredentials,
    RunPodPodSpec,
    merge_cuda_versions,
    validate_env,
    validate_pod_name,
)
from prefect_runpod.blocks.runpod.client import graphql_escape
from prefect_runpod.blocks.runpod.ssh_key import (
    RunPodSSHKey,
    key_in_authorized,
    normalise_public_key,
)

BLOCKS = [RunPodCredentials, RunPodPodSpec, RunPodSSHKey]


@pytest.mark.parametrize("block", BLOCKS)
class TestBlockStandards:
    """The checks of Prefect's BlockStandardTestSuite that need no network."""

    def test_has_a_description(self, block: type[Block]) -> None:
        assert block.get_description()

    def test_has_a_documentation_url(self, block: type[Block]) -> None:
        assert block._documentation_url

    def test_all_fields_have_a_description(self, block: type[Block]) -> None:
        for name, field in block.model_fields.items():
            assert field.description, f"{block.__name__}.{name} has no description"
            assert field.description.endswith("."), f"{block.__name__}.{name}"

    def test_has_a_valid_code_example(self, block: type[Block]) -> None:
        example = block.get_code_example()
        assert example is not None
        assert re.search(rf"from .* import {block.__name__}", example)
        assert re.search(rf'.* = {block.__name__}\.load\("BLOCK_NAME"\)', example)


class TestCredentials:
    def test_key_never_shows(self) -> None:
        credentials = RunPodCredentials(api_key="rpa_SENTINEL_KEY")
        client = credentials.get_client()
        for text in (
            repr(credentials),
            str(credentials),
            repr(client),
            repr(RunPodCredentials(api_key="rpa_SENTINEL_KEY", api="v2").get_api()),
            repr(RunPodCredentials(api_key="rpa_SENTINEL_KEY", api="graphql").get_api()),
            credentials.model_dump_json(),
        ):
            assert "SENTINEL" not in text

    def test_one_setting_chooses_the_api(self) -> None:
        from prefect_runpod.blocks.runpod.api import DEFAULT_API, RunPodApi

        assert RunPodCredentials(api_key="k").get_api().name == DEFAULT_API
        for name in ("v2", "graphql"):
            api = RunPodCredentials(api_key="k", api=name).get_api()
            assert isinstance(api, RunPodApi) and api.name == name
        with pytest.raises(ValidationError):
            RunPodCredentials(api_key="k", api="v1")

    def test_the_base_url_has_no_path(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("RUNPOD_API_BASE_URL", raising=False)
        v2 = RunPodCredentials(api_key="k", api="v2")
        assert v2.get_api().base_url == "https://api.runpod.io"  # type: ignore[attr-defined]
        there = RunPodCredentials(api_key="k", api="v2", api_base_url="http://127.0.0.1:9")
        assert there.get_api().base_url == "http://127.0.0.1:9"  # type: ignore[attr-defined]
        with pytest.raises(ValidationError, match="has a path"):
            RunPodCredentials(api_key="k", api_base_url="https://api.runpod.io/v2")

    def test_rest_base_url_is_accepted_only_to_warn(self) -> None:
        with pytest.warns(DeprecationWarning, match="rest_base_url is obsolete"):
            old = RunPodCredentials(api_key="k", rest_base_url="https://rest.runpod.io/v1")
        assert old.api_base_url is None


class TestPodSpec:
    def test_defaults(self) -> None:
        spec = RunPodPodSpec()
        assert spec.image_name == DEFAULT_IMAGE
        assert spec.gpu_type_ids[0] == "NVIDIA GeForce RTX 3090"
        assert (spec.ports, spec.name_prefix, spec.cloud_type) == ("22/tcp", "prft", "SECURE")

    @pytest.mark.parametrize(
        "fields",
        [
            {"gpu_type_ids": []},
            {"gpu_type_ids": ['RTX" }) { id } } #']},
            {"image_name": 'img"; drop'},
            {"ports": "22/tcp;rm"},
            {"env": {"BAD-NAME": "x"}},
            {"env": {"HF_TOKEN": "hf_abc"}},
            {"data_center_ids": ["EU RO 1"]},
            {"allowed_cuda_versions": ["twelve"]},
            {"name_prefix": "Has Spaces"},
            {"name_prefix": "x" * 24},
            {"cloud_type": "MOON"},
            {"max_usd_per_hour": -1},
        ],
    )
    def test_bad_fields_fail_at_construction(self, fields: dict) -> None:
        with pytest.raises(ValidationError):
            RunPodPodSpec(**fields)

    def test_pod_name(self) -> None:
        run_id = "0b6f5d8e-4c4f-4a53-9a1e-5a2b7c9d1e00"
        assert RunPodPodSpec(name_prefix="ft").pod_name(run_id) == f"ft-{run_id}"


class TestValidation:
    @pytest.mark.parametrize("name", ['a" }) { id } } #', "", "x" * 61, "-lead", "a\nb"])
    def test_unsafe_pod_names(self, name: str) -> None:
        with pytest.raises(SpecError, match="pod name"):
            validate_pod_name(name)

    @pytest.mark.parametrize(
        ("env", "match"),
        [
            ({"A": "x\x00y"}, "NUL"),
            ({"HF_TOKEN": "x"}, "secret"),
            ({"MY_API_KEY": "x"}, "secret"),
            ({"NOTE": "token hf_" + "a" * 30}, "token"),
            ({"1BAD": "x"}, "env name"),
        ],
    )
    def test_bad_env(self, env: dict[str, str], match: str) -> None:
        with pytest.raises(SpecError, match=match):
            validate_env(env)

    def test_secret_values_never_echoed(self) -> None:
        token = "hf_" + "S" * 30
        with pytest.raises(SpecError) as info:
            validate_env({"NOTE": token})
        assert token not in str(info.value)

    def test_plain_env_with_quotes_passes(self) -> None:
        assert validate_env({"MSG": 'say "hi"\n'}) == {"MSG": 'say "hi"\n'}

    def test_graphql_escape(self) -> None:
        assert graphql_escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'

    def test_cuda_merge_is_an_intersection(self) -> None:
        assert merge_cuda_versions(["12.4", "12.6", "12.8"], ["12.8", "12.6"]) == ["12.6", "12.8"]
        assert merge_cuda_versions([], ["12.8"]) == ["12.8"]
        with pytest.raises(SpecError, match="share none"):
            merge_cuda_versions(["11.8"], ["12.8"])


class TestSSHKey:
    def test_generated_key_is_ed25519_and_consistent(self) -> None:
        from prefect_runpod.blocks.keys import public_key_line

        block = RunPodSSHKey.generate(comment="ft")
        assert block.get_public_key().startswith("ssh-ed25519 ")
        derived = public_key_line(block.get_private_key(), comment="ft")
        assert derived == block.get_public_key()

    def test_public_key_derived_when_absent(self) -> None:
        block = RunPodSSHKey.generate()
        bare = RunPodSSHKey(private_key=block.private_key)
        assert key_in_authorized(block.get_public_key(), bare.get_public_key())

    def test_key_from_path(self, tmp_path) -> None:
        block = RunPodSSHKey.generate()
        path = tmp_path / "id_ed25519"
        assert block.private_key is not None
        path.write_text(block.private_key.get_secret_value())
        from_path = RunPodSSHKey(private_key_path=str(path))
        assert from_path.get_public_key().split()[:2] == block.get_public_key().split()[:2]

    def test_missing_path_is_a_spec_error(self, tmp_path) -> None:
        with pytest.raises(SpecError, match="cannot read"):
            RunPodSSHKey(private_key_path=str(tmp_path / "nope")).get_private_key()

    def test_needs_some_private_key(self) -> None:
        with pytest.raises(ValidationError):
            RunPodSSHKey()

    def test_gateway_defaults_and_endpoint(self) -> None:
        block = RunPodSSHKey.generate(gateway_host_key="ssh-ed25519 AAAAPIN")
        endpoint = block.gateway_endpoint("abc123-0a1b2c3d")
        assert (endpoint.host, endpoint.port, endpoint.user) == (
            "ssh.runpod.io",
            22,
            "abc123-0a1b2c3d",
        )
        assert endpoint.mode == "gateway" and endpoint.host_key == "ssh-ed25519 AAAAPIN"

    def test_private_key_never_shows(self) -> None:
        block = RunPodSSHKey(private_key=SecretStr("-----BEGIN SENTINEL-----"))
        assert "SENTINEL" not in repr(block) and "SENTINEL" not in block.model_dump_json()

    @pytest.mark.parametrize("line", ['ssh-ed25519 AAAA" }', "ssh-ed25519", "rsa AAAA x"])
    def test_bad_public_keys(self, line: str) -> None:
        with pytest.raises(SpecError, match="public key"):
            normalise_public_key(line)

    def test_key_in_authorized_ignores_comments(self) -> None:
        ours = RunPodSSHKey.generate(comment="a").get_public_key()
        kind, body, _ = ours.split()
        assert key_in_authorized(ours, f"ssh-rsa AAAAother x\n{kind} {body} other-comment")
        assert not key_in_authorized(ours, "ssh-rsa AAAAother x")


@pytest.mark.slow
def test_a_credentials_block_saved_by_the_previous_release_still_loads(
    prefect_server: None,
) -> None:
    """The previous release's ``RunPodCredentials`` had ``api_key`` and ``rest_base_url``
    only; its saved document loads into today's block, warns that ``rest_base_url`` is
    obsolete, and speaks the default API."""
    import warnings

    from prefect.utilities.dispatch import register_type

    from prefect_runpod.blocks.runpod.api import DEFAULT_API

    with warnings.catch_warnings():  # it takes over the slug in Prefect's registry …
        warnings.simplefilter("ignore", UserWarning)

        class PreviousRunPodCredentials(Block):
            _block_type_name = "RunPod Credentials"
            _block_type_slug = "runpod-credentials"
            api_key: SecretStr
            rest_base_url: str | None = None

    name = f"old-{__import__('uuid').uuid4().hex[:8]}"
    try:
        PreviousRunPodCredentials(
            api_key=SecretStr("rpa_OLD"), rest_base_url="https://rest.runpod.io/v1"
        ).save(name)
    finally:
        with warnings.catch_warnings():  # … until today's class takes it back
            warnings.simplefilter("ignore", UserWarning)
            register_type(RunPodCredentials)
    with pytest.warns(DeprecationWarning, match="rest_base_url is obsolete"):
        loaded = RunPodCredentials.load(name)
    assert loaded.api_key.get_secret_value() == "rpa_OLD"
    assert loaded.api_name == DEFAULT_API and loaded.api_base_url is None


@pytest.mark.slow
def test_blocks_save_and_load_through_prefect(prefect_server: None) -> None:
    """Registered and stored in a real Prefect server; secrets round-trip as SecretStr."""
    suffix = __import__("uuid").uuid4().hex[:8]
    RunPodCredentials(api_key="rpa_ROUNDTRIP").save(f"rp-{suffix}")
    loaded = RunPodCredentials.load(f"rp-{suffix}")
    assert loaded.api_key.get_secret_value() == "rpa_ROUNDTRIP"
    RunPodPodSpec(gpu_type_ids=["NVIDIA RTX A5000"], max_usd_per_hour=0.3).save(f"spec-{suffix}")
    spec = RunPodPodSpec.load(f"spec-{suffix}")
    assert spec.gpu_type_ids == ["NVIDIA RTX A5000"] and spec.max_usd_per_hour == 0.3
    key = RunPodSSHKey.generate(gateway_port=2222)
    key.save(f"key-{suffix}")
    again = RunPodSSHKey.load(f"key-{suffix}")
    assert again.get_public_key() == key.get_public_key() and again.gateway_port == 2222
