"""Turn what a terminal would show into plain text lines (pure functions, no I/O).

A PTY shell's output is meant for a screen: colour and title escapes (ANSI CSI / OSC),
progress bars that redraw one line with ``\\r`` (tqdm, pip, ``runpodctl``), ``\\r\\n``
line ends, backspaces, and cursor-position queries (``ESC[6n``) that expect an answer.
``TerminalDecoder`` models one terminal line the way xterm would draw it and hands
back each finished line in its final drawn state, so ``10%\\r55%\\r100%\\n`` gives
``100%``. It is incremental: bytes can arrive split anywhere, even inside a UTF-8
character or an escape sequence. Cursor movement across lines (``ESC[A``) is ignored:
only the current line is modelled.

Secrets are masked by ``blocks.secret_mask.redact``, the one redaction of the process.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "last_json_object",
    "TerminalDecoder",
    "clean_output",
    "strip_ansi",
]

# One complete escape sequence (ECMA-48 / xterm):
#   CSI  ESC [ params intermediates final       colours, erase, cursor moves, queries
#   OSC  ESC ] ... (BEL | ESC \)                window title, hyperlinks
#   DCS/SOS/PM/APC  ESC P|X|^|_ ... ESC \       rare device strings
#   ESC + intermediates + final                 charset selection (ESC ( B), keypad modes
_ESCAPE = (
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x1b]*\x1b\\"
    r"|\x1b[ -/]*[0-OQ-WYZ\\`-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_ESCAPE_RE = re.compile(_ESCAPE)
# Tokens for the line model: escapes, line controls, other C0 controls, or plain text.
_TOKEN_RE = re.compile(
    rf"({_ESCAPE})|(\r\n|\n|\r|\x08)|([\x00-\x1f\x7f])|([^\x00-\x1f\x7f\x1b\x9b]+)"
)
# Where an unfinished escape sequence may start at the end of a chunk.
_INCOMPLETE_ESCAPE_RE = re.compile(
    r"(?:\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[PX^_][^\x1b]*\x1b?|[ -/]*)?|\x9b[0-?]*[ -/]*)\Z"
)
# An OSC / DCS string longer than this without its terminator is dropped, not buffered.
_MAX_PENDING_ESCAPE_CHARS = 8192
# The xterm cursor-position query (DSR 6); the terminal answers ESC [ row ; col R.
_CURSOR_QUERY = "\x1b[6n"


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (CSI, OSC, DCS, charset selection) from ``text``.

    Line controls (``\\r``, ``\\n``, backspace) are kept; see ``clean_output`` to
    resolve them too.
    """
    return _ESCAPE_RE.sub("", text)


def clean_output(text: str | bytes) -> str:
    """The plain text a terminal would end up showing for ``text``: escapes removed,
    ``\\r`` redraws and backspaces resolved per line, ``\\r\\n`` made ``\\n``.

    A trailing unfinished line is kept (without a final ``\\n``).
    """
    decoder = TerminalDecoder()
    lines = decoder.feed(text)
    tail = decoder.flush()
    if tail:
        lines.append(tail)
    return "\n".join(lines)


