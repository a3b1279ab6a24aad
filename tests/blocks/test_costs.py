"""Cost math: USD = price per hour × billed seconds (create → terminate confirmed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.costs import billed_seconds, budget_exceeded, cost_usd, projected_usd

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class TestBilledSeconds:
    def test_span_between_create_and_confirmed_terminate(self) -> None:
        assert billed_seconds(T0, T0 + timedelta(minutes=90, seconds=3)) == 5403.0

    def test_never_negative(self) -> None:
        assert billed_seconds(T0, T0 - timedelta(seconds=5)) == 0.0

    def test_naive_timestamps_are_refused(self) -> None:
        with pytest.raises(ValueError, match="no timezone"):
            billed_seconds(T0.replace(tzinfo=None), T0)


class TestCostUsd:
    def test_a_3090_hour_and_a_half(self) -> None:
        assert cost_usd(0.22, 5400) == pytest.approx(0.33)

    def test_negative_price_is_refused(self) -> None:
        with pytest.raises(ValueError, match="negative"):
            cost_usd(-0.1, 10)


class TestBudget:
    def test_projection_grows_with_time(self) -> None:
        assert projected_usd(0.22, T0, T0 + timedelta(hours=2)) == pytest.approx(0.44)

    def test_exceeded_once_spend_reaches_cap(self) -> None:
        assert not budget_exceeded(0.22, T0, T0 + timedelta(minutes=59), 0.22)
        assert budget_exceeded(0.22, T0, T0 + timedelta(minutes=60), 0.22)

    def test_no_cap_never_exceeded(self) -> None:
        assert not budget_exceeded(100.0, T0, T0 + timedelta(days=9), None)

    def test_negative_cap_is_refused(self) -> None:
        with pytest.raises(ValueError, match="max_cost_usd"):
            budget_exceeded(0.22, T0, T0, -1.0)
