"""The Hugging Face decision table as a pure function (docs/architecture.md#env-fix-and-hugging-face-diagnosis), and the evidence
parsing around it. No network."""

from __future__ import annotations

import json

import pytest

from prefect_runpod.blocks.exceptions import HFAuthError
from prefect_runpod.tasks.hf_auth import parse_hf_check_output, raise_if_blocking, skip_reason
from prefect_runpod.tasks.hf_classify import TOKENS_URL, classify_hf_access, diagnose_evidence
from prefect_runpod.tasks.models import HFCause

REPO = "meta-llama/Llama-3.2-1B"
NOT_LISTED = (
    f"Access to model {REPO} is restricted and you are not in the authorized list. "
    f"Visit https://huggingface.co/{REPO} to ask for access."
)
LOGIN = (
    f"Access to model {REPO} is restricted. You must have access to it and be "
    "authenticated to access it. Please log in."
)
SCOPE = (
    "Please enable access to public gated repositories in your fine-grained token "
    "settings to view this repository."
)
PENDING = f"Your request to access model {REPO} is awaiting a review from the repo authors."
REJECTED = f"Your request to access model {REPO} has been rejected by the repo's authors."


# status, code, message, token_present, token_valid, can_read_gated → cause, recognised
CASES = [
    (200, None, None, True, True, None, HFCause.OK, True),
    (302, None, None, True, True, None, HFCause.OK, True),
    (404, "EntryNotFound", "Entry not found", True, True, None, HFCause.OK, True),
    (200, None, None, False, None, None, HFCause.OK, True),
    (401, "GatedRepo", LOGIN, False, None, None, HFCause.NO_TOKEN, True),
    (403, "GatedRepo", NOT_LISTED, False, None, None, HFCause.NO_TOKEN, True),
    (
        401,
        None,
        "Invalid credentials in Authorization header",
        True,
        False,
        None,
        HFCause.INVALID_TOKEN,
        True,
    ),
    (401, None, "Invalid username or password.", True, None, None, HFCause.INVALID_TOKEN, True),
    (403, "GatedRepo", NOT_LISTED, True, False, None, HFCause.INVALID_TOKEN, True),
    (401, "GatedRepo", LOGIN, True, True, None, HFCause.LICENCE_NOT_ACCEPTED, True),
    (403, "GatedRepo", NOT_LISTED, True, True, None, HFCause.LICENCE_NOT_ACCEPTED, True),
    (403, None, SCOPE, True, True, False, HFCause.TOKEN_SCOPE, True),
    (403, None, SCOPE, True, True, None, HFCause.TOKEN_SCOPE, True),
    (403, None, "Forbidden", True, True, False, HFCause.TOKEN_SCOPE, True),
    (403, "GatedRepo", PENDING, True, True, None, HFCause.ACCESS_PENDING, True),
    (403, "GatedRepo", REJECTED, True, True, None, HFCause.ACCESS_REJECTED, True),
    (401, None, REJECTED, True, True, None, HFCause.ACCESS_REJECTED, True),
    (404, "RepoNotFound", "Repository not found", True, True, None, HFCause.REPO_NOT_FOUND, True),
    (401, "RepoNotFound", "Repository not found", False, None, None, HFCause.REPO_NOT_FOUND, True),
    (404, None, None, True, True, None, HFCause.REPO_NOT_FOUND, True),
    # The usual rule of thumb, only for text we do not recognise:
    (401, None, "Unauthorized", True, True, None, HFCause.LICENCE_NOT_ACCEPTED, False),
    (403, None, "Forbidden", True, True, None, HFCause.TOKEN_SCOPE, False),
    (403, "GatedRepo", "something new", True, True, None, HFCause.TOKEN_SCOPE, False),
    (500, None, "Internal Error", True, True, None, HFCause.UNKNOWN, False),
    (429, None, "rate limited", True, True, None, HFCause.UNKNOWN, False),
    (None, None, "cannot reach", True, None, None, HFCause.UNKNOWN, False),
]


@pytest.mark.parametrize(
    ("status", "code", "message", "present", "valid", "gated_scope", "cause", "recognised"), CASES
)
def test_decision_table(status, code, message, present, valid, gated_scope, cause, recognised):
    d = classify_hf_access(
        repo_id=REPO,
        status=status,
        error_code=code,
        message=message,
        token_present=present,
        token_valid=valid,
        token_can_read_gated=gated_scope,
    )
    assert d.cause == cause
    assert d.recognised is recognised
    # evidence is kept verbatim
    assert (d.http_status, d.error_code, d.server_message) == (status, code, message)
    assert d.remediation and d.remediation_url
    assert d.blocking == (cause != HFCause.OK)
    if not recognised and cause != HFCause.UNKNOWN:
        assert d.remediation.startswith("Unrecognised answer")


