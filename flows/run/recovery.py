"""Lose a pod, keep the run: the run's pod attempts, one after another
(docs/architecture.md#resuming-from-a-checkpoint).

``AttemptLoop.run`` brings up a pod attempt and does the work. When the pod is lost
under it and the loss is recoverable — the pod EXITED, its host was lost (RunPod's
ERROR, a local pod's daemon dead), or it stayed unreachable and its terminate was
confirmed; a pod ended outside the run only with ``recover_outside_terminate``; never
one ended by ``prefect-runpod terminate`` — and the bundle declares checkpoints and one
has verified here, the lost pod's end and cost are recorded and its end confirmed
(``PodSession.bring_back``), and only then a new attempt (``<prefix>-<flow_run_id>-a<n>``)
rents a pod, puts the bundle and the checkpoint on it, and resumes training. At most one
pod of the run is alive at a time; after ``max_pod_losses`` losses, or once the lost
pods billed ``max_recovery_usd`` together, the run fails with the last verified
checkpoint kept and named.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.costs import round_usd
from prefect_runpod.blocks.exceptions import PodGoneError, SpecError
from prefect_runpod.blocks.pod_side import manifest as tree_manifest
from prefect_runpod.blocks.pod_side.checkpoints import step_of
from prefect_runpod.blocks.provider import PodCause
from prefect_runpod.blocks.validation.parameters import (
    DEFAULT_MAX_POD_LOSSES,
    DEFAULT_TERMINATE_TIMEOUT_SECONDS,
)
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.checkpoints import CheckpointStore, gpu_count_refusal
from prefect_runpod.flows.run.pod_session import PodSession

__all__ = [
    "POD_LOST_EVENT",
    "POD_RECOVERED_EVENT",
    "RECOVERABLE_CAUSES",
    "AttemptLoop",
    "changed_bundle_files",
    "lost_spend",
    "pod_event",
    "recoverable",
    "recovery_spend_refusal",
    "resume_checkpoint",
]

POD_LOST_EVENT = "prefect-runpod.pod.lost"
"""The Prefect event of a pod lost under a run (resource ``prefect-runpod.pod.<id>``)."""

POD_RECOVERED_EVENT = "prefect-runpod.pod.recovered"
"""The Prefect event of a new pod the run resumed on, once it is up with the checkpoint."""

_log = logging.getLogger("prefect_runpod.flows")

RECOVERABLE_CAUSES = frozenset({PodCause.EXITED.value, PodCause.HOST_LOST.value})
"""Losses a run resumes after by default (an unreachable pod confirmed gone is
``host_lost``)."""

_DELIBERATE = frozenset({"cli", "reaper", "deadman"})
"""Who ended a pod on purpose: the run never resumes after them."""

SessionFactory = Callable[[int, str | None, int | None], PodSession]
"""``(number, resume_from, steps_lost) -> PodSession``: the flow's way to make an attempt."""


def recoverable(cause: str, ended_by: str | None, *, outside_too: bool = False) -> bool:
    """Whether a run resumes after losing its pod this way. Pure.

    Args:
        cause: the loss's ``PodCause`` value.
        ended_by: who the provider says ended it (``cli``, ``deadman``…), or None.
        outside_too: ``recover_outside_terminate``: a pod ended outside the run counts.
    """
    if ended_by in _DELIBERATE:
        return False
    if cause in RECOVERABLE_CAUSES:
        return True
    return outside_too and cause == PodCause.TERMINATED_OUTSIDE.value


