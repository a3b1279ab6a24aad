"""Issue 14, on the local pod and emulated RunPod: a pod lost under a run is noticed at
once and said in one sentence; a run whose pod may still bill never ends Completed; the
summary, run-report.json, the finetune-costs record and the Prefect state agree."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from prefect_runpod.blocks.costs import settle
from prefect_runpod.blocks.faults import release_marker
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.flows.finetune import finetune
from prefect_runpod.flows.run.cost_record import latest_record
from prefect_runpod.flows.run.report import RunReport, render_summary
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.runpod_emulator import assert_billed_as_the_ledger

pytestmark = pytest.mark.slow

_INTERNAL = ("reconnect()", "connect()")
"""User-facing text never names the console's methods (issue 14)."""


def _terminate_when_reached(marker: Path, out: Path, argv_extra: list[str], seen: dict) -> None:
    """From "another shell": wait for the run's pause, end its pod with the CLI, release."""
    from prefect_runpod.flows.cli import main

    wait_until("the run to reach its pause", marker.exists, 240.0, 0.1)
    pod_id = json.loads((out / "run-report.json").read_text())["pod_id"]
    seen["pod_id"] = pod_id
    seen["rc"] = main(["terminate", pod_id, *argv_extra])
    release_marker(marker.parent, marker.name.removesuffix(".reached"))


def test_a_pod_terminated_from_outside_while_training_stops_the_run_in_one_sentence(
    prefect_server, tmp_path, monkeypatch
):
    """Issue 14 example 1: ``prefect-runpod terminate POD`` from another shell while the
    demo trains. The run used to wait out a second 300 s reconnect window, say
    "terminated yes, confirmed" beside "may still run on the pod", bill 629.9 s for a
    24 s pod and ask the user to call ``reconnect()``."""
    faults, out = tmp_path / "faults", tmp_path / "out"
    monkeypatch.setenv("PREFECT_RUNPOD_FAULTS", "train_running:pause")
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_DIR", str(faults))
    seen: dict = {}
    helper = threading.Thread(
        target=_terminate_when_reached,
        args=(faults / "train_running.reached", out, [], seen),
        daemon=True,
    )
    helper.start()
    state = finetune(
        output_dir=str(out), local_cost_per_hr=0.22, pod_poll_seconds=1.0, return_state=True
    )
    helper.join(timeout=120)
    assert seen["rc"] == 0

    assert state.is_failed()
    message = state.message or ""
    assert f"pod {seen['pod_id']} was terminated outside this run" in message
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    train = report.stage("train")
    assert train.state.value == "Failed" and train.reason.startswith("PodGoneError: ")
    assert len(train.reason.splitlines()) == 1
    # The pod's end: confirmed, by the CLI, billed until then — not until the run gave up.
    assert report.terminated and report.pod_end is not None and report.pod_end.confirmed
    assert report.pod_end.ended_by.value == "cli"
    assert len(report.attempts) == 1  # a pod ended by our own terminate is never resumed
    assert report.pod_end.ended_at <= train.ended_at
    bill = settle(0.22, report.pod.created_at, report.pod_end.ended_at)
    assert (report.cost.billed_seconds, report.cost.usd) == (bill.billed_seconds, bill.usd)
    # Summary, report, finetune-costs record and state agree with each other.
    record = latest_record(report.flow_run_id)
    assert record is not None and record.end is not None and report.pod_end is not None
    same = {"recorded_at"}
    assert record.end.model_dump(mode="json", exclude=same) == report.pod_end.model_dump(
        mode="json", exclude=same
    )
    assert (record.usd, record.billed_seconds) == (report.cost.usd, report.cost.billed_seconds)
    summary = render_summary(report)
    assert "terminated   gone: terminated outside this run, ended by cli" in summary
    assert "may still" not in summary and "may still" not in message
    for text in (message, summary, train.reason):
        assert not any(name in text for name in _INTERNAL), text
    assert LocalPodProvider().get(seen["pod_id"]) is None


