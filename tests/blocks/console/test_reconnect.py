"""Waiting out a pod's SSH outage: one budget, backoff, the provider asked before each
retry, and stages that run the cut-off step again (#13).

The policy itself runs on a fake clock (exact attempts and pauses, no real waiting);
the provider views and the console run against the RunPod emulator, whose gateway can
refuse connections for a while, and against local pods.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.console.launcher_client import kill_training
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy, Resuming, resuming
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import ConsoleConnectError, PodGoneError, SpecError
from prefect_runpod.blocks.local_pod.registry import read_record
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import PodCause, PodRequest, PodStatus, TerminateResult
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.local_pod import PodFixture


@dataclass
class FakeTime:
    """A clock that only moves when something sleeps."""

    now: float = 0.0
    slept: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _failing(times: int, error: Callable[[], Exception]) -> Callable[[], str]:
    calls = {"n": 0}

    def attempt() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise error()
        return f"ok after {calls['n']}"

    attempt.calls = calls  # type: ignore[attr-defined]
    return attempt


def _status(cause: PodCause) -> PodStatus:
    return PodStatus(pod_id="p", cause=cause, provider_status=f"said {cause.value}")


@dataclass
class _RunningProvider:
    """A provider that says the pod runs, and confirms a terminate."""

    provider_name: str = "fake"
    terminated: list[str] = field(default_factory=list)

    def status(self, pod_id: str) -> PodStatus:
        return _status(PodCause.TERMINATED_OUTSIDE if self.terminated else PodCause.ALIVE)

    def terminate(self, pod_id: str, timeout_seconds: float = 120.0) -> TerminateResult:
        self.terminated.append(pod_id)
        return TerminateResult(pod_id=pod_id, confirmed_at=datetime.now(UTC))


def _refused() -> ConsoleConnectError:
    return ConsoleConnectError("pod p: could not connect (connection refused)", pod_id="p")


class TestReconnectPolicy:
    def test_waits_out_a_refusing_gateway_with_backoff_asking_each_time(self) -> None:
        fake = FakeTime()
        asked: list[str] = []

        def status() -> PodStatus:
            asked.append("?")
            return _status(PodCause.ALIVE)

        policy = ReconnectPolicy(status=status, sleep=fake.sleep, clock=fake.clock)
        attempt = _failing(4, _refused)
        assert policy.call(attempt, pod_id="p", what="SSH") == "ok after 5"
        assert fake.slept == [0.5, 1.0, 2.0, 4.0]
        assert len(asked) == 4  # before each retry

    def test_a_pod_that_is_gone_ends_the_wait_at_once(self) -> None:
        fake = FakeTime()
        policy = ReconnectPolicy(
            status=lambda: _status(PodCause.TERMINATED_OUTSIDE), sleep=fake.sleep, clock=fake.clock
        )
        attempt = _failing(100, _refused)
        with pytest.raises(PodGoneError, match="pod p was terminated outside this run") as info:
            policy.call(attempt, pod_id="p", what="SSH")
        assert attempt.calls["n"] == 1 and fake.slept == []  # type: ignore[attr-defined]
        assert info.value.cause == "terminated_outside"

    def test_ssh_down_for_the_whole_budget_while_the_provider_says_it_runs_is_a_lost_host(
        self,
    ) -> None:
        """Issues 14 and 23: the gateway dead past the reconnect budget while the provider
        says RUNNING → unreachable: the watch terminates the pod, and once the provider
        confirmed it gone the pod is lost (host_lost)."""
        fake = FakeTime()
        provider = _RunningProvider()
        watch = PodWatch(provider, "p", poll_seconds=3600)  # type: ignore[arg-type]
        policy = ReconnectPolicy(
            budget_seconds=20.0,
            status=watch.ask,
            unreachable=watch.unreachable,
            sleep=fake.sleep,
            clock=fake.clock,
        )
        with pytest.raises(PodGoneError, match="lost its host") as info:
            policy.call(_failing(100, _refused), pod_id="p", what="SSH")
        assert info.value.cause == "host_lost" and provider.terminated == ["p"]
        assert "did not answer for 20 s" in str(info.value)
        # issue 24: the pod is gone already, so the sentence says who ended it, not
        # that the run "ends the pod"
        assert "; the run stopped waiting for it: the run itself had ended it, confirmed gone at" in str(info.value)  # fmt: skip
        assert "ends the pod" not in str(info.value)

    def test_a_gone_pod_seen_during_the_runs_own_terminate_is_the_runs_end(self) -> None:
        """Issue 24: another thread (the background poll, a follower's reconnect) asks
        the provider while the watch terminates an unreachable pod and finds it gone: the
        loss is the run's own terminate of a host lost, never "terminated outside this
        run" (which a frozen pod's run used to fail with)."""
        provider = _RunningProvider()
        watch = PodWatch(provider, "p", poll_seconds=3600)  # type: ignore[arg-type]
        seen: list[PodStatus] = []
        terminate = provider.terminate

        def terminate_and_ask(pod_id: str, timeout_seconds: float = 120.0) -> TerminateResult:
            ended = terminate(pod_id, timeout_seconds)
            seen.append(watch.ask(fresh=True))  # the provider says gone now
            return ended

        provider.terminate = terminate_and_ask  # type: ignore[method-assign]
        error = watch.unreachable(20.0)
        assert isinstance(error, PodGoneError) and provider.terminated == ["p"]
        assert [s.cause for s in seen] == [PodCause.HOST_LOST]
        assert watch.lost is not None and (watch.lost.cause, watch.lost.ended_by) == (
            PodCause.HOST_LOST, "flow",
        )  # fmt: skip
        assert "outside this run" not in str(error) and "the run itself had ended it" in str(error)
        assert "did not answer for 20 s" in str(error)

    def test_without_a_watch_a_spent_budget_decides_no_loss(self) -> None:
        """Only the pod watch gives the unreachable verdict (it can terminate and confirm);
        a policy without one gives up with the connect error."""
        fake = FakeTime()
        policy = ReconnectPolicy(
            budget_seconds=20.0,
            status=lambda: _status(PodCause.ALIVE),
            sleep=fake.sleep,
            clock=fake.clock,
        )
        with pytest.raises(ConsoleConnectError, match=r"gave up after waiting 20 s"):
            policy.call(_failing(100, _refused), pod_id="p", what="SSH")

    def test_an_unknown_status_keeps_waiting_until_the_budget(self) -> None:
        fake = FakeTime()
        policy = ReconnectPolicy(
            budget_seconds=20.0,
            status=lambda: _status(PodCause.UNKNOWN),
            sleep=fake.sleep,
            clock=fake.clock,
        )
        with pytest.raises(ConsoleConnectError, match=r"gave up after waiting 20 s of a 20 s"):
            policy.call(_failing(100, _refused), pod_id="p", what="SSH")
        assert fake.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 4.5]  # the last pause ends at 20 s

    def test_a_refused_key_or_host_key_is_never_waited_for(self) -> None:
        fake = FakeTime()
        policy = ReconnectPolicy(status=lambda: pytest.fail("asked"), sleep=fake.sleep)
        attempt = _failing(1, lambda: ConsoleConnectError("host key changed", retryable=False))
        with pytest.raises(ConsoleConnectError, match="host key changed"):
            policy.call(attempt, pod_id="p", what="SSH")
        assert fake.slept == []

    @pytest.mark.parametrize("field_name", ["budget_seconds", "initial_delay_seconds"])
    def test_a_budget_must_be_positive(self, field_name: str) -> None:
        with pytest.raises(SpecError, match=field_name):
            ReconnectPolicy(**{field_name: 0.0})


