"""The run's budget check: what the run's earlier pods cost plus the projected
spend of the pod on record against ``max_cost_usd``, with the sentence that ends the
run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.exceptions import BudgetExceededError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.budget import RunBudget
from prefect_runpod.flows.run.report import RunReport

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


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
