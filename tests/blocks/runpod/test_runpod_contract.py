"""RunPod's REST v2 contract, strict: the vendored schema closed where objects are used,
so an unknown field in a request and an extra field in an answer both fail — and RunPod's
own examples still pass. Plus the product holds no call to a retired API outside the
GraphQL fallback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.emulators.runpod_contract import SCHEMA_PATH, check_request, check_response

ROOT = Path(__file__).resolve().parents[3]
AUTH = {"Authorization": "Bearer rpa_x", "Content-Type": "application/json"}
RATE = {
    "RateLimit": '"minute";r=59;t=60',
    "RateLimit-Policy": '"minute";q=60;w=60',
    "Content-Type": "application/json",
}
USED = [
    ("get", "/v2/pods"),
    ("post", "/v2/pods"),
    ("get", "/v2/pods/{id}"),
    ("get", "/v2/account/ssh-keys"),
    ("put", "/v2/account/ssh-keys"),
    ("get", "/v2/catalog/gpus"),
    ("get", "/v2/billing/pods"),
]


def _spec() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _example(method: str, path: str) -> tuple[int, dict]:
    responses = _spec()["paths"][path][method]["responses"]
    status = next(s for s in ("200", "201") if s in responses)
    media = responses[status]["content"]["application/json"]
    return int(status), next(iter(media["examples"].values()))["value"]


def test_the_vendored_schema_is_runpods_v2() -> None:
    spec = _spec()
    assert spec["openapi"].startswith("3.1") and spec["info"]["version"] == "2.0.0"
    assert spec["info"]["description"] == "Runpod public REST API — v2"


@pytest.mark.parametrize(("method", "path"), USED)
def test_runpods_own_examples_pass_the_strict_contract(method: str, path: str) -> None:
    status, body = _example(method, path)
    url = path.replace("{id}", "7h9k2m4n6p")
    assert check_response(method, url, AUTH, status, RATE, json.dumps(body).encode()) == []


def test_a_request_with_an_unknown_field_fails() -> None:
    body = {"name": "p", "image": "i", "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}}
    assert check_request("post", "/v2/pods", AUTH, json.dumps(body).encode()) == []
    nested = {**body, "gpu": {**body["gpu"], "spot": True}}
    assert check_request("post", "/v2/pods", AUTH, json.dumps(nested).encode()) == [
        "POST /v2/pods $.gpu: additional properties 'spot' not allowed"
    ]
    top = {**body, "terminateAfter": "2026-12-01T00:00:00Z"}
    assert check_request("post", "/v2/pods", AUTH, json.dumps(top).encode()) == [
        "POST /v2/pods $: additional properties 'terminateAfter' not allowed"
    ]


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("top", lambda pod: pod.update(extra=1)),
        ("ssh.proxy", lambda pod: pod["ssh"]["proxy"].update(machine="x")),
        ("runtime", lambda pod: pod["runtime"].update(gpuCount=1)),
        ("gpu", lambda pod: pod["gpu"].update(price=0.2)),
    ],
)
def test_an_answer_with_an_extra_field_fails(where, change) -> None:  # type: ignore[no-untyped-def]
    """The published schema leaves these objects open; closed, each extra field fails."""
    status, pod = _example("get", "/v2/pods/{id}")
    change(pod)
    found = check_response("get", "/v2/pods/x", AUTH, status, RATE, json.dumps(pod).encode())
    assert len(found) == 1 and found[0].startswith("GET /v2/pods/x -> 200 $")


def test_an_extra_field_in_a_problem_object_fails() -> None:
    problem = {"title": "Not Found", "status": 404, "detail": "pod not found"}
    headers = {**RATE, "Content-Type": "application/problem+json"}
    ok = check_response("get", "/v2/pods/x", AUTH, 404, headers, json.dumps(problem).encode())
    bad = json.dumps({**problem, "code": "E1"}).encode()
    assert ok == [] and check_response("get", "/v2/pods/x", AUTH, 404, headers, bad)


PRODUCT = ("blocks", "tasks", "flows", "deployments")
GRAPHQL_FALLBACK = {"blocks/runpod/graphql_api.py", "blocks/runpod/client.py"}
"""The GraphQL fallback: ``GraphQLApi`` and the ``runpod`` SDK binding it wraps."""
QUOTES = {"blocks/local_pod/pod_files.py"}
"""Quotes runpodctl's own error text (an x509 failure naming its GraphQL URL), no call."""


def _product_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for d in PRODUCT for p in (ROOT / d).rglob("*.py"))


def test_no_product_file_names_rest_v1() -> None:
    hits = [f for f in _product_files() if "rest.runpod.io/v1" in (ROOT / f).read_text()]
    assert hits == []


@pytest.mark.parametrize(
    "path", [p for p in _product_files() if p not in GRAPHQL_FALLBACK | QUOTES]
)
def test_the_graphql_endpoint_only_in_the_fallback(path: str) -> None:
    text = (ROOT / path).read_text()
    assert not re.search(r"/graphql\b", text), f"{path} names RunPod's GraphQL endpoint"


def test_no_product_file_keeps_a_server_side_deadline() -> None:
    """RunPod never acted on ``terminateAfter`` and v2 has none: no field, no parameter
    and no record carries one (docstrings may still say why not)."""
    hits = [f for f in _product_files() if "terminate_after" in (ROOT / f).read_text()]
    assert hits == []
