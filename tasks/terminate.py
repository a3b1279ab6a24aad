"""Terminate: the idempotent, confirmed end of a pod, shared by the flow's ``finally``,
its crash/cancel hooks and the reaper (docs/architecture.md#termination-layers)."""

from __future__ import annotations

import logging

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.provider import PodProvider, TerminateResult
from prefect_runpod.blocks.validation.parameters import DEFAULT_TERMINATE_TIMEOUT_SECONDS

__all__ = ["terminate", "terminate_by_name", "terminate_pod"]


def terminate_pod(
    provider: PodProvider, pod_id: str, timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
) -> TerminateResult:
    """Terminate ``pod_id`` and return once the provider confirms it gone.

    Idempotent: a pod already gone returns ``already_gone=True``; a pod this provider
    ended itself answers that first confirmed end again (RunPod's provider).

    Raises:
        TerminateError: when not confirmed in ``timeout_seconds`` (the pod may still bill;
            the message names it and the manual command).
    """
    return provider.terminate(pod_id, timeout_seconds=timeout_seconds)


def terminate_by_name(
    provider: PodProvider,
    name: str,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    *,
    handle: PodHandle | None = None,
) -> TerminateResult | None:
    """Find the pod named ``name`` and terminate it; None when no such pod lives.

    Used by hooks that run in another process with nothing but the flow run: the pod's
    name is ``<prefix>-<flow_run_id>``.

    Args:
        provider: the pod's provider.
        name: ``<prefix>-<flow_run_id>``.
        logger: where to say what happened.
        handle: the pod, when the caller found it already (saves a second lookup).

    Raises:
        TerminateError: found but not confirmed gone (it may still bill).
    """
    handle = handle or provider.find(name)
    if handle is None:
        if logger:
            logger.info("no live pod named %s: nothing to terminate", name)
        return None
    result = terminate_pod(provider, handle.pod_id)
    if logger:
        logger.info(
            "%s: terminated (pod %s), confirmed at %s", handle.pod_id, name, result.confirmed_at
        )
    return result


@task(name="terminate", cache_policy=NO_CACHE, retries=0)
def terminate(
    provider: PodProvider, pod_id: str, timeout_seconds: float = DEFAULT_TERMINATE_TIMEOUT_SECONDS
) -> TerminateResult:
    """The ``terminate`` stage: see ``terminate_pod``. One deadline in all: the provider
    repeats transient failures within it and stops at once on answers retrying cannot
    change, so the task itself is not retried (a retried task would only triple the wait
    for a pod that may still be billing)."""
    return terminate_pod(provider, pod_id, timeout_seconds)
