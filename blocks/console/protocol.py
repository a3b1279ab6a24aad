"""What a stage needs of a console: the one protocol every task is typed against.

``PodConsole`` fills it in; so do the tests' local-shell stand-ins, which replace the
SSH transport only. The protocol holds exactly what the tasks call on a console they
are given: ``run``, ``set_secret_env`` and ``reconnect``. Opening and closing stay
with whoever made the console, and byte streams (``PodConsole.open_stream``) belong to
the transfer methods, which take a ``PodConsole`` itself (docs/architecture.md#the-console).

Both protocols are ``runtime_checkable`` so a test can assert that a stand-in still
fits (``isinstance`` checks that the members exist, not their signatures; mypy checks
those wherever a ``PodConsole`` is passed to a task).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pydantic import SecretStr

__all__ = ["CommandOutput", "ConsoleLike"]


@runtime_checkable
class CommandOutput(Protocol):
    """What ``ConsoleLike.run`` returns (``PodConsole``'s ``CommandResult`` is one)."""

    @property
    def output(self) -> str:
        """What the command printed: stdout and stderr merged, lines joined by ``\\n``."""
        ...

    @property
    def exit_code(self) -> int:
        """The command's exit status (``$?``)."""
        ...


@runtime_checkable
class ConsoleLike(Protocol):
    """A shell on a pod that runs one command at a time (``PodConsole`` is one)."""

    def run(
        self, command: str, *, timeout_seconds: float = 60.0, check: bool = False
    ) -> CommandOutput:
        """Run one shell command in the session's shell and wait for it.

        Args:
            command: bash text; ``cd`` and ``export`` persist to later commands.
            timeout_seconds: the deadline in seconds.
            check: raise when the exit code is not 0.

        Returns:
            The command's output and exit code.

        Raises:
            CommandTimeoutError: the deadline passed.
            ConsoleError: ``check`` and a non-zero exit code.
            ConsoleConnectError: the connection dropped (a ``PodConsole`` opens a fresh
                session by itself for the next command).
        """
        ...

    def set_secret_env(self, name: str, value: SecretStr, *, mask: bool = True) -> None:
        """Export ``name=value`` to later commands without the value appearing in any
        command line, transcript or shell history; with ``mask`` (default) the value is
        also masked in everything this process prints from now on.

        Raises:
            SpecError: ``name`` is not a shell identifier or the value cannot be typed.
        """
        ...

    def reconnect(self, *, spent_seconds: float = 0.0) -> None:
        """Open a fresh session after a drop, with the secrets exported again, waiting
        at most the reconnect budget less ``spent_seconds`` (the outage so far).

        Raises:
            ConsoleConnectError: the pod cannot be reached.
        """
        ...
