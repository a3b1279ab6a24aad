"""Cost math: USD = price per hour × billed seconds (create → terminate confirmed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_runpod.blocks.costs import (
    Bill,
    billed_seconds,
    budget_exceeded,
    budget_reason,
    cost_usd,
    projected_usd,
    round_usd,
    settle,
)

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


class TestBudgetReason:
    def test_sentence_names_spend_cap_pod_and_price(self) -> None:
        why = budget_reason(0.22, T0, T0 + timedelta(hours=1), 0.2, pod_id="abc123")
        assert why == (
            "projected spend 0.2200 USD reached max_cost_usd 0.2000 USD (pod abc123 at 0.22 USD/h)"
        )

    def test_reached_exactly_is_a_reason(self) -> None:
        assert budget_reason(0.22, T0, T0 + timedelta(hours=1), 0.22, pod_id="p") is not None

    def test_under_the_cap_is_no_reason(self) -> None:
        assert budget_reason(0.22, T0, T0 + timedelta(minutes=59), 0.22, pod_id="p") is None

    def test_no_cap_is_no_reason(self) -> None:
        assert budget_reason(100.0, T0, T0 + timedelta(days=9), None, pod_id="p") is None

    def test_clock_behind_create_projects_nothing(self) -> None:
        assert budget_reason(0.22, T0, T0 - timedelta(hours=1), 0.01, pod_id="p") is None

    def test_negative_cap_is_refused(self) -> None:
        with pytest.raises(ValueError, match="max_cost_usd"):
            budget_reason(0.22, T0, T0, -1.0, pod_id="p")


class TestSettle:
    """The figures the run record keeps. The literals are what the flow recorded before
    its arithmetic moved here; a change in rounding or order shows up as a mismatch."""

    @pytest.mark.parametrize(
        ("price", "seconds", "billed", "usd"),
        [
            (0.22, 1234.56789, 1234.568, 0.07544582),
            (0.22, 0.0004, 0.0, 0.0),
            (2.49, 7 * 3600 + 0.0005, 25200.0, 17.43),
            (0.0, 60.0, 60.0, 0.0),
        ],
    )
    def test_recorded_seconds_and_usd(self, price, seconds, billed, usd) -> None:
        bill = settle(price, T0, T0 + timedelta(seconds=seconds))
        assert bill == Bill(billed_seconds=billed, usd=usd)

    def test_usd_comes_from_the_rounded_seconds(self) -> None:
        bill = settle(0.22, T0, T0 + timedelta(seconds=1234.56789))
        assert bill.usd == round_usd(cost_usd(0.22, bill.billed_seconds))

    def test_end_before_create_bills_nothing(self) -> None:
        assert settle(0.22, T0, T0 - timedelta(seconds=5)) == Bill(0.0, 0.0)

    def test_naive_end_is_refused(self) -> None:
        with pytest.raises(ValueError, match="no timezone"):
            settle(0.22, T0, T0.replace(tzinfo=None))
