"""A sweep: many fine-tune runs at once, never more pods than the GPU limit allows.

Each config becomes one run of the fine-tune deployment (``run_deployment``, linked to
the sweep as a subflow). Every run holds one slot of the global concurrency limit
(``runpod-gpu`` by default) from provision to confirmed terminate, so however many runs
start, at most ``limit`` pods live and bill at once; the others wait for a slot before
creating their pod.
"""

from __future__ import annotations

import time
from typing import Any, cast

from prefect import flow, get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.held_artifacts import hold_artifact

__all__ = ["sweep"]

FINETUNE_DEPLOYMENT = "runpod-finetune/on-demand"
"""The deployment a sweep runs by default (see ``deployments/``)."""


@flow(name="runpod-sweep")
def sweep(
    configs: list[dict[str, Any]],
    concurrency_limit: str = "runpod-gpu",
    deployment_name: str = FINETUNE_DEPLOYMENT,
    timeout_seconds: float = 6 * 3600.0,
    poll_interval_seconds: float = 5.0,
) -> list[dict[str, Any]]:
    """Run the fine-tune once per config, all started at once, pods capped by the limit.

    Args:
        configs: one dict of fine-tune parameters per run (``bundle``, ``model_id``…);
            ``concurrency_limit`` is set on each.
        concurrency_limit: the global concurrency limit every run holds a slot of while
            its pod lives. Must exist (``register setup`` creates ``runpod-gpu``).
        deployment_name: the fine-tune deployment, ``<flow name>/<deployment name>``.
        timeout_seconds: how long to wait for all runs to finish, in seconds.
        poll_interval_seconds: how often to read the runs' states.

    Returns:
        One row per config, in order: ``flow_run_id``, ``state``, and ``report`` (the
        RunReport dict) for a completed run or ``error`` for another.

    Raises:
        SpecError: when the concurrency limit does not exist (nothing was started).
        TimeoutError: when runs are still going after ``timeout_seconds`` (they keep
            running; the message lists them).
    """
    logger = get_run_logger()
    with get_client(sync_client=True) as client:
        try:
            slots = client.read_global_concurrency_limit_by_name(concurrency_limit).limit
        except ObjectNotFound:
            raise SpecError(
                f"global concurrency limit {concurrency_limit!r} does not exist: create it with "
                f"`prefect gcl create {concurrency_limit} --limit 2` (or "
                "`python -m prefect_runpod.deployments.register setup`)"
            ) from None
    logger.info(
        "sweep of %d runs, at most %d pods at once (%s)", len(configs), slots, concurrency_limit
    )
    runs = [
        cast(
            FlowRun,
            run_deployment(
                deployment_name,
                parameters={**config, "concurrency_limit": concurrency_limit},
                timeout=0,
            ),
        )
        for config in configs
    ]
    deadline = time.monotonic() + timeout_seconds
    finished: dict[Any, Any] = {}
    with get_client(sync_client=True) as client:
        while len(finished) < len(runs):
            for run in runs:
                if run.id in finished:
                    continue
                current = client.read_flow_run(run.id)
                if current.state is not None and current.state.is_final():
                    finished[run.id] = current
            if len(finished) < len(runs):
                if time.monotonic() > deadline:
                    pending = [str(r.id) for r in runs if r.id not in finished]
                    raise TimeoutError(
                        f"sweep: {len(pending)} runs still going after {timeout_seconds:.0f} s "
                        f"({', '.join(pending)}); they keep running, cancel them in the UI if needed"
                    )
                time.sleep(poll_interval_seconds)
    rows: list[dict[str, Any]] = []
    for run in runs:
        state = finished[run.id].state
        row: dict[str, Any] = {"flow_run_id": str(run.id), "state": state.name}
        if state.is_completed():
            row["report"] = state.result(raise_on_failure=False)
        else:
            row["error"] = state.message
        rows.append(row)
    hold_artifact(
        "sweep-runs",
        "table",
        [
            {
                "flow_run_id": r["flow_run_id"],
                "state": r["state"],
                "pod_id": (r.get("report") or {}).get("pod_id"),
                "usd": ((r.get("report") or {}).get("cost") or {}).get("usd"),
            }
            for r in rows
        ],
        f"{len(rows)} fine-tune runs under {concurrency_limit}",
    )
    outbox().flush()  # in Prefect before the flow ends, unless the API is down
    return rows
