"""The run's artifacts, written through the outbox (:mod:`.api_outbox`): a new version of
an artifact, a progress artifact's updates, and a retry that never makes an artifact
twice (docs/architecture.md#prefect-surface).

A try that meets an outage may still have reached the server, its answer lost on the
way back; the next try takes the artifact the server made instead of making a second.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect_runpod.blocks.api_outbox import ApiOutbox, Held, outbox

__all__ = ["HeldArtifact", "hold_artifact", "update_held_progress"]


@dataclass
class HeldArtifact:
    """An artifact queued in the outbox: ``id`` is its Prefect id once written (None
    before, or when it was given up)."""

    held: Held

    @property
    def id(self) -> UUID | None:
        created = self.held.result
        return getattr(created, "id", None)


def hold_artifact(
    key: str,
    kind: str,
    data: Any,
    description: str,
    *,
    flow_run_id: str | UUID | None = None,
    box: ApiOutbox | None = None,
) -> HeldArtifact:
    """Queue a new version of artifact ``key`` for the run this is called in (or
    ``flow_run_id``), through the outbox; returns at once.

    Args:
        key: the artifact's key (``checksum-manifest``).
        kind: Prefect's artifact type: ``table`` (``data``: a list of row dicts),
            ``markdown`` (a string), ``progress`` (a percent, 0-100).
        data: the artifact's data, as above.
        description: its one-line description.
        flow_run_id: the run it belongs to; default: the flow run of the current context
            (and its task run, when called inside one).
        box: the outbox (default: the process's).
    """
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.utilities.context import get_task_and_flow_run_ids

    task_run_id, context_flow_run_id = get_task_and_flow_run_ids()
    if flow_run_id is not None:
        task_run_id = None
    run_id = flow_run_id or context_flow_run_id
    payload = _format(kind, data)
    fields: dict[str, Any] = {"key": key, "type": kind, "data": payload}
    fields["description"] = description
    if run_id is not None:
        fields["flow_run_id"] = run_id
    if task_run_id is not None:
        fields["task_run_id"] = task_run_id
    create = ArtifactCreate(**fields)
    tried: list[bool] = []

    def write(client: Any) -> Any:
        # A try that met an outage may still have reached the server (the answer was
        # lost on the way back): the next one takes that artifact rather than make twice
        if tried and (made := _made_before(client, create)) is not None:
            return made
        tried.append(True)
        return client.create_artifact(create)

    held = (box or outbox()).put(f"artifact {key}", write)
    return HeldArtifact(held)


def _made_before(client: Any, create: Any) -> Any:
    """The newest artifact of ``create``'s key in its run (and task run), when it holds
    exactly what ``create`` would write; else None."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        ArtifactFilterTaskRunId,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    where = ArtifactFilter(key=ArtifactFilterKey(any_=[create.key]))
    if create.flow_run_id is not None:
        where.flow_run_id = ArtifactFilterFlowRunId(any_=[create.flow_run_id])
    if create.task_run_id is not None:
        where.task_run_id = ArtifactFilterTaskRunId(any_=[create.task_run_id])
    newest = client.read_artifacts(artifact_filter=where, sort=ArtifactSort.CREATED_DESC, limit=1)
    same = ("type", "data", "description")
    if newest and all(getattr(newest[0], f) == getattr(create, f) for f in same):
        return newest[0]
    return None


def update_held_progress(
    artifact: HeldArtifact, percent: float, *, box: ApiOutbox | None = None
) -> None:
    """Queue a progress update of ``artifact`` (a ``progress`` one) to ``percent``
    (0-100); an update still queued is replaced by this one. Nothing is written when the
    artifact itself could not be."""
    from prefect.client.schemas.actions import ArtifactUpdate

    key = f"progress {id(artifact)}"
    value = max(0.0, min(100.0, float(percent)))

    def write(client: Any) -> None:
        if artifact.id is not None:  # written in order: the create was tried before
            client.update_artifact(artifact.id, ArtifactUpdate(data=value))

    (box or outbox()).put(f"{artifact.held.what} update", write, coalesce=key)


def _format(kind: str, data: Any) -> Any:
    """The artifact's data as Prefect stores it (tables as JSON text, NaN as null)."""
    if kind == "table":
        return json.dumps(_sanitize(data))
    if kind == "progress":
        return max(0.0, min(100.0, float(data)))
    return data


def _sanitize(item: Any) -> Any:
    if isinstance(item, list):
        return [_sanitize(x) for x in item]
    if isinstance(item, dict):
        return {k: _sanitize(v) for k, v in item.items()}
    if isinstance(item, float) and math.isnan(item):
        return None
    return item
