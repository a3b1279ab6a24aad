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
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["clear_stop", "forget_stop", "note_stop", "raise_if_stopped", "stop_pending"]

_lock = threading.Lock()
_pending: Callable[[], BaseException] | None = None


def note_stop(make: Callable[[], BaseException]) -> None:
    """Record a stop: ``make()`` builds the exception a boundary raises
    (``KeyboardInterrupt`` for Ctrl-C, the CLI's ``Terminated`` for SIGTERM,
    ``BudgetExceededError`` once the budget watch finds the cap reached)."""
    global _pending
    with _lock:
        _pending = make


def stop_pending() -> bool:
    """Whether a signal asked the process to stop and no boundary has raised it yet."""
    return _pending is not None


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
    """Forget a pending stop (the CLI acted on it)."""
    global _pending
    with _lock:
        _pending = None


def forget_stop(make: Callable[[], BaseException]) -> None:
    """Forget the pending stop only when it is the one ``make`` noted (the budget watch
    of a run that ended): a stop a signal asked for meanwhile stays pending."""
    global _pending
    with _lock:
        if _pending is make:
            _pending = None
