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
from prefect_runpod.blocks.provider import PodCause, PodStatus, TerminateResult, end_command
from prefect_runpod.blocks.runpod.client import RunPodClient
from prefect_runpod.blocks.runpod.errors import ErrorKind, FailoverAction, classify_exception

__all__ = [
    "GONE_STATUSES",
    "LOST_STATUSES",
    "direct_endpoint",
    "probe_ssh_host_key",
    "status_from_pod",
    "terminate_until_gone",
]

logger = logging.getLogger("prefect_runpod.runpod")

GONE_STATUSES = frozenset({"TERMINATED"})
"""``desiredStatus`` values of a pod that is gone: terminate counts one as confirmed,
and the provider's ``find`` and ``list`` leave it out."""


LOST_STATUSES = frozenset({"ERROR", "DEAD"})
"""``desiredStatus`` values of a pod whose host failed it (REST v2 says ``ERROR``)."""


def status_from_pod(pod_id: str, pod: dict[str, Any] | None) -> PodStatus:
    """Map one ``pod(input:{podId})`` answer to a ``PodStatus``.

    ``pod: null`` (RunPod forgets terminated pods) or TERMINATED → ``terminated_outside``;
    EXITED → ``exited``; ERROR/DEAD → ``host_lost``; RUNNING with a ``runtime`` →
    ``alive``; anything else (``runtime: null``, CREATED, RESTARTING) → ``starting``.
    """
    if pod is None:
        return PodStatus(
            pod_id=pod_id,
            cause=PodCause.TERMINATED_OUTSIDE,
            provider_status="RunPod no longer knows it",
        )
    status = str(pod.get("desiredStatus") or "?")
    runtime = "up" if pod.get("runtime") else "null"
    said = f"RunPod: desiredStatus={status} runtime={runtime}"
    if status in GONE_STATUSES:
        cause = PodCause.TERMINATED_OUTSIDE
    elif status == "EXITED":
        cause = PodCause.EXITED
    elif status in LOST_STATUSES:
        cause = PodCause.HOST_LOST
    elif status == "RUNNING" and pod.get("runtime"):
        cause = PodCause.ALIVE
    else:
        cause = PodCause.STARTING
    return PodStatus(pod_id=pod_id, cause=cause, provider_status=said)


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
    the deadline; the terminate call is repeated while the pod still reads back. An
    answer that retrying cannot change (HTTP 401, a GraphQL validation error, an
    unrecognised answer) stops at once with RunPod's message.

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
        TerminateError: refused for good, or not confirmed within ``timeout_seconds``
            (the pod may still bill; the message says how to end it by hand). Never
            reports gone then.
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
                elif classified.action is not FailoverAction.RETRY:
                    raise _refused(pod_id, classified.kind, classified.message) from exc
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
                if classified.action is FailoverAction.STOP:
                    raise _refused(pod_id, classified.kind, classified.message) from exc
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
                f"`{end_command('runpod', pod_id)}` or terminate it in the RunPod console.",
                pod_id=pod_id,
            )
        sleep(min(delay, remaining))
        delay = min(delay * 2 or poll_interval_seconds, poll_interval_seconds)


def _refused(pod_id: str, kind: ErrorKind, message: str) -> TerminateError:
    """The error for a terminate answer that retrying cannot change (a refused key, an
    invalid request), with RunPod's own words and the way to end the pod by hand."""
    why = "refused the API key" if kind is ErrorKind.AUTH else "refused the request"
    return TerminateError(
        f"pod {pod_id}: RunPod {why} while terminating ({message}); retrying cannot help. "
        "It may still be billing: terminate it in the RunPod console, or fix the cause and "
        f"run `{end_command('runpod', pod_id)}`.",
        pod_id=pod_id,
    )
