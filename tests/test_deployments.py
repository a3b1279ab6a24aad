"""Deployments, triggers and the pod cap, against a real ``prefect server start``.

The deployments are served by ``python -m prefect_runpod.deployments.register serve``
in a subprocess (a real runner: each flow run is its own process), and driven the way
other pipelines drive them: ``run_deployment`` (waiting and fire-and-forget), a
``dataset.updated`` event, cancellation through the API, and a sweep under the
``runpod-gpu`` limit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.demo_bundle import copy_demo_bundle

ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = ROOT / "deployments" / "prefect.yaml"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


# --- static: prefect.yaml and register agree ------------------------------------------


def test_prefect_yaml_declares_what_register_serves():
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.flows import load_flow_from_entrypoint

    from prefect_runpod.deployments.serving import build_deployments

    doc = yaml.safe_load(PREFECT_YAML.read_text())
    declared = set()
    for dep in doc["deployments"]:
        flow = load_flow_from_entrypoint(dep["entrypoint"])
        declared.add(f"{flow.name}/{dep['name']}")
        assert dep["work_pool"]["name"] == "runpod-finetune"
        for trig in dep.get("triggers", []):
            parsed = DeploymentEventTrigger(**{k: v for k, v in trig.items() if k != "type"})
            assert parsed.expect == {"dataset.updated"}
            assert parsed.parameters["bundle"] == "{{ event.payload.bundle }}"
    served = {f"{d.flow_name}/{d.name}" for d in build_deployments()}
    assert (
        declared
        == served
        == {
            "runpod-finetune/on-demand",
            "runpod-finetune/nightly",
            "runpod-finetune/on-dataset-updated",
            "runpod-reaper/every-10-min",
            "runpod-sweep/on-demand",
        }
    )
    by_name = {f"{d.flow_name}/{d.name}": d for d in build_deployments()}
    assert by_name["runpod-finetune/nightly"].schedules[0].schedule.cron == "0 3 * * *"
    reaper_every = by_name["runpod-reaper/every-10-min"].schedules[0].schedule.interval
    assert reaper_every == timedelta(minutes=10)
    assert by_name["runpod-finetune/on-demand"].parameters["concurrency_limit"] == "runpod-gpu"


# --- live: a served runner on a real server -------------------------------------------


def _slow_bundle(dest: Path, sleep_per_epoch_seconds: float) -> Path:
    """The demo bundle whose training sleeps per epoch, for runs that last a while."""
    bundle = copy_demo_bundle(dest)
    spec = bundle / "bundle.toml"
    text = spec.read_text()
    slow = f"--out outputs --sleep-per-epoch-seconds {sleep_per_epoch_seconds} "
    assert "--out outputs " in text
    spec.write_text(text.replace("--out outputs ", slow, 1))
    return bundle


@pytest.fixture(scope="module")
def served(prefect_api_server, tmp_path_factory) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """``register setup`` then ``register serve`` in a subprocess, until the module ends."""
    work = tmp_path_factory.mktemp("served")
    # The zombie automation below expects a heartbeat every 30 s; runs must send them
    # that often (Prefect's default is 180 s), or a long run is marked Crashed.
    # Each run may read faults meant for it alone from <fault dir>/runs/<flow_run_id>.
    env = prefect_api_server.client_env(
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY="30",
        PREFECT_RUNPOD_FAULT_DIR=str(work / "faults"),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_runpod.deployments.register",
            "setup",
            "--heartbeat-seconds",
            "30",
        ],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = open(work / "runner.log", "wb")  # noqa: SIM115 - closed at teardown
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect_runpod.deployments.register",
            "serve",
            "--no-setup",
            "--no-schedules",
            "--limit",
            "10",
            "--query-seconds",
            "1",
        ],
        env=env,
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield {
            "work": work,
            "runner": runner,
            "log": work / "runner.log",
            "faults": work / "faults",
            "home": Path(env["PREFECT_HOME"]),
        }
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGINT)
            try:
                runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait(timeout=10)
        log.close()


def _runner_log(served: dict[str, Any]) -> str:
    return served["log"].read_bytes()[-4000:].decode(errors="replace")


def _wait_deployment(name: str, served: dict[str, Any], timeout_seconds: float = 120.0) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while True:
            assert served["runner"].poll() is None, _runner_log(served)
            try:
                client.read_deployment_by_name(name)
                return
            except ObjectNotFound:
                pass
            assert time.monotonic() < deadline, f"{name} not served:\n{_runner_log(served)}"
            time.sleep(1.0)


def _wait_trigger(name: str, served: dict[str, Any], timeout_seconds: float = 120.0) -> None:
    """Until the deployment's trigger automation exists: ``serve`` creates a deployment
    first and its triggers' automations after it, so an event sent as soon as the
    deployment shows may find no automation yet and start nothing (a busy machine
    widens that gap)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        resource = f"prefect.deployment.{client.read_deployment_by_name(name).id}"
        while not client.read_resource_related_automations(resource):
            assert served["runner"].poll() is None, _runner_log(served)
            assert time.monotonic() < deadline, f"{name} has no trigger:\n{_runner_log(served)}"
            time.sleep(0.5)


