"""The lines ``PodConsole`` types into a pod's shell, and how their answers read
(pure functions, no I/O; docs/architecture.md#the-console).

Every command travels as one framed line that the shell reads whole before running
any of it, so nothing the command does can swallow or disturb the frame::

    printf START; __prx_tag=SEQ; . <(printf %s 'COMMAND'); __prx_rc=$?; TIDY; printf END:$__prx_rc

``START`` (``__PRB_<nonce>.<seq>``) and ``END`` (``__PRX_<nonce>.<seq>:<exit code>``)
bracket the command's output; whatever the shell prints around them (its prompt, a
banner, job notices, an echo of typed text) is not output. Sourcing the command (in
a POSIX sh: ``eval``-ing it) keeps ``cd`` and ``export`` in the session's shell, turns
a syntax error into exit code 2 instead of a hung parser, leaves the terminal to the
command's stdin, and lets a command end in ``&``. ``TIDY`` puts back what the console
relies on after the command ran (prompt and ``PROMPT_COMMAND`` empty, no history, no
line editing, no ``errexit``/``xtrace``…), so a command that changes them cannot
change the next command's output.

The markers are typed as separately quoted pieces (``printf '%s%s.%s' __PRB_ NONCE
SEQ``), so the typed text never holds an assembled marker. Every line stays under the
tty's 4096-byte canonical line limit (observed: a longer typed line is cut at 4096
bytes, which is why a long heredoc typed whole arrives truncated); longer commands go
through a staged file. The lines work in bash and in a POSIX ``sh`` (after ``exec sh``):
bash-only settings sit behind ``case ${BASH_VERSION-}``, because an interactive
``dash`` abandons the rest of a line after a failing special builtin (observed).
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from dataclasses import dataclass

__all__ = [
    "END_TAG",
    "EXEC_TAG",
    "LINE_CLEAR",
    "MAX_LINE_BYTES",
    "READY_TAG",
    "SETUP_TAG",
    "START_TAG",
    "SYNC_TAG",
    "SetupReport",
    "command_line",
    "end_pattern",
    "marker",
    "needs_staging",
    "parse_setup_report",
    "session_setup_line",
    "short",
    "staging_lines",
    "stream_line",
    "sync_line",
    "tail",
]

START_TAG = "__PRB_"
"""Start of a command's output: ``__PRB_<nonce>.<seq>``."""
END_TAG = "__PRX_"
"""End of a command: ``__PRX_<nonce>.<seq>:<exit code>``."""
EXEC_TAG = "__PRJ_"
"""Printed by the console's DEBUG trap just before ``exec PROGRAM`` replaces the shell."""
SETUP_TAG = "__PRV_"
"""The setup line's report: ``__PRV_<nonce>.<token>``, then tab-separated fields."""
SYNC_TAG = "__PRS_"
READY_TAG = "__PRR_"
MAX_LINE_BYTES = 3000
"""Longest command typed as is (bytes, once quoted); longer ones, or ones with line
breaks or control characters, go through a temporary file."""
LINE_CLEAR = b"\x15\n"
"""Typed before every line: Ctrl-U drops whatever the tty's line buffer holds (a
cursor-position answer nobody read), and the newline ends it, so even in a raw tty
(where Ctrl-U is an ordinary byte) the line that follows is read on its own."""
_STAGE_CHUNK_CHARS = 2800
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


# What every command leaves behind, in bash and in sh: prompts and PROMPT_COMMAND empty
# (a venv's "(v) " or conda's "(base) " gone), history, history expansion and line
# editing off, no errexit/nounset/xtrace/verbose/noclobber/pipefail, and the console's
# DEBUG trap (the exec watch) back in place.
def _tidy(nonce: str) -> str:
    return (
        "case ${BASH_VERSION-} in ?*) set +o history +o emacs +o vi +o pipefail +H -T "
        f"2>/dev/null; PROMPT_COMMAND=; PS0=; {_watch_trap(nonce)};; esac; "
        "set +e +u +x +v +C; PS1=; PS2="
    )


