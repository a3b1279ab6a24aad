"""Reading a training log: progress and metrics out of single lines (pure functions).

Recognised progress, first match wins:

* a JSON object line: ``{"progress": 0.4, "step": 40, "total": 100, "loss": 0.31}``
  (``progress`` in 0..1; also ``epoch``/``epochs``);
* a tqdm bar: ``Train:  40%|████      | 40/100 [00:04<00:06,  9.98it/s, loss=0.31]``
  (tqdm's ``unit_scale`` counts such as ``1.5k/10k`` too);
* ``step 40/100`` / ``Step 40 of 100``, optionally with ``epoch 2/5`` on the same line
  (the overall fraction then counts the finished epochs);
* ``epoch 2/5`` / ``Epoch [2/5]`` alone: the announced epoch is under way, so 1/5 done.

Metrics: numeric keys of a JSON line or of a Python dict line (Hugging Face
``Trainer`` logs ``{'loss': 0.3, 'learning_rate': 5e-05, 'epoch': 0.5}``), and
``name=value`` pairs (tqdm postfix, most scripts) or ``name: value`` where the name
looks like a metric (loss, acc…). Progress counters are never metrics.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from prefect_runpod.blocks.console.terminal_text import strip_ansi  # one ANSI grammar for all

__all__ = [
    "LogCoalescer",
    "Progress",
    "error_line",
    "is_record_line",
    "parse_metrics",
    "parse_progress",
    "strip_ansi",
]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_COUNT = r"\d+(?:\.\d+)?[kMGTP]?"
_TQDM = re.compile(rf"(\d{{1,3}})%\|[^|]*\|\s*({_COUNT})/({_COUNT})\b")
_STEP = re.compile(r"\bstep\b[\s:#\[(]*(\d+)\s*(?:/|\bof\b)\s*(\d+)", re.IGNORECASE)
_EPOCH = re.compile(r"\bepoch\b[\s:#\[(]*(\d+)\s*(?:/|\bof\b)\s*(\d+)", re.IGNORECASE)
_PAIR_EQ = re.compile(rf"(?<![\w.])([A-Za-z_][\w./-]*)\s*=\s*({_NUM})(?![\w.])")
_PAIR_COLON = re.compile(rf"(?<![\w.])([A-Za-z_][\w./-]*)\s*:\s*({_NUM})(?![\w.:])")
_METRIC_NAME = re.compile(
    r"loss|acc|f1|\blr\b|learning_rate|perplexity|ppl|bleu|rouge|auc|precision|recall|"
    r"reward|grad_norm|score|error|mse|mae|wer|cer|kl",
    re.IGNORECASE,
)
_NOT_METRICS = frozenset(
    {"progress", "step", "steps", "total", "epoch", "epochs", "global_step", "max_steps"}
)
_SCALE = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


_EXCEPTION_LINE = re.compile(
    r"(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?"
)
_ERROR_WORD = re.compile(r".*\b(?:error|fatal|failed|killed|out of memory|oom)\b.*", re.IGNORECASE)


def error_line(lines: list[str]) -> str | None:
    """The line of a log tail that names why the job failed, or None for an empty tail.

    Searched from the end, so the cause wins over earlier noise: the last line that is
    an exception (``ValueError: bad lr``, ``torch.OutOfMemoryError: CUDA out of memory``,
    the last line of a Python traceback); else the last line with an error word
    (``error``, ``fatal``, ``failed``, ``killed``, ``out of memory``); else the last
    non-empty line. Lines are stripped; at most 300 characters are kept.
    """
    kept = [line.strip() for line in lines if line and line.strip()]
    if not kept:
        return None
    for pattern in (_EXCEPTION_LINE, _ERROR_WORD):
        for line in reversed(kept):
            if pattern.fullmatch(line):
                return line[:300]
    return kept[-1][:300]


@dataclass(frozen=True)
class Progress:
    """How far training is.

    Attributes:
        fraction: done, 0.0 … 1.0.
        step / total: the counter and its end, when the line gave them.
        unit: ``step`` (tqdm, step lines, JSON), ``epoch`` or ``fraction`` (JSON
            ``progress`` alone).
        epoch / epochs: the epoch counter, when the line gave it.
    """

    fraction: float
    step: int | None = None
    total: int | None = None
    unit: str = "step"
    epoch: int | None = None
    epochs: int | None = None

    @property
    def percent(self) -> float:
        """``fraction`` × 100, as Prefect progress artifacts want it."""
        return self.fraction * 100.0


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def _count(text: str) -> int:
    number, suffix = (text[:-1], text[-1]) if text[-1] in _SCALE else (text, "")
    return int(float(number) * _SCALE[suffix])


def _object(line: str) -> dict | None:
    """The dict a JSON (or Python-literal) object line holds, else None."""
    start, end = line.find("{"), line.rfind("}")
    if start < 0 or end <= start:
        return None
    text = line[start : end + 1]
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _int_or_none(value: object) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _progress_from_object(obj: dict) -> Progress | None:
    step, total = _int_or_none(obj.get("step")), _int_or_none(obj.get("total"))
    epoch, epochs = _int_or_none(obj.get("epoch")), _int_or_none(obj.get("epochs"))
    fraction = _number(obj.get("progress"))
    if fraction is not None:
        if fraction > 1.0:
            fraction /= 100.0  # a percentage
        return Progress(
            _clamp(fraction), step, total, "step" if total else "fraction", epoch, epochs
        )
    if step is not None and total:
        return Progress(_clamp(step / total), step, total, "step", epoch, epochs)
    if epoch is not None and epochs:
        return Progress(_clamp((epoch - 1) / epochs), epoch, epochs, "epoch", epoch, epochs)
    return None


def parse_progress(line: str) -> Progress | None:
    """The progress a log line reports, or None (see the module docstring for forms).

    Args:
        line: one log line; ANSI escapes and ``\\r`` are tolerated.

    Returns:
        A ``Progress`` with ``fraction`` clamped to 0..1, or None when the line says
        nothing about progress (also for a zero ``total``).
    """
    text = strip_ansi(line).strip()
    if not text:
        return None
    if text.startswith("{"):
        obj = _object(text)
        if obj is not None:
            return _progress_from_object(obj)
    match = _TQDM.search(text)
    if match:
        done, total = _count(match.group(2)), _count(match.group(3))
        if total > 0:
            return Progress(_clamp(done / total), done, total, "step")
        return Progress(_clamp(int(match.group(1)) / 100.0), None, None, "fraction")
    step_match, epoch_match = _STEP.search(text), _EPOCH.search(text)
    epoch = epochs = None
    if epoch_match:
        epoch, epochs = int(epoch_match.group(1)), int(epoch_match.group(2))
    if step_match:
        step, total = int(step_match.group(1)), int(step_match.group(2))
        if total <= 0:
            return None
        fraction = step / total
        if epoch and epochs:
            fraction = (epoch - 1 + fraction) / epochs
        return Progress(_clamp(fraction), step, total, "step", epoch, epochs)
    if epoch is not None and epochs:
        return Progress(_clamp((epoch - 1) / epochs), epoch, epochs, "epoch", epoch, epochs)
    return None


def parse_metrics(line: str) -> dict[str, float]:
    """The metrics a log line reports, name → value (finite floats only).

    Args:
        line: one log line; ANSI escapes are removed first.

    Returns:
        A possibly empty dict. Progress counters (step, total, epoch, progress…) are
        left out; a JSON line's nested ``"metrics": {...}`` object is read too.
    """
    text = strip_ansi(line).strip()
    found: dict[str, float] = {}
    if "{" in text:
        obj = _object(text)
        if obj is not None:
            nested = obj.get("metrics")
            items = list(obj.items()) + (list(nested.items()) if isinstance(nested, dict) else [])
            for key, value in items:
                number = _number(value)
                if number is not None and str(key) not in _NOT_METRICS:
                    found[str(key)] = number
            return found
    for key, value in _PAIR_EQ.findall(text):
        if key.lower() not in _NOT_METRICS:
            found[key] = float(value)
    for key, value in _PAIR_COLON.findall(text):
        if key.lower() not in _NOT_METRICS and _METRIC_NAME.search(key) and key not in found:
            found[key] = float(value)
    return {k: v for k, v in found.items() if math.isfinite(v)}


def is_record_line(line: str) -> bool:
    """True for a structured record line: the whole line is one JSON (or Python-literal)
    object, such as ``{"step": 4, "loss": 0.3}``. Its progress and metrics reach the
    ``train-progress`` and ``train-metrics`` artifacts; it is left out of log records."""
    text = strip_ansi(line).strip()
    return text.startswith("{") and text.endswith("}") and _object(text) is not None


class LogCoalescer:
    """Training-log lines gathered into few log records, at a bounded rate.

    ``add`` keeps a line (record lines, ``is_record_line``, and blank lines are left
    out); a batch is handed to ``emit`` once ``interval_seconds`` have passed since the
    last one, or when it holds ``max_lines`` lines, and ``flush`` hands over the rest
    (at the end of training, or before an error). So a job printing 30 lines a second
    makes one record per ``interval_seconds``, never 30.

    Args:
        emit: called with the lines of one record (at least one).
        interval_seconds: the least time between two records, in seconds.
        max_lines: the most lines in one record; more start the next one at once.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        emit: Callable[[list[str]], None],
        interval_seconds: float = 10.0,
        max_lines: int = 200,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.emit = emit
        self.interval_seconds = interval_seconds
        self.max_lines = max(1, max_lines)
        self.clock = clock or time.monotonic
        self.pending: list[str] = []
        self.records = 0
        self._last: float | None = None

    def add(self, line: str) -> None:
        """Keep ``line`` for the next record; hand a batch over when it is due."""
        if not line.strip() or is_record_line(line):
            return
        self.pending.append(line)
        now = self.clock()
        if self._last is None:
            self._last = now  # the first batch waits one interval, like every later one
        if len(self.pending) >= self.max_lines or now - self._last >= self.interval_seconds:
            self.flush()

    def tick(self) -> None:
        """Hand over what is pending when its interval has passed (called at each poll,
        so a job that goes quiet still gets its last lines out in time)."""
        due = self._last is not None and self.clock() - self._last >= self.interval_seconds
        if self.pending and due:
            self.flush()

    def flush(self) -> None:
        """Hand over what is pending as one record (nothing when empty)."""
        if not self.pending:
            return
        lines, self.pending = self.pending, []
        self._last = self.clock()
        self.records += 1
        self.emit(lines)
