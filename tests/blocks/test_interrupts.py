"""A Ctrl-C raised inside a weakref callback during garbage collection is dropped by
CPython (reported as unraisable); the stop noted by the CLI's handler is raised again at
the next boundary of a waiting loop, so the run still ends with 130.

The budget cap and the signals share one stop slot: the first reason wins, whichever it
is, and a later one is only said (issue 24)."""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
import weakref

import pytest

from prefect_runpod.blocks import faults
from prefect_runpod.blocks.exceptions import BudgetExceededError
from prefect_runpod.blocks.interrupts import (
    claim_stop,
    clear_stop,
    end_stops,
    note_stop,
    raise_if_stopped,
    stop_pending,
    stop_under_way,
    stops_sentence,
)
from prefect_runpod.flows.cli.session import EXIT_SIGINT, Terminated, orderly_signals


class _Garbage:
    pass


def _drop_a_signal_inside_gc(signum: int) -> None:
    """Run the installed handler for ``signum`` from a weakref callback during
    gc.collect(), where CPython swallows what it raises."""
    handler = signal.getsignal(signum)
    assert callable(handler)
    cycle = _Garbage()
    cycle.self = cycle  # type: ignore[attr-defined]  # only the collector frees it
    keep = weakref.ref(cycle, lambda _ref: handler(signum, None))
    del cycle
    gc.collect()  # the handler's exception is dropped here
    assert keep() is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_dropped_by_the_collector_is_raised_at_the_next_boundary() -> None:
    with orderly_signals():
        _drop_a_signal_inside_gc(signal.SIGINT)  # nothing raised: CPython dropped it
        assert stop_pending()
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()
        raise_if_stopped()  # raised once, not again
    assert EXIT_SIGINT == 130


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_dropped_sigterm_stops_a_paused_fault_point(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(faults.FAULTS_ENV, "upload_started:pause")
    monkeypatch.setenv(faults.FAULT_DIR_ENV, str(tmp_path))
    with orderly_signals():
        _drop_a_signal_inside_gc(signal.SIGTERM)
        with pytest.raises(Terminated):
            faults.fault_point("upload_started")  # would wait 300 s for its release
    assert not stop_pending()  # the block's end forgets what was not acted on


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_lane_thread_leaves_the_stop_to_the_main_thread() -> None:
    with orderly_signals():
        _drop_a_signal_inside_gc(signal.SIGINT)
        raised: list[BaseException] = []

        def lane() -> None:
            try:
                raise_if_stopped()
            except BaseException as exc:  # pragma: no cover - the failure being tested
                raised.append(exc)

        worker = threading.Thread(target=lane)
        worker.start()
        worker.join()
        assert not raised and stop_pending()
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()


BUDGET = functools.partial(
    BudgetExceededError,
    "projected spend 0.0512 USD by the pod's end, 4.1 s after a stop now, reached "
    "max_cost_usd 0.0500 USD (pod abc123 at 36.00 USD/h)",
    pod_id="abc123",
)
"""The budget watch's stop, as ``RunBudget`` notes it."""


def test_a_ctrl_c_during_the_budget_stop_leaves_the_budget_the_reason() -> None:
    with orderly_signals():
        assert note_stop(BUDGET)  # the watch found the cap reached
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C before the boundary: nothing raised
        with pytest.raises(BudgetExceededError, match="max_cost_usd 0.0500 USD"):
            raise_if_stopped()  # the boundary raises the budget's stop, not the Ctrl-C
        clear_stop()  # the stage recorded it; the terminate runs
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the stop itself: nothing raised
        raise_if_stopped()
        assert stop_under_way()
        first, later = end_stops()  # the run's end: what the CLI says
    assert first is BUDGET and later == [KeyboardInterrupt]
    assert stops_sentence(first, later) == (
        "Ctrl-C came while the run was already stopping for the budget cap "
        "(max_cost_usd 0.0500 USD): the first reason stands, the stop went on unchanged"
    )


def test_the_budget_cap_during_a_ctrl_c_stop_changes_nothing() -> None:
    with orderly_signals():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C stops the run
        assert not note_stop(BUDGET)  # the watch finds the cap reached during the stop
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()  # the slot still holds the Ctrl-C, not the budget's stop
        raise_if_stopped()  # and nothing after it
        assert not claim_stop(BUDGET)  # nor does the budget's own check raise
        first, later = end_stops()
    assert first is KeyboardInterrupt and later == [BUDGET]
    assert stops_sentence(first, later) == (
        "the budget cap (max_cost_usd 0.0500 USD) came while the run was already stopping "
        "for Ctrl-C: the first reason stands, the stop went on unchanged"
    )
    assert stops_sentence(first, []) is None  # a stop alone: the CLI says nothing more


def test_the_runs_end_empties_the_slot_for_the_next_stop() -> None:
    with orderly_signals():
        assert note_stop(BUDGET)
        end_stops(keep_pending=True)  # a run that starts keeps a stop no boundary raised
        assert stop_pending() and stop_under_way()
        end_stops()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the next run's Ctrl-C is its own
