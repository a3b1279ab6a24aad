"""The termination fault matrix (docs/architecture.md#termination-layers, #testing): stage × fault → which layer ended the
pod, and how long it took; zero pods left in every cell.

Stages: provision, env, upload, train, download. Faults, each fired at the named
barrier at the start of the stage (``prefect_runpod.blocks.faults``), never by timing:

- ``raise``   — an exception in the stage (served run) → Failed, the flow's ``finally``;
- ``sigterm`` — SIGTERM to the flow process (served run) → Crashed, the ``finally``;
- ``sigkill`` — SIGKILL to a flow run as a plain script process (nothing runs after it
  and the run stays Running): the pod-side dead-man switch (``env``: heartbeat stale
  after 3 s), the run's guardian (``provision``: no dead-man armed yet) or the reaper
  flow (the other stages: run silent for 2 s) ends the pod;
- ``cancel``  — the run of the served deployment paused at the barrier is cancelled
  through the API → Cancelled; the runner's SIGTERM reaches the ``finally``;
- ``drop``    — paused at the barrier, the RunPod gateway is told to cut the stage's
  next SSH connection after a few KiB, then the run goes on: the stage reconnects and
  the run completes, or it fails saying so; either way the ``finally`` ends the pod.
- ``refuse``  — paused at the barrier, the RunPod gateway is told to refuse its next
  three connections (an outage counted in connections, not seconds, so a slow run
  meets all of it), then the run goes on: the stage waits it out (backoff, the provider
  asked before each retry) and the run completes; the ``finally`` ends the pod. These
  cells exist for ``env``, ``upload`` and ``download`` (#13).

One more cell runs SIGKILL under the served runner: the runner marks the run Crashed
and its ``on_crashed`` hook, in the runner's process, finds the pod by name and ends it.

Issue 14 adds the cells about the truth of a run: the pod terminated from outside
(``prefect-runpod terminate`` from "another shell" while the run waits at a stage: one
stage by default, every stage under the full matrix), the terminate API down for good,
the pod's ``runpodctl`` failing with x509 (the dead-man's REST v2 layer, with the pod's
own key, ends it), a SIGKILL during ``wait_ready`` (the run's guardian ends it: issue 23;
RunPod's ``terminateAfter`` never did), and two runs at once on emulated RunPod. Every
cell speaks REST v2: the emulator's GraphQL answers 410 Gone. Every cell asserts no pod left, the run's final Prefect
state, and the run's recorded cost (its ``finetune-costs`` record, completed by
``prefect-runpod cost --reconcile`` where no layer of the run could write it): its
billing window sits on the emulator's record of the pod's life, compared on the one
clock both read (no tolerance a busy machine could exceed), its USD is the price times
that window, and RunPod's bill in it equals the emulator's ledger.

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
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.costs import settle
from prefect_runpod.blocks.faults import (
    InjectedFault,
    fault_point,
    parse_faults,
    release_marker,
    run_fault_dir,
)
from prefect_runpod.flows.run.cost_record import CostRecord, latest_record
from tests.fixtures.fault_matrix import Cell, FaultLab, wait_until
from tests.fixtures.runpod_emulator import assert_billed_as_the_ledger

STAGES = ("provision", "env", "upload", "train", "download")
"""Every stage the matrix fires faults in."""
FAULTS = ("raise", "sigterm", "sigkill", "cancel", "drop", "refuse")
REFUSE_STAGES = ("env", "upload", "download")
REFUSED_CONNECTIONS = 3
FULL = os.environ.get("PREFECT_RUNPOD_FULL_MATRIX") == "1"

# Every stage, every fault and every layer; the full matrix behind the variable.
SUBSET = {
    ("provision", "raise"),
    ("provision", "sigkill"),  # the guardian: no dead-man is armed yet
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
    monkeypatch.setenv("PREFECT_RUNPOD_FAULT_PAUSE_SECONDS", "600")  # only a hang guard
    done = threading.Event()
    before = time.time()
    thread = threading.Thread(target=lambda: (fault_point("env"), done.set()), daemon=True)
    thread.start()
    wait_until("the pause marker", (tmp_path / "env.reached").exists, 120.0, 0.05)
    assert not done.is_set(), "the pause must hold until released"
    release_marker(tmp_path, "env")
    assert done.wait(120.0), "a released pause must return"
    stamp, action = (tmp_path / "env.fired").read_text().split()
    ms = [float(f"{t:.3f}") for t in (before, time.time())]  # the stamp's own rounding
    assert action == "pause" and ms[0] <= float(stamp) <= ms[1]  # fired in between


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


def _cost_matches_ledger(
    lab: FaultLab, run_id: uuid.UUID | str, pod_id: str, ended_by: datetime | None = None
) -> CostRecord:
    """The run's recorded billing window sits on the emulator's record of the pod's life
    (same clock, see ``assert_billed_as_the_ledger``; its end no later than ``ended_by``,
    default now), our USD is the price times that window, and RunPod's bill in the record
    equals the emulator's ledger (its billing rule, see runpod_billing)."""
    record = latest_record(str(run_id))
    assert record is not None, f"run {run_id} has no finetune-costs record"
    assert record.end is not None and record.end.confirmed, record.state_line()
    assert record.created_at is not None and record.end.ended_at is not None, record
    ledger = lab.emulator.ledger.usd(pod_id)
    assert ledger > 0
    assert_billed_as_the_ledger(
        lab.emulator,
        pod_id,
        record.created_at,
        record.end.ended_at,
        ended_by=ended_by or datetime.now(UTC),
    )
    bill = settle(record.cost_per_hr, record.created_at, record.end.ended_at)
    assert (record.billed_seconds, record.usd) == (bill.billed_seconds, bill.usd), record
    slack = lab.emulator.ledger.split_rounding_usd(pod_id, record.billing_note)
    assert record.runpod_usd == pytest.approx(ledger, abs=slack), record.billing_note
    return record


