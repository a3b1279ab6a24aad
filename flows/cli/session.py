"""The ``prefect-runpod`` process around a command: the Prefect API it talks to, and
SIGTERM / Ctrl-C turned into an orderly end.

- **Which API.** ``prefect_api`` opens, for a command that needs one, the configured API
  (``PREFECT_API_URL`` in the environment or the active Prefect profile: always first,
  nothing is started), else the local server prefect-runpod keeps in the background
  (``flows.cli.local_server``: started on first use, reused after), else — with
  ``--ephemeral`` or ``PREFECT_RUNPOD_EPHEMERAL=1`` — a temporary server for the command
  alone. Whichever it is, the process's queued logs and events are sent before the block
  ends, so nothing waits at exit.
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
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from prefect_runpod.blocks.interrupts import end_stops, note_stop

__all__ = [
    "EPHEMERAL_VAR",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "Terminated",
    "api_mode",
    "check_prefect_api",
    "drain_prefect_workers",
    "orderly_signals",
    "pause_collector",
    "prefect_api",
    "resume_collector",
    "temporary_server",
]

EPHEMERAL_VAR = "PREFECT_RUNPOD_EPHEMERAL"
"""Set to ``1`` (or ``true``) for a temporary server per command instead of the local
server prefect-runpod keeps (the same as ``--ephemeral``)."""
_modes: list[tuple[bool, bool]] = [(False, False)]
"""``(ephemeral, check_api)`` of the innermost ``api_mode`` block."""

EXIT_SIGTERM = 128 + signal.SIGTERM
"""The exit status after a SIGTERM (143), as a shell reports a process it ended."""
EXIT_SIGINT = 128 + signal.SIGINT
"""The exit status after Ctrl-C (130)."""


class Terminated(BaseException):
    """Raised in the main thread when the CLI receives SIGTERM (a ``BaseException``, like
    ``KeyboardInterrupt``, so no ``except Exception`` swallows it)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    # noted, to be raised again at a boundary if this one is dropped; a stop under way
    # already (the budget cap's, an earlier signal's) keeps its reason and goes on
    if note_stop(lambda: Terminated(name)):
        raise Terminated(name)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    if note_stop(KeyboardInterrupt):  # as for SIGTERM: the first stop wins
        raise KeyboardInterrupt


@contextlib.contextmanager
def orderly_signals() -> Iterator[None]:
    """Within the block, SIGTERM raises ``Terminated`` and Ctrl-C ``KeyboardInterrupt`` in
    the main thread, each also noted in ``blocks.interrupts`` so that a waiting loop raises
    it again should the garbage collector have dropped the first; a signal that comes
    while a stop is under way (the budget cap's, an earlier signal's) raises nothing: the
    first reason wins. The previous handlers come back afterwards. Outside the main thread (the CLI called from a thread) signals
    are left as they are."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: Python delivers signals there only
        yield
        return
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        end_stops()


def drain_prefect_workers() -> None:
    """Send this process's queued logs and events to the API while it is still there
    (else they retry against a stopped server at exit, for minutes, or keep the process
    waiting), as Prefect's own test harness does. Only workers that started are drained:
    none is started here (a look-up that logged nothing returns at once)."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for service in (APILogWorker, EventsWorker):
            drained: Any = service.drain_all()
            if inspect.isawaitable(drained):
                await drained

    run_coro_as_sync(drain())


@contextlib.contextmanager
def api_mode(*, ephemeral: bool, check_api: bool = False) -> Iterator[None]:
    """Within the block, ``prefect_api`` starts a temporary server (``ephemeral``, or
    ``PREFECT_RUNPOD_EPHEMERAL`` set) instead of using the local server, and with
    ``check_api`` holds a configured API to its health check before using it."""
    wanted = ephemeral or os.environ.get(EPHEMERAL_VAR, "").strip().lower() in ("1", "true", "yes")
    _modes.append((wanted, check_api))
    try:
        yield
    finally:
        _modes.pop()


def _temporary_server_settings() -> dict[Any, Any]:
    """What prefect-runpod changes in Prefect's defaults for a temporary server: a start
    deadline long enough for a busy small machine (Prefect's 20 s is not), and no
    telemetry. (The local server gets its own settings in its environment.)"""
    from prefect.settings import get_current_settings

    defaults: dict[Any, Any] = {}
    if "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in os.environ:
        timeout = max(get_current_settings().server.ephemeral.startup_timeout_seconds, 120)
        defaults["server.ephemeral.startup_timeout_seconds"] = timeout
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        defaults["server.analytics_enabled"] = False
    return defaults


_collector_paused = False
"""True while ``pause_collector`` holds the cyclic garbage collector off."""


def pause_collector() -> None:
    """Hold Python's cyclic garbage collector off while a command loads its modules:
    importing Prefect, pydantic and the flow allocates hundreds of thousands of objects
    and triggers about 340 collections that find nothing to free (0.09 s of a 1.1 s
    import, measured on the demo). ``resume_collector`` turns it back on. For the
    ``prefect-runpod`` process only (``console_main``); ``main``'s in-process callers keep
    their collector as it is."""
    global _collector_paused
    if gc.isenabled():
        gc.disable()
        _collector_paused = True


