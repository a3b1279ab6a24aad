"""A run that fails after renting names its cause: the failing stage's reason, the
Prefect state message and the CLI summary start with the real error line, and the CLI
prints the summary without Prefect's tracebacks above it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.flows.finetune import finetune
from tests.fixtures.demo_bundle import copy_demo_bundle
from tests.fixtures.flow_env import server_env

pytestmark = pytest.mark.slow


def _bundle_training_with(tmp_path: Path, script: str) -> Path:
    bundle = copy_demo_bundle(tmp_path / "bundle")
    (bundle / "job.py").write_text(script)
    spec = bundle / "bundle.toml"
    # The job keeps no checkpoints, so the demo's checkpoint fields go with its train line.
    lines = [
        'train = "{python} -u job.py"' if line.startswith("train =") else line
        for line in spec.read_text().splitlines()
        if not line.startswith(("checkpoints =", "keep_checkpoints ="))
    ]
    spec.write_text("\n".join(lines) + "\n")
    return bundle


def test_cli_failure_shows_the_error_line_and_no_traceback(prefect_server, tmp_path):
    bundle = _bundle_training_with(
        tmp_path,
        "import sys\n"
        "print('step 1/4', flush=True)\n"
        "print('ValueError: learning rate must be positive', flush=True)\n"
        "print('cleaning up', flush=True)\n"
        "sys.exit(3)\n",
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable, "-m", "prefect_runpod.flows.cli", "finetune",
            "--bundle", str(bundle), "--output-dir", str(out),
        ],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    cause = "training exited with code 3 after"
    train_row = next(line for line in proc.stdout.splitlines() if line.startswith("train "))
    assert "Failed" in train_row and cause in train_row
    assert train_row.endswith(": ValueError: learning rate must be positive.")
    report = json.loads((out / "run-report.json").read_text())
    assert report["terminated"] and LocalPodProvider().get(report["pod_id"]) is None
    assert report["error"].splitlines()[0].endswith("ValueError: learning rate must be positive.")


def test_a_job_that_exits_0_without_its_outputs_fails_in_train(prefect_server, tmp_path):
    bundle = _bundle_training_with(tmp_path, "print('trained, wrote nothing')\n")
    state = finetune(bundle=str(bundle), output_dir=str(tmp_path / "out"), return_state=True)
    assert state.is_failed()
    report = json.loads((tmp_path / "out" / "run-report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["train"]["state"] == "Failed"
    assert stages["eval_parity"]["state"] == "Pending", "the eval is not blamed"
    reason = stages["train"]["reason"]
    assert "training exited 0 but did not write outputs (outputs), " in reason
    assert "outputs/eval_train.jsonl (train_eval_jsonl)" in reason
    assert "did not write outputs" in (state.message or "")
    assert report["terminated"]