def _reconcile(run_id: uuid.UUID | str) -> CostRecord:
    """``prefect-runpod cost RUN_ID --reconcile``, as a person runs it after a crash."""
    from prefect_runpod.flows.cli import main

    main(["cost", str(run_id), "--reconcile", "--provider", "runpod"])
    record = latest_record(str(run_id))
    assert record is not None and record.recorded_by == "cost --reconcile"
    return record


def _hook_log(lab: FaultLab, run_id: uuid.UUID) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return "\n".join(log.message for log in logs if "terminated (pod" in log.message)


def _layer_of(lab: FaultLab, report: dict[str, Any], run_id: uuid.UUID) -> str:
    """Which layer ended the pod: the emulator says whether it was removed from inside
    (dead-man); otherwise the run's record says who (issue 14: whoever ends a pod records
    it), and for a hook its log line must say so too."""
    end = lab.emulator.ended[report["pod_id"]]
    if end.how == "removed-from-inside":
        return "3 dead-man"

    def confirmed() -> CostRecord | None:
        record = latest_record(str(run_id))
        return record if record and record.end and record.end.confirmed else None

    # Ended with the account's key: by the run, its hook, the reaper or the CLI, each of
    # which records the end once the provider confirmed it — after the pod is gone.
    record = (
        wait_until("the record of who ended the pod", confirmed, 120.0, 0.5)
        if end.how in ("podTerminate", "DELETE /v2/pods")
        else latest_record(str(run_id))
    )
    by = record.end.ended_by.value if record and record.end else "unknown"
    if by == "hook":
        wait_until("the hook's 'terminated' log line", lambda: _hook_log(lab, run_id), 120.0, 1.0)
        return "2 hook"
    return {"flow": "1 finally", "reaper": "4 reaper", "guardian": "5 guardian"}.get(by, by)


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
            lab.emulator.refuse_next_connections(REFUSED_CONNECTIONS)
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
        lab.emulator.refuse_next_connections(0)  # none left over for the next cell
        assert refused == REFUSED_CONNECTIONS, f"the gateway refused {refused} during {stage}"
        assert state == "COMPLETED", (state, message, lab.runner_tail())
        message = f"survived: the gateway refused {refused} connections in a row"
    if fault != "sigkill-served":
        assert layer == "1 finally", (layer, report.get("error"))
    _cost_matches_ledger(lab, run_id, report["pod_id"])
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
    # SIGKILL runs no finally and no hook: on a self-hosted server the run stays Running
    # (killed before its dead-man was armed, its guardian may have marked it Crashed).
    guarded = stage == "provision"
    assert run.state.type.value in ({"RUNNING", "CRASHED"} if guarded else {"RUNNING"}), run.state
    if guarded:  # after create, before the dead-man is armed: the run's guardian ends it
        _pods_gone(lab, prefix, 60.0)
        end = lab.emulator.ended[report["pod_id"]]
        assert end.how == "DELETE /v2/pods", end

        def recorded() -> CostRecord | None:
            record = latest_record(str(run_id))
            by = record.end.ended_by.value if record and record.end else None
            return record if by == "guardian" else None

        wait_until("the guardian's record of the end", recorded, 120.0, 0.5)
        ended_by = datetime.now(UTC)  # it confirmed the end before it recorded it
        layer, message = "5 guardian", "run Crashed; the guardian ended the pod, no reaper run"
    elif deadman:
        _pods_gone(lab, prefix, 150.0)
        end = lab.emulator.ended[report["pod_id"]]
        assert end.how == "removed-from-inside", end
        # No layer of the run could write the end: the record is completed afterwards.
        record = _reconcile(run_id)
        ended_by = datetime.now(UTC)
        assert record.end is not None and record.end.ended_by.value == "deadman"
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
        ended_by = datetime.now(UTC)  # the reaper confirmed the end before it returned
        assert [(r["pod_id"], r["reap"], r["terminated"]) for r in rows] == [
            (report["pod_id"], True, True)
        ], rows
        assert "silent" in rows[0]["reason"]
        _pods_gone(lab, prefix, 30.0)
        end = lab.emulator.ended[report["pod_id"]]
        assert end.how == "DELETE /v2/pods", end
        assert latest_record(str(run_id)).end.ended_by.value == "reaper"  # type: ignore[union-attr]
        reaped = lab.read_run(run_id).state  # no longer Running forever: Crashed, with why
        assert reaped.type.value == "CRASHED" and "the reaper ended its pod" in reaped.message
        layer, message = "4 reaper", f"run left Running, then Crashed; reaper: {rows[0]['reason']}"
    _cost_matches_ledger(lab, run_id, report["pod_id"], ended_by)
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


