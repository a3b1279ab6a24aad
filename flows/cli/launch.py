"""``prefect-runpod finetune``: run the fine-tune flow from the command line, and the
fine-tune options that ``plan`` shares (the same options, the same checks).

Secrets are never taken as arguments (they would land in shell history and
``/proc/*/cmdline``) nor passed on as run parameters (Prefect stores those as sent):
the Hugging Face token comes from a saved block (``--hf-credentials`` or
``--hf-token-secret``) or the environment variable named by ``--hf-token-env``
(default ``HF_TOKEN``), RunPod's key from blocks or ``RUNPOD_API_KEY``.

Bad input is refused before Prefect starts a run or anything is rented, with one
sentence on stderr and exit status 2 (``blocks/validation/`` holds the rules; see
docs/architecture.md#input-validation). A run that fails prints its summary, never a
traceback; exit status 1. SIGTERM or Ctrl-C during a run ends it the same way: the pod
is terminated, the temporary Prefect server (when the CLI started one) is stopped, the
summary is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.api_outbox import is_outage
from prefect_runpod.flows.cli.common import (
    EXIT_FAILED,
    add_parameter_options,
    api,
    api_args,
    api_for_blocks,
    quiet_console_tracebacks,
)

__all__ = [
    "add_finetune_options",
    "add_parser",
    "cancel_interrupted_run",
    "finetune_params",
    "print_report",
    "run",
]


def add_parser(sub: Any) -> None:
    """Register ``finetune`` under the CLI's subcommands."""
    ft = sub.add_parser(
        "finetune",
        help="run the fine-tune flow",
        description="Run the fine-tune flow. With no options: the demo bundle on a local pod "
        "(a loopback SSH server that behaves like RunPod's PTY-only gateway). Exit status 0 "
        "only when every stage passed and the pod is confirmed terminated.",
    )
    add_finetune_options(ft)
    api_args(ft)
    ft.add_argument(
        "--json", action="store_true", help="print the RunReport as JSON instead of the summary"
    )
    loud = ft.add_mutually_exclusive_group()
    loud.add_argument(
        "--verbose",
        action="store_true",
        help="show the training log's lines in the terminal too (they always reach Prefect's "
        "log, coalesced)",
    )
    loud.add_argument(
        "--quiet",
        action="store_true",
        help="show only warnings, errors, the progress line and the summary",
    )


def add_finetune_options(ft: argparse.ArgumentParser) -> None:
    """Add every option of a fine-tune run (``finetune`` and ``plan`` take the same), group
    by group (source, publish, transfer, limits, local pod, pod life, blocks), each from
    its parameter's one declaration (``blocks.validation.parameters``)."""
    from prefect_runpod.blocks.validation.parameters import CLI_GROUPS, FINETUNE_PARAMETERS

    for group in CLI_GROUPS:
        add_parameter_options(ft, [p.name for p in FINETUNE_PARAMETERS if p.group == group])


def finetune_params(args: argparse.Namespace) -> dict[str, Any]:
    """The flow's parameters from the command line (no secret among them)."""
    from prefect_runpod.blocks.validation.parameters import FINETUNE_PARAMETERS

    return {p.name: getattr(args, p.name) for p in FINETUNE_PARAMETERS}


