"""The rsync method against a real OpenSSH sshd on loopback (direct mode): the tree kept
exactly, the key and host key in a private folder, files already there not sent, a
rewritten file sent as a delta, an interrupted file resumed."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.base import TransferHooks
from prefect_runpod.blocks.transfer.dispatch import check_pod_end, download_dir, upload_dir
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.openssh_login import close_shared_connections
from prefect_runpod.blocks.transfer.pod_tools import tools_dir
from prefect_runpod.blocks.transfer.rsync import PARTIAL_DIR, RsyncOptions
from tests.fixtures.sshd import SshdServer
from tests.fixtures.transfer import CuttingProxy, make_tree

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _modes(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode)
        for p in root.rglob("*")
        if not p.is_symlink() and not mf.is_transfer_scratch(p.name)
    }


def _stamps(root: Path) -> dict[str, tuple[int, int]]:
    """Each file's inode and ctime: any write or replacement changes one of them."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_ctime_ns)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def _tree(tmp_path: Path) -> Path:
    src = make_tree(tmp_path / "src", big_bytes=2 * 1024 * 1024 + 3)
    (src / "ckpt" / "empty").mkdir(parents=True)
    (src / "current").symlink_to("sub dir")
    (src / "ckpt" / "latest.json").symlink_to("../sub dir/naïve café ✓.json")
    run = src / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o750)
    (src / "text.log").chmod(0o600)
    (src / "ckpt").chmod(0o700)
    return src


class _KeyWatch(TransferHooks):
    """Looks at the transfer's private folder while bytes move."""

    def __init__(self, temp: Path) -> None:
        self.temp, self.seen = temp, []

    def progress(self, done_bytes: int) -> None:
        for folder in self.temp.glob("prefect-runpod-ssh-*"):
            key = folder / "key"
            self.seen.append(
                (stat.S_IMODE(key.stat().st_mode), (folder / "known_hosts").read_text())
            )


