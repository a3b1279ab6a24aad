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
import json
import sys
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.provider import DEFAULT_POD_LIFETIME_SECONDS, DEFAULT_POD_POLL_SECONDS
from prefect_runpod.flows.cli.common import EXIT_FAILED, api, quiet_console_tracebacks

__all__ = ["add_finetune_options", "add_parser", "finetune_params", "print_report", "run"]


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
    """Add every option of a fine-tune run (``finetune`` and ``plan`` take the same), in
    the order ``--help`` lists them."""
    _add_source_options(ft)
    _add_publish_options(ft)
    _add_transfer_options(ft)
    _add_limit_options(ft)
    _add_local_pod_options(ft)
    _add_pod_life_options(ft)
    _add_block_options(ft)


def _add_source_options(ft: argparse.ArgumentParser) -> None:
    """The bundle, the provider, and the Hugging Face model, token and endpoint."""
    ft.add_argument("--bundle", help="bundle directory with bundle.toml (default: the demo bundle)")
    ft.add_argument(
        "--provider",
        choices=["local", "runpod"],
        default="local",
        help="where the pod runs: the embedded local pod (default) or RunPod",
    )
    ft.add_argument(
        "--model-id", help="Hugging Face repo the job downloads; checked before any spend"
    )
    ft.add_argument(
        "--hf-credentials",
        metavar="NAME",
        help="saved HuggingFaceCredentials block with the Hugging Face token (and endpoint)",
    )
    ft.add_argument(
        "--hf-token-secret",
        metavar="NAME",
        help="saved Prefect Secret block holding the Hugging Face token",
    )
    ft.add_argument(
        "--hf-token-env",
        default="HF_TOKEN",
        metavar="VAR",
        help="without a block: the environment variable holding the Hugging Face token "
        "(default HF_TOKEN); the token itself is never an argument",
    )
    ft.add_argument(
        "--hf-endpoint",
        help="Hugging Face Hub endpoint (default huggingface.co; a mirror or a test Hub), "
        "for the model check and for publishing",
    )


def _add_publish_options(ft: argparse.ArgumentParser) -> None:
    """Where the outputs go: a publish target from the pod, what comes back."""
    ft.add_argument(
        "--publish",
        metavar="TARGET",
        help="ship the outputs from the pod itself, verified there: hf:ORG/REPO[@BRANCH] "
        "(a Hub model repo, private unless --publish-public; needs a write token) or "
        "s3[:PREFIX] (into the --s3-target bucket)",
    )
    ft.add_argument(
        "--publish-public",
        action="store_true",
        help="create the Hub repo public (default private)",
    )
    ft.add_argument(
        "--download",
        choices=["all", "eval", "none"],
        default="all",
        help="what comes back through the gateway: all outputs (default), only the eval "
        "files, or none (only with --publish)",
    )


def _add_transfer_options(ft: argparse.ArgumentParser) -> None:
    """How files travel to and from the pod."""
    ft.add_argument(
        "--transfer",
        default="auto",
        choices=_transfer_choices(),
        help="file transfer method (auto: s3 with --s3-target, sftp in direct mode, else pty)",
    )
    ft.add_argument(
        "--pty-framing",
        default="auto",
        choices=_framing_choices(),
        help="pty transfers: raw frames when a probe finds the gateway 8-bit clean (auto), "
        "always raw, or always base64",
    )
    ft.add_argument(
        "--pty-streams",
        type=int,
        default=1,
        help="pty transfers: PTY sessions to stripe large files over (1-16, default 1)",
    )
    ft.add_argument(
        "--follow-links",
        action="store_true",
        help="copy what links leaving the bundle point at (default: refuse them, naming each)",
    )


def _add_limit_options(ft: argparse.ArgumentParser) -> None:
    """The run's caps and gates, and the pods' name prefix."""
    ft.add_argument(
        "--max-cost-usd", type=float, help="budget cap in USD: reaching it ends the run"
    )
    ft.add_argument(
        "--max-runtime-seconds",
        type=float,
        default=3600.0,
        help="training runtime cap in seconds (default 3600)",
    )
    ft.add_argument(
        "--parity-tolerance",
        type=float,
        default=0.02,
        help="allowed accuracy gap between in-training and standalone eval (default 0.02)",
    )
    ft.add_argument(
        "--parity-warn-only",
        action="store_true",
        help="record an eval-parity failure without failing the run",
    )
    ft.add_argument(
        "--keep-pod-on-failure",
        action="store_true",
        help="leave the pod up after a failure for inspection (dead-man lifetime applies)",
    )
    ft.add_argument("--name-prefix", default="prft", help="pods are named <prefix>-<flow_run_id>")


