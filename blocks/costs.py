"""Cost arithmetic: price per hour × billed seconds, in USD.

Billing runs from the moment the provider returned the pod id (create) to the moment
terminate was confirmed (docs/architecture.md#data-that-moves, ``CostReport``). These numbers are estimates, as
SkyPilot's ``cost_report`` and dstack's run cost are; RunPod's billing API
(``/billing/pods``) holds the real charges.

Pure functions: no network, no Prefect. The fine-tune flow takes every figure it
records from here: the projected spend its budget checks (``budget_reason``) and the
billed seconds and USD of its cost record (``settle``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

__all__ = [
    "Bill",
    "billed_seconds",
    "budget_exceeded",
    "budget_reason",
    "cost_usd",
    "projected_usd",
    "round_seconds",
    "round_usd",
    "settle",
]

_SECONDS_PER_HOUR = 3600.0
_SECONDS_DECIMALS = 3
"""Billed seconds are recorded to the millisecond: finer is clock noise."""
_USD_DECIMALS = 8
"""USD is recorded to 1e-8: a cent-rounded figure would read 0.00 for a short
rehearsal at a real price (0.22 USD/h for 60 s is 0.00366667 USD)."""


def _check_aware(*stamps: datetime) -> None:
    for stamp in stamps:
        if stamp.tzinfo is None:
            raise ValueError(f"timestamp {stamp.isoformat()} has no timezone; use UTC-aware times")


def billed_seconds(created_at: datetime, confirmed_at: datetime) -> float:
    """Seconds billed between create and confirmed terminate (never negative).

    Args:
        created_at: when the provider returned the pod id (timezone-aware).
        confirmed_at: when the provider confirmed the pod gone (timezone-aware).

    Returns:
        Seconds, as a float, ≥ 0.

    Raises:
        ValueError: when either timestamp is naive.
    """
    _check_aware(created_at, confirmed_at)
    return max(0.0, (confirmed_at - created_at).total_seconds())


def cost_usd(cost_per_hr: float, seconds: float) -> float:
    """USD for ``seconds`` at ``cost_per_hr`` USD/h.

    Raises:
        ValueError: when the price or the duration is negative.
    """
    if cost_per_hr < 0 or seconds < 0:
        raise ValueError(f"negative price ({cost_per_hr} USD/h) or duration ({seconds} s)")
    return cost_per_hr * seconds / _SECONDS_PER_HOUR


def projected_usd(cost_per_hr: float, started_at: datetime, now: datetime) -> float:
    """What a pod started at ``started_at`` has cost by ``now``, in USD.

    Args:
        cost_per_hr: USD/h (RunPod's ``costPerHr``).
        started_at: when billing started (timezone-aware).
        now: the moment to project to (timezone-aware).

    Raises:
        ValueError: on naive timestamps or a negative price.
    """
    return cost_usd(cost_per_hr, billed_seconds(started_at, now))


def budget_exceeded(
    cost_per_hr: float, started_at: datetime, now: datetime, max_cost_usd: float | None
) -> bool:
    """True when the projected spend has reached ``max_cost_usd``; never with no budget.

    Args:
        cost_per_hr: USD/h.
        started_at: when billing started (timezone-aware).
        now: the moment to check (timezone-aware).
        max_cost_usd: the budget in USD, or None for no cap.

    Raises:
        ValueError: on naive timestamps, a negative price or a negative budget.
    """
    if max_cost_usd is None:
        return False
    if max_cost_usd < 0:
        raise ValueError(f"max_cost_usd must be ≥ 0, got {max_cost_usd}")
    return projected_usd(cost_per_hr, started_at, now) >= max_cost_usd


def budget_reason(
    cost_per_hr: float,
    started_at: datetime,
    now: datetime,
    max_cost_usd: float | None,
    *,
    pod_id: str,
    stop_seconds: float = 0.0,
) -> str | None:
    """The sentence that ends a run whose projected spend reached its budget, else None.

    Args:
        cost_per_hr: USD/h.
        started_at: when billing started (timezone-aware).
        now: the moment to check (timezone-aware).
        max_cost_usd: the budget in USD, or None for no cap (never a reason then).
        pod_id: the pod that is billing, named in the sentence.
        stop_seconds: how long stopping takes from ``now`` until the pod's end is
            confirmed (billing ends there): the spend is projected to that moment, so
            a run stopped now still ends under the cap.

    Returns:
        For example ``projected spend 0.2200 USD reached max_cost_usd 0.2000 USD (pod
        abc123 at 0.22 USD/h)`` (with ``stop_seconds``: ``projected spend 0.0500 USD
        by the pod's end, 1.2 s after a stop now, reached …``), or None while the
        spend is under the budget.

    Raises:
        ValueError: on naive timestamps, a negative price or a negative budget.
    """
    if max_cost_usd is None:
        return None
    if max_cost_usd < 0:
        raise ValueError(f"max_cost_usd must be ≥ 0, got {max_cost_usd}")
    if stop_seconds < 0:
        raise ValueError(f"stop_seconds must be ≥ 0, got {stop_seconds}")
    spent = projected_usd(cost_per_hr, started_at, now + timedelta(seconds=stop_seconds))
    if spent < max_cost_usd:
        return None
    until = f" by the pod's end, {stop_seconds:.1f} s after a stop now," if stop_seconds else ""
    return (
        f"projected spend {spent:.4f} USD{until} reached max_cost_usd {max_cost_usd:.4f} USD "
        f"(pod {pod_id} at {cost_per_hr:.2f} USD/h)"
    )


def round_seconds(seconds: float) -> float:
    """Billed seconds as recorded: rounded to the millisecond."""
    return round(seconds, _SECONDS_DECIMALS)


def round_usd(usd: float) -> float:
    """USD as recorded: rounded to 1e-8 USD."""
    return round(usd, _USD_DECIMALS)


class Bill(NamedTuple):
    """A pod's recorded cost.

    Attributes:
        billed_seconds: create → end, rounded to the millisecond (≥ 0).
        usd: ``cost_per_hr`` × the rounded ``billed_seconds`` / 3600, rounded to 1e-8 USD.
    """

    billed_seconds: float
    usd: float


def settle(cost_per_hr: float, created_at: datetime, ended_at: datetime) -> Bill:
    """What a pod cost from create to ``ended_at``, as the run record keeps it.

    ``ended_at`` is the moment terminate was confirmed, or ``now`` for a pod that may
    still be billing (kept for inspection, or terminate unconfirmed). The USD is
    computed from the rounded seconds, so ``usd == round_usd(cost_usd(cost_per_hr,
    billed_seconds))`` holds for the recorded pair.

    Args:
        cost_per_hr: USD/h.
        created_at: when the provider returned the pod id (timezone-aware).
        ended_at: when billing ended, or the moment to count to (timezone-aware).

    Returns:
        The ``Bill``.

    Raises:
        ValueError: on naive timestamps or a negative price.
    """
    seconds = round_seconds(billed_seconds(created_at, ended_at))
    return Bill(billed_seconds=seconds, usd=round_usd(cost_usd(cost_per_hr, seconds)))
