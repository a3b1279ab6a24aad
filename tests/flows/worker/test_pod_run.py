"""``PodFlowRun`` on the local pod, without a worker: a run handed over again has the
pod its earlier attempt left ended first; the pod is always ended and confirmed."""

from __future__ import annotations

import logging
import uuid

import pytest

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.flows.worker import RunPodJobConfiguration
from prefect_runpod.flows.worker.pod_run import PodFlowRun


@pytest.mark.slow
def test_a_run_handed_over_again_ends_the_pod_its_earlier_attempt_left(
    prefect_server: None, local_provider: LocalPodProvider, caplog: pytest.LogCaptureFixture
) -> None:
    flow_run_id = str(uuid.uuid4())
    name = f"prft-{flow_run_id}"
    earlier = local_provider.create(PodRequest(public_key=generate_keypair().public_key), name)
    ids: list[str] = []
    run = PodFlowRun(
        RunPodJobConfiguration(),
        flow_run_id,
        api_url="http://127.0.0.1:9/api",
        api_key=None,
        logger=logging.getLogger("test.pod_run"),
        on_created=ids.append,
    )
    try:
        with caplog.at_level(logging.INFO, logger="test.pod_run"):
            handle = run.rent()
        assert ids == [handle.pod_id] and handle.pod_id != earlier.pod_id
        assert local_provider.get(earlier.pod_id) is None  # ended before the new one
        assert f"ended the pod {name} an earlier attempt of this run left" in caplog.text
        assert local_provider.find(name).pod_id == handle.pod_id
    finally:
        end = run.end()
    assert end is not None and end.confirmed and local_provider.get(handle.pod_id) is None
