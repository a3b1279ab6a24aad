"""The sftp method against a real OpenSSH sshd on loopback (direct mode)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.pod_tools import POD_TOOLS_DIR
from prefect_runpod.blocks.transfer.sftp import SftpSession, sftp_download, sftp_upload
from tests.fixtures.transfer import make_tree

pytestmark = pytest.mark.sshd


def _tree_entries(root: Path) -> list[dict]:
    return mf.compute_manifest(str(root))["entries"]


def test_sftp_roundtrip_with_resume_and_drop(tmp_path: Path, sshd_server) -> None:
    src = make_tree(tmp_path / "src")
    remote = str(sshd_server.home / f"up-{os.getpid()}")
    tools = str(sshd_server.home / POD_TOOLS_DIR)
    source = Manifest.compute(src)
    big = next(e for e in source.entries if e.path.endswith("big.bin"))
    # a verified prefix already on the pod, and one bad prefix that must be redone
    Path(remote, "sub dir", "deeper").mkdir(parents=True)
    Path(remote, big.path + ".part").write_bytes((src / big.path).read_bytes()[:100_000])
    Path(remote, "text.log.part").write_bytes(b"garbage that is not the prefix")
    drops = {"left": 1}
    endpoint, key = sshd_server.endpoint(), sshd_server.client_key.private_key

    def flaky() -> SftpSession:
        s = SftpSession(endpoint, key, tools)
        if drops["left"]:
            drops["left"] -= 1
            s.client.close()  # the first connection dies under the transfer
        return s

    up = sftp_upload(endpoint, key, src, remote, source, tools_dir=tools, session_factory=flaky)
    assert up.reconnects == 1 and up.source_manifest == source
    assert up.dest_manifest.entries == source.entries
    assert _tree_entries(Path(remote)) == source.as_dict()["entries"]
    back = tmp_path / "back"
    down = sftp_download(endpoint, key, remote, back, tools_dir=tools)
    assert down.source_manifest.entries == source.entries
    assert down.dest_manifest == Manifest.compute(back)
    assert _tree_entries(back) == source.as_dict()["entries"]
