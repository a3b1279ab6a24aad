"""``RunPodWorker``: the hybrid Prefect worker of the ``runpod`` work-pool type
(docs/worker.md).

``prefect work-pool create POOL --type runpod`` makes a pool with this worker's job
variables (``flows/worker/config.py``); ``prefect worker start --pool POOL --type
runpod`` polls it. Each flow run gets its own pod (``flows/worker/pod_run.py``): its id
is the flow run's infrastructure id from the moment it exists, the worker follows the
flow process to its end, and the pod is always ended, confirmed and its cost recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import anyio
import anyio.abc
import anyio.to_thread
import httpx
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import InfrastructureNotFound
from prefect.settings import get_current_settings
from prefect.states import Crashed
from prefect.workers.base import BaseWorker, BaseWorkerResult

from prefect_runpod.blocks.exceptions import PodGoneError, PodTimeoutError, SpecError
from prefect_runpod.blocks.provider import EndedBy, PodCause
from prefect_runpod.blocks.secret_mask import error_text, redact
from prefect_runpod.flows.run.recovery import POD_LOST_EVENT
from prefect_runpod.flows.worker.api_url import api_key_kind, pod_api_url
from prefect_runpod.flows.worker.code import checked_requirements
from prefect_runpod.flows.worker.config import RunPodJobConfiguration, RunPodJobVariables

__all__ = ["RunPodWorker", "RunPodWorkerResult", "crash_sentence"]

_FINAL = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
_Outcome = tuple[int | None, str | None, str | None, list[str]]
"""``(exit_code, problem, stopped, tail)`` of a run on its pod (``_follow_on_pod``)."""


class RunPodWorkerResult(BaseWorkerResult):
    """What ``RunPodWorker.run`` returns: ``identifier`` the pod id (empty when none was
    created), ``status_code`` the flow process's exit code (0 when it ended well)."""


