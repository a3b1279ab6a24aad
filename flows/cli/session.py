"""The ``prefect-runpod`` process around a command: a temporary Prefect server of its own
when no API is configured, and SIGTERM / Ctrl-C turned into an orderly end.

- **The temporary server.** Without ``PREFECT_API_URL`` Prefect would start its
  temporary server as a child in the CLI's own process group: a Ctrl-C in the terminal
  (or a signal to the group) then kills the server first, and the run can no longer
  report its end. Here the same server (Prefect's ``SubprocessASGIServer``) is started
  in a session of its own and stopped when the command ends — by a signal too.
- **Signals.** Prefect turns a SIGTERM during a flow run into a crash of the run, then
  sends the signal again to the handler it found: the Python default would kill the
  process on the spot, leaving the server orphaned. ``orderly_signals`` installs a
  handler that raises ``Terminated`` instead, so the command prints the run's summary
  and stops the server.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any
from unittest import mock

__all__ = [
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "Terminated",
    "drain_prefect_workers",
    "orderly_signals",
    "temporary_server",
]

EXIT_SIGTERM = 128 + signal.SIGTERM
"""The exit status after a SIGTERM (143), as a shell reports a process it ended."""
EXIT_SIGINT = 128 + signal.SIGINT
"""The exit status after Ctrl-C (130)."""


class Terminated(BaseException):
    """Raised in the main thread when the CLI receives SIGTERM (a ``BaseException``, like
    ``KeyboardInterrupt``, so no ``except Exception`` swallows it)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


@contextlib.contextmanager
def orderly_signals() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` in the main thread (Ctrl-C already
    raises ``KeyboardInterrupt``); the previous handler comes back afterwards. Outside
    the main thread (the CLI called from a thread) signals are left as they are."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: Python delivers signals there only
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def drain_prefect_workers() -> None:
    """Send this process's queued logs and events to the API while it is still there
    (else they retry against a stopped server at exit, for minutes), as Prefect's own
    test harness does."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            logs: Any = APILogWorker.instance().drain()
            if inspect.isawaitable(logs):
                await logs
        except RuntimeError:
            pass  # never started
        events: Any = EventsWorker.drain_all()
        if inspect.isawaitable(events):
            await events

    run_coro_as_sync(drain())


@contextlib.contextmanager
def temporary_server(startup_timeout_seconds: float) -> Iterator[str | None]:
    """Prefect's temporary API server in a session of its own, for the block, unless an
    API is configured (then nothing is started and None is yielded).

    Yields:
        The server's API URL (also set as ``PREFECT_API_URL`` within the block).

    Raises:
        RuntimeError: the server did not answer within ``startup_timeout_seconds``.
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield None
        return
    server = SubprocessASGIServer()
    # Prefect starts the server with subprocess.Popen; give the child its own session so
    # that a signal to the CLI's process group does not end it before the run does.
    own_session = functools.partial(subprocess.Popen, start_new_session=True)
    try:
        with mock.patch.object(subprocess, "Popen", own_session):
            server.start(timeout=int(startup_timeout_seconds))
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:
                with contextlib.suppress(Exception):
                    drain_prefect_workers()
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        sys.stderr.flush()
