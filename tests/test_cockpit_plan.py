"""``plan`` and ``check`` against the local pod and emulated RunPod (real Prefect server,
real SDK): every precondition listed with ✔/✘ and its fix, the price, nothing rented;
and the small pure pieces the cockpit tables use."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from prefect_runpod.blocks.console.openssh import ssh_argv
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.runpod.catalog import parse_catalog
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.cli.common import age_text


def test_age_reads_like_a_person_says_it():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    ages = [timedelta(seconds=s) for s in (5, 420, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)]
    assert [age_text(now - d, now) for d in ages] == ["5s", "7m", "3h05m", "2d4h"]
    assert age_text(None, now) == "-"


def test_ssh_pins_the_pods_host_key(tmp_path: Path):
    handle = PodHandle(
        pod_id="abc123def45678",
        name="prft-x",
        provider="local",
        ssh=SSHEndpoint(host="127.0.0.1", port=2222, user="abc-1", host_key="ssh-ed25519 AAAAC3"),
    )
    known = tmp_path / "known_hosts"
    argv = ssh_argv(handle, "/k/pod-ssh-key", known)
    assert argv[:2] == ["ssh", "-tt"] and argv[-1] == "abc-1@127.0.0.1"
    assert "StrictHostKeyChecking=yes" in argv and f"UserKnownHostsFile={known}" in argv
    assert known.read_text() == "[127.0.0.1]:2222 ssh-ed25519 AAAAC3\n"


def test_every_place_shows_the_ssh_line_that_works_when_pasted(tmp_path: Path, monkeypatch):
    """The run's log, its summary, ``status`` and ``pods`` showed ``ssh -tt -i KEY -p PORT
    user@host``, which fails when pasted (``Host key verification failed``: the pod's key
    is in no known_hosts); ``ssh RUN --print`` showed the pinned line. Now all show it."""
    from prefect_runpod.blocks.pod_handle import known_hosts_file

    monkeypatch.setenv("PREFECT_RUNPOD_HOME", str(tmp_path / "home"))
    handle = PodHandle(
        pod_id="abc123def45678",
        name="prft-x",
        provider="local",
        ssh=SSHEndpoint(host="127.0.0.1", port=2222, user="abc-1", host_key="ssh-ed25519 AAAAC3"),
    )
    line = handle.pinned_ssh_command("/runs/r1/pod-ssh-key")
    known = known_hosts_file(handle.pod_id)
    assert known == tmp_path / "home" / "known_hosts" / "abc123def45678"
    assert line == (
        "ssh -tt -i /runs/r1/pod-ssh-key -p 2222 -o IdentitiesOnly=yes "
        f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes abc-1@127.0.0.1"
    )
    assert known.read_text() == "[127.0.0.1]:2222 ssh-ed25519 AAAAC3\n"
    # RunPod's gateway key is learned by the run on its first connection: the handle that
    # `status` or `pods` reads back from the provider has none, and showed `accept-new`
    # beside the run's `yes`. The pin the run wrote counts the same.
    assert handle.ssh is not None
    read_back = handle.model_copy(update={"ssh": handle.ssh.model_copy(update={"host_key": None})})
    assert read_back.pinned_ssh_command("/runs/r1/pod-ssh-key") == line
    other_pod = read_back.model_copy(update={"pod_id": "zzz999zzz99999"})
    assert "StrictHostKeyChecking=accept-new" in other_pod.pinned_ssh_command("/k")


def test_the_catalog_parser_reads_rest_v2_and_leaves_the_unknown_unknown():
    found = parse_catalog(
        {
            "gpus": [
                {
                    "id": "NVIDIA GeForce RTX 3090",
                    "price": {"secure": 0.22, "community": 0.22},
                    "maxCount": 8,
                    "availability": "low",
                    "dataCenters": [{"id": "US-TX-3", "availability": "NONE"}],
                },
                {"id": "NVIDIA RTX A5000"},
                {"displayName": "no id: skipped"},
            ]
        }
    )
    a3090 = found["NVIDIA GeForce RTX 3090"]
    assert (a3090.availability, a3090.secure_usd_per_hr, a3090.max_count) == ("LOW", 0.22, 8)
    assert a3090.data_centers == {"US-TX-3": "NONE"}
    assert found["NVIDIA RTX A5000"].availability == "UNKNOWN"
    assert len(found) == 2


@pytest.mark.slow
def test_plan_on_the_local_pod_prices_the_demo_and_rents_nothing(
    prefect_server, tmp_path, capsys, runpod_home, monkeypatch
):
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    monkeypatch.delenv("HF_TOKEN", raising=False)

    before = LocalPodProvider().list("")
    code = main(
        ["plan", "--local-cost-per-hr", "0.22", "--output-dir", str(tmp_path / "out"), "--json"]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ok"] is True
    names = [c["name"] for c in data["checks"]]
    assert names[:5] == [
        "inputs and bundle",
        "blocks and provider",
        "Hugging Face token",
        "transfer method",
        "pod disk",
    ]
    assert {"Hugging Face access", "CUDA floor"} <= set(names)
    assert "pty (asked 'auto')" in data["checks"][3]["detail"]
    # No token is said as such (it read "token from none", ticked).
    assert data["checks"][2]["detail"].startswith("no token (public models only")
    (price,) = data["prices"]
    assert price["usd_per_hr"] == 0.22 and data["expected_runtime_seconds"] == 10.0
    assert price["estimate_usd"] == pytest.approx(0.22 * 10 / 3600, abs=1e-6)
    assert LocalPodProvider().list("") == before  # nothing was rented


def test_plan_lists_every_failing_precondition_with_its_fix(prefect_server, tmp_path, capsys):
    code = main(
        [
            "plan",
            "--bundle",
            str(tmp_path / "nowhere"),
            "--hf-credentials",
            "no-such-block",
            "--output-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "✘ inputs and bundle: bundle directory" in out and "pass --bundle DIR" in out
    assert "✘ Hugging Face token:" in out and "no-such-block" in out
    assert "✔ blocks and provider" in out
    assert out.rstrip().endswith("finetune would NOT start: fix each ✘")
    assert main(["plan", "--max-cost-usd", "lots"]) == 2  # bad usage: argparse's own


@pytest.mark.slow
def test_plan_and_check_on_emulated_runpod(
    prefect_server, runpod_emulator, runpod_blocks, tmp_path, capsys
):
    """Over REST v2 (the emulator's GraphQL retired): prices and availability in failover
    order from one read of the catalog, the GPU ids checked there before renting, the
    account's SSH key read (never added by plan); ``check`` says which API answered."""
    creds, spec, key = runpod_blocks
    spec.gpu_type_ids = ["NVIDIA GeForce RTX 3090", "NVIDIA RTX A5000"]
    spec.cloud_type = "ALL"
    creds.save("cockpit-creds", overwrite=True)
    spec.save("cockpit-spec", overwrite=True)
    key.save("cockpit-key", overwrite=True)
    a5000 = runpod_emulator.gpu_types["NVIDIA RTX A5000"]
    runpod_emulator.gpu_types["NVIDIA RTX A5000"] = {**a5000, "availability": "NONE"}
    blocks = [
        "--provider",
        "runpod",
        "--runpod-credentials",
        "cockpit-creds",
        "--runpod-spec",
        "cockpit-spec",
        "--ssh-key",
        "cockpit-key",
    ]
    assert main(["plan", *blocks, "--output-dir", str(tmp_path / "out"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(p["gpu_type"], p["usd_per_hr"], p["availability"]) for p in data["prices"]] == [
        ("NVIDIA GeForce RTX 3090", 0.22, "HIGH"),
        ("NVIDIA RTX A5000", 0.16, "NONE"),
    ]
    assert next(c for c in data["checks"] if c["name"] == "account SSH key")["ok"] is True
    # The spec asks for 22/tcp on a public IP; whether the host grants one shows once the
    # pod runs (the emulator's does not: the run uses pty). plan said "sftp".
    transfer = next(c for c in data["checks"] if c["name"] == "transfer method")["detail"]
    assert re.match(r"(rsync|sftp) if the host grants a public IP for 22/tcp, else pty", transfer)
    placed = next(c for c in data["checks"] if c["name"] == "GPU types and placement")
    assert placed["ok"] and placed["detail"].startswith("2 GPU type(s) known to RunPod")
    assert runpod_emulator.live_pod_ids() == []
    paths = [r.get("path") for r in runpod_emulator.requests]
    assert "/v2/catalog/gpus" in paths

    check = ["check", "--provider", "runpod", "--runpod-credentials", "cockpit-creds"]
    assert main([*check, "--ssh-key", "cockpit-key"]) == 0
    out = capsys.readouterr().out
    assert "✔ RunPod API key: REST v2 answered for the account" in out
    assert "✔ account SSH key" in out and "✔ Prefect API" in out
    assert runpod_emulator.retired == {"graphql", "v1"}
    runpod_emulator.pub_key = ""  # the key is no longer on the account
    key.add_to_account = False
    key.save("cockpit-key", overwrite=True)
    assert main([*check, "--ssh-key", "cockpit-key"]) == 1
    out = capsys.readouterr().out
    assert "✘ account SSH key" in out and "Settings, SSH Public Keys" in out


@pytest.mark.slow
def test_reaper_prints_a_table_and_says_when_there_is_nothing(prefect_server, capfd):
    """It printed raw JSON (``[]`` when empty); now a table, or one sentence — and only
    that: not Prefect's flow-run lines around it (``Beginning flow run …``, ``View at``,
    ``Finished in state``)."""
    assert main(["reaper", "--dry-run", "--name-prefix", "nobody"]) == 0
    read = capfd.readouterr()
    assert read.out.strip() == ""
    assert read.err.strip() == "no live pods named nobody-* at local: nothing to reap"
    assert main(["reaper", "--dry-run", "--name-prefix", "nobody", "--json"]) == 0
    assert json.loads(capfd.readouterr().out) == []


@pytest.mark.slow
def test_an_unknown_run_is_the_same_error_for_every_command(prefect_server, capsys):
    """A well-formed id the Prefect API does not know: each command says so alike, exit 2
    (status answered 1 without ``error:``, cost answered 0 on stdout)."""
    unknown = "00000000-0000-0000-0000-000000000000"
    for command in (["status", unknown], ["logs", unknown], ["ssh", unknown], ["cost", unknown]):
        assert main(command) == 2, command
        read = capsys.readouterr()
        assert read.out == "", command
        assert read.err.startswith(f"error: no flow run {unknown} in the Prefect API"), command