class RunPodWorker(BaseWorker[RunPodJobConfiguration, RunPodJobVariables, RunPodWorkerResult]):
    """Runs each flow run of a ``runpod`` pool on its own pod: the local pod (the
    embedded default) or a RunPod pod (docs/worker.md).

    Example:
        ```bash
        prefect work-pool create gpu --type runpod
        prefect worker start --pool gpu --type runpod
        ```
    """

    type = "runpod"
    job_configuration = RunPodJobConfiguration
    job_configuration_variables = RunPodJobVariables
    _description = (
        "Run each flow run on its own rented GPU pod (RunPod, or a local pod on the "
        "worker's machine); the pod is always ended and its cost recorded."
    )
    _documentation_url = "https://github.com/prefect-runpod/prefect-runpod/blob/main/docs/worker.md"
    _logo_url = "https://avatars.githubusercontent.com/u/79115926"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._key_kind_logged = False
        self._adoption_started = False
        self._following: set[UUID] = set()

    async def run(
        self,
        flow_run: FlowRun,
        configuration: RunPodJobConfiguration,
        task_status: anyio.abc.TaskStatus[Any] | None = None,
    ) -> RunPodWorkerResult:
        """Rent the run's pod, put its code and a Prefect on it, start the flow process
        detached, mark the pod id as the infrastructure id at once, follow the process
        to its end, then end the pod (confirmed) and record its cost.

        A run the pod cannot do is marked Crashed with one sentence: a Prefect API a
        RunPod pod cannot reach or a ``requirements`` entry that is no pip requirement
        specifier (both refused before renting), requirements pip could not install, a pod that never came up, code
        that could not be put on it, a process that died without a final state, the
        runtime cap. A run being cancelled has its process stopped and is marked
        Cancelled once its pod is gone.

        Returns:
            ``RunPodWorkerResult``: the pod id and the process's exit code.
        """
        logger = self.get_flow_run_logger(flow_run)
        settings = get_current_settings()
        api_key = settings.api.key.get_secret_value() if settings.api.key else None
        started: dict[str, str] = {}
        created = anyio.Event()  # the pod id exists, or the work ended without one

        def on_created(pod_id: str) -> None:
            started["pod_id"] = pod_id
            anyio.from_thread.run_sync(created.set)

        try:
            url = pod_api_url(
                settings.api.url,
                configuration.prefect_api_url_for_pod,
                provider=configuration.provider,
            )
            checked_requirements(list(configuration.requirements))
        except SpecError as exc:
            return await self._refused(flow_run, task_status, str(exc))
        if not self._key_kind_logged:
            self._key_kind_logged = True
            self._logger.info("the pods this worker starts get %s", api_key_kind(api_key))
        outcomes: list[_Outcome] = []

        async def work() -> None:
            try:
                outcomes.append(
                    await anyio.to_thread.run_sync(
                        _run_on_pod,
                        configuration,
                        str(flow_run.id),
                        url,
                        api_key,
                        logger,
                        on_created,
                    )  # fmt: skip
                )
            finally:
                created.set()

        self._following.add(flow_run.id)  # never adopted by this worker meanwhile
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(work)
                await created.wait()
                if "pod_id" in started and task_status is not None:
                    # From run()'s own task: Prefect records the pod id as the infrastructure id.
                    task_status.started(started["pod_id"])
        finally:
            self._following.discard(flow_run.id)
        if "pod_id" not in started:
            return await self._refused(
                flow_run, task_status, outcomes[0][1] or "no pod was created"
            )
        return await self._settle(flow_run, started["pod_id"], outcomes[0])

    async def _settle(
        self,
        flow_run: FlowRun,
        pod_id: str,
        outcome: _Outcome,
    ) -> RunPodWorkerResult:
        """The flow run's last word once its pod is ended: Cancelled when it was being
        cancelled, Crashed with the one-sentence reason when the process died without a
        final state or the worker stopped it (the runtime cap)."""
        exit_code, problem, stopped, tail_lines = outcome
        state = await self._state_type(flow_run)
        if stopped == "cancelled" or state == "CANCELLING":
            # The stopped engine may have proposed Crashed over Cancelling: the cancel wins.
            if state not in {"CANCELLED", "COMPLETED"}:
                await self._mark_flow_run_as_cancelled(
                    flow_run,
                    {"message": "Cancelled: the worker stopped the flow and ended its pod."},
                )
            return RunPodWorkerResult(identifier=pod_id, status_code=0)
        if problem is None and exit_code not in (0, None) and state not in _FINAL:
            tail = " / ".join(line for line in tail_lines if line.strip())[-300:]
            problem = (
                f"the flow process on pod {pod_id} exited with code {exit_code} "
                f"without a final state{': ' + tail if tail else ''}"
            )
        if problem is not None and stopped == "runtime cap" and state != "COMPLETED":
            # The stopped engine may have set its own Crashed ("termination signal"):
            # the run says why it was stopped.
            await self.client.set_flow_run_state(flow_run.id, Crashed(message=problem), force=True)
        elif problem is not None and state not in _FINAL:
            await self._propose_crashed_state(flow_run, problem)
        code = exit_code if exit_code is not None else (0 if problem is None else 1)
        return RunPodWorkerResult(identifier=pod_id, status_code=code)

    # -- adopting the pods of a worker that stopped ----------------------------------

    async def get_and_submit_flow_runs(self) -> list[FlowRun]:
        """Prefect's poll for scheduled runs; the first one, once the pool is known,
        also starts adopting the live pods a stopped worker of this pool left
        (``_adopt_live_pods``)."""
        if not self._adoption_started and self._work_pool is not None:
            self._adoption_started = True
            if self._runs_task_group is not None:
                self._runs_task_group.start_soon(self._adopt_live_pods)
        return await super().get_and_submit_flow_runs()

    async def _adopt_live_pods(self) -> None:
        """Adopt each live pod of this pool's flow runs that no worker follows: a run
        whose infrastructure id is a live pod named ``<name_prefix>-<flow_run_id>``,
        found when this worker starts, before the pod's dead-man limit ends it. Its
        heartbeat and following resume; the pod is ended and recorded as usual."""
        try:
            runs = await self._runs_with_pods()
        except Exception as exc:  # the poll goes on; the dead-man still ends the pods
            self._logger.warning("could not look for live pods to adopt: %s", exc)
            return
        for flow_run in runs:
            if flow_run.id in self._following or flow_run.id in self._submitting_flow_run_ids:
                continue
            try:
                configuration = await self.job_configuration.resolve_for_flow_run(
                    flow_run,
                    client=self.client,
                    work_pool=self.work_pool,
                    worker_name=self.name,
                    worker_id=self.backend_id,
                )
            except Exception as exc:
                self._logger.warning("could not read flow run %s's job: %s", flow_run.id, exc)
                continue
            assert self._runs_task_group is not None
            self._runs_task_group.start_soon(self._adopt, flow_run, configuration)

    async def _runs_with_pods(self) -> list[FlowRun]:
        """This pool's flow runs that may have a live pod to adopt: Running or
        Cancelling, or final in the last hour (a run that ended while no worker followed
        it), with an infrastructure id. A Pending run's pod is still being brought up by
        the worker that claimed it (no heartbeat yet, no flow process): never adopted."""
        from datetime import UTC, datetime, timedelta

        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterEndTime,
            FlowRunFilterState,
            FlowRunFilterStateType,
            WorkPoolFilter,
            WorkPoolFilterName,
        )
        from prefect.client.schemas.objects import StateType

        pool = WorkPoolFilter(name=WorkPoolFilterName(any_=[self._work_pool_name]))
        live = [StateType.RUNNING, StateType.CANCELLING]
        final = [StateType(t) for t in sorted(_FINAL)]
        found = await self.client.read_flow_runs(
            work_pool_filter=pool,
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live))
            ),
        )
        found += await self.client.read_flow_runs(
            work_pool_filter=pool,
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=final)),
                end_time=FlowRunFilterEndTime(
                    after_=datetime.now(UTC) - timedelta(hours=1)  # type: ignore[arg-type]
                ),
            ),
        )
        return [run for run in found if run.infrastructure_pid]

    async def _adopt(self, flow_run: FlowRun, configuration: RunPodJobConfiguration) -> None:
        pod_id = str(flow_run.infrastructure_pid)
        self._following.add(flow_run.id)
        try:
            outcome = await anyio.to_thread.run_sync(
                _adopt_on_pod, configuration, str(flow_run.id), pod_id,
                self.get_flow_run_logger(flow_run),
            )  # fmt: skip
            if outcome is not None:
                await self._settle(flow_run, pod_id, outcome)
        except Exception as exc:
            self._logger.warning(
                "adopting pod %s of flow run %s failed: %s", pod_id, flow_run.id, exc
            )
        finally:
            self._following.discard(flow_run.id)

    async def _refused(
        self, flow_run: FlowRun, task_status: anyio.abc.TaskStatus[Any] | None, sentence: str
    ) -> RunPodWorkerResult:
        """A run that never got a pod: Crashed with ``sentence``."""
        self.get_flow_run_logger(flow_run).error(sentence)
        await self._propose_crashed_state(flow_run, sentence)
        if task_status is not None:
            task_status.started(SpecError(sentence))
        return RunPodWorkerResult(identifier="", status_code=1)

    async def _give_worker_labels_to_flow_run(self, flow_run_id: UUID) -> None:
        """Prefect's labels for a run being submitted (``prefect.worker.name``, the
        pool's name and id), best effort: the run goes on without them when the Prefect
        API still fails after its client's own retries (``PREFECT_CLIENT_MAX_RETRIES``).

        Prefect's base worker makes this PATCH before ``run()`` and crashes the run on
        any error ("Failed to submit flow run to infrastructure"). Its server answers
        503 when the PATCH's read-then-write loses SQLite's write race
        (``SQLITE_BUSY_SNAPSHOT``), which a busy server does again and again; the
        labels name who ran the run, they decide nothing here (adoption reads the
        pool and the infrastructure id).
        """
        try:
            await super()._give_worker_labels_to_flow_run(flow_run_id)
        except (httpx.HTTPStatusError, httpx.TransportError) as exc:
            self._logger.warning(
                "flow run %s goes on without this worker's labels: the Prefect API answered %s",
                flow_run_id,
                error_text(exc).splitlines()[0],
            )

    async def _state_type(self, flow_run: FlowRun) -> str | None:
        try:
            fresh = await self.client.read_flow_run(flow_run.id)
        except Exception:
            return None
        return fresh.state.type.value if fresh.state is not None else None

    async def kill_infrastructure(
        self,
        infrastructure_pid: str,
        configuration: RunPodJobConfiguration,
        grace_seconds: int = 30,
    ) -> None:
        """End pod ``infrastructure_pid`` (a cancelled flow run's) and wait for the
        provider's confirmation; its end goes into the run's cost record.

        Raises:
            InfrastructureNotFound: no such pod, or it already ended.
            TerminateError: the end was not confirmed (the pod may still bill).
        """
        await anyio.to_thread.run_sync(_kill_pod, infrastructure_pid, configuration)


