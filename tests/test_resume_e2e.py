"""Issue 25 end to end on the local pod: lose a pod mid-training, keep the run. The demo
checkpoints every epoch; its pod's host (the local pod's daemon) is killed once a
checkpoint has verified off the pod; the run resumes on a second pod from that
checkpoint and ends with the model an uninterrupted run trains."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import read_record
from prefect_runpod.flows.cli import main
from prefect_runpod.flows.finetune import finetune
from prefect_runpod.flows.run.cost_record import latest_record
from prefect_runpod.flows.run.report import RunReport, render_summary
from tests.fixtures.demo_bundle import copy_demo_bundle, demo_with_points, run_script
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.run_cells import HANG_GUARD, reaped, start_cli

pytestmark = pytest.mark.slow

_EPOCHS = ["--epochs", "6", "--sleep-per-epoch-seconds", "1.5"]


def _slow_demo(dest: Path) -> Path:
    """The demo bundle, 6 epochs with a pause after each (time to lose the pod)."""
    bundle = copy_demo_bundle(dest)
    spec = (bundle / "bundle.toml").read_text()
    spec = spec.replace("--out outputs ", f"--out outputs {' '.join(_EPOCHS)} ", 1)
    assert spec.count("--sleep-per-epoch-seconds") == 1, "the demo's train line changed"
    (bundle / "bundle.toml").write_text(spec)
    return bundle


def _pod_events(flow_run_id: str) -> dict[str, str]:
    """The run's ``prefect-runpod.pod.*`` events: name → resource id (the server stores
    events a little after they are sent: asked again until both are there)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    async def read() -> dict[str, str]:
        found: dict[str, str] = {}
        async with get_client() as client:
            for _ in range(180):
                page = await client.read_events(
                    filter=EventFilter(
                        event=EventNameFilter(prefix=["prefect-runpod.pod."]),
                        related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
                    ),
                    limit=50,
                )
                found = {e.event: e.resource.id for e in page.events}
                if len(found) >= 2:
                    break
                await asyncio.sleep(1.0)
        return found

    return asyncio.run(read())


def _kill_host_after_a_checkpoint(out: Path, seen: dict) -> None:
    """From "outside": once a checkpoint verified off the pod, kill its pod's daemon."""
    wait_until(
        "a checkpoint to verify off the pod",
        lambda: any((out / "checkpoints").glob("step-*.manifest.json")),
        300.0,
        0.1,
    )
    pod_id = json.loads((out / "run-report.json").read_text())["pod_id"]
    record = read_record(LocalPodProvider().home, pod_id)
    assert record is not None
    seen["pod_id"], seen["verified"] = (
        pod_id,
        sorted(p.name for p in (out / "checkpoints").glob("step-*.manifest.json")),
    )
    os.kill(record.pid, signal.SIGKILL)  # the host is lost


def _run_losing_the_host(bundle: Path, out: Path, **params: Any) -> tuple[Any, dict]:
    """Run the fine-tune while a thread kills its pod's host after the first verified
    checkpoint; returns the run's final state and what the thread saw (pod id, checkpoints)."""
    seen: dict = {}
    killer = threading.Thread(target=_kill_host_after_a_checkpoint, args=(out, seen), daemon=True)
    killer.start()
    state = finetune(
        bundle=str(bundle), output_dir=str(out), pod_poll_seconds=1.0, return_state=True,
        **params,
    )  # fmt: skip
    killer.join(timeout=60)
    return state, seen


def _uninterrupted_model(bundle: Path, where: Path) -> bytes:
    """The model an uninterrupted run of the bundle's job with the same seed trains."""
    done = run_script(bundle, "train.py", "--out", str(where), *_EPOCHS)
    assert done.returncode == 0, done.stderr
    return (where / "model.json").read_bytes()


