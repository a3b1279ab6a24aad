"""A pod the run keeps on purpose because some of its outputs could not travel
(docs/architecture.md#termination-layers): what stayed is named, the pod is marked kept
where each layer that could end it looks, and the run says how to fetch the rest.

- on the pod, ``<run_dir>/kept``: its dead-man switch stops reading the heartbeat, and
  only the lifetime ends the pod;
- on the flow run, the tag ``kept-pod:<pod_id>``: the reaper spares the pod of a
  finished run until its TTL;
- in the run's report and summary: the entries left on the pod, until when it is kept,
  the command that fetches them and the command that ends the pod.
"""

from __future__ import annotations

import logging
import shlex
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import TransferError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side.watchdog import KEPT_FILE
from prefect_runpod.blocks.provider import end_command
from prefect_runpod.flows.run.names import KEPT_TAG_PREFIX

if TYPE_CHECKING:
    from prefect_runpod.flows.run.report import RunReport

__all__ = [
    "fetch_command",
    "keep_reason",
    "kept_for",
    "kept_until",
    "left_on_pod_error",
    "mark_kept",
]

_log = logging.getLogger(__name__)


def fetch_command(flow_run_id: str) -> str:
    """The command that brings a kept pod's outputs home, links read through:
    ``prefect-runpod fetch RUN_ID --follow-links``."""
    return f"prefect-runpod fetch {flow_run_id} --follow-links"


def kept_until(armed_at: datetime, lifetime_seconds: float) -> datetime:
    """When the dead-man ends a kept pod at the latest: ``armed_at`` (UTC, when its
    watchdog started: the pod's ready time) plus its lifetime in seconds."""
    return armed_at + timedelta(seconds=lifetime_seconds)


def _entries(n: int) -> str:
    return f"{n} output entr{'y' if n == 1 else 'ies'}"


def keep_reason(left: dict[str, str], flow_run_id: str, until: datetime) -> str:
    """The ``terminate`` stage's reason for a pod kept because ``left`` stayed on it."""
    return (
        f"kept: {_entries(len(left))} could not travel; until {until:%Y-%m-%d %H:%M} UTC "
        f"at the latest (its dead-man lifetime); `{fetch_command(flow_run_id)}` fetches them"
    )


def left_on_pod_error(
    left: dict[str, str],
    *,
    pod_id: str,
    provider: str,
    flow_run_id: str,
    outputs: str,
    until: datetime,
) -> TransferError:
    """The error a run ends with when outputs stayed on its (kept) pod.

    Args:
        left: relative path → why it could not travel (``TransferReport.left_on_pod``).
        pod_id / provider: the kept pod.
        flow_run_id: the run (its fetch command names it).
        outputs: the local folder everything else landed in, verified.
        until: when the pod's dead-man ends it (UTC).
    """
    listed = "; ".join(f"{path} ({why})" for path, why in list(left.items())[:20])
    more = f"; and {len(left) - 20} more" if len(left) > 20 else ""
    return TransferError(
        f"{_entries(len(left))} could not travel and stayed on pod {pod_id}: {listed}{more}. "
        f"Everything else travelled and was verified in {outputs}. The pod is kept (billing) until {until:%Y-%m-%d %H:%M} UTC "
        f"at the latest: fetch the rest with `{fetch_command(flow_run_id)}`, then end it "
        f"with `{end_command(provider, pod_id)}`",
        pod_id=pod_id,
        stage="download",
    )


def kept_for(
    report: RunReport,
    handle: PodHandle | None,
    armed_at: datetime | None,
    lifetime_seconds: float,
    outputs: str,
) -> tuple[str, TransferError] | None:
    """Why a run keeps its pod and the error it ends with, when its download left outputs
    on the pod (``TransferReport.left_on_pod``); None when everything travelled.

    Args:
        report: the run (its download's ``left_on_pod``, flow run id and provider).
        handle: the pod, None when none was rented.
        armed_at: when its dead-man started (the pod's ready time, UTC), else its create.
        lifetime_seconds: the dead-man's lifetime: the latest the kept pod lives.
        outputs: the local folder the rest of the outputs landed in, verified.
    """
    left = report.download.left_on_pod if report.download else {}
    if not left or handle is None:
        return None
    until = kept_until(armed_at or handle.created_at, lifetime_seconds)
    error = left_on_pod_error(
        left,
        pod_id=handle.pod_id,
        provider=report.provider,
        flow_run_id=report.flow_run_id,
        outputs=outputs,
        until=until,
    )
    return keep_reason(left, report.flow_run_id, until), error


def mark_kept(handle: PodHandle, key: SecretStr, run_dir: str, flow_run_id: str) -> list[str]:
    """Mark ``handle`` kept: ``<run_dir>/kept`` on the pod (the dead-man then waits for
    the lifetime only) and the flow run's ``kept-pod:<pod_id>`` tag (the reaper spares
    it). Never raises: each mark that could not be made is returned, in words."""
    from prefect_runpod.blocks.console.session import run_remote

    failed: list[str] = []
    path = shlex.quote(f"{run_dir}/{KEPT_FILE}")
    try:
        _out, code = run_remote(handle, key, [f"date -u +%FT%TZ > {path}"])
        if code != 0:
            failed.append(f"the pod's {run_dir}/{KEPT_FILE} (exit {code})")
    except Exception as exc:
        failed.append(f"the pod's {run_dir}/{KEPT_FILE} ({exc})")
    try:
        _tag_run(flow_run_id, f"{KEPT_TAG_PREFIX}{handle.pod_id}")
    except Exception as exc:
        failed.append(f"the flow run's tag ({exc})")
    for what in failed:
        _log.warning("could not mark pod %s kept in %s", handle.pod_id, what)
    return failed


def _tag_run(flow_run_id: str, tag: str) -> None:
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        if tag not in run.tags:
            client.update_flow_run(UUID(flow_run_id), tags=[*run.tags, tag])
