"""What the cockpit commands know about a run and its pod, from the Prefect API (the
source of truth for runs) and the pod's provider: the run's state and current stage, its
``finetune-costs`` record, its live pod, the SSH key and command a person uses to get in,
and the run's page in the Prefect UI.

Plain functions over the Prefect client; ``status``, ``logs``, ``ssh`` and ``pods`` call
them, nothing here prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import Capability, PodProvider
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.validation.parameters import DEFAULT_NAME_PREFIX, DEFAULT_PROVIDER
from prefect_runpod.flows.run.cost_record import CostRecord, latest_record
from prefect_runpod.flows.run.report import flow_run_url

__all__ = [
    "FLOW_NAME",
    "RunView",
    "flow_run_url",
    "key_path_for",
    "live_pod",
    "provider_for_run",
    "read_run",
    "recent_runs",
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
        from prefect_runpod.flows.reaper import FINISHED_STATE_TYPES

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


def _stage_of(client: Any, flow_run_id: str) -> str:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    tasks = client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)])),
        sort=TaskRunSort.EXPECTED_START_TIME_DESC,
        limit=50,
    )
    for task in tasks:
        if task.state is not None and task.state.type.value == "RUNNING":
            return str(task.name).split("-")[0]
    return str(tasks[0].name).rsplit("-", 1)[0] if tasks else "-"


def _view(client: Any, run: Any, with_record: bool = True) -> RunView:
    state = run.state
    record = None
    if with_record:
        try:
            record = latest_record(str(run.id))
        except Exception:  # the record is beside the run, never in its way
            record = None
    return RunView(
        flow_run_id=str(run.id),
        flow_run_name=str(run.name),
        state=state.name if state else "Unknown",
        state_type=state.type.value if state else "UNKNOWN",
        stage=_stage_of(client, str(run.id)),
        started_at=run.start_time,
        parameters=dict(run.parameters or {}),
        record=record,
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
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
        except ObjectNotFound:
            return None
        return _view(client, run)


def recent_runs(limit: int = 20, since: datetime | None = None) -> list[RunView]:
    """The latest fine-tune runs, newest first.

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
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW_NAME])),
            flow_run_filter=run_filter,
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=max(1, limit),
        )
        return [_view(client, run) for run in runs]


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
    from prefect_runpod.flows.finetune import pod_name_for

    name = (view.record.pod_name if view.record else "") or pod_name_for(
        str(view.parameters.get("name_prefix") or DEFAULT_NAME_PREFIX), view.flow_run_id
    )
    return provider.find(name)


def key_path_for(provider_name: str, output_dir: str | None) -> str | None:
    """The private key a person uses to get into a run's pod, when it is on this machine:
    the user's own key where the provider reaches pods with it (``Capability.USER_KEY``:
    RunPod's ``RUNPOD_SSH_KEY_PATH``, default ``~/.ssh/id_ed25519_runpod``), else the
    run's key kept beside its outputs (``<output_dir>/pod-ssh-key``, the local pod)."""
    if provider_supports(provider_name, Capability.USER_KEY):
        path = os.path.expanduser(provider_class(provider_name).user_key_path())
        return path if os.path.isfile(path) else None
    if output_dir and (Path(output_dir) / "pod-ssh-key").is_file():
        return str(Path(output_dir) / "pod-ssh-key")
    return None


def now_utc() -> datetime:
    """The present, UTC (one place, so tests and tables agree)."""
    return datetime.now(UTC)
