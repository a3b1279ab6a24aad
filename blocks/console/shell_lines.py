"""The lines ``PodConsole`` types into a pod's bash (pure functions, no I/O).

Every line built here stays under the tty's 4096-byte canonical line limit (observed:
a longer typed line is cut at 4096 bytes, the real cause of the field guide's
truncated heredoc), and none of them contains an assembled sentinel, so an echo of a
typed line can never be mistaken for the shell's answer.
"""

from __future__ import annotations

import base64
import hashlib
import re

__all__ = [
    "MAX_LINE_BYTES",
    "PROMPT_TAG",
    "READY_TAG",
    "SYNC_TAG",
    "needs_staging",
    "session_setup_line",
    "short",
    "staging_lines",
    "stream_line",
    "sync_line",
    "tail",
]

PROMPT_TAG = "__PRX_"
"""Start of the sentinel prompt ``__PRX_<nonce>:<exit code>``."""
SYNC_TAG = "__PRS_"
READY_TAG = "__PRR_"
MAX_LINE_BYTES = 3000
"""Longest command typed as is (bytes); longer ones, or ones with line breaks or
control characters, go through a temporary file."""
_STAGE_CHUNK_CHARS = 2800
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Pagers would wait for a key; history and line editing off keep typed text (and
# secrets) out of ~/.bash_history and out of any echo.
_SESSION_SETUP = (
    "stty -echo; unset HISTFILE; HISTSIZE=0; set +o history; set +o emacs +o vi 2>/dev/null; "
    "unset PROMPT_COMMAND; PS0=; PS2=; trap - DEBUG 2>/dev/null; "
    "export PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER=; "
)


def session_setup_line(nonce: str) -> str:
    """The line typed once per session: echo, history and line editing off, and
    ``PS1`` set to the sentinel ``__PRX_<nonce>:$?`` + newline. The tag and nonce are
    typed in separately quoted pieces, so the typed text never holds the sentinel."""
    return f"{_SESSION_SETUP}PS1='{PROMPT_TAG}'\"{nonce}\"':$?\\n'"


def needs_staging(command: str) -> bool:
    """True when ``command`` cannot be typed as one tty line: too long, or it holds line
    breaks or control characters (which the tty would act on)."""
    return len(command.encode()) > MAX_LINE_BYTES or bool(_CONTROL_RE.search(command))


def staging_lines(command: str, path: str) -> tuple[list[str], str]:
    """How to send ``command`` through a file at ``path`` on the pod.

    Returns:
        ``(setup, run)``: lines that must each exit 0 (create the file, append base64
        pieces, decode and check the sha256), then the line that sources the file in
        the session's shell, removes it and keeps the command's exit code.
    """
    payload = command.encode()
    b64 = base64.b64encode(payload).decode()
    digest = hashlib.sha256(payload).hexdigest()
    setup = [f"(umask 077; : > {path}.b64)"]
    for i in range(0, len(b64), _STAGE_CHUNK_CHARS):
        setup.append(f"printf %s '{b64[i : i + _STAGE_CHUNK_CHARS]}' >> {path}.b64")
    setup.append(
        f"base64 -d {path}.b64 > {path} && rm -f {path}.b64 && "
        f'[ "$(sha256sum < {path} | cut -c1-64)" = {digest} ]'
    )
    return setup, f". {path}; __prx_rc=$?; rm -f {path}; (exit $__prx_rc)"


def stream_line(body: str, nonce: str, *, raw: bool) -> str:
    """The line that starts a stream command: raw tty first (``raw``), then a ready
    marker ``__PRR_<nonce>`` + newline just before ``body`` runs, then the tty made sane
    again with echo off, keeping ``body``'s exit code for the prompt."""
    ready = f"printf '%s%s\\n' {READY_TAG} {nonce}"
    if not raw:
        return f"{ready}; {body}"
    return (
        f"stty raw -echo -iexten; {ready}; {body}; __prx_rc=$?; stty sane -echo; (exit $__prx_rc)"
    )


def sync_line(token: str) -> str:
    """A line that makes the tty sane (echo off) and prints ``__PRS_<token>``."""
    return f"stty sane -echo; printf '%s%s\\n' {SYNC_TAG} {token}"


def short(command: str, limit: int = 120) -> str:
    """``command`` on one line, cut to ``limit`` characters for messages."""
    one = command.replace("\n", " ⏎ ")
    return one if len(one) <= limit else one[: limit - 1] + "…"


def tail(output: str, lines: int = 20) -> str:
    """The last ``lines`` lines of ``output`` (or ``(no output)``)."""
    return "\n".join(output.splitlines()[-lines:]) or "(no output)"
