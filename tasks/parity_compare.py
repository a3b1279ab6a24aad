"""The eval-parity comparison, pure (docs/architecture.md#eval-parity): does the user's
standalone eval score the trained model the way the in-training eval did?

Both paths write JSONL, one record per held-out example::

    {"id": ..., "raw_input": ..., "model_input": ..., "raw_output": ..., "prediction": ..., "label": ...}

``compare_eval`` matches records by ``id`` and names each way the two paths can drift
apart, the failure this stage exists for (the in-process eval says 0.9, the
standalone eval says 0.4): input drift (the model was fed a different ``model_input``:
skipped preprocessing, another truncation length, other whitespace or case handling),
parse drift (the prediction is not what the trained output format extracts from
``raw_output``: e.g. the first token), format violations, and the accuracy gap.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect_runpod.blocks.exceptions import EvalParityError
from prefect_runpod.tasks.models import ParityRecordDiff, ParityReport
from prefect_runpod.tasks.parity_render import DEFAULT_OUTPUT_FORMAT, char_diff

__all__ = ["compare_eval", "load_jsonl"]


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read an eval JSONL file: one JSON object per non-blank line.

    Raises:
        EvalParityError: when the file is missing or a line is not a JSON object (the
            message names the file and the line).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalParityError(
            f"eval records {path} cannot be read ({exc}); did the eval write its JSONL there?",
            stage="eval_parity",
        ) from exc
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalParityError(
                f"{path} line {number} is not JSON ({exc.msg}); each line must be one record",
                stage="eval_parity",
            ) from exc
        if not isinstance(record, dict):
            raise EvalParityError(f"{path} line {number} is not a JSON object", stage="eval_parity")
        records.append(record)
    return records


def _text(value: Any) -> str | None:
    """A field as stripped text; None and "" both mean 'no value'."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _parse(pattern: re.Pattern[str], raw_output: Any) -> str | None:
    match = pattern.search("" if raw_output is None else str(raw_output))
    return _text(match.group(1)) if match else None


def _first_words(raw_output: Any) -> set[str]:
    """What a naive 'first token' parser takes from an answer, with and without tags."""
    text = str(raw_output or "")
    found = set()
    for candidate in (text, re.sub(r"<[^>]*>", " ", text)):
        words = candidate.split()
        if words:
            found |= {words[0], words[0].strip(".,:;!?\"'")}
    return found


def _input_hint(pairs: list[tuple[str, str, str]]) -> str:
    """Guess what made the inputs differ, from (raw_input, train_input, eval_input) triples."""
    causes: Counter[str] = Counter()
    for raw, ours, theirs in pairs:
        squash_ours, squash_theirs = " ".join(ours.split()), " ".join(theirs.split())
        if theirs == raw or theirs.strip() == raw.strip():
            causes["raw"] += 1
        elif ours.startswith(theirs) or theirs.startswith(ours):
            causes["truncation"] += 1
        elif (
            squash_ours == squash_theirs
            or squash_ours.startswith(squash_theirs)
            or squash_theirs.startswith(squash_ours)
        ):
            causes["whitespace"] += 1
        elif ours.lower() == theirs.lower():
            causes["case"] += 1
        else:
            causes["other"] += 1
    cause = causes.most_common(1)[0][0]
    if cause == "raw":
        return "the standalone eval fed the raw input (skipped preprocessing?)"
    if cause == "truncation":
        longest_ours = max(len(o) for _, o, _ in pairs)
        longest_theirs = max(len(t) for _, _, t in pairs)
        return (
            "the inputs are cut at different lengths — a different truncation length? "
            f"(longest differing input: {longest_ours} chars in training, "
            f"{longest_theirs} standalone)"
        )
    if cause == "whitespace":
        return "the inputs differ only in whitespace — different whitespace normalisation?"
    if cause == "case":
        return "the inputs differ only in letter case — different case normalisation?"
    return "the standalone eval preprocesses differently — compare the inputs below"


