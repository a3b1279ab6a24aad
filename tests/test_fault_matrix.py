"""The termination fault matrix (docs/architecture.md#termination-layers, #testing): stage × fault → which layer ended the
pod, and how long it took; zero pods left in every cell.

Stages: provision, env, upload, train, download. Faults, each fired at the named
barrier at the start of the stage (``prefect_runpod.blocks.faults``), never by timing:

- ``raise``   — an exception in the stage (served run) → Failed, the flow's ``finally``;
- ``sigterm`` — SIGTERM to the flow process (served run) → Crashed, the ``finally``;
- ``sigkill`` — SIGKILL to a flow run as a plain script process (nothing runs after it
  and the run stays Running): the pod-side dead-man switch (``env``: heartbeat stale
  after 3 s) or the reaper flow (the other stages: run silent for 2 s) ends the pod;
- ``cancel``  — the run of the served deployment paused at the barrier is cancelled
  through the API → Cancelled; the runner's SIGTERM reaches the ``finally``;
- ``drop``    — paused at the barrier, the RunPod gateway is told to cut the stage's
  next SSH connection after a few KiB, then the run goes on: the stage reconnects and
  the run completes, or it fails saying so; either way the ``finally`` ends the pod.
- ``refuse``  — paused at the barrier, the RunPod gateway refuses every connection for
  10 s, then the run goes on: the stage waits it out (backoff, the provider asked
  before each retry) and the run completes; the ``finally`` ends the pod. These cells
  exist for ``env``, ``upload`` and ``download`` (#13).

One more cell runs SIGKILL under the served runner: the runner marks the run Crashed
and its ``on_crashed`` hook, in the runner's process, finds the pod by name and ends it.

All cells share one Prefect server, one served runner and one RunPod emulator (pods
backed by real local pods, reached through the emulator's gateway), one cell at a time.
The default run is a representative subset covering every stage, every fault and every
layer; ``PREFECT_RUNPOD_FULL_MATRIX=1`` runs all 25 cells (plus the runner cell). The
table (stage × fault → layer, seconds from the fault to the pod confirmed gone) is
printed at the end (``-s`` shows it) and written as JSON to ``fault-matrix.json`` in
the pytest tmp dir. The clock starts when the fault fires (for ``cancel``, at the
cancel request; for ``drop``, when the paused run is released, so a run that survives
the drop counts until its normal end); for the reaper it includes the test's own wait
before running the reaper, which in production is the reaper's schedule (10 min).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.faults import (
    InjectedFault,
    fault_point,
    parse_faults,
    release_marker,
    run_fault_dir,
)
from tests.fixtures.fault_matrix import FaultLab, wait_until

STAGES = ("provision", "env", "upload", "train", "download")
FAULTS = ("raise", "sigterm", "sigkill", "cancel", "drop", "refuse")
REFUSE_STAGES = ("env", "upload", "download")
REFUSE_SECONDS = 10.0
FULL = os.environ.get("PREFECT_RUNPOD_FULL_MATRIX") == "1"

# Every stage, every fault and every layer; the full matrix behind the variable.
SUBSET = {
    ("provision", "raise"),
    ("provision", "sigkill"),  # reaper: no dead-man is armed yet
    ("env", "sigkill"),  # dead-man switch
    ("env", "drop"),
    ("upload", "sigterm"),
    ("upload", "drop"),
    ("train", "cancel"),
    ("train", "raise"),
    ("download", "sigkill"),  # reaper
    ("download", "cancel"),
    *((stage, "refuse") for stage in REFUSE_STAGES),  # always: the gateway outage cells
}
CELLS = [
    (s, f)
    for s in STAGES
    for f in FAULTS
    if (FULL and (f != "refuse" or s in REFUSE_STAGES)) or (s, f) in SUBSET
]

DEADMAN_STALE_SECONDS = 3.0
REAPER_STALE_SECONDS = 2.0
DROP_AFTER_BYTES = 8192
"""The gateway cuts the stage's next connection after this much traffic: past the SSH
handshake and login, inside the stage's first commands."""


@dataclass
class Cell:
    """One cell's outcome, as printed and written to JSON."""

    stage: str
    fault: str
    layer: str
    seconds: float
    state: str
    message: str
    pods_left: int


