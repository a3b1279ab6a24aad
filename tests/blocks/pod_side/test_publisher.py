"""The pod-side publisher (issue 17, items 2, 3 and 6), run as the pod runs it — a
script in a child process with the token in its environment — against the Hub
emulator driven by the real ``huggingface_hub`` client, and against moto's S3 through
``boto3``. Faults are injected at named emulator routes, never by timing."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.huggingface import hub_file_records
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.s3 import s3_object_records
from prefect_runpod.tasks.publish_verify import verify_published
from tests.emulators.hf_hub import HubFault
from tests.emulators.hf_hub_write import git_blob_id
from tests.fixtures.publish import PART_BYTES, PublishHub, make_outputs
from tests.fixtures.transfer import moto_target

POD_SIDE = Path(mf.__file__).parent
PUBLISHER = POD_SIDE / "publisher.py"


def _run(args: list[str], env: dict[str, str]) -> tuple[int, list[dict], str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "AWS_"))}
    base["HF_HOME"] = env.pop("HF_HOME", base.get("HF_HOME", "/tmp/hf-home-publisher"))
    proc = subprocess.run(
        [sys.executable, str(PUBLISHER), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    return proc.returncode, lines, proc.stderr


def _hub_args(hub: PublishHub, root: Path, repo: str, *extra: str) -> list[str]:
    files = [e["path"] for e in mf.compute_manifest(str(root))["entries"]]
    return [
        "hf",
        "--root",
        str(root),
        "--repo-id",
        repo,
        "--endpoint",
        hub.endpoint,
        "--xet",
        "off",
        *extra,
        "--files",
        *files,
    ]


def _result(lines: list[dict]) -> dict:
    results = [x for x in lines if x["kind"] == "publish_result"]
    assert len(results) == 1, lines
    return results[0]


@pytest.mark.slow
def test_commit_lands_and_the_hub_records_match_the_pod_manifest(publish_hub, tmp_path):
    """One LFS file (multipart) and two regular ones, verified from paths-info."""
    root = make_outputs(tmp_path / "outputs")
    token = publish_hub.tokens["write"].get_secret_value()
    code, lines, err = _run(
        _hub_args(publish_hub, root, "demo/tiny-classifier"), {"HF_TOKEN": token}
    )
    assert code == 0, err[-2000:]
    result = _result(lines)
    assert result["ok"] and result["attempts"] == 1 and result["files"] == 3
    repo = publish_hub.hub.repos[("model", "demo/tiny-classifier")]
    assert repo.private is True  # private unless --public
    stored = publish_hub.stored("demo/tiny-classifier", result["revision"])
    assert stored["weights/model.safetensors"].lfs  # ≥ the stated LFS threshold
    assert not stored["config.json"].lfs
    manifest = Manifest.compute(root)
    records = hub_file_records(
        "demo/tiny-classifier",
        [e.path for e in manifest.entries],
        revision=result["revision"],
        token=SecretStr(token),
        endpoint=publish_hub.endpoint,
    )
    files, problems = verify_published(manifest, records, "hf")
    assert problems == []
    by_path = {f.path: f for f in files}
    assert by_path["weights/model.safetensors"].storage == "lfs"
    assert (
        by_path["weights/model.safetensors"].remote_id
        == hashlib.sha256((root / "weights" / "model.safetensors").read_bytes()).hexdigest()
    )
    assert by_path["config.json"].storage == "regular"
    assert by_path["config.json"].remote_id == git_blob_id((root / "config.json").read_bytes())
    assert token not in json.dumps(lines) + err
    assert token not in publish_hub.hub.log_text()


@pytest.mark.slow
def test_a_dropped_part_is_resent_alone(publish_hub, tmp_path):
    """The link drops 1000 bytes into part 2: huggingface_hub re-sends that part only."""
    root = make_outputs(tmp_path / "outputs")
    publish_hub.hub.writer.faults.append(HubFault("lfs_part", nth=2, after_bytes=1000))
    code, lines, err = _run(
        _hub_args(publish_hub, root, "demo/dropped"),
        {"HF_TOKEN": publish_hub.tokens["write"].get_secret_value()},
    )
    assert code == 0, err[-2000:]
    size = (root / "weights" / "model.safetensors").stat().st_size
    assert publish_hub.hub.writer.received_bytes["lfs_part"] == size + 1000
    parts = [r for r in publish_hub.hub.requests if "/part/" in r["path"]]
    assert [r["status"] for r in parts if r["path"].endswith("/part/2")] == ["dropped", 200]
    assert len(parts) == -(-size // PART_BYTES) + 1
    stored = publish_hub.stored("demo/dropped")
    assert (
        stored["weights/model.safetensors"].sha256
        == hashlib.sha256((root / "weights" / "model.safetensors").read_bytes()).hexdigest()
    )


@pytest.mark.slow
def test_a_failed_commit_is_retried_without_sending_the_model_again(publish_hub, tmp_path):
    """The commit answers 503 once: the publisher tries again, and the LFS batch says the
    object is already stored, so no model byte is uploaded twice."""
    root = make_outputs(tmp_path / "outputs")
    publish_hub.hub.writer.faults.append(HubFault("commit", nth=1, action="status", status=503))
    code, lines, err = _run(
        _hub_args(publish_hub, root, "demo/retried"),
        {"HF_TOKEN": publish_hub.tokens["write"].get_secret_value()},
    )
    assert code == 0, err[-2000:]
    result = _result(lines)
    assert result["attempts"] == 2
    failed = [x for x in lines if x["kind"] == "publish_attempt" and x.get("ok") is False]
    assert [x["status"] for x in failed] == [503] and failed[0]["retry"] is True
    size = (root / "weights" / "model.safetensors").stat().st_size
    assert publish_hub.hub.writer.received_bytes["lfs_part"] == size  # sent once
    assert (
        publish_hub.hub.writer.calls["batch"] == 2 and publish_hub.hub.writer.calls["commit"] == 2
    )


@pytest.mark.slow
def test_a_read_only_token_is_refused_at_once(publish_hub, tmp_path):
    root = make_outputs(tmp_path / "outputs")
    code, lines, _ = _run(
        _hub_args(publish_hub, root, "demo/existing"),
        {"HF_TOKEN": publish_hub.tokens["read"].get_secret_value()},
    )
    result = _result(lines)
    assert code == 1 and result["ok"] is False
    assert result["status"] == 403 and result["retryable"] is False
    assert len([x for x in lines if x["kind"] == "publish_attempt" and x.get("ok") is False]) == 1
    assert "rights to write" in result["error"]
    assert not publish_hub.hub.writer.calls.get("batch")  # nothing was sent


@pytest.mark.slow
def test_a_namespace_that_is_not_yours_is_refused_with_the_hubs_words(publish_hub, tmp_path):
    root = make_outputs(tmp_path / "outputs", lfs_bytes=10)
    code, lines, _ = _run(
        _hub_args(publish_hub, root, "someone-else/model"),
        {"HF_TOKEN": publish_hub.tokens["write"].get_secret_value()},
    )
    result = _result(lines)
    assert code == 1 and result["status"] == 403
    assert 'create a model under the namespace "someone-else"' in result["error"]
    assert ("model", "someone-else/model") not in publish_hub.hub.repos


@pytest.mark.slow
def test_a_branch_is_created_and_committed_to(publish_hub, tmp_path):
    root = make_outputs(tmp_path / "outputs", lfs_bytes=10)
    code, lines, err = _run(
        _hub_args(publish_hub, root, "demo/branched", "--branch", "exp/1"),
        {"HF_TOKEN": publish_hub.tokens["write"].get_secret_value()},
    )
    assert code == 0, err[-2000:]
    repo = publish_hub.hub.repos[("model", "demo/branched")]
    assert repo.branches["exp/1"] == _result(lines)["revision"]
    assert publish_hub.stored("demo/branched", "main") == {}
    assert "config.json" in publish_hub.stored("demo/branched", "exp/1")


@pytest.mark.slow
def test_no_token_and_missing_files_are_reported_not_raised(publish_hub, tmp_path):
    root = make_outputs(tmp_path / "outputs", lfs_bytes=10)
    code, lines, _ = _run(_hub_args(publish_hub, root, "demo/x"), {})
    assert code == 1 and "HF_TOKEN is not set" in _result(lines)["error"]
    args = _hub_args(publish_hub, root, "demo/x") + ["gone.bin"]
    code, lines, _ = _run(args, {"HF_TOKEN": "x"})
    assert code == 1 and "not on the pod: gone.bin" in _result(lines)["error"]


@pytest.mark.slow
def test_s3_objects_carry_our_sha256_and_a_second_run_sends_nothing(moto_s3, tmp_path):
    target = moto_target(moto_s3, "pub")
    bucket = target.bucket
    root = make_outputs(tmp_path / "outputs", lfs_bytes=6 * 1024 * 1024)
    manifest = Manifest.compute(root)
    args = [
        "s3",
        "--root",
        str(root),
        "--bucket",
        bucket,
        "--key-prefix",
        "models/run-1",
        "--endpoint-url",
        moto_s3["endpoint_url"],
        "--region",
        moto_s3["region_name"],
        "--multipart-threshold-bytes",
        str(5 * 1024 * 1024),
        "--part-bytes",
        str(5 * 1024 * 1024),
        "--files",
        *[e.path for e in manifest.entries],
    ]
    env = {
        "AWS_ACCESS_KEY_ID": moto_s3["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": moto_s3["secret_access_key"],
    }
    code, lines, err = _run(list(args), dict(env))
    assert code == 0, err[-2000:]
    keys = _result(lines)["keys"]
    assert keys["weights/model.safetensors"] == "models/run-1/weights/model.safetensors"
    records = s3_object_records(target, keys)
    files, problems = verify_published(manifest, records, "s3")
    assert problems == [] and {f.storage for f in files} == {"s3"}
    head = target.get_client().head_object(Bucket=bucket, Key=keys["weights/model.safetensors"])
    assert head["ETag"].strip('"').endswith("-2")  # multipart: the ETag is no digest of the file
    before = {
        k: target.get_client().head_object(Bucket=bucket, Key=k)["LastModified"]
        for k in keys.values()
    }
    code, lines, err = _run(list(args), dict(env))
    assert code == 0, err[-2000:]
    after = {
        k: target.get_client().head_object(Bucket=bucket, Key=k)["LastModified"]
        for k in keys.values()
    }
    assert after == before  # present with the same size and sha256: not uploaded again


_STDLIB = set(sys.stdlib_module_names)
_OWN = {"manifest", "prefect_runpod"}
_PUBLISH_CLIENTS = {"huggingface_hub", "boto3", "botocore"}


def _imports(nodes: list[ast.stmt]) -> set[str]:
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Try):
            found |= _imports(node.body) | _imports(node.orelse) | _imports(node.finalbody)
            for handler in node.handlers:
                found |= _imports(handler.body)
    return found


@pytest.mark.parametrize("script", sorted(p.name for p in POD_SIDE.glob("*.py")))
def test_pod_side_scripts_parse_on_38_and_import_only_the_stdlib_at_load(script):
    """Pod-side code runs on Python 3.8 with the standard library; the publisher alone
    reaches for a client, and only inside the function of its target."""
    tree = ast.parse((POD_SIDE / script).read_text(), feature_version=(3, 8))
    assert _imports(tree.body) <= _STDLIB | _OWN, script
    inner: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            inner |= _imports(list(ast.walk(node)))  # type: ignore[arg-type]
    outside = inner - _STDLIB - _OWN
    if script == "publisher.py":
        assert outside == _PUBLISH_CLIENTS
    else:
        assert outside == set(), script
