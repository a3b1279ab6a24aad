"""An upstream pipeline that hands its data to the fine-tune, three ways (docs/architecture.md#prefect-surface).

- ``train_and_wait``: ``run_deployment(..., timeout=None)`` waits for the fine-tune and
  reads its RunReport through ``.state.result()`` (a plain dict: the result is JSON, so
  no prefect-runpod class is needed to read it; the result storage must be shared, for
  example an S3 block, when the fine-tune ran on another machine);
- ``train_and_go``: ``run_deployment(..., timeout=0)`` starts the fine-tune and returns
  at once (fire and forget);
- ``announce_dataset``: emits a ``dataset.updated`` event; the
  ``runpod-finetune/on-dataset-updated`` deployment's trigger starts a run on the
  bundle named in the event, without the upstream knowing any deployment name.
"""

from __future__ import annotations

from typing import Any, cast

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.events import emit_event

from prefect_runpod.blocks.exceptions import RunPodFlowError

__all__ = ["DATASET_EVENT", "announce_dataset", "dataset_event", "train_and_go", "train_and_wait"]

DATASET_EVENT = "dataset.updated"
FINETUNE_DEPLOYMENT = "runpod-finetune/on-demand"


@flow(name="upstream-train-and-wait")
def train_and_wait(
    bundle: str | None = None,
    deployment_name: str = FINETUNE_DEPLOYMENT,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Prepare data (here: point at a bundle), run the fine-tune, wait, read its report.

    Args:
        bundle: the bundle directory; None for the fine-tune's default (the demo).
        deployment_name: the fine-tune deployment to run.
        parameters: more fine-tune parameters.

    Returns:
        ``{"flow_run_id", "state", "passed", "pod_id", "usd", "report"}``.

    Raises:
        RunPodFlowError: when the fine-tune run did not complete (its state message).
    """
    logger = get_run_logger()
    params = dict(parameters or {})
    if bundle is not None:
        params["bundle"] = bundle
    run = cast(FlowRun, run_deployment(deployment_name, parameters=params, timeout=None))
    if run.state is None or not run.state.is_completed():
        name = run.state.name if run.state else "unknown"
        raise RunPodFlowError(
            f"fine-tune run {run.id} ended {name}: "
            f"{run.state.message if run.state else ''}; see its logs in the Prefect UI"
        )
    report: dict[str, Any] = run.state.result()
    logger.info(
        "fine-tune %s: passed=%s pod=%s cost=%.6f USD",
        run.id,
        report.get("passed"),
        report.get("pod_id"),
        report["cost"]["usd"],
    )
    return {
        "flow_run_id": str(run.id),
        "state": run.state.name,
        "passed": report.get("passed"),
        "pod_id": report.get("pod_id"),
        "usd": report["cost"]["usd"],
        "report": report,
    }


@flow(name="upstream-train-and-go")
def train_and_go(
    bundle: str | None = None,
    deployment_name: str = FINETUNE_DEPLOYMENT,
    parameters: dict[str, Any] | None = None,
) -> str:
    """Start the fine-tune and return at once. Returns the new run's id."""
    params = dict(parameters or {})
    if bundle is not None:
        params["bundle"] = bundle
    run = cast(FlowRun, run_deployment(deployment_name, parameters=params, timeout=0))
    get_run_logger().info(
        "started fine-tune run %s (%s)", run.id, run.state.name if run.state else "-"
    )
    return str(run.id)


def dataset_event(bundle: str, dataset: str) -> dict[str, Any]:
    """The ``dataset.updated`` event's fields: resource ``dataset.<dataset>``, and the
    bundle directory in ``payload.bundle`` (the trigger maps it to ``bundle``)."""
    return {
        "event": DATASET_EVENT,
        "resource": {"prefect.resource.id": f"dataset.{dataset}", "prefect.resource.name": dataset},
        "payload": {"bundle": bundle, "dataset": dataset},
    }


@flow(name="upstream-announce-dataset")
def announce_dataset(bundle: str, dataset: str = "demo") -> str:
    """Tell whoever listens that ``dataset`` changed and lives in ``bundle``.

    Returns:
        The emitted event's id.

    Raises:
        RunPodFlowError: when the event could not be emitted (events disabled).
    """
    event = emit_event(**dataset_event(bundle, dataset))
    if event is None:
        raise RunPodFlowError("dataset.updated was not emitted: Prefect events are disabled here")
    get_run_logger().info("emitted %s for %s (%s)", DATASET_EVENT, dataset, bundle)
    return str(event.id)
