"""A Ctrl-C raised inside a weakref callback during garbage collection is dropped by
CPython (reported as unraisable); the stop noted by the CLI's handler is raised again at
the next boundary of a waiting loop, so the run still ends with 130."""

from __future__ import annotations

import gc
import signal
import threading
import weakref

import pytest

from prefect_runpod.blocks import faults
from prefect_runpod.blocks.interrupts import raise_if_stopped, stop_pending
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
