"""The outbox of the run's Prefect API writes (``blocks.api_outbox``), against the
session's real Prefect test server behind a port that refuses while the test holds it
down: writes held through the outage and written when the API is back, the outage told
once and its end once, a refused write and one that did not fit named, progress updates
coalesced."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from prefect_runpod.blocks.api_outbox import ApiOutbox, fresh_client
from prefect_runpod.blocks.held_artifacts import hold_artifact, update_held_progress
from tests.fixtures.prefect_outage import ApiSwitch

DEADLINE = 120.0
"""A hang guard: every wait below ends on an event long before."""


class Said:
    """What an outbox told the terminal, and an event for each kind of line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.down, self.back = threading.Event(), threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if "does not answer" in line:
            self.down.set()
        if "answers again" in line:
            self.back.set()


def _box(**kw: Any) -> tuple[ApiOutbox, Said]:
    said = Said()
    return ApiOutbox(say=said, first_pause_seconds=0.05, max_pause_seconds=0.5, **kw), said


def _artifacts(key: str) -> list[Any]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with fresh_client() as client:
        return list(
            client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        )


def _key(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:10]}"


def test_writes_made_while_the_api_is_down_are_written_when_it_is_back(
    api_switch: ApiSwitch,
) -> None:
    box, said = _box()
    keys = [_key("held-table"), _key("held-note")]
    api_switch.down()
    first = hold_artifact(keys[0], "table", [{"metric": "loss", "value": 0.25}], "rows", box=box)
    hold_artifact(keys[1], "markdown", "[model](file:///tmp/outputs)", "a link", box=box)
    assert said.down.wait(DEADLINE), said.lines
    assert box.down_since is not None
    assert box.held == [f"artifact {keys[0]}", f"artifact {keys[1]}"]
    assert box.flush() == box.held  # a writer never waits on a Prefect that is down
    assert first.id is None
    api_switch.up()
    assert box.drain(DEADLINE) == []
    assert said.back.is_set() and box.down_since is None
    assert [line for line in said.lines if "does not answer" in line][1:] == []  # told once
    assert len([line for line in said.lines if "answers again" in line]) == 1
    assert first.id is not None
    (table,) = _artifacts(keys[0])
    assert table.type == "table" and "loss" in str(table.data)
    (note,) = _artifacts(keys[1])
    assert note.data == "[model](file:///tmp/outputs)"
    assert box.finish(0) == []


def test_progress_updates_held_through_an_outage_coalesce_to_the_last(
    api_switch: ApiSwitch,
) -> None:
    box, said = _box(capacity=3)
    key = _key("held-progress")
    progress = hold_artifact(key, "progress", 0.0, "training", box=box)
    assert box.flush() == []
    assert progress.id is not None
    api_switch.down()
    for percent in (10, 20, 30, 40, 50):
        update_held_progress(progress, percent, box=box)
    assert said.down.wait(DEADLINE), said.lines
    assert box.unwritten == []  # 5 updates, room for 3: each replaced the one still queued
    api_switch.up()
    assert box.drain(DEADLINE) == []
    (artifact,) = _artifacts(key)
    assert float(artifact.data) == 50.0
    assert box.unwritten == []


def test_a_create_whose_answer_was_lost_is_not_made_twice(api_switch: ApiSwitch) -> None:
    """The API went down while it answered the progress artifact's create: the server
    had made it, the outbox saw only the cut. The next try takes that artifact instead of
    making a second one (a loaded run's Prefect showed train-progress twice, at 0 and
    100 %), and the update lands on it."""
    box, said = _box()
    key = _key("lost-answer")
    api_switch.lose_answer_to(b"POST /api/artifacts/")
    progress = hold_artifact(key, "progress", 0.0, "training", box=box)
    assert said.down.wait(DEADLINE), said.lines
    assert progress.id is None  # the server made it; the outbox saw only the cut
    update_held_progress(progress, 100, box=box)
    api_switch.up()
    assert box.drain(DEADLINE) == []
    (artifact,) = _artifacts(key)
    assert float(artifact.data) == 100.0
    assert progress.id == artifact.id and box.unwritten == []


def test_a_full_outbox_and_a_refused_write_are_named(api_switch: ApiSwitch) -> None:
    from prefect.client.schemas.actions import ArtifactUpdate

    box, said = _box(capacity=2)
    api_switch.down()
    keys = [_key("fits"), _key("fits"), _key("overflow")]
    for key in keys:
        hold_artifact(key, "markdown", "x", "d", box=box)
    assert said.down.wait(DEADLINE), said.lines
    assert box.unwritten == [f"artifact {keys[2]} (not held: 2 writes were waiting already)"]
    left = box.finish(0)  # the API stays down: what could not be written is named
    assert f"artifact {keys[0]} (not written)" in left and f"artifact {keys[2]}" in left[-1]
    assert any("could not be written" in line for line in said.lines)
    api_switch.up()
    assert box.drain(DEADLINE) == []
    box.put(
        "a progress update", lambda c: c.update_artifact(uuid.uuid4(), ArtifactUpdate(data=1.0))
    )
    assert box.drain(DEADLINE) == []
    assert box.unwritten[-1].startswith("a progress update (refused: ")
    assert [a.key for a in _artifacts(keys[0])] == [keys[0]]
    assert _artifacts(keys[2]) == []


@pytest.mark.parametrize("how", ["refused port", "answering"])
def test_is_outage_tells_an_unreachable_api_from_a_refusal(api_switch: ApiSwitch, how: str) -> None:
    from prefect.client.schemas.actions import ArtifactUpdate

    from prefect_runpod.blocks.api_outbox import is_outage

    if how == "refused port":
        api_switch.down()
    with pytest.raises(Exception) as caught, fresh_client() as client:
        client.update_artifact(uuid.uuid4(), ArtifactUpdate(data=1.0))
    assert is_outage(caught.value) is (how == "refused port")
