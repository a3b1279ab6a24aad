"""A frozen pod (its SSH daemon SIGSTOPped: the socket stays open, nothing answers) is
given up within the run's reconnect budget counted from the first command that got no
answer, not from the moment a 60 s command timeout fired; a reconnect waits only what is
left of that budget, each connect attempt bounded by it; and paramiko's own report of the
failure (``Error reading SSH protocol banner`` with its traceback) never reaches a
handler above debug (issue 24)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from prefect_runpod.blocks.console.launcher_client import LogFollower
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import ConsoleConnectError, TrainingError
from tests.fixtures.sshd import SshdServer, run_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

BUDGET = 4.0
"""The reconnect budget (s) the tests give: the pod's SSH stays frozen for longer."""

_STATE = """printf '{"state": "running"}\\n'"""


def _server_processes(server: SshdServer) -> list[psutil.Process]:
    """The sshd listening for ``server`` and every process under it (its sessions)."""
    config = str(server.root / "sshd_config")
    listeners = [p for p in psutil.process_iter(["cmdline"]) if config in (p.info["cmdline"] or [])]
    return [proc for p in listeners for proc in (p, *p.children(recursive=True))]


@contextlib.contextmanager
def _frozen(server: SshdServer) -> Iterator[None]:
    """SIGSTOP the server and its sessions for the block, SIGCONT afterwards."""
    procs = _server_processes(server)
    assert procs, "the test's sshd is not running"
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[SshdServer]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("no /usr/sbin/sshd")
    with run_sshd(tmp_path / "sshd") as server:
        yield server


def test_a_frozen_pod_is_given_up_within_the_budget_from_its_first_silence(
    own_sshd: SshdServer, caplog: pytest.LogCaptureFixture
) -> None:
    policy = ReconnectPolicy(budget_seconds=BUDGET)
    console = PodConsole(
        own_sshd.endpoint(), own_sshd.client_key.private_key, pod_id="frozen", reconnect=policy
    )
    follower = LogFollower(
        console, "/nowhere", "/nowhere", pod_id="frozen", reconnect_budget_seconds=BUDGET
    )
    with console:
        assert follower.call(_STATE, "state") == {"state": "running"}
        caplog.set_level(logging.WARNING)
        with _frozen(own_sshd):
            started = time.monotonic()
            with pytest.raises(TrainingError, match="the console stayed down for"):
                follower.call(_STATE, "state")  # once asked 60 s of the frozen pod
            waited = time.monotonic() - started
            # The command's silence used the whole budget: no reconnect was started after it.
            assert follower.reconnects == 0
            print(f"frozen pod given up after {waited:.1f} s ({waited / BUDGET:.2f} x the budget)")

            # A reconnect that the outage has already used most of the budget for waits
            # only the rest: each attempt is bounded by it (1 s at least).
            started = time.monotonic()
            with pytest.raises(ConsoleConnectError, match="reconnect budget"):
                console.reconnect(spent_seconds=BUDGET - 1.0)
            print(f"reconnect with 1 s left gave up after {time.monotonic() - started:.1f} s")
    loud = [
        r for r in caplog.records if r.name.startswith("paramiko") and r.levelno > logging.DEBUG
    ]
    assert not loud, [r.getMessage() for r in loud]
