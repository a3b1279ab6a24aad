"""Waiting out a pod's SSH outage: one budget, backoff, and the provider asked before
each retry (docs/architecture.md#reconnecting).

After a pod is ready, its gateway may refuse or drop connections for a while (RunPod's
proxy restarting, a network blip). Every stage waits that out the same way:

- ``ReconnectPolicy.call`` retries a connect attempt that failed in a way waiting may
  fix (``ConsoleConnectError.retryable``), with exponential backoff (tenacity), for at
  most ``budget_seconds``. Before each retry it asks the provider whether the pod
  still lives (``PodProvider.status``): a pod that is gone ends the wait at once with
  ``PodGoneError`` (one sentence: terminated outside the run, exited, host lost). When
  the budget runs out, ``unreachable`` (the pod watch's) gives the verdict: a pod the
  provider says runs is terminated and, once confirmed gone, counted lost.
- ``resuming(console)`` is a console whose ``run`` runs a command again after the
  connection dropped under it (the console opens a fresh session by itself, under its
  policy). Stages give it only commands that are safe to repeat, so a stage resumes
  at the step it was at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from prefect_runpod.blocks.exceptions import ConsoleConnectError, SpecError
from prefect_runpod.blocks.provider import PodStatus, lost_error
from prefect_runpod.blocks.validation.parameters import DEFAULT_RECONNECT_BUDGET_SECONDS

if TYPE_CHECKING:
    from pydantic import SecretStr

    from prefect_runpod.blocks.console.protocol import CommandOutput, ConsoleLike

__all__ = ["DEFAULT_RECONNECT_BUDGET_SECONDS", "ReconnectPolicy", "Resuming", "resuming"]

log = logging.getLogger("prefect_runpod.console")


T = TypeVar("T")


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ConsoleConnectError) and exc.retryable


@dataclass(frozen=True)
class ReconnectPolicy:
    """How long and how a stage waits for a pod's SSH to come back.

    Attributes:
        budget_seconds: the longest wait for one outage (s); > 0.
        initial_delay_seconds: the first pause between attempts (s).
        max_delay_seconds: the longest pause between attempts (s).
        status: the provider's view of the pod (``PodProvider.status`` bound to its
            id), asked before each retry; None: never asked.
        unreachable: called with the seconds waited once the budget is spent; returns the
            error to raise (``PodWatch.unreachable``). None: the connect error stands.
        sleep: how to pause; clock: a monotonic clock (tests inject fakes).

    Raises:
        SpecError: a budget or delay that is not positive.
    """

    budget_seconds: float = DEFAULT_RECONNECT_BUDGET_SECONDS
    initial_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    status: Callable[[], PodStatus] | None = None
    unreachable: Callable[[float], BaseException] | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        for name in ("budget_seconds", "initial_delay_seconds", "max_delay_seconds"):
            value = getattr(self, name)
            if not value > 0:
                raise SpecError(f"reconnect {name} must be > 0 s, got {value}")

    def left(self, since: float) -> float:
        """Seconds left of the budget of an outage that began at ``since`` (this
        policy's clock); at least 1 s, so a last attempt can still answer."""
        return max(1.0, self.budget_seconds - (self.clock() - since))

    def call(
        self,
        attempt: Callable[[], T],
        *,
        pod_id: str | None,
        what: str,
        since: float | None = None,
    ) -> T:
        """Run ``attempt`` until it succeeds, waiting out retryable connect failures.

        Args:
            attempt: one try (e.g. open an SSH session); raises ``ConsoleConnectError``.
            pod_id: the pod, for messages.
            what: what is being waited for (``the SSH gateway``), for messages.
            since: when the outage began (this policy's clock), when a caller waited
                already; None: now. The budget counts from there.

        Returns:
            What ``attempt`` returned.

        Raises:
            PodGoneError: the provider said the pod no longer lives, or ``unreachable``
                found it running while its SSH stayed down for the whole budget.
            ConsoleConnectError: not retryable, or still failing after ``budget_seconds``
                (the message says how long it waited).
        """
        started = self.clock() if since is None else since

        def out_of_budget(state: RetryCallState) -> bool:
            return self.clock() - started >= self.budget_seconds

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if state.attempt_number == 1:
                log.warning(
                    "pod %s: %s is not answering (%s); waiting up to %.0f s, asking the "
                    "provider before each retry",
                    pod_id,
                    what,
                    exc,
                    self.budget_seconds,
                )
            if self.status is not None and (seen := self.status()).gone:
                raise lost_error(seen) from exc

        backoff = wait_exponential(
            multiplier=self.initial_delay_seconds,
            min=self.initial_delay_seconds,
            max=self.max_delay_seconds,
        )

        def pause(state: RetryCallState) -> float:
            left = self.budget_seconds - (self.clock() - started)
            return max(0.0, min(backoff(state), left))  # the last pause ends at the budget

        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            stop=out_of_budget,
            wait=pause,
            before_sleep=before_sleep,
            sleep=self.sleep,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except ConsoleConnectError as exc:
            waited = self.clock() - started
            if not exc.retryable or waited < self.initial_delay_seconds:
                raise
            if self.unreachable is not None:
                raise self.unreachable(waited) from exc
            seen: PodStatus | None = self.status() if self.status is not None else None
            if seen is not None and seen.gone:
                raise lost_error(seen) from exc
            raise ConsoleConnectError(
                f"{exc} (gave up after waiting {waited:.0f} s of a "
                f"{self.budget_seconds:g} s reconnect budget)",
                pod_id=pod_id,
            ) from exc


class Resuming:
    """A console whose ``run`` runs a command again after its connection dropped (or
    could not be opened), for at most the console's reconnect budget from the first
    failure. Only for commands that are safe to repeat.

    Args:
        console: the console to drive (a ``PodConsole``, or any ``ConsoleLike``).
        budget_seconds: the longest time from the first failure to giving up (s).
        pause_seconds: the pause before running a command again (s); the console's own
            policy does the real waiting when it reopens its session.
        sleep: how to pause (tests inject a fake).
    """

    def __init__(
        self,
        console: ConsoleLike,
        budget_seconds: float,
        *,
        pause_seconds: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.console = console
        self.budget_seconds = budget_seconds
        self.pause_seconds = pause_seconds
        self.sleep = sleep

    def run(
        self, command: str, *, timeout_seconds: float = 60.0, check: bool = False, **kw: Any
    ) -> CommandOutput:
        """``console.run``, repeated after a retryable ``ConsoleConnectError``.

        Raises:
            ConsoleConnectError: still failing ``budget_seconds`` after the first failure,
                or not retryable.
            PodGoneError: from the console's policy, when the pod is gone.
        """
        first: float | None = None
        while True:
            try:
                return self.console.run(command, timeout_seconds=timeout_seconds, check=check, **kw)
            except ConsoleConnectError as exc:
                now = time.monotonic()
                first = now if first is None else first
                if not exc.retryable or now - first > self.budget_seconds:
                    raise
                log.warning("%s; running it again on a fresh session", exc)
                self.sleep(self.pause_seconds)

    def set_secret_env(self, name: str, value: SecretStr, *, mask: bool = True) -> None:
        """``console.set_secret_env`` (a fresh session exports the secrets again)."""
        self.console.set_secret_env(name, value, mask=mask)

    def reconnect(self, *, spent_seconds: float = 0.0) -> None:
        """``console.reconnect``."""
        self.console.reconnect(spent_seconds=spent_seconds)


def resuming(console: ConsoleLike) -> Resuming:
    """``console`` wrapped in :class:`Resuming`, with the budget of the console's own
    reconnect policy (``DEFAULT_RECONNECT_BUDGET_SECONDS`` when it has none)."""
    policy = getattr(console, "reconnect_policy", None)
    budget = policy.budget_seconds if policy is not None else DEFAULT_RECONNECT_BUDGET_SECONDS
    return Resuming(console, budget)
