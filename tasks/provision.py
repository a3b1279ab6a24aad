"""Provision: create the pod, record it at once, wait until its SSH answers, and make it
ready for the run (pod tools in place, dead-man switch armed). docs/architecture.md#pod-providers, #termination-layers."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.exceptions import TerminateError
from prefect_runpod.blocks.faults import fault_point
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import Capability, DeadmanConfig, PodProvider, PodRequest
from prefect_runpod.blocks.provider_registry import provider_supports
from prefect_runpod.blocks.validation.parameters import DEFAULT_TERMINATE_TIMEOUT_SECONDS

if TYPE_CHECKING:  # the console (paramiko) is opened only inside prepare_pod
    from prefect_runpod.blocks.console import ConsoleLike

__all__ = ["arm_deadman", "prepare_pod", "provision"]


@task(name="provision", cache_policy=NO_CACHE)
def provision(
    provider: PodProvider,
    request: PodRequest,
    name: str,
    ready_timeout_seconds: float,
    on_created: Callable[[PodHandle], None],
    terminate_timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS,
) -> PodHandle:
    """Create the pod named ``name`` (adopting a live one of that name), hand its handle to
    ``on_created`` as soon as the id exists, then wait until SSH answers.

    Args:
        provider: where to rent the pod.
        request: public key, env, CUDA floor, dead-man settings.
        name: ``<prefix>-<flow_run_id>``.
        ready_timeout_seconds: the bound on the wait for RUNNING + SSH.
        on_created: called with the fresh handle before any wait (so a crash while
            waiting can still terminate the pod).
        terminate_timeout_seconds: how long the terminate after a failed wait may wait
            for the provider's confirmation, s (the run's ``terminate_timeout_seconds``).

    Returns:
        The ready handle (SSH endpoint filled in).

    Raises:
        ProviderError subclasses from create; PodTimeoutError / PodGoneError from the
        wait (the pod is terminated first); TerminateError when that end was not
        confirmed (the pod may still be billing).
    """
    logger = get_run_logger()
    handle = provider.create(request, name)
    on_created(handle)
    logger.info(
        "%s: created (%s, %s, %.2f USD/h)", handle.pod_id, name, handle.gpu_type, handle.cost_per_hr
    )
    try:
        fault_point("wait_ready")
        handle = provider.wait_ready(handle, ready_timeout_seconds)
    except TerminateError:
        raise  # the provider already tried to end it and could not confirm: the run says so
    except BaseException:
        logger.warning("%s: not ready; terminating it before giving up", handle.pod_id)
        provider.terminate(handle.pod_id, terminate_timeout_seconds)
        raise
    logger.debug("%s: ready; get in with: %s", handle.pod_id, handle.ssh_command())
    return handle


def arm_deadman(
    console: ConsoleLike,
    tools_dir: str,
    run_dir: str,
    deadman: DeadmanConfig,
    *,
    use_api: bool = True,
) -> None:
    """Start the pod-side dead-man switch (``watchdog.py``) detached, with a fresh
    heartbeat file in ``run_dir``. The flow refreshes the heartbeat; when it goes stale for
    ``heartbeat_stale_seconds``, or ``lifetime_seconds`` pass, the pod ends itself by every
    way it has (``runpodctl pod delete``, ``runpodctl remove pod``, RunPod's API with the
    pod's own key; else it stops the workload and records that the pod was NOT ended).

    Args:
        console: the pod's console.
        tools_dir: where ``watchdog.py`` is on the pod.
        run_dir: the run directory (heartbeat, ``deadman.jsonl``).
        deadman: the limits.
        use_api: let the pod end itself through its provider's API with its own key
            (``Capability.SELF_TERMINATE``; off for a local pod, which has no such key).

    Raises:
        ConsoleError: when the watchdog cannot be started.
    """
    q = shlex.quote
    watchdog = f"{tools_dir}/watchdog.py"
    console.run(f"mkdir -p {q(run_dir)} && touch {q(run_dir)}/heartbeat", check=True)
    # --detach: the watchdog double-forks into its own session and keeps one instance
    # per run directory, so arming twice (a retry after a dropped link) is harmless.
    console.run(
        f"python3 {q(watchdog)} --detach --run-dir {q(run_dir)} "
        f"--heartbeat-stale-seconds {deadman.heartbeat_stale_seconds:g} "
        f"--lifetime-seconds {deadman.lifetime_seconds:g} "
        f"--check-interval-seconds {deadman.check_interval_seconds:g}"
        + (f" --stop-run-first {deadman.stop_run_seconds:g}" if deadman.stop_run_seconds else "")
        + ("" if use_api else " --no-api"),
        check=True,
    )


def prepare_pod(
    handle: PodHandle,
    private_key: SecretStr,
    run_dir: str,
    deadman: DeadmanConfig | None,
    reconnect: ReconnectPolicy | None = None,
) -> str:
    """Copy the pod-side tools onto the pod and arm the dead-man switch.

    Idempotent, and done again from the start when the SSH link drops or cannot be
    opened, under the run's one reconnect policy (``reconnect``: its budget, its
    backoff, the provider asked before each retry): the tools copy is verified file by
    file and the watchdog keeps one instance per run directory.

    Returns:
        The pod-side tools directory.

    Raises:
        ConsoleError / TransferError when the pod cannot be reached or written;
        PodGoneError when the provider says the pod is gone meanwhile.
    """
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools

    policy = reconnect or ReconnectPolicy()
    # The pod may end itself through its provider's API with its own key (RunPod); a
    # provider without that has the dead-man stop the workload instead.
    use_api = provider_supports(handle.provider, Capability.SELF_TERMINATE)

    def attempt() -> str:
        with PodConsole.for_pod(handle, private_key, reconnect=policy) as console:
            tools_dir = bootstrap_pod_tools(console, handle)
            if deadman is not None:
                arm_deadman(console, tools_dir, run_dir, deadman, use_api=use_api)
        return tools_dir

    return policy.call(attempt, pod_id=handle.pod_id, what="the pod's SSH")
