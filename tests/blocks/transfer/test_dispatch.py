"""Dispatch knows methods only through the registry: a fifth method registered here is
picked, configured and called by upload_dir / download_dir like the built-in ones."""

from __future__ import annotations

import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from prefect_runpod.blocks.console.session import CommandResult
from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.transfer import registry
from prefect_runpod.blocks.transfer.base import MethodConfig, MethodOptions, PodLink
from prefect_runpod.blocks.transfer.dispatch import download_dir, pick_method, upload_dir
from prefect_runpod.blocks.transfer.models import Manifest, MethodResult
from prefect_runpod.blocks.transfer.pod_tools import tools_dir
from prefect_runpod.blocks.transfer.registry import method_names, register_method
from prefect_runpod.blocks.transfer.s3 import S3Target
from tests.fixtures.transfer import make_tree


class _ShellStandIn:
    """Answers every command with exit 0 and no output (enough for the tools copy)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, timeout_seconds: float = 60, check: bool = False) -> CommandResult:
        self.commands.append(command)
        return CommandResult(command=command, output="", exit_code=0, seconds=0.0)


@dataclass
class CopyOptions(MethodOptions):
    """The fake method's own options."""

    tag: str = "default"
    corrupt_dest: bool = False


@dataclass
class CopyMethod:
    """A fifth method: copies trees on this machine (the 'pod' is a local folder)."""

    options: CopyOptions
    auto_priority: int | None = 99
    calls: list[tuple[str, PodLink, str]] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: MethodConfig) -> CopyMethod:
        method = cls(config.options_for(CopyOptions))
        BUILT.append(method)
        return method

    def unavailable(self, handle: PodHandle) -> str | None:
        return None

    def upload(self, pod, local_root, remote_root, source, *, on_progress=None) -> MethodResult:
        self.calls.append(("upload", pod, remote_root))
        shutil.copytree(local_root, remote_root)
        if self.options.corrupt_dest:
            next(Path(remote_root).rglob("text.log")).write_text("not the file")
        if on_progress:
            on_progress(source.total_bytes, source.total_bytes)
        return MethodResult(
            bytes=source.total_bytes,
            retries=1,
            reconnects=2,
            source_manifest=source,
            dest_manifest=Manifest.compute(remote_root),
        )

    def download(self, pod, remote_root, local_root, *, on_progress=None) -> MethodResult:
        self.calls.append(("download", pod, remote_root))
        shutil.copytree(remote_root, local_root)
        source = Manifest.compute(remote_root)
        return MethodResult(
            bytes=source.total_bytes,
            source_manifest=source,
            dest_manifest=Manifest.compute(local_root),
        )


BUILT: list[CopyMethod] = []


@pytest.fixture
def copy_method(monkeypatch: pytest.MonkeyPatch):
    """The registry with ``copy`` added, restored afterwards."""
    monkeypatch.setattr(registry, "METHOD_REGISTRY", dict(registry.METHOD_REGISTRY))
    BUILT.clear()
    register_method("copy", CopyMethod.from_config)
    yield BUILT
    BUILT.clear()


def _handle(tmp_path: Path, **kw: object) -> PodHandle:
    return PodHandle(
        pod_id="p-reg", name="n", provider="local", workdir=str(tmp_path / "pod"), **kw
    )


def test_registered_method_carries_upload_and_download(tmp_path: Path, copy_method) -> None:
    handle = _handle(tmp_path)
    shell = _ShellStandIn()
    src = make_tree(tmp_path / "src", big_bytes=10_000)
    seen: list[tuple[int, int]] = []
    up = upload_dir(
        shell,  # type: ignore[arg-type]
        handle,
        src,
        "bundle",
        method="copy",
        options=CopyOptions(tag="mine"),
        on_progress=lambda done, total: seen.append((done, total)),
    )
    assert up.method == "copy" and up.verified and up.direction == "upload"
    assert up.retries == 3  # retries + reconnects
    assert up.source_manifest == Manifest.compute(src)
    assert up.bytes == up.source_manifest.total_bytes and seen[-1] == (up.bytes, up.bytes)
    (method,) = copy_method
    assert method.options.tag == "mine"
    kind, link, remote = method.calls[0]
    assert kind == "upload" and remote == f"{handle.workdir}/bundle"
    assert link.handle is handle and link.console is shell and link.tools_dir == tools_dir(handle)
    assert any("receiver.py" in c for c in shell.commands)  # the pod tools went first

    down = download_dir(shell, handle, "bundle", tmp_path / "back", method="copy")  # type: ignore[arg-type]
    assert down.method == "copy" and down.verified and down.direction == "download"
    assert copy_method[-1].options == CopyOptions()  # no options given: its defaults
    assert Manifest.compute(tmp_path / "back").entries == up.source_manifest.entries


