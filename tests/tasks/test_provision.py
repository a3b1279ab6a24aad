"""Readying a pod waits out its SSH under the run's one reconnect policy: a link that
drops is tried again within the budget, the provider is asked before each retry, and a
failure waiting cannot fix (a changed host key) is not tried again."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import ConsoleConnectError, PodGoneError
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider import PodCause, PodStatus
from prefect_runpod.blocks.transfer import pod_tools
from prefect_runpod.tasks.provision import prepare_pod

HANDLE = PodHandle(
    pod_id="prep1",
    name="prft-prep1",
    provider="local",
    ssh=SSHEndpoint(host="127.0.0.1", port=2222, user="root"),
)
KEY = SecretStr("not a key")


class _Console:
    def __enter__(self) -> _Console:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _pod(monkeypatch: pytest.MonkeyPatch, failures: list[ConsoleConnectError]) -> list[int]:
    """Consoles that fail to open with ``failures`` first; returns the open count."""
    opened = [0]

    def for_pod(cls: type, handle: PodHandle, key: SecretStr, **kw: Any) -> _Console:
        assert isinstance(kw.get("reconnect"), ReconnectPolicy)
        opened[0] += 1
        if failures:
            raise failures.pop(0)
        return _Console()

    monkeypatch.setattr(PodConsole, "for_pod", classmethod(for_pod))
    monkeypatch.setattr(pod_tools, "bootstrap_pod_tools", lambda console, handle: "/tools")
    return opened


def _policy(status: PodStatus | None = None) -> ReconnectPolicy:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    return ReconnectPolicy(
        budget_seconds=30.0,
        status=(lambda: status) if status is not None else None,
        sleep=sleep,
        clock=lambda: now[0],
    )


def test_a_dropped_link_is_tried_again_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    drops = [ConsoleConnectError("dropped", pod_id="prep1") for _ in range(4)]
    opened = _pod(monkeypatch, drops)
    assert prepare_pod(HANDLE, KEY, "/run", None, _policy()) == "/tools"
    assert opened[0] == 5  # four drops waited out, then ready


def test_a_changed_host_key_is_not_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = _pod(monkeypatch, [ConsoleConnectError("host key changed", retryable=False)])
    with pytest.raises(ConsoleConnectError, match="host key changed"):
        prepare_pod(HANDLE, KEY, "/run", None, _policy())
    assert opened[0] == 1


def test_a_pod_gone_meanwhile_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = PodStatus(pod_id="prep1", cause=PodCause.TERMINATED_OUTSIDE, provider_status="not found")
    opened = _pod(monkeypatch, [ConsoleConnectError("refused", pod_id="prep1")] * 5)
    with pytest.raises(PodGoneError, match="terminated outside this run"):
        prepare_pod(HANDLE, KEY, "/run", None, _policy(gone))
    assert opened[0] == 1
