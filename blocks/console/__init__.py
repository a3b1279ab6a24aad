"""PodConsole: commands on a pod through a PTY-only SSH gateway.

- ``session``        ``PodConsole`` and ``run_remote`` (the console's contract)
- ``channel``        the byte layer: a channel read while written, ``PtyStream``
- ``shell_lines``    the lines the console types (pure)
- ``terminal_text``  what a terminal shows -> plain lines; the one ANSI grammar
- ``ssh``            opening SSH with the host key pinned; exec where allowed
"""

from __future__ import annotations

from prefect_runpod.blocks.console.session import CommandResult, PodConsole, PtyStream, run_remote

__all__ = ["CommandResult", "PodConsole", "PtyStream", "run_remote"]