def _add_local_pod_options(ft: argparse.ArgumentParser) -> None:
    """The local pod's mode, image and pretend price."""
    from prefect_runpod.blocks.local_pod.images import profile_names

    ft.add_argument(
        "--local-mode",
        choices=["gateway", "direct"],
        help="local pod SSH mode: gateway (PTY only, like RunPod; the default) or direct "
        "(exec+SFTP)",
    )
    ft.add_argument(
        "--local-image",
        choices=profile_names(),
        metavar="NAME",
        help="the local pod's image profile, the login environment of a real image: "
        + ", ".join(profile_names())
        + " (default plain; see docs/local-pod-images.md)",
    )
    ft.add_argument(
        "--local-cost-per-hr",
        type=float,
        help="pretend price of the local pod in USD/h, to rehearse costs (e.g. 0.22; default 0)",
    )


def _add_pod_life_options(ft: argparse.ArgumentParser) -> None:
    """Where results go, and how the pod is watched, reconnected and ended."""
    from prefect_runpod.blocks.console.reconnect import DEFAULT_RECONNECT_BUDGET_SECONDS

    ft.add_argument(
        "--output-dir",
        help="where outputs and run-report.json go (default ./prefect-runpod-runs/<flow_run_id>)",
    )
    ft.add_argument(
        "--concurrency-limit", help="Prefect global concurrency limit capping live pods"
    )
    ft.add_argument(
        "--pod-poll-seconds",
        type=float,
        default=DEFAULT_POD_POLL_SECONDS,
        help="how often the run asks the provider whether its pod still lives (default "
        f"{DEFAULT_POD_POLL_SECONDS:g}); it also asks before every reconnect",
    )
    ft.add_argument(
        "--terminate-timeout-seconds",
        type=float,
        default=120.0,
        help="how long terminate waits for the provider to confirm the pod gone (default "
        "120); unconfirmed, the run fails saying the pod may still be billing",
    )
    ft.add_argument(
        "--heartbeat-stale-seconds",
        type=float,
        default=900.0,
        help="dead-man switch: the pod removes itself when the flow's heartbeat is older",
    )
    ft.add_argument(
        "--pod-lifetime-seconds",
        type=float,
        default=DEFAULT_POD_LIFETIME_SECONDS,
        help="hard cap on the pod's life in seconds (default "
        f"{DEFAULT_POD_LIFETIME_SECONDS:g}): the dead-man switch's, and RunPod's "
        "terminateAfter (create + lifetime)",
    )
    ft.add_argument(
        "--reconnect-budget-seconds",
        type=float,
        default=DEFAULT_RECONNECT_BUDGET_SECONDS,
        help="how long each stage waits for the pod's SSH to come back after it refuses or "
        "drops connections (default 120)",
    )


def _add_block_options(ft: argparse.ArgumentParser) -> None:
    """Saved blocks, RunPod's GPU types, and bundle files allowed despite a secret's look."""
    ft.add_argument("--runpod-credentials", help="saved RunPodCredentials block name")
    ft.add_argument("--runpod-spec", help="saved RunPodPodSpec block name")
    ft.add_argument("--ssh-key", help="saved RunPodSSHKey block name")
    ft.add_argument(
        "--s3-target",
        metavar="NAME",
        help="saved S3Target block (a bucket or a RunPod network volume) for --transfer s3 "
        "and --publish s3",
    )
    ft.add_argument(
        "--gpu-type",
        action="append",
        dest="gpu_types",
        metavar="GPU_TYPE_ID",
        help="RunPod GPU type id to rent; repeat to fall back in order, e.g. "
        "--gpu-type 'NVIDIA GeForce RTX 3090' --gpu-type 'NVIDIA GeForce RTX 4090'",
    )
    ft.add_argument(
        "--allow-secret-file",
        action="append",
        dest="allow_secret_files",
        metavar="PATH",
        help="upload this bundle file although it looks like a secret (a path or gitignore "
        "pattern inside the bundle; repeat for more)",
    )


