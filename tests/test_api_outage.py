"""A Prefect API outage never costs the model (issue 24): ``prefect-runpod finetune`` on
the local pod, the session's Prefect test server behind a port the test takes down at a
named point (``tests/fixtures/prefect_outage.py``) and brings back once the run's work is
done. Before: with the API down when training finished, the train stage's artifact calls
raised ``ConnectError``, the run failed, the outputs were lost with the pod, no summary
was printed and the cost record stayed at its first version.

Each run must download and verify the model, end the pod and write ``run-report.json``
while the API is down; tell the outage once on the terminal and its end once; print its
summary; and, once the API is back, have its artifacts, its cost record (the confirmed
end) and its final state in Prefect.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.faults import release_marker
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import EndedBy
from prefect_runpod.flows.run.cost_record import latest_record
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.prefect_outage import ApiSwitch

pytestmark = pytest.mark.slow

HANG_GUARD = 300.0
"""Every wait below ends on an event; this only stops a hung run."""


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """The CLI run is killed (and waited for) if the test leaves it running."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(
    tmp_path: Path, switch: ApiSwitch, point: str, **env: str
) -> tuple[subprocess.Popen[bytes], Path]:
    import os

    log = tmp_path / "cli.log"
    full = dict(
        os.environ,
        PREFECT_API_URL=switch.api_url,
        PREFECT_RUNPOD_FAULTS=f"{point}:pause",
        PREFECT_RUNPOD_FAULT_DIR=str(tmp_path / "faults"),
        **env,
    )
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect_runpod.flows.cli", "finetune",
             "--output-dir", str(tmp_path / "out")],
            env=full, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    return proc, log


def _text(log: Path) -> str:
    return log.read_text(errors="replace")


def _down_at(
    proc: subprocess.Popen[bytes], log: Path, tmp_path: Path, switch: ApiSwitch, point: str
) -> None:
    """Wait for the run to pause at ``point``, take the API down, let the run go on."""
    faults = tmp_path / "faults"
    wait_until(
        f"the run to reach {point}",
        lambda: (faults / f"{point}.reached").exists() or proc.poll() is not None,
        HANG_GUARD,
    )
    assert proc.poll() is None, _text(log)[-3000:]
    switch.down()
    release_marker(faults, point)


def _ended_while_down(proc: subprocess.Popen[bytes], log: Path, out: Path) -> dict[str, Any]:
    """The run's report with the pod's end confirmed, read while the API is still down;
    the model downloaded and verified, the pod gone."""

    def report() -> dict[str, Any] | None:
        try:
            data = json.loads((out / "run-report.json").read_text())
        except (OSError, ValueError):
            return None
        return data if data.get("terminated") else None

    data = wait_until(
        "the run to end its pod", lambda: report() or proc.poll() is not None, HANG_GUARD
    )
    assert isinstance(data, dict), _text(log)[-3000:]
    assert data["passed"] is True, data.get("error")
    assert data["download"]["verified"] is True
    for entry in data["download"]["source_manifest"]["entries"]:
        if entry.get("sha256"):
            got = hashlib.sha256((out / "outputs" / entry["path"]).read_bytes()).hexdigest()
            assert got == entry["sha256"], entry["path"]
    assert LocalPodProvider().get(data["pod_id"]) is None
    assert "does not answer" in _text(log)
    return data


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
def test_the_api_down_when_training_finishes_costs_nothing(
    api_switch: ApiSwitch, tmp_path: Path
) -> None:
    """Down at ``train_finished`` (the train stage's last artifacts), back once the pod is
    gone: the flow engine's own retry of its final state then finds it."""
    proc, log = _start(tmp_path, api_switch, "train_finished")
    with _reaped(proc):
        _down_at(proc, log, tmp_path, api_switch, "train_finished")
        data = _ended_while_down(proc, log, tmp_path / "out")
        api_switch.up()
        assert proc.wait(timeout=HANG_GUARD) == 0, _text(log)[-4000:]
    _in_prefect_once_back(data, _text(log))


@pytest.mark.timeout(900)
def test_the_api_down_during_download_outlasting_the_run(
    api_switch: ApiSwitch, tmp_path: Path
) -> None:
    """Down from the start of ``download`` until the summary is printed: Prefect's client
    gives up on the run's final state (one retry), the CLI prints the summary from
    ``run-report.json``, holds the state with the records, and writes them all once the
    API is back."""
    proc, log = _start(tmp_path, api_switch, "download", PREFECT_CLIENT_MAX_RETRIES="1")
    with _reaped(proc):
        _down_at(proc, log, tmp_path, api_switch, "download")
        data = _ended_while_down(proc, log, tmp_path / "out")
        wait_until(
            "the summary, printed while the API is down",
            lambda: "result       PASSED" in _text(log) or proc.poll() is not None,
            HANG_GUARD,
        )
        text = _text(log)
        assert proc.poll() is None, text[-4000:]
        assert "the Prefect API did not answer when the run told it its end" in text
        api_switch.up()
        assert proc.wait(timeout=HANG_GUARD) == 0, _text(log)[-4000:]
    _in_prefect_once_back(data, _text(log))
