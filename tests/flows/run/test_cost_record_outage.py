"""A pod's end recorded from outside its run (a hook, the reaper, the guardian, the
worker, ``prefect-runpod terminate``) while the Prefect API is down (issue 24): the
record of that end is held in the process's outbox, not dropped, and written once the
API answers: read, merged with the run's record and written as one. Before: it was
dropped with a warning ("could not read its cost record") and the run's record stayed
"may still be billing". Through the session's Prefect test server behind a switch."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.provider import EndedBy, PodEnd
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.cost_record import (
    CostRecord,
    latest_record,
    publish_record,
    record_pod_end,
)
from tests.fixtures.prefect_outage import ApiSwitch

DEADLINE = 120.0
"""A hang guard: every wait below ends on an event."""


def _running_run() -> str:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="outage-finetune")
    def ghost(provider: str = "local") -> None: ...

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(ghost, parameters={"provider": "local"}, state=Running())
    return str(run.id)


def test_a_pod_end_recorded_during_an_outage_is_written_once_the_api_answers(
    api_switch: ApiSwitch, tmp_path: Path
) -> None:
    run_id, pod_id = _running_run(), f"lp{uuid.uuid4().hex[:12]}"
    created = datetime.now(UTC) - timedelta(seconds=30)
    attempt = PodAttempt(pod_id=pod_id, provider="local", cost_per_hr=0.36, created_at=created)
    rented = CostRecord(flow_run_id=run_id, attempts=[attempt], output_dir=str(tmp_path))
    rented.settle()
    publish_record(rented)
    ended = created + timedelta(seconds=12)
    end = PodEnd(pod_id=pod_id, ended_by=EndedBy.REAPER, confirmed=True, ended_at=ended,
                 layer="terminate (the reaper)")  # fmt: skip

    api_switch.down()
    assert record_pod_end(run_id, end, recorded_by="reaper") is None  # held, not lost
    assert f"the finetune-costs record of pod {pod_id}'s end" in outbox().held
    api_switch.up()
    assert outbox().drain(DEADLINE) == []

    record = latest_record(run_id)
    assert record is not None and record.recorded_by == "reaper"
    assert record.end is not None and record.end.confirmed
    assert (record.end.ended_by, record.end.ended_at) == (EndedBy.REAPER, ended)
    assert record.billed_seconds == 12.0 and not record.may_still_bill
    # with the API up it is written before the call returns
    again = end.model_copy(update={"ended_by": EndedBy.HOOK, "layer": "terminate (hook)"})
    written = record_pod_end(run_id, again, recorded_by="hook")
    assert written is not None and latest_record(run_id).recorded_by == "hook"  # type: ignore[union-attr]