def test_the_local_manifest_is_hashed_while_the_pod_tools_are_checked(
    tmp_path: Path, copy_method, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload's hashing and the tools check (a round trip to the pod) overlap: the
    hashing here waits until the check has begun, which it could not if it came first.
    The hashing stays on the caller's thread (large reads on a short-lived thread left
    20-30 MiB more resident in its allocator arena), and a tree the manifest refuses
    still fails the upload before any file moves."""
    checking = threading.Event()
    compute = Manifest.compute.__func__  # type: ignore[attr-defined]

    def hash_once_checked(cls, *args, **kw):  # type: ignore[no-untyped-def]
        assert checking.wait(30), "the manifest was computed before the tools check began"
        assert threading.current_thread() is threading.main_thread()
        return compute(cls, *args, **kw)

    shell = _ShellStandIn()
    real_run = shell.run

    def run(command: str, timeout_seconds: float = 60, check: bool = False) -> CommandResult:
        checking.set()
        return real_run(command, timeout_seconds, check)

    monkeypatch.setattr(shell, "run", run)
    monkeypatch.setattr(Manifest, "compute", classmethod(hash_once_checked))
    src = make_tree(tmp_path / "src", big_bytes=10_000)
    up = upload_dir(shell, _handle(tmp_path), src, "bundle", method="copy")  # type: ignore[arg-type]
    assert up.verified and up.source_manifest.entries == up.dest_manifest.entries
    (src / "away").symlink_to("/etc/hostname")
    with pytest.raises(SpecError, match="away"):
        upload_dir(shell, _handle(tmp_path), src, "again", method="copy")  # type: ignore[arg-type]
    assert len(copy_method[-1].calls) == 0


def test_auto_follows_priority_and_availability(
    tmp_path: Path, copy_method, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = _handle(tmp_path)
    assert "copy" in method_names()
    assert pick_method(handle) == "copy"
    monkeypatch.setattr(
        CopyMethod, "unavailable", lambda self, h: f"pod {h.pod_id} is out of copy range"
    )
    assert pick_method(handle) == "pty"
    with pytest.raises(SpecError, match="out of copy range") as info:
        pick_method(handle, "copy")
    assert info.value.pod_id == "p-reg"
    with pytest.raises(SpecError, match="use auto, pty, sftp, rsync, s3, runpodctl, copy"):
        pick_method(handle, "carrier-pigeon")


def test_dispatch_refuses_a_result_that_does_not_verify(tmp_path: Path, copy_method) -> None:
    handle = _handle(tmp_path)
    src = make_tree(tmp_path / "src", big_bytes=1000)
    with pytest.raises(TransferError, match="did not verify"):
        upload_dir(
            _ShellStandIn(),  # type: ignore[arg-type]
            handle,
            src,
            "bundle",
            method="copy",
            options=CopyOptions(corrupt_dest=True),
        )


def test_register_refuses_auto_and_duplicates(copy_method) -> None:
    with pytest.raises(ValueError, match="auto"):
        register_method("auto", CopyMethod.from_config)
    with pytest.raises(ValueError, match="already registered"):
        register_method("copy", CopyMethod.from_config)
    register_method("copy", CopyMethod.from_config, replace=True)


def test_built_in_auto_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = SSHEndpoint(host="ssh.runpod.io", port=22, user="abc-123")
    direct = SSHEndpoint(host="203.0.113.7", port=40022, user="root", mode="direct")
    on_gateway = _handle(tmp_path, ssh=gateway)
    with_direct = _handle(tmp_path, ssh=gateway, direct_ssh=direct)
    assert pick_method(on_gateway) == "pty"
    assert pick_method(with_direct) == "rsync"  # this machine has rsync and ssh
    assert (
        pick_method(with_direct, s3=S3Target(bucket="vol1", volume_mount_path="/workspace")) == "s3"
    )
    # a plain bucket (no volume mount) is never a transfer path: it is a publish target
    assert pick_method(with_direct, s3=S3Target(bucket="models")) == "rsync"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert pick_method(with_direct) == "sftp"  # no rsync here
    with pytest.raises(SpecError, match="'rsync' is not on this machine's PATH"):
        pick_method(with_direct, "rsync")
    with pytest.raises(SpecError, match="no direct-TCP SSH endpoint, so rsync"):
        pick_method(on_gateway, "rsync")
    with pytest.raises(SpecError, match="runpodctl is not installed on this machine"):
        pick_method(on_gateway, "runpodctl")  # this machine's end, asked before any transfer
    (bin_dir / "runpodctl").write_text("#!/bin/sh\n")
    (bin_dir / "runpodctl").chmod(0o755)
    assert pick_method(on_gateway, "runpodctl") == "runpodctl"  # never chosen by auto
    with pytest.raises(SpecError, match="no direct-TCP SSH endpoint"):
        pick_method(on_gateway, "sftp")
    with pytest.raises(SpecError, match="needs an S3Target"):
        pick_method(on_gateway, "s3")


@dataclass
class ChunkedCopy(CopyMethod):
    """``copy``, one file per confirmed chunk, telling ``on_progress`` after each."""

    @classmethod
    def from_config(cls, config: MethodConfig) -> ChunkedCopy:
        return cls(config.options_for(CopyOptions))

    def upload(self, pod, local_root, remote_root, source, *, on_progress=None) -> MethodResult:
        done = 0
        for path in sorted(p for p in Path(local_root).rglob("*") if p.is_file()):
            target = Path(remote_root) / path.relative_to(local_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            done += path.stat().st_size
            self.calls.append(("chunk", pod, str(target)))
            if on_progress:
                on_progress(done, source.total_bytes)
        return MethodResult(
            bytes=done, source_manifest=source, dest_manifest=Manifest.compute(remote_root)
        )

    def download(self, pod, remote_root, local_root, *, on_progress=None) -> MethodResult:
        source = Manifest.compute(remote_root)
        self.upload(pod, remote_root, local_root, source, on_progress=on_progress)
        return MethodResult(
            bytes=source.total_bytes,
            source_manifest=source,
            dest_manifest=Manifest.compute(local_root),
        )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_dropped_by_the_collector_stops_the_transfer_at_the_next_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect_runpod.blocks.transfer.models import TransferProgress
    from prefect_runpod.flows.cli.session import orderly_signals
    from tests.blocks.test_interrupts import _drop_a_signal_inside_gc

    monkeypatch.setattr(registry, "METHOD_REGISTRY", dict(registry.METHOD_REGISTRY))
    method: list[ChunkedCopy] = []

    def build(config: MethodConfig) -> ChunkedCopy:
        method.append(ChunkedCopy.from_config(config))
        return method[-1]

    register_method("chunked", build)
    src = make_tree(tmp_path / "src", big_bytes=10_000)
    moved = TransferProgress("upload", "chunked")

    def on_progress(done: int, total: int) -> None:
        moved(done, total)
        if len(method[-1].calls) == 2:  # two chunks are in: Ctrl-C, dropped by gc
            _drop_a_signal_inside_gc(signal.SIGINT)

    with orderly_signals(), pytest.raises(KeyboardInterrupt):
        upload_dir(
            _ShellStandIn(),  # type: ignore[arg-type]
            _handle(tmp_path),
            src,
            "bundle",
            method="chunked",
            on_progress=on_progress,
        )
    assert len(method[-1].calls) == 2  # stopped at the chunk boundary after the drop
    partial = moved.partial_report()
    sent = sum(Path(target).stat().st_size for _kind, _pod, target in method[-1].calls)
    assert partial.bytes == sent > 0 and not partial.verified and partial.direction == "upload"


def test_a_download_that_fills_the_local_disk_says_so_naming_this_machine(
    tmp_path: Path, tiny_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "METHOD_REGISTRY", dict(registry.METHOD_REGISTRY))
    register_method("chunked", ChunkedCopy.from_config)
    handle = _handle(tmp_path)
    remote = make_tree(Path(handle.workdir) / "bundle")  # 3 MiB into a 1 MiB disk
    assert remote.is_dir()
    with pytest.raises(TransferError) as info:
        download_dir(_ShellStandIn(), handle, "bundle", tiny_disk / "outputs", method="chunked")  # type: ignore[arg-type]
    text = str(info.value)
    assert text.startswith(
        f"the local disk is full: the download from pod p-reg into {tiny_disk / 'outputs'} "
        "stopped (No space left on device; "
    ), text
    assert "free of 1.0 MiB there)" in text and "lost its connection" not in text
