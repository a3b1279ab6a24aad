"""``RunPodWorker``: the hybrid Prefect worker of the ``runpod`` work-pool type
(docs/worker.md).

``prefect work-pool create POOL --type runpod`` makes a pool with this worker's job
variables (``flows/worker/config.py``); ``prefect worker start --pool POOL --type
runpod`` polls it. Each flow run gets its own pod (``flows/worker/pod_run.py``): its id
is the flow run's infrastructure id from the moment it exists, the worker follows the
flow process to its end, and the pod is always ended, confirmed and its cost recorded.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import InfrastructureNotFound
from prefect.settings import get_current_settings
from prefect.states import Crashed
from prefect.workers.base import BaseWorker, BaseWorkerResult

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.provider import EndedBy, PodCause, PodEnd
from prefect_runpod.blocks.secret_mask import error_text
from prefect_runpod.flows.worker.api_url import api_key_kind, pod_api_url
from prefect_runpod.flows.worker.config import RunPodJobConfiguration, RunPodJobVariables

__all__ = ["RunPodWorker", "RunPodWorkerResult"]

_FINAL = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})


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
        RunPod pod cannot reach (refused before renting), a pod that never came up, code
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
        except SpecError as exc:
            return await self._refused(flow_run, task_status, str(exc))
        if not self._key_kind_logged:
            self._key_kind_logged = True
            self._logger.info("the pods this worker starts get %s", api_key_kind(api_key))
        outcomes: list[tuple[int | None, str | None, str | None, list[str]]] = []

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

        async with anyio.create_task_group() as group:
            group.start_soon(work)
            await created.wait()
            if "pod_id" in started and task_status is not None:
                # From run()'s own task: Prefect records the pod id as the infrastructure id.
                task_status.started(started["pod_id"])
        exit_code, problem, stopped, tail_lines = outcomes[0]
        if "pod_id" not in started:
            return await self._refused(flow_run, task_status, problem or "no pod was created")
        state = await self._state_type(flow_run)
        if stopped == "cancelled" or state == "CANCELLING":
            # The stopped engine may have proposed Crashed over Cancelling: the cancel wins.
            if state not in {"CANCELLED", "COMPLETED"}:
                await self._mark_flow_run_as_cancelled(
                    flow_run,
                    {"message": "Cancelled: the worker stopped the flow and ended its pod."},
                )
            return RunPodWorkerResult(identifier=started["pod_id"], status_code=0)
        if problem is None and exit_code not in (0, None) and state not in _FINAL:
            tail = " / ".join(line for line in tail_lines if line.strip())[-300:]
            problem = (
                f"the flow process on pod {started['pod_id']} exited with code {exit_code} "
                f"without a final state{': ' + tail if tail else ''}"
            )
        if problem is not None and stopped == "runtime cap" and state != "COMPLETED":
            # The stopped engine may have set its own Crashed ("termination signal"):
            # the run says why it was stopped.
            await self.client.set_flow_run_state(flow_run.id, Crashed(message=problem), force=True)
        elif problem is not None and state not in _FINAL:
            await self._propose_crashed_state(flow_run, problem)
        code = exit_code if exit_code is not None else (0 if problem is None else 1)
        return RunPodWorkerResult(identifier=started["pod_id"], status_code=code)

    async def _refused(
        self, flow_run: FlowRun, task_status: anyio.abc.TaskStatus[Any] | None, sentence: str
    ) -> RunPodWorkerResult:
        """A run that never got a pod: Crashed with ``sentence``."""
        self.get_flow_run_logger(flow_run).error(sentence)
        await self._propose_crashed_state(flow_run, sentence)
        if task_status is not None:
            task_status.started(SpecError(sentence))
        return RunPodWorkerResult(identifier="", status_code=1)

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
) -> tuple[int | None, str | None, str | None, list[str]]:
    """The blocking part of ``RunPodWorker.run``, in a thread.

    Returns:
        ``(exit_code, problem, stopped, tail)``: the process's exit code (None when it
        never ran or was lost), the one-sentence reason the run crashed (None), why the
        worker stopped it (None), its last output lines.
    """
    from prefect.client.orchestration import get_client

    from prefect_runpod.blocks.exceptions import TerminateError
    from prefect_runpod.flows.worker.pod_run import PodFlowRun, local_code_dir

    exit_code: int | None = None
    problem: str | None = None
    run: PodFlowRun | None = None
    try:
        run = PodFlowRun(
            configuration, flow_run_id, api_url=api_url, api_key=api_key, logger=logger,
            on_created=on_created,
        )  # fmt: skip
        with get_client(sync_client=True) as client:

            def state_type() -> str | None:
                try:
                    state = client.read_flow_run(flow_run_id).state  # type: ignore[arg-type]
                except Exception:
                    return None
                return state.type.value if state is not None else None

            run.rent()
            run.put_code(local_code_dir(configuration.deployment))
            run.ready_python()
            run.launch()
            exit_code = run.follow(state_type)
            if exit_code is None:
                problem = f"the flow process on pod {run.handle and run.handle.pod_id} was lost"
            elif run.stopped == "runtime cap":
                problem = (
                    f"the flow run passed max_runtime_seconds={configuration.max_runtime_seconds:g} "
                    "on its pod; the worker stopped it and ended the pod"
                )
    except Exception as exc:
        problem = error_text(exc)
        logger.error("the run on its pod failed: %s", problem, exc_info=True)
    finally:
        if run is not None:
            try:
                run.end()
            except TerminateError as exc:
                problem = problem or error_text(exc)
    return exit_code, problem, run.stopped if run else None, list(run.tail) if run else []


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
        end = PodEnd(
            pod_id=pod_id,
            ended_by=EndedBy.FLOW,
            confirmed=True,
            ended_at=result.confirmed_at,
            layer="terminate (the runpod worker's kill_infrastructure)",
            detail="the flow run was cancelled",
        )
        record_pod_end(flow_run_id, end, recorded_by="worker", provider=provider)
