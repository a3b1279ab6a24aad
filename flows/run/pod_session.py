"""The work of a run on one pod: a ``PodSession`` is one pod attempt
(docs/architecture.md#the-runs-attempts).

It carries what every stage on the pod needs — the handle and key, the pod-side tools
and run directories, the Python the env stage chose, the run's reconnect policy and the
pod's liveness watch, the heartbeat keepers and the budget — so the stages get them from
one place, and the flow (``flows/finetune.py``) only orchestrates. Three steps:

- ``bring_up``: provision (create, record at once, wait for SSH, pod tools, dead-man),
  env, hf_auth, upload;
- ``work``: train, eval_parity, publish, download, checksum;
- ``bring_back``: stop watching, terminate (unless kept) and record the end and the cost
  (``flows.run.end.end_run``).

Each stage is recorded in the run's ledger with the attempt's number, and the attempt
itself (``PodAttempt``) in the run's report and cost record.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import get_run_logger
from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.exceptions import (
    ChecksumMismatchError,
    EvalParityError,
    TerminateError,
)
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.interrupts import raise_if_stopped
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import DeadmanConfig, PodRequest
from prefect_runpod.blocks.transfer.models import TransferProgress
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.budget import RunBudget
from prefect_runpod.flows.run.checkpoints import CheckpointStore
from prefect_runpod.flows.run.end import end_run, record_cost, write_report
from prefect_runpod.flows.run.guardian import Guardian
from prefect_runpod.flows.run.heartbeat import HeartbeatKeeper, heartbeat_interval_seconds
from prefect_runpod.flows.run.inputs import PreparedRun
from prefect_runpod.flows.run.kept import kept_for, mark_kept
from prefect_runpod.flows.run.ledger import StageSkipped, run_stage
from prefect_runpod.flows.run.logs import WAY_IN
from prefect_runpod.flows.run.names import TRAIN_LOG, attempt_pod_name, save_pod_key
from prefect_runpod.flows.run.report import RunReport
from prefect_runpod.flows.run.train_steps import TrainSteps
from prefect_runpod.tasks.models import HFDiagnosis, StageState

__all__ = ["READY_TIMEOUT_SECONDS", "TRAIN_LOG", "PodSession"]

READY_TIMEOUT_SECONDS = 600.0
"""RunPod can take minutes to pull a large image (dstack allows 20 min); the local pod ~1 s."""


class PodSession(TrainSteps):
    """One pod attempt of a run: bring the pod up, do the work, bring it back.

    Args:
        report: the run's report (the attempt, the stages and their records go there).
        run: the run that passed its pre-rent checks (settings, provider, key, tokens).
        on_stage: called with ``(stage, state)`` at each change (the terminal's lines).
        number: the attempt's number (1 for the run's first pod).
        key_path: the key file a person gets in with (the provider's user key), or None
            for the run's own key, saved beside the outputs.
        parity_warn_only: a failing parity gate only warns.
        guardian: the run's guardian (``flows.run.guardian``), started before the create:
            told ``armed`` once the pod's dead-man runs, ``gone`` or ``release`` at the end.
        resume_from: the name of the run's verified local checkpoint this attempt
            resumes from (uploaded and verified on the pod first); None to start afresh.
        steps_lost: the training steps the previous pod took with it (with
            ``resume_from``).

    Attributes:
        handle / key / tools_dir / run_dir / python / reconnect / watch: what the stages
            on this pod share, filled in as the pod comes up.
    """

    def __init__(
        self,
        report: RunReport,
        run: PreparedRun,
        on_stage: Any,
        *,
        number: int = 1,
        key_path: str | None = None,
        parity_warn_only: bool = False,
        guardian: Guardian | None = None,
        resume_from: str | None = None,
        steps_lost: int | None = None,
    ) -> None:
        self.report, self.run, self.settings = report, run, run.settings
        self.provider = run.provider
        self.on_stage = on_stage
        self.number = number
        self.key_path = key_path
        self.parity_warn_only = parity_warn_only
        self.key: SecretStr = run.keypair.private_key
        self.out = Path(self.settings.output_dir)
        self.budget = RunBudget(report, self.settings.max_cost_usd)
        self.deadman = DeadmanConfig(
            heartbeat_stale_seconds=self.settings.heartbeat_stale_seconds,
            lifetime_seconds=self.settings.pod_lifetime_seconds,
            check_interval_seconds=heartbeat_interval_seconds(
                self.settings.heartbeat_stale_seconds
            ),
        )
        self.handle: PodHandle | None = None
        self.attempt: PodAttempt | None = None
        self.tools_dir = ""
        self.run_dir = ""
        self.python = "python3"
        self.reconnect: ReconnectPolicy | None = None
        self.watch: PodWatch | None = None
        self.keepers: list[HeartbeatKeeper] = []
        self.guardian = guardian
        self.resume_from, self.steps_lost = resume_from, steps_lost
        self.last_step: int | None = None
        """The last training step the job reported on this pod."""
        self.checkpoints = CheckpointStore(self.out, self.settings.bundle.keep_checkpoints)
        self.brought_back = False
        self._provision_started = time.monotonic()

    # -- the three steps ----------------------------------------------------------------

    def bring_up(self) -> None:
        """Provision, env, hf_auth, upload: the pod ready for the job, the bundle on it."""
        self._provision()
        self._env()
        self._hf_auth()
        self._upload()

    def work(self) -> BaseException | None:
        """Train, eval_parity, publish, download, checksum.

        Returns:
            A deferred error for the flow to raise after the outputs came back (a
            failed parity gate; outputs that could not travel and stay on the kept
            pod), else None.
        """
        self._train()
        deferred = self._eval_parity()
        self._publish(deferred)
        self._download()
        self._checksum()
        kept = self._kept()
        return deferred or (kept[1] if kept else None)

    def bring_back(
        self, *, keep_pod_on_failure: bool, terminate_timeout_seconds: float
    ) -> TerminateError | None:
        """Stop watching the pod, terminate it (unless kept after a failure), record its
        end and the cost, and write the report (``flows.run.end.end_run``).

        Returns:
            The ``TerminateError`` the run must fail with when the pod may still bill
            (None when this attempt was brought back already).
        """
        if self.brought_back:
            write_report(self.report)
            return None
        self.brought_back = True
        self.budget.stop()  # the terminate is never stopped by the budget
        kept = self._kept()
        keep_reason = kept[0] if kept else None
        held = kept or (keep_pod_on_failure and self.report.stopped_short)
        if self.handle is not None and held:  # the dead-man and the reaper spare it
            mark_kept(self.handle, self.key, self.run_dir, self.report.flow_run_id)
        for keeper in self.keepers:
            keeper.stop()
        if self.watch is not None:
            self.watch.stop()
        unconfirmed = end_run(
            self.report,
            self.provider,
            self.watch,
            keep_pod_on_failure=keep_pod_on_failure,
            terminate_timeout_seconds=terminate_timeout_seconds,
            on_stage=self.on_stage,
            attempt=self.number,
            keep_reason=keep_reason,
        )
        if self.guardian is not None:  # its pod's end is confirmed, none was rented, or kept
            gone = self.report.terminated or self.report.pod_id is None
            self.guardian.tell("gone" if gone else "release")
        return unconfirmed

    def _kept(self) -> tuple[str, BaseException] | None:
        """Why this pod is kept whatever the run's outcome and the run's error naming what
        stayed on it; None when every output travelled (``flows.run.kept.kept_for``)."""
        armed = self.attempt.ready_at if self.attempt else None
        lifetime = self.deadman.lifetime_seconds
        return kept_for(self.report, self.handle, armed, lifetime, str(self.out / "outputs"))

    # -- bring up -------------------------------------------------------------------------

    def _stage(self, name: str) -> Any:
        return run_stage(self.report, name, self.on_stage, watch=self.watch, attempt=self.number)

    def _record(self, handle: PodHandle) -> None:
        """The pod is on record before any wait: the attempt in the report, the run's
        ``finetune-costs`` record (it may still be billing) and ``run-report.json``."""
        first = self.attempt is None
        if self.attempt is None:
            self.attempt = PodAttempt.of(
                handle, self.number, resumed_from=self.resume_from, steps_lost=self.steps_lost
            )
            self.report.attempts.append(self.attempt)
        self.attempt.handle = handle
        self.report.cost.cost_per_hr = handle.cost_per_hr
        if first:
            # the provider's create, measured: the budget's estimate of its terminate
            self.budget.create_seconds = time.monotonic() - self._provision_started
            self.budget.watch()  # the cap is watched from the pod's first billed second
            record_cost(self.report, self.provider, final=False)
            write_report(self.report)
            fault_point("provision")

    def _provision(self) -> None:
        from prefect_runpod.tasks.env_plan import cuda_floor_for_requirements
        from prefect_runpod.tasks.provision import prepare_pod, provision
        from prefect_runpod.tasks.upload import check_upload_method

        settings, logger = self.settings, get_run_logger()
        self._provision_started = time.monotonic()
        with self._stage("provision"):
            request = PodRequest(
                public_key=self.run.keypair.public_key,
                deadman=self.deadman,
                # docs/architecture.md#env-fix-and-hugging-face-diagnosis: never rent a host whose driver is too old for the job's torch.
                allowed_cuda_versions=cuda_floor_for_requirements(settings.bundle.requirements),
            )
            try:
                handle = provision(
                    self.provider,
                    request,
                    attempt_pod_name(self.report.pod_name, self.number),
                    READY_TIMEOUT_SECONDS,
                    self._record,
                    settings.terminate_timeout_seconds,
                )
            finally:
                self.report.provision_attempts = list(getattr(self.provider, "attempts", []) or [])
            self._record(handle)
            self.handle = handle
            if self.resume_from is not None:  # per-rank state needs the same GPU count
                self.checkpoints.refuse_other_gpu_count(self.resume_from, handle)
            raise_if_stopped()  # a stop asked for while the pod came up (Ctrl-C, the budget)
            assert self.attempt is not None
            self.attempt.ready_at = datetime.now(UTC)
            # From here on the provider is asked whether the pod lives, every
            # pod_poll_seconds and before every reconnect (every stage waits out SSH
            # outages through one policy that asks the watch): a pod gone under the run
            # stops it at once.
            self.watch = PodWatch(self.provider, handle.pod_id, settings.pod_poll_seconds).start()
            self.reconnect = ReconnectPolicy(
                budget_seconds=settings.reconnect_budget_seconds,
                status=self.watch.ask,
                unreachable=self.watch.unreachable,
            )
            self.attempt.ssh_command = handle.pinned_ssh_command(
                self.key_path or save_pod_key(self.key, self.out)
            )
            write_report(self.report)  # the report on disk names the way in while the pod is up
            self.run_dir = f"{handle.workdir.rstrip('/')}/prefect-runpod/{self.report.flow_run_id}"
            self.tools_dir = prepare_pod(
                handle, self.key, self.run_dir, self.deadman, self.reconnect
            )
            if self.guardian is not None:  # the dead-man switch runs on the pod now
                self.guardian.tell("armed")
            raise_if_stopped()
            self.keepers.append(
                HeartbeatKeeper(
                    handle,
                    self.key,
                    f"{self.run_dir}/heartbeat",
                    heartbeat_interval_seconds(self.deadman.heartbeat_stale_seconds),
                ).start()
            )
            logger.info(
                "pod %s is up; get in with: %s",
                handle.pod_id,
                self.attempt.ssh_command,
                extra=WAY_IN,
            )
            # The pod's end of the transfer, now that it runs: before env, hf_auth or upload.
            check_upload_method(
                handle, self.key, settings.transfer_method, s3=self.run.s3, reconnect=self.reconnect
            )

    def _env(self) -> None:
        from prefect_runpod.tasks.env import env as env_stage

        assert self.handle is not None
        with self._stage("env"):
            self.budget.check()
            publish = self.settings.publish
            self.report.env = env_stage(
                self.handle,
                self.key,
                self.settings.bundle.requirements,
                self.tools_dir,
                publish_kind=publish.kind if publish else None,
                reconnect=self.reconnect,
            )
        env = self.report.env
        self.python = env.python if env and env.python else "python3"

    def _hf_auth(self) -> None:
        from prefect_runpod.tasks.hf_auth import hf_auth

        assert self.handle is not None
        with self._stage("hf_auth"):
            if self.settings.model_id is None:
                raise StageSkipped("no model id: the bundle downloads nothing from the Hub")
            diagnosis = hf_auth(
                self.handle,
                self.key,
                self.settings.model_id,
                self.run.hf.token,
                self.run.hf.endpoint,
                self.tools_dir,
                self.python,
                reconnect=self.reconnect,
            )
            if isinstance(diagnosis, HFDiagnosis):
                self.report.hf.append(diagnosis)

    def _upload(self) -> None:
        from prefect_runpod.tasks.upload import upload

        assert self.handle is not None
        settings = self.settings
        with self._stage("upload"), self._moving("upload") as moved:
            self.budget.check()
            self.report.upload = upload(
                self.handle,
                self.key,
                Path(settings.bundle.root),
                f"{self.run_dir}/bundle",
                settings.transfer_method,
                s3=self.run.s3,
                paths=settings.upload.files if settings.upload else None,
                options=settings.transfer_options(),
                follow_links=settings.follow_links,
                reconnect=self.reconnect,
                on_progress=moved,
            )
            if self.resume_from is not None:
                self._upload_checkpoint(self.resume_from)

    @contextmanager
    def _moving(self, direction: Literal["upload", "download"]) -> Iterator[TransferProgress]:
        """How far the stage's transfer got: when it stops before its end (a Ctrl-C, a
        lost pod) after moving some bytes, the report keeps those as the stage's
        unverified transfer, so the summary says what moved instead of ``0 B``."""
        moved = TransferProgress(direction, self.settings.transfer_method)
        try:
            yield moved
        except BaseException:
            if moved.done:
                setattr(self.report, direction, moved.partial_report())
            raise

    # -- work -----------------------------------------------------------------------------

    def _eval_parity(self) -> BaseException | None:
        from prefect_runpod.tasks.eval_parity import check_parity_on_pod

        assert self.handle is not None
        settings, deferred = self.settings, None
        with self._stage("eval_parity"):
            if not settings.bundle.eval:
                raise StageSkipped("the bundle declares no standalone eval command")
            try:
                self.report.parity = check_parity_on_pod(
                    self.handle,
                    self.key,
                    settings.bundle,
                    self.run_dir,
                    self.python,
                    self.out / "parity",
                    timeout_seconds=settings.max_runtime_seconds,
                    tolerance=settings.parity_tolerance,
                    warn_only=self.parity_warn_only,
                    transfer_method=settings.transfer_method,
                    hf_token=self.run.hf.token,
                    s3=self.run.s3,
                    reconnect=self.reconnect,
                )
            except EvalParityError as exc:
                # docs/architecture.md#eval-parity: a parity failure fails the run *after* download, artifacts kept.
                self.report.parity = exc.report  # type: ignore[assignment]
                deferred = exc
                get_run_logger().error(
                    "eval parity failed; downloading outputs before failing the run"
                )
        if deferred is not None:
            stage = self.report.stage("eval_parity")
            stage.state, stage.reason = StageState.FAILED, f"EvalParityError: {deferred}"[:500]
        return deferred

    @property
    def _outputs(self) -> str:
        return f"{self.run_dir}/bundle/{self.settings.bundle.outputs}"

    def _publish(self, deferred: BaseException | None) -> None:
        from prefect_runpod.tasks.publish import publish

        assert self.handle is not None
        with self._stage("publish"):
            target = self.settings.publish
            if target is None:
                raise StageSkipped(
                    "no publish target (--publish hf:ORG/REPO or s3 ships it from the pod)"
                )
            if deferred is not None:
                raise StageSkipped(
                    "blocked: the eval-parity gate failed, so the model is not published "
                    "(--parity-warn-only publishes anyway)"
                )
            self.budget.check()
            env = self.report.env
            self.report.publish = publish(
                target,
                self.handle,
                self.key,
                self._outputs,
                run_id=self.report.flow_run_id,
                tools_dir=self.tools_dir,
                python=env.publish_python if env else None,
                hf_token=self.run.hf.token,
                hf_endpoint=self.run.hf.endpoint,
                s3=self.run.s3,
                follow_links=self.settings.follow_links,
                reconnect=self.reconnect,
            )

    def _download(self) -> None:
        from prefect_runpod.tasks.download import download, eval_files

        assert self.handle is not None
        settings = self.settings
        with self._stage("download"), self._moving("download") as moved:
            if settings.download == "none":
                where = self.report.model_location
                raise StageSkipped(
                    f"--download none: the model stays at {where}, verified there"
                    if where
                    else "--download none: nothing is downloaded, and the model was not published"
                )
            self.budget.check()
            only = eval_files(settings.bundle) if settings.download == "eval" else None
            if only is not None and not only:
                raise StageSkipped(
                    "--download eval: the bundle's eval files are not under its outputs"
                )
            self.report.download = download(
                self.handle,
                self.key,
                self._outputs,
                self.out / "outputs",
                settings.transfer_method,
                s3=self.run.s3,
                only=only,
                staging_dir=f"{self.run_dir}/download-{'eval' if only else 'staging'}",
                options=settings.transfer_options(),
                follow_links=settings.follow_links,
                reconnect=self.reconnect,
                on_progress=moved,
            )

    def _checksum(self) -> None:
        from prefect_runpod.tasks.checksum import checksum, extra_entries, verification_records

        assert self.handle is not None
        report, outputs = self.report, self.out / "outputs"
        with self._stage("checksum"):
            if report.download is None and report.publish is None:
                raise StageSkipped("nothing was downloaded or published")
            if report.download is not None and report.download.source_manifest is None:
                raise ChecksumMismatchError(
                    f"the download from pod {self.handle.pod_id} carried no pod-side manifest; "
                    "nothing can be accepted unverified",
                    pod_id=self.handle.pod_id,
                )
            source = report.download.source_manifest if report.download is not None else None
            report.manifest = checksum(outputs, source, self.handle.pod_id, report.publish)
            extra = extra_entries(outputs, source) if source is not None else []
            report.verified = verification_records(outputs, report.manifest, report.publish, extra)