def pod_event(
    event: str, pod_id: str, pod_name: str, flow_run_id: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """The arguments of ``prefect.events.emit_event`` for a pod of a run: the pod as the
    resource (``prefect-runpod.pod.<id>``), the flow run related to it. Pure."""
    return {
        "event": event,
        "resource": {
            "prefect.resource.id": f"prefect-runpod.pod.{pod_id}",
            "prefect.resource.name": pod_name,
        },
        "related": [
            {
                "prefect.resource.id": f"prefect.flow-run.{flow_run_id}",
                "prefect.resource.role": "flow-run",
            }
        ],
        "payload": payload,
    }


def _emit(event: str, attempt: Any, flow_run_id: str, payload: dict[str, Any]) -> None:
    """Emit a pod event for automations; an event that cannot be sent only logs."""
    try:
        from prefect.events import emit_event

        emit_event(**pod_event(event, attempt.pod_id, attempt.pod_name, flow_run_id, payload))
    except Exception as exc:  # never let an event end the run
        _log.warning("could not emit %s for pod %s: %s", event, attempt.pod_id, exc)


def changed_bundle_files(
    uploaded: Any, root: str, files: list[str] | None, *, follow_links: bool = False
) -> list[str]:
    """The bundle files that differ now from what the run's first upload sent.

    Args:
        uploaded: the first upload's source ``Manifest`` (None: nothing to compare).
        root: the local bundle folder.
        files: the files the run uploads (preflight's selection), None for all.
        follow_links: read links that leave the bundle through, as the upload did.

    Returns:
        Relative paths changed, added or removed, sorted; empty when nothing changed.
    """
    if uploaded is None:
        return []
    now = tree_manifest.compute_manifest(
        root, paths=files, select=files is not None, follow_links=follow_links
    )
    before = {e.path: (e.kind, e.sha256, e.target) for e in uploaded.entries}
    after = {
        e["path"]: (e.get("kind", "file"), e.get("sha256", ""), e.get("target"))
        for e in now.get("entries", [])
    }
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _source_store(value: str) -> tuple[CheckpointStore, str | None]:
    """The checkpoint store ``resume_from`` names and the checkpoint in it (None: its
    newest that verifies)."""
    from prefect_runpod.blocks.validation.names import check_flow_run_id

    try:
        run_id = check_flow_run_id(value, "resume_from")
    except SpecError:
        run_id = None
    if run_id is not None:
        from prefect_runpod.flows.run.cost_record import latest_record

        record = latest_record(run_id)
        if record is None or not record.output_dir:
            raise SpecError(
                f"resume_from: run {run_id} has no cost record naming its output dir: pass "
                "that output dir (or a checkpoint folder in it) instead"
            )
        return CheckpointStore(record.output_dir), None
    path = Path(value).expanduser().resolve()
    if (path.parent / f"{path.name}.manifest.json").is_file():  # one checkpoint folder
        return CheckpointStore(path.parent.parent), path.name
    return CheckpointStore(path), None


def resume_checkpoint(value: str | None, run: Any) -> str | None:
    """Check ``resume_from`` before renting and put its checkpoint in this run's store.

    Args:
        value: the ``resume_from`` parameter (a flow run id, a run's output dir, or a
            checkpoint folder), or None.
        run: the run that passed its pre-rent checks (its bundle and output dir).

    Returns:
        The checkpoint's name in this run's ``CheckpointStore``, or None for ``value`` None.

    Raises:
        SpecError: the bundle declares no checkpoints, nothing verified is found there,
            the checkpoint named does not verify, or it was written on a pod with
            another GPU count than the run's pod spec asks for.
    """
    if value is None:
        return None
    settings = run.settings
    if not settings.bundle.checkpoints:
        raise SpecError(
            f"resume_from needs a bundle that declares checkpoints: {settings.bundle.root}"
            "/bundle.toml has no 'checkpoints' (docs/bundles.md#checkpoints-and-resume)"
        )
    source, name = _source_store(value)
    name = name if name is not None else source.latest()
    if name is None or not source.verifies(name):
        raise SpecError(
            f"resume_from {value!r}: no verified checkpoint in {source.root}: pass a run "
            "whose checkpoints verified, or start afresh without --resume-from"
        )
    refusal = gpu_count_refusal(name, source.written_gpu_count(name), _planned_gpus(run))
    if refusal is not None:
        raise SpecError(f"resume_from {value!r}: {refusal} (without --resume-from); nothing "
                        "was rented")  # fmt: skip
    here = CheckpointStore(settings.output_dir, settings.bundle.keep_checkpoints)
    if source.root.resolve() != here.root.resolve():
        folder, _ = here.staging(name, source.manifest(name))
        shutil.rmtree(folder)
        shutil.copytree(source.root / name, folder)
        if not here.accept(name, folder, source.manifest(name)):
            raise SpecError(f"resume_from: checkpoint {name} did not verify once copied here")
    _log.info("resuming from checkpoint %s (verified, from %s)", name, source.root)
    return name


def _planned_gpus(run: Any) -> int:
    """GPUs of the pod the run is about to rent (its pod spec's count; 0 locally)."""
    return int(run.planned.handle.gpu_count)


def lost_spend(attempts: list[PodAttempt], through: int) -> float:
    """What the run's pods numbered up to ``through`` billed together, USD (our
    estimate, each to its confirmed end): the pods a run lost before it rents the next
    one. Pure."""
    return round_usd(sum(a.usd for a in attempts if a.number <= through))


def recovery_spend_refusal(spent_usd: float, cap_usd: float | None) -> str | None:
    """Why a run stops resuming once its lost pods billed ``spent_usd`` together under a
    recovery spend cap of ``cap_usd`` (``max_recovery_usd``); None with no cap or while
    the spend is below it. The rule is the spend so far alone: the next pod's cost is
    not guessed, so a cap stops the run at the first loss that reaches it. Pure."""
    if cap_usd is None or spent_usd < cap_usd:
        return None
    return (
        f"the pods it lost billed {spent_usd:.6f} USD together, at or over max_recovery_usd "
        f"{cap_usd:g} USD"
    )


def _stopped(exc: PodGoneError, why: str, latest: str, where: Path, run_id: str) -> PodGoneError:
    """The error of a run that stops resuming after losing its pod (``why``: which cap):
    one sentence naming the last verified checkpoint, where it is kept, and the
    ``--resume-from`` command that continues the run."""
    return PodGoneError(
        f"{exc}; {why}: the run stops; its last verified checkpoint, {latest}, is kept in "
        f"{where}: continue with `prefect-runpod finetune --resume-from {run_id}` (and the "
        "same bundle and options)",
        pod_id=exc.pod_id,
        cause=exc.cause,
        seen_at=exc.seen_at,
    )


class AttemptLoop:
    """The run's pod attempts (see the module).

    Args:
        params: the flow's parameters (``max_pod_losses``, ``max_recovery_usd``,
            ``recover_outside_terminate``, ``terminate_timeout_seconds``).

    Attributes:
        session: the current attempt (the flow's ``finally`` brings it back).
        losses: pods lost and resumed after so far.
    """

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = params
        self.session: PodSession | None = None
        self.losses = 0

    def _number(self, name: str, default: float) -> float:
        from prefect_runpod.blocks.validation import check_number

        value = self.params.get(name)
        return default if value is None else float(check_number(name, value))  # type: ignore[arg-type]

    def run(
        self, make: SessionFactory, resume_from: str | None = None, first: int = 1
    ) -> BaseException | None:
        """Attempt after attempt until the work is done or a loss is not recovered;
        the first, numbered ``first`` (k + 1 after the k attempts a continued run's record
        carried), resumes from ``resume_from`` (a checkpoint of the run's store) if given.

        Returns:
            The last attempt's deferred error (``PodSession.work``).

        Raises:
            PodGoneError: a loss that is not recovered (the last verified checkpoint,
                when there is one, named in the message); whatever a stage raised.
            TerminateError: the lost pod's end could not be confirmed (nothing more is
                rented).
        """
        number, resume, lost_steps = first, resume_from, None
        while True:
            self.session = make(number, resume, lost_steps)
            try:
                self.session.bring_up()
                if number > first:
                    self._said(POD_RECOVERED_EVENT, self.session, resumed_from=resume)
                return self.session.work()
            except PodGoneError as exc:
                self._said(POD_LOST_EVENT, self.session, cause=exc.cause)
                resume, lost_steps = self._recover(self.session, exc)
                number += 1

    @staticmethod
    def _said(event: str, session: PodSession, **payload: Any) -> None:
        attempt = session.attempt
        if attempt is not None and attempt.pod_id:
            payload["attempt"] = attempt.number
            _emit(event, attempt, session.report.flow_run_id, payload)

    def _recover(self, session: PodSession, exc: PodGoneError) -> tuple[str, int]:
        """End the lost attempt and say what the next resumes from, or raise."""
        bundle = session.settings.bundle
        if not bundle.checkpoints:
            raise exc  # a bundle without checkpoints ends the run, as it always did
        lost = session.watch.lost if session.watch is not None else None
        ended_by = lost.ended_by if lost is not None else None
        outside = bool(self.params.get("recover_outside_terminate"))
        if not recoverable(exc.cause, ended_by, outside_too=outside):
            raise exc
        latest = session.checkpoints.latest()
        if latest is None:
            raise PodGoneError(
                f"{exc}; no checkpoint had verified off the pod yet, so there is nothing "
                "to resume from: run it again",
                pod_id=exc.pod_id,
                cause=exc.cause,
                seen_at=exc.seen_at,
            ) from exc
        limit = int(self._number("max_pod_losses", DEFAULT_MAX_POD_LOSSES))
        where = session.checkpoints.root / latest
        if self.losses >= limit:
            why = f"that is {self.losses + 1} pods lost, over max_pod_losses {limit}"
            raise _stopped(exc, why, latest, where, session.report.flow_run_id) from exc
        refusal = gpu_count_refusal(
            latest, session.checkpoints.written_gpu_count(latest), _planned_gpus(session.run)
        )
        if refusal is not None:
            raise PodGoneError(
                f"{exc}; the run does not resume: {refusal}; the checkpoint is kept in {where}",
                pod_id=exc.pod_id,
                cause=exc.cause,
                seen_at=exc.seen_at,
            ) from exc
        step = step_of(latest) or 0
        steps_lost = max(0, (session.last_step or step) - step)
        timeout = self._number("terminate_timeout_seconds", DEFAULT_TERMINATE_TIMEOUT_SECONDS)
        unconfirmed = session.bring_back(
            keep_pod_on_failure=False, terminate_timeout_seconds=timeout
        )
        if unconfirmed is not None:  # never two pods alive: rent nothing
            raise unconfirmed from exc
        cap = self.params.get("max_recovery_usd")
        cap_usd = None if cap is None else self._number("max_recovery_usd", 0.0)
        over = recovery_spend_refusal(lost_spend(session.report.attempts, session.number), cap_usd)
        if over is not None:  # the lost pod is confirmed gone: nothing more is rented
            raise _stopped(exc, over, latest, where, session.report.flow_run_id) from exc
        self._same_bundle(session, exc)
        self.losses += 1
        _log.warning(
            "pod %s lost (%s): resuming from checkpoint %s (step %d, %d steps lost) on a "
            "new pod, attempt %d (loss %d of at most %d)",
            exc.pod_id,
            exc.cause,
            latest,
            step,
            steps_lost,
            session.number + 1,
            self.losses,
            limit,
        )
        return latest, steps_lost

    def _same_bundle(self, session: PodSession, exc: PodGoneError) -> None:
        """Refuse to resume with a bundle that changed since the run's first upload:
        the checkpoint was trained by the code that upload carried."""
        settings, upload = session.settings, session.report.upload
        changed = changed_bundle_files(
            upload.source_manifest if upload is not None else None,
            settings.bundle.root,
            settings.upload.files if settings.upload else None,
            follow_links=settings.follow_links,
        )
        if changed:
            shown = ", ".join(changed[:5]) + (
                f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            )
            raise SpecError(
                f"{exc}; the run does not resume: the bundle in {settings.bundle.root} changed "
                f"since the run uploaded it ({shown}); put those files back as they were, or "
                "start a new run"
            ) from exc
