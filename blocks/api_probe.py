"""A Prefect API outage told while it lasts, from whatever stage it starts in
(docs/architecture.md#prefect-surface).

The outbox (``blocks.api_outbox``) notices an outage when one of its writes meets it.
A stage that writes nothing for a while — an upload, the env stage, a pod coming up —
would leave an outage that starts in it untold until a later stage's first write. The
run's boundaries therefore call :func:`probe_api`: the end of every stage
(``flows.run.ledger.run_stage``) and every confirmed chunk of a transfer
(``blocks.transfer.models.TransferProgress``). At each stage's end, at most once per
``PROBE_INTERVAL_SECONDS`` for chunks, and only while the outbox holds no write (a held
write finds the outage, and its end, itself), it starts one health check of the API on a
thread of its own (a check asked for while one runs follows it there) — the caller, a transfer's lane among them, only reads a clock — and
tells the outbox what it found: an outage (``ApiOutbox.went_down``, told once as it
starts) or an answer during one (``ApiOutbox.came_back``, its end told once).

Only a run switches the probe on (:func:`watch_api`, called by the fine-tune flow with
its context, so the check asks the run's API); anywhere else — a stage's unit test, a
transfer outside a run — :func:`probe_api` does nothing.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

from prefect_runpod.blocks.api_outbox import ApiOutbox, is_outage, outbox

__all__ = ["PROBE_INTERVAL_SECONDS", "PROBE_TIMEOUT_SECONDS", "ApiProbe", "probe_api", "watch_api"]

PROBE_INTERVAL_SECONDS = 2.0
"""The shortest time between two health checks (s)."""
PROBE_TIMEOUT_SECONDS = 5.0
"""How long one health check waits for the API (s)."""


def _health_problem(timeout_seconds: float) -> BaseException | None:
    """What Prefect's health check of the current API met, None when it answered."""
    from prefect_runpod.blocks.api_outbox import fresh_client

    try:
        with fresh_client(timeout_seconds) as client:
            problem: BaseException | None = client.api_healthcheck()
    except Exception as exc:  # the client could not even be opened
        problem = exc
    return problem


class ApiProbe:
    """The run's health check of the Prefect API at its boundaries (see the module).

    Args:
        box: the outbox told what the check found.
        context: the context the check runs in (the run's settings: its API URL).
        interval_seconds: the shortest time between two checks a chunk asks for.
        check: runs one check, returns the problem met or None (default: Prefect's
            health check with a fresh client, ``PROBE_TIMEOUT_SECONDS``).
        clock: seconds, monotonic.
    """

    def __init__(
        self,
        box: ApiOutbox,
        context: contextvars.Context,
        *,
        interval_seconds: float = PROBE_INTERVAL_SECONDS,
        check: Callable[[], BaseException | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.box, self._context = box, context
        self.interval_seconds = interval_seconds
        self._check = check or (lambda: _health_problem(PROBE_TIMEOUT_SECONDS))
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = False
        self._again = False
        self._last: float | None = None
        self.checks = 0
        """Health checks made or started so far."""

    def __call__(self, *, now: bool = False) -> threading.Thread | None:
        """Start a health check when one is due: at once with ``now`` (a stage's end),
        else once the interval has passed since the last (a chunk). Returns the check's
        thread; None when none started: the outbox holds writes, none is due, or one
        runs already (a check asked ``now`` then follows it on its thread). Never
        blocks, never raises."""
        at = self._clock()
        with self._lock:
            due = now or self._last is None or at - self._last >= self.interval_seconds
            if not due or self.box.held:
                return None
            if self._busy:
                self._again = self._again or now
                return None
            self._busy, self._last = True, at
            self.checks += 1
        thread = threading.Thread(target=self._run, name="prefect-api-probe", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while True:
            try:
                problem = self._context.copy().run(self._check)
            except Exception as exc:  # a check that failed in itself tells nothing
                problem = exc if is_outage(exc) else None
            if problem is None:
                self.box.came_back()
            elif is_outage(problem):
                self.box.went_down(problem)
            with self._lock:
                if not self._again:
                    self._busy = False
                    return
                self._again, self._last = False, self._clock()
                self.checks += 1


_PROBE: ApiProbe | None = None


def watch_api() -> ApiProbe:
    """Switch the probe on for this process's run, in the caller's context (the flow's:
    its settings name the run's API); returns it."""
    global _PROBE
    _PROBE = ApiProbe(outbox(), contextvars.copy_context())
    return _PROBE


def probe_api(*, now: bool = False) -> None:
    """A boundary of the run: a health check of the API when one is due — at once with
    ``now`` (a stage's end), else at most once per ``PROBE_INTERVAL_SECONDS`` (a chunk);
    nothing when no run switched the probe on. Never blocks, never raises."""
    probe = _PROBE
    if probe is not None:
        probe(now=now)
