"""The run's budget: what its pods have cost so far plus the current pod's projected
spend against ``max_cost_usd`` (docs/architecture.md#what-a-run-cost).

The spend is projected to the moment the pod's end would be confirmed if the run
stopped now, so a run stopped by its cap ends under it: the stop takes the time until
the next check (the longest measured gap between training polls, or the watch's
interval), the
kill (one console command, like a poll) and the terminate (measured on this run's
earlier pod, else its create, the provider's same kind of call).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from prefect_runpod.blocks.costs import budget_reason
from prefect_runpod.blocks.exceptions import BudgetExceededError
from prefect_runpod.blocks.interrupts import claim_stop, forget_stop, note_stop
from prefect_runpod.flows.run.report import RunReport

__all__ = ["WATCH_INTERVAL_SECONDS", "RunBudget"]

WATCH_INTERVAL_SECONDS = 0.5
"""How often the budget's watch projects the spend between the stages' own checks."""


class RunBudget:
    """The run's budget check: what its pods have cost so far plus the current pod's
    projected spend (``blocks/costs.py``) to the end of a stop that began now, against
    ``max_cost_usd``, from the moment the pod is on record.

    Args:
        report: the run's report (its attempts, the earlier pods' stages).
        max_cost_usd: the cap in USD, or None for none.
        now: the wall clock (UTC); clock: a monotonic clock (s), for measured gaps.
    """

    def __init__(
        self,
        report: RunReport,
        max_cost_usd: float | None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.report = report
        self.max_cost_usd = max_cost_usd
        self._now = now
        self._clock = clock
        self.create_seconds: float | None = None
        """How long the provider took to create this pod (s), measured at provision."""
        self.poll_gap_seconds = 0.0
        """The longest measured gap between two training polls (s)."""
        self._last_poll: float | None = None
        self._stop_watch = threading.Event()
        self._watch: threading.Thread | None = None
        self._noted: Callable[[], BaseException] | None = None

    def stop_seconds(self) -> float:
        """Seconds from a stop decided now to the pod's confirmed end, projected from
        what this run measured: twice the longest gap between training polls (the next
        poll can come that late; the kill is one console command, like a poll), the
        watch's interval, and the terminate: an earlier pod's of this run, else this pod's
        create (0 while neither is known)."""
        earlier = [s.seconds for s in self.report.earlier_stages if s.name == "terminate"]
        end = max(earlier) if earlier else (self.create_seconds or 0.0)
        watching = WATCH_INTERVAL_SECONDS if self._watch is not None else 0.0
        return 2 * self.poll_gap_seconds + watching + end

    def reason(self) -> str | None:
        """A sentence when the budget is spent by the end of a stop begun now (see
        ``stop_seconds``), else None (also with no pod or no cap)."""
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
            stop_seconds=self.stop_seconds(),
        )

    def should_stop(self) -> str | None:
        """``reason`` for the training poll, measuring the gap since the previous poll
        (the longest one counts); None while another stop is under way (a Ctrl-C the
        poll raises next: the first reason wins, ``blocks.interrupts``)."""
        now = self._clock()
        if self._last_poll is not None:  # the slowest poll yet: the next may be as slow
            self.poll_gap_seconds = max(self.poll_gap_seconds, now - self._last_poll)
        self._last_poll = now
        why = self.reason()
        return why if why and claim_stop(self._stop(why)) else None

    def check(self) -> None:
        """Raise ``BudgetExceededError`` when the budget is spent, unless another stop is
        under way already (it keeps its reason: the first wins)."""
        why = self.reason()
        if why and claim_stop(self._stop(why)):
            raise BudgetExceededError(why, pod_id=self.report.pod_id)

    def _stop(self, why: str) -> Callable[[], BaseException]:
        """The budget's one stop in the run's stop slot (made at the first reason)."""
        if self._noted is None:
            self._noted = functools.partial(BudgetExceededError, why, pod_id=self.report.pod_id)
        return self._noted

    def watch(self) -> None:
        """Between the stages' own checks, project the spend every
        ``WATCH_INTERVAL_SECONDS`` in a thread; once it reaches the cap, note the stop
        (``blocks.interrupts``) so the next boundary (a transfer chunk, a stage's start
        or end, a training poll) raises ``BudgetExceededError``. No-op without a cap."""
        if self.max_cost_usd is None or self._watch is not None:
            return
        self._watch = threading.Thread(target=self._run, name="budget-watch", daemon=True)
        self._watch.start()

    def stop(self) -> None:
        """End the watch (before the terminate: it is never stopped by the budget), and
        forget a stop it noted that no boundary raised, so it never reaches another run
        served by this process."""
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.join(10.0)
        if self._noted is not None:
            forget_stop(self._noted)

    def _run(self) -> None:
        while not self._stop_watch.wait(WATCH_INTERVAL_SECONDS):
            why = self.reason()
            if why:
                note_stop(self._stop(why))  # refused while another stop is under way
                return
