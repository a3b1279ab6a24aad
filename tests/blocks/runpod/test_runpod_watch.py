"""The pod watch over REST v2 (issue 23 §5): its three verdicts — lost, unreachable,
degraded — with the shared pod-list read behind them (ten watched runs of one account
read one ``GET /v2/pods`` per interval and stay under RunPod's 60 a minute), and boot
failures named from the pod's ``system`` log. Pods that need no SSH are the emulator's
hollow pods (no local pod behind them), so ten of them cost nothing to make."""

from __future__ import annotations

import uuid

import pytest

from prefect_runpod.blocks.exceptions import ConsoleConnectError, PodGoneError, PodTimeoutError
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import PodCause, PodEnd, PodRequest, PodStatus
from prefect_runpod.blocks.provider import TerminateResult as Ended
from prefect_runpod.blocks.runpod.poller import poller_for
from prefect_runpod.blocks.runpod.provider import RunPodProvider
from prefect_runpod.flows.run.end import flow_end
from tests.emulators.runpod_api import RunPodEmulator
from tests.fixtures.fault_matrix import wait_until
from tests.fixtures.runpod_emulator import blocks_for

V2 = pytest.mark.parametrize("runpod_api", ["v2"], indirect=True)
RUNPODS_QUOTA = {"minute": (60, 60.0), "hour": (3000, 3600.0), "day": (50000, 86400.0)}
"""RunPod's published policy (``RateLimit-Policy: "minute";q=60;w=60, …``)."""


def _name() -> str:
    return f"prft-{uuid.uuid4()}"


def _end_all(emu: RunPodEmulator, pods: list[str]) -> None:
    for pod_id in pods:
        emu.end_pod(pod_id, "test teardown")


@V2
def test_ten_watched_runs_share_one_list_read_per_interval_and_still_see_a_loss(
    runpod_emulator: RunPodEmulator,
) -> None:
    """Ten runs in one process, each with its own provider, under RunPod's quota of 60 a
    minute: no 429, one list read per interval for all of them, and the pod that goes is
    noticed within two of its watch's asks — two poll intervals — of its end (before: one
    ``GET /v2/pods/{id}`` per watch per interval, ten times the requests, past the quota
    in seconds)."""
    emu = runpod_emulator
    emu.v2.quota = dict(RUNPODS_QUOTA)
    credentials, spec, ssh_key = blocks_for(emu)
    pods = [emu.hollow_pod(_name()) for _ in range(10)]
    providers = [RunPodProvider(credentials, spec, ssh_key) for _ in pods]
    poller = poller_for(providers[0].api)
    noticed: dict[str, int] = {}

    def on_lost(status: PodStatus) -> None:  # how many asks its watch had made by then
        watch = next(w for w in watches if w.pod_id == status.pod_id)
        noticed.setdefault(status.pod_id, watch.polls)

    watches = [
        PodWatch(provider, pod_id, poll_seconds=0.3, on_lost=on_lost).start()
        for provider, pod_id in zip(providers, pods, strict=True)
    ]
    try:
        wait_until(
            "every watch to ask three times", lambda: min(w.polls for w in watches) >= 3, 120
        )
        gone = pods[3]
        asks_before = watches[3].polls
        emu.end_pod(gone, "terminated in RunPod's console")
        wait_until("the watch to notice its pod gone", lambda: gone in noticed, 120)
        assert noticed[gone] - asks_before <= 2, (noticed[gone], asks_before)
        lost = [w for w in watches if w.lost is not None]
        assert [w.pod_id for w in lost] == [gone]
        assert lost[0].lost.cause is PodCause.TERMINATED_OUTSIDE  # type: ignore[union-attr]
    finally:
        for watch in watches:
            watch.stop()
        _end_all(emu, pods)
    lists = [r for r in emu.requests if r.get("operation") == "listPods"]
    assert emu.v2.answered_429 == 0
    assert len(lists) == poller.list_reads
    assert len(lists) * 5 <= sum(w.polls for w in watches), (len(lists), [w.polls for w in watches])
    assert len(emu.requests) < 60  # everything this minute's quota saw


