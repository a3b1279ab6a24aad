"""Publishing from the pod, end to end on the local pod (issue 17, "Done when"): the CLI
publishes the demo model to the Hub emulator with ``--download none`` and every file is
verified from the Hub's own metadata; a byte flipped after the pod's manifest fails the
run naming the file; a read-only token is refused before anything is rented; the
asset's materialization event reaches the server; the eval-parity gate blocks the
publish; S3 (moto) takes the same path with our sha256 as object metadata."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from prefect_runpod.blocks.faults import release_marker
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import find_marked_pids
from prefect_runpod.flows.finetune import finetune
from tests.emulators.hf_hub import HubEmulator, HubRepo, HubToken
from tests.fixtures.demo_bundle import copy_demo_bundle
from tests.fixtures.flow_env import server_env, start_cli, wait_for_fault
from tests.fixtures.transfer import moto_target

pytestmark = pytest.mark.slow

# The demo's model.json (~126 KB) goes to LFS, its eval JSONL files (~48 KB) stay regular.
LFS_THRESHOLD_BYTES = 100 * 1024


@pytest.fixture
def hub():
    """A Hub where alice (org ``demo``, write role) has a write and a read token."""
    tokens = {"write": "hf_" + uuid.uuid4().hex, "read": "hf_" + uuid.uuid4().hex}
    emulator = HubEmulator(
        [
            HubToken(tokens["write"], "alice", "write", orgs={"demo": "write"}),
            HubToken(tokens["read"], "alice", "read", orgs={"demo": "write"}),
        ],
        [HubRepo("demo/existing")],
        lfs_threshold_bytes=LFS_THRESHOLD_BYTES,
    )
    emulator.start()
    emulator.tokens_by_role = tokens  # type: ignore[attr-defined]
    try:
        yield emulator
    finally:
        emulator.stop()


def _assert_pod_gone(pod_id: str) -> None:
    provider = LocalPodProvider()
    assert provider.get(pod_id) is None
    assert find_marked_pids(pod_id) == []


def _stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


def test_done_when_the_cli_publishes_to_the_hub_and_downloads_nothing(
    prefect_server, hub, tmp_path
):
    """`prefect-runpod finetune --publish hf:demo/tiny-classifier --download none` on the
    local pod against the Hub emulator: every file verified from Hub metadata."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_runpod.flows.cli",
            "finetune",
            "--publish",
            "hf:demo/tiny-classifier",
            "--download",
            "none",
            "--hf-endpoint",
            hub.endpoint,
            "--output-dir",
            str(out),
            "--json",
        ],
        env=server_env(HF_TOKEN=hub.tokens_by_role["write"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["passed"] and data["terminated"]
    assert _stage(data, "publish")["state"] == "Completed"
    download = _stage(data, "download")
    assert download["state"] == "Skipped" and "hf://demo/tiny-classifier@" in download["reason"]
    published = data["publish"]
    assert published["verified"] and published["target"] == "hf://demo/tiny-classifier"
    revision = published["revision"]
    assert data["model_location"] == f"hf://demo/tiny-classifier@{revision}"
    assert published["url"] == f"{hub.endpoint}/demo/tiny-classifier/commit/{revision}"
    # Every file checked against what the Hub itself stored at that revision.
    repo = hub.repos[("model", "demo/tiny-classifier")]
    stored = hub.writer.tree(repo, revision)
    assert stored is not None and set(stored) == {f["path"] for f in published["files"]}
    storage = {f["path"]: f["storage"] for f in published["files"]}
    assert storage == {
        "model.json": "lfs",
        "eval_train.jsonl": "regular",
        "eval_standalone.jsonl": "regular",
    }
    for f in published["files"]:
        assert f["verified"] is True
        held = stored[f["path"]]
        assert f["sha256"] == held.sha256 and f["size_bytes"] == held.size
        assert f["remote_id"] == (held.sha256 if held.lfs else held.blob_id)
    assert any(
        r["method"] == "POST"
        and r["path"] == f"/api/models/demo/tiny-classifier/paths-info/{revision}"
        for r in hub.requests
    )
    assert repo.private is True
    # Nothing came back through the gateway but the eval files of the parity check.
    assert data["download"] is None and data["manifest"] is None
    assert not (out / "outputs").exists()
    assert [v["where"] for v in data["verified"]] == ["hub"]
    assert hub.tokens_by_role["write"] not in hub.log_text() + proc.stdout + proc.stderr
    _assert_pod_gone(data["pod_id"])


def test_a_byte_flipped_after_the_pod_manifest_fails_naming_the_file(prefect_server, hub, tmp_path):
    """The fault point after the pod-side manifest pauses the run; the test flips one
    byte of model.json on the pod; the Hub's sha256 then differs from the manifest."""
    faults, out = tmp_path / "faults", tmp_path / "out"
    proc = start_cli(
        [
            "finetune",
            "--publish",
            "hf:demo/tampered",
            "--download",
            "none",
            "--hf-endpoint",
            hub.endpoint,
            "--output-dir",
            str(out),
        ],
        server_env(
            HF_TOKEN=hub.tokens_by_role["write"],
            PREFECT_RUNPOD_FAULTS="publish_upload:pause",
            PREFECT_RUNPOD_FAULT_DIR=str(faults),
        ),
    )
    try:
        wait_for_fault(proc, faults, "publish_upload")
        report = json.loads((out / "run-report.json").read_text())
        handle = LocalPodProvider().get(report["pod_id"])
        assert handle is not None
        model = (
            Path(handle.workdir)
            / "prefect-runpod"
            / report["flow_run_id"]
            / "bundle"
            / "outputs"
            / "model.json"
        )
        data = bytearray(model.read_bytes())
        data[100] ^= 0x01
        model.write_bytes(bytes(data))
        release_marker(faults, "publish_upload")
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output[-3000:]
    final = json.loads((out / "run-report.json").read_text())
    publish = _stage(final, "publish")
    assert publish["state"] == "Failed"
    assert "ChecksumMismatchError" in publish["reason"] and "model.json" in publish["reason"]
    assert "does not match the pod's manifest (sha256" in final["error"]
    assert final["publish"] is None and final["model_location"] is None
    assert final["terminated"] is True
    # The Hub holds the tampered bytes; the run refused to call them the model.
    held = hub.writer.tree(hub.repos[("model", "demo/tampered")], "main")["model.json"]
    assert held.sha256 == hashlib.sha256(bytes(data)).hexdigest()
    _assert_pod_gone(final["pod_id"])


def test_a_read_only_token_is_refused_in_preflight_with_nothing_rented(
    prefect_server, hub, tmp_path
):
    """The token comes from a saved HuggingFaceCredentials block (with the Hub's endpoint)."""
    from prefect_runpod.blocks.huggingface import HuggingFaceCredentials

    block = f"hf-read-{uuid.uuid4().hex[:8]}"
    HuggingFaceCredentials(token=hub.tokens_by_role["read"], endpoint=hub.endpoint).save(block)
    before = {h.pod_id for h in LocalPodProvider().list("")}
    state = finetune(
        publish="hf:demo/existing",
        download="none",
        hf_credentials_block=block,
        output_dir=str(tmp_path),
        return_state=True,
    )
    assert state.is_failed()
    report = json.loads((tmp_path / "run-report.json").read_text())
    preflight = _stage(report, "preflight")
    assert preflight["state"] == "Failed"
    assert (
        "publishing to demo/existing will fail on this machine: no_write_access, HTTP 403"
        in preflight["reason"]
    )
    assert "settings/tokens/new?tokenType=write" in report["error"]
    assert report["pod_id"] is None and _stage(report, "provision")["state"] == "Pending"
    assert _stage(report, "terminate")["reason"] == "no pod was created"
    assert {h.pod_id for h in LocalPodProvider().list("")} == before
    assert not hub.writer.calls  # no upload route was ever called


def test_an_s3_bucket_that_does_not_answer_rents_nothing(prefect_server, moto_s3, tmp_path):
    target = moto_target(moto_s3, "models").model_copy(update={"bucket": "never-created"})
    block = f"pub-{uuid.uuid4().hex[:8]}"
    target.save(block)
    before = {h.pod_id for h in LocalPodProvider().list("")}
    state = finetune(
        publish="s3", s3_target_block=block, output_dir=str(tmp_path), return_state=True
    )
    assert state.is_failed()
    report = json.loads((tmp_path / "run-report.json").read_text())
    assert _stage(report, "preflight")["state"] == "Failed"
    assert "s3://never-created" in report["error"] and "answered 404" in report["error"]
    assert report["pod_id"] is None
    assert {h.pod_id for h in LocalPodProvider().list("")} == before


def _table(artifact: object) -> list[dict]:
    """A table artifact's rows (the API returns them as JSON text)."""
    data = artifact.data  # type: ignore[attr-defined]
    return json.loads(data) if isinstance(data, str) else data


def _events(resource_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    async def read() -> list:
        async with get_client() as client:
            page = await client.read_events(
                filter=EventFilter(
                    event=EventNameFilter(prefix=["prefect.asset.materialization"]),
                    resource=EventResourceFilter(id=[resource_id]),
                ),
                limit=10,
            )
            return list(page.events)

    return asyncio.run(read())


def test_the_model_asset_is_materialised_and_eval_files_come_home(
    prefect_server, hub, tmp_path, monkeypatch
):
    """The write token comes from the worker's environment (HF_TOKEN)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    monkeypatch.setenv("HF_TOKEN", hub.tokens_by_role["write"])

    state = finetune(
        publish="hf:demo/asset-model@exp/1",
        download="eval",
        hf_endpoint=hub.endpoint,
        output_dir=str(tmp_path),
        return_state=True,
    )
    assert state.is_completed(), state.message
    report = state.result()
    revision = report["publish"]["revision"]
    assert report["publish"]["branch"] == "exp/1"
    assert hub.repos[("model", "demo/asset-model")].branches["exp/1"] == revision
    # --download eval: only the eval files crossed the gateway, verified locally.
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == [
        "eval_standalone.jsonl",
        "eval_train.jsonl",
    ]
    assert [(v["where"], v["files"]) for v in report["verified"]] == [("local", 2), ("hub", 3)]
    deadline = time.monotonic() + 180
    events = _events("hf://demo/asset-model")
    while not events and time.monotonic() < deadline:
        time.sleep(1.0)
        events = _events("hf://demo/asset-model")
    assert events, "no asset materialization event reached the server"
    event = events[0]
    assert event.event == "prefect.asset.materialization.succeeded"
    assert event.payload["revision"] == revision and event.payload["files"] == 3
    assert event.resource["prefect.asset.url"] == f"{hub.endpoint}/demo/asset-model"

    async def artifacts() -> dict:
        async with get_client() as client:
            arts = await client.read_artifacts(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
                )
            )
            # the latest version of each key (the API's default order is by id)
            return {a.key: a for a in sorted(arts, key=lambda a: a.created) if a.key}

    arts = asyncio.run(artifacts())
    assert revision in str(arts["published-model"].data)
    # The checkpoint's link points at the Hub commit once published (Prefect stores a
    # link artifact as one markdown link), not at a file:// path.
    link = re.fullmatch(r"\[(.+)\]\((.+)\)", str(arts["model-checkpoint"].data))
    assert link is not None and revision in link[1]
    assert link[2].startswith(f"{hub.endpoint}/demo/asset-model")
    costs = _table(arts["finetune-costs"])
    assert len(costs) == 1 and isinstance(costs[0]["stage_publish_s"], float)
    by_path = {r["path"]: r for r in _table(arts["checksum-manifest"])}
    assert by_path["model.json"]["local"] == "not downloaded"
    assert by_path["model.json"]["destination"] == "ok (lfs)"
    _assert_pod_gone(report["pod_id"])


PREPROCESS_CALL = 'model_input = textproc.preprocess(record["text"])'


def test_a_failing_parity_gate_blocks_the_publish_unless_warn_only(
    prefect_server, hub, tmp_path, monkeypatch
):
    bundle = copy_demo_bundle(tmp_path / "bundle")
    eval_py = bundle / "eval.py"
    assert eval_py.read_text().count(PREPROCESS_CALL) == 1
    eval_py.write_text(eval_py.read_text().replace(PREPROCESS_CALL, 'model_input = record["text"]'))
    monkeypatch.setenv("HF_TOKEN", hub.tokens_by_role["write"])
    common = {"bundle": str(bundle), "hf_endpoint": hub.endpoint}
    state = finetune(
        publish="hf:demo/gated", output_dir=str(tmp_path / "a"), return_state=True, **common
    )
    assert state.is_failed() and "input drift" in (state.message or "")
    report = json.loads((tmp_path / "a" / "run-report.json").read_text())
    publish = _stage(report, "publish")
    assert publish["state"] == "Skipped" and "eval-parity gate failed" in publish["reason"]
    assert _stage(report, "download")["state"] == "Completed"  # the run still downloads
    assert ("model", "demo/gated") not in hub.repos  # nothing was published
    state = finetune(
        publish="hf:demo/gated",
        parity_warn_only=True,
        output_dir=str(tmp_path / "b"),
        return_state=True,
        **common,
    )
    assert state.is_completed(), state.message
    report = state.result()
    assert report["parity"]["verdict"] == "fail" and report["publish"]["verified"]
    assert ("model", "demo/gated") in hub.repos


def test_publish_to_s3_stores_our_sha256_and_reads_it_back(prefect_server, moto_s3, tmp_path):
    target = moto_target(moto_s3, "models", prefix="team")
    bucket = target.bucket
    block = f"pub-{uuid.uuid4().hex[:8]}"
    target.save(block)
    state = finetune(
        publish="s3:models/e2e",
        s3_target_block=block,
        download="none",
        output_dir=str(tmp_path),
        return_state=True,
    )
    assert state.is_completed(), state.message
    report = state.result()
    published = report["publish"]
    assert published["target"] == f"s3://{bucket}/team/models/e2e"
    assert report["model_location"] == published["target"]
    assert {f["storage"] for f in published["files"]} == {"s3"}
    client = target.get_client()
    for f in published["files"]:
        head = client.head_object(Bucket=bucket, Key=f"team/models/e2e/{f['path']}")
        assert head["Metadata"]["sha256"] == f["sha256"] == f["remote_id"]
        assert head["ContentLength"] == f["size_bytes"]
    assert [v["where"] for v in report["verified"]] == ["s3"]
    assert moto_s3["secret_access_key"] not in json.dumps(report)
    _assert_pod_gone(report["pod_id"])


def test_a_runpod_emulator_pod_publishes_to_the_hub_on_loopback(
    runpod_emulator, runpod_provider, runpod_blocks, hub
):
    """Through RunPod's (emulated) PTY-only gateway, the pod itself reaches the Hub
    emulator on loopback and publishes; the flow verifies it from the Hub's records."""
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.provider import PodRequest
    from tests.fixtures.publish import make_outputs, publish_through

    _, _, ssh_key = runpod_blocks
    provider = runpod_provider()
    name = f"prft-{uuid.uuid4()}"
    handle = provider.create(PodRequest(public_key=ssh_key.get_public_key()), name)
    try:
        handle = provider.wait_ready(handle, timeout_seconds=180)
        assert handle.provider == "runpod" and handle.ssh is not None
        outputs = make_outputs(Path(handle.workdir) / "out", lfs_bytes=200 * 1024)
        with PodConsole.for_pod(handle, ssh_key.get_private_key()) as console:
            report = publish_through(
                console,
                handle,
                outputs,
                "hf:demo/from-runpod",
                hub.tokens_by_role["write"],
                hub.endpoint,
            )
    finally:
        provider.terminate(handle.pod_id)
    assert report.verified and {f.storage for f in report.files} == {"lfs", "regular"}
    assert hub.writer.calls["commit"] == 1
