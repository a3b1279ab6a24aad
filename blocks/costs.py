"""Cost arithmetic: price per hour × billed seconds, in USD.

Billing runs from the moment the provider returned the pod id (create) to the moment
terminate was confirmed (docs/architecture.md#data-that-moves, ``CostReport``). These numbers are estimates, as
SkyPilot's ``cost_report`` and dstack's run cost are; RunPod's billing API
(``/billing/pods``) holds the real charges.

Pure functions: no network, no Prefect.
"""

from __future__ import annotations

from datetime import datetime

__all__ = ["billed_seconds", "budget_exceeded", "cost_usd", "projected_usd"]

_SECONDS_PER_HOUR = 3600.0


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