def _parse_hint(triples: list[tuple[Any, str | None]]) -> str:
    """Guess how the standalone eval read its answers, from (raw_output, prediction) pairs."""
    first_word = sum(1 for raw, pred in triples if pred is not None and pred in _first_words(raw))
    whole = sum(1 for raw, pred in triples if pred is not None and pred == _text(raw))
    if first_word * 2 >= len(triples) and first_word:
        return "it took the first word of the answer instead of matching the output format?"
    if whole * 2 >= len(triples) and whole:
        return "it used the whole answer as the label instead of matching the output format?"
    return "it does not parse answers with the trained output format"


def _record_diff(
    rid: str,
    kinds: list[str],
    ours: dict[str, Any],
    theirs: dict[str, Any],
    predictions: tuple[str | None, str | None],
    parsed_theirs: str | None,
) -> ParityRecordDiff:
    """One divergent record, both sides side by side (``predictions``: training's,
    then the standalone eval's)."""
    ours_input, theirs_input = (
        str(ours.get("model_input", "")),
        str(theirs.get("model_input", "")),
    )
    pred_ours, pred_theirs = predictions
    return ParityRecordDiff(
        id=rid,
        kinds=kinds,
        train_model_input=ours_input,
        eval_model_input=theirs_input,
        input_diff=char_diff(ours_input, theirs_input) if "input_drift" in kinds else None,
        train_raw_output=_text(ours.get("raw_output")),
        eval_raw_output=_text(theirs.get("raw_output")),
        train_prediction=pred_ours,
        eval_prediction=pred_theirs,
        expected_parse=parsed_theirs,
        label=_text(ours.get("label")),
    )


def _add_reasons(
    report: ParityReport,
    n_train: int,
    n_eval: int,
    drifted_inputs: list[tuple[str, str, str]],
    parse_drift_eval: list[tuple[Any, str | None]],
    parse_drift_train: int,
    violations_train: set[str],
    violations_eval: set[str],
) -> None:
    """Name, in ``report.reasons``, each way the two evals drifted apart, in plain words
    (``n_train`` / ``n_eval``: the records on each side)."""
    n = report.n_records
    output_format, tolerance = report.output_format, report.tolerance
    reasons = report.reasons
    if not n:
        reasons.append(
            "no records in common: the two eval files share no id "
            f"({n_train} in training, {n_eval} standalone) — the same held-out split?"
        )
    if report.missing_in_eval or report.missing_in_train:
        reasons.append(
            f"coverage: {len(report.missing_in_eval)} training-eval records are missing from "
            f"the standalone eval and {len(report.missing_in_train)} standalone records are "
            "not in the training eval — they did not score the same held-out split"
        )
    if drifted_inputs:
        reasons.append(
            f"input drift: {len(drifted_inputs)}/{n} records fed different model_input — "
            + _input_hint(drifted_inputs)
        )
    if parse_drift_eval:
        reasons.append(
            f"parse drift: {len(parse_drift_eval)}/{n} standalone predictions are not what "
            f"{output_format} extracts from raw_output — " + _parse_hint(parse_drift_eval)
        )
    if parse_drift_train:
        reasons.append(
            f"parse drift in training: {parse_drift_train}/{n} in-training predictions are not "
            f"what {output_format} extracts from raw_output — is output_format in bundle.toml "
            "the format the model was trained to emit?"
        )
    if violations_train != violations_eval:
        reasons.append(
            f"format violations: {len(violations_eval)}/{n} standalone answers break "
            f"{output_format} against {len(violations_train)}/{n} in training — the model "
            "answers off-format when fed or prompted differently (input, prompt template, "
            "generation settings)"
        )
    if n and report.accuracy_gap > tolerance + 1e-9:  # a gap equal to the tolerance passes
        reasons.append(
            f"accuracy gap: in-training {report.accuracy_train:.3f} vs standalone "
            f"{report.accuracy_eval:.3f} (gap {report.accuracy_gap:.3f} > tolerance {tolerance:.3f})"
        )


