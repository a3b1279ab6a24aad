"""Pod lifecycle pieces of the RunPod provider: endpoints from a pod answer, an SSH
key-exchange probe, a boot failure named from the pod's ``system`` log, and a terminate
that returns only once RunPod confirms the pod gone.

Terminate mirrors the lesson from dstack's RunPod backend, which marks an instance
terminated after 15 minutes of failed attempts anyway (a known orphan path): here a
pod is gone only when RunPod reads it back as gone (REST v2: 404 or TERMINATED; GraphQL:
``pod: null``/TERMINATED) or answers that it is not there; a timeout raises
``TerminateError`` with the manual next step. Everything here reads ``PodRecord``s
through ``RunPodApi``, whichever API answers.
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import paramiko

from prefect_runpod.blocks.exceptions import TerminateError
from prefect_runpod.blocks.pod_handle import SSHEndpoint
from prefect_runpod.blocks.provider import PodCause, PodStatus, TerminateResult, end_command
from prefect_runpod.blocks.runpod.api import PodRecord, RunPodApi
from prefect_runpod.blocks.runpod.errors import ErrorKind, FailoverAction, classify_exception
from prefect_runpod.blocks.validation.parameters import DEFAULT_TERMINATE_TIMEOUT_SECONDS

__all__ = [
    "BOOT_FAILURES",
    "GONE_STATUSES",
    "boot_diagnosis",
    "LOST_STATUSES",
    "direct_endpoint",
    "probe_ssh_host_key",
    "status_from_pod",
    "terminate_until_gone",
]

logger = logging.getLogger("prefect_runpod.runpod")

GONE_STATUSES = frozenset({"TERMINATED"})
"""Statuses of a pod that is gone: terminate counts one as confirmed, and the
provider's ``find`` and ``list`` leave it out."""


LOST_STATUSES = frozenset({"ERROR"})
"""Statuses of a pod whose host failed it (GraphQL's ``DEAD`` reads as ``ERROR``)."""


def status_from_pod(pod_id: str, pod: PodRecord | None) -> PodStatus:
    """Map one read of a pod to a ``PodStatus``.

    None (RunPod forgets terminated pods: 404, ``pod: null``) or TERMINATED →
    ``terminated_outside``; EXITED → ``exited``; ERROR → ``host_lost``; RUNNING with a
    runtime → ``alive``; anything else (PROVISIONING, STARTING, runtime null) →
    ``starting``.
    """
    if pod is None:
        return PodStatus(
            pod_id=pod_id,
            cause=PodCause.TERMINATED_OUTSIDE,
            provider_status="RunPod no longer knows it",
        )
    if pod.status in GONE_STATUSES:
        cause = PodCause.TERMINATED_OUTSIDE
    elif pod.status == "EXITED":
        cause = PodCause.EXITED
    elif pod.status in LOST_STATUSES:
        cause = PodCause.HOST_LOST
    elif pod.status == "RUNNING" and pod.runtime_up:
        cause = PodCause.ALIVE
    else:
        cause = PodCause.STARTING
    return PodStatus(pod_id=pod_id, cause=cause, provider_status=f"RunPod: {pod.said()}")


BOOT_FAILURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"pull access denied|manifest (unknown|for \S+ not found)|ErrImagePull|"
            r"ImagePullBackOff|back-off pulling image|error pulling image|failed to pull|"
            r"toomanyrequests|unauthorized: authentication required",
            re.IGNORECASE,
        ),
        "the image could not be pulled: check image_name (and the registry's credentials)",
    ),
    (re.compile(r"no space left on device", re.IGNORECASE), "the pod ran out of disk"),
    (
        re.compile(r"\bssh\b.*\b(not started|failed|error)|no ssh public key", re.IGNORECASE),
        "SSH did not start: the account needs an SSH public key before the create "
        "(RunPodSSHKey.add_to_account, or RunPod's console)",
    ),
    (
        re.compile(r"crash ?loop|back-off restarting|exited with (code|status) [1-9]", re.I),
        "the container kept exiting: check the image's start command",
    ),
)
"""What a pod's ``system`` log (host side: image pull, start) says went wrong at boot,
by the text of its lines, first match wins. RunPod does not document these lines: the
patterns are Docker's and Kubernetes' own words for the same failures."""


def boot_diagnosis(api: RunPodApi, pod_id: str, *, lines: int = 200) -> str | None:
    """Why ``pod_id`` did not boot, in words, from its ``system`` log stream (REST v2
    ``GET /v2/pods/{id}/logs?source=system``): the first ``BOOT_FAILURES`` match in its
    last ``lines`` lines, else the last line it logged; None when the stream says nothing
    or cannot be read (the diagnosis is a courtesy: it never stands in the error's way).
    Read it before the pod is terminated (RunPod forgets an ended pod's logs)."""
    try:
        events = list(
            itertools.islice(
                api.pod_logs(pod_id, source="system", tail=lines, idle_seconds=2.0), lines
            )
        )
    except Exception as exc:
        logger.info("%s: its system log could not be read (%s)", pod_id, exc)
        return None
    for pattern, what in BOOT_FAILURES:
        for event in reversed(events):
            if pattern.search(event.line):
                return f"its system log says {what} ({event.line.strip()[:200]!r})"
    if events:
        return f"its system log's last line: {events[-1].line.strip()[:200]!r}"
    return None


def direct_endpoint(pod: PodRecord) -> SSHEndpoint | None:
    """The direct-TCP SSH endpoint of a pod (REST v2 ``ssh.direct``; GraphQL: 22/tcp on
    a public IP in ``runtime.ports``), or None."""
    login = pod.direct
    if login is None or not login.host or not login.port:
        return None
    return SSHEndpoint(host=login.host, port=login.port, user=login.username, mode="direct")


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
    client: RunPodApi,
    pod_id: str,
    *,
    timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS,
    initial_delay_seconds: float = 1.0,
    poll_interval_seconds: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> TerminateResult:
    """Terminate ``pod_id`` and return once RunPod reads it back as gone.

    Idempotent: a pod RunPod does not know (404, ``pod not found to terminate``,
    ``pod: null``) counts as gone. Transient failures (``Something went wrong``, 5xx,
    429 after its waits, network) are retried until the deadline; the terminate call is repeated while the pod still reads back. An
    answer that retrying cannot change (HTTP 401, a GraphQL validation error, an
    unrecognised answer) stops at once with RunPod's message.

    Args:
        client: the RunPod client (either API).
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
                elif classified.action not in (FailoverAction.RETRY, FailoverAction.RESOLVE):
                    raise _refused(pod_id, classified.kind, classified.message) from exc
        if not send:
            try:
                pod = client.get_pod(pod_id)
                if pod is None or pod.status in GONE_STATUSES:
                    logger.info("%s: terminate confirmed", pod_id)
                    return TerminateResult(
                        pod_id=pod_id,
                        confirmed_at=datetime.now(UTC),
                        already_gone=already_gone,
                        attempts=calls,
                    )
                last = f"still status={pod.status}"
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