@dataclass
class _DroppingConsole:
    """A console whose first runs fail as a dropped connection does."""

    drops: int
    retryable: bool = True
    runs: int = 0

    def run(self, command: str, *, timeout_seconds: float = 60.0, check: bool = False):  # type: ignore[no-untyped-def]
        self.runs += 1
        if self.runs <= self.drops:
            raise ConsoleConnectError("the SSH session dropped", retryable=self.retryable)
        return f"ran {command}"

    def set_secret_env(self, name: str, value: SecretStr) -> None: ...

    def reconnect(self, *, spent_seconds: float = 0.0) -> None: ...


class TestResuming:
    def test_a_step_cut_off_by_a_drop_runs_again(self) -> None:
        console = _DroppingConsole(drops=2)
        slept: list[float] = []
        assert Resuming(console, 60.0, sleep=slept.append).run("probe") == "ran probe"
        assert console.runs == 3 and slept == [0.5, 0.5]

    def test_it_gives_up_after_the_budget_and_never_on_a_permanent_error(self) -> None:
        with pytest.raises(ConsoleConnectError):
            Resuming(_DroppingConsole(drops=10**9), 0.0, sleep=lambda s: None).run("probe")
        console = _DroppingConsole(drops=5, retryable=False)
        with pytest.raises(ConsoleConnectError):
            resuming(console).run("probe")
        assert console.runs == 1


