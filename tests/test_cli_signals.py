"""SIGTERM or Ctrl-C to ``prefect-runpod finetune --ephemeral`` (issue 14): the run ends
its pod, the CLI prints the summary without a traceback, and the temporary Prefect server
it started is gone too — it used to be left running, orphaned (reparented to init). (The
server prefect-runpod keeps by default stays by design: tests/flows/cli/test_local_server.py.)

A Ctrl-C reaches the run at three points end to end (issue 24): during the upload and the
download (paused at the transfer's first confirmed bytes) and while the job trains; each
ends with 130, one sentence naming the stage, the bytes that moved and the pod ended. The
download's runs against the session's server (the temporary server's end is the other
cells') and records the fault matrix's figures (``tests/fixtures/run_cells.py``); the
flow run ends Cancelled, its message naming the Ctrl-C and the pod's end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from tests.fixtures.fault_matrix import Cell, wait_until
from tests.fixtures.run_cells import cell_of, reaped, start_cli

pytestmark = pytest.mark.slow


def _pids_with(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle.encode() in fh.read().replace(b"\0", b" "):
                    found.append(int(entry))
        except OSError:
            continue
    return found


# The waits below are hang guards (300 + 240 + 120 s); the suite's 300 s would cut them first.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("how", "expected_rc", "said", "point"),
    [
        ("sigterm-to-the-cli", 143, "SIGTERM", "train_running"),
        ("ctrl-c-to-the-group", 130, "Ctrl-C", "train_running"),
        ("ctrl-c-during-upload", 130, "Ctrl-C", "upload_moving"),
    ],
)
def test_a_signal_ends_the_run_the_server_and_prints_the_summary(
    tmp_path: Path, how: str, expected_rc: int, said: str, point: str
) -> None:
    faults, out = tmp_path / "faults", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_RUNPOD_FAULTS=f"{point}:pause",
        PREFECT_RUNPOD_FAULT_DIR=str(faults),
    )
    log = tmp_path / "cli.log"
    with open(log, "wb") as sink:
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect_runpod.flows.cli",
                "finetune",
                "--ephemeral",
                "--output-dir",
                str(out),
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    try:
        wait_until(
            f"the run to reach {point}",
            lambda: (faults / f"{point}.reached").exists() or cli.poll() is not None,
            300.0,
        )
        assert cli.poll() is None, log.read_text(errors="replace")[-3000:]
        port = re.search(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", log.read_text())
        assert port, log.read_text(errors="replace")[-3000:]
        servers = _pids_with(f"--port {port.group(1)}")
        assert servers, "the temporary server is not running"
        if how.startswith("sigterm"):
            os.kill(cli.pid, signal.SIGTERM)
        else:
            os.killpg(cli.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        cli.wait(timeout=240)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait()
    text = log.read_text(errors="replace")
    assert cli.returncode == expected_rc, text[-3000:]
    assert f"the run was stopped by {said}" in text
    assert "result       FAILED" in text and "terminated   yes" in text
    assert "Traceback" not in text
    stage = point.split("_")[0]  # issue 24: one true sentence, and the bytes that moved
    assert f"error        stopped by {said} during {stage} (" in text, text[-3000:]
    assert "KeyboardInterrupt" not in text
    if stage == "upload":
        _bytes_moved(text)
    deadline = time.monotonic() + 120  # a process may take a moment to be reaped
    while any(os.path.exists(f"/proc/{pid}") for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in servers if os.path.exists(f"/proc/{pid}")], "server orphaned"
    pod_id = json.loads((out / "run-report.json").read_text())["pod_id"]
    assert pod_id and LocalPodProvider().get(pod_id) is None


def _bytes_moved(text: str) -> None:
    """The summary's bytes moved is what moved, not 0 B."""
    moved = re.search(r"bytes moved  (\S+ \S+) between", text)
    assert moved and moved.group(1) != "0 B", text[-3000:]


