"""The pod commands: ``pods`` (live pods with their run, age, cost so far and ssh
command), ``ssh RUN|POD`` (an interactive shell in the pod), ``fetch RUN`` (a kept pod's
outputs brought home, verified), ``terminate`` (idempotent, confirmed, recorded) and
``reaper`` (one reaper pass, ``--dry-run`` to only decide)."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import subprocess
import sys
from datetime import timedelta
from typing import Any

from prefect_runpod.blocks.defaults import REAPER_TTL_GRACE_SECONDS
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_POD_LIFETIME_SECONDS,
    DEFAULT_PROVIDER,
)
from prefect_runpod.flows.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    age_text,
    api,
    api_args,
    api_for_blocks,
    names_saved_block,
    print_json,
    print_ssh_lines,
    print_table,
    provider_args,
    provider_params,
    quiet_console_tracebacks,
)

__all__ = ["add_parsers", "run_fetch", "run_pods", "run_reaper", "run_ssh", "run_terminate"]


def add_parsers(sub: Any) -> None:
    """Register ``pods``, ``ssh``, ``terminate`` and ``reaper`` under the CLI's subcommands."""
    pods = sub.add_parser(
        "pods",
        help="list live pods: run, state, GPU, age, cost so far, ssh command",
        description="List the live pods whose names carry the prefix, with the run each "
        "belongs to and its state in Prefect, GPU, price, age, what it has cost so far, "
        "when the reaper ends it at the latest (its lifetime plus a grace) and the ssh "
        "command that gets you in.",
    )
    provider_args(pods)
    pods.add_argument("--json", action="store_true", help="print the pods as JSON")
    api_args(pods)

    ssh = sub.add_parser(
        "ssh",
        help="open an interactive shell in a run's pod (RUN id or POD id)",
        description="Open an interactive shell in the pod of a run (its flow run id) or in "
        "a pod given by id, with the OpenSSH client through the pod's gateway (a PTY, as "
        "RunPod's proxy wants). The exit status is the remote shell's.",
    )
    ssh.add_argument("target", metavar="RUN|POD", help="a flow run id or a pod id")
    ssh.add_argument("--print", action="store_true", help="print the command, do not run it")
    provider_args(ssh)
    ssh.set_defaults(provider=None)
    api_args(ssh)

    fetch = sub.add_parser(
        "fetch",
        help="bring a kept pod's outputs home into the run's output dir, verified",
        description="Download the outputs of a run whose pod was kept (entries that could "
        "not travel stayed on it) into <output_dir>/outputs, verified against the pod's "
        "manifest; files already there are not sent again. The pod stays: end it with "
        "`prefect-runpod terminate POD_ID`.",
    )
    fetch.add_argument("run", metavar="RUN", help="a flow run id")
    fetch.add_argument(
        "--follow-links",
        action="store_true",
        help="copy what links that leave the outputs point at, instead of refusing them",
    )
    provider_args(fetch)
    fetch.set_defaults(provider=None)
    api_args(fetch)

    term = sub.add_parser("terminate", help="terminate a pod by id or name (idempotent, confirmed)")
    term.add_argument("pod_id", nargs="?", help="the pod id")
    term.add_argument("--name", help="terminate the pod with this name instead")
    provider_args(term)
    api_args(term)

    reap = sub.add_parser(
        "reaper",
        help="one reaper pass: terminate pods no live run stands behind (--dry-run: only say)",
    )
    provider_args(reap)
    reap.add_argument(
        "--ttl-seconds",
        type=float,
        default=None,
        help="terminate any pod older than this, however fresh its heartbeat (default: the "
        "pod's recorded lifetime plus "
        f"{REAPER_TTL_GRACE_SECONDS:g} s; {DEFAULT_POD_LIFETIME_SECONDS:g} s plus that when "
        "the pod recorded none)",
    )
    reap.add_argument("--dry-run", action="store_true", help="decide and report, terminate nothing")
    reap.add_argument("--json", action="store_true", help="print the decisions as JSON")
    api_args(reap)


