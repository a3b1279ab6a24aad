"""Plain functions of the publish stage (issue 17, items 3 and 7): the destination's
records against the pod's manifest, the publisher's command line, its result line, and
what the checksum stage reports per place."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.checksum import manifest_rows, verification_records
from prefect_runpod.tasks.publish_target import parse_publish_target
from prefect_runpod.tasks.publish_verify import (
    parse_publish_output,
    publisher_command,
    timeout_for,
    verify_published,
)
from tests.fixtures.publish import make_outputs


def _hub_records(manifest: Manifest, lfs: set[str]) -> dict[str, dict]:
    """What an honest Hub reports: LFS sha256 + size, or the blob id of a regular file."""
    out = {}
    for e in manifest.entries:
        if e.path in lfs:
            out[e.path] = {
                "size": 134,
                "blob_id": "f" * 40,
                "lfs_sha256": e.sha256,
                "lfs_size": e.size_bytes,
            }
        else:
            out[e.path] = {
                "size": e.size_bytes,
                "blob_id": e.git_sha1,
                "lfs_sha256": None,
                "lfs_size": None,
            }
    return out


@pytest.fixture
def manifest(tmp_path: Path) -> Manifest:
    return Manifest.compute(make_outputs(tmp_path / "o", lfs_bytes=2048))


class TestVerifyPublished:
    def test_directories_and_links_are_not_published(self, tmp_path: Path) -> None:
        root = make_outputs(tmp_path / "o", lfs_bytes=10)
        (root / "empty").mkdir()
        (root / "latest.json").symlink_to("config.json")
        tree = Manifest.compute(root)
        assert {e.kind for e in tree.entries} == {"file", "dir", "link"}
        records = _hub_records(Manifest(root=tree.root, entries=tree.files), set())
        files, problems = verify_published(tree, records, "hf")
        assert problems == []
        assert {f.path for f in files} == {"config.json", "eval.jsonl", "weights/model.safetensors"}

    def test_lfs_by_sha256_and_regular_by_git_blob_id(self, manifest: Manifest) -> None:
        files, problems = verify_published(
            manifest, _hub_records(manifest, {"weights/model.safetensors"}), "hf"
        )
        assert problems == []
        assert {f.path: f.storage for f in files} == {
            "config.json": "regular",
            "eval.jsonl": "regular",
            "weights/model.safetensors": "lfs",
        }
        assert all(f.verified for f in files)

    @pytest.mark.parametrize(
        ("path", "change", "why"),
        [
            ("weights/model.safetensors", {"lfs_sha256": "0" * 64}, "sha256"),
            ("weights/model.safetensors", {"lfs_size": 1}, "size"),
            ("config.json", {"blob_id": "0" * 40}, "git blob id"),
            ("config.json", {"size": 3}, "size"),
        ],
    )
    def test_any_difference_names_the_file(self, manifest, path, change, why) -> None:
        records = _hub_records(manifest, {"weights/model.safetensors"})
        records[path].update(change)
        files, problems = verify_published(manifest, records, "hf")
        assert [p for p, _ in problems] == [path]
        assert problems[0][1].startswith(why)
        assert [f.path for f in files if not f.verified] == [path]

    def test_a_missing_file_or_a_manifest_without_blob_ids(self, manifest: Manifest) -> None:
        records = _hub_records(manifest, set())
        del records["eval.jsonl"]
        _, problems = verify_published(manifest, records, "hf")
        assert problems == [("eval.jsonl", "missing at the destination")]
        old = manifest.model_copy(deep=True)
        for e in old.entries:
            e.git_sha1 = None
        _, problems = verify_published(old, _hub_records(manifest, set()), "hf")
        assert {p for p, _ in problems} == {e.path for e in old.entries}  # never assumed ok

    def test_s3_by_our_sha256_metadata_and_content_length(self, manifest: Manifest) -> None:
        records = {
            e.path: {"size": e.size_bytes, "sha256": e.sha256, "key": e.path}
            for e in manifest.entries
        }
        files, problems = verify_published(manifest, records, "s3")
        assert problems == [] and {f.storage for f in files} == {"s3"}
        records["config.json"]["sha256"] = None  # an object without our metadata
        _, problems = verify_published(manifest, records, "s3")
        assert [p for p, _ in problems] == ["config.json"]


class TestPublisherCommand:
    def test_hub_command_has_no_secret_and_xet_only_on_huggingface_co(self) -> None:
        target = parse_publish_target("hf:demo/tiny@exp", public=True)
        assert target is not None
        local = publisher_command(
            "/pod/py",
            "/pod/publisher.py",
            target,
            "/pod/out",
            ["a b.json", "w/m.bin"],
            hf_endpoint="http://127.0.0.1:9999/",
        )
        assert "--xet off" in local and "--endpoint http://127.0.0.1:9999 " in local
        assert "--branch exp" in local and "--public" in local
        assert local.endswith("--files 'a b.json' w/m.bin")
        real = publisher_command("p", "s", target, "r", ["x"], hf_endpoint=None)
        assert "--xet auto" in real and "https://huggingface.co" in real
        assert "HF_TOKEN" not in local

    def test_s3_command_names_the_bucket_never_the_key(self) -> None:
        target = parse_publish_target("s3:models", s3_target_block="vol")
        assert target is not None
        s3 = S3Target(
            bucket="vol123",
            endpoint_url="https://s3api-eu-ro-1.runpod.io/",
            region_name="EU-RO-1",
            access_key_id="user_abc",
            secret_access_key=SecretStr("rps_SECRET"),
        )
        cmd = publisher_command("p", "s", target, "/r", ["x"], s3=s3, key_prefix="models")
        assert "--bucket vol123" in cmd and "--key-prefix models" in cmd
        assert "--region EU-RO-1" in cmd and "--part-bytes" in cmd
        assert "rps_SECRET" not in cmd and "user_abc" not in cmd

    def test_deadline_grows_with_the_bytes(self) -> None:
        assert timeout_for(0) == 600
        assert timeout_for(1600 * 1024 * 1024) == 600 + 1600


def test_result_line_is_found_among_warnings() -> None:
    out = 'UserWarning: something\n{"kind": "publish_attempt", "attempt": 1}\n' + (
        '{"kind": "publish_result", "ok": true, "revision": "abc"}\nbye\n'
    )
    assert parse_publish_output(out) == {"kind": "publish_result", "ok": True, "revision": "abc"}
    assert parse_publish_output("Traceback …") is None


def test_checksum_reports_what_was_verified_where(tmp_path: Path) -> None:
    from prefect_runpod.tasks.models import PublishReport

    root = make_outputs(tmp_path / "o", lfs_bytes=100)
    manifest = Manifest.compute(root)
    files, _ = verify_published(
        manifest, _hub_records(manifest, {"weights/model.safetensors"}), "hf"
    )
    published = PublishReport(
        target="hf://demo/x",
        kind="hf",
        revision="c0ffee",
        files=files,
        bytes=manifest.total_bytes,
        verified=True,
    )
    evals = Manifest.compute(root, ["eval.jsonl"])  # --download eval brought only this
    places = verification_records(root, evals, published)
    assert [(p.where, p.files, p.location) for p in places] == [
        ("local", 1, str(root)),
        ("hub", 3, "hf://demo/x@c0ffee"),
    ]
    rows = {r["path"]: r for r in manifest_rows(evals, [], published)}
    assert (
        rows["eval.jsonl"]["local"] == "ok" and rows["eval.jsonl"]["destination"] == "ok (regular)"
    )
    assert rows["weights/model.safetensors"]["local"] == "not downloaded"
    assert rows["weights/model.safetensors"]["destination"] == "ok (lfs)"
    assert (
        rows["weights/model.safetensors"]["sha256"]
        == hashlib.sha256((root / "weights" / "model.safetensors").read_bytes()).hexdigest()
    )
    assert (
        mf.git_blob_sha1((root / "config.json").read_bytes())
        == {f.path: f for f in files}["config.json"].remote_id
    )


def test_the_summary_says_where_the_model_is(tmp_path: Path) -> None:
    from prefect_runpod.flows.run.report import RunReport, render_summary
    from prefect_runpod.tasks.models import PublishReport, StageState

    manifest = Manifest.compute(make_outputs(tmp_path / "o", lfs_bytes=100))
    files, _ = verify_published(manifest, _hub_records(manifest, set()), "hf")
    report = RunReport(pod_id="lp-1", terminated=True, download_choice="none")
    for stage in report.stages:
        stage.state = StageState.COMPLETED
    report.publish = PublishReport(
        target="hf://demo/x",
        kind="hf",
        revision="c0ffee",
        url="https://huggingface.co/demo/x/commit/c0ffee",
        files=files,
        bytes=manifest.total_bytes,
        verified=True,
        seconds=2.5,
        attempts=1,
    )
    report.verified = verification_records(None, None, report.publish)
    text = render_summary(report)
    assert "model at     hf://demo/x@c0ffee (https://huggingface.co/demo/x/commit/c0ffee)" in text
    assert "verified     hub: 3 files at hf://demo/x@c0ffee" in text
    assert "from the pod to hf://demo/x" in text and "manifest" not in text
    assert report.to_json_dict()["model_location"] == "hf://demo/x@c0ffee"
    report.publish = None
    report.verified = []
    assert "model at     nowhere verified (--download none)" in render_summary(report)


def test_a_failed_run_without_a_pod_says_so_and_puts_its_error_first() -> None:
    """A run refused before any pod (e.g. no Hub token for --publish): the summary's first
    line is the error and the cost says nothing was billed, not "may still be billing"."""
    from prefect_runpod.flows.run.report import RunReport, render_summary

    report = RunReport(error="HFAuthError: no Hugging Face token to publish with")
    lines = render_summary(report).splitlines()
    assert lines[0] == "error        HFAuthError: no Hugging Face token to publish with"
    cost = [line for line in lines if line.startswith("cost ")]
    assert cost == ["cost         0.000000 USD (no pod was created: nothing billed)"]
    assert "may still be billing" not in "\n".join(lines)
    assert lines[-1] == "result       FAILED"
