"""Holding a run against the pod about to be rented (flows/run/inputs.py,
flows/run/providers.planned_pod, tasks/preflight): the transfer method against what the pod
will offer, the bundle's bytes against its disk, and the validated settings the flow
runs on. Nothing here rents or calls an API."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
from prefect_runpod.flows.run.inputs import prepare_run
from prefect_runpod.flows.run.providers import planned_pod, ssh_key_file
from prefect_runpod.tasks.bundle_files import BundleFiles
from prefect_runpod.tasks.preflight import (
    check_pod_disk,
    check_transfer_before_renting,
    transfer_methods,
    validate_settings,
)
from tests.fixtures.demo_bundle import DEMO_BUNDLE, copy_demo_bundle


def _runpod(**spec: object):
    return RunPodPodSpec(**spec).get_provider(
        RunPodCredentials(api_key=SecretStr("rpa_" + "k" * 24)), RunPodSSHKey.generate()
    )


def test_transfer_choices_come_from_the_registry():
    from prefect_runpod.blocks.transfer import method_names

    assert transfer_methods() == ("auto", *method_names())


def test_the_local_pods_mode_decides_what_it_offers():
    gateway = planned_pod(LocalPodProvider(mode="gateway"), "prft-x")
    direct = planned_pod(LocalPodProvider(mode="direct"), "prft-x")
    assert "gateway mode" in gateway.description and gateway.handle.direct_ssh is None
    assert direct.handle.direct_ssh is not None
    assert check_transfer_before_renting("auto", gateway.handle, gateway.description) == "pty"
    assert check_transfer_before_renting("auto", direct.handle, direct.description) == "rsync"
    with pytest.raises(SpecError) as info:
        check_transfer_before_renting("sftp", gateway.handle, gateway.description)
    text = str(info.value)
    assert text.startswith("transfer_method (--transfer) 'sftp' cannot work with a local pod")
    assert "checked before renting" in text and "(not rented yet)" not in text


def test_a_runpod_spec_without_22_tcp_cannot_do_sftp():
    exposed = planned_pod(_runpod(), "prft-x")
    hidden = planned_pod(_runpod(ports="8888/http"), "prft-x")
    no_ip = planned_pod(_runpod(support_public_ip=False), "prft-x")
    assert check_transfer_before_renting("sftp", exposed.handle, exposed.description) == "sftp"
    for plan in (hidden, no_ip):
        with pytest.raises(SpecError, match="no direct-TCP SSH endpoint"):
            check_transfer_before_renting("sftp", plan.handle, plan.description)


def test_plan_predicts_what_the_run_decides_for_each_pod_runpod_may_give():
    """``plan`` said ``sftp`` for RunPod's default spec, whose run then used ``pty``: the
    direct endpoint appears only when the host grants a public IP, which shows once the pod
    runs. The prediction now comes from the run's own choice (``pick_method``) on both."""
    from prefect_runpod.blocks.transfer.dispatch import pick_method

    exposed = planned_pod(_runpod(), "prft-x")
    assert exposed.gateway_only is not None and exposed.gateway_only.direct_ssh is None
    direct = pick_method(exposed.handle)  # rsync (sftp on a machine without rsync)
    assert direct in ("rsync", "sftp") and pick_method(exposed.gateway_only) == "pty"

    def said(method: str, plan) -> str:
        return check_transfer_before_renting(
            method, plan.handle, plan.description, None, plan.gateway_only
        )

    assert said("auto", exposed) == f"{direct} if the host grants a public IP for 22/tcp, else pty"
    assert said("sftp", exposed).startswith("sftp if the host grants a public IP for 22/tcp; ")
    assert said("pty", exposed) == "pty"
    hidden = planned_pod(_runpod(ports="8888/http"), "prft-x")
    assert hidden.gateway_only is None and said("auto", hidden) == "pty"
    local = planned_pod(LocalPodProvider(mode="direct"), "prft-x")
    assert local.gateway_only is None and said("auto", local) == direct