def _watch_trap(nonce: str) -> str:
    """The bash DEBUG trap, run before each simple command: it announces
    ``exec PROGRAM`` (not ``exec >file``, which only redirects) with the current
    command's sequence number, so the console knows the shell is being replaced. It is
    self-contained (no function a command could remove), and inherited by sourced
    commands and functions (``set -T``: without it ``.`` suspends the trap), where it
    stays silent in subshells (``$BASHPID`` is not ``$$``), whose ``exec`` replaces
    only the subshell."""
    announce = f'printf "%s%s.%s\\n" {EXEC_TAG} {nonce} "${{__prx_tag-0}}"'
    return (
        'trap \'case $BASH_COMMAND in "exec "[!0-9\\<\\>\\&]*) '
        f'[ "$BASHPID" = "$$" ] && {announce};; esac\' DEBUG'
    )


def marker(tag: str, nonce: str, seq: int | str) -> str:
    """An assembled marker as the shell prints it: ``<tag><nonce>.<seq>``."""
    return f"{tag}{nonce}.{seq}"


def _print_marker(tag: str, nonce: str, seq: int | str, *extra: str) -> str:
    """The ``printf`` that prints a marker (plus ``:``-joined ``extra`` fields) from
    separately quoted pieces."""
    fmt = "%s%s.%s" + ":%s" * len(extra) + "\\n"
    return f"printf '{fmt}' {tag} {nonce} {seq}" + "".join(f" {e}" for e in extra)


def end_pattern(nonce: str, seq: int | str) -> re.Pattern[str]:
    """Matches the end marker of command ``seq``; group 1 is its exit code."""
    return re.compile(re.escape(marker(END_TAG, nonce, seq)) + r":(\d+)$")


def session_setup_line(nonce: str, token: str) -> str:
    """The line that sets a fresh shell up (after login, after ``exec``, after a drift)
    and reports what it found and what it got.

    It notes the shell's options and tty flags as it found them, makes the tty sane
    with echo off, drops the history file, makes pagers ``cat``, tidies (see the
    module docstring; this sets the exec watch), then prints one report line:
    ``__PRV_<nonce>.<token>`` and, tab-separated, ``bash`` (or nothing), the options
    and tty flags found, and the options and tty flags now (:func:`parse_setup_report`).
    """
    tty = "$(stty -a 2>/dev/null | tr '\\n' ' ')"
    report = (
        f"printf '%s%s.%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' {SETUP_TAG} {nonce} {token} "
        f'"${{BASH_VERSION:+bash}}" "$__prx_was" "$__prx_tty" "${{SHELLOPTS-}}" "{tty}"'
    )
    return (
        f'__prx_was="${{SHELLOPTS-}}"; __prx_tty="{tty}"; stty sane -echo 2>/dev/null; '
        "unset HISTFILE PROMPT_COMMAND; HISTSIZE=0; "
        "export PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER=; "
        f"{_tidy(nonce)}; {report}"
    )


def _state_problems(options: str, stty: str) -> list[str]:
    """What in a shell's options (``$SHELLOPTS``) and tty flags (``stty -a``) is not as
    the console needs it, in words."""
    flags = set(stty.replace(";", " ").split())
    names = set(options.split(":"))
    out = []
    if "echo" in flags:
        out.append("tty echo on")
    if "-icanon" in flags or "-opost" in flags:
        out.append("tty in raw mode")
    if "history" in names:
        out.append("shell history on")
    if names & {"emacs", "vi"}:
        out.append("line editing on")
    for option in ("errexit", "nounset", "xtrace"):
        if option in names:
            out.append(f"set -o {option}")
    return out


@dataclass(frozen=True)
class SetupReport:
    """What a shell reported after the setup line.

    Attributes:
        shell: ``bash`` or ``sh`` (any other POSIX shell).
        found: what was not as the console needs it before the line ran, in words.
        problems: what still is not, after it ran (empty when the setup held).
    """

    shell: str
    found: tuple[str, ...]
    problems: tuple[str, ...]