def compare_eval(
    train_records: Sequence[dict[str, Any]],
    eval_records: Sequence[dict[str, Any]],
    output_format: str = DEFAULT_OUTPUT_FORMAT,
    tolerance: float = 0.02,
    max_divergent: int = 5,
) -> ParityReport:
    """Compare the in-training eval with the standalone eval, record by record.

    Args:
        train_records / eval_records: the two eval JSONL files as dicts, each with
            ``id``, ``raw_input``, ``model_input``, ``raw_output``, ``prediction``, ``label``.
        output_format: the regex the model was trained to emit; group 1 is the label
            (``re.DOTALL``, first match).
        tolerance: the allowed accuracy gap (0..1).
        max_divergent: how many divergent records to keep side by side.

    Returns:
        A ``ParityReport``. The verdict is ``fail`` when no record is common, a record is
        missing on one side, any input drift or parse drift is found, the two sides break
        the format on different records, or the accuracy gap exceeds ``tolerance``;
        ``reasons`` names each of these in plain words.
    """
    pattern = re.compile(output_format, re.DOTALL)
    train = {str(r.get("id")): r for r in train_records}
    other = {str(r.get("id")): r for r in eval_records}
    common = [i for i in train if i in other]
    report = ParityReport(
        n_records=len(common),
        missing_in_eval=[i for i in train if i not in other],
        missing_in_train=[i for i in other if i not in train],
        tolerance=tolerance,
        output_format=output_format,
    )
    drifted_inputs: list[tuple[str, str, str]] = []
    parse_drift_eval: list[tuple[Any, str | None]] = []
    parse_drift_train = 0
    correct_train = correct_eval = 0
    violations_train: set[str] = set()
    violations_eval: set[str] = set()
    for rid in common:
        ours, theirs = train[rid], other[rid]
        kinds: list[str] = []
        ours_input, theirs_input = (
            str(ours.get("model_input", "")),
            str(theirs.get("model_input", "")),
        )
        if ours_input != theirs_input:
            kinds.append("input_drift")
            drifted_inputs.append((str(ours.get("raw_input", "")), ours_input, theirs_input))
        parsed_ours = _parse(pattern, ours.get("raw_output"))
        parsed_theirs = _parse(pattern, theirs.get("raw_output"))
        pred_ours, pred_theirs = _text(ours.get("prediction")), _text(theirs.get("prediction"))
        drift_ours, drift_theirs = pred_ours != parsed_ours, pred_theirs != parsed_theirs
        if drift_ours or drift_theirs:
            kinds.append("parse_drift")
            parse_drift_train += drift_ours
            if drift_theirs:
                parse_drift_eval.append((theirs.get("raw_output"), pred_theirs))
        if pattern.search(str(ours.get("raw_output") or "")) is None:
            violations_train.add(rid)
        if pattern.search(str(theirs.get("raw_output") or "")) is None:
            violations_eval.add(rid)
        if rid in violations_train or rid in violations_eval:
            kinds.append("format_violation")
        if pred_ours != pred_theirs:
            kinds.append("prediction")
        correct_train += pred_ours is not None and pred_ours == _text(ours.get("label"))
        correct_eval += pred_theirs is not None and pred_theirs == _text(theirs.get("label"))
        report.input_drift += "input_drift" in kinds
        report.parse_drift += "parse_drift" in kinds
        if kinds and len(report.first_divergent) < max_divergent:
            report.first_divergent.append(
                _record_diff(rid, kinds, ours, theirs, (pred_ours, pred_theirs), parsed_theirs)
            )
    n = len(common)
    report.format_violations = len(violations_train | violations_eval)
    report.format_violations_train = len(violations_train)
    report.format_violations_eval = len(violations_eval)
    report.accuracy_train = correct_train / n if n else 0.0
    report.accuracy_eval = correct_eval / n if n else 0.0
    report.accuracy_gap = abs(report.accuracy_train - report.accuracy_eval)

    _add_reasons(
        report,
        len(train),
        len(other),
        drifted_inputs,
        parse_drift_eval,
        parse_drift_train,
        violations_train,
        violations_eval,
    )
    report.verdict = "fail" if report.reasons else "pass"
    return report
