"""What the stages that work on a pod through a console share (docs/architecture.md#data-that-moves):
a console borrowed from the caller or opened for the stage (``borrowed_console``), and a
transfer's progress in the run's log (``progress_logger``). The upload and download
stages use both, the train stage the console; none imports another.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.exceptions import BudgetExceededError, DiskFullError
from prefect_runpod.blocks.pod_handle import PodHandle

__all__ = ["borrowed_console", "progress_logger", "retry_unless_final"]


def retry_unless_final(task: Any, task_run: Any, state: Any) -> bool:
    """A pod stage task's retry condition (Prefect's ``retry_condition_fn``): retried
    after any failure but one a retry cannot change: the run's budget spent
    (``BudgetExceededError``) or a full disk (``DiskFullError``)."""
    try:
        state.result()
    except (BudgetExceededError, DiskFullError):
        return False
    except Exception:  # noqa: BLE001 - anything else may pass on a second try
        return True
    return True


@contextmanager
def borrowed_console(
    handle: PodHandle,
    private_key: SecretStr,
    console: Any = None,
    reconnect: ReconnectPolicy | None = None,
) -> Iterator[Any]:
    """The caller's console when it passed one (left open), else a console opened for
    the pod here (with the run's ``reconnect`` policy) and closed on the way out,
    whatever happens inside.

    Args:
        handle: the pod.
        private_key: the SSH key, used only when a console is opened here.
        console: an open console to reuse, or None.
        reconnect: how the console opened here waits out a gateway outage.

    Raises:
        ConsoleConnectError: the pod has no SSH endpoint yet (as ``PodConsole.for_pod``).
    """
    if console is not None:
        yield console
        return
    from prefect_runpod.blocks.console.session import PodConsole

    opened = PodConsole.for_pod(handle, private_key, reconnect=reconnect)
    try:
        yield opened
    finally:
        opened.close()


def progress_logger(
    logger: Any,
    what: str,
    interval_seconds: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    also: Callable[[int, int], None] | None = None,
) -> Any:
    """An ``on_progress(done_bytes, total_bytes)`` that logs at most once per
    ``interval_seconds``, the first time once the transfer has run that long: a quick
    transfer logs nothing but its summary, a long one a line every interval. ``also``
    (the caller's own ``on_progress``, e.g. a ``TransferProgress``) sees every call."""
    state = {"next": clock() + interval_seconds}

    def _log(done: int, total: int) -> None:
        if also is not None:
            also(done, total)
        now = clock()
        if now >= state["next"] and done < total:
            frac = done / total if total else 1.0
            logger.info("%s: %d/%d bytes (%.0f%%)", what, done, total, 100 * frac)
            state["next"] = now + interval_seconds

    return _log
