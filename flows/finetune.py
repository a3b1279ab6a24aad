"""The fine-tune flow: provision → env → hf_auth → upload → train → eval_parity →
publish → download → checksum → terminate, with terminate guaranteed (docs/architecture.md#layers-and-packages, #termination-layers, #publish-from-the-pod).

Stages run inline in the flow's main thread, so SIGTERM and cancellation reach the
``finally`` at once. The RunReport is the persisted (JSON) result; it is also written to
``<output_dir>/run-report.json`` whatever the outcome.

Run it: ``prefect-runpod finetune`` or ``python -m prefect_runpod.flows.finetune``.
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

from prefect import Flow, State, flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.logging.loggers import flow_run_logger

from prefect_runpod.blocks import secret_mask
from prefect_runpod.blocks.api_probe import watch_api
from prefect_runpod.blocks.exceptions import CancelRequested, TerminateError
from prefect_runpod.blocks.interrupts import end_stops
from prefect_runpod.blocks.provider import EndedBy
from prefect_runpod.blocks.validation import parameters as run_parameters
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_DOWNLOAD,
    DEFAULT_HEARTBEAT_STALE_SECONDS,
    DEFAULT_HF_TOKEN_ENV,
    DEFAULT_MAX_POD_LOSSES,
    DEFAULT_MAX_RUNTIME_SECONDS,
    DEFAULT_NAME_PREFIX,
    DEFAULT_PARITY_TOLERANCE,
    DEFAULT_POD_LIFETIME_SECONDS,
    DEFAULT_POD_POLL_SECONDS,
    DEFAULT_PROVIDER,
    DEFAULT_PTY_FRAMING,
    DEFAULT_PTY_STREAMS,
    DEFAULT_RECONNECT_BUDGET_SECONDS,
    DEFAULT_TERMINATE_TIMEOUT_SECONDS,
    DEFAULT_TRANSFER_METHOD,
    ProviderName,
)
from prefect_runpod.flows.run.cancel_watch import CancelWatch, cancelled_state
from prefect_runpod.flows.run.continuation import carry_run
from prefect_runpod.flows.run.cost_record import latest_record, record_pod_end
from prefect_runpod.flows.run.end import end_run, record_cost, write_report
from prefect_runpod.flows.run.guardian import start_guardian
from prefect_runpod.flows.run.inputs import PreparedRun, prepare_run
from prefect_runpod.flows.run.ledger import error_line, run_stage
from prefect_runpod.flows.run.logs import install_quiet_engine, stage_logger
from prefect_runpod.flows.run.names import (
    TRAIN_LOG,
    attempt_pod_name,
    flow_run_url,
    pod_name_for,
)
from prefect_runpod.flows.run.pod_session import PodSession
from prefect_runpod.flows.run.providers import build_provider, ssh_key_file
from prefect_runpod.flows.run.recovery import AttemptLoop, resume_checkpoint
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.tasks.bundle import demo_bundle
from prefect_runpod.tasks.preflight_access import preflight
from prefect_runpod.tasks.terminate import terminate_by_name

__all__ = ["TRAIN_LOG", "demo_bundle", "finetune", "last_output_dir", "pod_name_for"]

_OUTPUT_DIRS: list[Path] = []
"""Where this process's runs keep their reports, newest last (``last_output_dir``)."""


def last_output_dir() -> Path | None:
    """The output directory of the latest run this process started, or None: the CLI
    finds the report there when a signal ended the run before it returned a state."""
    return _OUTPUT_DIRS[-1] if _OUTPUT_DIRS else None