def _pod_rows(provider: Any, pods: list[Any]) -> list[dict[str, Any]]:
    from prefect_runpod.blocks.costs import projected_usd
    from prefect_runpod.blocks.provider import reaper_ttl_seconds
    from prefect_runpod.flows.cli.runs import key_path_for, now_utc, read_runs
    from prefect_runpod.flows.run.heartbeat import deadman_note
    from prefect_runpod.flows.run.names import flow_run_id_from_pod_name

    now = now_utc()
    run_ids = {h.pod_id: flow_run_id_from_pod_name(h.name, None) for h in pods}
    views = read_runs([str(i) for i in run_ids.values() if i is not None])
    rows = []
    for h in pods:
        run_id = run_ids[h.pod_id]
        view = views.get(str(run_id)) if run_id is not None else None
        out = view.output_dir if view is not None else None
        key = key_path_for(h.provider, out, view.parameters if view is not None else None)
        rows.append(
            {
                "pod_id": h.pod_id,
                "name": h.name,
                "flow_run_id": str(run_id) if run_id else None,
                "run_state": view.state if view else ("unknown" if run_id else "-"),
                "stage": view.stage if view else "-",
                "gpu_type": h.gpu_type,
                "cost_per_hr_usd": h.cost_per_hr,
                "created_at": h.created_at.isoformat(),
                "age_seconds": round((now - h.created_at).total_seconds(), 1),
                "age": age_text(h.created_at, now),
                "usd_so_far": round(projected_usd(h.cost_per_hr, h.created_at, now), 6),
                "reaped_by": (h.created_at + timedelta(seconds=reaper_ttl_seconds(h))).isoformat(),
                "deadman": deadman_note(h),
                "ssh_command": h.pinned_ssh_command(key or "KEY"),
            }
        )
    return rows


def run_pods(args: argparse.Namespace) -> int:
    """``prefect-runpod pods``: one row per live pod; exit 0 (also with none)."""
    from prefect_runpod.flows.run.providers import build_provider

    params = provider_params(args)
    with api():  # saved blocks are read from the API too
        provider, _ = build_provider(params, need_ssh_key=False)
        rows = _pod_rows(provider, provider.list(args.name_prefix))
    if args.json:
        print_json(rows)
        return 0
    columns = [
        "pod",
        "run",
        "state",
        "stage",
        "GPU",
        "USD/h",
        "age",
        "USD so far",
        "reaped by",
        "ssh",
    ]
    print_table(
        f"live {args.provider} pods named {args.name_prefix}-*",
        columns,
        [
            [
                r["pod_id"],
                r["flow_run_id"],
                r["run_state"],
                r["stage"],
                r["gpu_type"],
                f"{r['cost_per_hr_usd']:.2f}",
                r["age"],
                f"{r['usd_so_far']:.4f}",
                r["reaped_by"],
                r["ssh_command"],
            ]
            for r in rows
        ],
        empty=f"no live pods named {args.name_prefix}-* at {args.provider}",
    )
    print_ssh_lines(
        [(f"pod {r['pod_id']} (run {r['flow_run_id']})", r["ssh_command"]) for r in rows]
    )
    return 0


def _checked_target(args: argparse.Namespace) -> tuple[str, bool]:
    """``args.target`` checked for its shape before anything is asked: ``(target, is_run)``.
    Raises ``SpecError`` for something that is neither a flow run id nor a pod id."""
    from prefect_runpod.blocks.validation import check_flow_run_id, check_pod_id

    target = args.target.strip()
    if "-" in target:  # a flow run id
        return check_flow_run_id(target), True
    check_pod_id(target)
    return target, False


