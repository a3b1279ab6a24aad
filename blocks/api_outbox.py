"""The run's writes to the Prefect API, held through an outage (docs/architecture.md#prefect-surface).

Prefect's API is the run's bookkeeping, never its work: an outage must not fail a stage,
stall the training log's follower or lose the model. Every artifact, and the
``finetune-costs`` record, a run writes goes through one ``ApiOutbox``, and so does every
``finetune-costs`` version written from outside the run (its hooks, the reaper, the
guardian, the worker, the CLI):

- ``put`` queues the write and returns at once (it never blocks and never raises); a
  background thread writes the queue in order, each write with a client of its own, so a
  refused connection fails in milliseconds instead of inside Prefect's retries of a
  connection that once worked (about a minute);
- a write that meets an outage (no connection, a timeout, a 5xx, 408 or 429) stays at
  the head of the queue and is tried again with a growing pause; the outage is said once
  on the terminal when it starts and once when it ends, with how many writes it held;
- a write the API refuses (another 4xx) or one that did not fit (the queue holds
  ``capacity`` writes; a progress update replaces the one still queued instead of
  adding to it) is named in ``unwritten``;
- ``flush`` waits until everything held is written or the API is found down (a stage
  that wants its artifact in Prefect before it ends, as long as Prefect answers), and
  ``wait_for`` the same for one write;
  ``drain`` waits until everything held is written or a deadline passes; ``finish``, at
  a process's end, drains for ``hold_seconds()`` and says what became of the writes
  (an ``atexit`` hook does it for a process that did not).

``outbox()`` is the process's outbox; ``fresh_client()`` is the client every write and
every quick read of the run uses. A write queued inside a flow or task run keeps that
run's context (settings, run ids) for when it is written.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "DEFAULT_CAPACITY",
    "api_down",
    "DEFAULT_FLUSH_SECONDS",
    "DEFAULT_HOLD_SECONDS",
    "HOLD_SECONDS_ENV",
    "ApiOutbox",
    "Held",
    "fresh_client",
    "hold_seconds",
    "is_outage",
    "outbox",
]

DEFAULT_CAPACITY = 512
"""How many writes the outbox holds at most (a run writes a few dozen)."""

DEFAULT_HOLD_SECONDS = 120.0
"""How long a process waits at its end for the API to come back (``hold_seconds``)."""
HOLD_SECONDS_ENV = "PREFECT_RUNPOD_API_HOLD_SECONDS"

DEFAULT_FLUSH_SECONDS = 10.0
"""How long ``flush`` waits at most for a Prefect that answers slowly."""

_FIRST_PAUSE_SECONDS = 0.5
_MAX_PAUSE_SECONDS = 10.0
_OUTAGE_CODES = {408, 429, 500, 502, 503, 504}

_say_log = logging.getLogger("prefect.prefect_runpod.api")
"""A child of ``prefect``: Prefect's console handler shows it, and it is never sent to the
API it talks about."""


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means the Prefect API could not be reached or answered as a
    server that is down or overloaded (worth trying again later); False for an answer
    that refuses the write itself."""
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError

    if isinstance(exc, httpx.TransportError | OSError):
        return True
    if isinstance(exc, PrefectHTTPStatusError | httpx.HTTPStatusError):
        return exc.response.status_code in _OUTAGE_CODES
    return False


@contextlib.contextmanager
def fresh_client(timeout_seconds: float = 30.0) -> Iterator[Any]:
    """A ``SyncPrefectClient`` of its own (not the flow engine's shared client, which
    retries a refused connection for about a minute once it has connected), for the
    current settings; context-managed."""
    from prefect.client.orchestration import get_client

    with get_client(httpx_settings={"timeout": timeout_seconds}, sync_client=True) as client:
        yield client


@dataclass
class Held:
    """One write waiting in the outbox.

    Attributes:
        what: what it writes, as the terminal names it (``artifact checksum-manifest``).
        write: called with a fresh client; its return value is kept in ``result``.
        coalesce: a key: a later write with the same key replaces this one while queued.
        done: set once written (or given up: ``error`` says why).
    """

    what: str
    write: Callable[[Any], object]
    coalesce: str | None = None
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: str | None = None

    def wait(self, timeout_seconds: float) -> bool:
        """True when the write was made within ``timeout_seconds``."""
        return self.done.wait(timeout_seconds) and self.error is None


