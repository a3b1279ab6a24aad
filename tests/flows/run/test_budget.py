"""The run's budget check: what the run's earlier pods cost plus the projected
spend of the pod on record against ``max_cost_usd``, with the sentence that ends the
run."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.exceptions import BudgetExceededError
from prefect_runpod.blocks.interrupts import (
    clear_stop,
    end_stops,
    note_stop,
    raise_if_stopped,
    stop_pending,
)
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.budget import WATCH_INTERVAL_SECONDS, RunBudget
from prefect_runpod.flows.run.ledger import run_stage
from prefect_runpod.flows.run.report import RunReport

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _budget(max_cost_usd: float | None, elapsed: timedelta, *earlier: PodAttempt) -> RunBudget:
    report = RunReport(attempts=list(earlier))
    handle = PodHandle(
        pod_id="abc123", name="prft-run", provider="runpod", cost_per_hr=0.22, created_at=T0
    )
    report.attempts.append(PodAttempt.of(handle, len(earlier) + 1))
    return RunBudget(report, max_cost_usd, now=lambda: T0 + elapsed)


class TestBudget:
    def test_no_pod_on_record_is_never_over_budget(self) -> None:
        budget = RunBudget(RunReport(), 1e-9, now=lambda: T0 + timedelta(days=1))
        assert budget.reason() is None
        budget.check()

    def test_spent_budget_gives_the_sentence_and_raises(self) -> None:
        budget = _budget(0.2, timedelta(hours=1))
        expected = (
            "projected spend 0.2200 USD reached max_cost_usd 0.2000 USD (pod abc123 at 0.22 USD/h)"
        )
        assert budget.reason() == expected
        with pytest.raises(BudgetExceededError, match=r"pod abc123 at 0\.22 USD/h") as err:
            budget.check()
        assert err.value.pod_id == "abc123"

    def test_under_budget_and_no_cap_pass(self) -> None:
        assert _budget(0.22, timedelta(minutes=59)).reason() is None
        assert _budget(None, timedelta(days=30)).reason() is None

    def test_earlier_pods_of_the_run_count_against_the_budget(self) -> None:
        lost = PodAttempt(number=1, pod_id="old1", usd=0.05)
        assert _budget(0.22, timedelta(minutes=59)).reason() is None
        budget = _budget(0.22, timedelta(minutes=59), lost)
        assert budget.reason() == (
            "projected spend 0.2163 USD reached max_cost_usd 0.1700 USD (pod abc123 at 0.22 USD/h)"
        )


class TestStopInsideTheCap:
    """Issue 24: ``--max-cost-usd 0.05`` at 36 USD/h ended at 0.0615 USD, 23 % over the
    cap: the stop and the terminate were billed after the check. The spend is projected
    to the pod's confirmed end of a stop begun now, from what the run measured."""

    def _at_36(self, elapsed: float, **measured: float) -> RunBudget:
        report = RunReport()
        handle = PodHandle(
            pod_id="p36", name="prft-run", provider="local", cost_per_hr=36.0, created_at=T0
        )
        report.attempts.append(PodAttempt.of(handle, 1))
        budget = RunBudget(report, 0.05, now=lambda: T0 + timedelta(seconds=elapsed))
        budget.create_seconds = measured.get("create")
        budget.poll_gap_seconds = measured.get("poll_gap", 0.0)
        return budget

    def test_the_stop_and_the_terminate_are_projected_from_what_was_measured(self) -> None:
        # 36 USD/h is 0.01 USD/s: the 0.05 cap is 5 s of billing.
        assert self._at_36(4.5).reason() is None  # nothing measured: only the spend so far
        budget = self._at_36(4.5, create=0.3, poll_gap=0.2)  # a stop: 0.4 + 0.3 s
        assert budget.stop_seconds() == pytest.approx(0.7)
        assert budget.reason() == (
            "projected spend 0.0520 USD by the pod's end, 0.7 s after a stop now, reached "
            "max_cost_usd 0.0500 USD (pod p36 at 36.00 USD/h)"
        )
        assert self._at_36(4.2, create=0.3, poll_gap=0.2).reason() is None

    def test_an_earlier_pods_terminate_is_the_measure_once_there_is_one(self) -> None:
        budget = self._at_36(4.0, create=0.1)
        assert budget.reason() is None
        with run_stage(budget.report, "terminate", attempt=1):
            time.sleep(0.05)  # a real stage, timed by the ledger
        with run_stage(budget.report, "terminate", attempt=2):
            pass  # the second pod's: the first moves to earlier_stages
        seconds = budget.report.earlier_stages[0].seconds
        assert budget.stop_seconds() == pytest.approx(seconds) and seconds >= 0.05

    def test_the_poll_measures_its_own_gap(self) -> None:
        ticks = iter([10.0, 10.75, 11.25])
        budget = RunBudget(RunReport(), 0.05, clock=lambda: next(ticks))
        assert budget.should_stop() is None and budget.poll_gap_seconds == 0.0
        budget.should_stop()
        assert budget.poll_gap_seconds == pytest.approx(0.75)
        budget.should_stop()  # a quicker poll: the slowest one still counts
        assert budget.poll_gap_seconds == pytest.approx(0.75)

    def test_the_watch_stops_the_run_at_the_next_boundary(self) -> None:
        budget = self._at_36(9.0)  # over the cap already
        budget.watch()
        try:
            assert wait_for(stop_pending, 60.0)
            with pytest.raises(BudgetExceededError, match="reached max_cost_usd 0.0500 USD"):
                raise_if_stopped()  # as a transfer chunk or a stage boundary does
        finally:
            budget.stop()
            clear_stop()
        assert budget.stop_seconds() >= WATCH_INTERVAL_SECONDS  # the watch's own lateness

    def test_a_ctrl_c_under_way_keeps_its_reason_over_the_budget(self) -> None:
        budget = self._at_36(9.0)  # over the cap already
        assert note_stop(KeyboardInterrupt)  # the user's Ctrl-C came first
        budget.check()  # a stage boundary's check: the Ctrl-C stop goes on, nothing raised
        assert budget.should_stop() is None  # the training poll raises the Ctrl-C instead
        budget.watch()
        budget.stop()
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()
        first, later = end_stops()
        assert first is KeyboardInterrupt and len(later) == 1
        with pytest.raises(BudgetExceededError, match="reached max_cost_usd"):
            raise later[0]()  # what came during the stop: the budget's own sentence

    def test_a_stop_the_watch_noted_never_outlives_its_run(self) -> None:
        budget = self._at_36(9.0)
        budget.watch()
        assert wait_for(stop_pending, 60.0)
        budget.stop()  # the run ended (terminate) before any boundary raised it
        assert not stop_pending()
        raise_if_stopped()  # the next run served by this process is not stopped
