"""RunPod's rate budget: read the ``RateLimit`` headers every REST v2 answer carries and
space requests so they never reach a 429.

RunPod answers every authenticated request with (RunPod's v2 OpenAPI schema, per the
IETF ratelimit-headers draft, as HTTP structured-field lists)::

    RateLimit:        "minute";r=0;t=12, "hour";r=2800;t=1812, "day";r=49500;t=45012
    RateLimit-Policy: "minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400

``r`` is what is left in a window, ``t`` the seconds until it resets, ``q``/``w`` the
quota and the window. A 429 also says ``Retry-After`` (whole seconds).

``RateBudget`` keeps the last answer per window for one account and, before each
request, waits when a window is nearly spent: nothing while more than ``reserve`` of
the quota is left, then the time left spread evenly over what is left, and the whole
reset when nothing is. ``budget_for`` gives one budget per (API base, key) for the whole
process, so every client of one account shares it. Its clock and sleep are injectable:
tests never sleep through a real reset.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import http_sf

__all__ = [
    "RateBudget",
    "WindowState",
    "budget_for",
    "parse_policy",
    "parse_rate_limit",
    "wait_for_429",
]

logger = logging.getLogger("prefect_runpod.runpod")

DEFAULT_RESERVE = 0.1
"""Below this share of a window's quota left, requests are spaced out."""

_BUDGETS: dict[tuple[str, str], RateBudget] = {}
_BUDGETS_LOCK = threading.Lock()


@dataclass
class WindowState:
    """One window as last answered.

    Attributes:
        remaining: requests left (``r``), less those sent since.
        reset_at: when the window resets, on the budget's clock (s).
        quota: the window's quota (``q``), when the policy said it.
        length: the window's length (``w``, s), when the policy said it.
        last_sent: when a request last went out in this window (the budget's clock).
    """

    remaining: int
    reset_at: float
    quota: int | None = None
    length: float | None = None
    last_sent: float | None = None


