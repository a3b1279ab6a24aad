"""The console recognises the gateway's PTY refusal from the one shared text."""

from __future__ import annotations

from prefect_runpod.blocks.console import ssh
from prefect_runpod.blocks.exceptions import GATEWAY_PTY_ERROR


def test_refusal_is_matched_with_or_without_its_error_prefix() -> None:
    assert ssh._PTY_REFUSAL == b"Your SSH client doesn't support PTY"
    assert ssh._PTY_REFUSAL in GATEWAY_PTY_ERROR.encode()
    assert ssh._PTY_REFUSAL in b"Your SSH client doesn't support PTY\n"
