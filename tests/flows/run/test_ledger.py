"""The stage ledger: a stage stopped from outside (SIGTERM, Ctrl-C, a cancelled run) is
Cancelled, known by the exception's type; anything else that escapes it is Failed."""

from __future__ import annotations

import prefect.exceptions
import pytest
from prefect.exceptions import TerminationSignal

from prefect_runpod.blocks.interrupts import end_stops, note_stop, stop_pending
from prefect_runpod.flows.run.ledger import StageSkipped, error_line, run_stage
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.models import StageState


class CancelledRun(Exception):
    """Not Prefect's: an error of the job's own that happens to share the name."""


_PREFECT_CANCELLED = prefect.exceptions.CancelledRun


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), TerminationSignal(15), _PREFECT_CANCELLED("cancelled")],
    ids=["ctrl-c", "sigterm", "cancelled-run"],
)
def test_a_stage_stopped_from_outside_is_cancelled(error: BaseException) -> None:
    report = RunReport()
    with pytest.raises(type(error)), run_stage(report, "train"):
        raise error
    assert report.stage("train").state is StageState.CANCELLED
    reason = report.stage("train").reason
    if isinstance(error, Exception):  # a cancellation keeps Prefect's own sentence
        assert reason.startswith(type(error).__name__)
    else:
        said = "Ctrl-C" if isinstance(error, KeyboardInterrupt) else "SIGTERM"
        assert reason.startswith(f"stopped by {said} during train (")


def test_an_error_that_only_shares_a_name_fails_the_stage() -> None:
    report = RunReport()
    with pytest.raises(CancelledRun), run_stage(report, "train"):
        raise CancelledRun("the job's own error")
    assert report.stage("train").state is StageState.FAILED
    assert "the job's own error" in report.stage("train").reason


def test_a_ctrl_c_is_one_sentence_naming_the_stage_not_an_empty_error() -> None:
    report = RunReport()
    try:
        with run_stage(report, "upload"):
            raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        line = error_line(report, exc)
    assert line == report.stage("upload").reason
    assert line.startswith("stopped by Ctrl-C during upload (") and "s into the stage" in line
    assert line.endswith("; the run ends its pod") and "KeyboardInterrupt" not in line


def test_a_dropped_stop_is_raised_at_the_stage_boundary_but_never_skips_terminate() -> None:
    report = RunReport()
    note_stop(KeyboardInterrupt)  # as if the handler's own raise had been dropped by gc
    try:
        with run_stage(report, "terminate"):
            pass  # the pod's end is never stopped
        assert stop_pending()
        with pytest.raises(KeyboardInterrupt), run_stage(report, "download"):
            raise AssertionError("the stage must not start")  # pragma: no cover
    finally:
        assert not stop_pending()  # the stage recorded it: the cleanup is not stopped again
    assert report.stage("terminate").state is StageState.COMPLETED
    assert report.stage("download").state is StageState.CANCELLED
    end_stops()  # another run: its own stop
    note_stop(KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt), run_stage(report, "checksum"):
        pass  # dropped during the stage: raised at its end
    assert report.stage("checksum").state is StageState.CANCELLED


def test_skipped_and_completed_stages_are_timed() -> None:
    report = RunReport()
    with run_stage(report, "hf_auth"):
        raise StageSkipped("no model id")
    with run_stage(report, "env"):
        pass
    assert report.stage("hf_auth").state is StageState.SKIPPED
    assert report.stage("hf_auth").reason == "no model id"
    assert report.stage("env").state is StageState.COMPLETED
    assert report.cost.stage_seconds.keys() >= {"hf_auth", "env"}
