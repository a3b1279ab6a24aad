"""The reaper: the last layer of guaranteed termination (docs/architecture.md#termination-layers, layer 4).

A scheduled flow that lists the pods carrying our name prefix, reads the flow run each
pod belongs to (the pod is named ``<prefix>-<flow_run_id>``), and terminates the pods
no live run stands behind:

- the run is finished (Completed, Failed, Crashed, Cancelled) yet its pod still lives,
  unless the run kept that pod on purpose (tagged ``kept-pod:<pod_id>``: outputs that could
  not travel are on it), which only the TTL ends;
- the run is unknown to the Prefect API (deleted, or never existed), past a short grace;
- the run still says Running (or Pending, Paused, Cancelling…) but nothing has been heard
  from it for ``stale_running_seconds``: no state change and no
  ``prefect.flow-run.heartbeat`` event. A SIGKILLed script run stays Running forever on
  a self-hosted server, so the state alone is not proof of life;
- the pod is older than its TTL, whatever its run says, a fresh heartbeat included: by
  default the pod's recorded lifetime (the dead-man's) plus ``REAPER_TTL_GRACE_SECONDS``,
  so the reaper acts after the dead-man, never before.

The decision is the pure function ``decide_reap``; the flow only gathers facts, asks it,
terminates, records each end in the run's own ``finetune-costs`` record (who: the
reaper; with what the pod's dead-man had tried, when that can be read from here), sets a
run that still said it ran Crashed with the cause (its process was gone, and Prefect
would show it Running forever), and writes a ``reaper-report`` table artifact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.events.filters import (
    EventFilter,
    EventNameFilter,
    EventOccurredFilter,
    EventResourceFilter,
)
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.exceptions import ProviderError, TerminateError
from prefect_runpod.blocks.held_artifacts import hold_artifact
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import (
    EndedBy,
    PodProvider,
    reaper_ttl_seconds,
)
from prefect_runpod.blocks.validation import check_name_prefix, check_number
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_NAME_PREFIX,
    DEFAULT_PROVIDER,
    ProviderName,
)
from prefect_runpod.flows.run.cost_record import record_pod_end
from prefect_runpod.flows.run.crashed import mark_crashed
from prefect_runpod.flows.run.heartbeat import deadman_attempts, deadman_note
from prefect_runpod.flows.run.names import (
    FINISHED_STATE_TYPES,
    KEPT_TAG_PREFIX,
    flow_run_id_from_pod_name,
)
from prefect_runpod.flows.run.providers import build_provider
from prefect_runpod.tasks.terminate import terminate_pod

__all__ = [
    "FINISHED_STATE_TYPES",
    "HEARTBEAT_EVENT",
    "ReapDecision",
    "RunSnapshot",
    "deadman_attempts",
    "deadman_note",
    "decide_reap",
    "flow_run_id_from_pod_name",
    "read_run_snapshot",
    "reaper",
]

HEARTBEAT_EVENT = "prefect.flow-run.heartbeat"
"""The event a running flow emits every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds
(180 s by default, 30 s at least)."""


class RunSnapshot(BaseModel):
    """What the Prefect API says about a pod's flow run, reduced to what the reaper needs.

    Attributes:
        flow_run_id: the run's id.
        state_type: the Prefect state type (``RUNNING``, ``COMPLETED``, …).
        state_name: the state's display name (``Running``, ``Crashed``, ``AwaitingRetry``…).
        last_seen_at: the latest sign of life (UTC): the newest of the state's timestamp
            and the run's last heartbeat event.
        kept_pods: the pods the run kept on purpose (its ``kept-pod:<pod_id>`` tags).
    """

    flow_run_id: str
    state_type: str
    state_name: str
    last_seen_at: datetime
    kept_pods: list[str] = []


class ReapDecision(BaseModel):
    """One row of the reaper's report.

    Attributes:
        pod_id / pod_name: the pod.
        flow_run_id: the run parsed from the name, or None when the name carries none.
        run_state: the run's state name, ``unknown`` when the API has no such run,
            ``-`` when the name carries no run id.
        age_seconds: the pod's age when decided.
        reap: True when the pod was (to be) terminated.
        reason: why, in one line.
        terminated: True once the provider confirmed the pod gone.
        error: the terminate error, when terminate failed.
    """

    pod_id: str
    pod_name: str
    flow_run_id: str | None
    run_state: str
    age_seconds: float
    reap: bool
    reason: str
    terminated: bool = False
    error: str | None = None


def decide_reap(
    pod: PodHandle,
    run: RunSnapshot | None,
    now: datetime,
    *,
    name_prefix: str = DEFAULT_NAME_PREFIX,
    ttl_seconds: float | None = None,
    stale_running_seconds: float = 900.0,
    grace_seconds: float = 60.0,
) -> tuple[bool, str]:
    """Decide whether one pod must be terminated. Pure: no I/O.

    Rules, first match wins:

    1. older than its TTL (``ttl_seconds``, or by default the pod's recorded lifetime
       plus ``REAPER_TTL_GRACE_SECONDS``) → reap, however fresh its heartbeat;
    2. the name carries no flow run id → keep (not a run's pod; only the TTL applies);
    3. no such run (``run`` is None) → reap, unless younger than ``grace_seconds``;
    4. run finished (Completed/Failed/Crashed/Cancelled) → reap, unless the run kept
       this pod on purpose (``run.kept_pods``): keep, the TTL ends it;
    5. run not finished but silent (no state change, no heartbeat) for more than
       ``stale_running_seconds`` → reap (a SIGKILLed run stays Running);
    6. otherwise keep.

    Args:
        pod: the pod as the provider lists it (``created_at`` in UTC).
        run: the pod's flow run, or None when the API does not know it.
        now: the current time (UTC).
        name_prefix: the prefix pods are named with.
        ttl_seconds: the hard maximum pod age in seconds; None for the default
            (``provider.reaper_ttl_seconds``: the pod's lifetime plus a grace).
        stale_running_seconds: silence after which an unfinished run counts as dead; keep
            it well above the heartbeat interval (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``).
        grace_seconds: how long a pod whose run is unknown is spared.

    Returns:
        ``(reap, reason)`` with a one-line reason.
    """
    age = (now - pod.created_at).total_seconds()
    ttl = reaper_ttl_seconds(pod, ttl_seconds)
    if age > ttl:
        return True, f"pod is {age:.0f} s old, past the TTL of {ttl:.0f} s"
    if flow_run_id_from_pod_name(pod.name, name_prefix) is None:
        return False, "name carries no flow run id; only the TTL applies"
    if run is None:
        if age < grace_seconds:
            return (
                False,
                f"flow run unknown but pod only {age:.0f} s old (grace {grace_seconds:.0f} s)",
            )
        return True, "flow run unknown to the Prefect API"
    if run.state_type.upper() in FINISHED_STATE_TYPES:
        if pod.pod_id in run.kept_pods:
            return False, (
                f"flow run is {run.state_name} and kept this pod (outputs left on it); "
                f"the TTL ends it in {ttl - age:.0f} s"
            )
        return True, f"flow run is {run.state_name} yet its pod still lives"
    silent = (now - run.last_seen_at).total_seconds()
    if silent > stale_running_seconds:
        return True, (
            f"flow run says {run.state_name} but was silent for {silent:.0f} s "
            f"(> {stale_running_seconds:.0f} s: no heartbeat, process likely killed)"
        )
    return False, f"flow run {run.state_name}, last seen {silent:.0f} s ago"


def read_run_snapshot(client: SyncPrefectClient, flow_run_id: UUID) -> RunSnapshot | None:
    """Read one flow run and its last heartbeat event through the Prefect API.

    Returns:
        The snapshot, or None when the API has no such run.
    """
    try:
        run = client.read_flow_run(flow_run_id)
    except ObjectNotFound:
        return None
    state = run.state
    seen = [t for t in (state.timestamp if state else None, run.start_time, run.created) if t]
    page = client.read_events(
        filter=EventFilter(
            occurred=EventOccurredFilter(since=datetime.now(UTC) - timedelta(days=7)),  # type: ignore[arg-type]
            event=EventNameFilter(name=[HEARTBEAT_EVENT]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
        ),
        limit=1,
    )
    seen.extend(e.occurred for e in page.events)
    return RunSnapshot(
        flow_run_id=str(flow_run_id),
        state_type=state.type.value if state else "SCHEDULED",
        state_name=(state.name or state.type.value.title()) if state else "Scheduled",
        last_seen_at=max(_utc(t) for t in seen),
        kept_pods=[t[len(KEPT_TAG_PREFIX) :] for t in run.tags if t.startswith(KEPT_TAG_PREFIX)],
    )


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _decide_all(
    pods: list[PodHandle],
    now: datetime,
    *,
    name_prefix: str,
    ttl_seconds: float | None,
    stale_running_seconds: float,
    grace_seconds: float,
) -> list[ReapDecision]:
    """One decision per pod, from its flow run as the Prefect API sees it now."""
    decisions: list[ReapDecision] = []
    with get_client(sync_client=True) as client:
        for pod in pods:
            run_id = flow_run_id_from_pod_name(pod.name, name_prefix)
            run = read_run_snapshot(client, run_id) if run_id is not None else None
            reap, reason = decide_reap(
                pod,
                run,
                now,
                name_prefix=name_prefix,
                ttl_seconds=ttl_seconds,
                stale_running_seconds=stale_running_seconds,
                grace_seconds=grace_seconds,
            )
            decisions.append(
                ReapDecision(
                    pod_id=pod.pod_id,
                    pod_name=pod.name,
                    flow_run_id=str(run_id) if run_id else None,
                    run_state=run.state_name if run else ("unknown" if run_id else "-"),
                    age_seconds=round((now - _utc(pod.created_at)).total_seconds(), 1),
                    reap=reap,
                    reason=reason,
                )
            )
    return decisions


def _act_on(
    decision: ReapDecision, pod: PodHandle, prov: PodProvider, dry_run: bool, logger: Any
) -> None:
    """Keep the pod, report what would be done (``dry_run``), or terminate it and record
    the end in its run's cost record; an unconfirmed terminate is kept in ``decision``."""
    if not decision.reap:
        logger.info("keep %s (%s): %s", decision.pod_id, decision.pod_name, decision.reason)
        return
    if dry_run:
        logger.warning(
            "would reap %s (%s): %s", decision.pod_id, decision.pod_name, decision.reason
        )
        return
    logger.warning("reaping %s (%s): %s", decision.pod_id, decision.pod_name, decision.reason)
    tried = deadman_note(pod)  # read before the pod (and its files) are gone
    try:
        result = terminate_pod(prov, decision.pod_id)
        decision.terminated = True
    except ProviderError as exc:
        decision.error = str(exc)
        logger.error("%s: terminate not confirmed: %s", decision.pod_id, exc)
        return
    if decision.flow_run_id:
        record_pod_end(
            decision.flow_run_id,
            result.end(
                EndedBy.REAPER,
                "terminate (the reaper)",
                detail=f"{decision.reason}; dead-man: {tried}"[:300],
            ),
            recorded_by="reaper",
            handle=pod,
            provider=prov,
        )
        cause = f"the reaper ended its pod {decision.pod_id}: {decision.reason}"
        try:
            if mark_crashed(decision.flow_run_id, cause):
                logger.warning("run %s marked Crashed: %s", decision.flow_run_id, cause)
        except Exception as exc:  # the pod is ended and recorded; the state is beside it
            logger.warning("could not mark run %s Crashed: %s", decision.flow_run_id, exc)


@flow(name="runpod-reaper", log_prints=False)
def reaper(
    provider: ProviderName = DEFAULT_PROVIDER,
    name_prefix: str = DEFAULT_NAME_PREFIX,
    ttl_seconds: float | None = None,
    stale_running_seconds: float = 900.0,
    grace_seconds: float = 60.0,
    dry_run: bool = False,
    runpod_credentials_block: str | None = None,
    runpod_spec_block: str | None = None,
    ssh_key_block: str | None = None,
) -> list[dict]:
    """Terminate pods no live flow run stands behind (see the module docstring).

    Args:
        provider: ``local`` or ``runpod``.
        name_prefix: only pods named ``<name_prefix>-…`` are considered.
        ttl_seconds: hard maximum pod age in seconds, applied whatever the run says;
            None (the default) for each pod's recorded lifetime plus
            ``REAPER_TTL_GRACE_SECONDS`` (``DEFAULT_POD_LIFETIME_SECONDS`` plus that for a
            pod that recorded none). Must be above 0.
        stale_running_seconds: silence (no state change, no heartbeat) after which an
            unfinished run counts as dead. Keep it above 2× the heartbeat interval
            (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, 180 s by default).
        grace_seconds: a pod whose run is unknown is spared while younger than this.
        dry_run: decide and report, terminate nothing.
        runpod_credentials_block / runpod_spec_block / ssh_key_block: saved block names
            for ``provider="runpod"``, as the fine-tune flow takes them (without them,
            ``RUNPOD_API_KEY`` and ``RUNPOD_SSH_KEY_PATH``).

    Returns:
        One ``ReapDecision`` per pod, as JSON-ready dicts.

    Raises:
        SpecError: a malformed prefix, a number that is NaN, infinite or out of range,
            or a named block that is not saved; nothing is listed or terminated.
        TerminateError: after reporting, when any terminate was not confirmed (the
            message lists the pods still billing).
    """
    check_name_prefix(name_prefix)
    check_number("ttl_seconds", ttl_seconds, optional=True)
    check_number("stale_running_seconds", stale_running_seconds)
    check_number("grace_seconds", grace_seconds)
    logger = get_run_logger()
    prov, _ = build_provider(
        {
            "provider": provider,
            "runpod_credentials_block": runpod_credentials_block,
            "runpod_spec_block": runpod_spec_block,
            "ssh_key_block": ssh_key_block,
        },
        need_ssh_key=False,  # the reaper only lists and terminates
    )
    pods = prov.list(name_prefix)
    now = datetime.now(UTC)
    decisions = _decide_all(
        pods,
        now,
        name_prefix=name_prefix,
        ttl_seconds=ttl_seconds,
        stale_running_seconds=stale_running_seconds,
        grace_seconds=grace_seconds,
    )
    by_id = {pod.pod_id: pod for pod in pods}
    for decision in decisions:
        _act_on(decision, by_id[decision.pod_id], prov, dry_run, logger)
    rows = [d.model_dump() for d in decisions]
    hold_artifact(
        "reaper-report",
        "table",
        rows
        or [
            {
                "pod_id": "-",
                "pod_name": "-",
                "reap": False,
                "reason": f"no pods named {name_prefix}-*",
            }
        ],
        f"Reaper pass over {provider} pods named {name_prefix}-* at {now.isoformat()}",
    )
    outbox().flush()  # in Prefect before the flow ends, unless the API is down
    failed = [d.pod_id for d in decisions if d.error]
    if failed:
        raise TerminateError(
            f"reaper could not confirm termination of {', '.join(failed)}: they may still bill; "
            f"terminate them by hand (RunPod console or `prefect-runpod terminate POD_ID`)"
        )
    return rows