def test_the_tree_travels_exactly_with_its_modes_and_the_key_file_goes_afterwards(
    tmp_path: Path, sshd_server: SshdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # short enough for a control socket's path (pytest's tmp_path may not be)
    temp = Path(tempfile.mkdtemp(prefix="rsync-tmp-"))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    handle = sshd_server.handle(pod_id=f"rsync-{os.getpid()}")
    key = sshd_server.client_key.private_key
    src = _tree(tmp_path)
    watch = _KeyWatch(temp)
    progress: list[tuple[int, int]] = []
    with PodConsole.for_pod(handle, key) as console:
        assert check_pod_end(console, handle, private_key=key) == "rsync"
        up = upload_dir(
            console,
            handle,
            src,
            "tree",
            private_key=key,
            hooks=watch,
            on_progress=lambda done, total: progress.append((done, total)),
        )
        assert up.method == "rsync" and up.verified and up.sent_bytes == up.bytes
        back = tmp_path / "back"
        down = download_dir(console, handle, "tree", back, method="rsync", private_key=key)
    on_pod = sshd_server.home / "tree"
    want = mf.compute_manifest(str(src))["entries"]
    assert mf.compute_manifest(str(on_pod))["entries"] == want
    assert down.verified and mf.compute_manifest(str(back))["entries"] == want
    assert _modes(on_pod) == _modes(src) and _modes(back) == _modes(src)
    assert os.readlink(on_pod / "current") == "sub dir" and (on_pod / "ckpt" / "empty").is_dir()
    assert progress and progress[-1] == (up.bytes, up.bytes)
    pinned = f"[{handle.ssh.host}]:{handle.ssh.port} {sshd_server.host_key}\n"  # type: ignore[union-attr]
    assert watch.seen and all(seen == (0o600, pinned) for seen in watch.seen)
    # key, known_hosts and file list are gone: what stays is the shared connection's
    # control socket, for the pod's next transfer
    left = [p for p in temp.rglob("*") if not p.is_dir()]
    assert [p.parent.name.startswith("prefect-runpod-cm-") for p in left] == [True]
    assert stat.S_ISSOCK(left[0].stat().st_mode)
    close_shared_connections()
    assert list(temp.iterdir()) == []
    temp.rmdir()


def test_files_already_there_are_not_sent_and_a_rewritten_one_travels_as_a_delta(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    handle = sshd_server.handle(pod_id=f"rsync-{os.getpid()}")
    key = sshd_server.client_key.private_key
    src = _tree(tmp_path)
    big = src / "sub dir" / "deeper" / "big.bin"
    on_pod = sshd_server.home / "delta"
    with PodConsole.for_pod(handle, key) as console:
        upload_dir(console, handle, src, "delta", method="rsync", private_key=key)
        before = _stamps(on_pod)
        again = upload_dir(console, handle, src, "delta", method="rsync", private_key=key)
        assert again.verified and again.sent_bytes == 0 and _stamps(on_pod) == before
        # a checkpoint rewritten in place: 64 KiB of its 2 MiB changed
        data = bytearray(big.read_bytes())
        data[500_000 : 500_000 + 65536] = os.urandom(65536)
        big.write_bytes(bytes(data))
        delta = upload_dir(console, handle, src, "delta", method="rsync", private_key=key)
        assert delta.verified and 65536 <= delta.sent_bytes < 300_000  # type: ignore[operator]
        # same size and time, other bytes: the manifest, not rsync's quick check, decides
        kept = big.stat()
        data[0:10] = b"0123456789"
        big.write_bytes(bytes(data))
        os.utime(big, ns=(kept.st_atime_ns, kept.st_mtime_ns))
        same = upload_dir(console, handle, src, "delta", method="rsync", private_key=key)
        assert same.verified and same.sent_bytes and same.retries == 0
    assert (on_pod / "sub dir" / "deeper" / "big.bin").read_bytes() == bytes(data)
    # each upload's record of what the pod hashed was used by its verify step, and gone
    assert list(Path(tools_dir(handle)).glob("known-*.json")) == []


def test_an_interrupted_transfer_resumes_from_what_arrived(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    key = sshd_server.client_key.private_key
    src = tmp_path / "src"
    src.mkdir()
    payload = os.urandom(8 * 1024 * 1024)
    (src / "weights.bin").write_bytes(payload)
    # what a cut transfer leaves: the first 6 MiB in rsync's partial folder
    partial = sshd_server.home / "resume" / PARTIAL_DIR
    partial.mkdir(parents=True)
    (partial / "weights.bin").write_bytes(payload[: 6 * 1024 * 1024])
    handle = sshd_server.handle(pod_id=f"rsync-{os.getpid()}")
    with PodConsole.for_pod(handle, key) as console:
        up = upload_dir(console, handle, src, "resume", method="rsync", private_key=key)
        assert up.verified and up.sent_bytes < 3 * 1024 * 1024  # type: ignore[operator]
        assert not partial.exists()
        # the link dies 5 MiB into the next transfer: rsync reconnects and carries on
        # from what arrived, so well under the whole file crosses after the cut
        with CuttingProxy(sshd_server.port, 5 * 1024 * 1024) as proxy:
            assert handle.ssh is not None
            far = handle.model_copy(
                update={"ssh": handle.ssh.model_copy(update={"port": proxy.port})}
            )
            cut = upload_dir(console, far, src, "cut", method="rsync", private_key=key)
        assert proxy.cuts == 1 and cut.retries == 1 and cut.verified  # the one reconnect
        assert cut.sent_bytes < 5 * 1024 * 1024  # type: ignore[operator]
    assert (sshd_server.home / "cut" / "weights.bin").read_bytes() == payload


_LATE_RSYNC = """#!/usr/bin/env python3
# rsync whose input ends 2 s after the connection's: it learns of a cut late
import os, subprocess, sys, threading, time
rsync = subprocess.Popen(["rsync", *sys.argv[1:]], stdin=subprocess.PIPE)
def feed():
    while chunk := os.read(0, 65536):
        try:
            rsync.stdin.write(chunk)
            rsync.stdin.flush()
        except OSError:
            return
    time.sleep(2)
    rsync.stdin.close()
threading.Thread(target=feed, daemon=True).start()
os._exit(rsync.wait())
"""


def test_a_cut_the_pods_rsync_sees_late_still_resumes_from_what_arrived(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    """The pod's receiving rsync learns of the cut 2 s after the client does (its input
    held open: a busy pod's receiver, or a link that dies on the client's side first):
    the next attempt waits for it to exit, keeping what arrived, and sends only the
    rest. Before, it started at once, found no partial file and sent the whole file
    again (what a loaded machine's suite hit), and the late receiver's partial file
    was left behind it."""
    key = sshd_server.client_key.private_key
    src = tmp_path / "src"
    src.mkdir()
    payload = os.urandom(8 * 1024 * 1024)
    (src / "weights.bin").write_bytes(payload)
    late = tmp_path / "late-rsync"
    late.write_text(_LATE_RSYNC)
    late.chmod(0o755)
    handle = sshd_server.handle(pod_id=f"rsync-late-{os.getpid()}")
    assert handle.ssh is not None
    with (
        PodConsole.for_pod(handle, key) as console,
        CuttingProxy(sshd_server.port, 5 * 1024 * 1024) as proxy,
    ):
        far = handle.model_copy(update={"ssh": handle.ssh.model_copy(update={"port": proxy.port})})
        cut = upload_dir(
            console, far, src, "late", method="rsync", private_key=key,
            options=RsyncOptions(pod_exe=str(late)),
        )  # fmt: skip
    assert proxy.cuts == 1 and cut.verified
    assert cut.sent_bytes < 5 * 1024 * 1024, cut  # type: ignore[operator]
    landed = sshd_server.home / "late"
    assert (landed / "weights.bin").read_bytes() == payload
    assert not (landed / PARTIAL_DIR).exists()


def test_a_pod_without_rsync_is_refused_by_name_and_auto_takes_sftp(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    handle = sshd_server.handle(pod_id=f"rsync-{os.getpid()}")
    key = sshd_server.client_key.private_key
    missing = RsyncOptions(pod_exe="rsync-not-installed")
    src = make_tree(tmp_path / "src", big_bytes=1000)
    with PodConsole.for_pod(handle, key) as console:
        with pytest.raises(SpecError, match="has no 'rsync-not-installed' on its PATH"):
            check_pod_end(console, handle, "rsync", private_key=key, options=missing)
        assert check_pod_end(console, handle, private_key=key, options=missing) == "sftp"
        up = upload_dir(console, handle, src, "fallback", private_key=key, options=missing)
    assert up.method == "sftp" and up.verified


def test_the_login_starts_while_the_tree_is_hashed_and_later_transfers_share_it(
    tmp_path: Path, sshd_server: SshdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection's round trips overlap the local hashing: the pod's sshd has been
    reached before the upload's local manifest is done, and that one connection is all
    the upload and then the download open; once it has died or been closed (or the
    caller keeps none), the next transfer logs in again."""
    key = sshd_server.client_key.private_key
    src = make_tree(tmp_path / "src", big_bytes=1024 * 1024)
    handle = sshd_server.handle(pod_id=f"rsync-early-{os.getpid()}")
    assert handle.ssh is not None
    compute = Manifest.compute
    seen_while_hashing: list[int] = []
    with (
        PodConsole.for_pod(handle, key) as console,
        CuttingProxy(sshd_server.port, 1 << 40) as proxy,  # counts, never cuts
    ):

        def hashing(*args: Any, **kwargs: Any) -> Manifest:
            found = compute(*args, **kwargs)
            deadline = time.monotonic() + 10
            while not proxy.connections and time.monotonic() < deadline:
                time.sleep(0.01)
            seen_while_hashing.append(proxy.connections)
            return found

        monkeypatch.setattr(Manifest, "compute", hashing)
        far = handle.model_copy(update={"ssh": handle.ssh.model_copy(update={"port": proxy.port})})
        up = upload_dir(console, far, src, "early", method="rsync", private_key=key)
        assert seen_while_hashing == [1] and proxy.connections == 1
        down = download_dir(console, far, "early", tmp_path / "back", private_key=key)
        assert down.method == "rsync" and proxy.connections == 1

        # the shared connection dies without removing its socket (a crash, an OOM kill)
        def masters() -> list[str]:
            pattern = f"-p {proxy.port} .*-M -N"
            found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
            return found.stdout.split()

        def eventually(check: Callable[[], bool]) -> bool:  # a master starts or ends apart
            deadline = time.monotonic() + 10
            while not check() and time.monotonic() < deadline:
                time.sleep(0.01)
            return check()

        def upload(folder: str, **kwargs: Any) -> None:  # each one sends: rsync runs
            sent = upload_dir(console, far, src, folder, method="rsync", private_key=key, **kwargs)
            assert sent.sent_bytes == sent.bytes

        assert eventually(lambda: len(masters()) == 1)
        os.kill(int(masters()[0]), signal.SIGKILL)
        upload("after-kill")
        assert proxy.connections == 2
        close_shared_connections()
        assert eventually(lambda: masters() == [])
        upload("kept-none", options=RsyncOptions(keep_connection_seconds=0))
        assert proxy.connections == 3 and eventually(lambda: masters() == [])
        upload("kept-again")
        assert proxy.connections == 4 and eventually(lambda: len(masters()) == 1)
    assert up.verified and up.sent_bytes == up.bytes and down.verified
    want = mf.compute_manifest(str(src))["entries"]
    assert mf.compute_manifest(str(tmp_path / "back"))["entries"] == want