def _terminate_hook(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:  # noqa: F811
    """``on_crashed`` / ``on_cancellation``: find the pod by name from the flow run alone
    (hooks may run in the runner's process, with none of the flow's memory) and terminate
    it. Idempotent, so running after the flow's own ``finally`` is harmless."""
    logger = flow_run_logger(flow_run, flow)
    params = dict(flow_run.parameters or {})
    if params.get("keep_pod_on_failure"):
        logger.warning("keep_pod_on_failure is set: the pod is left for inspection")
        return
    run_name = pod_name_for(params.get("name_prefix", DEFAULT_NAME_PREFIX), str(flow_run.id))
    attempts = 1 + int(params.get("max_pod_losses") or DEFAULT_MAX_POD_LOSSES)
    attempts += _carried(str(flow_run.id)) if params.get("resume_from") else 0
    for number in range(1, attempts + 1):  # every pod attempt of the run, by its name
        _terminate_attempt(flow, flow_run, state, attempt_pod_name(run_name, number), number)


def _carried(flow_run_id: str) -> int:
    """How many attempts the run's record carried from the run it continued (its own
    pods are numbered after them); 0 when the record cannot be read."""
    try:
        record = latest_record(flow_run_id)
    except Exception:  # the hook still ends the attempts it can name
        return 0
    return sum(1 for a in record.attempts if a.carried_from) if record is not None else 0


def _terminate_attempt(
    flow: Flow[..., Any], flow_run: FlowRun, state: State[Any], name: str, number: int
) -> None:
    """The hook's terminate of the run's pod attempt ``number``, found by ``name``."""
    logger = flow_run_logger(flow_run, flow)
    params = dict(flow_run.parameters or {})
    provider = None
    try:
        provider, _ = build_provider(params, need_ssh_key=False)
        handle = provider.find(name)
        if handle is None and number > 1:
            return  # the run never got this far: nothing to say
        result = terminate_by_name(provider, name, logger, handle=handle)
        if result is not None and handle is not None:
            record_pod_end(
                str(flow_run.id),
                result.end(
                    EndedBy.HOOK,
                    f"terminate (the {state.type.value.lower() if state else '?'} hook)",
                ),
                recorded_by="hook",
                handle=handle,
                provider=provider,
            )
    except Exception as exc:  # a hook must never raise; say what to do instead
        logger.error(
            "could not terminate pod %s from the %s hook (%s); it may still be billing: run "
            "`prefect-runpod terminate --provider %s --name %s` or the reaper flow",
            name,
            state.type.value if state else "?",
            type(exc).__name__,
            params.get("provider", DEFAULT_PROVIDER),
            name,
        )


def _flow_run_id() -> str:
    ctx = get_run_context()
    run = getattr(ctx, "flow_run", None)
    return str(run.id) if run is not None else uuid.uuid4().hex


@flow(
    name="runpod-finetune",
    persist_result=True,
    result_serializer="json",
    on_crashed=[_terminate_hook],
    on_cancellation=[_terminate_hook],
    validate_parameters=True,
)
@run_parameters.document
def finetune(
    bundle: str | None = None,
    provider: ProviderName = DEFAULT_PROVIDER,
    model_id: str | None = None,
    hf_credentials_block: str | None = None,
    hf_token_secret: str | None = None,
    hf_token_env: str = DEFAULT_HF_TOKEN_ENV,
    hf_endpoint: str | None = None,
    transfer_method: str = DEFAULT_TRANSFER_METHOD,
    follow_links: bool = False,
    pty_framing: Literal["auto", "raw", "base64"] = DEFAULT_PTY_FRAMING,
    pty_streams: int = DEFAULT_PTY_STREAMS,
    max_cost_usd: float | None = None,
    max_runtime_seconds: float = DEFAULT_MAX_RUNTIME_SECONDS,
    parity_tolerance: float = DEFAULT_PARITY_TOLERANCE,
    parity_warn_only: bool = False,
    keep_pod_on_failure: bool = False,
    name_prefix: str = DEFAULT_NAME_PREFIX,
    local_cost_per_hr: float | None = None,
    local_mode: Literal["gateway", "direct"] | None = None,
    local_image: str | None = None,
    output_dir: str | None = None,
    concurrency_limit: str | None = None,
    pod_poll_seconds: float = DEFAULT_POD_POLL_SECONDS,
    terminate_timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS,
    heartbeat_stale_seconds: float = DEFAULT_HEARTBEAT_STALE_SECONDS,
    pod_lifetime_seconds: float = DEFAULT_POD_LIFETIME_SECONDS,
    reconnect_budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS,
    runpod_credentials_block: str | None = None,
    runpod_spec_block: str | None = None,
    ssh_key_block: str | None = None,
    gpu_type_ids: list[str] | None = None,
    s3_target_block: str | None = None,
    allow_secret_files: list[str] | None = None,
    publish: str | None = None,
    publish_public: bool = False,
    download: Literal["all", "eval", "none"] = DEFAULT_DOWNLOAD,
    max_pod_losses: int = DEFAULT_MAX_POD_LOSSES,
    max_recovery_usd: float | None = None,
    resume_from: str | None = None,
    recover_outside_terminate: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tune a bundle on a pod end to end and always terminate the pod.

    Args:

    Returns:
        The RunReport as JSON data (``stages``, ``pod_id``, ``cost``, ``manifest``, ``parity``…).

    Raises:
        SpecError / HFAuthError before any pod exists; the failing stage's error otherwise
        (after the pod is terminated; ``PodGoneError`` when the pod went away under the
        run); EvalParityError after download when parity fails; TerminateError when the
        pod's end could not be confirmed (it may still be billing: the message names the
        command that ends it). A run whose pod may still bill never ends Completed.
        A run whose flow run is set Cancelling in Prefect while it runs ends its pod and
        ends Cancelled (``flows.run.cancel_watch``): called as a function, it raises
        Prefect's ``CancelledRun`` then.
    """
    params = dict(locals())  # every parameter, as the hooks see them in flow_run.parameters
    end_stops(keep_pending=True)  # an earlier run's stop is not this one's (a process serves many)
    watch_api()  # an API outage is told while it lasts, whatever the stage (blocks.api_probe)
    run_id = _flow_run_id()
    out = Path(output_dir or Path.cwd() / "prefect-runpod-runs" / run_id).expanduser().resolve()
    _OUTPUT_DIRS.append(out)
    report = RunReport(
        flow_run_id=run_id,
        pod_name=pod_name_for(name_prefix, run_id),
        provider=provider,
        output_dir=str(out),
        flow_run_url=flow_run_url(run_id),
    )
    cancel = CancelWatch(run_id).start()  # a cancel in Prefect stops the run
    try:
        given_out = output_dir is not None
        return _finetune(report, {**params, "output_dir": out}, cancel, given_out=given_out)
    except CancelRequested:  # the pod is ended; Prefect makes a returned state the run's
        return cancelled_state(report.to_json_dict())  # type: ignore[no-any-return]
    finally:
        cancel.stop()


def _finetune(
    report: RunReport, params: dict[str, Any], cancel: CancelWatch, *, given_out: bool
) -> dict[str, Any]:
    """The body of ``finetune``: ``params`` holds every parameter, ``output_dir``
    resolved (``given_out``: the caller named it); ``cancel`` is stopped before the
    run's pod is ended (no stop interrupts that)."""
    logger = get_run_logger()
    install_quiet_engine()
    secret_mask.install_log_filter()
    on_stage = stage_logger(logger, report)
    attempts = AttemptLoop(params)
    deferred: BaseException | None = None

    # The concurrency slot (one per live pod) is released only after terminate.
    with ExitStack() as holds:
        try:
            run, resume = _preflight(report, params, on_stage, given_out=given_out)
            concurrency_limit = params["concurrency_limit"]
            if concurrency_limit:
                from prefect.concurrency.sync import concurrency

                logger.info(
                    "run %s takes a slot of global concurrency limit %r before renting "
                    "(one per live pod; it waits here while every slot is held)",
                    report.pod_name,
                    concurrency_limit,
                )
                holds.enter_context(concurrency(concurrency_limit, occupy=1, strict=True))

            def _attempt(number: int, resume: str | None, lost: int | None) -> PodSession:
                return PodSession(
                    report,
                    run,
                    on_stage,
                    number=number,
                    key_path=ssh_key_file(params),  # None: the key is kept beside the outputs
                    parity_warn_only=params["parity_warn_only"],
                    # before the create: ends the pod if this process dies before its dead-man
                    guardian=start_guardian(
                        params, attempt_pod_name(report.pod_name, number), report.flow_run_id
                    ),
                    resume_from=resume,
                    steps_lost=lost,
                )

            # a lost pod is resumed on a new one when the bundle checkpoints (flows.run.recovery)
            deferred = attempts.run(_attempt, resume_from=resume, first=len(report.attempts) + 1)
        except BaseException as exc:
            report.error = report.error or error_line(report, exc)
            in_flight: BaseException | None = exc
            masked = secret_mask.masked_error(exc)
            if masked is not exc:  # Prefect copies the text into states, events, results
                raise masked from None
            raise
        else:
            in_flight = None
        finally:
            cancel.stop()  # a cancel that comes now changes nothing: the pod is ended next
            unconfirmed = _bring_back(attempts.session, report, params, on_stage)
            # A pod that may still bill fails the run, whatever happened before: the
            # state names the pod and the command (signals and cancellations keep their
            # own state, which is never Completed either).
            if unconfirmed is not None and (in_flight is None or isinstance(in_flight, Exception)):
                raise unconfirmed from in_flight
    if deferred is not None:
        report.error = secret_mask.error_text(deferred)
        write_report(report)
        raise deferred
    return report.to_json_dict()


def _preflight(
    report: RunReport, params: dict[str, Any], on_stage: Any, *, given_out: bool = False
) -> tuple[PreparedRun, str | None]:
    """The run's ``preflight`` stage: every check that needs no pod (``prepare_run``, the
    checkpoint ``resume_from`` names, the Hub's answers), before anything is rented; an
    output dir the run was given (``given_out``) must be empty unless ``overwrite``.

    Returns:
        The prepared run, and the checkpoint its first attempt resumes from (or None).
    """
    with run_stage(report, "preflight", on_stage):
        if given_out:
            from prefect_runpod.blocks.validation import check_output_dir_unused

            check_output_dir_unused(Path(params["output_dir"]), overwrite=params["overwrite"])
        run = prepare_run(params, demo_bundle=demo_bundle(), run_name=report.pod_name)
        resume = resume_checkpoint(params.get("resume_from"), run)
        timeout = run.settings.terminate_timeout_seconds
        if carry_run(report, params.get("resume_from"), run.provider, timeout):
            record_cost(report, None, final=False)  # the record carries the old attempts
        get_run_logger().info(
            "preflight: %s; Hugging Face token: %s", run.upload_line, run.hf.source
        )
        report.cost.max_cost_usd = run.settings.max_cost_usd
        report.download_choice = run.settings.download
        report.hf.extend(preflight(run.settings, run.hf.token, run.hf.endpoint, run.s3))
    return run, resume


def _bring_back(
    session: PodSession | None, report: RunReport, params: dict[str, Any], on_stage: Any
) -> TerminateError | None:
    """End the run's pod attempt (``PodSession.bring_back``), or, when the run ended
    before one began, record that no pod was created and write the report."""
    keep = bool(params.get("keep_pod_on_failure"))
    timeout = _terminate_timeout(params)
    if session is not None:
        return session.bring_back(keep_pod_on_failure=keep, terminate_timeout_seconds=timeout)
    return end_run(
        report,
        None,
        None,
        keep_pod_on_failure=keep,
        terminate_timeout_seconds=timeout,
        on_stage=on_stage,
    )


def _terminate_timeout(params: dict[str, Any]) -> float:
    """The validated terminate deadline; preflight refused anything else before renting."""
    from prefect_runpod.blocks.validation import check_number

    try:
        return check_number("terminate_timeout_seconds", params.get("terminate_timeout_seconds"))  # type: ignore[return-value]
    except Exception:
        return DEFAULT_TERMINATE_TIMEOUT_SECONDS


if __name__ == "__main__":
    from prefect_runpod.flows.cli import main

    raise SystemExit(main(["finetune", *__import__("sys").argv[1:]]))