class ApiOutbox:
    """A bounded queue of Prefect API writes and the thread that writes it (see the
    module docstring).

    Args:
        capacity: the most writes held at once; one more is refused (``unwritten``).
        say: where the outage's start and end are told (default: a WARNING record on
            the terminal through Prefect's console handler).
        first_pause_seconds / max_pause_seconds: the pause between tries during an
            outage, doubling from the first to the most.
    """

    def __init__(
        self,
        *,
        capacity: int = DEFAULT_CAPACITY,
        say: Callable[[str], None] | None = None,
        first_pause_seconds: float = _FIRST_PAUSE_SECONDS,
        max_pause_seconds: float = _MAX_PAUSE_SECONDS,
    ) -> None:
        self.capacity = capacity
        self._say = say or _say_log.warning
        self._first_pause, self._max_pause = first_pause_seconds, max_pause_seconds
        self._queue: deque[Held] = deque()
        self._busy: Held | None = None
        self._cond = threading.Condition()
        self._told = threading.Lock()  # the outage's start and end, each told once
        self._thread: threading.Thread | None = None
        self._closed = False
        self.down_since: datetime | None = None
        """When the current outage began (None: the API answers)."""
        self.down_reason = ""
        self.unwritten: list[str] = []
        """Writes given up: refused by the API, or not held (the queue was full)."""
        self.outages = 0
        """How many outages this outbox has seen end or begin."""

    # -- the caller's side -------------------------------------------------------------

    def put(
        self, what: str, write: Callable[[Any], object], *, coalesce: str | None = None
    ) -> Held:
        """Queue ``write`` (called later with a fresh client); returns at once, never
        raises. A queued write with the same ``coalesce`` key is replaced (its place in
        the queue kept). A full queue refuses the write: it is named in ``unwritten``
        and the returned ``Held`` is done with an ``error``."""
        held = Held(what=what, write=write, coalesce=coalesce)
        with self._cond:
            if coalesce is not None:
                for i, queued in enumerate(self._queue):
                    if queued.coalesce == coalesce:
                        queued.error = "replaced by a later write"
                        queued.done.set()
                        self._queue[i] = held
                        return held
            if len(self._queue) + (self._busy is not None) >= self.capacity:
                held.error = f"not held: {self.capacity} writes were waiting already"
                self.unwritten.append(f"{what} ({held.error})")
                held.done.set()
                return held
            self._queue.append(held)
            self._start()
            self._cond.notify_all()
        return held

    @property
    def held(self) -> list[str]:
        """What is waiting to be written, oldest first (the one being written included)."""
        with self._cond:
            busy = [self._busy.what] if self._busy is not None else []
            return busy + [h.what for h in self._queue]

    def drain(self, timeout_seconds: float) -> list[str]:
        """Wait until every held write is written or ``timeout_seconds`` pass (meanwhile
        the write at the head is tried every second, not after the outage's longer
        pause); returns what is still held, oldest first (empty: all written)."""
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        with self._cond:
            while self._queue or self._busy is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.notify_all()  # a writer pausing for an outage tries again now
                self._cond.wait(min(left, 1.0))
        return self.held

    def flush(self, timeout_seconds: float = DEFAULT_FLUSH_SECONDS) -> list[str]:
        """Wait until every held write is written, the API is found down, or
        ``timeout_seconds`` pass, whichever comes first: a writer that wants its records
        in Prefect before it goes on, as long as Prefect answers. Returns what is still
        held."""
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        with self._cond:
            while (self._queue or self._busy is not None) and self.down_since is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
        return self.held

    def wait_for(self, held: Held, timeout_seconds: float = DEFAULT_FLUSH_SECONDS) -> bool:
        """Wait until ``held`` is written (True), given up, the API is found down or
        ``timeout_seconds`` pass (False: still held, or ``held.error`` says why not): a
        writer outside the run (a hook, the reaper, the guardian, the worker) that wants
        its record in Prefect before it goes on, as long as Prefect answers."""
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        with self._cond:
            while not held.done.is_set() and self.down_since is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
        return held.done.is_set() and held.error is None

    def finish(self, timeout_seconds: float | None = None) -> list[str]:
        """The end of a process that wrote through the outbox: when writes are still
        held, say so, wait for the API up to ``timeout_seconds`` (default:
        ``hold_seconds()``), and say what became of them. Returns every write that could
        not be written (still held, refused, or not held), one phrase each; empty when
        Prefect has everything."""
        held = self.held
        timeout = hold_seconds() if timeout_seconds is None else timeout_seconds
        left: list[str] = []
        if held:
            self._say(
                f"{_count(len(held), 'write')} to the Prefect API still held "
                f"({_names(held)}); waiting up to {timeout:.0f} s for it to come back"
            )
            left = self.drain(timeout)
            if left:
                self._say(
                    f"the Prefect API did not come back within {timeout:.0f} s: "
                    f"{_names(left)} could not be written"
                )
            else:
                self._say(f"the Prefect API has the {_count(len(held), 'held write')} now")
        lost = [f"{w} (not written)" for w in left] + list(self.unwritten)
        if self.unwritten:
            self._say(f"not written to the Prefect API: {'; '.join(self.unwritten)}")
        return lost

    def close(self) -> None:
        """Stop the writer thread once it is idle (what is still queued stays unwritten)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the writer's side -------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(
                target=self._serve, name="prefect-api-outbox", daemon=True
            )
            self._thread.start()

    def _serve(self) -> None:
        pause = self._first_pause
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                self._busy = self._queue.popleft()
            item = self._busy
            try:
                item.result = item.context.run(_write_with_fresh_client, item.write)
            except Exception as exc:
                if is_outage(exc):
                    self.went_down(exc)
                    with self._cond:
                        if item.coalesce is None or not any(
                            q.coalesce == item.coalesce for q in self._queue
                        ):
                            self._queue.appendleft(item)  # tried again first
                        else:
                            item.error = "replaced by a later write"
                            item.done.set()
                        self._busy = None
                        self._cond.notify_all()
                        self._cond.wait(pause)
                    pause = min(pause * 2, self._max_pause)
                    continue
                item.error = _short(exc)
                self.unwritten.append(f"{item.what} (refused: {item.error})")
                _say_log.warning("the Prefect API refused %s: %s", item.what, item.error)
            else:
                self.came_back()
            pause = self._first_pause
            with self._cond:
                item.done.set()
                self._busy = None
                self._cond.notify_all()

    def went_down(self, exc: BaseException) -> None:
        """The API met an outage (a write, or ``blocks.api_probe``): told once, as it starts."""
        with self._told:
            if self.down_since is not None:
                return
            self.down_since, self.down_reason = datetime.now(UTC), _short(exc)
            self.outages += 1
        self._say(
            f"the Prefect API does not answer ({self.down_reason}): the run goes on; its "
            f"records for Prefect ({len(self.held)} so far) are held here until it answers"
        )

    def came_back(self) -> None:
        """The API answered (a write, or a probe): the outage's end, told once."""
        with self._told:
            if self.down_since is None:
                return
            seconds = (datetime.now(UTC) - self.down_since).total_seconds()
            self.down_since = None
        self._say(
            f"the Prefect API answers again after {seconds:.0f} s: writing the "
            f"{_count(len(self.held), 'record')} held meanwhile"
        )