def _transfer_choices() -> tuple[str, ...]:
    from prefect_runpod.tasks.preflight import transfer_methods

    return transfer_methods()


def _framing_choices() -> tuple[str, ...]:
    from prefect_runpod.blocks.transfer.pty.options import FRAMING_CHOICES

    return FRAMING_CHOICES


def finetune_params(args: argparse.Namespace) -> dict[str, Any]:
    """The flow's parameters from the command line (no secret among them)."""
    return {
        "bundle": args.bundle,
        "provider": args.provider,
        "model_id": args.model_id,
        "hf_credentials_block": args.hf_credentials,
        "hf_token_secret": args.hf_token_secret,
        "hf_token_env": args.hf_token_env,
        "hf_endpoint": args.hf_endpoint,
        "transfer_method": args.transfer,
        "follow_links": args.follow_links,
        "pty_framing": args.pty_framing,
        "pty_streams": args.pty_streams,
        "max_cost_usd": args.max_cost_usd,
        "max_runtime_seconds": args.max_runtime_seconds,
        "parity_tolerance": args.parity_tolerance,
        "parity_warn_only": args.parity_warn_only,
        "keep_pod_on_failure": args.keep_pod_on_failure,
        "name_prefix": args.name_prefix,
        "local_cost_per_hr": args.local_cost_per_hr,
        "local_mode": args.local_mode,
        "local_image": args.local_image,
        "output_dir": args.output_dir,
        "concurrency_limit": args.concurrency_limit,
        "pod_poll_seconds": args.pod_poll_seconds,
        "terminate_timeout_seconds": args.terminate_timeout_seconds,
        "heartbeat_stale_seconds": args.heartbeat_stale_seconds,
        "pod_lifetime_seconds": args.pod_lifetime_seconds,
        "reconnect_budget_seconds": args.reconnect_budget_seconds,
        "runpod_credentials_block": args.runpod_credentials,
        "runpod_spec_block": args.runpod_spec,
        "ssh_key_block": args.ssh_key,
        "gpu_type_ids": args.gpu_types,
        "s3_target_block": args.s3_target,
        "allow_secret_files": args.allow_secret_files,
        "publish": args.publish,
        "publish_public": args.publish_public,
        "download": args.download,
    }


def run(args: argparse.Namespace) -> int:
    """Carry out ``prefect-runpod finetune``; returns the exit status (0 only when every
    stage passed and the pod is confirmed gone)."""
    from prefect_runpod.flows.cli.session import EXIT_SIGINT, EXIT_SIGTERM, Terminated
    from prefect_runpod.flows.finetune import demo_bundle, finetune, last_output_dir
    from prefect_runpod.flows.run.inputs import prepare_run

    params = finetune_params(args)
    # Bad input fails here, before Prefect starts a run or anything is rented; saved
    # blocks are looked up only when the command names one.
    prepare_run(
        {**params, "output_dir": args.output_dir or Path.cwd() / "prefect-runpod-runs"},
        demo_bundle=demo_bundle(),
        run_name=f"{args.name_prefix}-<flow_run_id>",
    )
    # The flow's preflight checks again, for every caller that reaches it without the CLI.
    quiet_console_tracebacks("verbose" if args.verbose else "quiet" if args.quiet else "normal")
    with api():  # the summary is printed while the API still takes the run's last logs
        try:
            state = finetune(**params, return_state=True)
        except (KeyboardInterrupt, Terminated) as signalled:
            # The flow's finally ended the pod and wrote the report; say so, no traceback.
            out = last_output_dir()
            name = "SIGTERM" if isinstance(signalled, Terminated) else "Ctrl-C"
            print(f"\nthe run was stopped by {name}", file=sys.stderr)
            if out is not None and (out / "run-report.json").is_file():
                print_report(out / "run-report.json", args.json)
            return EXIT_SIGTERM if isinstance(signalled, Terminated) else EXIT_SIGINT
    run_id = str(state.state_details.flow_run_id)
    out = (
        Path(args.output_dir or Path.cwd() / "prefect-runpod-runs" / run_id).expanduser().resolve()
    )
    report_file = out / "run-report.json"
    if not report_file.is_file():
        print(
            f"the run ended {state.type.value} before writing a report: {state.message}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    data = print_report(report_file, args.json)
    return 0 if (state.is_completed() and data.get("passed")) else EXIT_FAILED


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