TRUTH_CELLS = ("outside", "api-down", "runpodctl-x509", "sigkill-wait_ready", "concurrent")
"""Issue 14's cells (see the module docstring)."""


def render_table(cells: list[Cell]) -> str:
    """Stage rows × fault columns, each ``<layer> <seconds> s``."""
    columns = [
        f for f in (*FAULTS, "sigkill-served", *TRUTH_CELLS) if any(c.fault == f for c in cells)
    ]
    grid = {(c.stage, c.fault): f"{c.layer} {c.seconds:5.1f}s" for c in cells}
    width = max([len(v) for v in grid.values()] + [len(c) for c in columns]) + 2
    lines = ["stage".ljust(11) + "".join(c.ljust(width) for c in columns)]
    extra = [c.stage for c in cells if c.stage not in STAGES]
    for stage in (*STAGES, *dict.fromkeys(extra)):
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


# --- issue 14: the truth about pods and money ------------------------------------------

OUTSIDE_STAGES = STAGES if FULL else ("train",)


def _pause_run(lab: FaultLab, params: dict[str, Any], point: str) -> tuple[uuid.UUID, Path]:
    """Submit a served run that pauses at ``point``; return it once it waits there."""
    run_id = lab.submit(params, f"{point}:pause")
    own = run_fault_dir(lab.fault_dir, str(run_id))

    def reached() -> bool:
        run = lab.read_run(run_id)
        assert not (run.state and run.state.is_final()), (
            f"run ended {run.state.name} before {point}: {run.state.message}\n{lab.runner_tail()}"
        )
        return (own / f"{point}.reached").exists()

    wait_until(f"run {run_id} to reach {point}", reached, 240.0, 0.3)
    return run_id, own


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("stage", OUTSIDE_STAGES)
def test_pod_terminated_from_outside(fault_lab: FaultLab, matrix_table, stage: str):
    """``prefect-runpod terminate POD`` from another shell while the run is at ``stage``:
    the run stops at once with one sentence, its record says the CLI ended the pod, and
    the pod is billed until then (train: the job is running when the pod goes)."""
    from prefect_runpod.flows.cli import main

    lab = fault_lab
    cell = _cell_dir(lab, stage, "outside")
    prefix = f"fm{uuid.uuid4().hex[:8]}"
    params = {"provider": "runpod", "name_prefix": prefix, "output_dir": str(cell / "out"),
              "pod_poll_seconds": 2.0}  # fmt: skip
    point = "train_running" if stage == "train" else stage
    run_id, own = _pause_run(lab, params, point)
    pod_id = lab.pods_named(prefix)[0]
    assert main(["terminate", "--provider", "runpod", pod_id]) == 0
    terminated = datetime.now(UTC)  # the CLI confirmed the end before it returned
    gone_at = lab.emulator.ended[pod_id].at
    release_marker(own, point)
    released = time.time()
    run = lab.wait_final(run_id, 300.0)
    state, message = run.state.type.value, run.state.message or ""
    assert state == "FAILED", (state, message)
    assert f"pod {pod_id} was terminated outside this run" in message
    assert "reconnect()" not in message and "may still" not in message
    report = _report(cell / "out")
    assert report["terminated"] and report["pod_end"]["ended_by"] == "cli"
    record = _cost_matches_ledger(lab, run_id, pod_id, terminated)
    assert record.end.ended_by.value == "cli"  # type: ignore[union-attr]
    stopped = run.state.timestamp.timestamp()
    result = Cell(
        stage, "outside", "cli", round(stopped - released, 1), state,
        f"pod gone at +0.0 s, run resumed at +{released - gone_at:.1f} s, stopped "
        f"{stopped - released:.1f} s later: {message[:80]}", len(lab.leftover_pods()),
    )  # fmt: skip
    matrix_table.append(result)
    assert result.pods_left == 0, lab.leftover_pods()


