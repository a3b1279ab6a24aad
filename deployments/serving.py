"""What ``python -m prefect_runpod.deployments.register`` sets up and serves, on the
Prefect API it opened (docs/architecture.md#prefect-surface): the ``runpod-gpu``
concurrency limit, the zombie automation, the ``runpod-finetune`` work pool and its
migration from ``runpod-pool``, the provider variable, and the deployments ``serve``
runs. The command line itself is ``deployments/register.py``, which checks its
arguments and the environment before this module (and so Prefect) is imported."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect import serve
from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import StateType
from prefect.deployments.runner import RunnerDeployment
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
from prefect.exceptions import ObjectAlreadyExists
from prefect.schedules import Cron, Interval
from prefect.utilities.callables import ParameterSchema
from pydantic import ConfigDict

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.flows.finetune import finetune
from prefect_runpod.flows.reaper import reaper
from prefect_runpod.flows.sweep import sweep

__all__ = [
    "CONCURRENCY_LIMIT",
    "DATASET_EVENT",
    "OLD_WORK_POOL",
    "WORK_POOL",
    "PROVIDER_VARIABLE",
    "ZOMBIE_AUTOMATION",
    "DeployedElsewhere",
    "build_deployments",
    "deployed_copies",
    "ensure_provider_variable",
    "dataset_trigger",
    "ensure_concurrency_limit",
    "ensure_work_pool",
    "migrate_old_work_pool",
    "ensure_zombie_automation",
    "refuse_unknown_parameters",
    "serve_all",
    "setup",
    "setup_lines",
]

CONCURRENCY_LIMIT = "runpod-gpu"
"""The global concurrency limit capping simultaneous pods."""
WORK_POOL = "runpod-finetune"
"""The process work pool ``prefect.yaml`` deploys to."""
OLD_WORK_POOL = "runpod-pool"
"""The process pool's name before ``runpod-finetune``; ``setup`` migrates it."""
ZOMBIE_AUTOMATION = "runpod-crash-zombie-flows"
"""The automation that marks heartbeat-less flow runs Crashed."""
DATASET_EVENT = "dataset.updated"
"""The event an upstream pipeline emits when a training set changes; its payload's
``bundle`` is the bundle directory to fine-tune on."""

PROVIDER_VARIABLE = "prefect_runpod_provider"
"""The Prefect variable ``prefect.yaml``'s deployments take their provider from."""

HEARTBEATS_MISSED = 3
"""A run is a zombie after this many missed heartbeat intervals."""


def ensure_concurrency_limit(name: str = CONCURRENCY_LIMIT, limit: int = 2) -> int:
    """Create the global concurrency limit ``name`` with ``limit`` slots, or set the
    limit of an existing one (its held slots are left as they are).

    Returns:
        The limit now on the server.
    """
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, limit)
        return client.read_global_concurrency_limit_by_name(name).limit


def ensure_work_pool(name: str = WORK_POOL) -> str:
    """Create the process work pool ``name`` unless it exists. Returns its type."""
    with get_client(sync_client=True) as client:
        try:
            pool = client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pool = client.read_work_pool(name)
        return pool.type


def migrate_old_work_pool(old: str = OLD_WORK_POOL, new: str = WORK_POOL) -> list[str]:
    """Move every deployment of the process pool ``old`` to ``new`` (which must exist)
    and delete ``old``. A pool of that name of another type is someone else's: left.

    Returns:
        The deployments moved (``flow/deployment``); empty when ``old`` did not exist.
    """
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import WorkPoolFilter, WorkPoolFilterName
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(old)
        except ObjectNotFound:
            return []
        if pool.type != "process":
            return []
        deployments = client.read_deployments(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[old]))
        )
        moved = []
        for deployment in deployments:
            client.update_deployment(deployment.id, DeploymentUpdate(work_pool_name=new))
            flow = client.read_flow(deployment.flow_id)
            moved.append(f"{flow.name}/{deployment.name}")
        client.delete_work_pool(old)
        return moved


def zombie_automation(heartbeat_seconds: float = 180.0) -> Automation:
    """The automation that marks a flow run Crashed when no heartbeat, and no final
    state, followed its last heartbeat within ``HEARTBEATS_MISSED`` intervals.

    Args:
        heartbeat_seconds: the flows' heartbeat interval
            (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, 180 s by default, 30 s at least).
    """
    finals = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
    return Automation(
        name=ZOMBIE_AUTOMATION,
        description=(
            "Marks a flow run Crashed when its heartbeats stop (killed process, lost host), "
            "so on_crashed hooks elsewhere and the runpod reaper can end its pod."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *finals},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=heartbeat_seconds * HEARTBEATS_MISSED),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"No heartbeat for {HEARTBEATS_MISSED} intervals: the flow process is gone.",
            )
        ],
    )


