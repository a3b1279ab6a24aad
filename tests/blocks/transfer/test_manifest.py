"""Manifests (sha256 + git blob id), the pod-side script form, and the checksum task."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import ChecksumMismatchError
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.tasks.checksum import checksum, verify_manifest
from prefect_runpod.tasks.models import Manifest as ReExported
from tests.fixtures.transfer import make_tree

POD_SIDE = Path(mf.__file__).parent


def test_entries_match_hashlib_and_skip_scratch(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=9 * 1024 * 1024 + 1)  # several read buffers
    (root / "half.bin.part").write_bytes(b"x")
    (root / "half.bin.part.json").write_text("{}")
    m = mf.compute_manifest(str(root))
    paths = [e["path"] for e in m["entries"]]
    assert paths == sorted(paths) and "half.bin.part" not in paths
    assert "sub dir/naïve café ✓.json" in paths and "empty.txt" in paths
    for e in m["entries"]:
        data = root.joinpath(*e["path"].split("/")).read_bytes()
        assert e["size_bytes"] == len(data)
        assert "md5" not in e  # nothing checks one; sha256 is what a transfer verifies
        assert e["sha256"] == hashlib.sha256(data).hexdigest()
        # git's blob id, the one the Hugging Face Hub reports for a regular file
        assert e["git_sha1"] == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert e["git_sha1"] == mf.git_blob_sha1(data)
    assert mf.compute_manifest(str(root / "empty.txt"))["entries"][0]["path"] == "empty.txt"
    prefix = mf.entry_for(str(root), "text.log", 100)
    assert prefix["size_bytes"] == 100
    assert prefix["sha256"] == hashlib.sha256((root / "text.log").read_bytes()[:100]).hexdigest()
    assert "git_sha1" not in prefix  # a prefix is not a blob


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_sha1_is_what_git_hash_object_prints(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=5 * 1024 * 1024 + 7)
    for e in mf.compute_manifest(str(root))["entries"]:
        path = root.joinpath(*e["path"].split("/"))
        out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True)
        assert out.stdout.strip() == e["git_sha1"], e["path"]


def test_git_sha1_differs_is_a_problem_and_a_missing_one_is_not(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=10)
    want = mf.compute_manifest(str(root))
    got = json.loads(json.dumps(want))
    got["entries"][0]["git_sha1"] = "0" * 40
    assert mf.compare_manifests(want, got) == [
        (want["entries"][0]["path"], f"git_sha1 {want['entries'][0]['git_sha1']} != {'0' * 40}")
    ]
    old = Manifest.from_dict(want).model_copy(deep=True)
    for e in old.entries:
        e.git_sha1 = None  # a manifest recorded before git_sha1 existed
    assert mf.compare_manifests(want, old.as_dict()) == []


def test_an_md5_is_compared_only_when_both_sides_carry_one(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=10)
    want = mf.compute_manifest(str(root))
    older = json.loads(json.dumps(want))  # what an older manifest.py answered
    for e in mf.file_entries(older):
        e["md5"] = hashlib.md5(root.joinpath(*e["path"].split("/")).read_bytes()).hexdigest()
    assert mf.compare_manifests(want, older) == []
    assert mf.compare_manifests(older, want) == []
    wrong = json.loads(json.dumps(older))
    first = mf.file_entries(wrong)[0]
    first["md5"] = "0" * 32
    assert mf.compare_manifests(older, wrong) == [
        (first["path"], f"md5 {mf.file_entries(older)[0]['md5']} != {'0' * 32}")
    ]
    assert "md5" not in Manifest.from_dict(want).as_dict()["entries"][0]


def test_a_file_hashed_earlier_in_the_transfer_is_reused_until_it_changes(
    tmp_path: Path,
) -> None:
    root = make_tree(tmp_path / "t", big_bytes=5000)
    known: dict = {}
    first = mf.compute_manifest(str(root), known=known)
    assert {os.path.abspath(root / "text.log")} <= set(known)
    marked = {k: (sig, dict(e, sha256="f" * 64)) for k, (sig, e) in known.items()}
    again = mf.compute_manifest(str(root), known=marked)  # served from ``known``
    assert {e["sha256"] for e in mf.file_entries(again)} == {"f" * 64}
    (root / "text.log").write_text("rewritten")
    after = {e["path"]: e for e in mf.compute_manifest(str(root), known=marked)["entries"]}
    assert after["text.log"]["sha256"] == hashlib.sha256(b"rewritten").hexdigest()
    assert after["empty.txt"]["sha256"] == "f" * 64
    assert mf.file_entries(first)[0]["sha256"] != "f" * 64


def test_compare_names_each_problem(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=10)
    want = mf.compute_manifest(str(root))
    (root / "text.log").write_text("changed")
    (root / "empty.txt").unlink()
    problems = dict(mf.compare_manifests(want, mf.compute_manifest(str(root))))
    assert problems["empty.txt"] == "missing"
    assert problems["text.log"].startswith("size_bytes")
    assert len(problems) == 2


def test_script_prints_json_and_is_python38(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=10)
    out = subprocess.run(
        [sys.executable, str(POD_SIDE / "manifest.py"), str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == mf.compute_manifest(str(root))
    missing = subprocess.run(
        [sys.executable, str(POD_SIDE / "manifest.py"), str(tmp_path / "no")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    for name in ("manifest.py", "receiver.py"):
        ast.parse((POD_SIDE / name).read_text(), feature_version=(3, 8))


def test_models_are_shared(tmp_path: Path) -> None:
    assert ReExported is Manifest
    root = make_tree(tmp_path / "t", big_bytes=10)
    m = Manifest.from_dict(mf.compute_manifest(str(root)))
    assert m.total_bytes == sum(e.size_bytes for e in m.entries)
    assert Manifest.from_dict(m.as_dict()) == m


def test_verify_manifest_flags_flipped_byte(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t", big_bytes=5000)
    expected = Manifest.from_dict(mf.compute_manifest(str(root)))
    big = root / "sub dir" / "deeper" / "big.bin"
    data = bytearray(big.read_bytes())
    data[1234] ^= 0xFF
    big.write_bytes(bytes(data))
    _, problems = verify_manifest(root, expected)
    assert [p for p, _ in problems] == ["sub dir/deeper/big.bin"]
    assert problems[0][1].startswith("sha256")


@pytest.mark.slow
def test_checksum_task_artifact_and_error(tmp_path: Path, prefect_server) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client

    root = make_tree(tmp_path / "t", big_bytes=5000)
    expected = Manifest.from_dict(mf.compute_manifest(str(root)))

    @flow
    def verify_ok() -> Manifest:
        return checksum(root, expected)

    assert verify_ok().entries == expected.entries
    os.remove(root / "text.log")

    @flow
    def verify_bad() -> None:
        checksum(root, expected, pod_id="lp-x")

    with pytest.raises(ChecksumMismatchError, match="text.log") as info:
        verify_bad()
    assert info.value.path == "text.log"

    async def _artifacts() -> list:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["checksum-manifest"]))
            )

    import asyncio

    arts = asyncio.run(_artifacts())
    assert any("MISMATCH" in str(a.data) for a in arts)
    assert any("all verified" in (a.description or "") for a in arts)
