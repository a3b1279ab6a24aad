"""The pod commands: ``pods`` (live pods with their run, age, cost so far and ssh
command), ``ssh RUN|POD`` (an interactive shell in the pod), ``terminate`` (idempotent,
confirmed, recorded) and ``reaper`` (one reaper pass, ``--dry-run`` to only decide)."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from typing import Any

from prefect_runpod.blocks.provider import DEFAULT_POD_LIFETIME_SECONDS, REAPER_TTL_GRACE_SECONDS
from prefect_runpod.blocks.validation.parameters import DEFAULT_PROVIDER
from prefect_runpod.flows.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    age_text,
    api,
    print_json,
    print_table,
    provider_args,
    provider_params,
    quiet_console_tracebacks,
)

__all__ = ["add_parsers", "run_pods", "run_reaper", "run_ssh", "run_terminate"]


def add_parsers(sub: Any) -> None:
    """Register ``pods``, ``ssh``, ``terminate`` and ``reaper`` under the CLI's subcommands."""
    pods = sub.add_parser(
        "pods",
        help="list live pods: run, state, GPU, age, cost so far, ssh command",
        description="List the live pods whose names carry the prefix, with the run each "
        "belongs to and its state in Prefect, GPU, price, age, what it has cost so far, its "
        "lease and the ssh command that gets you in.",
    )
    provider_args(pods)
    pods.add_argument("--json", action="store_true", help="print the pods as JSON")

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

    term = sub.add_parser("terminate", help="terminate a pod by id or name (idempotent, confirmed)")
    term.add_argument("pod_id", nargs="?", help="the pod id")
    term.add_argument("--name", help="terminate the pod with this name instead")
    provider_args(term)

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


def _pod_rows(provider: Any, pods: list[Any]) -> list[dict[str, Any]]:
    from prefect_runpod.blocks.costs import projected_usd
    from prefect_runpod.flows.cli.runs import key_path_for, now_utc, read_run
    from prefect_runpod.flows.reaper import deadman_note, flow_run_id_from_pod_name

    now = now_utc()
    rows = []
    for h in pods:
        run_id = flow_run_id_from_pod_name(h.name, None)
        view = read_run(str(run_id)) if run_id is not None else None
        out = view.output_dir if view is not None else None
        key = key_path_for(h.provider, out)
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
                "terminate_after": h.terminate_after.isoformat() if h.terminate_after else None,
                "deadman": deadman_note(h),
                "ssh_command": h.ssh_command(key or "KEY"),
            }
        )
    return rows


def run_pods(args: argparse.Namespace) -> int:
    """``prefect-runpod pods``: one row per live pod; exit 0 (also with none)."""
    from prefect_runpod.flows.run.providers import build_provider

    provider, _ = build_provider(provider_params(args), need_ssh_key=False)
    pods = provider.list(args.name_prefix)
    with api():
        rows = _pod_rows(provider, pods)
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
        "ends by",
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
                r["terminate_after"] or "no lease",
                r["ssh_command"],
            ]
            for r in rows
        ],
        empty=f"no live pods named {args.name_prefix}-* at {args.provider}",
    )
    return 0


def _resolve_pod(args: argparse.Namespace) -> tuple[Any, str | None, str]:
    """The live pod ``args.target`` names (a run id or a pod id), the key to reach it,
    and the provider's name. Raises ``SpecError`` for a target that names nothing live."""
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.validation import check_flow_run_id, check_pod_id
    from prefect_runpod.flows.cli.runs import (
        key_path_for,
        live_pod,
        provider_for_run,
        read_run,
        require_run,
    )
    from prefect_runpod.flows.reaper import flow_run_id_from_pod_name
    from prefect_runpod.flows.run.providers import build_provider

    overrides = provider_params(args)
    target = args.target.strip()
    if "-" in target:  # a flow run id
        run_id = check_flow_run_id(target)
        view = require_run(run_id)
        provider = provider_for_run(view, overrides)
        handle = live_pod(view, provider)
        if handle is None:
            raise SpecError(
                f"run {run_id} ({view.state}) has no live pod: it was terminated; "
                f"`prefect-runpod logs {run_id}` shows its training log"
            )
        return handle, key_path_for(handle.provider, view.output_dir), provider.provider_name
    check_pod_id(target)
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
    return handle, key_path_for(handle.provider, out), provider.provider_name


