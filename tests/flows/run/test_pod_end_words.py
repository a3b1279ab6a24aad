"""The layer that ended a pod is named as itself: the run's own dead-man switch ending
its pod is not "terminated outside this run" (issue 24), in the run's error sentence nor
in the summary's ``terminated`` line; a pod ended by someone else still is. A lost pod's
sentence says the run "ends the pod" only while it is still to be ended; one already
ended says who ended it."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import PodCause, PodStatus, TerminateResult, lost_sentence
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.end import flow_end
from prefect_runpod.flows.run.report import RunReport

ENDED = datetime(2026, 1, 1, 12, 0, 3, tzinfo=UTC)


def _gone(by: str | None, said: str) -> PodStatus:
    """What the local pod's status says of a pod its tombstone names ``by`` for."""
    return PodStatus(
        pod_id="p1",
        cause=PodCause.TERMINATED_OUTSIDE,
        provider_status=said,
        observed_at=ENDED,
        ended_at=ENDED if by else None,
        ended_by=by,
        ended_layer="runpodctl pod delete" if by else None,
    )


def _end_line(status: PodStatus) -> str:
    report = RunReport(flow_run_id="r1", pod_name="prft-r1", provider="local")
    report.attempts.append(
        PodAttempt.of(PodHandle(pod_id="p1", name="prft-r1", provider="local", created_at=ENDED), 1)
    )
    result = TerminateResult(pod_id="p1", confirmed_at=datetime.now(UTC), already_gone=True)
    report.attempts[0].end = flow_end(result, status)
    return report.end_line()


def test_the_runs_own_dead_man_is_named_as_itself() -> None:
    status = _gone("deadman", "the local pod ended at 12:00:03 UTC by its dead-man switch")
    sentence = lost_sentence(status)
    assert sentence.startswith("pod p1 was ended by the run's own dead-man switch (")
    assert "outside this run" not in sentence
    line = _end_line(status)
    assert line == (
        "gone: ended by the run's own dead-man switch (runpodctl pod delete) at 12:00:03 UTC,"
        " confirmed"
    )


def test_a_pod_ended_by_someone_else_is_still_terminated_outside_the_run() -> None:
    status = _gone(None, "no such local pod")
    assert "was terminated outside this run (no such local pod" in lost_sentence(status)
    assert _end_line(status).startswith("gone: terminated outside this run, ended by outside")


def _lost(cause: PodCause, by: str | None) -> PodStatus:
    return PodStatus(
        pod_id="p1",
        cause=cause,
        provider_status="ERROR" if cause is PodCause.HOST_LOST else "EXITED",
        observed_at=ENDED,
        ended_at=ENDED if by else None,
        ended_by=by,
        ended_layer="DELETE /v2/pods" if by else None,
    )


def test_a_lost_pod_still_to_be_ended_is_ended_by_the_run() -> None:
    assert lost_sentence(_lost(PodCause.HOST_LOST, None)) == (
        "pod p1 lost its host (ERROR) at 12:00:03 UTC; the run stopped waiting and ends the pod."
    )
    assert lost_sentence(_lost(PodCause.EXITED, None)).endswith(
        "its container stopped, so the run stopped waiting and ends the pod."
    )


def test_a_lost_pod_already_ended_names_who_ended_it() -> None:
    by_run = lost_sentence(_lost(PodCause.HOST_LOST, "flow"))  # its SSH stayed silent
    assert by_run == (
        "pod p1 lost its host (ERROR) at 12:00:03 UTC; the run stopped waiting for it: "
        "the run itself had ended it, confirmed gone at 12:00:03 UTC."
    )
    by_reaper = lost_sentence(_lost(PodCause.EXITED, "reaper"))
    assert by_reaper.endswith(
        "so the run stopped waiting for it: the reaper had ended it (DELETE /v2/pods), "
        "confirmed gone at 12:00:03 UTC."
    )
    assert "ends the pod" not in by_run + by_reaper