def _resolve_pod(
    args: argparse.Namespace, target: str, is_run: bool
) -> tuple[Any, str | None, str]:
    """The live pod ``target`` names (a run id or a pod id), the key to reach it, and the
    provider's name. Raises ``SpecError`` for a target that names nothing live."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.flows.cli.runs import (
        key_path_for,
        live_pod,
        provider_for_run,
        read_run,
        require_run,
    )
    from prefect_runpod.flows.run.names import flow_run_id_from_pod_name
    from prefect_runpod.flows.run.providers import build_provider

    overrides = provider_params(args)
    if is_run:
        run_id = target
        view = require_run(run_id)
        provider = provider_for_run(view, overrides)
        handle = live_pod(view, provider)
        if handle is None:
            raise SpecError(
                f"run {run_id} ({view.state}) has no live pod: it was terminated; "
                f"`prefect-runpod logs {run_id}` shows its training log"
            )
        key = key_path_for(handle.provider, view.output_dir, view.parameters)
        return handle, key, provider.provider_name
    params = {**provider_params(args), "provider": args.provider or DEFAULT_PROVIDER}
    provider, _ = build_provider(params, need_ssh_key=False)
    found = [h for h in provider.list("") if h.pod_id == target]
    if not found:
        raise SpecError(
            f"no live pod {target} at {provider.provider_name}: `prefect-runpod pods "
            f"--provider {provider.provider_name}` lists them"
        )
    handle = found[-1]
    pod_run = flow_run_id_from_pod_name(handle.name, None)
    pod_view = read_run(str(pod_run)) if pod_run is not None else None
    out = pod_view.output_dir if pod_view is not None else None
    run_params = pod_view.parameters if pod_view is not None else None
    return handle, key_path_for(handle.provider, out, run_params), provider.provider_name


def run_ssh(args: argparse.Namespace) -> int:
    """``prefect-runpod ssh RUN|POD``: run the OpenSSH client on the pod's gateway in this
    terminal; returns its exit status."""
    from prefect_runpod.blocks.console.openssh import ssh_argv
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.pod_handle import known_hosts_file

    target, is_run = _checked_target(args)
    with api():
        handle, key, provider_name = _resolve_pod(args, target, is_run)
    if handle.ssh is None:
        raise SpecError(f"pod {handle.pod_id}: its SSH endpoint is not known yet; try again")
    if key is None:
        raise SpecError(
            f"pod {handle.pod_id}: no key for it on this machine (a local pod's key is kept "
            "in its run's output dir; a RunPod pod needs RUNPOD_SSH_KEY_PATH): "
            f"{handle.ssh_command('KEY')}"
        )
    # The pinned host key goes in a file of this pod's that outlives the command, so the
    # line --print shows works when pasted later (while the pod lives): the same line
    # `pods`, `status` and the run's own log show.
    argv = ssh_argv(handle, key, known_hosts_file(handle.pod_id))
    if args.print:
        print(shlex.join(argv))
        return 0
    print(f"{handle.pod_id} ({provider_name}): {shlex.join(argv)}", file=sys.stderr)
    sys.stderr.flush()
    return subprocess.call(argv)


def run_fetch(args: argparse.Namespace) -> int:
    """``prefect-runpod fetch RUN [--follow-links]``: the run's outputs from its live
    (kept) pod into ``<output_dir>/outputs``, verified; 0 once every entry is here.
    ``<output_dir>/run-report.json`` then says so (``report_file.record_fetch``): nothing
    left on the pod, the folder's files counted as verified.

    Raises:
        SpecError: the run has no live pod, no key or report on this machine.
        LinksRefusedError: links that cannot travel, without ``--follow-links``.
    """
    import json
    from pathlib import Path

    from pydantic import SecretStr

    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.provider import end_command
    from prefect_runpod.blocks.transfer.dispatch import download_dir
    from prefect_runpod.flows.cli.runs import require_run
    from prefect_runpod.flows.run.report_file import record_fetch

    with api():
        handle, key, _name = _resolve_pod(args, args.run, True)
        out = require_run(args.run).output_dir
    saved = Path(out) / "run-report.json" if out else None
    if saved is None or not saved.is_file() or key is None:
        raise SpecError(
            f"run {args.run}: its output dir and pod key are not on this machine (fetch "
            "from the machine that ran it)"
        )
    moved = json.loads(saved.read_text()).get("download") or {}
    remote = moved.get("left_in") or (moved.get("source_manifest") or {}).get("root")
    if not remote:
        raise SpecError(f"run {args.run}: its report names no pod folder to fetch")
    local = Path(out) / "outputs"  # type: ignore[arg-type]
    with PodConsole.for_pod(handle, SecretStr(Path(key).read_text())) as console:
        report = download_dir(
            console, handle, remote, local, private_key=SecretStr(Path(key).read_text()),
            follow_links=args.follow_links,
        )  # fmt: skip
    files = len(report.dest_manifest.entries) if report.dest_manifest else 0
    if not record_fetch(str(out), args.run, report):
        print(f"run {args.run}: could not update {saved}", file=sys.stderr)
    print(
        f"fetched {remote} from pod {handle.pod_id} into {local}: {files} entries verified "
        f"({report.bytes} bytes by {report.method}); the pod still runs: end it with "
        f"`{end_command(handle.provider, handle.pod_id)}`"
    )
    return 0


def run_terminate(args: argparse.Namespace) -> int:
    """``prefect-runpod terminate``: end a pod, confirmed, and record who ended it."""
    from prefect_runpod.blocks.validation import check_pod_id

    if not args.pod_id and not args.name:
        print(
            "error: give a POD_ID or --name NAME (prefect-runpod pods lists them)", file=sys.stderr
        )
        return EXIT_USAGE
    if args.pod_id:
        check_pod_id(args.pod_id)
    params = provider_params(args)
    from prefect_runpod.blocks.provider import EndedBy
    from prefect_runpod.blocks.secret_mask import error_text
    from prefect_runpod.flows.run.cost_record import record_pod_end
    from prefect_runpod.flows.run.names import flow_run_id_from_pod_name
    from prefect_runpod.flows.run.providers import build_provider
    from prefect_runpod.tasks.terminate import terminate_pod

    with contextlib.ExitStack() as opened:
        # Ending a pod never waits for a Prefect server unless a saved block must be read
        # first; the end is recorded in the API afterwards.
        opened.enter_context(api_for_blocks(params))
        provider, _ = build_provider(params, need_ssh_key=False)
        live = provider.list("")
        matches = [
            h for h in live if (h.name == args.name if args.name else h.pod_id == args.pod_id)
        ]
        handle = matches[-1] if matches else None
        if args.name and handle is None:
            print(f"no live pod named {args.name}")
            return 0
        result = terminate_pod(provider, handle.pod_id if handle else args.pod_id)
        if result.already_gone:
            print(
                f"{result.pod_id}: no such pod at {args.provider} (already terminated, or the "
                "id is mistyped); nothing bills under this id — `prefect-runpod pods` lists "
                "live pods"
            )
            return 0
        print(f"{result.pod_id} terminated (confirmed {result.confirmed_at.isoformat()})")
        run_id = flow_run_id_from_pod_name(handle.name, None) if handle else None
        if run_id is None or handle is None:
            return 0
        end = result.end(EndedBy.CLI, "prefect-runpod terminate")
        record = None
        try:
            if not names_saved_block(params):
                opened.enter_context(api())
            record = record_pod_end(
                str(run_id), end, recorded_by="cli", handle=handle, provider=provider
            )
        except Exception as exc:  # the pod is gone; only the bookkeeping failed
            print(f"run {run_id}: {error_text(exc)}", file=sys.stderr)
        if record is None:
            print(
                f"run {run_id}: cost not recorded; `prefect-runpod cost {run_id} --reconcile` "
                "records it once the Prefect API answers",
                file=sys.stderr,
            )
    if record is not None:
        print(f"run {run_id}: cost recorded, {record.usd:.6f} USD ({record.state_line()})")
    return 0


def run_reaper(args: argparse.Namespace) -> int:
    """``prefect-runpod reaper``: one pass of the reaper flow, its decisions as a table
    (or JSON); exit 1 when a terminate was not confirmed."""
    from prefect_runpod.blocks.exceptions import TerminateError
    from prefect_runpod.blocks.validation import check_number

    params = provider_params(args)
    check_number("ttl_seconds", args.ttl_seconds, optional=True)
    from prefect_runpod.flows.reaper import reaper

    quiet_console_tracebacks("quiet")  # the table is the answer; the flow run is in the API
    failed: TerminateError | None = None
    with api():
        state = reaper(
            provider=args.provider,
            name_prefix=args.name_prefix,
            ttl_seconds=args.ttl_seconds,
            dry_run=args.dry_run,
            runpod_credentials_block=params["runpod_credentials_block"],
            runpod_spec_block=params["runpod_spec_block"],
            ssh_key_block=params["ssh_key_block"],
            return_state=True,
        )
        try:
            rows = state.result()
        except TerminateError as exc:
            failed, rows = exc, []
    if args.json:
        print_json(rows)
    else:
        verb = "would reap" if args.dry_run else "reaped"
        print_table(
            f"reaper{' (dry run)' if args.dry_run else ''}: {args.provider} pods named "
            f"{args.name_prefix}-*",
            ["pod", "run", "run state", "age", "decision", "reason"],
            [
                [
                    r["pod_id"],
                    r["flow_run_id"],
                    r["run_state"],
                    f"{r['age_seconds']:.0f} s",
                    (verb if r["terminated"] or args.dry_run else "NOT confirmed")
                    if r["reap"]
                    else "keep",
                    r["reason"] if not r.get("error") else f"{r['reason']}; {r['error']}",
                ]
                for r in rows
            ],
            empty=f"no live pods named {args.name_prefix}-* at {args.provider}: nothing to reap",
        )
    if failed is not None:
        print(f"error: {failed}", file=sys.stderr)
        return EXIT_FAILED
    return 0