def resume_collector() -> None:
    """Turn the collector paused by ``pause_collector`` back on, with what was loaded so
    far moved out of its sight (``gc.freeze``): modules and their classes live as long as
    the process, and leaving them out makes each later full collection of a long run walk
    only what the run itself made (the demo's collections: 0.11 s -> 0.04 s). A no-op
    when nothing was paused."""
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """The Prefect API for a command that needs one, opened only once its input passed:
    the configured one, else the local server (started on first use), else with
    ``--ephemeral`` a temporary one (see the module's docstring). Prefect and the
    command's modules are loaded by then: the collector paused for the imports comes
    back on here (``resume_collector``).

    Yields:
        The API URL (set as ``PREFECT_API_URL`` in Prefect's settings within the block).

    Raises:
        SecretShapeError: ``PREFECT_API_KEY`` holds whitespace or a control character.
        SpecError: Prefect's home cannot be made, or (with ``check_api``) the configured
            API is malformed or does not answer.
        ServerStartError: the local server did not start (its log is named).
        RuntimeError: the temporary server did not answer in time.
    """
    with _opened_api() as url:
        resume_collector()
        yield url


@contextlib.contextmanager
def _opened_api() -> Iterator[str]:
    prefect_settings()  # before anything else of Prefect: settings it cannot read, said
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    from prefect_runpod.blocks.secret_mask import check_prefect_api_key
    from prefect_runpod.flows.cli.arguments import make_prefect_home

    settings = prefect_settings(get_current_settings)
    make_prefect_home(settings.home)  # a profile may name another home than the environment
    check_prefect_api_key()  # before anything talks to the API with it
    ephemeral, check_api = _modes[-1]
    configured = settings.api.url
    if configured:  # nothing to start; no settings copied (that costs a look-up 0.1-0.2 s)
        if check_api:
            check_prefect_api()
        with _drained():
            yield str(configured)
        return
    if ephemeral:
        with temporary_settings(updates=_temporary_server_settings()):
            timeout = get_current_settings().server.ephemeral.startup_timeout_seconds
            with temporary_server(timeout) as url:
                assert url is not None
                yield url
        return
    from prefect_runpod.flows.cli.arguments import make_home
    from prefect_runpod.flows.cli.local_server import ensure_server, server_home

    make_home(server_home(), "the Prefect server's home", "PREFECT_RUNPOD_HOME")
    record = ensure_server(say=lambda line: print(line, file=sys.stderr, flush=True))
    with temporary_settings(updates={PREFECT_API_URL: record.api_url}), _drained():
        yield record.api_url


def check_prefect_api() -> None:
    """The configured Prefect API (``PREFECT_API_URL``) is a URL and answers its health
    check (Prefect's own ``api_healthcheck``); nothing to check when none is configured
    (the CLI then starts or reuses its local server).

    Raises:
        SpecError: a malformed URL, or an API that does not answer, in one sentence.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    from prefect_runpod.blocks.exceptions import SpecError
    from prefect_runpod.blocks.validation import check_url

    url = get_current_settings().api.url
    if not url:
        return
    check_url(url, "PREFECT_API_URL", example="http://127.0.0.1:4200/api")
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        reason = str(problem).splitlines()[0] if str(problem) else type(problem).__name__
        raise SpecError(
            f"the Prefect API at {url} cannot be reached ({reason}): start it (prefect "
            "server start), or fix or unset PREFECT_API_URL."
        )


def prefect_settings(load: Any = None) -> Any:
    """Prefect's current settings, or one sentence when Prefect cannot read them.

    A ``PREFECT_*`` variable Prefect cannot parse (``PREFECT_API_REQUEST_TIMEOUT=abc``)
    fails the load of its settings, which Prefect's own import already attempts and
    reports on stderr ("Failed to initialize plugins: …") before the traceback. The first
    import is made here with that report held back, so the command says the problem once.

    Args:
        load: what loads the settings (default: ``prefect.settings.get_current_settings``).

    Returns:
        The settings object.

    Raises:
        SpecError: a setting Prefect cannot read, named, with what is wrong with it.
    """
    import io

    from pydantic import ValidationError

    from prefect_runpod.blocks.exceptions import SpecError

    held = io.StringIO()
    first = "prefect" not in sys.modules
    try:
        with contextlib.redirect_stderr(held) if first else contextlib.nullcontext():
            if load is None:
                from prefect.settings import get_current_settings as load
            settings = load()
    except ValidationError as exc:
        problems = "; ".join(
            f"{_setting_name(e['loc'])} {e['input']!r}: {e['msg']}"
            for e in exc.errors()
            if e["type"] != "default_factory_not_called"  # a consequence, not a cause
        )
        raise SpecError(
            f"Prefect cannot read its settings ({problems}): fix or unset it."
        ) from None
    sys.stderr.write(held.getvalue())
    return settings


def _setting_name(loc: tuple[Any, ...]) -> str:
    """The ``PREFECT_…`` variable set in the environment that a settings error's location
    names (Prefect's nested models give only the last part: ``request_timeout`` for
    ``PREFECT_API_REQUEST_TIMEOUT``), else the location as written."""
    field = "_".join(str(p) for p in loc).upper()
    found = [k for k in os.environ if k.startswith("PREFECT_") and k.endswith(f"_{field}")]
    return found[0] if len(found) == 1 else ".".join(str(p) for p in loc) or "a setting"


@contextlib.contextmanager
def _drained() -> Iterator[None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            drain_prefect_workers()


@contextlib.contextmanager
def temporary_server(startup_timeout_seconds: float) -> Iterator[str | None]:
    """Prefect's temporary API server in a session of its own, for the block, unless an
    API is configured (then nothing is started and None is yielded).

    Yields:
        The server's API URL (also set as ``PREFECT_API_URL`` within the block).

    Raises:
        RuntimeError: the server did not answer within ``startup_timeout_seconds``.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield None
        return
    from unittest import mock

    from prefect.server.api.server import SubprocessASGIServer

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
