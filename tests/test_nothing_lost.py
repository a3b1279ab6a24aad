"""Nothing is lost: outputs that cannot travel stay on a pod the run keeps, named, with
the command that fetches them (end to end on the local pod); a reused output dir is
refused unless ``--overwrite``, and then what an earlier run left there is named, never
counted as verified; a training log that is no text is kept and shown byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from tests.fixtures.demo_bundle import copy_demo_bundle
from tests.fixtures.flow_env import server_env


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.cli", *args],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _bundle_with_train_suffix(tmp_path: Path, suffix: str) -> Path:
    """The demo bundle whose train line runs ``suffix`` (shell) after the demo trained."""
    bundle = copy_demo_bundle(tmp_path / "bundle")
    spec = bundle / "bundle.toml"
    lines = [
        line[:-1] + f' && {suffix}"' if line.startswith("train =") else line
        for line in spec.read_text().splitlines()
    ]
    spec.write_text("\n".join(lines) + "\n")
    return bundle


@pytest.mark.slow
def test_an_absolute_link_in_the_outputs_keeps_the_pod_and_the_rest_travels(
    prefect_server, tmp_path
):
    from prefect.client.orchestration import get_client

    # One absolute link among the outputs (to the model itself, on the pod), and a log
    # that ends in 200 KB of binary output.
    link = 'ln -s \\"$PWD/outputs/model.json\\" outputs/abs'
    bundle = _bundle_with_train_suffix(tmp_path, f"{link} && head -c 200000 /dev/urandom")
    out = tmp_path / "out"
    (out / "outputs").mkdir(parents=True)  # an earlier run's folder, reused on purpose
    (out / "outputs" / "model.json").write_text('{"earlier": true}')
    (out / "outputs" / "stale.txt").write_text("from an earlier run")
    proc = _cli("finetune", "--bundle", str(bundle), "--output-dir", str(out), "--overwrite")
    report = json.loads((out / "run-report.json").read_text())
    pod_id, run_id = report["pod_id"], report["flow_run_id"]
    provider = LocalPodProvider()
    try:
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        # What can travel travelled and was verified: everything but the link.
        left = report["download"]["left_on_pod"]
        assert list(left) == ["abs"] and "absolute link" in left["abs"]
        here = sorted(p.name for p in (out / "outputs").iterdir())
        assert "model.json" in here and "abs" not in here
        assert "earlier" not in (out / "outputs" / "model.json").read_text()
        # The verified count and the earlier run's file together make up the folder.
        local = next(v for v in report["verified"] if v["where"] == "local")
        assert local["extra"] == ["stale.txt"]
        verified = {e["path"] for e in report["manifest"]["entries"]}
        assert local["files"] == len(verified) and verified | {"stale.txt"} == set(here)
        assert (
            f"verified     local: {local['files']} files at {out / 'outputs'}; 1 more there not from this run: stale.txt"
            in proc.stdout
        )
        # The error and the summary name what stayed, the fetch command and the CLI flag.
        fetch = f"prefect-runpod fetch {run_id} --follow-links"
        assert "abs (absolute link to " in report["error"] and fetch in report["error"]
        assert "follow_links" not in proc.stdout + proc.stderr
        assert f"fetch with   {fetch}" in proc.stdout
        terminate = next(s for s in report["stages"] if s["name"] == "terminate")
        assert terminate["state"] == "Skipped" and "kept: 1 output entry" in terminate["reason"]
        # The pod is kept and marked kept: on the pod (its dead-man then waits only for
        # the lifetime) and on the flow run (the reaper spares it).
        handle = provider.get(pod_id)
        assert handle is not None, "the pod holding the rest of the outputs was terminated"
        run_dir = Path(handle.workdir) / "prefect-runpod" / run_id
        assert (run_dir / "kept").is_file()
        with get_client(sync_client=True) as client:
            tags = client.read_flow_run(run_id).tags
        assert f"kept-pod:{pod_id}" in tags

        # The run's train.log is the pod's, byte for byte; `logs RUN` writes those bytes.
        pod_log = (run_dir / "train.log").read_bytes()
        assert len(pod_log) > 200000 and (out / "train.log").read_bytes() == pod_log
        shown = subprocess.run(
            [sys.executable, "-m", "prefect_runpod.flows.cli", "logs", run_id],
            env=server_env(), capture_output=True, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0 and shown.stdout == pod_log, shown.stderr[-2000:]

        # The fetch command brings the rest home, verified.
        got = _cli("fetch", run_id, "--follow-links")
        assert got.returncode == 0, got.stderr[-3000:]
        assert "entries verified" in got.stdout
        assert (out / "outputs" / "abs").read_bytes() == (
            out / "outputs" / "model.json"
        ).read_bytes()
        # ... and the run's report says so: nothing is left on the pod, and the folder's
        # files (the link's target among them) are counted as verified.
        after = json.loads((out / "run-report.json").read_text())
        assert after["download"]["left_on_pod"] == {}
        local = next(v for v in after["verified"] if v["where"] == "local")
        assert local["verified"] and local["extra"] == ["stale.txt"]
        assert local["files"] == len(here)  # model.json and the rest, now abs too
        assert "abs" in {e["path"] for e in after["manifest"]["entries"]}
        assert after["stages"] == report["stages"]  # the run's history stays as it was
    finally:
        provider.terminate(pod_id)


@pytest.mark.slow
def test_keep_pod_on_failure_marks_the_pod_kept_for_the_dead_man_and_the_reaper(
    prefect_server, tmp_path
):
    """``--keep-pod-on-failure`` kept the pod but marked it nowhere: its dead-man ended it
    once the run's heartbeat stopped, and the reaper could take it. Now the pod is marked
    kept on the pod and on the flow run, as for outputs that could not travel."""
    from prefect.client.orchestration import get_client

    bundle = _bundle_with_train_suffix(tmp_path, "exit 3")
    out = tmp_path / "out"
    proc = _cli(
        "finetune", "--bundle", str(bundle), "--output-dir", str(out), "--keep-pod-on-failure"
    )
    report = json.loads((out / "run-report.json").read_text())
    pod_id, run_id = report["pod_id"], report["flow_run_id"]
    provider = LocalPodProvider()
    try:
        assert proc.returncode == 1, proc.stderr[-3000:]
        terminate = next(s for s in report["stages"] if s["name"] == "terminate")
        assert terminate["state"] == "Skipped" and "keep_pod_on_failure" in terminate["reason"]
        handle = provider.get(pod_id)
        assert handle is not None, "the kept pod was terminated"
        assert (Path(handle.workdir) / "prefect-runpod" / run_id / "kept").is_file()
        with get_client(sync_client=True) as client:
            tags = client.read_flow_run(run_id).tags
        assert f"kept-pod:{pod_id}" in tags
    finally:
        provider.terminate(pod_id)


def test_a_folder_with_anything_in_it_is_refused_unless_overwriting(tmp_path):
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.validation import check_output_dir_unused

    out = tmp_path / "out"
    check_output_dir_unused(out, overwrite=False)  # a new folder
    out.mkdir()
    check_output_dir_unused(out, overwrite=False)  # an empty one
    for name in ("run-report.json", ".hidden", "a", "b"):
        (out / name).write_text("x")
    with pytest.raises(SpecError, match=r"not empty \(\.hidden, a, b and 1 more\)"):
        check_output_dir_unused(out, overwrite=False)
    check_output_dir_unused(out, overwrite=True)


def test_the_checksum_names_what_the_run_did_not_bring(tmp_path):
    from prefect_runpod.blocks.transfer.models import Manifest
    from prefect_runpod.tasks.checksum import extra_entries, verification_records

    (tmp_path / "sub").mkdir()
    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "sub" / "w.bin").write_bytes(b"123")
    expected = Manifest.compute(tmp_path)
    (tmp_path / "stale.txt").write_text("old")
    (tmp_path / "sub" / "old.bin").write_bytes(b"0")
    (tmp_path / "gone").mkdir()
    (tmp_path / "x.part").write_text("scratch")  # a transfer's own scratch is not the run's
    extra = extra_entries(tmp_path, expected)
    assert extra == ["gone", "stale.txt", "sub/old.bin"]
    (record,) = verification_records(tmp_path, expected, None, extra)
    assert record.files == 2 and record.extra == extra
