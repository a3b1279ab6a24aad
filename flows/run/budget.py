"""The run's budget: what its pods have cost so far plus the current pod's projected
spend against ``max_cost_usd`` (docs/architecture.md#what-a-run-cost)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from prefect_runpod.blocks.costs import budget_reason
from prefect_runpod.blocks.exceptions import BudgetExceededError
from prefect_runpod.flows.run.report import RunReport

__all__ = ["RunBudget"]


class RunBudget:
    """The run's budget check: what its pods have cost so far plus the current pod's
    projected spend (``blocks/costs.py``) against ``max_cost_usd``, from the moment the
    pod is on record."""

    def __init__(
        self,
        report: RunReport,
        max_cost_usd: float | None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.report = report
        self.max_cost_usd = max_cost_usd
        self._now = now

    def reason(self) -> str | None:
        """A sentence when the budget is spent, else None (also with no pod or no cap)."""
        attempts = self.report.attempts
        handle = attempts[-1].handle if attempts else None
        if handle is None or self.max_cost_usd is None:
            return None
        spent = sum(a.usd for a in attempts[:-1])
        return budget_reason(
            handle.cost_per_hr,
            handle.created_at,
            self._now(),
            max(self.max_cost_usd - spent, 0.0),
            pod_id=handle.pod_id,
        )

    def check(self) -> None:
        """Raise ``BudgetExceededError`` when the budget is spent."""
        why = self.reason()
        if why:
            raise BudgetExceededError(why, pod_id=self.report.pod_id)
