"""PodConsole: commands on a pod through a PTY-only SSH gateway.

- ``session``        ``PodConsole`` and ``run_remote`` (the console's contract)
- ``connection``     the SSH connection and PTY shell behind it, kept ready for the next command
- ``protocol``       ``ConsoleLike``: what a task needs of a console (``PodConsole`` or a stand-in)
- ``shell``          the shell behind a console: framing, verified setup, drift, ``exec``, resync
- ``channel``        the byte layer: a channel read while written, ``PtyStream``
- ``shell_lines``    the lines the console types and how their answers read (pure)
- ``terminal_text``  what a terminal shows -> plain lines; the one ANSI grammar
- ``ssh``            opening SSH with the host key pinned; exec where allowed
"""

from __future__ import annotations

from prefect_runpod.blocks.console.protocol import CommandOutput, ConsoleLike
from prefect_runpod.blocks.console.session import CommandResult, PodConsole, PtyStream, run_remote

__all__ = [
    "CommandOutput",
    "CommandResult",
    "ConsoleLike",
    "PodConsole",
    "PtyStream",
    "run_remote",
]
