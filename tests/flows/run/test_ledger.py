"""The stage ledger: a stage stopped from outside (SIGTERM, Ctrl-C, a cancelled run) is
Cancelled, known by the exception's type; anything else that escapes it is Failed."""

from __future__ import annotations

import prefect.exceptions
import pytest
from prefect.exceptions import TerminationSignal

from prefect_runpod.flows.run.ledger import StageSkipped, run_stage
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
    assert report.stage("train").reason.startswith(type(error).__name__)


def test_an_error_that_only_shares_a_name_fails_the_stage() -> None:
    report = RunReport()
    with pytest.raises(CancelledRun), run_stage(report, "train"):
        raise CancelledRun("the job's own error")
    assert report.stage("train").state is StageState.FAILED
    assert "the job's own error" in report.stage("train").reason


def test_a_signal_with_no_message_says_what_happens_next() -> None:
    report = RunReport()
    with pytest.raises(KeyboardInterrupt), run_stage(report, "upload"):
        raise KeyboardInterrupt
    assert "the pod is terminated next" in report.stage("upload").reason


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
