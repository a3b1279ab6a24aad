"""A Prefect API outage never costs the model (issue 24): the fault matrix's API-outage
cells. ``prefect-runpod finetune`` runs on the local pod with the session's Prefect test
server behind a port the test takes down at one named point
(``tests/fixtures/prefect_outage.py``) and brings back at a later one, at each moment of
a run: before training (from the upload to the training's start), during the upload
(from its first confirmed bytes to the train stage's start, told before that stage writes
anything), mid-training (from the job's start to its end), after training (from the train stage's last artifacts until the
pod is gone) and during the download (until the summary is printed). Before: with the API
down when training finished, the train stage's artifact calls raised ``ConnectError``,
the run failed, the outputs were lost with the pod, no summary was printed and the cost
record stayed at its first version; with it down mid-training the terminal said nothing
and the log follower stood still, blocked in Prefect API calls.

Each run must download and verify the model, end the pod, tell the outage once on the
terminal and its end once, print its summary and, once the API is back, have its
artifacts, its cost record (the confirmed end) and its final state in Prefect. Each cell
records the matrix's figures (``tests.fixtures.run_cells.py``): who ended the pod,
seconds from the outage to the run's end, the final state, pods left, the cost recorded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import PodPaths
from prefect_runpod.blocks.provider import EndedBy
from prefect_runpod.flows.run.cost_record import latest_record
from tests.fixtures.fault_matrix import Cell, wait_until
from tests.fixtures.prefect_outage import ApiSwitch
from tests.fixtures.run_cells import HANG_GUARD, CliRun, cell_of, reaped, start_cli

pytestmark = pytest.mark.slow

ENDED = "ended"
"""The API comes back once the run has ended its pod (read from ``run-report.json``)."""
SUMMARY = "summary"
"""The API comes back once the summary is printed: the CLI held the run's final state."""

MOMENTS = [
    pytest.param("upload", "train_running", id="before-training"),
    pytest.param("upload_moving", "train", id="during-upload"),
    pytest.param("train_running", "train_finished", id="mid-training"),
    pytest.param("train_finished", ENDED, id="after-training"),
    pytest.param("download", SUMMARY, id="during-download"),
]
"""(where the API goes down, where it comes back): a named point, or ENDED / SUMMARY."""


def _ended(run: CliRun) -> dict[str, Any]:
    """The run's report once its pod's end is confirmed."""

    def terminated() -> dict[str, Any] | None:
        data = run.report()
        return data if data and data.get("terminated") else None

    data = wait_until(
        "the run to end its pod", lambda: terminated() or run.proc.poll() is not None, HANG_GUARD
    )
    assert isinstance(data, dict), run.tail()
    return data


def _followed_while_down(run: CliRun) -> None:
    """At the train stage's end, with the API down since the job started: the log
    follower did not stand still: the run's copy of ``train.log`` is the pod's, byte for
    byte, and the job's last progress reached the terminal."""
    data = run.report()
    assert data is not None, run.tail()
    workspace = PodPaths.of(LocalPodProvider().home, data["pod_id"]).workspace
    pod_log = workspace / "prefect-runpod" / data["flow_run_id"] / "train.log"
    copy = (run.out / "train.log").read_bytes()
    assert copy and copy == pod_log.read_bytes()
    assert "100% step 100/100" in run.text(), run.tail()


def _model_kept(data: dict[str, Any], run: CliRun) -> None:
    assert data["passed"] is True, data.get("error")
    assert data["download"]["verified"] is True
    for entry in data["download"]["source_manifest"]["entries"]:
        if entry.get("sha256"):
            got = hashlib.sha256((run.out / "outputs" / entry["path"]).read_bytes()).hexdigest()
            assert got == entry["sha256"], entry["path"]
    assert LocalPodProvider().get(data["pod_id"]) is None


def _in_prefect_once_back(data: dict[str, Any], text: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    run_id = data["flow_run_id"]
    assert text.count("the Prefect API does not answer") == 1, text[-4000:]
    assert text.count("the Prefect API answers again") == 1, text[-4000:]
    assert "result       PASSED" in text and "Traceback" not in text
    assert "not in Prefect:" not in text
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        )
        state = client.read_flow_run(run_id).state
    keys = {a.key for a in arts if a.key}
    assert {"train-progress", "train-metrics", "checksum-manifest", "eval-parity",
            "model-checkpoint", "finetune-costs"} <= keys, keys  # fmt: skip
    progress = [a for a in arts if a.key == "train-progress"]
    assert [float(a.data) for a in progress] == [100.0]
    record = latest_record(run_id)
    assert record is not None and record.end is not None
    assert (record.end.confirmed, record.end.ended_by) == (True, EndedBy.FLOW)
    assert record.pod_id == data["pod_id"] and not record.may_still_bill
    assert state is not None and state.type.value == "COMPLETED", state


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("down", "up"), MOMENTS)
def test_an_api_outage_at_any_moment_costs_nothing(
    api_switch: ApiSwitch, tmp_path: Path, cli_cells: list[Cell], down: str, up: str
) -> None:
    """Down at ``down``, back at ``up``: nothing the run did is lost. After training the
    API comes back once the pod is gone (the flow engine's own retry of the final state
    finds it); during the download it stays down until the summary is printed: Prefect's
    client gives up on the final state (one retry), the CLI prints the summary from
    ``run-report.json``, holds the state with the records, and writes them all once the
    API is back."""
    points = f"{down}:pause" + ("" if up in (ENDED, SUMMARY) else f",{up}:pause")
    env = {"PREFECT_API_URL": api_switch.api_url}
    if up == SUMMARY:
        env["PREFECT_CLIENT_MAX_RETRIES"] = "1"
    with reaped(start_cli(tmp_path, points, **env)) as run:
        run.wait_reached(down)
        api_switch.down()
        run.release(down)
        if up not in (ENDED, SUMMARY):
            run.wait_reached(up)
            if down == "train_running":
                _followed_while_down(run)
            # told while it lasts, from the stage it began in: paused at the next one's
            # start, before it writes (during the upload the probe at its chunks and its
            # end tells it; it used to wait for the train stage's first write)
            wait_until("the outage told", lambda: "API does not answer" in run.text(), HANG_GUARD)
            api_switch.up()
            run.release(up)
        data = _ended(run)
        if up in (ENDED, SUMMARY):  # the model home and the pod gone while the API is down
            _model_kept(data, run)
            assert "the Prefect API does not answer" in run.text(), run.tail()
        if up == SUMMARY:
            wait_until(
                "the summary, printed while the API is down",
                lambda: "result       PASSED" in run.text() or run.proc.poll() is not None,
                HANG_GUARD,
            )
            assert run.proc.poll() is None, run.tail()
            assert "the Prefect API did not answer when the run told it its end" in run.text()
        api_switch.up()
        assert run.wait() == 0, run.tail()
    data = run.report() or {}
    _model_kept(data, run)
    _in_prefect_once_back(data, run.text())
    back = "the pod is gone" if up == ENDED else "the summary" if up == SUMMARY else up
    cell = cell_of("api-outage", down, run, run.fired_at(down), f"API down {down} → {back}")
    cli_cells.append(cell)
    assert (cell.state, cell.pods_left, cell.layer) == ("COMPLETED", 0, "flow"), cell
