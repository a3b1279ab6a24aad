"""Pod lifecycle pieces of the RunPod provider: endpoints from a pod answer, an SSH
key-exchange probe, and a terminate that returns only once RunPod confirms the pod gone.

Terminate mirrors the lesson from dstack's RunPod backend, which marks an instance
terminated after 15 minutes of failed attempts anyway (a known orphan path): here a
pod is gone only when RunPod reads it back as ``pod: null``/TERMINATED or answers
``pod not found``; a timeout raises ``TerminateError`` with the manual next step.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import paramiko

from prefect_runpod.blocks.exceptions import TerminateError
from prefect_runpod.blocks.pod_handle import SSHEndpoint
from prefect_runpod.blocks.provider import TerminateResult
from prefect_runpod.blocks.runpod.client import RunPodClient
from prefect_runpod.blocks.runpod.errors import ErrorKind, FailoverAction, classify_exception

__all__ = ["GONE_STATUSES", "direct_endpoint", "probe_ssh_host_key", "terminate_until_gone"]

logger = logging.getLogger("prefect_runpod.runpod")

GONE_STATUSES = frozenset({"TERMINATED"})
"""``desiredStatus`` values of a pod that is gone: terminate counts one as confirmed,
and the provider's ``find`` and ``list`` leave it out."""


def direct_endpoint(pod: dict[str, Any]) -> SSHEndpoint | None:
    """The direct-TCP SSH endpoint of a pod answer: ``runtime.ports`` holding
    ``privatePort 22``, type ``tcp``, on a public IP (as the SDK's own CLI connects)."""
    for port in ((pod.get("runtime") or {}).get("ports")) or []:
        if (
            port.get("privatePort") == 22
            and port.get("type") == "tcp"
            and port.get("isIpPublic")
            and port.get("ip")
            and port.get("publicPort")
        ):
            return SSHEndpoint(
                host=port["ip"], port=int(port["publicPort"]), user="root", mode="direct"
            )
    return None


def probe_ssh_host_key(host: str, port: int, timeout_seconds: float) -> str | None:
    """Run an SSH key exchange (paramiko) and return the server's host key line
    (``ssh-ed25519 AAAA…``), or None when nothing answers within ``timeout_seconds``."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_seconds)
    except OSError:
        return None
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout_seconds
        transport.start_client(timeout=timeout_seconds)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    except (paramiko.SSHException, OSError, EOFError):
        return None
    finally:
        transport.close()


def terminate_until_gone(
    client: RunPodClient,
    pod_id: str,
    *,
    timeout_seconds: float = 120.0,
    initial_delay_seconds: float = 1.0,
    poll_interval_seconds: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> TerminateResult:
    """Terminate ``pod_id`` and return once RunPod reads it back as gone.

    Idempotent: ``pod not found to terminate`` and ``pod: null`` count as gone.
    Transient failures (``Something went wrong``, 5xx, network) are retried until
    the deadline; the terminate call is repeated while the pod still reads back.

    Args:
        client: the bound SDK client.
        pod_id: a validated pod id.
        timeout_seconds: how long to try before giving up (raising, never "gone").
        initial_delay_seconds: first pause after a failed call (doubles, up to the poll).
        poll_interval_seconds: the longest pause between read-backs.
        sleep: the sleep function.

    Returns:
        A ``TerminateResult``; ``confirmed_at`` is when billing ended.

    Raises:
        TerminateError: not confirmed within ``timeout_seconds`` (the pod may still
            bill; the message says how to end it by hand). Never reports gone then.
    """
    deadline = time.monotonic() + timeout_seconds
    calls, already_gone, send, delay = 0, False, True, initial_delay_seconds
    last = "no answer yet"
    while True:
        if send:
            calls += 1
            try:
                client.terminate_pod(pod_id)
                send = False
            except Exception as exc:
                classified = classify_exception(exc)
                last = f"terminate: {classified.message}"
                if classified.action is FailoverAction.GONE:
                    already_gone = calls == 1
                    send = False
                elif classified.kind is ErrorKind.AUTH:
                    raise TerminateError(
                        f"pod {pod_id}: RunPod refused the API key while terminating; the "
                        "pod may still be billing — terminate it in the RunPod console "
                        f"or run `prefect-runpod terminate {pod_id}` with a valid key.",
                        pod_id=pod_id,
                    ) from exc
        if not send:
            try:
                pod = client.get_pod(pod_id)
                if pod is None or pod.get("desiredStatus") in GONE_STATUSES:
                    logger.info("%s: terminate confirmed", pod_id)
                    return TerminateResult(
                        pod_id=pod_id,
                        confirmed_at=datetime.now(UTC),
                        already_gone=already_gone,
                        attempts=calls,
                    )
                last = f"still desiredStatus={pod.get('desiredStatus')}"
                send = True  # ask again while it still reads back
            except Exception as exc:
                classified = classify_exception(exc)
                last = f"read back: {classified.message}"
                if classified.action is FailoverAction.GONE:
                    return TerminateResult(
                        pod_id=pod_id,
                        confirmed_at=datetime.now(UTC),
                        already_gone=already_gone,
                        attempts=calls,
                    )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TerminateError(
                f"pod {pod_id}: terminate not confirmed after {timeout_seconds:.0f} s "
                f"({calls} calls; last: {last}). It may still be billing: run "
                f"`prefect-runpod terminate {pod_id}` or terminate it in the RunPod console.",
                pod_id=pod_id,
            )
        sleep(min(delay, remaining))
        delay = min(delay * 2 or poll_interval_seconds, poll_interval_seconds)
