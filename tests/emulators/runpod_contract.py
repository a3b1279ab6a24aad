"""RunPod's REST v2 contract, strict: every request our client sends and every answer the
emulator gives is checked against RunPod's own OpenAPI 3.1 schema
(``tests/data/runpod-v2-openapi.json``, vendored verbatim) with openapi-core.

Strict means closed: the published schema leaves most objects open (a ``Pod`` with a
field RunPod never sends would pass), so before use every object schema is closed where
it is used — ``unevaluatedProperties: false`` beside each use of an object schema (a
``$ref``, an inline ``properties`` block, an ``anyOf`` branch), never inside an
``allOf`` member, whose siblings' properties it could not see. Maps
(``additionalProperties: {type: string}``, a pod's ``env``) stay maps. The vendored file
itself is never edited; the closing happens on a copy in memory.

``check_request`` / ``check_response`` return the violations as one-line strings (empty:
conforms); the emulator records them and the fixture fails a test that leaves any.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from openapi_core import Config, OpenAPI
from openapi_core.testing import MockRequest, MockResponse

__all__ = ["SCHEMA_PATH", "check_request", "check_response", "closed_spec", "contract"]

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "data" / "runpod-v2-openapi.json"
"""RunPod's published OpenAPI schema of REST v2 (version 2.0.0), copied verbatim."""

_HOST = "https://api.runpod.io"
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "not", "if", "then", "else", "contains", "propertyNames")


def _resolve(spec: dict[str, Any], node: Any) -> Any:
    seen = 0
    while isinstance(node, dict) and "$ref" in node and seen < 32:
        target: Any = spec
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        if not isinstance(target, dict):
            return target
        node, seen = target, seen + 1
    return node


def _is_map(spec: dict[str, Any], node: Any) -> bool:
    node = _resolve(spec, node)
    if not isinstance(node, dict):
        return False
    extra = node.get("additionalProperties")
    return (
        extra is not None
        and extra is not False
        or any(_is_map(spec, m) for m in node.get("allOf", []))
    )


def _is_object(spec: dict[str, Any], node: Any) -> bool:
    node = _resolve(spec, node)
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return (
        "properties" in node
        or "object" in kinds
        or any(_is_object(spec, m) for m in node.get("allOf", []))
    )


def _walk(spec: dict[str, Any], node: Any, *, use: bool) -> None:
    """Close ``node`` when it is a use of an object schema (``use``), then its children:
    property values, items and ``anyOf``/``oneOf`` branches are uses; ``allOf`` members
    are parts of the schema beside them, never closed themselves."""
    if not isinstance(node, dict):
        return
    if (
        use
        and "unevaluatedProperties" not in node
        and _is_object(spec, node)
        and not _is_map(spec, node)
    ):
        if "$ref" in node:  # openapi-core reads a $ref alone: put it under allOf
            node["allOf"] = [{"$ref": node.pop("$ref")}, *node.get("allOf", [])]
        node["unevaluatedProperties"] = False
    for value in (node.get("properties") or {}).values():
        _walk(spec, value, use=True)
    for key in _SUBSCHEMA_LISTS:
        for member in node.get(key) or []:
            _walk(spec, member, use=True)
    for member in node.get("allOf") or []:
        _walk(spec, member, use=False)
    for key in _SUBSCHEMA_ONE:
        if isinstance(node.get(key), dict):
            _walk(spec, node[key], use=True)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(spec, node["additionalProperties"], use=True)


def closed_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with every object schema closed where it is used (see the
    module docstring): component definitions keep their own shape, each use gets
    ``unevaluatedProperties: false``."""
    out = copy.deepcopy(spec)
    for schema in out["components"]["schemas"].values():
        _walk(out, schema, use=False)
    uses: list[dict[str, Any]] = []
    for item in out["paths"].values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            body = (operation.get("requestBody") or {}).get("content") or {}
            uses += [media["schema"] for media in body.values() if "schema" in media]
            for response in (operation.get("responses") or {}).values():
                content = (response.get("content") or {}) if isinstance(response, dict) else {}
                uses += [media["schema"] for media in content.values() if "schema" in media]
    for response in out["components"].get("responses", {}).values():
        for media in (response.get("content") or {}).values():
            if "schema" in media:
                uses.append(media["schema"])
    for schema in uses:
        _walk(out, schema, use=True)
    return out


@cache
def contract() -> OpenAPI:
    """The strict (closed) contract, built once per process."""
    config = Config(
        extra_media_type_deserializers={
            "application/problem+json": json.loads,
            "text/event-stream": lambda data: data.decode() if isinstance(data, bytes) else data,
        }
    )
    return OpenAPI.from_dict(closed_spec(json.loads(SCHEMA_PATH.read_text())), config=config)


_UNEVALUATED = re.compile(
    r"Unevaluated properties are not allowed \((.+) (?:was|were) unexpected\)"
)


def _lines(exc: BaseException) -> list[str]:
    """One line per place the data breaks the schema, in RunPod's words for an unknown
    field (``$.gpu: additional properties 'bogus' not allowed``); else the exception's
    text. A failing part makes its parents report all their fields unevaluated too:
    only the deepest place is kept."""
    found: dict[str, str] = {}
    for err in (exc, exc.__cause__, exc.__context__):
        for inner in getattr(err, "schema_errors", None) or []:
            where = str(getattr(inner, "json_path", "$"))
            text = str(getattr(inner, "message", inner))
            match = _UNEVALUATED.fullmatch(text)
            if match:
                text = f"additional properties {match.group(1)} not allowed"
            found.setdefault(where, text)
    deepest = [
        w for w in found if not any(o != w and o.startswith((w + ".", w + "[")) for o in found)
    ]
    return [f"{w}: {found[w]}" for w in deepest] or [f"{type(exc).__name__}: {str(exc)[:300]}"]


def _request(method: str, url: str, headers: dict[str, str], body: bytes) -> MockRequest:
    parts = urlsplit(url)
    return MockRequest(
        _HOST,
        method,
        parts.path,
        args=dict(parse_qsl(parts.query, keep_blank_values=True)),
        headers=headers,
        data=body or None,
        content_type=headers.get("content-type")
        or headers.get("Content-Type")
        or "application/json",
    )


def check_request(method: str, url: str, headers: dict[str, str], body: bytes) -> list[str]:
    """Violations of the strict contract by one request (path, query, headers, body)."""
    try:
        contract().validate_request(_request(method, url, headers, body))
    except Exception as exc:  # openapi-core's errors: each one is a violation
        return [f"{method.upper()} {urlsplit(url).path} {line}" for line in _lines(exc)]
    return []


def check_response(
    method: str,
    url: str,
    request_headers: dict[str, str],
    status: int,
    headers: dict[str, str],
    body: bytes,
) -> list[str]:
    """Violations of the strict contract by one answer to a request (status, headers,
    body); an SSE stream's body is not parsed (the schema says only ``string``)."""
    content_type = (headers.get("Content-Type") or headers.get("content-type") or "").split(";")[0]
    response = MockResponse(body, status_code=status, headers=headers, content_type=content_type)
    try:
        contract().validate_response(_request(method, url, request_headers, b""), response)
    except Exception as exc:
        where = f"{method.upper()} {urlsplit(url).path} -> {status}"
        return [f"{where} {line}" for line in _lines(exc)]
    return []
