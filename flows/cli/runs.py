"""What the cockpit commands know about a run and its pod, from the Prefect API (the
source of truth for runs) and the pod's provider: the run's state and current stage, its
``finetune-costs`` record, its live pod, the SSH key and command a person uses to get in,
and the run's page in the Prefect UI.

Plain functions over Prefect's async client, one client and few requests per look-up
(the runs, then their task runs and cost records together, whatever their number);
``status``, ``logs``, ``ssh``, ``pods`` and ``cost`` call them, nothing here prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect_runpod.blocks.validation.parameters import DEFAULT_NAME_PREFIX, DEFAULT_PROVIDER
from prefect_runpod.flows.run.names import FINISHED_STATE_TYPES, POD_KEY_FILE, pod_name_for

if TYPE_CHECKING:  # imported where used: a look-up loads only what it needs
    from prefect_runpod.blocks.pod_handle import PodHandle
    from prefect_runpod.blocks.provider import PodProvider
    from prefect_runpod.flows.run.cost_record import CostRecord

__all__ = [
    "FLOW_NAME",
    "RunView",
    "key_path_for",
    "live_pod",
    "provider_for_run",
    "read_run",
    "read_runs",
    "recent_runs",
    "require_run",
]

FLOW_NAME = "runpod-finetune"
"""The fine-tune flow's name in Prefect."""


@dataclass
class RunView:
    """One fine-tune run as the cockpit shows it.

    Attributes:
        flow_run_id / flow_run_name: the Prefect flow run.
        state: its state name (``Running``, ``Completed``, ``Crashed``…).
        state_type: its state type (``RUNNING``, ``COMPLETED``…).
        stage: the stage under way (a running stage task), else the last one that ran.
        started_at: when the run started (UTC), or None.
        parameters: the run's parameters as Prefect stored them (no secret among them).
        record: its latest ``finetune-costs`` record, or None (no pod on record yet).
        url: the run's page in the Prefect UI, or None when no UI address is known.
    """

    flow_run_id: str
    flow_run_name: str
    state: str
    state_type: str
    stage: str
    started_at: datetime | None
    parameters: dict[str, Any] = field(default_factory=dict)
    record: CostRecord | None = None
    url: str | None = None

    @property
    def live(self) -> bool:
        """True while the run is not finished (Prefect's view)."""
        return self.state_type not in FINISHED_STATE_TYPES

    @property
    def output_dir(self) -> str | None:
        """Where the run keeps its report, key and train.log: the record's, else the
        run's parameter (None: the default folder under the run's working directory)."""
        if self.record is not None and self.record.output_dir:
            return self.record.output_dir
        given = self.parameters.get("output_dir")
        return str(given) if given else None

    @property
    def provider(self) -> str:
        """The provider's name: the record's, else the run's parameter."""
        if self.record is not None:
            return self.record.provider
        return str(self.parameters.get("provider") or DEFAULT_PROVIDER)


_PAGE = 200
"""The most rows one Prefect API read returns (the server's default limit)."""


def _run_sync(coro: Any) -> Any:
    """Run one coroutine of Prefect's async client to its end (one event loop, one HTTP
    client for every request of a look-up)."""
    import asyncio

    return asyncio.run(coro)


async def _views(client: Any, runs: list[Any]) -> list[RunView]:
    """The views of ``runs``: their task runs (for the stage) and their ``finetune-costs``
    records read in two requests sent together, whatever the number of runs."""
    import asyncio

    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.client.schemas.sorting import ArtifactSort, TaskRunSort

    from prefect_runpod.flows.run.cost_record import COST_ARTIFACT_KEY

    if not runs:
        return []

    async def task_runs(ids: list[UUID]) -> list[Any]:
        found: list[Any] = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
            sort=TaskRunSort.EXPECTED_START_TIME_DESC,
            limit=_PAGE,
        )
        return found

    async def cost_tables(ids: list[UUID]) -> list[Any]:
        found: list[Any] = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[COST_ARTIFACT_KEY]),
                flow_run_id=ArtifactFilterFlowRunId(any_=ids),
            ),
            sort=ArtifactSort.CREATED_DESC,
            limit=_PAGE,
        )
        return found

    ids = [run.id for run in runs]
    tasks, tables = await asyncio.gather(task_runs(ids), cost_tables(ids))
    for rows, read in ((tasks, task_runs), (tables, cost_tables)):
        if len(rows) < _PAGE:
            continue
        seen = {row.flow_run_id for row in rows}  # a full page may have left runs out
        for more in await asyncio.gather(*(read([i]) for i in ids if i not in seen)):
            rows.extend(more)
    return [_view(run, tasks, tables) for run in runs]


def _stage_of(flow_run_id: Any, tasks: list[Any]) -> str:
    """The stage under way (a running stage task), else the last one that ran."""
    mine = [t for t in tasks if t.flow_run_id == flow_run_id]  # newest first
    for task in mine:
        if task.state is not None and task.state.type.value == "RUNNING":
            return str(task.name).rsplit("-", 1)[0]
    return str(mine[0].name).rsplit("-", 1)[0] if mine else "-"