def test_a_pod_lost_mid_training_resumes_on_a_new_pod_with_the_same_model(
    prefect_server, tmp_path, capsys
):
    bundle = _slow_demo(tmp_path / "bundle")
    out = tmp_path / "out"
    state, seen = _run_losing_the_host(bundle, out, local_cost_per_hr=0.36)
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    assert state.is_completed(), (state.message, report.error)

    # Two pods: the first lost with its host, the second resumed from a verified checkpoint.
    first, second = report.attempts
    assert first.pod_id == seen["pod_id"] and first.end is not None
    assert first.end.cause == "host_lost" and first.end.confirmed
    assert second.number == 2 and second.pod_name == f"{report.pod_name}-a2"
    assert second.resumed_from is not None and second.resumed_from.startswith("step-")
    assert second.steps_lost is not None and second.steps_lost >= 0
    assert second.end is not None and second.end.confirmed

    # The model is byte for byte the one an uninterrupted run with the same seed trains.
    assert (out / "outputs" / "model.json").read_bytes() == _uninterrupted_model(
        bundle, tmp_path / "plain"
    )
    assert report.manifest is not None and report.download is not None
    assert report.download.verified

    # Both pods gone, each one's cost known; the run's cost is their sum.
    local = LocalPodProvider()
    assert local.get(first.pod_id) is None and local.get(second.pod_id) is None
    assert report.terminated
    assert all(a.billed_seconds > 0 and a.usd > 0 for a in report.attempts)
    assert report.cost.usd == pytest.approx(first.usd + second.usd, abs=1e-6)
    record = latest_record(report.flow_run_id)
    assert record is not None and [a.pod_id for a in record.attempts] == [
        first.pod_id,
        second.pod_id,
    ]
    # The checkpoints' copies and their lag are recorded and shown.
    assert report.checkpoints and all(c.lag_seconds >= 0 for c in report.checkpoints)
    summary = render_summary(report)
    assert "attempt 2" in summary and f"resumed from {second.resumed_from}" in summary
    assert f"attempt 2    {second.pod_id} (cpu, no GPU) ended by" in summary  # its GPU count
    assert "copy lag" in summary
    # `status` shows both pods of the run.
    capsys.readouterr()
    assert main(["status", report.flow_run_id, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (
        row["attempts"].startswith(f"1: {first.pod_id} ")
        and f"; 2: {second.pod_id} " in (row["attempts"])
    )
    assert f"resumed from {second.resumed_from}" in row["attempts"]
    assert f"1: {first.pod_id} (cpu, no GPU) ended by" in row["attempts"]
    # Prefect events for the lost pod and the one the run resumed on, related to the run.
    events = _pod_events(report.flow_run_id)
    assert events.get("prefect-runpod.pod.lost") == f"prefect-runpod.pod.{first.pod_id}"
    assert events.get("prefect-runpod.pod.recovered") == f"prefect-runpod.pod.{second.pod_id}"


def test_a_loss_beyond_max_pod_losses_fails_naming_the_checkpoint_and_the_resume_from_command(
    prefect_server, tmp_path
):
    """With ``max_pod_losses=0`` the first loss is one too many: the run fails, rents no
    second pod, and its error names the last verified checkpoint, kept in the output dir,
    and the ``--resume-from`` command (which the SIGKILL test below runs end to end)."""
    bundle = _slow_demo(tmp_path / "bundle")
    out = tmp_path / "out"
    state, seen = _run_losing_the_host(bundle, out, max_pod_losses=0)
    assert state.is_failed()
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    (only,) = report.attempts
    assert only.pod_id == seen["pod_id"] and only.end is not None and only.end.confirmed
    kept = [p.name.removesuffix(".manifest.json") for p in (out / "checkpoints").glob("*.json")]
    newest = max(kept, key=lambda n: int(n.split("-")[1]))
    message = state.message or ""
    assert "over max_pod_losses 0" in message and f"checkpoint, {newest}, is kept" in message
    assert (out / "checkpoints" / newest / "model.json").is_file()
    assert LocalPodProvider().get(only.pod_id) is None
    assert f"--resume-from {report.flow_run_id}" in message


@pytest.mark.timeout(900)
def test_resume_from_a_killed_cli_continues_the_run_as_a_new_attempt_of_its_record(
    prefect_server, tmp_path, capsys
):
    """Issue 25's example: SIGKILL the CLI once a checkpoint verified off its pod; the
    pod's dead-man ends the pod (the heartbeat goes stale); ``finetune --resume-from
    RUN_ID`` continues the run: the model is the uninterrupted run's, the new record
    carries the old pod as its attempt 1 (its end confirmed from the pod's tombstone) and
    rents attempt 2, the old record says who continued it, and ``cost`` counts 2 pods,
    not 3."""
    from prefect.settings import get_current_settings

    bundle = _slow_demo(tmp_path / "bundle")
    first = tmp_path / "killed"
    first.mkdir()
    cli = start_cli(
        first, "", "--bundle", str(bundle), "--heartbeat-stale-seconds", "4",
        "--pod-poll-seconds", "1", "--local-cost-per-hr", "0.36",
        PREFECT_API_URL=str(get_current_settings().api.url),
    )  # fmt: skip
    with reaped(cli):
        wait_until(
            "a checkpoint to verify off the pod",
            lambda: (
                any((cli.out / "checkpoints").glob("step-*.manifest.json"))
                or cli.proc.poll() is not None
            ),
            HANG_GUARD,
            0.1,
        )
        assert cli.proc.poll() is None, cli.tail()
        os.kill(cli.proc.pid, signal.SIGKILL)  # the run's own process dies, its pod lives on
        cli.wait()
    old = json.loads((cli.out / "run-report.json").read_text())
    old_id, old_pod = old["flow_run_id"], old["pod_id"]
    before = latest_record(old_id)
    assert before is not None and before.may_still_bill  # nobody recorded its end
    local = LocalPodProvider()
    wait_until("the dead-man to end the pod", lambda: local.get(old_pod) is None, HANG_GUARD)

    again = tmp_path / "again"
    resumed = finetune(
        bundle=str(bundle), output_dir=str(again), resume_from=old_id, return_state=True,
        local_cost_per_hr=0.36,
    )  # fmt: skip
    report = RunReport.model_validate_json((again / "run-report.json").read_text())
    assert resumed.is_completed(), (resumed.message, report.error)
    assert (again / "outputs" / "model.json").read_bytes() == _uninterrupted_model(
        bundle, tmp_path / "plain"
    )

    # The new record: the old pod carried as attempt 1, its own pod attempt 2 (-a2).
    record = latest_record(report.flow_run_id)
    assert record is not None and record.carried_from == old_id
    carried, own = record.attempts
    assert (carried.number, carried.pod_id, carried.carried_from) == (1, old_pod, old_id)
    assert carried.end is not None and carried.end.confirmed
    assert carried.end.ended_by.value == "deadman"  # the local pod's tombstone says so
    assert own.number == 2 and own.carried_from is None and own.resumed_from is not None
    assert own.pod_name == f"{report.pod_name}-a2" and local.get(own.pod_id) is None  # type: ignore[arg-type]
    assert report.terminated and report.cost.usd == pytest.approx(record.total_usd, abs=1e-6)
    assert record.total_usd == pytest.approx(carried.usd + own.usd, abs=1e-6)
    assert "carried from run" in render_summary(report)

    # The old record says who continued it, with its pod's end confirmed.
    after = latest_record(old_id)
    assert after is not None and after.continued_by == report.flow_run_id
    assert not after.may_still_bill
    # Its flow run, left Running by the killed process, is Crashed and names who goes on.
    with get_client(sync_client=True) as client:
        old_state = client.read_flow_run(old_id).state  # type: ignore[arg-type]
    assert old_state is not None
    assert old_state.is_crashed() and report.flow_run_id in (old_state.message or ""), old_state
    capsys.readouterr()
    assert main(["status", old_id, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["continued_by"] == report.flow_run_id
    assert row["pod_end"].endswith(f"continued by {report.flow_run_id}")

    assert main(["status", report.flow_run_id, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["carried_from"] == old_id and row["attempts"].startswith(f"1: {old_pod} ")
    assert row["usd_so_far"] == pytest.approx(record.total_usd, abs=1e-6)  # both pods

    # `cost` over the two runs: the old pod shown in both records, counted once.
    assert main(["cost", "--json", "--limit", "2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {r["flow_run_id"] for r in shown["runs"]} == {old_id, report.flow_run_id}
    assert shown["totals"]["pods"] == 2  # not 3
    assert shown["totals"]["usd"] == pytest.approx(carried.usd + own.usd, abs=1e-6)


def test_a_loss_at_the_recovery_spend_cap_stops_the_run_before_renting_again(
    prefect_server, tmp_path
):
    """``max_recovery_usd``: the lost pod billed the cap already, so the run rents no
    second pod; it fails in one sentence naming the cap, what the lost pod billed, the
    last verified checkpoint (kept in the output dir) and the ``--resume-from`` command."""
    bundle = _slow_demo(tmp_path / "bundle")
    out = tmp_path / "out"
    state, seen = _run_losing_the_host(bundle, out, local_cost_per_hr=0.36, max_recovery_usd=0.0001)
    assert state.is_failed()
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    (only,) = report.attempts  # no second pod was rented
    assert only.pod_id == seen["pod_id"] and only.end is not None and only.end.confirmed
    assert only.usd >= 0.0001
    message = state.message or ""
    assert f"billed {only.usd:.6f} USD together, at or over max_recovery_usd 0.0001 USD" in (
        message
    )
    kept = [p.name.removesuffix(".manifest.json") for p in (out / "checkpoints").glob("*.json")]
    newest = max(kept, key=lambda n: int(n.split("-")[1]))
    assert f"checkpoint, {newest}, is kept in {out / 'checkpoints' / newest}" in message
    assert (out / "checkpoints" / newest / "model.json").is_file()
    assert f"--resume-from {report.flow_run_id}" in message
    assert LocalPodProvider().get(only.pod_id) is None


def test_a_pod_lost_while_a_checkpoint_is_written_resumes_from_the_one_before(
    prefect_server, tmp_path
):
    """The issue's example: the pod's host dies while the job writes ``step-80.tmp/``
    (epoch 4's checkpoint, its model file in, its state not, not renamed): the
    half-written checkpoint is never copied nor resumed from; the run resumes from
    ``step-60/`` (epoch 3's) and ends with the uninterrupted model."""
    points = tmp_path / "points"
    bundle = demo_with_points(tmp_path / "bundle", points, " ".join(_EPOCHS))
    out = tmp_path / "out"
    pause = points / "checkpoint_write-80.pause"
    pause.write_text("")
    seen: dict = {}

    def kill_while_writing() -> None:
        reached = points / "checkpoint_write-80.reached"
        wait_until("the job to start writing step-80.tmp/", reached.is_file, 600.0, 0.1)
        wait_until(
            "step-60 to verify off the pod",
            lambda: (out / "checkpoints" / "step-60.manifest.json").is_file(),
            300.0,
            0.1,
        )
        wait_until(  # the run has read the job's last progress line before the loss
            "the run to read step 80's progress",
            lambda: '"step": 80' in (out / "train.log").read_text(errors="replace"),
            300.0,
            0.1,
        )
        pod_id = reached.read_text().strip()
        record = read_record(LocalPodProvider().home, pod_id)
        assert record is not None
        half = list((LocalPodProvider().home).rglob("step-80.tmp"))
        seen["half"] = sorted(p.name for h in half for p in h.iterdir())
        seen["pod_id"] = pod_id
        pause.unlink()  # the next pod writes step-80 through
        os.kill(record.pid, signal.SIGKILL)  # the host is lost mid-write

    killer = threading.Thread(target=kill_while_writing, daemon=True)
    killer.start()
    started = time.monotonic()
    state = finetune(
        bundle=str(bundle), output_dir=str(out), pod_poll_seconds=1.0, return_state=True
    )
    killer.join(timeout=60)
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    assert state.is_completed(), (state.message, report.error)
    assert seen.get("half") == ["model.json"], seen  # it was half-written when lost

    first, second = report.attempts
    assert first.pod_id == seen["pod_id"] and first.end is not None
    assert first.end.cause == "host_lost" and first.end.confirmed
    assert second.resumed_from == "step-60"
    assert second.steps_lost == 20  # steps 61..80, trained on the lost pod after step-60
    # Nothing of step-80 came off the first pod: only the second pod's step-80 is kept.
    copied_off_first = [c.step for c in report.checkpoints if c.attempt == 1]
    assert copied_off_first and max(copied_off_first) == 60
    assert not (out / "checkpoints" / ".quarantine").exists()
    assert (out / "outputs" / "model.json").read_bytes() == _uninterrupted_model(
        bundle, tmp_path / "plain"
    )
    local = LocalPodProvider()
    assert local.get(first.pod_id) is None and local.get(second.pod_id) is None
    print(f"lost while writing a checkpoint, resumed: {time.monotonic() - started:.1f} s")


def test_resume_from_a_checkpoint_of_another_gpu_count_is_refused_before_renting(
    prefect_server, runpod_env, tmp_path
):
    """A checkpoint written on a pod with 2 GPUs, a RunPod pod spec of 1: the run fails
    in preflight saying why (per-rank state), and RunPod is never asked for a pod."""
    from prefect_runpod.blocks.pod_side import manifest as tree_manifest
    from prefect_runpod.flows.run.checkpoints import CheckpointStore

    old = CheckpointStore(tmp_path / "old-run")
    written = tmp_path / "pod" / "step-20"
    written.mkdir(parents=True)
    (written / "model.json").write_text("{}")
    (written / "state.json").write_text("{}")
    tree = tree_manifest.compute_manifest(str(written))
    folder, _ = old.staging("step-20", tree)
    for name in ("model.json", "state.json"):
        (folder / name).write_text("{}")
    assert old.accept("step-20", folder, tree, written_by={"gpu_count": 2, "attempt": 1})
    state = finetune(
        bundle=str(copy_demo_bundle(tmp_path / "bundle")), output_dir=str(tmp_path / "out"),
        provider="runpod", resume_from=str(old.root.parent), return_state=True,
    )  # fmt: skip
    assert state.is_failed()
    message = state.message or ""
    assert "step-20 was written on a pod with 2 GPUs and this pod has 1 GPU" in message
    assert "per-rank state" in message and "nothing was rented" in message
    assert not [r for r in runpod_env.requests if r.get("operation") == "createPod"]
    assert runpod_env.live_pod_ids() == []


def test_a_recovered_pod_rented_with_another_gpu_count_is_refused_and_ended(
    prefect_server, runpod_env, tmp_path
):
    """Emulated RunPod: once a checkpoint (written on a 1-GPU pod) verified, the pod's
    host fails and RunPod hands the re-rented pod 2 GPUs (``faults.gpu_count``). The
    pre-rent check passes (the pod spec still asks for 1); the new pod is refused once it
    is up, before the checkpoint is uploaded, with the reason (per-rank state), and the
    run fails with no pod left."""
    bundle = _slow_demo(tmp_path / "bundle")
    out = tmp_path / "out"
    seen: dict = {}

    def lose_and_regpu() -> None:
        wait_until(
            "a checkpoint to verify off the pod",
            lambda: any((out / "checkpoints").glob("step-*.manifest.json")),
            300.0,
            0.1,
        )
        seen["pod_id"] = json.loads((out / "run-report.json").read_text())["pod_id"]
        runpod_env.faults.gpu_count = 2  # the next pod RunPod hands out has 2 GPUs
        runpod_env.fail_host(seen["pod_id"], "ERROR")

    killer = threading.Thread(target=lose_and_regpu, daemon=True)
    killer.start()
    state = finetune(
        bundle=str(bundle), output_dir=str(out), provider="runpod", pod_poll_seconds=1.0,
        return_state=True,
    )  # fmt: skip
    killer.join(timeout=60)
    assert state.is_failed()
    report = RunReport.model_validate_json((out / "run-report.json").read_text())
    first, second = report.attempts
    assert first.pod_id == seen["pod_id"] and first.gpu_count == 1
    assert second.gpu_count == 2 and second.pod_name == f"{report.pod_name}-a2"
    message = state.message or ""
    assert f"pod {second.pod_id} does not resume the run: checkpoint {second.resumed_from} " in (
        message
    )
    assert "was written on a pod with 1 GPU and this pod has 2 GPUs" in message
    assert "per-rank state" in message and "the checkpoint is kept in" in message
    assert report.stage("provision").state.value == "Failed"
    assert report.stage("upload").attempt != 2  # no checkpoint was put on the refused pod
    assert all(a.end is not None and a.end.confirmed for a in report.attempts)
    assert runpod_env.live_pod_ids() == []
