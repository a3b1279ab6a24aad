"""Issue 25: a run's checkpoints — only the job's signal makes one complete, the pod
side writes its manifest only then, it is copied off the pod (only what changed is
sent), verified before it counts, the last N kept, and one that no longer verifies is
quarantined so the one before it is used."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.pod_side import checkpoints as pod_side
from prefect_runpod.blocks.pod_side import manifest as tree_manifest
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools
from prefect_runpod.flows.run.checkpoints import CheckpointStore, CheckpointSync
from tests.fixtures.local_pod import PodFixture


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def _verified(store: CheckpointStore, name: str, files: dict[str, bytes]) -> None:
    """``name`` accepted into ``store`` as a copy of a pod checkpoint with ``files``."""
    pod = _write(store.root.parent / "pod" / name, files)
    folder, _ = store.staging(name, tree_manifest.compute_manifest(str(pod)))
    _write(folder, files)
    assert store.accept(name, folder, tree_manifest.compute_manifest(str(pod)))


class TestThePodSide:
    def test_a_checkpoint_is_complete_only_once_renamed_and_only_then_has_a_manifest(
        self, tmp_path
    ):
        ck, manifests = tmp_path / "ck", tmp_path / "manifests"
        _write(ck / "step-4.tmp", {"model.json": b"{}"})
        listing = pod_side.scan(str(ck), str(manifests))
        assert listing == {"checkpoints": [], "incomplete": ["step-4.tmp"]}
        assert not manifests.exists()
        (ck / "step-4.tmp").rename(ck / "step-4")
        (found,) = pod_side.scan(str(ck), str(manifests), inline=True)["checkpoints"]
        assert (found["name"], found["step"], found["bytes"]) == ("step-4", 4, 2)
        assert json.loads((manifests / "step-4.json").read_text()) == found["tree"]

    def test_with_a_marker_only_the_marker_written_last_completes_it(self, tmp_path):
        ck, manifests = tmp_path / "ck", tmp_path / "manifests"
        _write(ck / "checkpoint-10", {"adapter_model.safetensors": b"x" * 10})
        assert pod_side.scan(str(ck), str(manifests), "COMPLETE")["checkpoints"] == []
        assert not manifests.exists()
        (ck / "checkpoint-10" / "COMPLETE").write_text("")
        (found,) = pod_side.scan(str(ck), str(manifests), "COMPLETE")["checkpoints"]
        assert found["step"] == 10

    def test_checkpoints_come_sorted_by_step_not_by_name(self, tmp_path):
        ck = tmp_path / "ck"
        for step in (100, 20, 3):
            _write(ck / f"step-{step}", {"m": str(step).encode()})
        names = [c["name"] for c in pod_side.scan(str(ck), str(tmp_path / "m"))["checkpoints"]]
        assert names == ["step-3", "step-20", "step-100"]


class TestTheStore:
    def test_only_files_matching_the_pods_manifest_are_accepted(self, tmp_path):
        store = CheckpointStore(tmp_path / "run")
        pod = _write(tmp_path / "pod" / "step-1", {"a": b"aaa"})
        manifest = tree_manifest.compute_manifest(str(pod))
        folder, _ = store.staging("step-1", manifest)
        _write(folder, {"a": b"aab"})  # not what the pod wrote
        assert not store.accept("step-1", folder, manifest)
        assert store.names() == [] and store.latest() is None

    def test_the_last_n_are_kept(self, tmp_path):
        store = CheckpointStore(tmp_path / "run", keep=2)
        for step in (1, 2, 3):
            _verified(store, f"step-{step}", {"m": f"{step}".encode()})
        assert store.names() == ["step-2", "step-3"]
        assert not (store.root / "step-1").exists()

    def test_a_checkpoint_that_no_longer_verifies_is_quarantined_and_the_one_before_used(
        self, tmp_path
    ):
        store = CheckpointStore(tmp_path / "run", keep=2)
        _verified(store, "step-3", {"m": b"three"})
        _verified(store, "step-4", {"m": b"four", "opt": b"state"})
        (store.root / "step-4" / "opt").write_bytes(b"half")  # damaged after it verified
        assert store.latest() == "step-3"
        assert (store.root / ".quarantine" / "step-4").is_dir()
        assert store.names() == ["step-3"]

    def test_files_already_verified_here_are_copied_locally_whatever_their_path(self, tmp_path):
        store = CheckpointStore(tmp_path / "run")
        _verified(store, "step-1", {"tokenizer.json": b"t" * 100, "model": b"one"})
        pod = _write(tmp_path / "pod2" / "step-2", {"sub/tok.json": b"t" * 100, "model": b"2"})
        folder, copied = store.staging("step-2", tree_manifest.compute_manifest(str(pod)))
        assert copied == 100
        assert (folder / "sub" / "tok.json").read_bytes() == b"t" * 100
        assert not (folder / "model").exists()


def _pod_run(console: PodConsole, command: str) -> None:
    result = console.run(command, timeout_seconds=60)
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_no_manifest_and_no_copy_before_the_jobs_signal_and_only_changes_are_sent(
    local_pod: PodFixture, tmp_path: Path
) -> None:
    """The job writes a checkpoint file by file, pausing between files, while the pod
    lives: the run looks after each file and neither a manifest nor a copy appears until
    the rename; the next checkpoint sends only the file that changed."""
    _, handle, keypair = local_pod
    q = shlex.quote
    root = f"{handle.workdir}/ck-test"
    folder, manifests = f"{root}/checkpoints", f"{root}/manifests"
    store = CheckpointStore(tmp_path / "run")
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        bootstrap_pod_tools(console, handle)
        sync = CheckpointSync(
            handle, keypair.private_key, store, pod_folder=folder, manifest_folder=manifests
        )
        tmp = f"{folder}/step-4.tmp"
        _pod_run(console, f"mkdir -p {q(tmp)}")
        for name, size in (("weights.bin", 200_000), ("optimizer.bin", 50_000), ("state", 10)):
            _pod_run(console, f"head -c {size} /dev/urandom > {q(tmp + '/' + name)}")
            assert sync.poll_once() is None  # not signalled: nothing happens
            assert console.run(f"test -e {q(manifests)}").exit_code != 0
            assert not (store.root / ".incoming").exists() and store.names() == []
        _pod_run(console, f"mv {q(tmp)} {q(folder + '/step-4')}")  # the job's signal
        first = sync.poll_once()
        assert first is not None and (first.name, first.step) == ("step-4", 4)
        assert first.sent_bytes == first.bytes == 250_010 and first.local_bytes == 0
        assert console.run(f"test -f {q(manifests + '/step-4.json')}").exit_code == 0
        assert store.latest() == "step-4"

        # step-5: the optimizer state changed, the weights did not.
        _pod_run(
            console,
            f"cp -r {q(folder + '/step-4')} {q(folder + '/step-5.tmp')} && "
            f"head -c 50000 /dev/urandom > {q(folder + '/step-5.tmp/optimizer.bin')} && "
            f"mv {q(folder + '/step-5.tmp')} {q(folder + '/step-5')}",
        )
        second = sync.poll_once()
        assert second is not None and second.name == "step-5"
        assert second.local_bytes == 200_010  # weights.bin and state: copied here
        assert second.sent_bytes == 50_000  # only optimizer.bin crossed
        assert second.lag_seconds >= 0
        assert store.names() == ["step-4", "step-5"] and store.latest() == "step-5"
        sync.stop()
