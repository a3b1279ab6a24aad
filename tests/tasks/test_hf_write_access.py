"""Preflight's write check for a publish target (issue 17, item 4): ``whoami`` and the
Hub's own write check through the real ``huggingface_hub`` client against the emulated
Hub, decided by one table, ``classify_write_access`` — with ``no_write_access`` and its
remediation URL in the HF diagnosis."""

from __future__ import annotations

import pytest

from prefect_runpod.blocks.exceptions import HFAuthError
from prefect_runpod.tasks.hf_auth import diagnose_write_local, raise_if_blocking
from prefect_runpod.tasks.hf_classify import WRITE_TOKEN_URL, classify_write_access
from prefect_runpod.tasks.models import HFCause

CASES = [
    # token, repo, cause, http status, remediation URL
    ("write", "demo/existing", HFCause.OK, 200, None),
    ("write", "demo/new-model", HFCause.OK, None, None),  # created in an org with write role
    ("write", "alice/new-model", HFCause.OK, None, None),  # the token's own namespace
    ("write", "readers/model", HFCause.NO_WRITE_ACCESS, 404, "https://huggingface.co/readers"),
    ("write", "bob/model", HFCause.NO_WRITE_ACCESS, 404, "https://huggingface.co/bob"),
    ("read", "demo/existing", HFCause.NO_WRITE_ACCESS, 403, WRITE_TOKEN_URL),
    ("read", "alice/new-model", HFCause.NO_WRITE_ACCESS, 404, WRITE_TOKEN_URL),
    ("fine_user", "alice/new-model", HFCause.OK, None, None),
    ("fine_user", "demo/new-model", HFCause.NO_WRITE_ACCESS, 404, WRITE_TOKEN_URL),
    (
        "unknown",
        "demo/existing",
        HFCause.INVALID_TOKEN,
        401,
        "https://huggingface.co/settings/tokens",
    ),
    (None, "demo/existing", HFCause.NO_TOKEN, None, WRITE_TOKEN_URL),
]


@pytest.mark.parametrize(("token", "repo", "cause", "status", "url"), CASES)
def test_write_access_table(publish_hub, token, repo, cause, status, url):
    secret = publish_hub.tokens[token] if token else None
    diagnosis = diagnose_write_local(repo, secret, publish_hub.endpoint)
    assert diagnosis.cause == cause, diagnosis
    assert diagnosis.http_status == status
    assert diagnosis.where == "local" and diagnosis.repo_id == repo
    if url is not None:
        assert diagnosis.remediation_url == url
    if token:
        assert publish_hub.tokens[token].get_secret_value() not in diagnosis.model_dump_json()


def test_a_read_only_token_is_refused_with_the_way_out(publish_hub):
    diagnosis = diagnose_write_local(
        "demo/existing", publish_hub.tokens["read"], publish_hub.endpoint
    )
    with pytest.raises(
        HFAuthError,
        match=r"publishing to demo/existing will fail on this machine: no_write_access, HTTP 403",
    ) as info:
        raise_if_blocking(diagnosis, action="publishing to")
    assert WRITE_TOKEN_URL in str(info.value)
    assert "write token" in str(info.value)
    assert "rights to write" in (diagnosis.server_message or "")
    # the Hub's own write check was asked, through huggingface_hub's auth_check(write=True)
    assert any(
        r["path"] == "/api/models/demo/existing/auth-check/write" for r in publish_hub.hub.requests
    )


def test_a_hub_that_does_not_answer_is_unknown_not_ok():
    evidence = {
        "repo_id": "demo/x",
        "token_present": True,
        "whoami": {"status": 200, "user": "alice", "role": "write", "orgs": {}},
        "write_check": {"status": 502, "error_code": None, "message": "Bad Gateway"},
    }
    diagnosis = classify_write_access(evidence)
    assert diagnosis.cause == HFCause.UNKNOWN and diagnosis.recognised is False
    unreachable = {"repo_id": "demo/x", "token_present": True, "whoami": {"status": None}}
    assert classify_write_access(unreachable).cause == HFCause.UNKNOWN


def test_no_write_access_is_a_cause_with_a_remediation():
    assert HFCause("no_write_access") is HFCause.NO_WRITE_ACCESS
    evidence = {
        "repo_id": "demo/x",
        "token_present": True,
        "whoami": {"status": 200, "user": "alice", "role": "read", "orgs": {"demo": "admin"}},
        "write_check": {"status": 403, "error_code": None, "message": "no"},
    }
    diagnosis = classify_write_access(evidence)
    assert diagnosis.blocking and diagnosis.remediation_url == WRITE_TOKEN_URL
    assert "cannot write to demo/x" in diagnosis.remediation


def test_token_text_never_reaches_the_evidence(publish_hub):
    from prefect_runpod.blocks.huggingface import collect_write_evidence

    for name in ("write", "read", "unknown"):
        evidence = collect_write_evidence(
            "demo/existing", token=publish_hub.tokens[name], endpoint=publish_hub.endpoint
        )
        assert publish_hub.tokens[name].get_secret_value() not in repr(evidence)
    assert "Bearer <redacted>" in publish_hub.hub.log_text()
    assert not any(
        t.get_secret_value() in publish_hub.hub.log_text() for t in publish_hub.tokens.values()
    )
