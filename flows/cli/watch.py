"""Watching runs: ``status [RUN]`` (live and recent runs: stage, pod, GPU, age, USD so far,
ssh command, the run's page) and ``logs RUN [--follow]`` (the training log, like ``sky
logs``: from the pod while it lives, afterwards from the copy the run kept in its output
dir, else from Prefect's coalesced log records; it always says which source it read)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from prefect_runpod.flows.cli.common import (
    age_text,
    api,
    api_args,
    print_json,
    print_ssh_lines,
    print_table,
)

__all__ = ["add_parsers", "run_logs", "run_status", "status_row"]


def add_parsers(sub: Any) -> None:
    """Register ``status`` and ``logs`` under the CLI's subcommands."""
    status = sub.add_parser(
        "status",
        help="live and recent runs: stage, pod, GPU, age, USD so far, ssh command, run page",
        description="The fine-tune runs Prefect knows, newest first (or one run): its state "
        "and stage, its pod, provider and GPU, its age, what it has cost so far (our "
        "estimate, price x seconds), the ssh command while the pod lives, and the run's "
        "page in the Prefect UI.",
    )
    status.add_argument("run", nargs="?", metavar="RUN", help="a flow run id")
    status.add_argument("--limit", type=int, default=10, help="recent runs to list (default 10)")
    status.add_argument("--json", action="store_true", help="print the runs as JSON")
    api_args(status)

    logs = sub.add_parser(
        "logs",
        help="a run's training log: from the pod while it lives, else the run's copy",
        description="Print a run's training log. While the pod lives it is read from the "
        "pod (by byte offset, as the run follows it); afterwards from the train.log the run "
        "kept in its output dir, else from Prefect's log records of the run (coalesced). "
        "The source read is named on stderr.",
    )
    logs.add_argument("run", metavar="RUN", help="a flow run id")
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep reading until training ends"
    )
    logs.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="with --follow: stop following after this long (default: the run's pod "
        "lifetime, which the pod cannot outlive)",
    )
    api_args(logs)


def status_row(view: Any, *, with_pod: bool = True) -> dict[str, Any]:
    """One run as ``status`` shows it (JSON-ready): ids, state, stage, pod, provider, GPU,
    age (s and as text), USD so far (ours, every pod of the run; to now while a pod may
    still bill), the ssh
    command while the pod lives, the run's page; the run it continues (``carried_from``)
    and the one that continued it (``continued_by``; ``pod_end`` then ends ``continued by
    RUN``).

    Args:
        view: a ``flows.cli.runs.RunView``.
        with_pod: ask the provider for the live pod (its GPU and ssh command).
    """
    from prefect_runpod.flows.cli.runs import key_path_for, live_pod, now_utc, provider_for_run

    now = now_utc()
    record = view.record
    handle = None
    if with_pod and view.live and record is not None and record.pod_id:
        try:
            handle = live_pod(view, provider_for_run(view))
        except Exception:  # a provider that cannot be asked here: the record still shows
            handle = None
    usd = None
    if record is not None:
        record.settle(now)
        usd = record.total_usd  # every pod of the run, those carried from the run it continues too
    out = view.output_dir
    ssh = None
    if handle is not None:
        key = key_path_for(handle.provider, out, view.parameters)
        ssh = handle.pinned_ssh_command(key or "KEY")
    return {
        "flow_run_id": view.flow_run_id,
        "flow_run_name": view.flow_run_name,
        "state": view.state,
        "stage": view.stage,
        "pod_id": record.pod_id if record else None,
        "pod_live": handle is not None,
        "provider": view.provider,
        "gpu_type": handle.gpu_type if handle else (record.gpu_type if record else "-"),
        "cost_per_hr_usd": record.cost_per_hr if record else None,
        "started_at": view.started_at.isoformat() if view.started_at else None,
        "age_seconds": round((now - view.started_at).total_seconds(), 1)
        if view.started_at
        else None,
        "age": age_text(view.started_at, now),
        "usd_so_far": usd,
        "pod_end": record.state_line() if record else "no pod was created",
        "attempts": _attempts_text(record),
        "carried_from": record.carried_from if record else None,
        "continued_by": record.continued_by if record else None,
        "ssh_command": ssh,
        "url": view.url,
        "output_dir": out,
    }


def _attempts_text(record: Any) -> str:
    """Each pod attempt of the run (``flows.run.attempts.attempt_line``), ``; ``-joined."""
    from prefect_runpod.flows.run.attempts import attempt_line

    attempts = record.attempts if record is not None else []
    return "; ".join(f"{a.number}: {attempt_line(a)}" for a in attempts) or "-"


def run_status(args: argparse.Namespace) -> int:
    """``prefect-runpod status [RUN]``; exit 0, 2 when the run is not known."""
    from prefect_runpod.blocks.validation import check_flow_run_id
    from prefect_runpod.flows.cli.runs import recent_runs, require_run

    run_id = None if args.run is None else check_flow_run_id(args.run)
    with api():
        if run_id is not None:
            rows = [status_row(require_run(run_id))]
        else:
            rows = [status_row(v) for v in recent_runs(args.limit)]
    if args.json:
        print_json(rows[0] if run_id is not None else rows)
        return 0
    ways_in = [(f"pod {r['pod_id']} of run {r['flow_run_id']}", r["ssh_command"]) for r in rows]
    if run_id is not None:
        print_table(
            f"run {run_id}",
            ["field", "value"],
            [[k, v] for k, v in rows[0].items() if k != "ssh_command"],
        )
        print_ssh_lines(ways_in)
        return 0
    print_table(
        "fine-tune runs (newest first)",
        ["run", "state", "stage", "pod", "GPU", "age", "USD so far", "page"],
        [
            [
                f"{r['flow_run_id']} ({r['flow_run_name']})",
                r["state"],
                r["stage"],
                f"{r['pod_id'] or '-'} ({r['provider']}{', live' if r['pod_live'] else ''})",
                r["gpu_type"],
                r["age"],
                "-" if r["usd_so_far"] is None else f"{r['usd_so_far']:.4f}",
                r["url"],
            ]
            for r in rows
        ],
        empty="no fine-tune runs in the Prefect API yet: `prefect-runpod finetune` starts one",
    )
    print_ssh_lines(ways_in)
    return 0


