"""The download's staging copy of a tree without the links that cannot travel, run by a
real shell on a real tree: hard links (no byte copied), in-tree links kept, the named
entries gone, the source untouched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.tasks.download import stage_travelling_command


def test_the_staging_copy_holds_everything_but_the_links_that_cannot_travel(tmp_path: Path):
    src = tmp_path / "outputs"
    (src / "ckpt").mkdir(parents=True)
    (src / "ckpt" / "model.bin").write_bytes(os.urandom(4096))
    (src / "empty").mkdir()
    (src / "current").symlink_to("ckpt")  # in-tree relative: travels as a link
    (src / "abs").symlink_to(src / "ckpt" / "model.bin")  # absolute: cannot travel
    (src / "ckpt" / "gone").symlink_to("../nowhere")  # dangling: cannot travel
    _items, problems = mf.scan_tree(str(src))
    left = sorted(path for path, _why in problems)
    assert left == ["abs", "ckpt/gone"]

    staging = tmp_path / "run" / "download-staging"
    command = stage_travelling_command(str(src), left, str(staging))
    subprocess.run(["bash", "-c", command], check=True, timeout=60)

    items, problems = mf.scan_tree(str(staging))
    assert problems == []
    assert items == [
        ("ckpt/model.bin", "file", None),
        ("current", "link", "ckpt"),
        ("empty", "dir", None),
    ]
    # a hard link to the same bytes, not a copy; the source keeps everything
    assert (staging / "ckpt" / "model.bin").stat().st_ino == (
        src / "ckpt" / "model.bin"
    ).stat().st_ino
    assert (src / "abs").is_symlink() and (src / "ckpt" / "gone").is_symlink()
