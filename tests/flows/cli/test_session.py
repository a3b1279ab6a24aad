"""The CLI's session: Prefect's settings, read once with one sentence for a bad one."""

from __future__ import annotations

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
