"""The eval-parity stage (docs/architecture.md#eval-parity): does the user's standalone eval score the trained
model the way the in-training eval did?

Both paths write JSONL, one record per held-out example::

    {"id": ..., "raw_input": ..., "model_input": ..., "raw_output": ..., "prediction": ..., "label": ...}

``compare_eval`` matches records by ``id`` and names each way the two paths can drift
apart, the failure mode the field guide describes ("in-process eval says 0.9, the
standalone eval says 0.4"): input drift (the model was fed a different ``model_input``:
skipped preprocessing, another truncation length, other whitespace or case handling),
parse drift (the prediction is not what the trained output format extracts from
``raw_output``: e.g. the first token), format violations, and the accuracy gap.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from prefect_runpod.blocks.exceptions import EvalParityError
from prefect_runpod.blocks.secret_mask import redact
from prefect_runpod.tasks.models import ParityRecordDiff, ParityReport
from prefect_runpod.tasks.parity_render import (
    DEFAULT_OUTPUT_FORMAT,
    char_diff,
    render_parity_markdown,
)

if TYPE_CHECKING:  # the console package loads paramiko; comparing needs none of it
    from pydantic import SecretStr

    from prefect_runpod.blocks.console import CommandOutput, ConsoleLike
    from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
    from prefect_runpod.blocks.pod_handle import PodHandle
    from prefect_runpod.blocks.transfer.s3 import S3Target
    from prefect_runpod.tasks.bundle import BundleSpec

__all__ = [
    "DEFAULT_OUTPUT_FORMAT",
    "char_diff",
    "check_parity_on_pod",
    "compare_eval",
    "eval_parity",
    "load_jsonl",
    "render_parity_markdown",
    "run_standalone_eval",
]


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
                ParityRecordDiff(
                    id=rid,
                    kinds=kinds,
                    train_model_input=ours_input,
                    eval_model_input=theirs_input,
                    input_diff=char_diff(ours_input, theirs_input)
                    if "input_drift" in kinds
                    else None,
                    train_raw_output=_text(ours.get("raw_output")),
                    eval_raw_output=_text(theirs.get("raw_output")),
                    train_prediction=pred_ours,
                    eval_prediction=pred_theirs,
                    expected_parse=parsed_theirs,
                    label=_text(ours.get("label")),
                )
            )
    n = len(common)
    report.format_violations = len(violations_train | violations_eval)
    report.format_violations_train = len(violations_train)
    report.format_violations_eval = len(violations_eval)
    report.accuracy_train = correct_train / n if n else 0.0
    report.accuracy_eval = correct_eval / n if n else 0.0
    report.accuracy_gap = abs(report.accuracy_train - report.accuracy_eval)

    reasons = report.reasons
    if not n:
        reasons.append(
            "no records in common: the two eval files share no id "
            f"({len(train)} in training, {len(other)} standalone) — the same held-out split?"
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
    report.verdict = "fail" if reasons else "pass"
    return report


def run_standalone_eval(
    console: ConsoleLike,
    bundle_remote_dir: str,
    eval_command: str,
    python: str,
    timeout_seconds: float,
    output_path: str | None = None,
) -> CommandOutput:
    """Run the bundle's own, unmodified eval command on the pod, as the user would.

    Args:
        console: an open pod console (``PodConsole`` or any ``ConsoleLike``).
        bundle_remote_dir: the bundle's directory on the pod (the command runs there).
        eval_command: the ``eval`` template from ``bundle.toml`` (``{python}`` placeholder).
        python: the interpreter the env stage chose.
        timeout_seconds: the deadline for the whole eval, in seconds.
        output_path: the standalone JSONL path relative to the bundle; when given, a stale
            copy is removed first and its absence afterwards is an error.

    Returns:
        The console's result of the eval command (``output``, ``exit_code``).

    Raises:
        EvalParityError: the eval exited non-zero or wrote no ``output_path`` (the message
            carries the last lines of its output).
        CommandTimeoutError: (from the console) the eval ran past ``timeout_seconds``.
    """
    if not eval_command.strip():
        raise EvalParityError(
            "bundle.toml declares no eval command; add `eval = ...` to [job] or skip eval parity",
            stage="eval_parity",
        )
    command = eval_command.replace("{python}", python)
    script = f"cd {shlex.quote(bundle_remote_dir)} && "
    if output_path:
        script += f"rm -f {shlex.quote(output_path)} && "
    script += command
    if output_path:
        script += f" && test -s {shlex.quote(output_path)}"
    result = console.run(script, timeout_seconds=timeout_seconds, check=False)
    if result.exit_code != 0:
        tail = "\n".join(str(result.output).splitlines()[-15:])
        missing = f" or wrote no {output_path}" if output_path else ""
        raise EvalParityError(
            f"the standalone eval `{command}` exited {result.exit_code}{missing} in "
            f"{bundle_remote_dir}; fix the bundle's eval script. Last lines:\n{tail}",
            stage="eval_parity",
        )
    return result


@task(name="eval_parity")
def eval_parity(
    train_jsonl: str | Path,
    eval_jsonl: str | Path,
    output_format: str = DEFAULT_OUTPUT_FORMAT,
    tolerance: float = 0.02,
    max_divergent: int = 5,
    warn_only: bool = False,
    pod_id: str | None = None,
) -> ParityReport:
    """Compare the downloaded in-training and standalone eval JSONL files, publish the
    ``eval-parity`` markdown artifact, and return the report.

    Args:
        train_jsonl / eval_jsonl: local paths of the two eval files.
        output_format, tolerance, max_divergent: see ``compare_eval``.
        warn_only: log a failed verdict instead of raising.
        pod_id: the pod the evals ran on, for messages.

    Returns:
        The ``ParityReport``.

    Raises:
        EvalParityError: the verdict is ``fail`` and not ``warn_only`` (``report`` attached),
            or a file is missing or malformed (from ``load_jsonl``).
    """
    logger = get_run_logger()
    report = compare_eval(
        load_jsonl(train_jsonl), load_jsonl(eval_jsonl), output_format, tolerance, max_divergent
    )
    create_markdown_artifact(
        markdown=redact(render_parity_markdown(report)),  # records quote the job's own text
        key="eval-parity",
        description=f"eval parity {report.verdict} on pod {pod_id or '-'}",
    )
    logger.info(
        "%s eval parity %s: in-training %.3f vs standalone %.3f on %d records",
        pod_id or "-",
        report.verdict,
        report.accuracy_train,
        report.accuracy_eval,
        report.n_records,
    )
    if report.verdict == "fail":
        summary = "; ".join(report.reasons)
        if warn_only:
            logger.warning("%s eval parity failed (warn_only): %s", pod_id or "-", summary)
        else:
            raise EvalParityError(
                f"eval parity failed on pod {pod_id or '-'}: {summary}. See the eval-parity "
                "artifact; make the standalone eval use the training preprocessing and "
                "output parsing, or pass warn_only to accept it.",
                report=report,
                pod_id=pod_id,
                stage="eval_parity",
            )
    return report


def check_parity_on_pod(
    handle: PodHandle,
    private_key: SecretStr,
    bundle: BundleSpec,
    run_dir: str,
    python: str,
    local_dir: Path,
    *,
    timeout_seconds: float,
    tolerance: float = 0.02,
    warn_only: bool = False,
    transfer_method: str = "auto",
    hf_token: SecretStr | None = None,
    s3: S3Target | None = None,
    reconnect: ReconnectPolicy | None = None,
) -> ParityReport:
    """The whole ``eval_parity`` stage on a trained pod: run the bundle's own standalone
    eval there, bring both eval JSONL files home with a verified manifest, and compare
    them (``eval_parity``).

    The two files are copied on the pod into ``<run_dir>/parity`` (as ``train.jsonl``
    and ``standalone.jsonl``) so that only they travel, then downloaded into
    ``local_dir``.

    Args:
        handle: the pod.
        private_key: the SSH key (unwrapped only inside the console).
        bundle: the bundle spec: its ``eval`` command, both JSONL paths, ``output_format``.
        run_dir: the pod-side run directory; the trained bundle is ``<run_dir>/bundle``.
        python: the pod interpreter the env stage chose (``{python}`` in the command).
        local_dir: where the two JSONL files are downloaded.
        timeout_seconds: the deadline for the standalone eval, in seconds.
        tolerance / warn_only: as for ``eval_parity``.
        transfer_method: ``auto``, ``pty``, ``sftp``, ``s3`` or ``runpodctl``.
        hf_token: exported hidden as ``HF_TOKEN`` first: the eval may load a gated base
            model too.
        s3: the ``S3Target`` for ``transfer_method="s3"``.
        reconnect: the run's reconnect policy: a gateway outage is waited out and the
            step it cut off (the eval, which removes its stale output first, the copy,
            the download from its last verified chunk) runs again.

    Returns:
        The ``ParityReport`` (verdict ``pass``, or ``fail`` under ``warn_only``).

    Raises:
        EvalParityError: the eval failed or wrote nothing, or the verdict is ``fail``
            without ``warn_only`` (the report attached as ``.report``).
        ConsoleError: the copy on the pod failed. ConsoleConnectError and
            CommandTimeoutError come from the console, TransferError and
            ChecksumMismatchError from the download.

    Example:
        ```python
        @flow
        def parity(handle, key, bundle):
            return check_parity_on_pod(
                handle, key, bundle, "/workspace/prefect-runpod/run-1", "python3",
                Path("out/parity"), timeout_seconds=3600,
            )
        ```
    """
    from prefect_runpod.blocks.console import PodConsole
    from prefect_runpod.blocks.console.reconnect import resuming
    from prefect_runpod.blocks.transfer import download_dir

    remote_bundle = f"{run_dir}/bundle"
    parity_dir = f"{run_dir}/parity"
    q = shlex.quote
    with PodConsole.for_pod(handle, private_key, reconnect=reconnect) as console:
        steps = resuming(console)
        if hf_token is not None:
            console.set_secret_env("HF_TOKEN", hf_token)
        run_standalone_eval(
            steps,
            remote_bundle,
            bundle.eval,
            python,
            timeout_seconds=timeout_seconds,
            output_path=bundle.standalone_eval_jsonl,
        )
        steps.run(
            f"rm -rf {q(parity_dir)} && mkdir -p {q(parity_dir)} && "
            f"cp {q(remote_bundle + '/' + bundle.train_eval_jsonl)} {q(parity_dir)}/train.jsonl && "
            f"cp {q(remote_bundle + '/' + bundle.standalone_eval_jsonl)} {q(parity_dir)}/standalone.jsonl",
            check=True,
        )
        download_dir(
            console,
            handle,
            parity_dir,
            local_dir,
            method=transfer_method,
            private_key=private_key,
            s3=s3,
        )
    return eval_parity(
        local_dir / "train.jsonl",
        local_dir / "standalone.jsonl",
        output_format=bundle.output_format,
        tolerance=tolerance,
        warn_only=warn_only,
        pod_id=handle.pod_id,
    )
