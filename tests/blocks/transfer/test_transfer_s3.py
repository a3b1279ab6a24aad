"""The s3 method against moto in server mode on loopback, through boto3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import ChecksumMismatchError, SpecError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.transfer.dispatch import pick_method
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.s3 import (
    S3Target,
    _volume_prefix,
    s3_download_dir,
    s3_upload_dir,
)
from tests.fixtures.transfer import make_tree, moto_target


def test_roundtrip_multipart_and_metadata(tmp_path: Path, moto_s3) -> None:
    target = moto_target(
        moto_s3, multipart_threshold_bytes=5 * 1024 * 1024, part_bytes=5 * 1024 * 1024
    )
    src = make_tree(tmp_path / "src", big_bytes=11 * 1024 * 1024 + 3)
    source = Manifest.compute(src)
    keys = s3_upload_dir(target, src, "runs/r1", source)
    assert "runs/r1/sub dir/naïve café ✓.json" in keys
    client = target.get_client()
    head = client.head_object(Bucket=target.bucket, Key="runs/r1/sub dir/deeper/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # three parts: multipart was used
    down = s3_download_dir(target, "runs/r1", tmp_path / "back")
    assert down.source_manifest.entries == source.entries and down.bytes == source.total_bytes
    assert down.dest_manifest.entries == source.entries
    assert Manifest.compute(tmp_path / "back").entries == source.entries


def test_damaged_object_is_never_accepted(tmp_path: Path, moto_s3) -> None:
    target = moto_target(moto_s3)
    src = make_tree(tmp_path / "src", big_bytes=1000)
    source = Manifest.compute(src)
    s3_upload_dir(target, src, "ckpt", source)
    # the object is replaced behind our back; its metadata still claims the old hash
    target.get_client().put_object(
        Bucket=target.bucket,
        Key="ckpt/text.log",
        Body=os.urandom(100),
        Metadata={"sha256": next(e.sha256 for e in source.entries if e.path == "text.log")},
    )
    with pytest.raises(ChecksumMismatchError, match="text.log") as info:
        s3_download_dir(target, "ckpt", tmp_path / "back")
    assert info.value.path == "text.log"


def test_volume_paths_and_method_choice(moto_s3) -> None:
    target = S3Target(bucket="vol123", volume_mount_path="/workspace")
    handle = PodHandle(pod_id="p1", name="n", provider="runpod")
    assert _volume_prefix(target, handle, "/workspace/runs/a") == "runs/a"
    assert target.key_for("x/y.bin", "runs/a") == "runs/a/x/y.bin"
    with pytest.raises(SpecError, match="mount"):
        _volume_prefix(target, handle, "/root/elsewhere")
    assert pick_method(handle, "auto", s3=target) == "s3"
    with pytest.raises(SpecError):
        pick_method(handle, "s3")
    with pytest.raises(SpecError, match="models has none \\(a plain bucket\\)"):
        pick_method(handle, "s3", s3=S3Target(bucket="models"))


def test_check_s3_target_before_anything_is_rented(moto_s3) -> None:
    """Preflight for ``--publish s3``: the bucket must answer with these credentials."""
    from prefect_runpod.blocks.transfer.s3 import check_s3_target

    target = moto_target(moto_s3)
    check_s3_target(target)  # answers: nothing raised
    missing = target.model_copy(update={"bucket": "no-such-bucket-here"})
    with pytest.raises(
        SpecError, match=r"s3://no-such-bucket-here at http://127\.0\.0\.1:\d+ answered 404"
    ):
        check_s3_target(missing)
    nowhere = target.model_copy(update={"endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(SpecError, match="cannot reach the S3 target"):
        check_s3_target(nowhere)