def run_ssh(args: argparse.Namespace) -> int:
    """``prefect-runpod ssh RUN|POD``: run the OpenSSH client on the pod's gateway in this
    terminal; returns its exit status."""
    from prefect_runpod.blocks.console.openssh import ssh_argv
    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.local_pod.registry import default_home

    with api():
        handle, key, provider_name = _resolve_pod(args)
    if handle.ssh is None:
        raise SpecError(f"pod {handle.pod_id}: its SSH endpoint is not known yet; try again")
    if key is None:
        raise SpecError(
            f"pod {handle.pod_id}: no key for it on this machine (a local pod's key is kept "
            "in its run's output dir; a RunPod pod needs RUNPOD_SSH_KEY_PATH): "
            f"{handle.ssh_command('KEY')}"
        )
    # The pinned host key goes in a file of this pod's that outlives the command, so the
    # line --print shows works when pasted later (while the pod lives).
    known_hosts = default_home() / "known_hosts" / handle.pod_id
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    argv = ssh_argv(handle, key, known_hosts)
    if args.print:
        print(shlex.join(argv))
        return 0
    print(f"{handle.pod_id} ({provider_name}): {handle.ssh_command(key)}", file=sys.stderr)
    sys.stderr.flush()
    return subprocess.call(argv)


def run_terminate(args: argparse.Namespace) -> int:
    """``prefect-runpod terminate``: end a pod, confirmed, and record who ended it."""
    from prefect_runpod.blocks.provider import EndedBy, PodEnd
    from prefect_runpod.blocks.validation import check_pod_id
    from prefect_runpod.flows.reaper import flow_run_id_from_pod_name
    from prefect_runpod.flows.run.cost_record import record_pod_end
    from prefect_runpod.flows.run.providers import build_provider
    from prefect_runpod.tasks.terminate import terminate_pod

    if not args.pod_id and not args.name:
        print(
            "error: give a POD_ID or --name NAME (prefect-runpod pods lists them)", file=sys.stderr
        )
        return EXIT_USAGE
    if args.pod_id:
        check_pod_id(args.pod_id)
    provider, _ = build_provider(provider_params(args), need_ssh_key=False)
    live = provider.list("")
    matches = [h for h in live if (h.name == args.name if args.name else h.pod_id == args.pod_id)]
    handle = matches[-1] if matches else None
    if args.name and handle is None:
        print(f"no live pod named {args.name}")
        return 0
    result = terminate_pod(provider, handle.pod_id if handle else args.pod_id)
    if result.already_gone:
        print(
            f"{result.pod_id}: no such pod at {args.provider} (already terminated, or the id "
            "is mistyped); nothing bills under this id — `prefect-runpod pods` lists live pods"
        )
        return 0
    print(f"{result.pod_id} terminated (confirmed {result.confirmed_at.isoformat()})")
    run_id = flow_run_id_from_pod_name(handle.name, None) if handle else None
    if run_id is not None and handle is not None:
        end = PodEnd(
            pod_id=result.pod_id,
            ended_by=EndedBy.CLI,
            confirmed=True,
            ended_at=result.confirmed_at,
            layer="prefect-runpod terminate",
        )
        with api():
            record = record_pod_end(
                str(run_id), end, recorded_by="cli", handle=handle, provider=provider
            )
        if record is None:  # the pod is gone; only the bookkeeping failed (logged)
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
    from prefect_runpod.flows.reaper import reaper

    params = provider_params(args)
    check_number("ttl_seconds", args.ttl_seconds, optional=True)
    quiet_console_tracebacks()
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