def ensure_zombie_automation(heartbeat_seconds: float = 180.0) -> str:
    """Create (or replace) the zombie-run automation. Returns its id."""
    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(ZOMBIE_AUTOMATION):
            client.delete_automation(old.id)
    created = zombie_automation(heartbeat_seconds).create()
    return str(created.id)


def ensure_provider_variable(default: str = "local") -> str:
    """The ``prefect_runpod_provider`` variable, created with ``default`` when missing
    (an existing value is kept); returns its value."""
    from prefect.variables import Variable

    value = Variable.get(PROVIDER_VARIABLE, default=None)
    if value is None:
        Variable.set(PROVIDER_VARIABLE, default)
        value = default
    return str(value)


def setup(limit: int = 2, heartbeat_seconds: float = 180.0) -> dict[str, Any]:
    """The concurrency limit, the zombie automation, the work pool and the provider
    variable, all idempotent.

    Returns:
        What exists now: ``{"concurrency_limit": …, "automation_id": …, "work_pool": …,
        "migrated": {"runpod-pool": [deployments moved from it]}, "provider_variable": …}``.
    """
    return {
        "concurrency_limit": {CONCURRENCY_LIMIT: ensure_concurrency_limit(limit=limit)},
        "automation_id": ensure_zombie_automation(heartbeat_seconds),
        "work_pool": {WORK_POOL: ensure_work_pool()},
        "migrated": {OLD_WORK_POOL: migrate_old_work_pool()},
        "provider_variable": {PROVIDER_VARIABLE: ensure_provider_variable()},
    }


def setup_lines(done: dict[str, Any]) -> list[str]:
    """``setup``'s result as lines a person reads."""
    ((limit_name, slots),) = done["concurrency_limit"].items()
    ((pool, pool_type),) = done["work_pool"].items()
    ((variable, provider),) = done["provider_variable"].items()
    moved = (done.get("migrated") or {}).get(OLD_WORK_POOL) or []
    lines = [
        f"concurrency limit  {limit_name}: {slots} pods at once",
        f"automation         {ZOMBIE_AUTOMATION} ({done['automation_id']})",
        f"work pool          {pool} ({pool_type})",
    ]
    if moved:
        lines.append(
            f"migrated           {OLD_WORK_POOL} -> {pool}: {', '.join(moved)} (old pool deleted)"
        )
    return [*lines, f"variable           {variable} = {provider}"]


class DeployedElsewhere(SpecError):
    """A deployment ``serve`` would replace was made by ``prefect deploy`` (it has a
    work pool)."""


def deployed_copies(deployments: list[RunnerDeployment]) -> list[str]:
    """``flow/name (work pool POOL)`` for each of ``deployments`` the server already has
    on a work pool, i.e. made by ``prefect deploy``: serving it would replace it."""
    from prefect.exceptions import ObjectNotFound

    found = []
    with get_client(sync_client=True) as client:
        for d in deployments:
            name = f"{d.flow_name}/{d.name}"
            try:
                existing = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                found.append(f"{name} (work pool {existing.work_pool_name})")
    return found


def dataset_trigger() -> DeploymentEventTrigger:
    """Run the fine-tune when a ``dataset.updated`` event arrives, on the bundle the
    event names (``payload.bundle``): one run per event."""
    return DeploymentEventTrigger(
        name="fine-tune-on-dataset-update",
        expect={DATASET_EVENT},
        match={"prefect.resource.id": "dataset.*"},
        posture=Posture.Reactive,
        threshold=1,
        parameters={
            "bundle": "{{ event.payload.bundle }}",
            "concurrency_limit": CONCURRENCY_LIMIT,
        },
    )


class _StrictParameterSchema(ParameterSchema):
    """Prefect's parameter schema, able to carry ``additionalProperties``."""

    model_config = ConfigDict(extra="allow")