# How long ``logs`` keeps reconnecting to a pod that stopped answering before it reads
# the rest from the run's own copy of the log (a pod ended after training, the usual case).
_POD_GONE_SECONDS = 10.0


def _from_pod(view: Any, handle: Any, key_path: str, args: argparse.Namespace) -> int:
    from pydantic import SecretStr

    from prefect_runpod.blocks.console.launcher_client import LogFollower, sleep_in_steps
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.exceptions import ConsoleError, PodGoneError, TrainingError
    from prefect_runpod.blocks.transfer import pod_tools

    run_dir = f"{handle.workdir.rstrip('/')}/prefect-runpod/{view.flow_run_id}"
    print(f"source: pod {handle.pod_id} (live), {run_dir}/train.log", file=sys.stderr)
    key = SecretStr(Path(key_path).read_text())
    lifetime = float(view.parameters.get("pod_lifetime_seconds") or 6 * 3600)
    deadline = time.monotonic() + (args.max_seconds or lifetime)
    printed = 0

    def emit(data: bytes) -> None:  # the log's bytes as the pod has them
        nonlocal printed
        printed += len(data)
        _write_bytes(data)

    try:
        with PodConsole.for_pod(handle, key) as console:
            follower = LogFollower(
                console,
                run_dir,
                pod_tools.tools_dir(handle),
                heartbeat_path="",  # reading is not a sign of the run's life
                on_bytes=emit,
                pod_id=handle.pod_id,
                reconnect_budget_seconds=_POD_GONE_SECONDS,
            )
            chunk = follower.drain()
            while args.follow and chunk.running and time.monotonic() < deadline:
                sleep_in_steps(1.0, time.sleep)
                chunk = follower.drain()
    except (ConsoleError, PodGoneError, TrainingError) as exc:
        # The pod went away under us (the run ends it right after training): the rest of
        # the log is in the run's own copy when the run ran on this machine.
        if _rest_from_copy(view, printed, why=f"pod {handle.pod_id} stopped answering"):
            return 0
        print(
            f"pod {handle.pod_id}: could not read the training log (stage {view.stage}): {exc}",
            file=sys.stderr,
        )
        return 1
    if args.follow and chunk.running:
        print(f"stopped following after {args.max_seconds or lifetime:g} s", file=sys.stderr)
    return 0


def _local_copy(view: Any) -> Path | None:
    from prefect_runpod.flows.run.names import TRAIN_LOG

    copy = Path(view.output_dir) / TRAIN_LOG if view.output_dir else None
    return copy if copy is not None and copy.is_file() else None


def _write_bytes(data: bytes) -> None:
    """Write ``data`` to stdout as it is (the log's bytes, never decoded)."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream: the nearest text
        sys.stdout.write(data.decode("utf-8", errors="replace"))
    else:
        buffer.write(data)
        buffer.flush()


def _rest_from_copy(view: Any, skip_bytes: int, *, why: str = "") -> bool:
    """Write the run's own copy of the training log (``<output_dir>/train.log``, the
    pod's log byte for byte) past its first ``skip_bytes`` bytes; False when that copy
    is not on this machine."""
    copy = _local_copy(view)
    if copy is None:
        return False
    note = f"{why}; " if why else ""
    where = f"from byte {skip_bytes} " if skip_bytes else ""
    print(f"source: {note}{copy} {where}(the pod's log, byte for byte)", file=sys.stderr)
    _write_bytes(copy.read_bytes()[skip_bytes:])
    return True


def _from_records(view: Any) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    pod = view.record.pod_id if view.record else None
    print(
        f"source: Prefect's log records of run {view.flow_run_id} (coalesced; the run's "
        "train.log is not on this machine)",
        file=sys.stderr,
    )
    if pod is None:
        print(f"run {view.flow_run_id} never had a pod: no training log", file=sys.stderr)
        return 1
    offset, found = 0, 0
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[view.flow_run_id])),  # type: ignore[list-item]
                sort=LogSort.TIMESTAMP_ASC,
                limit=200,
                offset=offset,
            )
            for log in logs:
                if log.message.startswith(f"{pod} | "):
                    print(log.message[len(pod) + 3 :])
                    found += 1
            offset += len(logs)
            if len(logs) < 200:
                break
    return 0 if found else 1


def run_logs(args: argparse.Namespace) -> int:
    """``prefect-runpod logs RUN [--follow]``; exit 0 when a log was read, else 1."""
    from prefect_runpod.blocks.validation import check_flow_run_id, check_number
    from prefect_runpod.flows.cli.runs import (
        key_path_for,
        live_pod,
        provider_for_run,
        require_run,
    )

    run_id = check_flow_run_id(args.run)
    check_number("max_seconds", args.max_seconds, optional=True)
    with api():
        view = require_run(run_id)
        out = view.output_dir
        handle = None
        if view.live and view.record is not None and view.record.pod_id:
            handle = live_pod(view, provider_for_run(view))
        key = key_path_for(handle.provider, out, view.parameters) if handle is not None else None
        if handle is not None and key is not None:
            return _from_pod(view, handle, key, args)
        if _rest_from_copy(view, 0):
            return 0
        return _from_records(view)