def _wait_run(run_id: Any, served: dict[str, Any], timeout_seconds: float, want=FINAL):  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_seconds
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state is not None and run.state.type.value in want:
                return run
            assert time.monotonic() < deadline, (
                f"run {run_id} is {run.state.name if run.state else '-'} after "
                f"{timeout_seconds} s\n{_runner_log(served)}"
            )
            time.sleep(1.0)


@pytest.mark.slow
def test_setup_creates_the_cap_and_the_zombie_automation(prefect_api, served):
    from prefect.client.orchestration import get_client

    from prefect_runpod.deployments.serving import ZOMBIE_AUTOMATION

    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name("runpod-gpu").limit == 2
        (auto,) = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        assert auto.trigger.posture.value == "Proactive"
        assert auto.trigger.after == {"prefect.flow-run.heartbeat"}
        assert auto.trigger.within == timedelta(seconds=90)
        assert [a.type for a in auto.actions] == ["change-flow-run-state"]
        assert auto.actions[0].state.value == "CRASHED"
        assert client.read_work_pool("runpod-finetune").type == "process"


@pytest.mark.slow
def test_upstream_waits_for_the_finetune_and_reads_its_report(prefect_api, served, tmp_path):
    """``run_deployment(timeout=None)`` from another flow; the RunReport comes back
    through ``.state.result()``; history and artifacts are read back through the client."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from prefect_runpod.flows.upstream_example import train_and_wait

    _wait_deployment("runpod-finetune/on-demand", served)
    bundle = copy_demo_bundle(tmp_path / "bundle")
    prefix = f"up{uuid.uuid4().hex[:6]}"
    state = train_and_wait(
        bundle=str(bundle), parameters={"name_prefix": prefix}, return_state=True
    )
    out = state.result()
    report = out["report"]
    assert out["state"] == "Completed" and out["passed"] is True, report.get("error")
    assert report["terminated"] is True and report["pod_name"].startswith(f"{prefix}-")

    with get_client(sync_client=True) as client:
        child = client.read_flow_run(uuid.UUID(out["flow_run_id"]))
        assert child.parent_task_run_id is not None, "run_deployment links it as a subflow"
        parent = client.read_task_run(child.parent_task_run_id)
        assert parent.flow_run_id == state.state_details.flow_run_id
        arts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[child.id]))
        )
        assert "finetune-costs" in {a.key for a in arts}
        history = client.read_flow_run_states(child.id)
        assert [s.type.value for s in history][-2:] == ["RUNNING", "COMPLETED"]
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    assert LocalPodProvider().list(prefix) == []


@pytest.mark.slow
def test_cancel_through_the_api_terminates_the_pod(prefect_api, served, tmp_path):
    """Fire and forget (``timeout=0``), wait for the pod, cancel the run the way the
    UI's Cancel button does: the run ends Cancelled and its pod is gone."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.flows.upstream_example import train_and_go

    _wait_deployment("runpod-finetune/on-demand", served)
    bundle = _slow_bundle(tmp_path / "slow", sleep_per_epoch_seconds=20)
    prefix = f"cx{uuid.uuid4().hex[:6]}"
    run_id = uuid.UUID(train_and_go(bundle=str(bundle), parameters={"name_prefix": prefix}))
    provider = LocalPodProvider()
    name = f"{prefix}-{run_id}"
    deadline = time.monotonic() + 240
    while provider.find(name) is None:
        assert time.monotonic() < deadline, f"no pod {name}\n{_runner_log(served)}"
        time.sleep(0.5)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelling(), force=True)
    run = _wait_run(run_id, served, timeout_seconds=240)
    assert run.state.type.value == "CANCELLED", run.state
    assert provider.find(name) is None
    assert provider.list(prefix) == []