# --- real providers and a real gateway -------------------------------------------------


@pytest.mark.slow
def test_the_local_provider_says_when_a_pod_is_gone(local_pod: PodFixture) -> None:
    provider, handle, _ = local_pod
    assert provider.status(handle.pod_id).cause is PodCause.ALIVE
    record = read_record(provider.home, handle.pod_id)
    assert record is not None
    os.kill(record.pid, signal.SIGKILL)  # the daemon dies: the pod is lost
    wait_until(  # until the kernel reaps it: a dying daemon still has its environment
        "the dead daemon to read as a lost host",
        lambda: provider.status(handle.pod_id).cause is PodCause.HOST_LOST,
        timeout_seconds=120,
        step_seconds=0.05,
    )
    provider.terminate(handle.pod_id)
    assert provider.status(handle.pod_id).cause is PodCause.TERMINATED_OUTSIDE


@pytest.fixture
def emulated_pod(runpod_emulator, runpod_provider):  # type: ignore[no-untyped-def]
    """A ready pod of the RunPod emulator, reached through its gateway."""
    provider = runpod_provider()
    public_key = provider.ssh_key.get_public_key()
    handle = provider.create(PodRequest(public_key=public_key), "prft-reconnect")
    handle = provider.wait_ready(handle, 180)
    try:
        yield runpod_emulator, provider, handle, provider.ssh_key.get_private_key()
    finally:
        provider.terminate(handle.pod_id)


@pytest.mark.slow
def test_the_runpod_provider_says_alive_unknown_and_gone(emulated_pod) -> None:  # type: ignore[no-untyped-def]
    emulator, provider, handle, _ = emulated_pod
    assert provider.status(handle.pod_id).cause is PodCause.ALIVE
    emulator.faults.http_5xx["getPod" if emulator.client_api == "v2" else "pod"] = 1
    assert provider.status(handle.pod_id).cause is PodCause.UNKNOWN
    emulator.vanish(handle.pod_id)
    assert provider.status(handle.pod_id).gone


@pytest.mark.slow
def test_a_console_waits_out_a_refusing_gateway(emulated_pod) -> None:  # type: ignore[no-untyped-def]
    """#13: after ready, a gateway refusing connections for a few seconds failed the
    stage at the first refusal. The outage is a count of refused connections, so the
    console meets all of it however slow the machine (the budget only guards a hang)."""
    emulator, provider, handle, key = emulated_pod
    policy = ReconnectPolicy(budget_seconds=300, status=lambda: provider.status(handle.pod_id))
    emulator.refuse_next_connections(2)
    with PodConsole.for_pod(handle, key, reconnect=policy) as console:
        assert console.run("echo through").output == "through"
        assert emulator.refused_connections == 2  # both waited out
        # A later outage mid-stage: the link drops and the gateway refuses for a while;
        # the step runs again once it is back.
        emulator.refuse_next_connections(2)
        transport = console._client.get_transport()  # noqa: SLF001 - the test cuts the link
        assert transport is not None
        transport.close()
        assert resuming(console).run("echo again").output == "again"
    assert emulator.refused_connections == 4


@pytest.mark.slow
def test_a_vanished_pod_is_noticed_at_the_first_retry(emulated_pod) -> None:  # type: ignore[no-untyped-def]
    emulator, provider, handle, key = emulated_pod
    policy = ReconnectPolicy(budget_seconds=300, status=lambda: provider.status(handle.pod_id))
    emulator.refuse_connections_for(300.0)
    emulator.vanish(handle.pod_id)
    with pytest.raises(PodGoneError, match=handle.pod_id):
        PodConsole.for_pod(handle, key, reconnect=policy).connect()
    assert emulator.refused_connections == 1  # no second attempt: the provider said gone


def test_the_kill_path_uses_the_runs_budget_not_300_s() -> None:
    """#13: train's kill path hard-coded 300 s of reconnecting."""
    console = _DroppingConsole(drops=10**9)
    with pytest.raises(Exception, match=r"console stayed down for \d+ s"):
        kill_training(console, "/run", "/tools", reconnect_budget_seconds=0.2, grace_seconds=1)
