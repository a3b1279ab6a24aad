"""``kill_infrastructure``: a cancelled run's pod ended and confirmed; an unknown or
already-ended pod is ``InfrastructureNotFound``."""

from __future__ import annotations

import anyio
import pytest
from prefect.exceptions import InfrastructureNotFound

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.flows.worker import RunPodJobConfiguration, RunPodWorker


@pytest.mark.slow
def test_kill_infrastructure_ends_the_pod_then_finds_none(local_provider: LocalPodProvider) -> None:
    handle = local_provider.create(
        PodRequest(public_key=generate_keypair().public_key), "prft-kill"
    )
    worker = RunPodWorker(work_pool_name="kill-test")
    config = RunPodJobConfiguration()
    anyio.run(worker.kill_infrastructure, handle.pod_id, config)
    assert local_provider.get(handle.pod_id) is None
    assert local_provider.status(handle.pod_id).gone
    with pytest.raises(InfrastructureNotFound):  # already ended
        anyio.run(worker.kill_infrastructure, handle.pod_id, config)
    with pytest.raises(InfrastructureNotFound):  # never existed
        anyio.run(worker.kill_infrastructure, "nosuchpod0000", config)