class TerminalDecoder:
    """Incremental model of one terminal line: feed bytes or text, get finished lines.

    Handles: UTF-8 split across chunks (invalid bytes become U+FFFD), escape
    sequences split across chunks, ``\\r`` (back to column 0, later text overwrites),
    backspace, ``ESC[K`` erase-in-line (0/1/2), ``ESC[nG`` column, ``ESC[nC``/``ESC[nD``
    cursor forward/back, tabs (kept as ``\\t``). Other escapes and control bytes are
    dropped. ``ESC[6n`` cursor queries are counted; the caller answers them (see
    ``take_cursor_queries``). Line ends that arrive as a bare ``\\n`` are counted too
    (``take_bare_line_ends``): a tty with output processing on (``onlcr``, as ``stty
    sane`` sets it) sends every line end as ``\\r\\n``, so a bare one means the tty was
    left raw.

    Example:
        >>> d = TerminalDecoder()
        >>> d.feed(b"\\x1b[32mok\\x1b[0m\\r\\n 10%\\r 99%\\r100%\\npart")
        ['ok', '100%']
        >>> d.pending
        'part'
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._carry = ""  # an unfinished escape sequence from the last chunk
        self._line: list[str] = []  # the current line's cells
        self._col = 0
        self._queries = 0
        self._bare_line_ends = 0
        self._after_cr = False  # the last control seen was a lone \r (a chunk may split \r\n)

    @property
    def pending(self) -> str:
        """The unfinished current line, as drawn so far."""
        return "".join(self._line)

    @property
    def column(self) -> int:
        """The cursor column (0-based) on the current line."""
        return self._col

    def take_cursor_queries(self) -> int:
        """How many ``ESC[6n`` cursor-position queries arrived since the last call."""
        count, self._queries = self._queries, 0
        return count

    def take_bare_line_ends(self) -> int:
        """How many line ends arrived as ``\\n`` without ``\\r`` since the last call."""
        count, self._bare_line_ends = self._bare_line_ends, 0
        return count

    def feed(self, data: str | bytes) -> list[str]:
        """Process a chunk; return the lines it finished (without line ends)."""
        text = self._utf8.decode(data) if isinstance(data, bytes) else data
        if self._carry:
            text = self._carry + text
            self._carry = ""
        esc = max(text.rfind("\x1b"), text.rfind("\x9b"))
        if esc >= 0:
            match = _INCOMPLETE_ESCAPE_RE.match(text, esc)
            if match is not None and match.end() == len(text) and not _ESCAPE_RE.match(text, esc):
                if len(text) - esc <= _MAX_PENDING_ESCAPE_CHARS:
                    self._carry = text[esc:]
                text = text[:esc]
        done: list[str] = []
        for escape, line_ctl, control, plain in _TOKEN_RE.findall(text):
            after_cr, self._after_cr = self._after_cr, False
            if plain:
                self._write(plain)
            elif line_ctl:
                if line_ctl == "\r":
                    self._col = 0
                    self._after_cr = True
                elif line_ctl == "\x08":
                    self._col = max(0, self._col - 1)
                else:  # \n or \r\n
                    if line_ctl == "\n" and not after_cr:
                        self._bare_line_ends += 1
                    done.append("".join(self._line))
                    self._line = []
                    self._col = 0
            elif escape:
                self._escape(escape)
            elif control == "\t":
                self._write("\t")
        return done

    def flush(self) -> str:
        """End of stream: return the unfinished line (possibly '') and reset it."""
        tail = self._utf8.decode(b"", final=True)
        if tail:
            self._write(tail)
        line = "".join(self._line)
        self._line = []
        self._col = 0
        self._carry = ""
        return line

    def _write(self, text: str) -> None:
        col, line = self._col, self._line
        if col == len(line):
            line.extend(text)
        else:
            if col > len(line):
                line.extend(" " * (col - len(line)))
            line[col : col + len(text)] = list(text)
        self._col = col + len(text)

    def _escape(self, seq: str) -> None:
        if seq == _CURSOR_QUERY:
            self._queries += 1
            return
        if not seq.startswith(("\x1b[", "\x9b")):
            return
        final = seq[-1]
        params = seq[2:-1] if seq.startswith("\x1b[") else seq[1:-1]
        if not params.replace(";", "").isdigit() and params:
            return  # private modes (ESC[?2004h) and the like
        numbers = [int(p) if p else 0 for p in params.split(";")] if params else [0]
        n = numbers[0]
        if final == "K":  # erase in line
            if n == 0:
                del self._line[self._col :]
            elif n == 1:
                upto = min(self._col + 1, len(self._line))
                self._line[:upto] = [" "] * upto
            elif n == 2:
                self._line = []  # cells left of the cursor are re-padded on the next write
        elif final == "G":  # cursor to column n (1-based)
            self._col = max(0, n - 1)
        elif final == "C":
            self._col += max(1, n)
        elif final == "D":
            self._col = max(0, self._col - max(1, n))


def last_json_object(
    output: str, accept: Callable[[dict[str, Any]], bool] = lambda obj: True
) -> dict[str, Any] | None:
    """The last JSON object printed in console ``output`` that ``accept`` takes.

    Pod-side scripts answer with one JSON line; through a PTY that line can carry a
    prompt or escape codes before it, and ``\r`` line ends. Each line is cleaned of
    ANSI escapes and read from its first ``{``.

    Args:
        output: console output (text).
        accept: a predicate on the decoded object (e.g. ``lambda o: o.get("kind") == "x"``).

    Returns:
        The object, or None when no line holds an accepted JSON object.
    """
    for line in reversed(output.replace("\r", "\n").splitlines()):
        text = strip_ansi(line).strip()
        start = text.find("{")
        if start < 0:
            continue
        try:
            value = json.loads(text[start:])
        except ValueError:
            continue
        if isinstance(value, dict) and accept(value):
            return value
    return None
