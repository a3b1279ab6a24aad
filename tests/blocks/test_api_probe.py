"""The run's probe of the Prefect API at its boundaries (``blocks.api_probe``), against
the session's real Prefect test server behind a port the test takes down: an outage
that begins while nothing is written is told once, its end once, each check on a thread
of its own; no check while the outbox holds a write (that write tells it) or sooner than
the interval; nothing at all where no run switched the probe on."""

from __future__ import annotations

import contextvars
import threading

import pytest

from prefect_runpod.blocks import api_probe
from prefect_runpod.blocks.api_outbox import ApiOutbox
from prefect_runpod.blocks.api_probe import ApiProbe, probe_api
from tests.fixtures.prefect_outage import ApiSwitch

DEADLINE = 120.0
"""A hang guard: every wait below ends on an event long before."""


def _ran(thread: threading.Thread | None) -> None:
    assert thread is not None and thread is not threading.current_thread()
    thread.join(DEADLINE)
    assert not thread.is_alive()


def test_an_outage_without_writes_is_told_once_and_its_end_once(api_switch: ApiSwitch) -> None:
    said: list[str] = []
    box = ApiOutbox(say=said.append)
    probe = ApiProbe(box, contextvars.copy_context(), interval_seconds=0.0)
    _ran(probe())  # the API answers: nothing to tell
    assert said == [] and box.down_since is None
    api_switch.down()
    _ran(probe())
    _ran(probe())  # still down: told once
    assert box.down_since is not None and len(said) == 1, said
    assert said[0].startswith("the Prefect API does not answer (ConnectError")
    api_switch.up()
    _ran(probe())
    _ran(probe())
    assert box.down_since is None and len(said) == 2, said
    assert said[1].startswith("the Prefect API answers again after ")
    assert probe.checks == 5


def test_a_chunk_checks_after_the_interval_a_stage_end_at_once_and_never_over_a_write(
    api_switch: ApiSwitch,
) -> None:
    now = [100.0]
    box = ApiOutbox(say=lambda line: None)
    found: list[None] = []
    running, go_on = threading.Event(), threading.Event()

    def check() -> None:
        found.append(None)  # the API answers
        running.set()
        go_on.wait(DEADLINE)

    probe = ApiProbe(
        box, contextvars.copy_context(), interval_seconds=2.0, check=check, clock=lambda: now[0]
    )
    first = probe()
    assert first is not None and running.wait(DEADLINE)
    assert probe() is None  # a chunk, less than the interval after the last check
    assert probe(now=True) is None  # a stage's end while a check runs: it follows that one
    go_on.set()
    _ran(first)
    assert probe.checks == 2 and len(found) == 2
    _ran(probe(now=True))  # a stage's end: at once, whatever the interval
    now[0] += 2.0
    gate = threading.Event()
    box.put("a held write", lambda client: gate.wait(DEADLINE))
    try:
        assert probe() is None and probe(now=True) is None  # the held write tells it
    finally:
        gate.set()
    assert box.drain(DEADLINE) == []
    _ran(probe())
    assert probe.checks == 4 and len(found) == 4


def test_no_probe_where_no_run_switched_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_probe, "_PROBE", None)
    before = threading.active_count()
    probe_api()  # a stage's unit test, a transfer outside a run: no check, no thread
    assert threading.active_count() == before
