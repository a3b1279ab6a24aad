"""The upload and download tasks borrow a console the same way: the caller's stays
open, one opened for the pod is closed even when the transfer fails."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.tasks.pod_io import borrowed_console


class _Console:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


HANDLE = PodHandle(
    pod_id="p-borrow",
    name="n",
    provider="local",
    ssh=SSHEndpoint(host="127.0.0.1", port=2222, user="root"),
)
KEY = SecretStr("not a key")


def test_the_callers_console_is_lent_not_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PodConsole, "for_pod", lambda *a, **k: pytest.fail("opened a console"))
    mine = _Console()
    with borrowed_console(HANDLE, KEY, mine) as live:
        assert live is mine
    with pytest.raises(RuntimeError), borrowed_console(HANDLE, KEY, mine):
        raise RuntimeError("transfer failed")
    assert mine.closed == 0


def test_an_opened_console_is_closed_even_on_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[_Console] = []

    def for_pod(
        cls: type, handle: PodHandle, private_key: SecretStr, reconnect: object = None
    ) -> _Console:
        assert handle is HANDLE and private_key is KEY and reconnect is None
        opened.append(_Console())
        return opened[-1]

    monkeypatch.setattr(PodConsole, "for_pod", classmethod(for_pod))
    with borrowed_console(HANDLE, KEY) as live:
        assert live is opened[0] and live.closed == 0
    assert opened[0].closed == 1
    with pytest.raises(RuntimeError), borrowed_console(HANDLE, KEY):
        raise RuntimeError("transfer failed")
    assert opened[1].closed == 1