def hold_seconds() -> float:
    """How long a process waits at its end for the Prefect API to take what it holds:
    ``PREFECT_RUNPOD_API_HOLD_SECONDS`` (default 120 s)."""
    import os

    try:
        return max(0.0, float(os.environ.get(HOLD_SECONDS_ENV, DEFAULT_HOLD_SECONDS)))
    except ValueError:
        return DEFAULT_HOLD_SECONDS


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _names(whats: list[str]) -> str:
    shown = ", ".join(dict.fromkeys(whats[:8]))
    return shown + (f" and {len(whats) - 8} more" if len(whats) > 8 else "")


def _write_with_fresh_client(write: Callable[[Any], object]) -> object:
    with fresh_client() as client:
        return write(client)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")[:200]


_OUTBOX: ApiOutbox | None = None
_OUTBOX_LOCK = threading.Lock()


def outbox() -> ApiOutbox:
    """The process's outbox (made on first use)."""
    global _OUTBOX
    with _OUTBOX_LOCK:
        if _OUTBOX is None:
            _OUTBOX = ApiOutbox()
            atexit.register(_finish_at_exit)
        return _OUTBOX


def api_down() -> bool:
    """True while the process's outbox finds the Prefect API down (False when this
    process never wrote through it)."""
    return _OUTBOX is not None and _OUTBOX.down_since is not None


def _finish_at_exit() -> None:
    """A process that ends with writes held (a served run, a script) gives the API its
    ``hold_seconds()`` to take them; the CLI has finished already and holds nothing."""
    if _OUTBOX is not None and _OUTBOX.held:
        with contextlib.suppress(BaseException):
            _OUTBOX.finish()
