"""What only REST v2 does, through ``RunPodProvider`` against the emulator with GraphQL
(and v1) retired: a create whose answer is lost resolved by reading, never by creating
again; a pod listed late found by id; one cloud per create; "did you mean" for an
inexact GPU id; the shared pod-list poller."""

from __future__ import annotations

import threading
import uuid

import pytest

from prefect_runpod.blocks.exceptions import ProviderTransientError, SpecError
from prefect_runpod.blocks.provider import PodCause, PodRequest
from prefect_runpod.blocks.runpod.poller import PodListPoller
from prefect_runpod.blocks.runpod.provider import RunPodProvider
from tests.emulators.runpod_api import RunPodEmulator
from tests.fixtures.runpod_emulator import blocks_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("runpod_api", ["v2"], indirect=True),
]
R3090, R4090 = "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"


def _name() -> str:
    return f"prft-{uuid.uuid4()}"


def _creates(emu: RunPodEmulator) -> int:
    return sum(e.get("operation") == "createPod" for e in emu.requests)


def _request(runpod_blocks) -> PodRequest:  # type: ignore[no-untyped-def]
    return PodRequest(public_key=runpod_blocks[2].get_public_key())


def test_graphql_is_retired_and_never_asked(runpod_emulator, runpod_blocks, runpod_provider):  # type: ignore[no-untyped-def]
    provider = runpod_provider()
    assert provider.api_name == "v2" and runpod_emulator.retired == {"graphql", "v1"}
    handle = provider.wait_ready(provider.create(_request(runpod_blocks), _name()), 60)
    try:
        assert provider.status(handle.pod_id).cause is PodCause.ALIVE
    finally:
        provider.terminate(handle.pod_id)
    assert {e["path"] for e in runpod_emulator.requests} <= {
        "/v2/pods",
        f"/v2/pods/{handle.pod_id}",
        "/v2/catalog/gpus",
        "/v2/account/ssh-keys",
    }


def test_a_lost_create_answer_is_resolved_by_the_list_never_by_a_second_create(
    runpod_emulator, runpod_blocks, runpod_provider
):  # type: ignore[no-untyped-def]
    runpod_emulator.faults.create_answer_lost = 1
    runpod_emulator.faults.list_delay_seconds = 0.5  # and the pod shows in the list late
    provider, name = runpod_provider(), _name()
    handle = provider.create(_request(runpod_blocks), name)
    try:
        assert _creates(runpod_emulator) == 1 and list(runpod_emulator.pods) == [handle.pod_id]
        assert provider.attempts == [
            f"{R3090}/SECURE: answer_lost",
            f"{R3090}/SECURE: answer lost; found {handle.pod_id} by name",
        ]
        assert handle.name == name and handle.ssh is not None
    finally:
        provider.terminate(handle.pod_id)


def test_a_lost_create_whose_pod_never_shows_is_an_error_not_a_second_pod(
    runpod_emulator, runpod_blocks, runpod_provider
):  # type: ignore[no-untyped-def]
    runpod_emulator.faults.create_answer_lost = 1
    runpod_emulator.faults.list_delay_seconds = 3600
    provider = runpod_provider(create_resolve_seconds=0.3)
    with pytest.raises(ProviderTransientError, match="answer was lost.*not created again"):
        provider.create(_request(runpod_blocks), _name())
    assert _creates(runpod_emulator) == 1
    (pod_id,) = runpod_emulator.pods  # the one pod RunPod made: the reaper's, here ours
    provider.terminate(pod_id)


def test_a_pod_listed_late_is_read_by_id(runpod_emulator, runpod_blocks, runpod_provider):  # type: ignore[no-untyped-def]
    runpod_emulator.faults.list_delay_seconds = 3600
    provider, name = runpod_provider(), _name()
    handle = provider.create(_request(runpod_blocks), name)
    try:
        assert provider.find(name) is None  # not in the list yet
        assert provider.status(handle.pod_id).cause is PodCause.ALIVE  # by id: there
        assert provider.wait_ready(handle, 60).ssh is not None
    finally:
        provider.terminate(handle.pod_id)


def test_cloud_all_is_secure_then_community(runpod_emulator):  # type: ignore[no-untyped-def]
    credentials, spec, ssh_key = blocks_for(runpod_emulator, gpu_type_ids=[R4090], cloud_type="ALL")
    runpod_emulator.faults.capacity_first_n = 1
    provider = RunPodProvider(credentials, spec, ssh_key, retry_initial_delay_seconds=0.01)
    handle = provider.create(PodRequest(public_key=ssh_key.get_public_key()), _name())
    try:
        assert provider.attempts == [
            f"{R4090}/SECURE: capacity",
            f"{R4090}/COMMUNITY: created {handle.pod_id}",
        ]
        assert handle.cost_per_hr == 0.34  # the community price
        assert provider.gpu_prices() == {R4090: 0.34}  # ALL: the lowest
    finally:
        provider.terminate(handle.pod_id)