_RESULTS: list[Cell] = []


# --- the fault points themselves (fast, no Prefect) ------------------------------------


def test_parse_faults_picks_the_point_in_order():
    spec = "train:pause, env:raise,train:sigterm,bad, upload:"
    assert parse_faults(spec, "train") == ["pause", "sigterm"]
    assert parse_faults(spec, "env") == ["raise"]
    assert parse_faults(spec, "upload") == []


def test_pause_waits_for_its_release_and_records_the_fire(tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("PREFECT_RUNPOD_FAULTS", "env:pause")
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_DIR", str(tmp_path))
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_PAUSE_SECONDS", "60")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (fault_point("env"), done.set()), daemon=True)
    thread.start()
    wait_until("the pause marker", (tmp_path / "env.reached").exists, 10.0, 0.05)
    assert not done.is_set(), "the pause must hold until released"
    release_marker(tmp_path, "env")
    assert done.wait(10.0), "a released pause must return"
    stamp, action = (tmp_path / "env.fired").read_text().split()
    assert action == "pause" and abs(float(stamp) - time.time()) < 60


def test_outside_a_flow_run_only_the_environment_applies(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_RUNPOD_FAULTS", raising=False)
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_DIR", str(tmp_path))
    fault_point("upload")  # no run, no faults file: nothing fires
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv("PREFECT_RUNPOD_FAULTS", "upload:raise")
    with pytest.raises(InjectedFault, match="fault injected at upload"):
        fault_point("upload")
    assert (tmp_path / "upload.fired").read_text().split()[1] == "raise"


@pytest.mark.slow
def test_a_runs_own_faults_file_inside_a_flow_run(prefect_server, tmp_path, monkeypatch):
    from prefect import flow

    monkeypatch.delenv("PREFECT_RUNPOD_FAULTS", raising=False)
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_DIR", str(tmp_path))

    @flow
    def probe(mine: bool) -> str:
        from prefect.runtime import flow_run

        if mine:
            own = run_fault_dir(tmp_path, flow_run.get_id())
            own.mkdir(parents=True)
            (own / "faults").write_text("upload:raise\n")
        try:
            fault_point("upload")
        except InjectedFault as exc:
            return str(exc)
        return "no fault"

    assert probe(True) == "fault injected at upload"
    assert probe(False) == "no fault"
    (fired,) = tmp_path.glob("runs/*/upload.fired")
    assert fired.read_text().split()[1] == "raise"


# --- the matrix ------------------------------------------------------------------------


def _cell_dir(lab: FaultLab, stage: str, fault: str) -> Path:
    path = lab.work / f"{stage}-{fault}-{uuid.uuid4().hex[:6]}"
    path.mkdir()
    return path


def _report(out: Path) -> dict[str, Any]:
    path = out / "run-report.json"
    assert path.is_file(), f"no run report in {out}: the pod was never recorded"
    return json.loads(path.read_text())


def _fired_at(marker_dir: Path, stage: str) -> float:
    return float((marker_dir / f"{stage}.fired").read_text().split()[0])


def _pods_gone(lab: FaultLab, prefix: str, timeout_seconds: float) -> None:
    wait_until(
        f"the pods named {prefix}-* to be gone from the emulator",
        lambda: not lab.pods_named(prefix),
        timeout_seconds,
        0.5,
    )


def _hook_log(lab: FaultLab, run_id: uuid.UUID) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return "\n".join(log.message for log in logs if "terminated (pod" in log.message)


def _layer_of(lab: FaultLab, report: dict[str, Any], run_id: uuid.UUID) -> str:
    """Which layer ended the pod: the emulator says whether it was removed from inside
    (dead-man) or through the API; the report says whether the flow's ``finally``
    confirmed it; else the hook's log line must say it did."""
    end = lab.emulator.ended[report["pod_id"]]
    if end.how == "removed-from-inside":
        return "3 dead-man"
    if report.get("terminated"):
        return "1 finally"
    wait_until("the hook's 'terminated' log line", lambda: _hook_log(lab, run_id), 30.0, 1.0)
    return "2 hook"


def _served_cell(lab: FaultLab, stage: str, fault: str, cell: Path) -> Cell:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    prefix = f"fm{uuid.uuid4().hex[:8]}"
    out = cell / "out"
    params = {"provider": "runpod", "name_prefix": prefix, "output_dir": str(out)}
    action = {
        "cancel": "pause",
        "drop": "pause",
        "refuse": "pause",
        "sigkill-served": "sigkill",
    }.get(fault, fault)
    links_before = len(lab.emulator.links)
    refused_before = lab.emulator.refused_connections
    run_id = lab.submit(params, f"{stage}:{action}")
    own = run_fault_dir(lab.fault_dir, str(run_id))
    if action == "pause":

        def reached() -> bool:
            run = lab.read_run(run_id)
            assert not (run.state and run.state.is_final()), (
                f"run ended {run.state.name} before reaching {stage}: {run.state.message}\n"
                f"{lab.runner_tail()}"
            )
            return (own / f"{stage}.reached").exists()

        wait_until(f"run {run_id} to reach {stage}", reached, 240.0, 0.3)
        t0 = time.time()
        if fault == "cancel":
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(run_id, Cancelling(), force=True)
        elif fault == "refuse":
            lab.emulator.refuse_connections_for(REFUSE_SECONDS)
            release_marker(own, stage)
        else:
            lab.emulator.faults.drop_next_connection_after_bytes = DROP_AFTER_BYTES
            release_marker(own, stage)
    run = lab.wait_final(run_id, 300.0)
    if action != "pause":
        t0 = _fired_at(own, stage)
    _pods_gone(lab, prefix, 90.0)
    report = _report(out)
    layer = _layer_of(lab, report, run_id)
    state, message = run.state.type.value, run.state.message or ""

    if fault == "raise":
        assert state == "FAILED", (state, message)
        assert f"fault injected at {stage}" in message
    elif fault == "sigterm":
        assert state == "CRASHED", (state, message)
        assert "SIGTERM" in message or "signal" in message.lower(), message
    elif fault == "cancel":
        assert state == "CANCELLED", (state, message)
        assert "cancel" in message.lower(), message
    elif fault == "sigkill-served":
        assert state == "CRASHED", (state, message)
        assert "-9" in message or "SIGKILL" in message, message
        assert layer == "2 hook", layer
    elif fault == "drop":
        dropped = [link for link in lab.emulator.links[links_before:] if link.dropped]
        assert dropped, f"the gateway never cut a link during {stage}"
        if state == "COMPLETED":
            message = f"survived: {len(dropped)} link cut by the gateway, the stage reconnected"
        else:
            assert state == "FAILED", (state, message)
            assert any(w in message.lower() for w in ("connect", "drop", "ssh", "channel")), message
    elif fault == "refuse":
        refused = lab.emulator.refused_connections - refused_before
        assert refused >= 1, f"the gateway refused nothing during {stage}"
        assert state == "COMPLETED", (state, message, lab.runner_tail())
        message = f"survived: the gateway refused {refused} connections for {REFUSE_SECONDS:g} s"
    if fault != "sigkill-served":
        assert layer == "1 finally", (layer, report.get("error"))
    end = lab.emulator.ended[report["pod_id"]]
    return Cell(stage, fault, layer, round(end.at - t0, 1), state, message[:160], 0)


def _script_cell(lab: FaultLab, stage: str, cell: Path) -> Cell:
    from prefect_runpod.flows.reaper import reaper

    prefix = f"fm{uuid.uuid4().hex[:8]}"
    out = cell / "out"
    markers = cell / "faults"
    deadman = stage == "env"
    args = ["--provider", "runpod", "--name-prefix", prefix, "--output-dir", str(out)]
    if deadman:
        args += ["--heartbeat-stale-seconds", str(DEADMAN_STALE_SECONDS)]
    proc = lab.start_script(args, f"{stage}:sigkill", markers)
    wait_until(
        f"the {stage}:sigkill script run to die", lambda: proc.poll() is not None, 240.0, 0.3
    )
    log = (cell / "script.log").read_text(errors="replace")[-3000:]
    assert proc.returncode == -9, f"exit {proc.returncode}\n{log}"
    t0 = _fired_at(markers, stage)
    report = _report(out)
    run_id = uuid.UUID(report["flow_run_id"])
    run = lab.read_run(run_id)
    # SIGKILL runs no finally and no hook: on a self-hosted server the run stays Running.
    assert run.state.type.value == "RUNNING", run.state
    if deadman:
        _pods_gone(lab, prefix, 150.0)
        end = lab.emulator.ended[report["pod_id"]]
        assert end.how == "removed-from-inside", end
        layer, message = "3 dead-man", "run left Running; the pod removed itself"
    else:
        assert lab.pods_named(prefix) == [report["pod_id"]], "no other layer may act first"
        silent_since = run.state.timestamp.timestamp()
        wait_until(
            "the run to be silent for longer than the reaper's threshold",
            lambda: time.time() - silent_since > REAPER_STALE_SECONDS + 0.5,
            30.0,
        )
        rows = reaper(
            provider="runpod",
            name_prefix=prefix,
            stale_running_seconds=REAPER_STALE_SECONDS,
            grace_seconds=0.0,
        )
        assert [(r["pod_id"], r["reap"], r["terminated"]) for r in rows] == [
            (report["pod_id"], True, True)
        ], rows
        assert "silent" in rows[0]["reason"]
        _pods_gone(lab, prefix, 30.0)
        end = lab.emulator.ended[report["pod_id"]]
        assert end.how == "podTerminate", end
        layer, message = "4 reaper", f"run left Running; reaper: {rows[0]['reason']}"
    return Cell(stage, "sigkill", layer, round(end.at - t0, 1), "RUNNING", message[:160], 0)


@pytest.fixture(scope="module")
def matrix_table(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Collects the cells; prints the table and writes ``fault-matrix.json`` at the end."""
    _RESULTS.clear()
    yield _RESULTS
    if not _RESULTS:
        return
    path = tmp_path_factory.mktemp("fault-matrix-report") / "fault-matrix.json"
    path.write_text(json.dumps([asdict(c) for c in _RESULTS], indent=2))
    print("\n" + render_table(_RESULTS) + f"\n(JSON: {path})")


def render_table(cells: list[Cell]) -> str:
    """Stage rows × fault columns, each ``<layer> <seconds> s``."""
    columns = [f for f in (*FAULTS, "sigkill-served") if any(c.fault == f for c in cells)]
    grid = {(c.stage, c.fault): f"{c.layer} {c.seconds:5.1f}s" for c in cells}
    width = max([len(v) for v in grid.values()] + [len(c) for c in columns]) + 2
    lines = ["stage".ljust(11) + "".join(c.ljust(width) for c in columns)]
    for stage in STAGES:
        lines.append(
            stage.ljust(11) + "".join(grid.get((stage, f), "-").ljust(width) for f in columns)
        )
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize(("stage", "fault"), CELLS, ids=[f"{s}-{f}" for s, f in CELLS])
def test_fault_matrix_cell(fault_lab: FaultLab, matrix_table, stage: str, fault: str):
    """One cell: fire ``fault`` at ``stage``, let the layers act, zero pods left."""
    cell = _cell_dir(fault_lab, stage, fault)
    if fault == "sigkill":
        result = _script_cell(fault_lab, stage, cell)
    else:
        result = _served_cell(fault_lab, stage, fault, cell)
    result.pods_left = len(fault_lab.leftover_pods())
    matrix_table.append(result)
    assert result.pods_left == 0, fault_lab.leftover_pods()


@pytest.mark.slow
@pytest.mark.matrix
def test_sigkill_under_the_runner_is_ended_by_the_crash_hook(fault_lab: FaultLab, matrix_table):
    """The served runner sees its flow process die by SIGKILL, marks the run Crashed and
    runs ``on_crashed`` in its own process: the hook finds the pod by name alone."""
    result = _served_cell(fault_lab, "train", "sigkill-served", _cell_dir(fault_lab, "train", "ks"))
    result.pods_left = len(fault_lab.leftover_pods())
    matrix_table.append(result)
    assert result.pods_left == 0, fault_lab.leftover_pods()
