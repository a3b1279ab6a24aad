"""A frozen pod, a whole run (issue 24): ``prefect-runpod finetune
--reconnect-budget-seconds 20`` on the local pod, the pod's daemon (its SSH server and
sessions) SIGSTOPped while the job trains (at the named point ``train_running``): the
socket stays open and nothing answers. The run must end with one sentence naming the
pod, no paramiko traceback on the terminal (``Error reading SSH protocol banner`` reached
it four times), and the pod ended. Before: the run exited 144.8 s after the freeze, the
first sign on the terminal after 84 s. The seconds from the freeze to the run's end are
the cell's figure (``tests/fixtures/run_cells.py``), measured, not asserted: the wait is
only a hang guard.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.local_pod.registry import read_record
from tests.fixtures.fault_matrix import Cell
from tests.fixtures.run_cells import HANG_GUARD, cell_of, reaped, start_cli

pytestmark = pytest.mark.slow

BUDGET_SECONDS = 20.0


@pytest.mark.timeout(900)
def test_a_frozen_pod_ends_the_run_in_one_sentence(
    prefect_server: None, tmp_path: Path, cli_cells: list[Cell]
) -> None:
    from prefect.settings import get_current_settings

    api_url = str(get_current_settings().api.url)
    # no resume on a new pod (issue 25 resumes after a host lost): this run ends
    args = ("--reconnect-budget-seconds", f"{BUDGET_SECONDS:g}", "--max-pod-losses", "0")
    with reaped(start_cli(tmp_path, "train_running:pause", *args, PREFECT_API_URL=api_url)) as run:
        run.wait_reached("train_running")
        data = run.report()
        assert data is not None and data["pod_id"], run.tail()
        pod_id = data["pod_id"]
        record = read_record(LocalPodProvider().home, pod_id)
        assert record is not None
        os.kill(record.pid, signal.SIGSTOP)  # the pod freezes: its sockets stay open
        try:
            frozen_at = run.fired_at("train_running")
            run.release("train_running")
            rc = run.wait(HANG_GUARD)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGCONT)
    text = run.text()
    assert rc == 1, text[-4000:]
    assert "Traceback" not in text and "SSH protocol banner" not in text, text[-4000:]
    errors = re.findall(r"^error        (.*)$", text, flags=re.MULTILINE)
    assert len(errors) == 1 and pod_id in errors[0], text[-4000:]
    # the run ended the pod before it said so: the sentence says who, not "ends the pod"
    assert "the run itself had ended it" in errors[0] and "ends the pod" not in errors[0]
    assert "result       FAILED" in text and "outside this run" not in text, text[-4000:]
    assert re.search(r"^terminated   gone: host lost, ended by flow", text, flags=re.MULTILINE)
    assert LocalPodProvider().get(pod_id) is None
    cell = cell_of("train", "frozen-pod", run, frozen_at, errors[0])
    cli_cells.append(cell)
    print(f"frozen pod: run ended {cell.seconds:.1f} s after the freeze "
          f"(budget {BUDGET_SECONDS:g} s: {cell.seconds / BUDGET_SECONDS:.2f} x)")  # fmt: skip
    assert (cell.state, cell.pods_left) == ("FAILED", 0), cell
