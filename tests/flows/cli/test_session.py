"""The CLI's session: Prefect's settings, read once with one sentence for a bad one."""

from __future__ import annotations

import gc

import pytest
from pydantic import BaseModel, ValidationError

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.flows.cli.session import prefect_settings


class _Api(BaseModel):
    request_timeout: float


def _bad_settings() -> None:
    _Api(request_timeout="abc")  # type: ignore[arg-type]


def test_a_setting_prefect_cannot_read_is_named_by_its_variable(monkeypatch):
    monkeypatch.setenv("PREFECT_API_REQUEST_TIMEOUT", "abc")
    with pytest.raises(SpecError) as info:
        prefect_settings(_bad_settings)
    message = str(info.value)
    assert message.startswith("Prefect cannot read its settings (PREFECT_API_REQUEST_TIMEOUT")
    assert "'abc': Input should be a valid number" in message and "\n" not in message
    assert not isinstance(info.value.__cause__, ValidationError)  # said, not chained


def test_settings_that_load_are_returned():
    assert prefect_settings(lambda: "the settings") == "the settings"


@pytest.fixture
def collector_restored():
    """Whatever a test does to the cyclic collector, the next test finds it on and its
    heap unfrozen."""
    yield
    gc.enable()
    gc.unfreeze()


def test_the_collector_paused_for_the_imports_comes_back_frozen_when_the_api_opens(
    prefect_server, collector_restored
):
    """``console_main`` pauses the collector while the command loads Prefect; opening
    the API turns it back on with what was loaded frozen, so a long run collects."""
    from prefect_runpod.flows.cli.session import pause_collector, prefect_api

    gc.unfreeze()
    pause_collector()
    assert not gc.isenabled()
    with prefect_api() as url:
        assert gc.isenabled(), "a run would go on without a garbage collector"
        assert gc.get_freeze_count() > 0
        assert url.startswith("http://127.0.0.1:")


def test_a_collector_its_caller_turned_off_stays_off(prefect_server, collector_restored):
    """A program that calls ``main`` with its collector off on purpose keeps it off."""
    from prefect_runpod.flows.cli.session import pause_collector, prefect_api

    gc.disable()
    pause_collector()
    before = gc.get_freeze_count()
    with prefect_api():
        assert not gc.isenabled()
        assert gc.get_freeze_count() == before, "the caller's heap was frozen"
