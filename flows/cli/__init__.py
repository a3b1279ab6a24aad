"""The ``prefect-runpod`` command line: run fine-tunes, and watch, reach and price them.

    prefect-runpod finetune [options]     run the fine-tune (local pod + demo bundle by default)
    prefect-runpod plan [options]         every precondition and the price; rents nothing
    prefect-runpod check                  credentials, SSH key, HF token, tools, Prefect API
    prefect-runpod status [RUN]           live and recent runs: stage, pod, age, USD, ssh
    prefect-runpod logs RUN [--follow]    the training log, from the pod or the downloaded copy
    prefect-runpod ssh RUN|POD            an interactive shell in the pod
    prefect-runpod fetch RUN              a kept pod's outputs brought home, verified
    prefect-runpod pods                   live pods: run, state, age, cost so far, ssh command
    prefect-runpod terminate POD_ID       terminate a pod (idempotent, confirmed, recorded)
    prefect-runpod reaper [--dry-run]     one reaper pass over orphaned pods
    prefect-runpod cost [RUN_ID]          what runs cost, ours beside RunPod's bill
    prefect-runpod server start|stop|status   the Prefect server kept in the background

One module per command group (``launch``: finetune; ``checks``: plan, check; ``watch``:
status, logs; ``pods``: pods, ssh, terminate, reaper; ``cost``: cost; ``server``: the
local Prefect server, kept by ``local_server``); ``common`` holds what they share,
``runs`` what they read about runs and ``session`` the API a command opens and its
signals. Building the parser imports neither Prefect nor paramiko nor httpx, so
``--help`` and every usage error answer at once. The exit status
is 0 on success, ``EXIT_FAILED`` (1) for a run or command that failed, ``EXIT_USAGE`` (2)
for bad input refused before anything was rented (docs/cli.md). Everything a command
prints, and every log record, is redacted (``blocks.secret_mask``): no secret the
process read reaches the terminal, whatever its shape.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence
from typing import Any

from prefect_runpod.flows.cli.common import EXIT_FAILED, EXIT_USAGE, api, api_args, provider_args

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "build_parser", "console_main", "main"]


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: it refuses what it does not know itself, so the error shows
    the subcommand's usage (argparse hands unknown arguments up to the top-level parser,
    which would show its own). An abbreviated option is refused, not guessed
    (``--max-cost 2`` is not ``--max-cost-usd 2``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


class _Version(argparse.Action):
    """``--version``: this package's version, Prefect's and Python's (read when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        python = ".".join(str(n) for n in sys.version_info[:3])
        print(
            f"prefect-runpod {version('prefect-runpod')} (Prefect {version('prefect')}, "
            f"Python {python})"
        )
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``prefect-runpod`` (every option documented in ``--help``)."""
    from prefect_runpod.flows.cli import checks, cost, launch, pods, server, watch

    parser = argparse.ArgumentParser(
        prog="prefect-runpod",
        allow_abbrev=False,
        description="Run a fine-tune on a RunPod GPU pod (or the embedded local pod) end to "
        "end with Prefect: provision, env, hf_auth, upload, train, eval_parity, publish, "
        "download, checksum, terminate. The pod is always terminated. Without "
        "PREFECT_API_URL the commands share one Prefect server that runs in the background "
        "(`prefect-runpod server status`).",
    )
    parser.add_argument("--version", action=_Version, help="print the versions and exit")
    api_args(parser, top_level=True)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    launch.add_parser(sub)
    checks.add_parsers(sub)
    watch.add_parsers(sub)
    pods.add_parsers(sub)
    cost.add_parser(sub, provider_args)
    server.add_parser(sub)
    return parser


def _commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    from prefect_runpod.flows.cli import checks, cost, launch, pods, server, watch

    return {
        "finetune": launch.run,
        "plan": checks.run_plan,
        "check": checks.run_check,
        "status": watch.run_status,
        "logs": watch.run_logs,
        "pods": pods.run_pods,
        "ssh": pods.run_ssh,
        "fetch": pods.run_fetch,
        "terminate": pods.run_terminate,
        "reaper": pods.run_reaper,
        "cost": lambda a: cost.run(a, api=api),
        "server": server.run,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``prefect-runpod``; returns the exit status: 0 success,
    ``EXIT_FAILED`` (1) a run or command that failed, ``EXIT_USAGE`` (2) bad input
    refused before anything was rented (one sentence on stderr, no traceback)."""
    from prefect_runpod.blocks.exceptions import RunPodFlowError, SpecError
    from prefect_runpod.blocks.secret_mask import redacted_output
    from prefect_runpod.flows.cli.arguments import (
        check_api_url,
        check_arguments,
        make_prefect_home,
        spell_negative_values,
    )

    try:
        args = build_parser().parse_args(
            spell_negative_values(sys.argv[1:] if argv is None else argv)
        )
    except SystemExit as exc:  # --help, --version, or argparse's own usage error (status 2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    with redacted_output():
        try:  # argument errors: refused before Prefect is imported
            check_arguments(args)
            check_api_url()
            make_prefect_home()
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from prefect_runpod.flows.cli.local_server import ServerStartError
    from prefect_runpod.flows.cli.session import (
        EXIT_SIGINT,
        EXIT_SIGTERM,
        Terminated,
        api_mode,
        orderly_signals,
    )

    # Prefect is imported only once a command opens the API (``session.prefect_api``). A
    # configured API is checked to answer before a command uses it, but for `check` (it
    # reports the API as one of its checks), `terminate` (it ends the pod first and says so
    # when the cost record cannot be written: a dead API never keeps a pod billing) and
    # `server` (which manages the local one).
    check_api = args.command not in ("check", "terminate", "server")
    with redacted_output():
        try:
            with orderly_signals(), api_mode(ephemeral=args.ephemeral, check_api=check_api):
                return _commands()[args.command](args)
        except (ServerStartError, RunPodFlowError) as exc:  # SpecError: refused input
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, SpecError) else EXIT_FAILED
        except (KeyboardInterrupt, Terminated) as exc:
            signal = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
            print(f"stopped by {signal}", file=sys.stderr)
            return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT


def console_main() -> None:
    """The ``prefect-runpod`` command (and ``python -m prefect_runpod.flows.cli``): ``main``
    on this process's arguments, then exit with its status.

    Before the interpreter's own teardown, every object it holds is moved out of the
    cyclic garbage collector's sight (``gc.freeze``): the collections Python makes while
    it shuts down walked the whole heap of Prefect's and pydantic's modules, about 0.4 s
    of every command that loads Prefect (measured: 0.47 s of a 1.9 s import-and-exit,
    0.11 s once frozen). Reference counting still frees what it frees, and the exit
    handlers run as before. Callers of ``main`` in a process that goes on (tests, other
    programs) are not affected.

    The collector is also held off while the command loads Prefect and its own modules,
    until it opens the Prefect API (``session.pause_collector`` / ``resume_collector``).

    Raises:
        SystemExit: always, with ``main``'s exit status.
    """
    from prefect_runpod.flows.cli.session import pause_collector

    pause_collector()
    code = main()
    gc.freeze()
    raise SystemExit(code)
