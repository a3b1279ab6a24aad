"""Which Prefect API a pod is handed: a RunPod pod is refused one it cannot reach."""

from __future__ import annotations

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.flows.worker.api_url import api_key_kind, pod_api_url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:4200/api", "loopback"),
        ("http://localhost:4200/api", "loopback"),
        ("http://[::1]:4200/api", "loopback"),
        ("http://169.254.10.2:4200/api", "link-local"),
        ("http://10.1.2.3:4200/api", "a private address"),
        ("http://192.168.0.7/api", "a private address"),
    ],
)
def test_a_runpod_pod_is_refused_an_api_it_cannot_reach(url: str, why: str) -> None:
    with pytest.raises(SpecError) as caught:
        pod_api_url(url, None, provider="runpod")
    sentence = str(caught.value)
    assert f"the Prefect API {url} is {why}, which a RunPod pod cannot reach" in sentence
    assert "prefect_api_url_for_pod" in sentence
    assert sentence.count(". ") == 0  # one sentence


def test_the_override_and_the_local_pod_take_any_url() -> None:
    loopback = "http://127.0.0.1:4200/api"
    assert pod_api_url(loopback, "https://p.example.com/api", provider="runpod") == (
        "https://p.example.com/api"
    )
    assert pod_api_url(loopback, None, provider="local") == loopback
    cloud = "https://api.prefect.cloud/api/accounts/a/workspaces/w"
    assert pod_api_url(cloud, None, provider="runpod") == cloud


def test_the_key_kind_is_named() -> None:
    assert "service account" in api_key_kind("pnb_x")
    assert "user API key" in api_key_kind("pnu_x")
    assert "no API key" in api_key_kind(None)
