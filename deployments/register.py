"""Set up and serve prefect-runpod's deployments (docs/architecture.md#termination-layers, layer 4; #prefect-surface).

Two commands::

    python -m prefect_runpod.deployments.register setup   # limit, automation, work pool
    python -m prefect_runpod.deployments.register serve   # setup, then serve every deployment

``setup`` is idempotent and creates, on the Prefect server ``PREFECT_API_URL`` points at:

- the global concurrency limit ``runpod-gpu`` (2 slots): the fine-tune flow holds one
  slot from provision to confirmed terminate, so at most two pods bill at once;
- the ``runpod-crash-zombie-flows`` automation: a flow run that stops sending
  ``prefect.flow-run.heartbeat`` events (its process was killed, its host died) is
  marked Crashed, as Prefect's docs advise for self-hosted servers
  (``advanced/detect-zombie-flows``); the reaper then ends its pod;
- the process work pool ``runpod-finetune`` that ``prefect deploy --all`` (prefect.yaml)
  targets. The GPU lives on RunPod, not under the worker, so a process pool is enough
  (the ``runpod`` pool type is for other flows, each on its own pod: docs/worker.md).
  A process pool of the old name ``runpod-pool`` has its deployments moved to it and is
  deleted, so no one starts ``--pool runpod-pool --type runpod`` by mistake;

- the variable ``prefect_runpod_provider`` (``local`` unless it exists): ``prefect.yaml``
  takes the provider of every fine-tune and reaper deployment from it
  (``{{ prefect.variables.prefect_runpod_provider }}``), so switching a deployed setup to
  RunPod is ``prefect variable set prefect_runpod_provider runpod --overwrite``, no edit.

``serve`` runs the same deployments as ``prefect.yaml`` in this process (no work pool,
no worker): handy on a laptop, and what the tests use. Its ``--provider`` and block
options (``--runpod-credentials``, ``--runpod-spec``, ``--ssh-key``) become the
deployments' parameters. ``serve`` and ``prefect deploy`` use the same deployment names
(``runpod-finetune/on-demand`` is what ``run_deployment`` and the sweep call), so
``serve`` refuses to replace a deployment that ``prefect deploy`` put on a work pool —
serving it would leave the pool's worker runs without code (``FileNotFoundError:
'…/None'``) — unless ``--replace`` says to take it over (docs/cli.md#deployments).
"""

from __future__ import annotations

import argparse
import sys

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.validation import check_number
from prefect_runpod.flows.cli.arguments import check_api_url, spell_negative_values
from prefect_runpod.flows.cli.local_server import ServerStartError
from prefect_runpod.flows.cli.session import api_mode, prefect_api

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Command line: ``setup`` or ``serve`` (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m prefect_runpod.deployments.register")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("setup", "serve"):
        cmd = sub.add_parser(name)
        cmd.add_argument(
            "--gpu-limit", type=int, default=2, help="slots of runpod-gpu (pods at once)"
        )
        cmd.add_argument(
            "--heartbeat-seconds",
            type=float,
            default=180.0,
            help="the flows' heartbeat interval, for the zombie automation",
        )
    serve_cmd = sub.choices["serve"]
    serve_cmd.add_argument(
        "--limit", dest="run_limit", type=int, default=None, help="most runs at once here"
    )
    serve_cmd.add_argument(
        "--query-seconds",
        type=float,
        default=None,
        help="how often to ask for scheduled runs (default PREFECT_RUNNER_POLL_FREQUENCY)",
    )
    serve_cmd.add_argument("--no-schedules", action="store_true", help="leave out cron/interval")
    serve_cmd.add_argument("--no-setup", action="store_true", help="skip the setup step")
    serve_cmd.add_argument(
        "--replace",
        action="store_true",
        help="take over deployments of the same names made by `prefect deploy`",
    )
    serve_cmd.add_argument("--provider", choices=["local", "runpod"], default=None)
    serve_cmd.add_argument("--runpod-credentials", help="saved RunPodCredentials block name")
    serve_cmd.add_argument("--runpod-spec", help="saved RunPodPodSpec block name")
    serve_cmd.add_argument("--ssh-key", help="saved RunPodSSHKey block name")
    args = parser.parse_args(spell_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        for name in ("gpu_limit", "heartbeat_seconds", "run_limit", "query_seconds"):
            if getattr(args, name, None) is not None:
                check_number(name, getattr(args, name))
        check_api_url()
        # The Prefect API the CLI's commands use: PREFECT_API_URL (checked to answer),
        # else the server prefect-runpod keeps in the background, so that the limit set up
        # here is the one `prefect-runpod finetune --concurrency-limit runpod-gpu` finds.
        with api_mode(ephemeral=False, check_api=True), prefect_api():
            return _run(args)
    except SpecError as exc:  # DeployedElsewhere is one too
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    """``setup`` or ``serve``, on the API ``main`` opened."""
    from prefect_runpod.deployments.serving import serve_all, setup, setup_lines

    if args.command == "setup" or not args.no_setup:
        done = setup(limit=args.gpu_limit, heartbeat_seconds=args.heartbeat_seconds)
        print("\n".join(["setup:", *(f"  {line}" for line in setup_lines(done))]), flush=True)
    if args.command == "serve":
        serve_all(
            limit=args.run_limit,
            query_seconds=args.query_seconds,
            schedules=not args.no_schedules,
            provider_params={
                "provider": args.provider,
                "runpod_credentials_block": args.runpod_credentials,
                "runpod_spec_block": args.runpod_spec,
                "ssh_key_block": args.ssh_key,
            },
            replace=args.replace,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
