"""Every diagnosis case against the emulated Hub: locally through the real
huggingface_hub client, and from the pod side through ``hf_check.py`` (as a
subprocess and through a console)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
)

from prefect_runpod.blocks.huggingface import HuggingFaceCredentials
from prefect_runpod.tasks.hf_auth import diagnose_local, diagnose_on_pod, hub_answer
from prefect_runpod.tasks.hf_classify import diagnose_evidence
from prefect_runpod.tasks.models import HFCause

POD_SIDE = Path(__file__).resolve().parents[2] / "blocks" / "pod_side"
HF_CHECK = POD_SIDE / "hf_check.py"

# token name (None = no token), repo → expected cause, expected HTTP status
MATRIX = [
    (None, "t/public", HFCause.OK, 200),
    (None, "t/accepted", HFCause.NO_TOKEN, 401),
    ("classic", "t/public", HFCause.OK, 200),
    ("classic", "t/accepted", HFCause.OK, 200),
    ("write", "t/accepted", HFCause.OK, 200),
    ("fine_gated", "t/accepted", HFCause.OK, 200),
    ("fine_nogated", "t/accepted", HFCause.TOKEN_SCOPE, 403),
    ("fine_nogated", "t/public", HFCause.OK, 200),
    ("classic", "t/unrequested", HFCause.LICENCE_NOT_ACCEPTED, 403),
    ("classic", "t/legacy401", HFCause.LICENCE_NOT_ACCEPTED, 401),
    ("classic", "t/pending", HFCause.ACCESS_PENDING, 403),
    ("classic", "t/rejected", HFCause.ACCESS_REJECTED, 403),
    ("classic", "t/missing", HFCause.REPO_NOT_FOUND, 404),
    (None, "t/missing", HFCause.REPO_NOT_FOUND, 401),
    ("revoked", "t/public", HFCause.INVALID_TOKEN, 401),
    ("unknown", "t/accepted", HFCause.INVALID_TOKEN, 401),
]
IDS = [f"{tok}-{repo}" for tok, repo, _, _ in MATRIX]


def _run_script(endpoint: str, repo: str, token, tmp_path, *extra: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HF_HOME"] = str(tmp_path / "hf-home")
    if token is not None:
        env["HF_TOKEN"] = token.get_secret_value()
    proc = subprocess.run(
        [sys.executable, str(HF_CHECK), "--repo-id", repo, "--endpoint", endpoint, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0]), proc


class TestEmulatorFidelity:
    """The real client raises the classes the reference names for each answer."""

    def test_exception_classes(self, hf_hub):
        api = HfApi(endpoint=hf_hub.endpoint, token=False)
        tok = hf_hub.tokens
        with pytest.raises(GatedRepoError, match="You must have access"):
            api.auth_check("t/accepted", token=False)
        with pytest.raises(GatedRepoError, match="not in the authorized list"):
            api.auth_check("t/unrequested", token=tok["classic"].get_secret_value())
        with pytest.raises(HfHubHTTPError, match="enable access to public gated") as info:
            api.auth_check("t/accepted", token=tok["fine_nogated"].get_secret_value())
        assert not isinstance(info.value, RepositoryNotFoundError)
        with pytest.raises(RepositoryNotFoundError):
            api.auth_check("t/missing", token=tok["classic"].get_secret_value())
        with pytest.raises(HfHubHTTPError, match="Invalid user token"):
            api.whoami(token=tok["revoked"].get_secret_value())
        url = hf_hub_url("t/pending", "config.json", endpoint=hf_hub.endpoint)
        with pytest.raises(GatedRepoError, match="awaiting a review"):
            get_hf_file_metadata(
                url, token=tok["classic"].get_secret_value(), endpoint=hf_hub.endpoint
            )

    def test_model_info_is_200_even_for_gated(self, hf_hub):
        info = HfApi(endpoint=hf_hub.endpoint).model_info("t/unrequested", token=False)
        assert info.id == "t/unrequested" and info.gated == "manual"

    def test_whoami_reports_fine_grained_gated_scope(self, hf_hub):
        body = HfApi(endpoint=hf_hub.endpoint).whoami(
            token=hf_hub.tokens["fine_nogated"].get_secret_value()
        )
        token_info = body["auth"]["accessToken"]
        assert body["name"] == "alice" and token_info["role"] == "fineGrained"
        assert token_info["fineGrained"]["canReadGatedRepos"] is False


@pytest.mark.parametrize(("tok", "repo", "cause", "status"), MATRIX, ids=IDS)
def test_local_diagnosis(hf_hub, tok, repo, cause, status):
    token = hf_hub.tokens[tok] if tok else None
    d = diagnose_local(repo, token, hf_hub.endpoint)
    assert (d.cause, d.http_status, d.where) == (cause, status, "local")
    assert d.recognised


@pytest.mark.parametrize(("tok", "repo", "cause", "status"), MATRIX, ids=IDS)
def test_what_the_hub_answered_reads_without_a_literal_none(hf_hub, tok, repo, cause, status):
    """``hf_auth ok for demo/gated-accepted (HTTP 200, None)``: the Hub sends no
    ``X-Error-Code`` on a 200, and the line printed the missing value."""
    token = hf_hub.tokens[tok] if tok else None
    said = hub_answer(diagnose_local(repo, token, hf_hub.endpoint))
    assert said.startswith(f"HTTP {status}") and "None" not in said
    if status == 200:
        assert said == "HTTP 200"


def test_no_answer_from_the_hub_is_said_so():
    d = diagnose_evidence({"http_status": None, "error": "connection refused"}, where="local")
    assert hub_answer(d) == "no HTTP answer"


@pytest.mark.parametrize(("tok", "repo", "cause", "status"), MATRIX, ids=IDS)
def test_pod_script_diagnosis(hf_hub, tmp_path, tok, repo, cause, status):
    token = hf_hub.tokens[tok] if tok else None
    evidence, proc = _run_script(hf_hub.endpoint, repo, token, tmp_path)
    assert proc.returncode == (0 if cause == HFCause.OK else 3)
    d = diagnose_evidence(evidence, where="pod")
    assert (d.cause, d.http_status, d.where) == (cause, status, "pod")


def test_local_and_pod_evidence_agree(hf_hub, tmp_path):
    """Both probes feed the same classifier with the same evidence fields."""
    for tok, repo, _, _ in MATRIX:
        token = hf_hub.tokens[tok] if tok else None
        local = diagnose_local(repo, token, hf_hub.endpoint)
        pod = diagnose_evidence(_run_script(hf_hub.endpoint, repo, token, tmp_path)[0], where="pod")
        assert (local.cause, local.http_status, local.error_code, local.server_message) == (
            pod.cause,
            pod.http_status,
            pod.error_code,
            pod.server_message,
        ), (tok, repo)


def test_missing_file_in_readable_repo_is_ok(hf_hub, tmp_path):
    token = hf_hub.tokens["classic"]
    d = diagnose_local("t/accepted", token, hf_hub.endpoint, filename="nope.bin")
    assert d.cause == HFCause.OK and d.error_code == "EntryNotFound"
    evidence, proc = _run_script(
        hf_hub.endpoint, "t/accepted", token, tmp_path, "--filename", "nope.bin"
    )
    assert proc.returncode == 0 and diagnose_evidence(evidence).cause == HFCause.OK


def test_dataset_repo(hf_hub):
    d = diagnose_local("t/data", hf_hub.tokens["classic"], hf_hub.endpoint, repo_type="dataset")
    assert d.cause == HFCause.OK
    d = diagnose_local("t/data", None, hf_hub.endpoint, repo_type="dataset")
    assert d.cause == HFCause.NO_TOKEN


def test_unreachable_hub_is_unknown(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    d = diagnose_local("t/public", None, endpoint)
    assert d.cause == HFCause.UNKNOWN and d.http_status is None and not d.recognised
    evidence, proc = _run_script(endpoint, "t/public", None, tmp_path, "--timeout-seconds", "5")
    assert proc.returncode == 3 and diagnose_evidence(evidence).cause == HFCause.UNKNOWN


def test_pod_script_reads_saved_login_file(hf_hub, tmp_path):
    """``hf auth login`` on the pod writes $HF_HOME/token; the check uses it when HF_TOKEN
    is not exported."""
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text(hf_hub.tokens["classic"].get_secret_value())
    evidence, _ = _run_script(hf_hub.endpoint, "t/accepted", None, tmp_path)
    assert evidence["token_source"] == "file"
    assert diagnose_evidence(evidence).cause == HFCause.OK


@pytest.mark.parametrize(
    ("tok", "repo", "cause"),
    [
        ("classic", "t/accepted", HFCause.OK),
        ("fine_nogated", "t/accepted", HFCause.TOKEN_SCOPE),
        (None, "t/accepted", HFCause.NO_TOKEN),
        ("classic", "t/pending", HFCause.ACCESS_PENDING),
    ],
)
def test_diagnose_on_pod_through_console(hf_hub, hf_shell_console, tok, repo, cause):
    token = hf_hub.tokens[tok] if tok else None
    d = diagnose_on_pod(
        hf_shell_console, repo, token, hf_hub.endpoint, sys.executable, script_path=str(HF_CHECK)
    )
    assert (d.cause, d.where) == (cause, "pod")
    if token is not None:
        assert token.get_secret_value() not in "".join(hf_shell_console.transcript)


def test_diagnose_on_pod_without_evidence_is_unknown(hf_shell_console, tmp_path):
    broken = tmp_path / "hf_check.py"
    broken.write_text("import sys; print('Traceback: boom'); sys.exit(1)\n")
    d = diagnose_on_pod(
        hf_shell_console,
        "t/public",
        None,
        "http://127.0.0.1:9",
        sys.executable,
        script_path=str(broken),
    )
    assert d.cause == HFCause.UNKNOWN and "boom" in (d.server_message or "")


def test_block_client_never_falls_back_to_a_saved_token(hf_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", hf_hub.tokens["classic"].get_secret_value())
    block = HuggingFaceCredentials(endpoint=hf_hub.endpoint + "/")
    with pytest.raises(GatedRepoError):
        block.get_client().auth_check("t/accepted")
    assert block.access_evidence("t/accepted")["token_present"] is False
    block = HuggingFaceCredentials(token=hf_hub.tokens["classic"], endpoint=hf_hub.endpoint)
    assert "**" in repr(block) and hf_hub.tokens["classic"].get_secret_value() not in repr(block)
    block.get_client().auth_check("t/accepted")


@pytest.mark.parametrize("script", sorted(p.name for p in POD_SIDE.glob("*.py")))
def test_pod_side_scripts_parse_as_python_38(script):
    if script not in ("hf_check.py", "probe.py"):
        pytest.skip("another area's script")
    ast.parse((POD_SIDE / script).read_text(), feature_version=(3, 8))
