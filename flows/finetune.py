"""The fine-tune flow: provision → env → hf_auth → upload → train → eval_parity →
publish → download → checksum → terminate, with terminate guaranteed (docs/architecture.md#layers-and-packages, #termination-layers, #publish-from-the-pod).

Stages run inline in the flow's main thread, so SIGTERM and cancellation reach the
``finally`` at once. The RunReport is the persisted (JSON) result; it is also written to
``<output_dir>/run-report.json`` whatever the outcome.

Run it: ``prefect-runpod finetune`` or ``python -m prefect_runpod.flows.finetune``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import Flow, State, flow, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.context import get_run_context
from prefect.logging.loggers import flow_run_logger
from pydantic import SecretStr

from prefect_runpod.blocks import secret_mask
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.costs import budget_reason
from prefect_runpod.blocks.exceptions import (
    BudgetExceededError,
    ChecksumMismatchError,
    EvalParityError,
)
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import (
    Capability,
    DeadmanConfig,
    EndedBy,
    PodEnd,
    PodRequest,
    PodWatch,
)
from prefect_runpod.blocks.provider_registry import provider_class, provider_supports
from prefect_runpod.blocks.validation import parameters as run_parameters
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_DOWNLOAD,
    DEFAULT_HEARTBEAT_STALE_SECONDS,
    DEFAULT_HF_TOKEN_ENV,
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
from prefect_runpod.flows.run.cost_record import record_pod_end
from prefect_runpod.flows.run.end import end_run, lease_text, record_cost, write_report
from prefect_runpod.flows.run.heartbeat import HeartbeatKeeper, heartbeat_interval_seconds
from prefect_runpod.flows.run.inputs import PreparedRun, prepare_run
from prefect_runpod.flows.run.ledger import StageSkipped, run_stage
from prefect_runpod.flows.run.logs import install_quiet_engine, stage_logger
from prefect_runpod.flows.run.providers import build_provider
from prefect_runpod.flows.run.report import RunReport, flow_run_url
from prefect_runpod.tasks.models import HFDiagnosis, StageState
from prefect_runpod.tasks.preflight import preflight
from prefect_runpod.tasks.provision import prepare_pod, provision
from prefect_runpod.tasks.terminate import terminate_by_name

__all__ = ["TRAIN_LOG", "demo_bundle", "finetune", "last_output_dir", "pod_name_for"]

_OUTPUT_DIRS: list[Path] = []
"""Where this process's runs keep their reports, newest last (``last_output_dir``)."""


def last_output_dir() -> Path | None:
    """The output directory of the latest run this process started, or None: the CLI
    finds the report there when a signal ended the run before it returned a state."""
    return _OUTPUT_DIRS[-1] if _OUTPUT_DIRS else None


def demo_bundle() -> Path:
    """The stdlib-only demo bundle shipped with the project (used when no bundle is given);
    installed as the package ``prefect_runpod.examples.demo``."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("prefect_runpod.examples.demo")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "bundle.toml").is_file():
                return Path(location)
    return Path(__file__).resolve().parent.parent / "examples" / "demo"


_READY_TIMEOUT_SECONDS = 600.0
"""RunPod can take minutes to pull a large image (dstack allows 20 min); the local pod ~1 s."""


def pod_name_for(name_prefix: str, flow_run_id: str) -> str:
    """The pod name hooks and the reaper find a run's pod by: ``<prefix>-<flow_run_id>``."""
    return f"{name_prefix}-{flow_run_id}"