def _run_on_pod(
    configuration: RunPodJobConfiguration,
    flow_run_id: str,
    api_url: str,
    api_key: str | None,
    logger: Any,
    on_created: Any,
) -> _Outcome:
    """The blocking part of ``RunPodWorker.run``, in a thread: rent, put the code and a
    Prefect on the pod, launch, then ``_follow_on_pod``.

    Returns:
        ``(exit_code, problem, stopped, tail)``: the process's exit code (None when it
        never ran or was lost), the one-sentence reason the run crashed (None), why the
        worker stopped it (None), its last output lines.
    """
    from prefect_runpod.flows.worker.pod_run import PodFlowRun, local_code_dir

    def bring_up(run: PodFlowRun) -> bool:
        run.rent()
        run.put_code(local_code_dir(configuration.deployment))
        run.ready_python()
        run.install_requirements()
        run.launch()
        return True

    try:
        run = PodFlowRun(
            configuration, flow_run_id, api_url=api_url, api_key=api_key, logger=logger,
            on_created=on_created,
        )  # fmt: skip
    except Exception as exc:
        logger.error("the run on its pod failed: %s", error_text(exc))
        return None, error_text(exc), None, []
    outcome = _follow_on_pod(run, configuration, bring_up)
    assert outcome is not None  # bring_up never declines
    return outcome


