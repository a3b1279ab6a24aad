"""The ``prefect-runpod`` command line: run fine-tunes, and watch, reach and price them.

    prefect-runpod finetune [options]     run the fine-tune (local pod + demo bundle by default)
    prefect-runpod plan [options]         every precondition and the price; rents nothing
    prefect-runpod check                  credentials, SSH key, HF token, tools, Prefect API
    prefect-runpod status [RUN]           live and recent runs: stage, pod, age, USD, ssh
    prefect-runpod logs RUN [--follow]    the training log, from the pod or the downloaded copy
    prefect-runpod ssh RUN|POD            an interactive shell in the pod
    prefect-runpod pods                   live pods: run, state, age, cost so far, ssh command
    prefect-runpod terminate POD_ID       terminate a pod (idempotent, confirmed, recorded)
    prefect-runpod reaper [--dry-run]     one reaper pass over orphaned pods
    prefect-runpod cost [RUN_ID]          what runs cost, ours beside RunPod's bill

One module per command group (``launch``: finetune; ``checks``: plan, check; ``watch``:
status, logs; ``pods``: pods, ssh, terminate, reaper; ``cost``: cost);
``common`` holds what they share and ``runs`` what they read about runs. The exit status
is 0 on success, ``EXIT_FAILED`` (1) for a run or command that failed, ``EXIT_USAGE`` (2)
for bad input refused before anything was rented (docs/cli.md). Everything a command
prints, and every log record, is redacted (``blocks.secret_mask``): no secret the
process read reaches the terminal, whatever its shape.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from prefect_runpod.flows.cli.common import EXIT_FAILED, EXIT_USAGE, api, provider_args

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``prefect-runpod`` (every option documented in ``--help``)."""
    from prefect_runpod.flows.cli import checks, cost, launch, pods, watch

    parser = argparse.ArgumentParser(
        prog="prefect-runpod",
        description="Run a fine-tune on a RunPod GPU pod (or the embedded local pod) end to "
        "end with Prefect: provision, env, hf_auth, upload, train, eval_parity, publish, "
        "download, checksum, terminate. The pod is always terminated.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    launch.add_parser(sub)
    checks.add_parsers(sub)
    watch.add_parsers(sub)
    pods.add_parsers(sub)
    cost.add_parser(sub, provider_args)
    return parser


def _commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    from prefect_runpod.flows.cli import checks, cost, launch, pods, watch

    return {
        "finetune": launch.run,
        "plan": checks.run_plan,
        "check": checks.run_check,
        "status": watch.run_status,
        "logs": watch.run_logs,
        "pods": pods.run_pods,
        "ssh": pods.run_ssh,
        "terminate": pods.run_terminate,
        "reaper": pods.run_reaper,
        "cost": lambda a: cost.run(a, api=api),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prefect-runpod``; returns the exit status: 0 success,
    ``EXIT_FAILED`` (1) a run or command that failed, ``EXIT_USAGE`` (2) bad input
    refused before anything was rented (one sentence on stderr, no traceback)."""
    from prefect_runpod.blocks.exceptions import RunPodFlowError, SpecError
    from prefect_runpod.blocks.secret_mask import redacted_output
    from prefect_runpod.flows.cli.arguments import (
        check_arguments,
        make_prefect_home,
        spell_negative_values,
    )

    try:
        args = build_parser().parse_args(
            spell_negative_values(sys.argv[1:] if argv is None else argv)
        )
    except SystemExit as exc:  # --help, or argparse's own usage error (status 2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    with redacted_output():
        try:  # argument errors: refused before Prefect is imported
            check_arguments(args)
            make_prefect_home()
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from prefect.settings import get_current_settings, temporary_settings

    from prefect_runpod.flows.cli.session import (
        EXIT_SIGINT,
        EXIT_SIGTERM,
        Terminated,
        orderly_signals,
    )
    from prefect_runpod.flows.run.inputs import check_prefect_api, check_prefect_api_key

    # Without PREFECT_API_URL Prefect starts a temporary server; its 20 s default start
    # deadline is too short on a busy small machine, and it should not phone home.
    # Prefect cannot create its home when the parent is missing (it then retries sqlite
    # for minutes); make it here.
    try:  # a profile may name another home
        make_prefect_home(get_current_settings().home)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    defaults: dict[Any, Any] = {}
    if "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in os.environ:
        timeout = max(get_current_settings().server.ephemeral.startup_timeout_seconds, 120)
        defaults["server.ephemeral.startup_timeout_seconds"] = timeout
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        defaults["server.analytics_enabled"] = False
    with redacted_output():
        try:
            check_prefect_api_key()  # before anything talks to the API with it
            # `check` reports the API as one of its checks; `terminate` ends the pod first
            # and says so when the cost record cannot be written: a dead API never keeps a
            # pod billing.
            if args.command not in ("check", "terminate"):
                check_prefect_api()
            with orderly_signals(), temporary_settings(updates=defaults):
                return _commands()[args.command](args)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except RunPodFlowError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except (KeyboardInterrupt, Terminated) as exc:
            signal = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
            print(f"stopped by {signal}", file=sys.stderr)
            return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT
