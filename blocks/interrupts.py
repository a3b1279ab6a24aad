"""A stop that a signal (or the run's budget watch) asked for, kept until a boundary acts
on it.

Python raises a signal handler's exception at the next bytecode boundary of the main
thread. When that boundary lies inside a weakref callback or a ``__del__`` run by the
garbage collector, CPython reports the exception as unraisable and drops it, so a Ctrl-C
can vanish and the run go on. The CLI's handlers therefore note the stop here before
raising, and the boundaries of a run call :func:`raise_if_stopped`: each step of a
waiting loop (a training poll, a paused fault point), each transfer chunk and the start
and end of every stage but terminate. A stop that was dropped is raised again there;
one that was raised is forgotten once a stage records it (:func:`clear_stop`).

The budget cap and the signals share one slot, and the first reason wins: once a stop
is noted (or the budget's own check raised one, :func:`claim_stop`), it is the stop under
way until the run ends (:func:`end_stops`). A later one — a Ctrl-C while the run stops
for its budget cap, the cap reached while a Ctrl-C ends the pod — changes neither the
exception raised nor the run's reason; it is only remembered, so the CLI can say it came
(:func:`stop_words`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

__all__ = [
    "claim_stop",
    "clear_stop",
    "end_stops",
    "forget_stop",
    "note_stop",
    "raise_if_stopped",
    "stop_pending",
    "stop_under_way",
    "stop_words",
    "stops_sentence",
]

Stop = Callable[[], BaseException]
"""What builds a stop's exception (``KeyboardInterrupt``, a ``functools.partial`` of
``BudgetExceededError``…)."""

_lock = threading.Lock()
_pending: Stop | None = None
"""The stop a boundary raises next (None: none asked for, or raised already)."""
_first: Stop | None = None
"""The stop under way: the first noted or claimed since the run began."""
_later: list[Stop] = []
"""Stops asked for while the first was under way, in order (they changed nothing)."""


def note_stop(make: Stop) -> bool:
    """Record a stop: ``make()`` builds the exception a boundary raises
    (``KeyboardInterrupt`` for Ctrl-C, the CLI's ``Terminated`` for SIGTERM,
    ``BudgetExceededError`` once the budget watch finds the cap reached).

    Returns:
        True when it is the run's stop; False when another stop was under way already:
        that one keeps its reason (the first wins), this one is only remembered.
    """
    global _pending, _first
    with _lock:
        if _first is not None:
            if make is not _first and make not in _later:
                _later.append(make)
            return False
        _first = _pending = make
        return True


def claim_stop(make: Stop) -> bool:
    """Record a stop its caller raises at once (the budget's own check at a stage
    boundary or a training poll) as the stop under way, unless one is already.

    Returns:
        True when the caller's stop is the run's; False when another came first (the
        caller then leaves it to that one and raises nothing of its own).
    """
    global _first
    with _lock:
        if _first is not None:
            if make is not _first and make not in _later:
                _later.append(make)
            return False
        _first = make
        return True


def stop_pending() -> bool:
    """Whether a signal asked the process to stop and no boundary has raised it yet."""
    return _pending is not None


def stop_under_way() -> bool:
    """Whether a stop was noted or claimed and the run has not ended since."""
    return _first is not None


def raise_if_stopped() -> None:
    """Raise the pending stop once, at a boundary. Only the main thread raises it (where
    Python delivers signals); a transfer lane's thread leaves it pending for the main one.

    Raises:
        BaseException: what :func:`note_stop` was given (``KeyboardInterrupt`` …).
    """
    global _pending
    if _pending is None or threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        make, _pending = _pending, None
    if make is not None:
        raise make()


def clear_stop() -> None:
    """Forget a pending stop (acted on); the stop stays the one under way."""
    global _pending
    with _lock:
        _pending = None


def forget_stop(make: Stop) -> None:
    """Forget the pending stop only when it is the one ``make`` noted and no boundary
    raised it (the budget watch of a run that ended): a stop a signal asked for
    meanwhile stays pending, and a stop already raised stays the one under way."""
    global _pending, _first
    with _lock:
        if _pending is make:
            _pending = None
            if _first is make:
                _first = None


def end_stops(*, keep_pending: bool = False) -> tuple[Stop | None, list[Stop]]:
    """The run's end (or a new run's start): forget the stop under way and the later ones.

    Args:
        keep_pending: keep a stop no boundary raised yet (a run that starts keeps a
            Ctrl-C the collector dropped just before): it stays the one under way.

    Returns:
        The stop that was under way (None: none) and those that came during it.
    """
    global _pending, _first
    with _lock:
        first, later = _first, list(_later)
        _later.clear()
        if keep_pending and _pending is not None:
            _first = _pending
        else:
            _pending = _first = None
    return first, later


def stop_words(make: Stop) -> str:
    """A stop in a few words for a sentence: ``Ctrl-C``, ``SIGTERM``, or the first
    clause of the exception's text (``the budget cap (projected spend … reached
    max_cost_usd …)``)."""
    exc = make()
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C"
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if first.startswith("SIG"):
        return first
    if type(exc).__name__ == "BudgetExceededError":
        cap = re.search(r"max_cost_usd [0-9.]+ USD|runtime cap of \S+ s", first)
        return f"the budget cap ({cap.group(0)})" if cap else "the budget cap"
    return first or type(exc).__name__


def stops_sentence(first: Stop | None, later: list[Stop]) -> str | None:
    """The CLI's sentence for stops that came while another was under way (what
    :func:`end_stops` returned), e.g. ``Ctrl-C came while the run was already stopping
    for the budget cap (max_cost_usd 0.0500 USD): the first reason stands, the stop
    went on unchanged``; None when nothing came during the stop."""
    if first is None or not later:
        return None
    words = list(dict.fromkeys(stop_words(make) for make in later))
    return (
        f"{' and '.join(words)} came while the run was already stopping for "
        f"{stop_words(first)}: the first reason stands, the stop went on unchanged"
    )