def _adopt_on_pod(
    configuration: RunPodJobConfiguration, flow_run_id: str, pod_id: str, logger: Any
) -> _Outcome | None:
    """The blocking part of adopting pod ``pod_id`` of flow run ``flow_run_id`` (a
    stopped worker's), in a thread: None when it is not this run's live pod or another
    worker follows it; else ``_follow_on_pod``'s outcome once the pod is ended."""
    from prefect_runpod.flows.worker.adoption import adoption_quiet_seconds
    from prefect_runpod.flows.worker.pod_run import PodFlowRun

    run = PodFlowRun(
        configuration, flow_run_id, api_url="", api_key=None, logger=logger,
        on_created=lambda _pod_id: None,
    )  # fmt: skip
    handle = run.provider.find(run.name)  # by name, and by the run's infrastructure id
    if handle is None or handle.pod_id != pod_id:
        return None
    quiet = adoption_quiet_seconds(configuration.heartbeat_stale_seconds)
    return _follow_on_pod(run, configuration, lambda r: r.adopt(handle, quiet))


def _follow_on_pod(
    run: Any, configuration: RunPodJobConfiguration, bring_up: Callable[[Any], bool]
) -> _Outcome | None:
    """Bring the pod up (``bring_up``: False leaves the pod as it is and returns None),
    follow the flow process to its end, and always end the pod."""
    from prefect.client.orchestration import get_client

    from prefect_runpod.blocks.exceptions import TerminateError

    exit_code: int | None = None
    problem: str | None = None
    flow_run_id = run.flow_run_id
    try:
        with get_client(sync_client=True) as client:

            def state_type() -> str | None:
                try:
                    state = client.read_flow_run(flow_run_id).state
                except Exception:
                    return None
                return state.type.value if state is not None else None

            if not bring_up(run):
                run.release()
                run = None
                return None
            exit_code = run.follow(state_type)
            if exit_code is None:
                problem = f"the flow process on pod {run.handle and run.handle.pod_id} was lost"
            elif run.stopped == "runtime cap":
                problem = (
                    f"the flow run passed max_runtime_seconds={configuration.max_runtime_seconds:g} "
                    "on its pod; the worker stopped it and ended the pod"
                )
    except Exception as exc:
        problem = crash_sentence(exc, run.handle.pod_id if run.handle else None, run.name)
        run.logger.error("the run on its pod failed: %s", problem, exc_info=True)
        if isinstance(exc, PodGoneError) and run.handle is not None:
            _emit_pod_event(POD_LOST_EVENT, run, {"cause": exc.cause, "message": problem})
    finally:
        if run is not None:
            try:
                run.end()
            except TerminateError as exc:
                problem = problem or error_text(exc)
    return exit_code, problem, run.stopped, list(run.tail)