def test_a_terminate_that_is_never_confirmed_fails_the_run_saying_may_still_be_billing(
    prefect_server, runpod_env, tmp_path
):
    """Issue 14 example 2: the RunPod API refusing every call from the first
    ``podTerminate`` on: the flow run ended Completed with ``terminated False``."""
    from prefect_runpod.flows.cli import main

    runpod_emulator = runpod_env
    runpod_emulator.faults.terminate_fail_n = 10**6  # down for good
    out = tmp_path / "out"
    state = finetune(
        provider="runpod", output_dir=str(out), terminate_timeout_seconds=3, return_state=True
    )
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    pod_id = report.pod_id
    command = f"prefect-runpod terminate --provider runpod {pod_id}"
    assert state.is_failed(), state
    assert f"pod {pod_id} may still be billing" in state.message and command in state.message
    assert not report.terminated and not report.passed
    assert report.pod_end is not None and not report.pod_end.confirmed
    assert f"NO: may still be billing; end it with `{command}`" in render_summary(report)
    assert all(s.passed for s in report.stages if s.name != "terminate")
    record = latest_record(report.flow_run_id)
    assert record is not None and record.may_still_bill and command in record.state_line()

    # The exact command, once RunPod answers again, ends it and completes the record.
    runpod_emulator.faults.terminate_fail_n = 0
    assert main(command.split()[1:]) == 0
    returned = datetime.now(UTC)
    assert runpod_emulator.live_pod_ids() == []
    record = latest_record(report.flow_run_id)
    assert record is not None and record.end.confirmed and record.end.ended_by.value == "cli"
    assert record.created_at is not None and record.end.ended_at is not None
    # Billed from create to the CLI's confirmed terminate, as the emulator billed it.
    assert_billed_as_the_ledger(
        runpod_emulator, pod_id, record.created_at, record.end.ended_at, ended_by=returned
    )
    bill = settle(record.cost_per_hr, record.created_at, record.end.ended_at)
    assert (record.billed_seconds, record.usd) == (bill.billed_seconds, bill.usd)
    slack = runpod_emulator.ledger.split_rounding_usd(pod_id, record.billing_note)
    assert record.runpod_usd == pytest.approx(runpod_emulator.ledger.usd(pod_id), abs=slack)
    updated = RunReport.model_validate_json((out / "run-report.json").read_text())
    assert updated.terminated and updated.cost.usd == record.usd


def test_a_wait_that_fails_ends_the_pod_within_the_runs_terminate_deadline(
    prefect_server, runpod_env, tmp_path, monkeypatch
):
    """The terminate after a failed ``wait_ready`` waits the run's
    ``terminate_timeout_seconds``, not a fixed 120 s, and the run says the pod may still
    be billing when RunPod never confirms."""
    runpod_env.faults.terminate_fail_n = 10**6  # down for good
    monkeypatch.setenv("PREFECT_RUNPOD_FAULTS", "wait_ready:raise")
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_DIR", str(tmp_path / "faults"))
    out = tmp_path / "out"
    state = finetune(
        provider="runpod", output_dir=str(out), terminate_timeout_seconds=2, return_state=True
    )
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    runpod_env.faults.terminate_fail_n = 0
    runpod_env.terminate(report.pod_id)  # RunPod answers again: nothing left behind
    provision = report.stage("provision")
    assert state.is_failed() and f"pod {report.pod_id} may still be billing" in state.message
    assert provision.state.value == "Failed"
    assert "terminate not confirmed after 2 s" in provision.reason, provision.reason


def test_the_budget_cap_holds_with_the_stop_and_the_terminate(prefect_server, tmp_path):
    """Issue 24: ``--max-cost-usd 0.05`` at 36 USD/h ended at 0.0615 USD (23 % over the
    cap). The spend is projected to the end of a stop begun now, so the final spend, the
    stop and the terminate included, stays under the cap."""
    from tests.test_deployments import _slow_bundle as _slow_demo

    out = tmp_path / "out"
    # 6 USD/h: the 0.05 USD cap is 30 s of billing, spent while the slowed demo trains
    state = finetune(
        bundle=str(_slow_demo(tmp_path / "bundle", 30.0)),
        output_dir=str(out),
        local_cost_per_hr=6.0,
        max_cost_usd=0.05,
        return_state=True,
    )
    assert state.is_failed()
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    assert report.error is not None and "reached max_cost_usd 0.0500 USD" in report.error
    assert report.terminated and report.pod_end is not None and report.pod_end.confirmed
    assert report.pod is not None and report.pod_end.ended_at is not None
    bill = settle(6.0, report.pod.created_at, report.pod_end.ended_at)
    assert report.cost.usd == bill.usd <= 0.05, report.error
    print(f"budget 0.05 USD: spent {report.cost.usd:.4f} USD ({report.cost.usd / 0.05:.2f} x)")
    assert LocalPodProvider().get(report.pod_id) is None