def run(args: argparse.Namespace) -> int:
    """Carry out ``prefect-runpod finetune``; returns the exit status (0 only when every
    stage passed and the pod is confirmed gone)."""
    from prefect_runpod.blocks.interrupts import end_stops, stops_sentence
    from prefect_runpod.flows.cli.session import EXIT_SIGINT, EXIT_SIGTERM, Terminated
    from prefect_runpod.flows.finetune import demo_bundle, finetune, last_output_dir
    from prefect_runpod.flows.run.inputs import check_concurrency_limit, prepare_run

    params = finetune_params(args)
    # Bad input fails here, before Prefect starts a run or anything is rented (the
    # arguments and the bundle were checked before Prefect was imported: args.settings);
    # saved blocks are looked up only when the command names one (the API opens for them,
    # once the other input passed).
    with contextlib.ExitStack() as blocks_api:
        prepare_run(
            {**params, "output_dir": args.output_dir or Path.cwd() / "prefect-runpod-runs"},
            demo_bundle=demo_bundle(),
            run_name=f"{args.name_prefix}-<flow_run_id>",
            settings=getattr(args, "settings", None),
            before_blocks=lambda: blocks_api.enter_context(api_for_blocks(params)),
        )
    # The flow's preflight checks again, for every caller that reaches it without the CLI.
    quiet_console_tracebacks("verbose" if args.verbose else "quiet" if args.quiet else "normal")
    # Prefect's log shipper writes "--- Error logging to API ---" to stderr at each batch
    # it cannot send; the run says an outage once (blocks.api_outbox)
    logging.raiseExceptions = False
    with api():  # the summary is printed while the API still takes the run's last logs
        check_concurrency_limit(args.concurrency_limit)  # before the flow run exists
        try:
            try:
                state = finetune(**params, return_state=True)
            finally:  # a stop that came during another's is said; the next Ctrl-C raises
                during = stops_sentence(*end_stops())
        except (KeyboardInterrupt, Terminated) as signalled:
            # The flow's finally ended the pod and wrote the report; say so, no traceback.
            out = last_output_dir()
            name = "SIGTERM" if isinstance(signalled, Terminated) else "Ctrl-C"
            print(f"\nthe run was stopped by {name}", file=sys.stderr)
            if during:
                print(during, file=sys.stderr)
            if out is not None and (out / "run-report.json").is_file():
                data = print_report(out / "run-report.json", args.json)
                if not isinstance(signalled, Terminated):
                    cancel_interrupted_run(data)
                    held_records(data.get("flow_run_id"))
            return EXIT_SIGTERM if isinstance(signalled, Terminated) else EXIT_SIGINT
        except Exception as exc:
            if not is_outage(exc):
                raise
            return _ended_without_api(args, exc)  # the work is done: only Prefect missed it
        run_id = str(state.state_details.flow_run_id)
        out = Path(args.output_dir or Path.cwd() / "prefect-runpod-runs" / run_id)
        report_file = out.expanduser().resolve() / "run-report.json"
        if not report_file.is_file():
            print(
                f"the run ended {state.type.value} before writing a report: {state.message}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        data = print_report(report_file, args.json)
        if state.is_cancelled():  # the flow run was cancelled in Prefect: the flow ended its pod
            print(f"the run was cancelled in Prefect: {state.message}", file=sys.stderr)
        if during:
            print(during, file=sys.stderr)
        held_records(data.get("flow_run_id"))
    return 0 if (state.is_completed() and data.get("passed")) else EXIT_FAILED


def cancel_interrupted_run(data: dict[str, Any]) -> str | None:
    """Record a run the user stopped with Ctrl-C as Cancelled in Prefect, as Prefect's
    runner records a run it cancelled (a forced Cancelled state), over the Crashed the flow
    engine sets for any ``KeyboardInterrupt``. The write goes through the process's outbox,
    so an outage holds it until the API answers.

    Args:
        data: the run's ``run-report.json`` (``flow_run_id``, ``error``, ``pod_id``,
            ``terminated``).

    Returns:
        The state's message (``stopped by Ctrl-C during upload (1.8 s into the stage);
        pod 3f2a… was ended``), or None when the report names no flow run.
    """
    from prefect.states import Cancelled

    from prefect_runpod.blocks.api_outbox import outbox
    from prefect_runpod.flows.run.cancel_watch import end_words

    run_id = data.get("flow_run_id")
    if not run_id:
        return None
    said = str(data.get("error") or "stopped by Ctrl-C").split("; the run ends its pod")[0]
    if "Ctrl-C" not in said:
        said = f"stopped by Ctrl-C ({said})"
    message = f"{said}; {end_words(data)}"[:500]
    outbox().put(
        "the run's final state",
        lambda client: client.set_flow_run_state(run_id, Cancelled(message=message), force=True),
    )
    return message


def _ended_without_api(args: argparse.Namespace, exc: Exception) -> int:
    """The run did its work, but the Prefect API was down when the flow told Prefect its
    end: print the summary from ``run-report.json``, hold the run's final state with its
    other records, and wait for the API (``held_records``)."""
    from prefect.client.schemas.objects import State
    from prefect.states import Completed, Failed

    from prefect_runpod.blocks.api_outbox import outbox
    from prefect_runpod.blocks.secret_mask import error_text
    from prefect_runpod.flows.finetune import last_output_dir

    out = last_output_dir()
    report_file = out / "run-report.json" if out is not None else None
    if report_file is None or not report_file.is_file():
        print(
            f"the Prefect API went down before the run wrote its report ({error_text(exc)})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(
        f"the Prefect API did not answer when the run told it its end ({error_text(exc)}); "
        "the run's state is held with its other records",
        file=sys.stderr,
    )
    data = print_report(report_file, args.json)
    run_id = data.get("flow_run_id")
    if run_id:
        passed = bool(data.get("passed"))
        final: State[Any] = (
            Completed() if passed else Failed(message=str(data.get("error") or "")[:500])
        )
        outbox().put(
            "the run's final state",
            lambda client: client.set_flow_run_state(run_id, final, force=True),
        )
    held_records(run_id)
    return 0 if data.get("passed") else EXIT_FAILED


def held_records(run_id: str | None) -> None:
    """After the summary: the records the run still holds for the Prefect API written
    (waiting for the API at most ``PREFECT_RUNPOD_API_HOLD_SECONDS``, default 120 s;
    Ctrl-C stops the wait), or what could not be written named, with where it is kept."""
    from prefect_runpod.blocks.api_outbox import hold_seconds, outbox

    box = outbox()
    try:
        lost = box.finish(hold_seconds())
    except KeyboardInterrupt:
        lost = [*box.held, *box.unwritten]
    if lost:
        hint = f"; `prefect-runpod cost {run_id} --reconcile` writes the cost record later"
        print(
            f"not in Prefect: {'; '.join(lost)}. run-report.json has the run's record"
            + (hint if run_id else ""),
            file=sys.stderr,
        )


def print_report(report_file: Path, as_json: bool) -> dict[str, Any]:
    """Print the run's summary (or its report as JSON); return the report's data."""
    from prefect_runpod.flows.run.report import RunReport, render_summary

    data = json.loads(report_file.read_text())
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print()
        print(render_summary(RunReport.model_validate(data)))
        print(f"report       {report_file}")
    return dict(data)
