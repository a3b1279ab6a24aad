"""Secrets of the wrong shape (issue 21): a key or token with a stray newline, a space or
a tab is refused before any call (one trailing newline is stripped, and said), and no
copy of it — whole, stripped, escaped or in pieces — reaches the Prefect database (and
its WAL), result storage, a run's output directory, a pod's home or what the CLI
printed, through the CLI (``finetune`` on the local pod and on emulated RunPod,
``check``, ``plan``, ``cost``) and direct flow calls. The served-deployment leg is in
``tests/test_deployments.py`` (it shares that module's runner).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.flows.cli import EXIT_USAGE, main
from tests.fixtures.flow_env import server_env
from tests.fixtures.leaks import assert_found_nowhere, prefect_stores, shaped_sentinels


def test_a_hf_token_with_a_newline_inside_is_refused_and_stored_nowhere(
    prefect_server, hf_hub, tmp_path, monkeypatch, capfd, caplog
):
    """Issue 21's second report: ``HF_TOKEN`` with a newline inside it was printed in the
    summary's error line (``LocalProtocolError: Illegal header value b'Bearer hf_…'``)
    and stored in the Prefect database, results and ``run-report.json``. Now the CLI
    refuses it before Prefect starts a run, and a direct flow call fails its preflight
    with the same sentence; neither leaves the token anywhere."""
    from prefect_runpod.flows.finetune import finetune

    token = shaped_sentinels("hf_")["inner_newline"]
    monkeypatch.setenv("HF_TOKEN", token)
    hub = ["--model-id", "t/public", "--hf-endpoint", hf_hub.endpoint]
    pods_before = {h.pod_id for h in LocalPodProvider().list("")}
    capfd.readouterr()
    assert main(["finetune", *hub, "--output-dir", str(tmp_path / "cli")]) == EXIT_USAGE
    cli_out, cli_err = capfd.readouterr()
    assert cli_err.startswith("error: HF_TOKEN has a newline inside it: remove it")
    assert cli_err.count("\n") == 1, cli_err
    out = tmp_path / "flow"
    state = finetune(
        model_id="t/public", hf_endpoint=hf_hub.endpoint, output_dir=str(out), return_state=True
    )
    assert state.is_failed()
    assert "HF_TOKEN has a newline inside it" in (state.message or "")
    report = json.loads((out / "run-report.json").read_text())
    assert report["pod_id"] is None and "HF_TOKEN has a newline inside it" in report["error"]
    flow_out, flow_err = capfd.readouterr()
    assert {h.pod_id for h in LocalPodProvider().list("")} == pods_before, "a pod was rented"
    assert_found_nowhere(
        [token],
        roots=[*prefect_stores(), out],
        texts={
            "cli stderr": cli_err,
            "flow output and log records": flow_out + flow_err + caplog.text,
        },
    )


@pytest.mark.slow
def test_a_runpod_key_with_a_trailing_newline_is_stripped_and_shown_nowhere(
    prefect_server, runpod_env, hf_hub, tmp_path, monkeypatch, capfd, caplog
):
    """Issue 21's first report: ``RUNPOD_API_KEY`` with a trailing newline (a copy-paste
    from a file) was stored whole in two Prefect log rows (``InvalidHeader: … 'Bearer
    rpa_…\\n'``), ``check --provider runpod`` printed it, and the run blamed the
    network. One trailing newline is unambiguous: it is stripped, and said, without the
    value. ``check``, a whole ``finetune`` on emulated RunPod (the Hugging Face token
    with a trailing newline too) and ``cost --reconcile`` then leave the key nowhere."""
    key = runpod_env.api_key
    token = hf_hub.tokens["classic"].get_secret_value()
    monkeypatch.setenv("RUNPOD_API_KEY", key + "\n")
    monkeypatch.setenv("HF_TOKEN", token + "\n")
    capfd.readouterr()
    assert main(["check", "--provider", "runpod", "--hf-endpoint", hf_hub.endpoint]) == 0
    check_out, check_err = capfd.readouterr()
    assert "✔ RunPod API key" in check_out and "✔ Hugging Face token" in check_out
    said = "ends with a newline: stripped it (the value is not shown)"
    assert {f"RUNPOD_API_KEY {said}", f"HF_TOKEN {said}"} <= set(caplog.messages)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.cli", "finetune", "--provider", "runpod"]
        + ["--model-id", "t/public", "--hf-endpoint", hf_hub.endpoint, "--output-dir", str(out)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RUNPOD_API_KEY ends with a newline: stripped it" in done.stderr
    assert "HF_TOKEN ends with a newline: stripped it" in done.stdout + done.stderr
    run_id = json.loads((out / "run-report.json").read_text())["flow_run_id"]
    assert main(["cost", run_id, "--reconcile", "--provider", "runpod", "--json"]) == 0
    cost_out, cost_err = capfd.readouterr()
    assert runpod_env.live_pod_ids() == []
    assert_found_nowhere(
        [key, token],
        roots=[*prefect_stores(), out, runpod_env.local.home],
        texts={
            "check": check_out + check_err,
            "log records": caplog.text,
            "finetune stdout": done.stdout,
            "finetune stderr": done.stderr,
            "cost": cost_out + cost_err,
        },
    )


def test_keys_of_every_shape_are_refused_by_check_plan_cost_and_the_flow(
    prefect_server, runpod_env, tmp_path, monkeypatch, capfd, caplog
):
    """Each secret's every source, each wrong shape: the environment's RunPod key and
    Hugging Face token, a ``RunPodCredentials``, ``HuggingFaceCredentials``, ``Secret``
    and ``S3Target`` block, ``PREFECT_API_KEY``. ``check`` and ``plan`` say ✘ with the
    sentence (no call is made with it: RunPod's API sees no request), ``cost
    --reconcile`` and ``plan`` with a bad ``PREFECT_API_KEY`` stop with exit 2, a
    direct flow call fails its preflight before renting; the values are nowhere."""
    from prefect.blocks.system import Secret
    from prefect.settings import PREFECT_API_KEY, temporary_settings

    from prefect_runpod.blocks.huggingface import HuggingFaceCredentials
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials
    from prefect_runpod.blocks.transfer.s3 import S3Target
    from prefect_runpod.flows.finetune import finetune
    from prefect_runpod.flows.run.cost_record import CostRecord, publish_record

    rp, hf, s3, pf = (shaped_sentinels(p) for p in ("rpa_", "hf_", "rps_", "pnu_"))
    RunPodCredentials(api_key=rp["tab"]).save("shape-creds", overwrite=True)
    HuggingFaceCredentials(token=hf["space"]).save("shape-hf", overwrite=True)
    Secret(value=hf["tab"]).save("shape-secret", overwrite=True)
    S3Target(bucket="b", access_key_id="user_ok", secret_access_key=s3["inner_newline"]).save(
        "shape-s3", overwrite=True
    )
    monkeypatch.setenv("RUNPOD_API_KEY", rp["space"])
    monkeypatch.setenv("MY_HF", hf["inner_newline"])
    sent_before = len(runpod_env.requests)
    capfd.readouterr()
    printed: dict[str, str] = {}

    def cli(name: str, argv: list[str], status: int) -> str:
        assert main(argv) == status, argv
        out, err = capfd.readouterr()
        printed[name] = out + err
        return out + err

    text = cli("check env", ["check", "--provider", "runpod", "--hf-token-env", "MY_HF"], 1)
    assert "✘ RunPod key and SSH key: RUNPOD_API_KEY has a space inside it: remove it" in text
    assert "✘ Hugging Face token: MY_HF has a newline inside it: remove it" in text
    blocks = ["--provider", "runpod", "--runpod-credentials", "shape-creds"]
    text = cli("check blocks", ["check", *blocks, "--hf-credentials", "shape-hf"], 1)
    assert "the api_key of the RunPodCredentials block 'shape-creds' has a tab inside it" in text
    assert "the token of the HuggingFaceCredentials block 'shape-hf' has a space inside" in text
    plan = ["plan", *blocks, "--hf-token-secret", "shape-secret", "--transfer", "s3"]
    text = cli("plan", [*plan, "--s3-target", "shape-s3", "--output-dir", str(tmp_path)], 1)
    assert "the Secret block 'shape-secret' (hf_token_secret) has a tab inside it" in text
    assert "the secret_access_key of the S3Target block 'shape-s3' has a newline inside" in text
    with temporary_settings(updates={PREFECT_API_KEY: pf["tab"]}):
        text = cli("prefect key", ["plan", "--output-dir", str(tmp_path)], EXIT_USAGE)
    assert text.startswith("error: PREFECT_API_KEY has a tab inside it: remove it")

    out = tmp_path / "flow"
    state = finetune(
        provider="runpod",
        runpod_credentials_block="shape-creds",
        hf_token_env="MY_HF",
        output_dir=str(out),
        return_state=True,
    )
    assert state.is_failed() and "has a tab inside it" in (state.message or "")
    printed["flow"] = "".join(capfd.readouterr()) + caplog.text
    # A record still open (as a SIGKILLed run leaves it): reconcile builds the provider
    # from the run's parameters, so the block's key is checked again.
    run_id = str(state.state_details.flow_run_id)
    publish_record(CostRecord(flow_run_id=run_id, pod_id="gonepod1", provider="runpod"))
    text = cli("cost", ["cost", run_id, "--reconcile"], EXIT_USAGE)
    assert "error: the api_key of the RunPodCredentials block 'shape-creds' has a tab" in text
    assert runpod_env.requests[sent_before:] == [], "RunPod's API was called with a bad key"
    assert_found_nowhere(
        [*rp.values(), *hf.values(), s3["inner_newline"], pf["tab"]],
        roots=[*prefect_stores(), out],
        texts=printed,
    )