def crash_sentence(exc: BaseException, pod_id: str | None, pod_name: str) -> str:
    """The one sentence a flow run is Crashed with when its pod failed it: a pod lost
    under the run (the provider says it ended, exited or lost its host), a pod that
    never booted (not reachable in time), else the error's own sentence."""
    pod = f"pod {pod_id} ({pod_name})" if pod_id else f"pod {pod_name}"
    if not isinstance(exc, PodGoneError | PodTimeoutError):
        return error_text(exc).rstrip(".")
    text = redact(str(exc)).rstrip(".")
    if isinstance(exc, PodGoneError):
        return f"{pod} was lost under the flow run: {text}"
    if isinstance(exc, PodTimeoutError):
        return f"{pod} never booted, its image may not start or the host has no capacity: {text}"
    return text


def _emit_pod_event(event: str, run: Any, payload: dict[str, Any]) -> None:
    """A Prefect event about a worker's pod (the fine-tune's kinds, ``prefect-runpod.pod.*``,
    the flow run related), for automations; one that cannot be sent only logs."""
    from prefect.events import emit_event

    from prefect_runpod.flows.run.recovery import pod_event

    try:
        emit_event(**pod_event(event, run.handle.pod_id, run.name, run.flow_run_id, payload))
    except Exception as exc:  # an event never changes the run
        run.logger.warning("could not emit %s for pod %s: %s", event, run.handle.pod_id, exc)


def _kill_pod(pod_id: str, configuration: RunPodJobConfiguration) -> None:
    from prefect_runpod.flows.run.cost_record import record_pod_end
    from prefect_runpod.flows.run.providers import build_provider

    provider, _ = build_provider(configuration.provider_params(), need_ssh_key=False)
    status = provider.status(pod_id)
    if status.cause is PodCause.TERMINATED_OUTSIDE:
        raise InfrastructureNotFound(f"pod {pod_id} is not running ({status.provider_status})")
    result = provider.terminate(pod_id, configuration.terminate_timeout_seconds)
    flow_run_id = (configuration.labels or {}).get("prefect.io/flow-run-id")
    if flow_run_id:
        end = result.end(
            EndedBy.FLOW,
            "terminate (the runpod worker's kill_infrastructure)",
            detail="the flow run was cancelled",
        )
        record_pod_end(flow_run_id, end, recorded_by="worker", provider=provider)
