"""The one verify step of every transfer method, and the one builder of the pod-side
manifest command."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import ChecksumMismatchError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.pod_tools import manifest_command
from prefect_runpod.blocks.transfer.verify import verify_resending_once
from tests.fixtures.transfer import POD_SIDE_DIR, make_tree

TRANSFER = Path(__file__).parents[3] / "blocks" / "transfer"


def _copy(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, dirs_exist_ok=True)


def test_a_file_that_differs_is_sent_once_more_and_then_verified(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", big_bytes=5000)
    dest = tmp_path / "dest"
    _copy(src, dest)
    (dest / "text.log").write_text("damaged on the way\n")
    resent: list[set[str]] = []

    def resend(bad: set[str]) -> None:
        resent.append(bad)
        for rel in bad:
            shutil.copyfile(src / rel, dest / rel)

    expected = mf.compute_manifest(str(src))
    got = verify_resending_once(
        expected,
        lambda: mf.compute_manifest(str(dest)),
        resend,
        method="sftp",
        direction="upload",
        pod="p1",
    )
    assert resent == [{"text.log"}]
    assert mf.compare_manifests(expected, got) == []


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_file_still_wrong_after_the_resend_names_the_file_and_the_method(
    tmp_path: Path, direction: str
) -> None:
    src = make_tree(tmp_path / "src", big_bytes=5000)
    dest = tmp_path / "dest"
    _copy(src, dest)
    (dest / "text.log").write_text("damaged for good\n")
    resent: list[set[str]] = []
    expected = mf.compute_manifest(str(src))
    with pytest.raises(ChecksumMismatchError, match=r"text\.log.*the rsync method") as info:
        verify_resending_once(
            expected,
            lambda: mf.compute_manifest(str(dest)),
            resent.append,
            method="rsync",
            direction=direction,  # type: ignore[arg-type]
            pod="p1",
        )
    assert resent == [{"text.log"}]
    err = info.value
    assert (err.path, err.stage, err.pod_id) == ("text.log", direction, "p1")
    want = next(e for e in expected["entries"] if e["path"] == "text.log")
    assert err.expected == want["sha256"]
    assert err.actual == mf.entry_for(str(dest), "text.log")["sha256"]
    assert "pod p1" in str(err)


def test_after_a_resend_cut_short_it_checks_once_and_never_resends(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", big_bytes=5000)
    dest = tmp_path / "dest"
    _copy(src, dest)
    (dest / "empty.txt").unlink()
    resent: list[set[str]] = []
    with pytest.raises(ChecksumMismatchError, match=r"empty\.txt.*missing"):
        verify_resending_once(
            mf.compute_manifest(str(src)),
            lambda: mf.compute_manifest(str(dest)),
            resent.append,
            method="pty",
            direction="upload",
            pod="p1",
            resent=True,
        )
    assert resent == []


def test_one_place_compares_manifests_after_a_transfer() -> None:
    """No method keeps its own copy of the verify-then-resend step: ``compare_manifests``
    is called in ``verify.py`` and in dispatch's last guard only."""
    callers = set()
    for path in TRANSFER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "compare_manifests":
                callers.add(path.relative_to(TRANSFER).as_posix())
    assert callers == {"verify.py", "dispatch.py"}


def test_the_manifest_command_runs_the_pod_script_with_each_option(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "a tree", big_bytes=5000)
    made = {"path": "new/empty", "kind": "dir", "size_bytes": 0, "sha256": ""}

    def run(cmd: str) -> dict:
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    whole = run(manifest_command(POD_SIDE_DIR, str(root), python="python3"))
    assert whole == mf.compute_manifest(str(root))
    some = run(manifest_command(POD_SIDE_DIR, str(root), ["sub dir/naïve café ✓.json"]))
    assert [e["path"] for e in some["entries"]] == ["sub dir/naïve café ✓.json"]
    assert run(manifest_command(POD_SIDE_DIR, str(root), []))["entries"] == []
    prefix = run(manifest_command(POD_SIDE_DIR, str(root), ["text.log"], prefix_bytes=10))
    assert prefix["entries"][0]["size_bytes"] == 10
    applied = run(manifest_command(POD_SIDE_DIR, str(root), structure=[made]))
    assert [e["path"] for e in applied["entries"]] == ["new/empty"]
    assert (root / "new" / "empty").is_dir()


def test_what_is_there_in_a_folder_not_made_yet_costs_no_python_start(tmp_path: Path) -> None:
    """A first upload asks what is already in a folder that does not exist: the shell
    answers the empty manifest itself (here an interpreter that cannot start proves
    it); a folder that exists is still described by the script."""
    root = make_tree(tmp_path / "a tree", big_bytes=5000)

    def run(where: Path, python: str) -> dict:
        cmd = manifest_command(
            POD_SIDE_DIR, str(where), ["text.log"], python=python, missing_ok=True
        )
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    absent = tmp_path / "not made 'yet'"
    assert run(absent, "/nonexistent/python3") == {"root": str(absent), "entries": []}
    assert run(root, "python3") == mf.compute_manifest(str(root), ["text.log"])
    assert run(root / "missing", "python3")["entries"] == []


def test_the_pod_script_saves_what_it_hashed_for_the_next_run_of_the_transfer(
    tmp_path: Path,
) -> None:
    """``--save-known`` then ``--use-known`` (one upload's two pod-side runs): a file
    unchanged since the first is not read again, a rewritten one is, and the record
    is removed once used."""
    root = make_tree(tmp_path / "a tree", big_bytes=5000)
    memo = tmp_path / "known.json"
    paths = ["text.log", "empty.txt"]

    def run(cmd: str) -> dict:
        out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    before = run(manifest_command(POD_SIDE_DIR, str(root), paths, save_known=str(memo)))
    assert before == mf.compute_manifest(str(root), paths)
    saved = json.loads(memo.read_text())
    assert memo.stat().st_mode & 0o077 == 0
    for _sig, entry in saved.values():
        entry["sha256"] = "f" * 64  # only a reused entry can carry this
    memo.write_text(json.dumps(saved))
    (root / "empty.txt").write_bytes(b"now with bytes")
    after = run(manifest_command(POD_SIDE_DIR, str(root), paths, use_known=str(memo)))
    by_path = {e["path"]: e["sha256"] for e in after["entries"]}
    assert by_path["text.log"] == "f" * 64
    assert by_path["empty.txt"] == hashlib.sha256(b"now with bytes").hexdigest()
    assert not memo.exists()
    assert run(manifest_command(POD_SIDE_DIR, str(root), paths, use_known=str(memo))) == (
        mf.compute_manifest(str(root), paths)
    )