def test_an_inexact_gpu_id_is_refused_with_did_you_mean(runpod_emulator):  # type: ignore[no-untyped-def]
    credentials, spec, ssh_key = blocks_for(runpod_emulator, gpu_type_ids=["NVIDIA RTX 4090"])
    provider = RunPodProvider(credentials, spec, ssh_key)
    with pytest.raises(SpecError, match=f"did you mean {R4090}"):
        provider.create(PodRequest(public_key=ssh_key.get_public_key()), _name())
    assert _creates(runpod_emulator) == 0


def test_a_volume_under_ten_gb_is_refused_before_any_request(runpod_emulator):  # type: ignore[no-untyped-def]
    credentials, spec, ssh_key = blocks_for(runpod_emulator, volume_gb=5)
    with pytest.raises(SpecError, match="at least 10 GB"):
        RunPodProvider(credentials, spec, ssh_key).create(
            PodRequest(public_key=ssh_key.get_public_key()), _name()
        )
    assert runpod_emulator.requests == []


def test_watches_of_several_pods_share_one_list_read_per_interval(
    runpod_emulator, runpod_blocks, runpod_provider
):  # type: ignore[no-untyped-def]
    provider = runpod_provider()
    handles = [provider.create(_request(runpod_blocks), _name()) for _ in range(3)]
    now = [0.0]
    poller = PodListPoller(provider._api, interval_seconds=10.0, clock=lambda: now[0])
    try:
        before = len(runpod_emulator.requests)
        answers: list[PodCause] = []
        threads = [
            threading.Thread(target=lambda h=h: answers.append(poller.status(h.pod_id).cause))
            for h in handles * 4
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        asked = [e["operation"] for e in runpod_emulator.requests[before:]]
        assert answers == [PodCause.ALIVE] * 12 and asked == ["listPods"]
        runpod_emulator.vanish(handles[0].pod_id)
        assert poller.status(handles[1].pod_id).cause is PodCause.ALIVE  # same interval
        now[0] += 10.0
        lost = poller.status(handles[0].pod_id)  # a new read; absent: confirmed by id
        assert lost.cause is PodCause.TERMINATED_OUTSIDE
        asked = [e["operation"] for e in runpod_emulator.requests[before:]]
        assert asked == ["listPods", "listPods", "getPod"] and poller.list_reads == 2
    finally:
        for handle in handles:
            provider.terminate(handle.pod_id)


def test_placement_is_checked_before_renting_against_runpods_catalog(runpod_emulator):  # type: ignore[no-untyped-def]
    """Issue 23 §4, through preflight's one check (``tasks.preflight.check_placement``):
    a CUDA floor none of the spec's GPU types has hosts for, and a network volume outside
    the data centres asked for, are refused; nothing is created, the catalog is read."""
    from prefect_runpod.blocks.transfer.s3 import S3Target
    from prefect_runpod.tasks.preflight import check_placement

    def provider(**spec: object) -> RunPodProvider:
        return RunPodProvider(*blocks_for(runpod_emulator, gpu_type_ids=[R3090, R4090], **spec))

    torch = ["torch>=2.12"]  # CUDA 12.6 or newer; the emulated hosts report 12.8 only
    volume = S3Target(bucket="vol1", region_name="EU-RO-1", volume_mount_path="/workspace")
    ok = check_placement(provider(), torch, None)
    assert ok.startswith("2 GPU type(s) known to RunPod; hosts with CUDA 12.6 or newer"), ok
    with pytest.raises(SpecError, match=r"no GPU type of the pod spec has hosts on CUDA 13\.0"):
        check_placement(provider(allowed_cuda_versions=["13.0"]), torch, None)
    with pytest.raises(
        SpecError, match="lives in EU-RO-1, but the pod spec asks for data centres US-TX-3"
    ):
        check_placement(provider(data_center_ids=["US-TX-3"]), [], volume)
    with pytest.raises(SpecError, match="asks for any data centre"):
        check_placement(provider(), [], volume)
    placed = check_placement(provider(data_center_ids=["EU-RO-1"]), [], volume)
    assert "the network volume's data centre EU-RO-1 is asked for" in placed
    assert _creates(runpod_emulator) == 0