@pytest.mark.slow
@pytest.mark.matrix
def test_terminate_api_down_for_good(fault_lab: FaultLab, matrix_table):
    """RunPod refuses every call from the first podTerminate on: the run ends Failed,
    naming the pod, "may still be billing" and the command, which later ends it."""
    from prefect_runpod.flows.cli import main

    lab = fault_lab
    cell = _cell_dir(lab, "terminate", "api-down")
    prefix = f"fm{uuid.uuid4().hex[:8]}"
    params = {"provider": "runpod", "name_prefix": prefix, "output_dir": str(cell / "out"),
              "terminate_timeout_seconds": 5.0}  # fmt: skip
    run_id, own = _pause_run(lab, params, "download")
    pod_id = lab.pods_named(prefix)[0]
    lab.emulator.faults.terminate_fail_n = 10**6
    try:
        release_marker(own, "download")
        run = lab.wait_final(run_id, 300.0)
    finally:
        lab.emulator.faults.terminate_fail_n = 0
    state, message = run.state.type.value, run.state.message or ""
    command = f"prefect-runpod terminate --provider runpod {pod_id}"
    assert state == "FAILED", (state, message)
    assert f"pod {pod_id} may still be billing" in message and command in message
    assert lab.pods_named(prefix) == [pod_id]
    report = _report(cell / "out")
    assert not report["terminated"] and not report["passed"]
    assert latest_record(str(run_id)).may_still_bill  # type: ignore[union-attr]
    assert main(command.split()[1:]) == 0
    terminated = datetime.now(UTC)  # the CLI confirmed the end before it returned
    t0 = time.time()
    _pods_gone(lab, prefix, 30.0)
    _cost_matches_ledger(lab, run_id, pod_id, terminated)
    result = Cell("terminate", "api-down", "cli", round(time.time() - t0, 1), state,
                  message[:160], len(lab.leftover_pods()))  # fmt: skip
    matrix_table.append(result)
    assert result.pods_left == 0, lab.leftover_pods()


