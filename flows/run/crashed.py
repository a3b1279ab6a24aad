"""A run whose process was killed stays Running in Prefect (a self-hosted server never
moves a SIGKILLed script run out of Running): whoever ends its pod for it — the reaper,
the run's guardian, ``prefect-runpod cost --reconcile --mark-crashed`` — sets it Crashed
with the cause, through the Prefect API (docs/architecture.md#termination-layers).
"""

from __future__ import annotations

__all__ = ["FINISHED_STATE_TYPES", "mark_crashed", "run_state", "run_state_type"]

from prefect_runpod.flows.run.names import FINISHED_STATE_TYPES


def run_state(flow_run_id: str) -> str:
    """The run's Prefect state type (``RUNNING``, ``CRASHED``…), ``UNKNOWN`` when it has
    no state.

    Raises:
        Whatever the Prefect client raises (``ObjectNotFound`` for a run the API does not
        know, or when the API cannot be reached).
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
    return state.type.value if state else "UNKNOWN"


def run_state_type(flow_run_id: str) -> str | None:
    """The run's Prefect state type (``RUNNING``, ``CRASHED``…), or None when the API has
    no such run.

    Raises:
        Whatever the Prefect client raises when the API cannot be reached.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
        except ObjectNotFound:
            return None
    return run.state.type.value if run.state else "SCHEDULED"


def mark_crashed(flow_run_id: str, cause: str) -> bool:
    """Set the run Crashed with ``cause`` as its state message, unless its state is final
    already (a run that ended on its own keeps its state) or the API has no such run.

    Args:
        flow_run_id: the run.
        cause: one sentence: who ended its pod, and why the run could not
            (``the guardian ended pod 50qy…: the run's process (pid 4242) died during
            provision, before the pod's dead-man switch was armed``).

    Returns:
        True when the state was set now.

    Raises:
        Whatever the Prefect client raises when the API cannot be reached.
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    state = run_state_type(flow_run_id)
    if state is None or state in FINISHED_STATE_TYPES:
        return False
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Crashed(message=cause[:500]), force=True)  # type: ignore[arg-type]
    return True
