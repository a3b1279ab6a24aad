"""How eval-parity results read: the character diff of two model inputs and the
``eval-parity`` markdown artifact (docs/architecture.md#eval-parity). Pure functions, no Prefect."""

from __future__ import annotations

import difflib
from typing import Any

from prefect_runpod.tasks.models import ParityReport

__all__ = ["DEFAULT_OUTPUT_FORMAT", "char_diff", "render_parity_markdown"]

DEFAULT_OUTPUT_FORMAT = r"<output>(.*?)</output>"
"""The output format a bundle's model emits unless its ``bundle.toml`` says otherwise."""

_DIFF_CONTEXT_CHARS = 24  # equal stretches longer than twice this are elided in diffs
_CELL_CHARS = 300  # longest text shown in one markdown table cell


def _visible(text: str) -> str:
    return text.replace("\n", "\\n").replace("\t", "\\t")


def char_diff(a: str, b: str, limit_chars: int = 400) -> str:
    """A one-line character diff of ``a`` → ``b`` (difflib): ``[-removed-]{+added+}``,
    long equal stretches elided with ``…``, whitespace shown as ``\\n``/``\\t``."""
    parts: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            same = a[i1:i2]
            if len(same) > 2 * _DIFF_CONTEXT_CHARS:
                same = same[:_DIFF_CONTEXT_CHARS] + "…" + same[-_DIFF_CONTEXT_CHARS:]
            parts.append(_visible(same))
        if op in ("replace", "delete"):
            parts.append("[-" + _visible(a[i1:i2]) + "-]")
        if op in ("replace", "insert"):
            parts.append("{+" + _visible(b[j1:j2]) + "+}")
    out = "".join(parts)
    return out if len(out) <= limit_chars else out[: limit_chars - 1] + "…"


def _cell(value: Any) -> str:
    """Text made safe for one markdown table cell (HTML escaped, pipes and newlines kept
    visible), cut to a readable length."""
    if value is None:
        return "—"
    text = _visible(str(value))
    if len(text) > _CELL_CHARS:
        text = text[: _CELL_CHARS - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|").replace("`", "'")


def render_parity_markdown(report: ParityReport) -> str:
    """The ``eval-parity`` markdown artifact: a verdict line, a table of counts, the
    reasons, and the first divergent records side by side."""
    n = report.n_records
    verdict = "PASS" if report.verdict == "pass" else "FAIL"
    lines = [
        f"## Eval parity: {verdict}",
        "",
        f"In-training eval vs the bundle's standalone eval on {n} common records "
        f"(accuracy gap {report.accuracy_gap:.3f}, tolerance {report.tolerance:.3f}); "
        f"output format `{report.output_format or DEFAULT_OUTPUT_FORMAT}`.",
        "",
        "| check | in-training | standalone |",
        "|---|---|---|",
        f"| accuracy | {report.accuracy_train:.3f} | {report.accuracy_eval:.3f} |",
        f"| format violations | {report.format_violations_train} | {report.format_violations_eval} |",
        f"| records missing from the other side | {len(report.missing_in_eval)} "
        f"| {len(report.missing_in_train)} |",
        f"| input drift (records) | | {report.input_drift} |",
        f"| parse drift (records) | | {report.parse_drift} |",
        "",
    ]
    if report.reasons:
        lines += ["### Why it failed", ""] + [f"- {_cell(r)}" for r in report.reasons] + [""]
    else:
        lines += ["Both paths fed the model the same inputs and read its answers the same way.", ""]
    if report.first_divergent:
        lines += [f"### First {len(report.first_divergent)} divergent records", ""]
    for diff in report.first_divergent:
        lines += [
            f"#### {_cell(diff.id)} — {', '.join(diff.kinds)}",
            "",
            "| | in-training | standalone |",
            "|---|---|---|",
            f"| model_input | {_cell(diff.train_model_input)} | {_cell(diff.eval_model_input)} |",
            f"| raw_output | {_cell(diff.train_raw_output)} | {_cell(diff.eval_raw_output)} |",
            f"| prediction | {_cell(diff.train_prediction)} | {_cell(diff.eval_prediction)} |",
            f"| format parse | | {_cell(diff.expected_parse)} |",
            f"| label | {_cell(diff.label)} | |",
            "",
        ]
        if diff.input_diff:
            lines += [f"input diff (training → standalone): {_cell(diff.input_diff)}", ""]
    return "\n".join(lines)