def _script_run(
    lab: FaultLab, cell: Path, prefix: str, faults: str, *extra: str
) -> tuple[Any, dict]:
    args = [
        "--provider",
        "runpod",
        "--name-prefix",
        prefix,
        "--output-dir",
        str(cell / "out"),
        *extra,
    ]
    proc = lab.start_script(args, faults, cell / "faults")
    wait_until(f"the {faults} script run to die", lambda: proc.poll() is not None, 240.0, 0.3)
    log = (cell / "script.log").read_text(errors="replace")[-3000:]
    assert proc.returncode == -9, f"exit {proc.returncode}\n{log}"
    return proc, _report(cell / "out")


@pytest.mark.slow
@pytest.mark.matrix
def test_the_watchdogs_runpodctl_fails(fault_lab: FaultLab, matrix_table):
    """A pod image whose runpodctl fails with x509 (runpodctl#149); the run's process is
    SIGKILLed while training: the dead-man's GraphQL layer, with the pod's own key and the
    CA bundle found on the pod, ends it; ``cost --reconcile`` completes the record that
    used to keep ``usd 0.0, terminated False`` forever."""
    lab = fault_lab
    cell = _cell_dir(lab, "train", "runpodctl-x509")
    prefix = f"fm{uuid.uuid4().hex[:8]}"
    lab.emulator.faults.pod_faults = "runpodctl:x509"
    try:
        _, report = _script_run(lab, cell, prefix, "train:sigkill",
                                "--heartbeat-stale-seconds", str(DEADMAN_STALE_SECONDS))  # fmt: skip
    finally:
        lab.emulator.faults.pod_faults = ""
    t0 = _fired_at(cell / "faults", "train")
    _pods_gone(lab, prefix, 150.0)
    end = lab.emulator.ended[report["pod_id"]]
    assert end.how == "DELETE /v2/pods (pod key)", end  # the API layer, from inside the pod
    run_id = uuid.UUID(report["flow_run_id"])
    assert lab.read_run(run_id).state.type.value == "RUNNING"  # SIGKILL: no one else acted
    # As it was left: no end, and only the cost counted when the pod went on record (to
    # that moment: 0.0 or a few ms' worth, whatever the machine's speed).
    assert not (report["pod_end"] or {}).get("confirmed") and not report["terminated"]
    left_usd = report["cost"]["usd"]
    record = _reconcile(run_id)
    assert record.end.ended_by.value == "deadman" and record.end.inferred  # type: ignore[union-attr]
    _cost_matches_ledger(lab, run_id, report["pod_id"])
    healed = _report(cell / "out")
    assert healed["terminated"] and healed["cost"]["usd"] == record.usd > left_usd
    assert healed["pod_end"]["ended_by"] == "deadman"
    result = Cell("train", "runpodctl-x509", "3 dead-man (API)", round(end.at - t0, 1),
                  "RUNNING", "runpodctl x509 both verbs; DELETE /v2/pods with the pod key",
                  len(lab.leftover_pods()))  # fmt: skip
    matrix_table.append(result)
    assert result.pods_left == 0, lab.leftover_pods()