def test_the_key_shown_is_the_one_in_use(monkeypatch, tmp_path):
    """The way in showed ``-i '~/.ssh/id_ed25519_runpod'`` (quoted, so ``~`` never
    expanded) even when the run used a saved RunPodSSHKey block. The file in use is named
    as it is; with a block (or a local pod) the run keeps the key beside its outputs."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RUNPOD_SSH_KEY_PATH", raising=False)
    assert ssh_key_file({"provider": "runpod"}) == str(tmp_path / ".ssh/id_ed25519_runpod")
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", "~/keys/rp")
    assert ssh_key_file({"provider": "runpod"}) == str(tmp_path / "keys/rp")
    assert ssh_key_file({"provider": "runpod", "ssh_key_block": "team-key"}) is None
    assert ssh_key_file({"provider": "local"}) is None


def test_the_disk_the_bundle_lands_on():
    container = planned_pod(_runpod(container_disk_gb=20, volume_gb=0), "prft-x")
    volume = planned_pod(_runpod(container_disk_gb=20, volume_gb=100), "prft-x")
    elsewhere = planned_pod(
        _runpod(container_disk_gb=20, volume_gb=100, volume_mount_path="/data"), "prft-x"
    )
    assert (container.disk_bytes, container.disk_description) == (
        20 * 10**9,
        "the pod's 20 GB container disk",
    )
    assert volume.disk_bytes == 100 * 10**9 and "volume" in volume.disk_description
    assert elsewhere.disk_bytes == 20 * 10**9


def test_the_upload_is_held_against_the_disk():
    files = BundleFiles(root="/b", files=["a", "b"], total_bytes=3 * 2**30, ignored_files=4)
    line = check_pod_disk(files, 20 * 10**9, "the pod's 20 GB container disk")
    assert line.startswith("upload: 2 files, 3221225472 bytes (3.0 GiB), 4 left out by")
    assert "16.11% of the pod's 20 GB container disk" in line
    with pytest.raises(SpecError, match=r"hold 3\.0 GiB, more than the pod's 1 GB container disk"):
        check_pod_disk(files, 10**9, "the pod's 1 GB container disk")
    assert "%" not in check_pod_disk(files, None, "unknown")


def test_settings_carry_the_checked_values_and_the_selected_files(tmp_path):
    bundle = copy_demo_bundle(tmp_path / "bundle")
    (bundle / "__pycache__").mkdir()
    (bundle / "__pycache__" / "x.pyc").write_bytes(b"\0")
    settings = validate_settings(
        bundle=bundle,
        provider="local",
        model_id=None,
        transfer_method="auto",
        max_cost_usd=2,
        max_runtime_seconds=60,
        name_prefix="prft",
        output_dir=tmp_path / "out",
        parity_tolerance=0.05,
        heartbeat_stale_seconds=30,
        pod_lifetime_seconds=600,
        hf_endpoint="https://hub.example/",
    )
    assert settings.max_cost_usd == 2.0 and settings.parity_tolerance == 0.05
    assert (settings.heartbeat_stale_seconds, settings.pod_lifetime_seconds) == (30.0, 600.0)
    assert settings.hf_endpoint == "https://hub.example"
    assert settings.upload is not None and "bundle.toml" in settings.upload.files
    assert not any("__pycache__" in p for p in settings.upload.files)
    assert settings.upload.ignored_files == 1


def test_pty_framing_and_streams_reach_the_transfers_options(tmp_path):
    bundle = copy_demo_bundle(tmp_path / "bundle")
    settings = validate_settings(
        bundle=bundle, output_dir=tmp_path / "out", pty_framing="base64", pty_streams=3
    )
    opts = settings.transfer_options()
    assert (opts.framing, opts.streams) == ("base64", 3)
    default = validate_settings(bundle=bundle, output_dir=tmp_path / "out")
    assert (default.transfer_options().framing, default.transfer_options().streams) == ("auto", 1)
    with pytest.raises(SpecError, match=r"pty_framing \(--pty-framing\) 'binary' is not one of"):
        validate_settings(bundle=bundle, output_dir=tmp_path / "out", pty_framing="binary")


def test_the_cli_passes_the_pty_options_to_the_flow():
    from prefect_runpod.flows.cli import build_parser
    from prefect_runpod.flows.cli.launch import finetune_params

    args = build_parser().parse_args(["finetune", "--pty-framing", "raw", "--pty-streams", "2"])
    params = finetune_params(args)
    assert (params["pty_framing"], params["pty_streams"]) == ("raw", 2)


def test_prepare_run_on_runpod_without_saved_blocks(tmp_path, monkeypatch, runpod_emulator):
    """RunPod, no saved blocks: the key from the environment, the default spec; sftp is
    possible there (22/tcp on a public IP, checked again once the pod runs), runpodctl
    is not without the binary on this machine; the GPU types are checked against the
    (emulated) catalog, read and nothing else."""
    key = tmp_path / "id_ed25519_runpod"
    key.write_text(RunPodSSHKey.generate().get_private_key().get_secret_value())
    monkeypatch.setenv("RUNPOD_API_KEY", runpod_emulator.api_key)
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(key))
    params = {
        "provider": "runpod",
        "transfer_method": "sftp",
        "output_dir": tmp_path / "out",
        "max_runtime_seconds": 60.0,
    }
    run = prepare_run(params, demo_bundle=DEMO_BUNDLE, run_name="prft-x")
    assert run.provider.provider_name == "runpod" and run.hf.source == "none"
    assert run.settings.bundle.root == str(DEMO_BUNDLE.resolve())
    assert run.upload_line.startswith("upload: ") and "20 GB volume" in run.upload_line
    assert {r["operation"] for r in runpod_emulator.requests} == {"listGpuTypes"}
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SpecError, match="runpodctl is not installed on this machine"):
        prepare_run(
            {**params, "transfer_method": "runpodctl"}, demo_bundle=DEMO_BUNDLE, run_name="x"
        )