@pytest.mark.slow
def test_dataset_event_starts_a_finetune_on_that_bundle(prefect_api, served, tmp_path):
    """``dataset.updated`` → the trigger starts a run with the event's bundle mapped into
    ``bundle``; the run is then cancelled (to keep the test short) and leaves no pod."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.states import Cancelling

    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from prefect_runpod.flows.upstream_example import announce_dataset

    _wait_deployment("runpod-finetune/on-dataset-updated", served)
    _wait_trigger("runpod-finetune/on-dataset-updated", served)
    bundle = _slow_bundle(tmp_path / f"ds-{uuid.uuid4().hex[:6]}", sleep_per_epoch_seconds=20)
    announce_dataset(bundle=str(bundle), dataset="tickets")
    deadline = time.monotonic() + 240
    with get_client(sync_client=True) as client:
        while True:
            runs = [
                r
                for r in client.read_flow_runs(
                    deployment_filter=DeploymentFilter(
                        name=DeploymentFilterName(any_=["on-dataset-updated"])
                    )
                )
                if r.parameters.get("bundle") == str(bundle)
            ]
            if runs:
                break
            assert time.monotonic() < deadline, f"no triggered run\n{_runner_log(served)}"
            time.sleep(1.0)
        (run,) = runs
        assert run.parameters["concurrency_limit"] == "runpod-gpu"
    # Cancelled once Running: a cancel between the runner's claim (Pending) and the flow's
    # start is Prefect's to act on, and its runner drops it (the engine then refuses to
    # start a Cancelling run and the run stays Cancelling, with no pod ever rented).
    _wait_run(run.id, served, timeout_seconds=240, want={"RUNNING", *FINAL})
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)
    done = _wait_run(run.id, served, timeout_seconds=240)
    assert done.state.type.value == "CANCELLED", done.state
    assert LocalPodProvider().find(f"prft-{run.id}") is None


def _peak_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end before a start at a tie)."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = cur = 0
    for _, step in points:
        cur += step
        peak = max(peak, cur)
    return peak


def _gated_bundle(dest: Path, gate: Path) -> Path:
    """The demo bundle whose training starts only once ``gate`` exists (the local pod
    shares this machine's files), so pods stay up until the test lets them go on."""
    bundle = copy_demo_bundle(dest)
    spec = bundle / "bundle.toml"
    text = spec.read_text()
    wait = f"while [ ! -e {gate} ]; do sleep 0.2; done; "
    assert 'train = "{python}' in text
    spec.write_text(text.replace('train = "{python}', f'train = "{wait}{{python}}', 1))
    return bundle


def _at_the_slot(served: dict[str, Any], prefix: str) -> int:
    """How many runs named ``<prefix>-…`` said in the runner's log that they take a slot
    of the concurrency limit (the line each run logs just before it waits for one)."""
    text = served["log"].read_bytes().decode(errors="replace")
    said = f"run {prefix}-"
    return sum(1 for line in text.splitlines() if said in line and "takes a slot" in line)


def _slots_held(limit: str) -> int:
    """How many slots of the global concurrency limit ``limit`` are held now."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return int(client.read_global_concurrency_limit_by_name(limit).active_slots)


def _live_pods(prefix: str) -> list[Any]:
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider

    return LocalPodProvider().list(prefix)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # four served runs, two at a time: minutes on a loaded machine
def test_sweep_of_four_never_has_more_than_two_pods(prefect_api, served, tmp_path):
    """Four runs, all started at once, on a cap of two: pod lifetimes (create →
    terminate confirmed, from each RunReport) overlap two at a time, never three.

    Training waits at a gate until two pods are up and the other two runs wait for a
    slot, so the overlap is two by construction and not by how fast this machine starts
    the runs (on a loaded machine they arrived one after another: a peak of one). The
    cap is a limit of this test's own, so a slot an earlier test's run still holds (a
    lease Prefect frees only when it expires) cannot take one of its two places."""
    import contextvars
    import threading

    from prefect_runpod.deployments.serving import ensure_concurrency_limit
    from prefect_runpod.flows.sweep import sweep

    _wait_deployment("runpod-finetune/on-demand", served)
    gate = tmp_path / "gate"
    bundle = _gated_bundle(tmp_path / "bundle", gate)
    prefix = f"sw{uuid.uuid4().hex[:6]}"
    limit = f"sweep-{prefix}"
    ensure_concurrency_limit(limit, 2)
    result: dict[str, Any] = {}

    def _sweep() -> None:
        try:
            result["rows"] = sweep(
                configs=[{"bundle": str(bundle), "name_prefix": prefix}] * 4,
                concurrency_limit=limit,
                poll_interval_seconds=1.0,
                timeout_seconds=1000,
            )
        except Exception as exc:  # handed to the test's thread
            result["error"] = exc

    # Prefect's settings (the test server's URL) are context variables: the thread gets a copy
    worker = threading.Thread(target=contextvars.copy_context().run, args=(_sweep,), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 700
        while True:  # two pods up (held at the gate), all four runs at the slot
            waiting = _at_the_slot(served, prefix)
            if len(_live_pods(prefix)) >= 2 and waiting >= 4:
                break
            assert worker.is_alive(), result
            assert time.monotonic() < deadline, (
                f"{len(_live_pods(prefix))} pods, {waiting} runs at the slot, "
                f"{_slots_held(limit)} slots held\n{_runner_log(served)}"
            )
            time.sleep(0.5)
        assert len(_live_pods(prefix)) == 2
    finally:
        gate.write_text("go\n")
        worker.join(timeout=450)
    assert "error" not in result, result.get("error")
    rows = result["rows"]
    assert [r["state"] for r in rows] == ["Completed"] * 4, rows
    intervals = []
    for row in rows:
        report = row["report"]
        created = datetime.fromisoformat(report["pod"]["created_at"])
        intervals.append((created, created + timedelta(seconds=report["cost"]["billed_seconds"])))
    assert _peak_overlap(intervals) == 2, intervals


def test_peak_overlap_counts_open_intervals():
    t = datetime(2025, 1, 1)
    s = timedelta(seconds=1)
    assert _peak_overlap([(t, t + 2 * s), (t + s, t + 3 * s), (t + 2 * s, t + 4 * s)]) == 2
    assert _peak_overlap([(t, t + 5 * s), (t + s, t + 2 * s), (t + s, t + 3 * s)]) == 3
    assert _peak_overlap([]) == 0


@pytest.mark.slow
def test_hf_token_reaches_a_served_run_only_through_a_block(prefect_api, served, hf_hub, tmp_path):
    """The token lives in a saved ``HuggingFaceCredentials`` block; a served deployment
    run with ``run_deployment`` names the block. The job gets exactly the token (its
    train and eval check it), and the token is found nowhere else: not in the run's
    parameters read back through the API, its logs, artifacts, state or result, the
    server's database files, the runner's Prefect home (result storage), the run
    directory, the pod's files (shell history and the run dir included) or any process's
    command line while the pod lives. Passing the token as a parameter is refused by the
    server (409), through ``run_deployment`` and the client alike, and stores nothing."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectHTTPStatusError

    from prefect_runpod.blocks.faults import release_marker, run_fault_dir
    from prefect_runpod.blocks.huggingface import HuggingFaceCredentials
    from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
    from tests.fixtures.demo_bundle import token_checking_bundle
    from tests.fixtures.leaks import files_holding, proc_cmdlines

    _wait_deployment("runpod-finetune/on-demand", served)
    token = hf_hub.tokens["classic"].get_secret_value()
    secret = token.encode()
    HuggingFaceCredentials(token=token, endpoint=hf_hub.endpoint).save(
        "hf-sentinel", overwrite=True
    )
    bundle = token_checking_bundle(tmp_path / "bundle", token)
    out = tmp_path / "out"
    prefix = f"hf{uuid.uuid4().hex[:6]}"

    # 1. A raw token as a parameter never reaches the database.
    with pytest.raises(PrefectHTTPStatusError, match="409"):
        run_deployment("runpod-finetune/on-demand", parameters={"hf_token": token}, timeout=0)
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("runpod-finetune/on-demand")
        with pytest.raises(PrefectHTTPStatusError, match="409"):
            client.create_flow_run_from_deployment(dep.id, parameters={"hf_token": token})

    # 2. The block name is the parameter; the run pauses at download while its pod lives.
    run = run_deployment(
        "runpod-finetune/on-demand",
        parameters={
            "bundle": str(bundle),
            "model_id": "t/accepted",
            "hf_credentials_block": "hf-sentinel",
            "name_prefix": prefix,
            "output_dir": str(out),
        },
        timeout=0,
    )
    marks = run_fault_dir(served["faults"], str(run.id))
    marks.mkdir(parents=True, exist_ok=True)
    (marks / "faults").write_text("download:pause\n")
    deadline = time.monotonic() + 240
    while not (marks / "download.reached").exists():
        assert time.monotonic() < deadline, f"the run never reached download\n{_runner_log(served)}"
        time.sleep(0.5)
    pod = LocalPodProvider().find(f"{prefix}-{run.id}")
    assert pod is not None
    pod_dir = LocalPodProvider().home / "pods" / pod.pod_id
    assert secret not in proc_cmdlines().encode()
    assert files_holding(secret, pod_dir) == [], "the token is in a file on the pod"
    release_marker(marks, "download")
    done = _wait_run(run.id, served, timeout_seconds=240)
    assert done.state.type.value == "COMPLETED", (done.state.message, _runner_log(served))

    # 3. Nothing the run left holds the token.
    with get_client(sync_client=True) as client:
        report = client.read_flow_run(run.id).state.result()
        assert report["passed"] and [d["cause"] for d in report["hf"]] == ["ok", "ok"]
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        arts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
        runs = client.read_flow_runs()
        stored = {
            "params": [r.parameters for r in runs],
            "states": [r.state.message if r.state else "" for r in runs],
            "logs": [log.message for log in logs],
            "artifacts": [a.data for a in arts],
            "report": report,
        }
    assert any(
        "Hugging Face token: HuggingFaceCredentials block 'hf-sentinel'" in m
        for m in stored["logs"]
    )
    assert {r.parameters.get("hf_credentials_block") for r in runs} >= {"hf-sentinel"}
    assert "hf_token" not in {k for r in runs for k in r.parameters}
    assert token not in json.dumps(stored, default=str)
    database = sorted(prefect_api.home.glob("prefect.db*"))
    assert database, "the server's SQLite files"
    assert files_holding(secret, *database, served["home"], out, served["log"]) == []
    assert not pod_dir.exists(), "terminate removed the pod and its files"
    assert token not in hf_hub.hub.log_text()


@pytest.mark.slow
def test_secrets_of_the_wrong_shape_stop_a_served_run_and_are_stored_nowhere(
    prefect_api, served, tmp_path
):
    """Issue 21 through a served deployment: a saved ``RunPodCredentials`` key with a
    newline inside and a ``HuggingFaceCredentials`` token with a tab. The run fails its
    preflight naming the block and the problem; neither value (nor any piece of it) is
    in the server's database and WAL, the runner's Prefect home (result storage), the
    run's output directory or the runner's log."""
    from prefect.deployments import run_deployment

    from prefect_runpod.blocks.huggingface import HuggingFaceCredentials
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials
    from tests.fixtures.leaks import assert_found_nowhere, shaped_sentinels

    _wait_deployment("runpod-finetune/on-demand", served)
    key = shaped_sentinels("rpa_")["inner_newline"]
    token = shaped_sentinels("hf_")["tab"]
    RunPodCredentials(api_key=key).save("dep-shape-creds", overwrite=True)
    HuggingFaceCredentials(token=token).save("dep-shape-hf", overwrite=True)
    out = tmp_path / "out"
    run = run_deployment(
        "runpod-finetune/on-demand",
        parameters={
            "provider": "runpod",
            "runpod_credentials_block": "dep-shape-creds",
            "hf_credentials_block": "dep-shape-hf",
            "output_dir": str(out),
        },
        timeout=0,
    )
    done = _wait_run(run.id, served, timeout_seconds=240)
    assert done.state.type.value == "FAILED", (done.state, _runner_log(served))
    assert "the api_key of the RunPodCredentials block 'dep-shape-creds' has a newline" in (
        done.state.message or ""
    )
    report = json.loads((out / "run-report.json").read_text())
    assert report["pod_id"] is None
    db = prefect_api.home / "prefect.db"
    assert_found_nowhere(
        [key, token],
        roots=[db, db.with_name("prefect.db-wal"), served["home"], out, served["log"]],
        texts={"state message": done.state.message or ""},
    )


def test_deployments_take_the_publish_parameters():
    """``publish``, ``publish_public`` and ``download`` are flow parameters, in the schema
    every fine-tune deployment (and ``run_deployment``) validates against (issue 17)."""
    from prefect.utilities.callables import parameter_schema

    from prefect_runpod.flows.finetune import finetune

    props = parameter_schema(finetune.fn).model_dump()["properties"]
    assert {"publish", "publish_public", "download"} <= set(props)
    assert props["download"]["enum"] == ["all", "eval", "none"]
    assert props["download"]["default"] == "all"
    assert props["publish"]["default"] is None


def test_serve_refuses_to_replace_what_prefect_deploy_made(prefect_server, capsys):
    """``register serve`` after ``prefect deploy`` used to replace the pool's deployments
    with runner ones, and every worker run then crashed (``FileNotFoundError: '…/None'``):
    now it refuses, naming them and the ways out, before serving anything."""
    from prefect.client.orchestration import get_client

    from prefect_runpod.deployments import register, serving
    from prefect_runpod.flows.finetune import finetune

    serving.ensure_work_pool()
    deployed = finetune.to_deployment("on-demand", parameters={"provider": "local"})
    deployed.apply(work_pool_name=serving.WORK_POOL)  # what `prefect deploy` leaves
    assert register.main(["serve", "--no-setup", "--no-schedules"]) == 2
    err = capsys.readouterr().err
    assert "runpod-finetune/on-demand (work pool runpod-finetune) came from `prefect deploy`" in err
    assert "--replace" in err and "prefect deployment delete" in err
    with get_client(sync_client=True) as client:
        kept = client.read_deployment_by_name("runpod-finetune/on-demand")
    assert kept.work_pool_name == serving.WORK_POOL  # untouched


def test_setup_prints_lines_and_creates_the_provider_variable(prefect_server, capsys):
    from prefect.variables import Variable

    from prefect_runpod.deployments import register, serving

    assert register.main(["setup"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out  # no Python dict
    assert "variable           prefect_runpod_provider = local" in out
    assert "concurrency limit  runpod-gpu: 2 pods at once" in out
    Variable.set(serving.PROVIDER_VARIABLE, "runpod", overwrite=True)
    assert serving.ensure_provider_variable() == "runpod"  # an existing value is kept
    Variable.set(serving.PROVIDER_VARIABLE, "local", overwrite=True)


def test_setup_moves_the_old_pool_runpod_pool_to_runpod_finetune(prefect_server, capsys):
    """The process pool was called ``runpod-pool``, a name that invites
    ``--pool runpod-pool --type runpod``: setup moves its deployments and deletes it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    from prefect_runpod.deployments import register, serving
    from prefect_runpod.flows.reaper import reaper

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="runpod-pool", type="process"))
    old = reaper.to_deployment("migrated-from-old-pool")
    old.apply(work_pool_name="runpod-pool")  # what an older `prefect deploy --all` left
    assert register.main(["setup"]) == 0
    out = capsys.readouterr().out
    assert (
        "migrated           runpod-pool -> runpod-finetune: runpod-reaper/migrated-from-old-pool"
        in out
    )
    with get_client(sync_client=True) as client:
        moved = client.read_deployment_by_name("runpod-reaper/migrated-from-old-pool")
        assert moved.work_pool_name == "runpod-finetune"
        assert client.read_work_pool("runpod-finetune").type == "process"
        with pytest.raises(ObjectNotFound):
            client.read_work_pool("runpod-pool")
        client.delete_deployment(moved.id)
    assert serving.migrate_old_work_pool() == []  # idempotent


def test_prefect_yaml_takes_the_provider_from_the_variable_and_serve_from_options():
    from prefect_runpod.deployments.serving import build_deployments

    doc = yaml.safe_load(PREFECT_YAML.read_text())
    providers = {d["name"]: d["parameters"].get("provider") for d in doc["deployments"]}
    assert set(providers.values()) - {None} == {"{{ prefect.variables.prefect_runpod_provider }}"}
    served = build_deployments(
        provider_params={"provider": "runpod", "runpod_credentials_block": "creds"}
    )
    by_name = {f"{d.flow_name}/{d.name}": d for d in served}
    for name in ("runpod-finetune/on-demand", "runpod-reaper/every-10-min"):
        assert by_name[name].parameters["provider"] == "runpod"
        assert by_name[name].parameters["runpod_credentials_block"] == "creds"
