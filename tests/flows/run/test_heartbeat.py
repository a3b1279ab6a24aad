"""The flow keeps the pod's heartbeat fresh through every stage (dead-man switch)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prefect_runpod.flows.run.heartbeat import HeartbeatKeeper, heartbeat_interval_seconds


@pytest.mark.parametrize(
    ("stale", "expected"), [(900.0, 60.0), (90.0, 30.0), (3.0, 1.0), (0.3, 0.5)]
)
def test_interval_is_a_third_of_the_staleness_within_bounds(stale, expected):
    assert heartbeat_interval_seconds(stale) == pytest.approx(expected)


@pytest.mark.slow
def test_keeper_touches_the_file_until_stopped(local_pod):
    _, handle, keypair = local_pod
    path = Path(handle.workdir) / "heartbeat"
    keeper = HeartbeatKeeper(handle, keypair.private_key, str(path), 0.5).start()
    try:
        deadline = time.monotonic() + 180
        while keeper.touches < 3:
            assert time.monotonic() < deadline, "the heartbeat was not refreshed"
            time.sleep(0.1)
        assert path.exists()
    finally:
        keeper.stop(timeout_seconds=120)  # a touch under way may finish first
    # Its thread has ended (not just paused between touches): nothing touches any more.
    assert not keeper._thread.is_alive(), "a stopped keeper must not touch any more"  # noqa: SLF001