def _terminate_hook(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:  # noqa: F811
    """``on_crashed`` / ``on_cancellation``: find the pod by name from the flow run alone
    (hooks may run in the runner's process, with none of the flow's memory) and terminate
    it. Idempotent, so running after the flow's own ``finally`` is harmless."""
    logger = flow_run_logger(flow_run, flow)
    params = dict(flow_run.parameters or {})
    if params.get("keep_pod_on_failure"):
        logger.warning("keep_pod_on_failure is set: the pod is left for inspection")
        return
    name = pod_name_for(params.get("name_prefix", DEFAULT_NAME_PREFIX), str(flow_run.id))
    provider = None
    try:
        provider, _ = build_provider(params, need_ssh_key=False)
        handle = provider.find(name)
        result = terminate_by_name(provider, name, logger, handle=handle)
        if result is not None and handle is not None:
            record_pod_end(
                str(flow_run.id),
                PodEnd(
                    pod_id=result.pod_id,
                    ended_by=EndedBy.HOOK,
                    confirmed=True,
                    ended_at=result.confirmed_at,
                    layer=f"terminate (the {state.type.value.lower() if state else '?'} hook)",
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


class _Budget:
    """The run's budget check: the pod's projected spend (``blocks/costs.py``) against
    ``max_cost_usd``, from the moment the pod is on record."""

    def __init__(
        self,
        max_cost_usd: float | None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.max_cost_usd = max_cost_usd
        self.handle: PodHandle | None = None
        self._now = now

    def reason(self) -> str | None:
        """A sentence when the budget is spent, else None (also with no pod or no cap)."""
        if self.handle is None:
            return None
        return budget_reason(
            self.handle.cost_per_hr,
            self.handle.created_at,
            self._now(),
            self.max_cost_usd,
            pod_id=self.handle.pod_id,
        )

    def check(self) -> None:
        """Raise ``BudgetExceededError`` when the budget is spent."""
        why = self.reason()
        if why:
            raise BudgetExceededError(why, pod_id=self.handle.pod_id if self.handle else None)


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
    """
    params = dict(locals())  # every parameter, as the hooks see them in flow_run.parameters
    logger = get_run_logger()
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
    budget = _Budget(None)
    ssh_key_path = (
        provider_class(provider).user_key_path()
        if provider_supports(provider, Capability.USER_KEY)
        else None
    )
    pod_provider = None
    deferred: BaseException | None = None
    guards = _Guards()

    install_quiet_engine()
    secret_mask.install_log_filter()
    on_stage = stage_logger(logger, report)

    # The concurrency slot (one per live pod) is released only after terminate.
    with ExitStack() as holds:
        try:
            with run_stage(report, "preflight", on_stage):
                run = prepare_run(
                    {**params, "output_dir": out},
                    demo_bundle=demo_bundle(),
                    run_name=report.pod_name,
                )
                logger.info("preflight: %s; Hugging Face token: %s", run.upload_line, run.hf.source)
                report.cost.max_cost_usd = budget.max_cost_usd = run.settings.max_cost_usd
                report.download_choice = run.settings.download
                report.hf.extend(preflight(run.settings, run.hf.token, run.hf.endpoint, run.s3))
                pod_provider = run.provider
            if concurrency_limit:
                from prefect.concurrency.sync import concurrency

                holds.enter_context(concurrency(concurrency_limit, occupy=1, strict=True))
            deferred = _run_on_pod(
                report,
                run,
                budget,
                on_stage,
                parity_warn_only=parity_warn_only,
                key_path=ssh_key_path,
                guards=guards,
            )
        except BaseException as exc:
            report.error = report.error or secret_mask.error_text(exc).strip()[:400]
            in_flight: BaseException | None = exc
            masked = secret_mask.masked_error(exc)
            if masked is not exc:  # Prefect copies the text into states, events, results
                raise masked from None
            raise
        else:
            in_flight = None
        finally:
            guards.stop()
            unconfirmed = end_run(
                report,
                pod_provider,
                guards.watch,
                keep_pod_on_failure=keep_pod_on_failure,
                terminate_timeout_seconds=_terminate_timeout(params),
                on_stage=on_stage,
            )
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


class _Guards:
    """What watches the pod while the run uses it: the heartbeat keepers (the dead-man's
    sign of life) and the liveness watch (the provider's word that the pod still lives)."""

    def __init__(self) -> None:
        self.keepers: list[HeartbeatKeeper] = []
        self.watch: PodWatch | None = None

    def stop(self) -> None:
        for keeper in self.keepers:
            keeper.stop()
        if self.watch is not None:
            self.watch.stop()


def _terminate_timeout(params: dict[str, Any]) -> float:
    """The validated terminate deadline; preflight refused anything else before renting."""
    from prefect_runpod.blocks.validation import check_number

    try:
        return check_number("terminate_timeout_seconds", params.get("terminate_timeout_seconds"))  # type: ignore[return-value]
    except Exception:
        return DEFAULT_TERMINATE_TIMEOUT_SECONDS


def _run_on_pod(
    report: RunReport,
    run: PreparedRun,
    budget: _Budget,
    on_stage: Any,
    *,
    parity_warn_only: bool,
    key_path: str | None,
    guards: _Guards,
) -> BaseException | None:
    """Provision … checksum. Returns a deferred error (parity) to raise after download."""
    from prefect_runpod.tasks.checksum import checksum, verification_records
    from prefect_runpod.tasks.download import download, eval_files
    from prefect_runpod.tasks.env import env as env_stage
    from prefect_runpod.tasks.env_plan import cuda_floor_for_requirements
    from prefect_runpod.tasks.eval_parity import check_parity_on_pod
    from prefect_runpod.tasks.hf_auth import hf_auth
    from prefect_runpod.tasks.publish import publish
    from prefect_runpod.tasks.train import terminal_progress_bar, train
    from prefect_runpod.tasks.upload import check_upload_method, upload

    logger = get_run_logger()
    settings, pod_provider, s3 = run.settings, run.provider, run.s3
    hf_token, hf_endpoint = run.hf.token, run.hf.endpoint
    bundle = settings.bundle
    keypair = run.keypair
    key = keypair.private_key
    out = Path(settings.output_dir)
    deadman = DeadmanConfig(
        heartbeat_stale_seconds=settings.heartbeat_stale_seconds,
        lifetime_seconds=settings.pod_lifetime_seconds,
        check_interval_seconds=heartbeat_interval_seconds(settings.heartbeat_stale_seconds),
    )

    def record(handle: PodHandle) -> None:
        first = report.pod_id is None
        report.pod_id = handle.pod_id
        report.pod = handle
        report.cost.cost_per_hr = handle.cost_per_hr
        report.lease = lease_text(handle, asked=deadman is not None)
        budget.handle = handle
        if first:
            # The pod is on record before any wait: the run's finetune-costs record (it
            # may still be billing) and run-report.json, for whoever completes them.
            record_cost(report, pod_provider, final=False)
            write_report(report)
            fault_point("provision")

    with run_stage(report, "provision", on_stage):
        request = PodRequest(
            public_key=keypair.public_key,
            deadman=deadman,
            # docs/architecture.md#env-fix-and-hugging-face-diagnosis: never rent a host whose driver is too old for the job's torch.
            allowed_cuda_versions=cuda_floor_for_requirements(bundle.requirements),
        )
        try:
            handle = provision(
                pod_provider,
                request,
                report.pod_name,
                _READY_TIMEOUT_SECONDS,
                record,
                settings.terminate_timeout_seconds,
            )
        finally:
            report.provision_attempts = list(getattr(pod_provider, "attempts", []) or [])
        record(handle)
        # From here on the provider is asked whether the pod lives, every pod_poll_seconds
        # and before every reconnect (every stage waits out SSH outages through one
        # policy that asks the watch): a pod gone under the run stops it at once.
        guards.watch = PodWatch(pod_provider, handle.pod_id, settings.pod_poll_seconds).start()
        reconnect = ReconnectPolicy(
            budget_seconds=settings.reconnect_budget_seconds, status=guards.watch.ask
        )
        report.ssh_command = handle.ssh_command(key_path or _save_local_key(key, out))
        write_report(report)  # the report on disk names the way in while the pod is up
        run_dir = f"{handle.workdir.rstrip('/')}/prefect-runpod/{report.flow_run_id}"
        tools_dir = prepare_pod(handle, key, run_dir, deadman, reconnect)
        if deadman is not None:
            guards.keepers.append(
                HeartbeatKeeper(
                    handle,
                    key,
                    f"{run_dir}/heartbeat",
                    heartbeat_interval_seconds(deadman.heartbeat_stale_seconds),
                ).start()
            )
        logger.info("pod %s is up; get in with: %s", handle.pod_id, report.ssh_command)
        # The pod's end of the transfer, now that it runs: before env, hf_auth or upload.
        check_upload_method(handle, key, settings.transfer_method, s3=s3, reconnect=reconnect)
    remote_bundle = f"{run_dir}/bundle"

    with run_stage(report, "env", on_stage, watch=guards.watch):
        budget.check()
        plan = env_stage(
            handle,
            key,
            bundle.requirements,
            tools_dir,
            publish_kind=settings.publish.kind if settings.publish else None,
            reconnect=reconnect,
        )
        report.env = plan
    python = report.env.python if report.env and report.env.python else "python3"

    with run_stage(report, "hf_auth", on_stage, watch=guards.watch):
        if settings.model_id is None:
            raise StageSkipped("no model id: the bundle downloads nothing from the Hub")
        diagnosis = hf_auth(
            handle,
            key,
            settings.model_id,
            hf_token,
            hf_endpoint,
            tools_dir,
            python,
            reconnect=reconnect,
        )
        if isinstance(diagnosis, HFDiagnosis):
            report.hf.append(diagnosis)

    with run_stage(report, "upload", on_stage, watch=guards.watch):
        budget.check()
        report.upload = upload(
            handle,
            key,
            Path(bundle.root),
            remote_bundle,
            settings.transfer_method,
            s3=s3,
            paths=settings.upload.files if settings.upload else None,
            options=settings.transfer_options(),
            follow_links=settings.follow_links,
            reconnect=reconnect,
        )

    with run_stage(report, "train", on_stage, watch=guards.watch):
        budget.check()
        report.train = train(
            handle,
            key,
            run_dir=run_dir,
            command=bundle.command(bundle.train, python),
            tools_dir=tools_dir,
            max_runtime_seconds=settings.max_runtime_seconds,
            should_stop=budget.reason,
            on_progress=terminal_progress_bar(pod_id=handle.pod_id),
            # A gated model is downloaded by the job itself: it needs the token in its env.
            secret_env={"HF_TOKEN": hf_token} if hf_token is not None else None,
            expected_outputs=_declared_outputs(bundle),
            reconnect=reconnect,
            local_log_path=str(_fresh_file(out / TRAIN_LOG)),
        )

    deferred: BaseException | None = None
    with run_stage(report, "eval_parity", on_stage, watch=guards.watch):
        if not bundle.eval:
            raise StageSkipped("the bundle declares no standalone eval command")
        try:
            report.parity = check_parity_on_pod(
                handle,
                key,
                bundle,
                run_dir,
                python,
                out / "parity",
                timeout_seconds=settings.max_runtime_seconds,
                tolerance=settings.parity_tolerance,
                warn_only=parity_warn_only,
                transfer_method=settings.transfer_method,
                hf_token=hf_token,
                s3=s3,
                reconnect=reconnect,
            )
        except EvalParityError as exc:
            # docs/architecture.md#eval-parity: a parity failure fails the run *after* download, artifacts kept.
            report.parity = exc.report  # type: ignore[assignment]
            deferred = exc
            logger.error("eval parity failed; downloading outputs before failing the run")
    if deferred is not None:
        report.stage("eval_parity").state = StageState.FAILED
        report.stage("eval_parity").reason = f"EvalParityError: {deferred}"[:500]

    remote_outputs = f"{remote_bundle}/{bundle.outputs}"
    with run_stage(report, "publish", on_stage, watch=guards.watch):
        target = settings.publish
        if target is None:
            raise StageSkipped(
                "no publish target (--publish hf:ORG/REPO or s3 ships it from the pod)"
            )
        if deferred is not None:
            raise StageSkipped(
                "blocked: the eval-parity gate failed, so the model is not published "
                "(--parity-warn-only publishes anyway)"
            )
        budget.check()
        report.publish = publish(
            target,
            handle,
            key,
            remote_outputs,
            run_id=report.flow_run_id,
            tools_dir=tools_dir,
            python=report.env.publish_python if report.env else None,
            hf_token=hf_token,
            hf_endpoint=hf_endpoint,
            s3=s3,
            follow_links=settings.follow_links,
            reconnect=reconnect,
        )

    with run_stage(report, "download", on_stage, watch=guards.watch):
        if settings.download == "none":
            where = report.model_location
            raise StageSkipped(
                f"--download none: the model stays at {where}, verified there"
                if where
                else "--download none: nothing is downloaded, and the model was not published"
            )
        budget.check()
        only = eval_files(bundle) if settings.download == "eval" else None
        if only is not None and not only:
            raise StageSkipped("--download eval: the bundle's eval files are not under its outputs")
        report.download = download(
            handle,
            key,
            remote_outputs,
            out / "outputs",
            settings.transfer_method,
            s3=s3,
            only=only,
            staging_dir=f"{run_dir}/download-eval" if only else None,
            options=settings.transfer_options(),
            follow_links=settings.follow_links,
            reconnect=reconnect,
        )

    with run_stage(report, "checksum", on_stage, watch=guards.watch):
        if report.download is None and report.publish is None:
            raise StageSkipped("nothing was downloaded or published")
        if report.download is not None and report.download.source_manifest is None:
            raise ChecksumMismatchError(
                f"the download from pod {handle.pod_id} carried no pod-side manifest; "
                "nothing can be accepted unverified",
                pod_id=handle.pod_id,
            )
        source = report.download.source_manifest if report.download is not None else None
        report.manifest = checksum(out / "outputs", source, handle.pod_id, report.publish)
        report.verified = verification_records(out / "outputs", report.manifest, report.publish)
    return deferred


TRAIN_LOG = "train.log"
"""The training log as the run followed it, kept in the output dir whatever is downloaded."""


def _fresh_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def _declared_outputs(bundle: Any) -> dict[str, str]:
    """What training must leave in the pod-side bundle, by the ``bundle.toml`` field that
    declares it: the ``outputs`` folder, and the in-training eval JSONL when the bundle
    has a standalone eval to compare it with."""
    expected = {bundle.outputs: "outputs"}
    if bundle.eval:
        expected[bundle.train_eval_jsonl] = "train_eval_jsonl"
    return expected


def _save_local_key(key: SecretStr, out: Path) -> str:
    """Keep a pod's throwaway per-run key (mode 0600) beside the outputs so the printed
    ``ssh`` command works (a provider that reaches pods with the user's own key,
    ``Capability.USER_KEY``, names that key instead)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pod-ssh-key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.get_secret_value())
    return str(path)


if __name__ == "__main__":
    from prefect_runpod.flows.cli import main

    raise SystemExit(main(["finetune", *__import__("sys").argv[1:]]))