@pytest.mark.parametrize(
    ("cause_row", "url"),
    [
        ((401, "GatedRepo", LOGIN, True, True), f"https://huggingface.co/{REPO}"),
        ((403, None, SCOPE, True, True), "https://huggingface.co/settings/tokens"),
        ((401, None, "Invalid credentials in Authorization header", True, False), TOKENS_URL),
        ((401, "GatedRepo", LOGIN, False, None), TOKENS_URL),
        ((403, "GatedRepo", PENDING, True, True), f"https://huggingface.co/{REPO}"),
    ],
)
def test_remediation_urls(cause_row, url):
    status, code, message, present, valid = cause_row
    d = classify_hf_access(
        repo_id=REPO,
        status=status,
        error_code=code,
        message=message,
        token_present=present,
        token_valid=valid,
    )
    assert d.remediation_url == url


def test_licence_remediation_names_user_and_page():
    d = classify_hf_access(
        repo_id=REPO,
        status=403,
        error_code="GatedRepo",
        message=NOT_LISTED,
        token_present=True,
        token_valid=True,
        user="alice",
    )
    assert "alice" in d.remediation and f"https://huggingface.co/{REPO}" in d.remediation


def _evidence(**kw):
    base = {
        "kind": "hf_check",
        "repo_id": REPO,
        "token_present": True,
        "whoami": None,
        "auth_check": None,
        "file": None,
    }
    base.update(kw)
    return base


def test_evidence_whoami_401_wins_over_public_repo():
    ev = _evidence(
        whoami={
            "status": 401,
            "error_code": None,
            "message": "Invalid credentials in Authorization header",
        },
        auth_check={"status": 200, "error_code": None, "message": None},
    )
    d = diagnose_evidence(ev, where="pod")
    assert (d.cause, d.where, d.http_status) == (HFCause.INVALID_TOKEN, "pod", 401)


def test_evidence_file_head_decides_when_auth_check_passes():
    ev = _evidence(
        whoami={"status": 200, "user": "alice", "role": "read"},
        auth_check={"status": 200, "error_code": None, "message": None},
        file={"status": 403, "error_code": "GatedRepo", "message": PENDING},
    )
    assert diagnose_evidence(ev).cause == HFCause.ACCESS_PENDING


def test_evidence_fine_grained_scope_from_whoami():
    ev = _evidence(
        whoami={"status": 200, "user": "alice", "role": "fineGrained", "can_read_gated": False},
        auth_check={"status": 403, "error_code": None, "message": "Forbidden"},
    )
    d = diagnose_evidence(ev)
    assert d.cause == HFCause.TOKEN_SCOPE and d.recognised


def test_parse_hf_check_output_finds_last_evidence_line_in_noise():
    ev = _evidence(auth_check={"status": 200, "error_code": None, "message": None})
    noisy = (
        '\x1b[32mroot@pod\x1b[0m:~# python3 hf_check.py\r\n{"other": 1}\r\n'
        + json.dumps(ev)
        + "\r\n$ "
    )
    assert parse_hf_check_output(noisy) == ev
    assert parse_hf_check_output("Traceback (most recent call last):\n  boom") is None


def test_raise_if_blocking_names_pod_cause_and_url():
    d = classify_hf_access(
        repo_id=REPO,
        status=403,
        error_code=None,
        message=SCOPE,
        token_present=True,
        token_valid=True,
        where="pod",
    )
    with pytest.raises(HFAuthError, match=r"pod-1: .*token_scope.*settings/tokens") as info:
        raise_if_blocking(d, pod_id="pod-1")
    assert info.value.diagnosis == d and info.value.stage == "hf_auth"
    raise_if_blocking(classify_hf_access(repo_id=REPO, status=200, token_present=False))


@pytest.mark.parametrize(("repo_id", "skipped"), [(None, True), ("  ", True), (REPO, False)])
def test_skip_reason(repo_id, skipped):
    assert (skip_reason(repo_id) is not None) == skipped


def test_no_answer_at_all_names_the_host_never_the_hub_answering():
    diagnosis = classify_hf_access(
        repo_id="org/m",
        status=None,
        message="ConnectError: [Errno -2] Name or service not known",
        token_present=True,
        endpoint="https://hub.internal.example:8443",
    )
    assert diagnosis.cause == HFCause.UNKNOWN
    assert diagnosis.remediation.startswith("Cannot reach hub.internal.example:8443 (ConnectError")
    assert "answered unexpectedly" not in diagnosis.remediation
    with pytest.raises(HFAuthError) as info:
        raise_if_blocking(diagnosis)
    text = str(info.value)
    assert "the Hub gave no answer" in text and "HTTP None" not in text


def test_an_unreachable_hub_through_the_real_client_says_cannot_reach():
    """A closed port on loopback: huggingface_hub raises a connection error, the
    diagnosis names the host."""
    from prefect_runpod.tasks.hf_auth import diagnose_local
    from tests.fixtures.prefect_server import free_port

    port = free_port()
    diagnosis = diagnose_local("org/m", None, f"http://127.0.0.1:{port}")
    assert f"Cannot reach 127.0.0.1:{port}" in diagnosis.remediation
    assert "answered unexpectedly" not in diagnosis.remediation


@pytest.mark.parametrize(("where", "said"), [("local", "this machine"), ("pod", "the pod")])
def test_the_no_token_remedy_names_the_place_in_words(where, said):
    """It read "where the download runs (local)"."""
    from prefect_runpod.tasks.hf_classify import _remedy

    text, _url = _remedy(HFCause.NO_TOKEN, "org/gated", where, None)
    assert f"where the download runs ({said})" in text
