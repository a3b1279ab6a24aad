"""A cancel asked for in Prefect reaches the run through its own watch of its state: the
stop is noted once the flow run is Cancelling or Cancelled, raised at the next boundary,
said in one sentence, shares the stop slot with Ctrl-C and the budget (the first reason
wins), and never outlives the run. The whole path — a CLI run cancelled in Prefect — is
``tests/test_cli_signals.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from prefect_runpod.blocks.exceptions import CancelRequested
from prefect_runpod.blocks.interrupts import (
    end_stops,
    note_stop,
    raise_if_stopped,
    stop_pending,
    stops_sentence,
)
from prefect_runpod.flows.run.cancel_watch import CancelWatch, cancelled_state, end_words
from prefect_runpod.flows.run.ledger import stop_sentence


@pytest.fixture(autouse=True)
def _empty_slot() -> Iterator[None]:
    end_stops()
    yield
    end_stops()


class _States:
    """The flow run's state types, one per read (the last one repeats), and the reads."""

    def __init__(self, *states: str | None) -> None:
        self.states = list(states)
        self.reads: list[str] = []
        self.read_twice = threading.Event()

    def __call__(self, flow_run_id: str) -> str | None:
        self.reads.append(flow_run_id)
        if len(self.reads) >= 2:
            self.read_twice.set()
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def _wait(predicate, seconds: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "the watch did not get there"
        time.sleep(0.01)


@pytest.mark.parametrize("state", ["CANCELLING", "CANCELLED"])
def test_a_cancelling_run_is_stopped_at_its_next_boundary(state: str) -> None:
    states = _States(None, "RUNNING", state)  # an unanswered read, then the run, then the cancel
    watch = CancelWatch("run-1", interval_seconds=0.01, read_state=states).start()
    try:
        _wait(lambda: watch.noted)
        assert states.reads[:3] == ["run-1"] * 3
        with pytest.raises(CancelRequested) as stopped:
            raise_if_stopped()
        assert stopped.value.flow_run_id == "run-1"
        assert stop_sentence(stopped.value, "train", 4.12) == (
            "stopped by a cancel in Prefect during train (4.1 s into the stage); the run ends its pod"
        )
    finally:
        watch.stop()


def test_a_run_that_is_not_cancelled_is_never_stopped() -> None:
    states = _States("RUNNING", None)  # running, then the API stops answering
    watch = CancelWatch("run-2", interval_seconds=0.01, read_state=states).start()
    try:
        assert states.read_twice.wait(30.0)
        _wait(lambda: len(states.reads) >= 5)
        assert not watch.noted and not stop_pending()
    finally:
        watch.stop()
    raise_if_stopped()  # nothing to raise


def test_a_cancel_no_boundary_raised_does_not_reach_the_next_run() -> None:
    states = _States("CANCELLING")
    watch = CancelWatch("run-3", interval_seconds=0.01, read_state=states).start()
    _wait(lambda: watch.noted)
    watch.stop()  # the run ended (its pod is ended next): the noted stop is forgotten
    assert not stop_pending()
    raise_if_stopped()


def test_a_ctrl_c_first_keeps_its_reason_and_the_cancel_is_said() -> None:
    assert note_stop(KeyboardInterrupt)
    watch = CancelWatch("run-4", interval_seconds=0.01, read_state=_States("CANCELLING"))
    watch.start()
    try:
        _wait(lambda: watch.noted)
        with pytest.raises(KeyboardInterrupt):
            raise_if_stopped()
    finally:
        watch.stop()
    assert stops_sentence(*end_stops()) == (
        "a cancel in Prefect came while the run was already stopping for Ctrl-C: the first "
        "reason stands, the stop went on unchanged"
    )


def test_the_cancelled_state_names_the_stage_and_the_pods_end() -> None:
    said = (
        "stopped by a cancel in Prefect during upload (2.0 s into the stage); the run ends its pod"
    )
    state = cancelled_state({"error": said, "pod_id": "p9", "terminated": True})
    assert state.is_cancelled()
    assert state.message == (
        "stopped by a cancel in Prefect during upload (2.0 s into the stage); pod p9 was ended"
    )
    assert end_words({"pod_id": None}) == "no pod was created"
    assert end_words({"pod_id": "p9", "terminated": False}) == (
        "pod p9 may still be billing: `prefect-runpod terminate p9` ends it"
    )