@V2
def test_degraded_answers_are_counted_never_a_loss_and_a_later_watch_starts_at_zero(
    runpod_emulator: RunPodEmulator, runpod_provider, caplog
) -> None:  # type: ignore[no-untyped-def]
    """25 failed reads in streaks (SkyPilot counted such blips into 24 recoveries of a
    healthy job): each streak is logged once, the pod is never lost, and the watch of a
    later attempt counts from zero."""
    emu = runpod_emulator
    provider = runpod_provider()
    pod_id = emu.hollow_pod(_name())
    watch = PodWatch(provider, pod_id, poll_seconds=0.0)  # asked by hand: every ask reads
    try:
        for streak in (10, 10, 5):
            emu.faults.http_5xx["listPods"] = streak
            assert {watch.ask().cause for _ in range(streak)} == {PodCause.UNKNOWN}
            assert watch.ask().cause is PodCause.ALIVE
        assert watch.lost is None and watch.degraded == 25
        said = [r.getMessage() for r in caplog.records if "degraded" in r.getMessage()]
        assert len(said) == 3 and all(pod_id in s for s in said)
        later = PodWatch(provider, emu.hollow_pod(_name()), poll_seconds=0.0)
        assert later.ask().cause is PodCause.ALIVE and later.degraded == 0
    finally:
        _end_all(emu, list(emu.pods))


@V2
def test_unreachable_is_terminated_then_lost_and_an_outage_of_both_is_no_loss(
    runpod_emulator: RunPodEmulator, runpod_provider
) -> None:  # type: ignore[no-untyped-def]
    """SSH silent for the whole reconnect budget: with RunPod's API down too, nothing is
    decided (a connect error, the pod kept); with the API saying RUNNING, the run ends
    the pod, waits for RunPod to confirm it gone, and only then counts it lost."""
    emu = runpod_emulator
    provider = runpod_provider()
    pod_id = emu.hollow_pod(_name())
    watch = PodWatch(provider, pod_id, poll_seconds=3600)
    try:
        emu.faults.http_5xx["getPod"] = 1
        outage = watch.unreachable(120.0)
        assert isinstance(outage, ConsoleConnectError) and "not counted lost" in str(outage)
        assert pod_id in emu.pods and watch.lost is None
        lost = watch.unreachable(120.0)
        assert isinstance(lost, PodGoneError) and lost.cause == "host_lost"
        assert "did not answer for 120 s" in str(lost) and "confirmed gone" in str(lost)
        assert emu.ended[pod_id].how == "DELETE /v2/pods" and watch.lost is not None
        # the run's own terminate then finds it gone: the end is the run's, cause host lost
        end = flow_end(Ended(pod_id=pod_id, confirmed_at=watch.lost.ended_at, already_gone=True),  # type: ignore[arg-type]
                       watch.lost)  # fmt: skip
        assert isinstance(end, PodEnd) and (end.ended_by.value, end.cause) == ("flow", "host_lost")
    finally:
        _end_all(emu, list(emu.pods))


@V2
@pytest.mark.slow
@pytest.mark.parametrize(
    ("failure", "named"),
    [("image_pull", "the image could not be pulled"), ("no_ssh", "SSH did not start")],
)
def test_a_boot_failure_is_named_from_the_pods_system_log(
    runpod_emulator: RunPodEmulator, runpod_provider, failure: str, named: str
) -> None:  # type: ignore[no-untyped-def]
    """A pod whose image cannot be pulled (it never gets a runtime) or whose SSH never
    starts: the ready wait times out, names the cause from RunPod's ``system`` log, and
    terminates the pod."""
    emu = runpod_emulator
    emu.faults.boot_failure = failure
    provider = runpod_provider()
    handle = provider.create(PodRequest(public_key=provider.ssh_key.get_public_key()), _name())
    with pytest.raises(PodTimeoutError) as info:
        provider.wait_ready(handle, timeout_seconds=2.0)
    assert named in str(info.value) and "It was terminated." in str(info.value)
    assert handle.pod_id in emu.ended
