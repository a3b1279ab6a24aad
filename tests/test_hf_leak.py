"""A sentinel token used for a full local + pod diagnosis never shows up anywhere:
not in the Hub's request log (only redacted), the console transcript, logs, captured
output, the returned diagnosis or the raised error."""

from __future__ import annotations

import logging
import secrets
import shutil
import sys
from pathlib import Path

import pytest
from prefect.logging import disable_run_logger
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import HFAuthError
from prefect_runpod.tasks.hf_auth import diagnose_local, diagnose_on_pod, hf_auth
from prefect_runpod.tasks.models import HFCause
from tests.emulators.hf_hub import HubRepo, HubToken, running_hub

POD_SIDE = Path(__file__).resolve().parents[1] / "blocks" / "pod_side"
SENTINEL = "hf_SENTINEL" + secrets.token_hex(12)


@pytest.fixture
def sentinel_hub():
    tokens = [HubToken(SENTINEL, "alice", "read")]
    repos = [HubRepo("t/ok", gated=True, access={"alice": "accepted"}), HubRepo("t/no", gated=True)]
    with running_hub(tokens, repos) as hub:
        yield hub


def _shell_history(console) -> str:  # type: ignore[no-untyped-def]
    """What the pod shell's history holds (in memory and in ~/.bash_history)."""
    return console.run(
        "history 2>/dev/null; cat ~/.bash_history 2>/dev/null; true",
        timeout_seconds=30,
        check=False,
    ).output


def _assert_clean(*texts: str) -> None:
    for text in texts:
        assert SENTINEL not in text
        assert SENTINEL[3:] not in text  # not even without its prefix


def test_local_and_shell_pod_diagnosis_leak_nothing(sentinel_hub, hf_shell_console, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    token = SecretStr(SENTINEL)
    results = [
        diagnose_local("t/ok", token, sentinel_hub.endpoint),
        diagnose_local("t/no", token, sentinel_hub.endpoint),
    ]
    for repo in ("t/ok", "t/no"):
        results.append(
            diagnose_on_pod(
                hf_shell_console,
                repo,
                token,
                sentinel_hub.endpoint,
                sys.executable,
                script_path=str(POD_SIDE / "hf_check.py"),
            )
        )
    assert [d.cause for d in results] == [HFCause.OK, HFCause.LICENCE_NOT_ACCEPTED] * 2
    out, err = capfd.readouterr()
    log = sentinel_hub.log_text()
    assert "Bearer <redacted>" in log  # the token was sent, and redacted in the log
    _assert_clean(
        log,
        "".join(hf_shell_console.transcript),
        caplog.text,
        out,
        err,
        *(d.model_dump_json() for d in results),
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="the local pod needs bash")
def test_pod_stage_through_the_local_pod_console_leaks_nothing(
    sentinel_hub, local_pod, caplog, capfd
):
    """The @task body, through the real PodConsole on a LocalPod (PTY gateway mode)."""
    from prefect_runpod.blocks.console.session import PodConsole

    caplog.set_level(logging.DEBUG)
    _, handle, keypair = local_pod
    token = SecretStr(SENTINEL)
    with disable_run_logger():
        ok = hf_auth.fn(
            handle,
            keypair.private_key,
            "t/ok",
            token,
            sentinel_hub.endpoint,
            str(POD_SIDE),
            sys.executable,
        )
        with pytest.raises(HFAuthError, match=f"{handle.pod_id}: .*licence_not_accepted") as info:
            hf_auth.fn(
                handle,
                keypair.private_key,
                "t/no",
                token,
                sentinel_hub.endpoint,
                str(POD_SIDE),
                sys.executable,
            )
        skipped = hf_auth.fn(
            handle,
            keypair.private_key,
            None,
            token,
            sentinel_hub.endpoint,
            str(POD_SIDE),
            sys.executable,
        )
    assert ok.cause == HFCause.OK and ok.where == "pod"
    assert info.value.diagnosis.remediation_url == "https://huggingface.co/t/no"
    assert skipped.name == "Skipped" and "no Hugging Face model id" in skipped.message
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        diagnosis = diagnose_on_pod(
            console,
            "t/ok",
            token,
            sentinel_hub.endpoint,
            sys.executable,
            script_path=str(POD_SIDE / "hf_check.py"),
        )
        history = _shell_history(console)
        transcript = console.transcript
    assert diagnosis.cause == HFCause.OK
    out, err = capfd.readouterr()
    _assert_clean(
        sentinel_hub.log_text(),
        transcript,
        history,
        caplog.text,
        out,
        err,
        str(info.value),
        ok.model_dump_json(),
        info.value.diagnosis.model_dump_json(),
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="the local pod needs bash")
def test_publishing_from_the_pod_leaks_the_write_token_nowhere(local_pod, caplog, capfd):
    """The publish stage's work through the real PodConsole on a LocalPod: the write
    token goes in hidden, the pod publishes to the Hub and the flow reads it back —
    and the token is in no transcript, shell history, pod file, log, report or request
    log (issue 17)."""
    from prefect_runpod.blocks.console.session import PodConsole
    from tests.fixtures.publish import make_outputs, publish_through

    caplog.set_level(logging.DEBUG)
    _, handle, keypair = local_pod
    outputs = make_outputs(Path(handle.workdir) / "run" / "outputs", lfs_bytes=300 * 1024)
    tokens = [HubToken(SENTINEL, "alice", "write")]
    with running_hub(tokens, [], lfs_threshold_bytes=64 * 1024) as hub:
        with PodConsole.for_pod(handle, keypair.private_key) as console:
            report = publish_through(
                console, handle, outputs, "hf:alice/leak-check", SENTINEL, hub.endpoint
            )
            history = _shell_history(console)
            transcript = console.transcript
        log = hub.log_text()
    assert report.verified and {f.storage for f in report.files} == {"lfs", "regular"}
    assert "Bearer <redacted>" in log  # the pod did send it, and the Hub log redacted it
    pod_files = [
        p.read_bytes().decode(errors="replace")
        for p in Path(handle.workdir).parent.rglob("*")
        if p.is_file() and p.stat().st_size < 5_000_000
    ]
    out, err = capfd.readouterr()
    _assert_clean(
        log, transcript, history, caplog.text, out, err, report.model_dump_json(), *pod_files
    )
