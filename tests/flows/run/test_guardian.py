"""The run's guardian (issue 23 §6, layer 5): what it waits for, and — on the default
provider, the local pod — a ``prefect-runpod finetune`` SIGKILLed during ``wait_ready``
whose pod the guardian ends, records (``ended_by: guardian``) and whose run it marks
Crashed, with no reaper run. No guardian is left behind (the session checks too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from prefect_runpod.flows.run.guardian import (
    Guardian,
    GuardianJob,
    _Inbox,
    live_guardians,
    wait_for_word,
)
from tests.fixtures.fault_matrix import wait_until


def _job(**kw: float) -> GuardianJob:
    return GuardianJob(params={"provider": "local"}, pod_name="prft-x", flow_run_id="r", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("said", "parent", "outcome"),
    [
        (b"armed\n", True, "armed"),
        (b"gone\n", True, "gone"),
        (b"release\n", True, "release"),
        (b"", True, "died"),  # the pipe closed without a word: the run's process is gone
        (None, False, "died"),  # still open, but its parent changed
    ],
)
def test_the_guardian_leaves_on_a_word_and_acts_when_its_run_dies(said, parent, outcome) -> None:  # type: ignore[no-untyped-def]
    read_end, write_end = os.pipe()
    try:
        if said is not None:
            os.write(write_end, said)
            os.close(write_end)
            write_end = -1
        got = wait_for_word(_Inbox(read_end), _job(poll_seconds=0.01), lambda: parent)
        assert got == outcome
    finally:
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)


def test_the_guardian_leaves_at_its_hard_deadline() -> None:
    read_end, write_end = os.pipe()
    now = {"t": 0.0}

    def clock() -> float:
        now["t"] += 10.0
        return now["t"]

    try:
        job = _job(deadline_seconds=30.0, poll_seconds=0.01)
        assert wait_for_word(_Inbox(read_end), job, lambda: True, clock) == "deadline"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_guardian_told_armed_leaves_and_says_only_its_words(tmp_path: Path) -> None:
    guardian = Guardian.start(_job(), home=tmp_path)
    try:
        with pytest.raises(ValueError, match="understands armed, gone, release"):
            guardian.tell("terminate")
        guardian.tell("armed")
        guardian.tell("gone")  # idempotent: the first word counts
        assert guardian.wait(120) == 0
    finally:
        guardian.process.kill()
        guardian.process.wait()
    assert live_guardians(tmp_path) == []
    assert "the run said 'armed'; leaving" in (tmp_path / "guardians" / "r.log").read_text()


@pytest.mark.slow
def test_sigkill_during_wait_ready_the_guardian_ends_the_local_pod(prefect_api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Before: nothing ended the pod until the reaper's TTL (the local pod kept a lease of
    its own, RunPod's never fired). Now the guardian, its run's process gone before the
    dead-man was armed, ends it, records who did, and the run says Crashed."""
    from prefect.client.orchestration import get_client

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.flows.run.cost_record import latest_record

    faults, out = tmp_path / "faults", tmp_path / "out"
    env = prefect_api.client_env(
        PREFECT_RUNPOD_FAULTS="wait_ready:sigkill", PREFECT_RUNPOD_FAULT_DIR=str(faults)
    )
    cli = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.cli", "finetune", "--output-dir", str(out),
         "--name-prefix", f"g{uuid.uuid4().hex[:6]}"],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert cli.returncode == -9, cli.stdout[-2000:] + cli.stderr[-2000:]
    report = json.loads((out / "run-report.json").read_text())
    pod_id, run_id = report["pod_id"], report["flow_run_id"]
    provider = LocalPodProvider()

    def settled() -> bool:
        record = latest_record(run_id)
        ended = record is not None and record.end is not None and record.end.confirmed
        return ended and provider.status(pod_id).gone and not live_guardians()

    wait_until("the guardian to end the pod, record it and leave", settled, 180.0, 0.5)
    record = latest_record(run_id)
    assert record is not None and record.end is not None
    assert (record.end.ended_by.value, record.recorded_by) == ("guardian", "guardian")
    assert "died before the pod's dead-man switch was armed" in record.end.detail
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state  # type: ignore[arg-type]
    assert state is not None and state.type.value == "CRASHED"
    assert "the guardian ended the run" in (state.message or "")