@pytest.mark.slow
@pytest.mark.matrix
def test_sigkill_during_wait_ready(fault_lab: FaultLab, matrix_table):
    """The CLI dies after create, before its dead-man could be armed (issue 23: RunPod's
    ``terminateAfter``, which the run used to count on here, never fired). The run's
    guardian ends the pod within 60 s with no reaper run, records the end as its own in
    the run's cost record (no reconcile needed) and marks the run Crashed."""
    lab = fault_lab
    cell = _cell_dir(lab, "provision", "sigkill-wait_ready")
    prefix = f"fm{uuid.uuid4().hex[:8]}"
    _, report = _script_run(lab, cell, prefix, "wait_ready:sigkill")
    t0 = _fired_at(cell / "faults", "wait_ready")
    _pods_gone(lab, prefix, 60.0)  # the bound: pod gone within 60 s of the SIGKILL
    end = lab.emulator.ended[report["pod_id"]]
    assert end.how == "DELETE /v2/pods", end
    run_id = uuid.UUID(report["flow_run_id"])

    def recorded() -> CostRecord | None:
        record = latest_record(str(run_id))
        return record if record and record.end and record.end.ended_by.value == "guardian" else None

    record = wait_until("the guardian's record of the end", recorded, 120.0, 0.5)
    ended_by = datetime.now(UTC)  # the guardian confirmed the end before it recorded it
    assert record.recorded_by == "guardian" and record.end.confirmed
    crashed = wait_until("the run marked Crashed", lambda: (
        (s := lab.read_run(run_id).state) and s.type.value == "CRASHED" and s), 120.0, 0.5)  # fmt: skip
    assert "the guardian ended the run" in crashed.message
    _cost_matches_ledger(lab, run_id, report["pod_id"], ended_by)
    result = Cell("provision", "sigkill-wait_ready", "5 guardian", round(end.at - t0, 1),
                  "CRASHED", "the guardian ended the pod, recorded it, marked the run Crashed",
                  len(lab.leftover_pods()))  # fmt: skip
    matrix_table.append(result)
    assert result.pods_left == 0, lab.leftover_pods()


@pytest.mark.slow
@pytest.mark.matrix
def test_two_runs_at_once_on_emulated_runpod(fault_lab: FaultLab, matrix_table):
    """The gateway routes each login to the pod its user names: two runs, two pods,
    both complete, each billed as the ledger says."""
    lab = fault_lab
    cells = [_cell_dir(lab, "all", f"concurrent-{n}") for n in range(2)]
    prefixes = [f"fm{uuid.uuid4().hex[:8]}" for _ in cells]
    t0 = time.time()
    runs = [
        lab.submit({"provider": "runpod", "name_prefix": p, "output_dir": str(c / "out")}, "")
        for p, c in zip(prefixes, cells, strict=True)
    ]
    finals = [lab.wait_final(r, 400.0) for r in runs]
    assert [f.state.type.value for f in finals] == ["COMPLETED", "COMPLETED"], [
        f.state.message for f in finals
    ]
    pods = [_report(c / "out")["pod_id"] for c in cells]
    assert len(set(pods)) == 2
    for prefix in prefixes:
        _pods_gone(lab, prefix, 60.0)
    for run_id, pod_id in zip(runs, pods, strict=True):
        _cost_matches_ledger(lab, run_id, pod_id)
    assert {link.pod_id for link in lab.emulator.links} >= set(pods)
    result = Cell("all", "concurrent", "1 finally", round(time.time() - t0, 1), "COMPLETED",
                  "two runs, two pods, each reached by its own podHostId", len(lab.leftover_pods()))  # fmt: skip
    matrix_table.append(result)
    assert result.pods_left == 0, lab.leftover_pods()