def refuse_unknown_parameters(deployment: RunnerDeployment) -> RunnerDeployment:
    """Make the server refuse a run of ``deployment`` that names a parameter the flow
    does not have (HTTP 409, nothing stored), instead of storing it and failing later.

    Prefect stores a run's parameters as sent, before the flow's code runs; a caller
    still passing the removed ``hf_token`` would otherwise leave the token in the API
    and the database. The deployment's schema gets ``additionalProperties: false``,
    which the server enforces with ``enforce_parameter_schema`` (on by default).

    Returns:
        The same deployment, changed in place.
    """
    schema = deployment._parameter_openapi_schema
    deployment._parameter_openapi_schema = _StrictParameterSchema(
        **schema.model_dump(exclude_unset=True), additionalProperties=False
    )
    deployment.enforce_parameter_schema = True
    return deployment


def build_deployments(
    *,
    schedules: bool = True,
    finetune_defaults: dict[str, Any] | None = None,
    provider_params: dict[str, Any] | None = None,
) -> list[RunnerDeployment]:
    """The deployments ``prefect.yaml`` declares, as runner deployments for ``serve``.

    - ``runpod-finetune/on-demand``: for ``run_deployment`` from other pipelines and the sweep;
    - ``runpod-finetune/nightly``: cron ``0 3 * * *`` UTC;
    - ``runpod-finetune/on-dataset-updated``: the ``dataset.updated`` trigger;
    - ``runpod-reaper/every-10-min``: the reaper, every 600 s;
    - ``runpod-sweep/on-demand``: a sweep of configs under the ``runpod-gpu`` cap.

    Every deployment refuses parameters its flow does not declare
    (``refuse_unknown_parameters``).

    Args:
        schedules: False leaves out the cron and interval schedules (tests, or a
            laptop where the shared reaper already runs elsewhere).
        finetune_defaults: default parameters for every fine-tune deployment.
        provider_params: ``provider`` and the RunPod block names
            (``runpod_credentials_block``, ``runpod_spec_block``, ``ssh_key_block``) for
            the fine-tune and reaper deployments alike (default: the local provider).
    """
    pods = {k: v for k, v in (provider_params or {}).items() if v}
    base = {"concurrency_limit": CONCURRENCY_LIMIT, **pods, **(finetune_defaults or {})}
    tags = ["prefect-runpod"]
    deployments = [
        finetune.to_deployment("on-demand", parameters=base, tags=tags),
        finetune.to_deployment(
            "nightly",
            schedules=[Cron("0 3 * * *", timezone="UTC")] if schedules else None,
            parameters=base,
            tags=tags,
        ),
        finetune.to_deployment(
            "on-dataset-updated", parameters=base, triggers=[dataset_trigger()], tags=tags
        ),
        reaper.to_deployment(
            "every-10-min",
            schedules=[Interval(timedelta(minutes=10))] if schedules else None,
            parameters={"provider": "local", "name_prefix": "prft", **pods},
            tags=tags,
        ),
        sweep.to_deployment(
            "on-demand", parameters={"concurrency_limit": CONCURRENCY_LIMIT}, tags=tags
        ),
    ]
    return [refuse_unknown_parameters(d) for d in deployments]


def serve_all(
    *,
    limit: int | None = None,
    query_seconds: float | None = None,
    schedules: bool = True,
    finetune_defaults: dict[str, Any] | None = None,
    provider_params: dict[str, Any] | None = None,
    replace: bool = False,
) -> None:
    """Serve every deployment from this process until interrupted (SIGINT/SIGTERM).

    Args:
        limit: most flow runs at once in this process (None: no limit). The pod cap
            is the ``runpod-gpu`` limit, not this.
        query_seconds: how often the runner polls for scheduled runs (default
            ``PREFECT_RUNNER_POLL_FREQUENCY``, 10 s).
        schedules / finetune_defaults / provider_params: see ``build_deployments``.
        replace: take over deployments of the same names that ``prefect deploy`` made.

    Raises:
        DeployedElsewhere: such deployments exist and ``replace`` is False (named, with
            the two ways out), before anything is served.
    """
    kwargs: dict[str, Any] = {}
    if query_seconds is not None:
        kwargs["query_seconds"] = query_seconds
    deployments = build_deployments(
        schedules=schedules, finetune_defaults=finetune_defaults, provider_params=provider_params
    )
    taken = [] if replace else deployed_copies(deployments)
    if taken:
        raise DeployedElsewhere(
            f"{', '.join(taken)} came from `prefect deploy`; serving here would replace "
            "them and their worker's runs would find no code (FileNotFoundError: '.../None'). "
            f"Run them with the worker (`prefect worker start --pool {WORK_POOL}`), delete "
            "them (`prefect deployment delete NAME`), or pass --replace to serve them here."
        )
    serve(*deployments, limit=limit, **kwargs)
