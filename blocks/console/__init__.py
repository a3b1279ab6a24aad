"""PodConsole: commands on a pod through a PTY-only SSH gateway.

- ``session``        ``PodConsole`` and ``run_remote`` (the console's contract)
- ``connection``     the SSH connection and PTY shell behind it, kept ready for the next command
- ``protocol``       ``ConsoleLike``: what a task needs of a console (``PodConsole`` or a stand-in)
- ``shell``          the shell behind a console: framing, verified setup, drift, ``exec``, resync
- ``channel``        the byte layer: a channel read while written, ``PtyStream``
- ``shell_lines``    the lines the console types and how their answers read (pure)
- ``terminal_text``  what a terminal shows -> plain lines; the one ANSI grammar
- ``ssh``            opening SSH with the host key pinned; exec where allowed

Names load lazily: importing one module of the package (``reconnect`` for the CLI's
help, say) does not import paramiko.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_runpod.blocks import lazy_exports

if TYPE_CHECKING:  # the same names, typed (PEP 562's __getattr__ hides them)
    from prefect_runpod.blocks.console.protocol import CommandOutput, ConsoleLike
    from prefect_runpod.blocks.console.session import (
        CommandResult,
        PodConsole,
        PtyStream,
        run_remote,
    )

__all__ = [
    "CommandOutput",
    "CommandResult",
    "ConsoleLike",
    "PodConsole",
    "PtyStream",
    "run_remote",
]

_PROTOCOL = f"{__name__}.protocol"
_SESSION = f"{__name__}.session"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CommandOutput": _PROTOCOL,
        "ConsoleLike": _PROTOCOL,
        "CommandResult": _SESSION,
        "PodConsole": _SESSION,
        "PtyStream": _SESSION,
        "run_remote": _SESSION,
    },
)