def parse_setup_report(text: str, nonce: str, token: str) -> SetupReport | None:
    """The report of setup line ``token`` in one output line, or None when the line
    holds none (or only part of one)."""
    head = marker(SETUP_TAG, nonce, token) + "\t"
    at = text.find(head)
    if at < 0:
        return None
    fields = text[at + len(head) :].split("\t")
    if len(fields) < 5:
        return None
    shell, was, tty_was, now, tty_now = fields[:5]
    return SetupReport(
        shell="bash" if shell == "bash" else "sh",
        found=tuple(_state_problems(was, tty_was)),
        problems=tuple(_state_problems(now, tty_now)),
    )


def _run_text(command: str, shell: str) -> str:
    """How the frame runs ``command`` in the session's shell: bash sources it from a
    process substitution (``eval`` would read the rest of its input from the terminal
    after a ``set -o vi`` inside it: observed, bash 5.2), a POSIX sh ``eval``-s it
    through ``command`` (so that a syntax error is the command's exit code 2, not an
    abandoned line: observed, dash)."""
    quoted = shlex.quote(command if command.strip() else ":")
    return f". <(printf %s {quoted})" if shell == "bash" else f"command eval {quoted}"


def command_line(command: str, nonce: str, seq: int, shell: str = "bash") -> str:
    """The framed line that runs ``command`` as command number ``seq`` in ``shell``
    (``bash`` or ``sh``; see the module docstring); ``command`` must pass
    :func:`needs_staging` first."""
    return (
        f"{_print_marker(START_TAG, nonce, seq)}; __prx_tag={seq}; {_run_text(command, shell)}; "
        f"__prx_rc=$?; {_tidy(nonce)}; {_print_marker(END_TAG, nonce, seq, '$__prx_rc')}"
    )


def needs_staging(command: str) -> bool:
    """True when ``command`` cannot be typed as one tty line: too long once quoted, or
    it holds line breaks or control characters (which the tty would act on)."""
    return len(shlex.quote(command).encode()) > MAX_LINE_BYTES or bool(_CONTROL_RE.search(command))


def staging_lines(command: str, path: str) -> tuple[list[str], str]:
    """How to send ``command`` through a file at ``path`` on the pod.

    Returns:
        ``(setup, run)``: commands that must each exit 0 (create the file, append
        base64 pieces, decode and check the sha256), then the command that sources the
        file in the session's shell, removes it and keeps the command's exit code.
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


def stream_line(body: str, nonce: str, seq: int, *, raw: bool, shell: str = "bash") -> str:
    """The line that starts stream command ``seq``: raw tty first (``raw``), then the
    ready marker ``__PRR_<nonce>.<seq>`` + newline just before ``body`` runs, then the
    tty made sane with echo off, tidied, and the end marker carrying ``body``'s exit
    code."""
    ready = _print_marker(READY_TAG, nonce, seq)
    run = _run_text(body, shell)
    end = _print_marker(END_TAG, nonce, seq, "$__prx_rc")
    if not raw:
        return f"{ready}; {run}; __prx_rc=$?; {_tidy(nonce)}; {end}"
    return (
        f"stty raw -echo -iexten; {ready}; {run}; __prx_rc=$?; stty sane -echo; "
        f"{_tidy(nonce)}; {end}"
    )


def sync_line(nonce: str, token: str) -> str:
    """A line that makes the tty sane (echo off), tidies, and prints
    ``__PRS_<nonce>.<token>``."""
    return f"stty sane -echo 2>/dev/null; {_tidy(nonce)}; {_print_marker(SYNC_TAG, nonce, token)}"


def short(command: str, limit: int = 120) -> str:
    """``command`` on one line, cut to ``limit`` characters for messages."""
    one = command.replace("\n", " ⏎ ")
    return one if len(one) <= limit else one[: limit - 1] + "…"


def tail(output: str, lines: int = 20) -> str:
    """The last ``lines`` lines of ``output`` (or ``(no output)``)."""
    return "\n".join(output.splitlines()[-lines:]) or "(no output)"