def _record_of(flow_run_id: Any, tables: list[Any]) -> CostRecord | None:
    """The run's latest ``finetune-costs`` record among ``tables`` (newest first); None
    when its latest table is not a cost record (the record is beside the run, never in
    its way)."""
    from prefect_runpod.flows.run.cost_record import CostRecord

    latest = next((t for t in tables if t.flow_run_id == flow_run_id), None)
    return CostRecord.from_artifact(latest) if latest is not None else None


def _view(run: Any, tasks: list[Any], tables: list[Any]) -> RunView:
    from prefect_runpod.flows.run.names import flow_run_url

    state = run.state
    return RunView(
        flow_run_id=str(run.id),
        flow_run_name=str(run.name),
        state=state.name if state else "Unknown",
        state_type=state.type.value if state else "UNKNOWN",
        stage=_stage_of(run.id, tasks),
        started_at=run.start_time,
        parameters=dict(run.parameters or {}),
        record=_record_of(run.id, tables),
        url=flow_run_url(str(run.id)),
    )


def require_run(flow_run_id: str) -> RunView:
    """The run with that id (see ``read_run``).

    Raises:
        SpecError: the Prefect API does not know the run (every command says it alike).
    """
    from prefect_runpod.blocks.exceptions import SpecError

    view = read_run(flow_run_id)
    if view is None:
        raise SpecError(
            f"no flow run {flow_run_id} in the Prefect API: `prefect-runpod status` lists runs"
        )
    return view


def read_run(flow_run_id: str) -> RunView | None:
    """The run with that id, or None when the Prefect API does not know it."""
    return read_runs([flow_run_id]).get(flow_run_id)


def read_runs(flow_run_ids: list[str]) -> dict[str, RunView]:
    """The runs with those ids that the Prefect API knows, by id (three requests in all:
    the runs, then their task runs and cost records together)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    wanted = sorted({UUID(i) for i in flow_run_ids})
    if not wanted:
        return {}

    async def read() -> dict[str, RunView]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=wanted)), limit=_PAGE
            )
            return {view.flow_run_id: view for view in await _views(client, list(runs))}

    result: dict[str, RunView] = _run_sync(read())
    return result


def recent_runs(limit: int = 20, since: datetime | None = None) -> list[RunView]:
    """The latest fine-tune runs, newest first (three requests in all).

    Args:
        limit: at most this many.
        since: only runs started (or expected to start) at or after this UTC time.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    run_filter = None
    if since is not None:
        after = FlowRunFilterExpectedStartTime(after_=since)  # type: ignore[arg-type]
        run_filter = FlowRunFilter(expected_start_time=after)

    async def read() -> list[RunView]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])),
                flow_run_filter=run_filter,
                sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=max(1, min(limit, _PAGE)),
            )
            return await _views(client, list(runs))

    views: list[RunView] = _run_sync(read())
    return views


def provider_for_run(view: RunView, overrides: dict[str, Any] | None = None) -> PodProvider:
    """The run's pod provider, rebuilt from its own parameters (blocks named there), with
    ``overrides`` (the command's own ``--provider`` and block options) on top.

    Raises:
        SpecError: a block the run names is no longer saved, or RunPod has no key here.
    """
    from prefect_runpod.flows.run.providers import build_provider

    params = dict(view.parameters)
    params["provider"] = view.provider
    params.update({k: val for k, val in (overrides or {}).items() if val})
    provider, _ = build_provider(params, need_ssh_key=False)
    return provider


def live_pod(view: RunView, provider: PodProvider) -> PodHandle | None:
    """The run's pod while it lives (found by its name), else None."""
    name = (view.record.pod_name if view.record else "") or pod_name_for(
        str(view.parameters.get("name_prefix") or DEFAULT_NAME_PREFIX), view.flow_run_id
    )
    return provider.find(name)


def key_path_for(
    provider_name: str, output_dir: str | None, parameters: dict[str, Any] | None = None
) -> str | None:
    """The private key file in use for a run's pod, when it is on this machine: the key
    the run kept beside its outputs (``<output_dir>/pod-ssh-key``: a local pod's per-run
    key, or a saved RunPodSSHKey block's), else for RunPod the user's key file
    (``flows.run.providers.ssh_key_file``: ``RUNPOD_SSH_KEY_PATH``, expanded) unless the
    run's ``parameters`` name a saved key block.

    Args:
        provider_name: ``local`` or ``runpod``.
        output_dir: the run's output dir, when known.
        parameters: the run's parameters, when known (a pod found by id has none).
    """
    from prefect_runpod.flows.run.providers import ssh_key_file

    kept = Path(output_dir) / POD_KEY_FILE if output_dir else None
    if kept is not None and kept.is_file():
        return str(kept)
    path = ssh_key_file({**(parameters or {}), "provider": provider_name})
    return path if path is not None and os.path.isfile(path) else None


def now_utc() -> datetime:
    """The present, UTC (one place, so tests and tables agree)."""
    return datetime.now(UTC)
