"""upload_dir / download_dir through real consoles: the local pod's PTY-only gateway,
its direct mode (SFTP), and a real OpenSSH sshd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.faults import FAULTS_ENV
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.dispatch import download_dir, pick_method, upload_dir
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools, tools_dir
from prefect_runpod.blocks.transfer.pty import PtyOptions
from prefect_runpod.blocks.transfer.rsync import RsyncOptions
from tests.fixtures.local_pod import start_pod
from tests.fixtures.transfer import FaultHooks, make_tree

pytestmark = pytest.mark.slow


def _drop(console: PodConsole) -> None:
    """Cut the TCP connection under the console (the pod's shell gets SIGHUP)."""
    transport = console._client.get_transport()  # noqa: SLF001 - the test severs the real link
    assert transport is not None
    transport.close()


def test_gateway_pty_roundtrip_with_drops(tmp_path: Path, local_pod) -> None:
    _, handle, keypair = local_pod
    assert pick_method(handle) == "pty"
    with pytest.raises(SpecError, match="sftp"):
        pick_method(handle, "sftp")
    src = make_tree(tmp_path / "src")
    opts = PtyOptions(chunk_bytes=128 * 1024, window_bytes=1024 * 1024, stall_seconds=3.0)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        remote = bootstrap_pod_tools(console, handle)
        assert remote == tools_dir(handle)
        before = console.run(f"ls {remote}").output
        assert "receiver.py" in before and "manifest.py" in before
        bootstrap_pod_tools(console, handle)  # idempotent
        hooks = FaultHooks(drop_at_bytes=1024 * 1024, drop=lambda: _drop(console))
        report = upload_dir(console, handle, src, "bundle", options=opts, hooks=hooks)
        assert hooks.fired == ["drop"] and report.verified and report.retries >= 1
        assert report.method == "pty"
        # the local gateway relays bytes verbatim: the probe passes, raw frames travel
        assert report.link is not None
        assert (report.link.framing, report.link.probe) == ("raw", "passed")
        assert report.dest_manifest.root.endswith("/bundle")
        assert [e.path for e in report.dest_manifest.entries] == [
            e["path"] for e in mf.compute_manifest(str(src))["entries"]
        ]
        hooks = FaultHooks(drop_at_bytes=1024 * 1024, drop=lambda: _drop(console))
        back = tmp_path / "back"
        down = download_dir(console, handle, "bundle", back, options=opts, hooks=hooks)
        assert hooks.fired == ["drop"] and down.verified
        assert mf.compute_manifest(str(back))["entries"] == mf.compute_manifest(str(src))["entries"]
        # the console still works after the stream and the drops
        assert console.run("echo still-here").output.strip() == "still-here"


def test_cooked_gateway_path_falls_back_to_base64_and_the_console_stays_healthy(
    tmp_path: Path, local_provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that relays bytes as a cooked terminal would (control bytes mangled):
    the probe fails, base64 frames carry the files intact, the console keeps working."""
    monkeypatch.setenv(FAULTS_ENV, "gateway_relay:cooked")
    handle, keypair = start_pod(local_provider)
    monkeypatch.delenv(FAULTS_ENV)
    try:
        src = make_tree(tmp_path / "src", big_bytes=600_000)
        opts = PtyOptions(chunk_bytes=64 * 1024, stall_seconds=3.0)
        with PodConsole.for_pod(handle, keypair.private_key) as console:
            assert console.run("echo before").output.strip() == "before"
            report = upload_dir(console, handle, src, "bundle", options=opts)
            assert report.verified and report.link is not None
            assert (report.link.framing, report.link.probe) == ("base64", "failed")
            # the relay dropped the NUL going in and turned LF into CR LF coming out
            assert "byte 0 sent 0x00 got 0x01" in report.link.probe_detail
            assert "sent 0x0a got 0x0d" in report.link.probe_detail
            assert console.run("echo still-here").output.strip() == "still-here"
            back = tmp_path / "back"
            down = download_dir(console, handle, "bundle", back, options=opts)
            assert down.verified and down.link is not None and down.link.framing == "base64"
            assert (
                mf.compute_manifest(str(back))["entries"]
                == mf.compute_manifest(str(src))["entries"]
            )
            with pytest.raises(TransferError, match="--pty-framing"):
                upload_dir(console, handle, src, "raw", options=PtyOptions(framing="raw"))
            assert console.run("echo ok").output.strip() == "ok"
    finally:
        local_provider.terminate(handle.pod_id)


def test_gateway_disk_limit_names_file(tmp_path: Path, local_pod) -> None:
    _, handle, keypair = local_pod
    src = make_tree(tmp_path / "src")
    opts = PtyOptions(shell_prefix="ulimit -f 512;", stall_seconds=3.0)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        with pytest.raises(TransferError, match=r"big\.bin") as info:
            upload_dir(console, handle, src, "full", options=opts)
        assert handle.pod_id in str(info.value)
        assert console.run("echo ok").output.strip() == "ok"


def test_direct_pod_picks_rsync_then_sftp(tmp_path: Path, direct_pod) -> None:
    _, handle, keypair = direct_pod
    assert pick_method(handle) == "rsync"
    src = make_tree(tmp_path / "src")
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        report = upload_dir(console, handle, src, "rsynced", private_key=keypair.private_key)
        assert report.method == "rsync" and report.verified
        # a pod whose image has no rsync: auto takes sftp
        report = upload_dir(
            console,
            handle,
            src,
            "bundle",
            private_key=keypair.private_key,
            options=RsyncOptions(pod_exe="rsync-missing"),
        )
        assert report.method == "sftp" and report.verified
        down = download_dir(
            console, handle, "bundle", tmp_path / "back", private_key=keypair.private_key
        )
        assert down.verified and down.source_manifest == report.dest_manifest.model_copy(
            update={"root": down.source_manifest.root}
        )


@pytest.mark.sshd
def test_real_sshd_pty_and_sftp(tmp_path: Path, sshd_server) -> None:
    handle = sshd_server.handle(pod_id=f"sshd-{os.getpid()}")
    key = sshd_server.client_key.private_key
    src = make_tree(tmp_path / "src")
    with PodConsole.for_pod(handle, key) as console:
        for method in ("pty", "sftp"):
            up = upload_dir(console, handle, src, f"tx-{method}", method=method, private_key=key)
            assert up.verified and up.method == method
            down = download_dir(
                console, handle, f"tx-{method}", tmp_path / method, method=method, private_key=key
            )
            assert down.verified
            assert (
                mf.compute_manifest(str(tmp_path / method))["entries"]
                == mf.compute_manifest(str(src))["entries"]
            )


def test_upload_sends_only_the_selected_paths(tmp_path: Path, local_pod) -> None:
    """``upload_dir(paths=…)``: what preflight selected (ignore file, secret scan) is all
    that reaches the pod; the files left out never leave this machine."""
    _, handle, keypair = local_pod
    src = make_tree(tmp_path / "src", big_bytes=100_000)
    (src / ".env").write_text("HF_TOKEN=left-behind\n")
    chosen = ["empty.txt", "sub dir/naïve café ✓.json", "text.log"]
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        report = upload_dir(console, handle, src, "sel", paths=chosen)
        listing = console.run(f"cd {handle.workdir}/sel && find . -type f | sort").output
    assert report.verified and [e.path for e in report.dest_manifest.entries] == chosen
    assert listing.split("\n") == ["./empty.txt", "./sub dir/naïve café ✓.json", "./text.log"]


def test_gateway_streams_stripe_over_extra_ssh_sessions(tmp_path: Path, local_pod) -> None:
    """``streams=3``: large files travel as segments over three SSH sessions to the
    gateway, each its own receiver, joined and verified on the pod (and here)."""
    _, handle, keypair = local_pod
    src = make_tree(tmp_path / "src")
    opts = PtyOptions(chunk_bytes=64 * 1024, streams=3, stall_seconds=3.0)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        with pytest.raises(SpecError, match="need the private key"):
            upload_dir(console, handle, src, "striped", method="pty", options=opts)
        report = upload_dir(
            console, handle, src, "striped", options=opts, private_key=keypair.private_key
        )
        assert report.verified and report.link is not None and report.link.streams == 3
        down = download_dir(
            console,
            handle,
            "striped",
            tmp_path / "back",
            options=opts,
            private_key=keypair.private_key,
        )
        assert down.verified and down.link is not None and down.link.streams == 3
        left = console.run(f"find {handle.workdir}/striped -name '*.part*' | wc -l").output
        assert left.strip() == "0"
        assert console.run("echo ok").output.strip() == "ok"
    assert (
        mf.compute_manifest(str(tmp_path / "back"))["entries"]
        == mf.compute_manifest(str(src))["entries"]
    )