@pytest.mark.timeout(900)
def test_ctrl_c_during_the_download_ends_the_run_in_one_sentence(
    prefect_server: None, tmp_path: Path, cli_cells: list[Cell]
) -> None:
    from prefect.settings import get_current_settings

    api_url = str(get_current_settings().api.url)
    with reaped(start_cli(tmp_path, "download_moving:pause", PREFECT_API_URL=api_url)) as run:
        run.wait_reached("download_moving")
        stopped_at = time.time()
        os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        rc = run.wait(240.0)
    text = run.text()
    assert rc == 130, text[-3000:]
    assert "the run was stopped by Ctrl-C" in text
    errors = re.findall(r"^error        (.*)$", text, flags=re.MULTILINE)
    assert len(errors) == 1 and errors[0].startswith("stopped by Ctrl-C during download ("), text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    _bytes_moved(text)
    assert "result       FAILED" in text and "terminated   yes" in text
    assert "manifest     verified" not in text  # stopped midway: nothing taken in as verified
    data = run.report()
    assert data is not None and LocalPodProvider().get(data["pod_id"]) is None
    cell = cell_of("download", "ctrl-c", run, stopped_at, errors[0])
    cli_cells.append(cell)
    # The user stopped it: Cancelled in Prefect, as a cancelled run is, not Crashed.
    assert cell.pods_left == 0 and cell.state == "CANCELLED", cell
    message = _state_message(data["flow_run_id"])
    assert "stopped by Ctrl-C during download" in message, message
    assert f"pod {data['pod_id']} was ended" in message, message


def _state_message(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return (state.message or "") if state is not None else ""


def _running_flow_run_of(out: Path) -> str:
    """The id of the Running ``runpod-finetune`` flow run whose output dir is ``out``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    running = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))
    )
    with get_client(sync_client=True) as client:
        runs = [
            r
            for r in client.read_flow_runs(flow_run_filter=running)
            if Path(str(r.parameters.get("output_dir"))).resolve() == out.resolve()
        ]
    assert len(runs) == 1, runs
    return str(runs[0].id)


@pytest.mark.timeout(900)
def test_a_cancel_in_prefect_ends_a_cli_run_its_pod_and_its_flow_run_cancelled(
    prefect_server: None, tmp_path: Path, cli_cells: list[Cell]
) -> None:
    """No runner follows a run started from the CLI: a Cancel in Prefect's UI (the flow run
    set Cancelling) used to leave it training while its pod billed. The run reads its own
    state: it stops at its next boundary, ends its pod, and its flow run ends Cancelled
    with one sentence naming the stage and the pod's end; the CLI exits 1."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings
    from prefect.states import Cancelling

    api_url = str(get_current_settings().api.url)
    with reaped(start_cli(tmp_path, "train_running:pause", PREFECT_API_URL=api_url)) as run:
        run.wait_reached("train_running")
        flow_run_id = _running_flow_run_of(run.out)
        with get_client(sync_client=True) as client:  # what the UI's Cancel does
            client.set_flow_run_state(flow_run_id, Cancelling(), force=True)  # type: ignore[arg-type]
        stopped_at = time.time()
        rc = run.wait(240.0)
    text = run.text()
    assert rc == 1, text[-3000:]
    errors = re.findall(r"^error        (.*)$", text, flags=re.MULTILINE)
    assert len(errors) == 1, text[-3000:]
    assert errors[0].startswith("stopped by a cancel in Prefect during train ("), errors
    assert "Traceback" not in text and "CancelRequested" not in text
    assert "result       FAILED" in text and "terminated   yes" in text
    data = run.report()
    assert data is not None and data["flow_run_id"] == flow_run_id
    assert LocalPodProvider().get(data["pod_id"]) is None
    cell = cell_of("train", "cancel in Prefect", run, stopped_at, errors[0])
    cli_cells.append(cell)
    assert cell.pods_left == 0 and cell.state == "CANCELLED", cell
    message = _state_message(flow_run_id)
    assert message.startswith("stopped by a cancel in Prefect during train ("), message
    assert message.endswith(f"; pod {data['pod_id']} was ended"), message
    assert f"the run was cancelled in Prefect: {message}" in text, text[-3000:]