def _members(value: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The members of a structured-field list header (RFC 8941, via http-sf) as
    ``(name, parameters)``; ``[]`` when it cannot be read (no information, no error)."""
    if not value:
        return []
    try:
        parsed: Any = http_sf.parse(value.encode(), tltype="list")
    except Exception:
        return []
    out = []
    for member in parsed if isinstance(parsed, list) else []:
        if isinstance(member, tuple) and len(member) == 2:
            name, params = member
            if isinstance(name, str) and isinstance(params, dict):
                out.append((name, params))
    return out


def parse_rate_limit(value: str | None) -> dict[str, tuple[int, float]]:
    """``RateLimit`` → window name → ``(remaining r, seconds to reset t)``; windows
    missing ``r`` or ``t`` are left out. An unreadable header gives ``{}``."""
    out = {}
    for name, params in _members(value):
        r, t = params.get("r"), params.get("t")
        if isinstance(r, int) and isinstance(t, int | float):
            out[name] = (r, float(t))
    return out


def parse_policy(value: str | None) -> dict[str, tuple[int, float]]:
    """``RateLimit-Policy`` → window name → ``(quota q, window w seconds)``."""
    out = {}
    for name, params in _members(value):
        q, w = params.get("q"), params.get("w")
        if isinstance(q, int) and isinstance(w, int | float):
            out[name] = (q, float(w))
    return out


def wait_for_429(headers: Mapping[str, str], default_seconds: float = 5.0) -> float:
    """How long a 429 asks to wait (s): the longest ``t`` of a window with ``r=0`` in
    ``RateLimit``, else ``Retry-After``, else ``default_seconds``."""
    spent = [t for r, t in parse_rate_limit(headers.get("RateLimit")).values() if r <= 0]
    if spent:
        return max(spent)
    try:
        return max(0.0, float(headers.get("Retry-After") or ""))
    except ValueError:
        return default_seconds


class RateBudget:
    """The rate budget of one RunPod account (see the module docstring).

    Args:
        clock: monotonic seconds.
        sleep: the sleep function.
        reserve: the share of a window's quota below which requests are spaced.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        reserve: float = DEFAULT_RESERVE,
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.reserve = reserve
        self.windows: dict[str, WindowState] = {}
        self.waited_seconds = 0.0
        """Every wait so far, summed (s)."""
        self._lock = threading.Lock()

    def _roll(self, now: float) -> None:
        """A window past its reset starts again full, for its whole length (what RunPod
        answers next corrects it); one whose policy is unknown is forgotten."""
        for name, window in list(self.windows.items()):
            if now < window.reset_at:
                continue
            if window.quota is None or not window.length:
                del self.windows[name]
            else:
                window.remaining, window.reset_at = window.quota, now + window.length
                window.last_sent = None

    def _delay(self, now: float) -> float:
        """Nothing while a window has more than its reserve left; then the time left
        spread over what is left, counted from the last request sent; the whole reset
        when nothing is left."""
        delay = 0.0
        for window in self.windows.values():
            left = window.reset_at - now
            if window.remaining <= 0:
                delay = max(delay, left)
                continue
            floor = (window.quota or 0) * self.reserve
            if window.remaining <= max(floor, 1) and window.last_sent is not None:
                due = window.last_sent + left / window.remaining
                delay = max(delay, due - now)
        return delay

    def before_request(self, what: str = "a request") -> float:
        """Wait as long as the budget says before sending; returns the wait (s). The
        request is counted when it may go, under the lock, so callers in several threads
        space out too; after a wait the budget is asked again."""
        waited = 0.0
        while True:
            with self._lock:
                now = self.clock()
                self._roll(now)
                delay = self._delay(now)
                if delay <= 0:
                    for window in self.windows.values():
                        window.remaining -= 1
                        window.last_sent = now
                    return waited
            logger.info("RunPod rate budget: waiting %.1f s before %s", delay, what)
            self.waited_seconds += delay
            waited += delay
            self.sleep(delay)

    def after_response(self, headers: Mapping[str, str]) -> None:
        """Take in one answer's ``RateLimit`` / ``RateLimit-Policy``. Within a window
        already known the lower count wins (answers of several threads arrive out of
        order, and requests counted here may not have reached RunPod yet); a later
        reset starts a new window; an earlier one is an answer from a window gone by."""
        limits = parse_rate_limit(headers.get("RateLimit"))
        if not limits:
            return
        policy = parse_policy(headers.get("RateLimit-Policy"))
        with self._lock:
            now = self.clock()
            for name, (remaining, reset) in limits.items():
                quota, length = policy.get(name, (None, None))
                known = self.windows.get(name)
                sent, reset_at = None, now + reset
                if known is not None and now < known.reset_at:
                    if reset_at < known.reset_at - 1:  # an answer from a window gone by
                        continue
                    if reset_at <= known.reset_at + 1:  # this window: the lower count wins
                        remaining, sent = min(remaining, known.remaining), known.last_sent
                self.windows[name] = WindowState(remaining, reset_at, quota, length, sent)

    def wait_429(self, headers: Mapping[str, str], what: str) -> float:
        """After a 429: take in its headers, then wait as RunPod asked; returns the wait
        (s). The wait is logged."""
        self.after_response(headers)
        delay = wait_for_429(headers)
        logger.warning("RunPod answered 429 to %s: waiting %.0f s as it asked", what, delay)
        self.waited_seconds += delay
        self.sleep(delay)
        return delay


def budget_for(base_url: str, api_key: str) -> RateBudget:
    """The process-wide budget of the account behind ``api_key`` at ``base_url`` (keyed
    by a hash of the key, never the key)."""
    key = (base_url, hashlib.sha256(api_key.encode()).hexdigest()[:16])
    with _BUDGETS_LOCK:
        if key not in _BUDGETS:
            _BUDGETS[key] = RateBudget()
        return _BUDGETS[key]
