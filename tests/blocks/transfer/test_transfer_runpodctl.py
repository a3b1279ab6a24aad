"""The runpodctl method with a stand-in executable (the croc relay is unreachable
here) that prints RunPod's real output: colours, progress redraws, "Code is: …"."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.dispatch import download_dir, upload_dir
from prefect_runpod.blocks.transfer.runpodctl import RunpodctlOptions, parse_code
from tests.fixtures.transfer import make_tree


def test_parse_code_from_coloured_log() -> None:
    log = (
        "Sending 'data.txt' (5 B)\r\n\x1b[1mCode is: 8338-galileo-collect-fidel\x1b[0m\r\n"
        "On the other computer run\n\nrunpodctl receive 8338-galileo-collect-fidel\n"
        "\r\x1b[36mdata.txt\x1b[0m  50% |#####"
    )
    assert parse_code(log) == "8338-galileo-collect-fidel"
    assert parse_code("Code is: 3528-baron-ritual-lecture-8\n") == "3528-baron-ritual-lecture-8"
    assert parse_code("Sending 'x' (5 B)\n") is None
    # tput sgr0 resets with ESC ( B, a charset escape the console's grammar knows; a
    # progress redraw may follow the code on the same line
    assert parse_code("Code is: 12-\x1b[33mbaron\x1b(B\x1b[m-ritual\r 10% |#") == "12-baron-ritual"


@pytest.mark.slow
def test_runpodctl_roundtrip_on_local_pod(tmp_path: Path, local_pod, runpodctl_standin) -> None:
    _, handle, keypair = local_pod
    src = make_tree(tmp_path / "bundle", big_bytes=200_000)
    opts = RunpodctlOptions(local_exe=runpodctl_standin, pod_exe=runpodctl_standin)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        up = upload_dir(console, handle, src, "work/bundle", method="runpodctl", options=opts)
        assert up.verified and up.method == "runpodctl"
        down = download_dir(
            console, handle, "work/bundle", tmp_path / "back", method="runpodctl", options=opts
        )
        assert down.verified
    assert (
        mf.compute_manifest(str(tmp_path / "back"))["entries"]
        == mf.compute_manifest(str(src))["entries"]
    )


@pytest.mark.slow
def test_runpodctl_sends_only_the_selected_paths(
    tmp_path: Path, local_pod, runpodctl_standin
) -> None:
    """runpodctl sends folders whole, so a selection travels as a staging copy: the
    files left out never reach the relay or the pod."""
    _, handle, keypair = local_pod
    src = make_tree(tmp_path / "bundle", big_bytes=50_000)
    (src / ".env").write_text("HF_TOKEN=left-behind\n")
    chosen = ["empty.txt", "text.log"]
    opts = RunpodctlOptions(local_exe=runpodctl_standin, pod_exe=runpodctl_standin)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        up = upload_dir(
            console, handle, src, "work/sel", method="runpodctl", options=opts, paths=chosen
        )
        listing = console.run(f"cd {handle.workdir}/work/sel && find . -type f | sort").output
    assert up.verified and [e.path for e in up.dest_manifest.entries] == chosen
    assert listing.split("\n") == ["./empty.txt", "./text.log"]


@pytest.mark.slow
def test_a_pod_without_runpodctl_is_refused_before_any_byte_moves(
    local_pod, runpodctl_standin
) -> None:
    """This machine has runpodctl, the pod does not: ``check_pod_end`` (run right after
    the pod is ready) says so, naming the pod."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.transfer.dispatch import check_pod_end

    _, handle, keypair = local_pod
    opts = RunpodctlOptions(local_exe=runpodctl_standin, pod_exe="no-runpodctl-here")
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        assert check_pod_end(console, handle, "pty") == "pty"
        with pytest.raises(SpecError, match=f"pod {handle.pod_id} has no 'no-runpodctl-here'"):
            check_pod_end(console, handle, "runpodctl", options=opts)
        assert console.run("echo alive").output.strip() == "alive"
