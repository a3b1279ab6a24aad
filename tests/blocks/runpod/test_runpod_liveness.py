"""What RunPod says about a pod, and what the provider does with it (issue 14): the
liveness causes, terminate that stops at once when retrying cannot help, no create
carrying a deadline (RunPod never honoured ``terminateAfter``), and a stopped pod of the
run's name replaced, never adopted. Against the emulator over both APIs where they behave
alike (REST v2, and GraphQL through the real ``runpod`` SDK)."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from prefect_runpod.blocks.exceptions import PodGoneError, TerminateError
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import DeadmanConfig, PodCause, PodRequest
from prefect_runpod.blocks.runpod.lifecycle import status_from_pod
from tests.emulators.runpod_api import RunPodEmulator

pytestmark = pytest.mark.slow
BOTH = pytest.mark.parametrize("runpod_api", ["graphql", "v2"], indirect=True)
OPS = {
    "get": {"graphql": "pod", "v2": "getPod"},
    "terminate": {"graphql": "podTerminate", "v2": "deletePod"},
    "ended": {"graphql": "podTerminate", "v2": "DELETE /v2/pods"},
}


def _op(emu: RunPodEmulator, what: str) -> str:
    return OPS[what][emu.client_api]  # type: ignore[attr-defined]


def _name() -> str:
    return f"prft-{uuid.uuid4()}"


def _request(ssh_key, lifetime_seconds: float | None = None) -> PodRequest:  # type: ignore[no-untyped-def]
    deadman = DeadmanConfig(lifetime_seconds=lifetime_seconds) if lifetime_seconds else None
    return PodRequest(public_key=ssh_key.get_public_key(), deadman=deadman)


@pytest.mark.parametrize(
    ("pod", "cause"),
    [
        (None, PodCause.TERMINATED_OUTSIDE),
        ({"desiredStatus": "TERMINATED", "runtime": None}, PodCause.TERMINATED_OUTSIDE),
        ({"desiredStatus": "EXITED", "runtime": None}, PodCause.EXITED),
        ({"desiredStatus": "ERROR", "runtime": None}, PodCause.HOST_LOST),
        ({"desiredStatus": "DEAD", "runtime": None}, PodCause.HOST_LOST),
        ({"desiredStatus": "RUNNING", "runtime": {"ports": []}}, PodCause.ALIVE),
        ({"desiredStatus": "RUNNING", "runtime": None}, PodCause.STARTING),
        ({"desiredStatus": "RESTARTING", "runtime": None}, PodCause.STARTING),
    ],
)
def test_every_graphql_status_maps_to_a_cause(pod, cause) -> None:  # type: ignore[no-untyped-def]
    from prefect_runpod.blocks.runpod.graphql_api import record_from_graphql

    record = None if pod is None else record_from_graphql({"id": "abc123", **pod})
    assert status_from_pod("abc123", record).cause is cause


@pytest.mark.parametrize(
    ("status", "runtime", "cause"),
    [
        ("PROVISIONING", None, PodCause.STARTING),
        ("STARTING", None, PodCause.STARTING),
        ("RUNNING", {"uptime": 3}, PodCause.ALIVE),
        ("RUNNING", None, PodCause.STARTING),
        ("EXITED", None, PodCause.EXITED),
        ("ERROR", None, PodCause.HOST_LOST),
        ("TERMINATED", None, PodCause.TERMINATED_OUTSIDE),
    ],
)
def test_every_v2_status_maps_to_a_cause(status, runtime, cause) -> None:  # type: ignore[no-untyped-def]
    from prefect_runpod.blocks.runpod.v2_models import V2Pod

    record = V2Pod(id="abc123", status=status, runtime=runtime).record()
    assert status_from_pod("abc123", record).cause is cause


@BOTH
class TestStatus:
    def test_alive_then_exited_then_gone(
        self, runpod_emulator: RunPodEmulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        try:
            assert provider.status(handle.pod_id).cause is PodCause.ALIVE
            runpod_emulator.pods[handle.pod_id].status = "EXITED"
            assert provider.status(handle.pod_id).cause is PodCause.EXITED
            runpod_emulator.pods[handle.pod_id].status = "ERROR"
            assert provider.status(handle.pod_id).cause is PodCause.HOST_LOST
            runpod_emulator.vanish(handle.pod_id)
            gone = provider.status(handle.pod_id)
            assert (
                gone.cause is PodCause.TERMINATED_OUTSIDE
                and "no longer knows" in gone.provider_status
            )
        finally:
            provider.terminate(handle.pod_id)

    def test_an_unanswered_status_is_unknown_never_gone(
        self, runpod_emulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        try:
            runpod_emulator.faults.http_5xx[_op(runpod_emulator, "get")] = 1
            status = provider.status(handle.pod_id)
            assert status.cause is PodCause.UNKNOWN and not status.gone
        finally:
            provider.terminate(handle.pod_id)

    def test_a_watch_sees_a_pod_terminated_outside_and_says_so_in_one_sentence(
        self, runpod_emulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        watch = PodWatch(provider, handle.pod_id, poll_seconds=0.2).start()
        try:
            assert watch.check_now().cause is PodCause.ALIVE
            runpod_emulator.vanish(handle.pod_id)
            with pytest.raises(PodGoneError, match="terminated outside this run") as info:
                watch.check_now()
            assert info.value.cause == "terminated_outside" and handle.pod_id in str(info.value)
            assert len(str(info.value).splitlines()) == 1
        finally:
            watch.stop()
            provider.terminate(handle.pod_id)

    def test_a_ready_pod_whose_runtime_goes_away_has_lost_its_host(
        self, runpod_emulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        watch = PodWatch(provider, handle.pod_id, poll_seconds=3600)
        try:
            runpod_emulator.faults.slow_boot_seconds = 10**6  # runtime: null again
            watch.ask()
            with pytest.raises(PodGoneError, match="lost its host") as info:
                watch.check_now()
            assert info.value.cause == "host_lost"
        finally:
            runpod_emulator.faults.slow_boot_seconds = 0
            provider.terminate(handle.pod_id)


@BOTH
class TestTerminateStopsWhenRetryingCannotHelp:
    def test_a_validation_answer_is_one_call_and_runpods_message(
        self, runpod_emulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        """Issue 14: 27 ``podTerminate`` calls over 121 s, all HTTP 400 — now one."""
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        answer = 'Syntax Error: Expected ":", found String "x".'
        runpod_emulator.faults.terminate_errors = [answer]
        before = len(runpod_emulator.requests)
        with pytest.raises(TerminateError, match=re.escape(answer)) as info:
            provider.terminate(handle.pod_id, timeout_seconds=60)
        op = _op(runpod_emulator, "terminate")
        calls = [r for r in runpod_emulator.requests[before:] if r.get("operation") == op]
        assert len(calls) == 1
        assert "may still be billing" in str(info.value)
        assert f"prefect-runpod terminate --provider runpod {handle.pod_id}" in str(info.value)
        provider.terminate(handle.pod_id)

    def test_a_transient_answer_is_retried_until_the_deadline(
        self, runpod_emulator, runpod_blocks, runpod_provider
    ) -> None:  # type: ignore[no-untyped-def]
        provider = runpod_provider()
        handle = provider.create(_request(runpod_blocks[2]), _name())
        runpod_emulator.faults.terminate_fail_n = 3
        result = provider.terminate(handle.pod_id, timeout_seconds=60)
        assert result.attempts == 4 and not result.already_gone


def test_the_cli_refuses_an_id_with_a_newline_before_any_call(
    runpod_emulator, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    from prefect_runpod.flows.cli import EXIT_USAGE, main

    monkeypatch.setenv("RUNPOD_API_KEY", runpod_emulator.api_key)
    before = len(runpod_emulator.requests)
    assert main(["terminate", "--provider", "runpod", "abcdefgh\n"]) == EXIT_USAGE
    assert "is not a pod id" in capsys.readouterr().err
    assert len(runpod_emulator.requests) == before


@BOTH
def test_no_create_carries_a_deadline_and_none_ends_a_pod(
    runpod_emulator, runpod_blocks, runpod_provider
) -> None:  # type: ignore[no-untyped-def]
    """RunPod never acted on GraphQL's ``terminateAfter`` and REST v2 has none: neither
    create sends one, the handle keeps only the dead-man lifetime (for the reaper's TTL),
    and the emulator's clock passing that lifetime ends nothing."""
    provider = runpod_provider()
    handle = provider.create(_request(runpod_blocks[2], lifetime_seconds=3600), _name())
    try:
        sent = [
            json.dumps(r.get("body")) + r.get("query", "")
            for r in runpod_emulator.requests
            if r.get("operation") == "createPod" or "podFindAndDeployOnDemand" in r.get("query", "")
        ]
        assert len(sent) == 1 and "terminateAfter" not in sent[0]
        assert handle.lifetime_seconds == 3600 and not hasattr(handle, "terminate_after")
        assert provider.attempts == [f"NVIDIA GeForce RTX 3090/SECURE: created {handle.pod_id}"]
        assert provider.list("prft")[0].lifetime_seconds == 3600  # recorded on the pod
        runpod_emulator.clock = lambda: time.time() + 7200
        assert provider.status(handle.pod_id).cause is PodCause.ALIVE
        assert handle.pod_id not in runpod_emulator.ended
    finally:
        runpod_emulator.clock = time.time
        provider.terminate(handle.pod_id)


@BOTH
def test_an_exited_pod_of_our_name_is_terminated_and_replaced_in_the_same_attempt(
    runpod_emulator, runpod_blocks, runpod_provider
) -> None:  # type: ignore[no-untyped-def]
    provider = runpod_provider()
    name = _name()
    first = provider.create(_request(runpod_blocks[2]), name)
    runpod_emulator.pods[first.pod_id].status = "EXITED"
    again = runpod_provider()
    fresh = again.create(_request(runpod_blocks[2]), name)
    try:
        assert fresh.pod_id != first.pod_id
        assert runpod_emulator.ended[first.pod_id].how == _op(runpod_emulator, "ended")
        assert again.attempts[0].startswith(f"replaced {first.pod_id}")
        assert again.wait_ready(fresh, 180).pod_id == fresh.pod_id
    finally:
        again.terminate(fresh.pod_id)


@BOTH
def test_two_pods_at_once_each_reached_by_its_own_user(
    runpod_emulator, runpod_blocks, runpod_provider
) -> None:  # type: ignore[no-untyped-def]
    """The gateway routes each login to the pod its user (podHostId) names."""
    from prefect_runpod.blocks.console.session import PodConsole

    _, _, ssh_key = runpod_blocks
    provider = runpod_provider()
    handles = [
        provider.wait_ready(provider.create(_request(ssh_key), _name()), 180) for _ in range(2)
    ]
    try:
        consoles = [PodConsole.for_pod(h, ssh_key.get_private_key()) for h in handles]
        for console in consoles:
            console.connect()
        for handle, console in zip(handles, consoles, strict=True):
            assert console.run("echo $RUNPOD_POD_ID").output.strip() == handle.pod_id
        for console in consoles:
            console.close()
        assert {link.pod_id for link in runpod_emulator.links} == {h.pod_id for h in handles}
    finally:
        for handle in handles:
            provider.terminate(handle.pod_id)
