"""A pod attempt's train stage and its checkpoints (docs/architecture.md#resuming-from-a-checkpoint):
put the checkpoint an attempt resumes from on its pod, the train command that resumes
from it, training itself, and the copy of the job's checkpoints off the pod while it
trains (``flows.run.checkpoints``). ``PodSession`` has them as a base class.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from pydantic import SecretStr

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.flows.run.checkpoints import CheckpointRecord, CheckpointStore, CheckpointSync
from prefect_runpod.flows.run.names import TRAIN_LOG

__all__ = ["CHECKPOINT_POLL_SECONDS", "TrainSteps", "runtime_left", "trained_step"]

CHECKPOINT_POLL_SECONDS = 2.0
"""How often the run looks for a checkpoint the job signalled complete, while it trains."""


def trained_step(progress: Any, last: int | None) -> int | None:
    """The last training step a job reported, after one more ``Progress``: its step when
    it counts steps; ``last`` otherwise (an ``epoch 4/6`` line counts epochs, and a
    fraction says no step). Pure."""
    if progress.unit == "step" and progress.step is not None:
        return int(progress.step)
    return last


def runtime_left(max_runtime_seconds: float, earlier_stages: list[Any]) -> float:
    """The runtime cap left for this attempt's training, in seconds: the run's cap less
    what the earlier pods' train stages ran (the cap counts every pod). Never below 1 s,
    so a spent cap stops the job at once through the train stage's own path. Pure."""
    spent = sum(s.seconds for s in earlier_stages if s.name == "train")
    return max(1.0, max_runtime_seconds - spent)


class TrainSteps:
    """A pod attempt's training and checkpoints; the attributes are the ``PodSession``'s."""

    handle: PodHandle | None
    key: SecretStr
    settings: Any
    run: Any
    report: Any
    run_dir: str
    python: str
    number: int
    reconnect: Any
    checkpoints: CheckpointStore
    resume_from: str | None
    last_step: int | None
    out: Path
    tools_dir: str
    budget: Any

    _stage: Callable[[str], Any]

    def _train(self) -> None:
        from prefect_runpod.tasks.train import terminal_progress_bar, train

        assert self.handle is not None
        bundle, token = self.settings.bundle, self.run.hf.token
        show = terminal_progress_bar(pod_id=self.handle.pod_id)

        def _progress(progress: Any) -> None:
            self.last_step = trained_step(progress, self.last_step)
            show(progress)

        with self._stage("train"), self._checkpoint_sync() as sync:
            self.budget.check()
            self.report.train = train(
                self.handle,
                self.key,
                run_dir=self.run_dir,
                command=self._train_command(),
                tools_dir=self.tools_dir,
                max_runtime_seconds=runtime_left(
                    self.settings.max_runtime_seconds, self.report.earlier_stages
                ),
                should_stop=self.budget.should_stop,
                on_progress=_progress,
                # A gated model is downloaded by the job itself: it needs the token in its env.
                secret_env={"HF_TOKEN": token} if token is not None else None,
                expected_outputs=_declared_outputs(bundle),
                reconnect=self.reconnect,
                local_log_path=str(_fresh_file(self.out / TRAIN_LOG)),
            )
            if sync is not None:
                sync.stop(final=True)

    def _upload_checkpoint(self, name: str) -> None:
        """Put the verified local checkpoint ``name`` where the job keeps its checkpoints
        on this pod, verified there (the upload's pod-side manifest)."""
        from prefect_runpod.tasks.upload import upload

        assert self.handle is not None
        settings = self.settings
        sent = upload(
            self.handle,
            self.key,
            self.checkpoints.root / name,
            f"{self.run_dir}/bundle/{settings.bundle.checkpoints}/{name}",
            settings.transfer_method,
            s3=self.run.s3,
            options=settings.transfer_options(),
            reconnect=self.reconnect,
        )
        get_run_logger().info(
            "checkpoint %s is on pod %s, verified (%d bytes by %s): training resumes from it",
            name,
            self.handle.pod_id,
            sent.bytes,
            sent.method,
        )

    def _train_command(self) -> str:
        """The bundle's train command, with the checkpoint to resume from (its pod path,
        relative to the bundle) as ``{resume_from}`` or ``PREFECT_RUNPOD_RESUME_FROM``."""
        from prefect_runpod.tasks.bundle import RESUME_ENV

        bundle = self.settings.bundle
        resume = f"{bundle.checkpoints}/{self.resume_from}" if self.resume_from else ""
        command = bundle.command(bundle.train, self.python, resume)
        if bundle.checkpoints and bundle.resume_from_env:
            command = f"export {RESUME_ENV}={shlex.quote(resume)}; {command}"
        return command

    @contextmanager
    def _checkpoint_sync(self) -> Iterator[CheckpointSync | None]:
        """While the job trains, its completed checkpoints are copied off the pod
        (``flows.run.checkpoints``); nothing runs for a bundle without checkpoints."""
        bundle = self.settings.bundle
        if not bundle.checkpoints or self.handle is None:
            yield None
            return
        sync = CheckpointSync(
            self.handle,
            self.key,
            self.checkpoints,
            pod_folder=f"{self.run_dir}/bundle/{bundle.checkpoints}",
            manifest_folder=f"{self.run_dir}/checkpoint-manifests",
            marker=bundle.checkpoint_marker,
            method=self.settings.transfer_method,
            options=self.settings.transfer_options(),
            s3=self.run.s3,
            attempt=self.number,
            interval_seconds=CHECKPOINT_POLL_SECONDS,
            reconnect=self.reconnect,
            on_copied=self._checkpoint_copied,
        ).start()
        try:
            yield sync
        finally:
            sync.stop()

    def _checkpoint_copied(self, record: CheckpointRecord) -> None:
        self.report.checkpoints.append(record)
        get_run_logger().info(
            "checkpoint %s (step %d) verified off pod %s: %d of %d bytes sent, %d copied "
            "locally; lag %.1f s from the job's signal",
            record.name,
            record.step,
            record.pod_id,
            record.sent_bytes,
            record.bytes,
            record.local_bytes,
            record.lag_seconds,
        )


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
