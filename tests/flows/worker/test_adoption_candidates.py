"""Which flow runs a starting ``runpod`` worker looks at for pods to adopt: a Running
(or Cancelling) run with an infrastructure id, never a Pending one, whose pod the worker
that claimed it is still bringing up (no heartbeat yet: a second worker that took it
over would end it under the first)."""

from __future__ import annotations

import anyio
import pytest


@pytest.mark.slow
def test_a_pending_runs_pod_is_left_to_the_worker_bringing_it_up(prefect_server: None) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Pending, Running

    from prefect_runpod.flows.worker import RunPodWorker

    pool = "adoption-candidates"
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.actions import WorkPoolCreate

        client.create_work_pool(WorkPoolCreate(name=pool, type="runpod"), overwrite=True)
        flow_id = client.create_flow(flow(name="candidates")(lambda: None))
        deployment_id = client.create_deployment(
            flow_id=flow_id, name="candidates", work_pool_name=pool
        )
        runs = {}
        for label, state in (("pending", Pending()), ("running", Running()), ("bare", Running())):
            run = client.create_flow_run_from_deployment(deployment_id)
            client.set_flow_run_state(run.id, state, force=True)
            if label != "bare":  # a run whose worker never recorded a pod
                client.update_flow_run(run.id, infrastructure_pid=f"pod{label}")
            runs[label] = run.id

    async def candidates() -> set[object]:
        async with RunPodWorker(work_pool_name=pool) as worker:
            await worker.sync_with_backend()
            return {run.id for run in await worker._runs_with_pods()}

    assert anyio.run(candidates) == {runs["running"]}
