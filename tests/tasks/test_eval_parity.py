"""Eval parity (docs/architecture.md#eval-parity): each way a standalone eval drifts from the in-training eval
is reproduced on the real demo job (a real train, then a drifted copy of its eval.py run
as a real subprocess) and must be detected and named; the unmodified eval must pass."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from prefect_runpod.blocks.exceptions import EvalParityError
from prefect_runpod.tasks.eval_parity import (
    char_diff,
    render_parity_markdown,
    run_standalone_eval,
)
from prefect_runpod.tasks.parity_compare import compare_eval, load_jsonl
from tests.fixtures.demo_bundle import run_script

PREPROCESS_CALL = 'model_input = textproc.preprocess(record["text"])'
PARSE_CALL = "prediction = textproc.parse_output(raw_output)"

# Each drift: (text in eval.py, its replacement, helper code added after the imports).
DRIFTS = {
    "raw_input": (PREPROCESS_CALL, 'model_input = record["text"]', ""),
    "first_token": (
        PARSE_CALL,
        "prediction = raw_output.split()[0] if raw_output.split() else None",
        "",
    ),
    "truncation": (
        PREPROCESS_CALL,
        'model_input = textproc.preprocess(record["text"], max_chars=120)',
        "",
    ),
    "whitespace": (
        PREPROCESS_CALL,
        'model_input = _clean(record["text"])',
        # The user's own cleaning: same tags/entities/case, but whitespace only stripped
        # at the ends instead of collapsed.
        "import html, re\n"
        "def _clean(raw):\n"
        "    text = html.unescape(re.sub(r'<[^>]+>', ' ', raw)).lower().strip()\n"
        "    return text[:textproc.MAX_INPUT_CHARS].rstrip()\n",
    ),
}


def _drifted_eval(bundle: Path, name: str) -> list[dict]:
    """Write eval_<name>.py (eval.py with one drift), run it for real, return its records."""
    source = (bundle / "eval.py").read_text(encoding="utf-8")
    old, new, helper = DRIFTS[name]
    assert source.count(old) == 1, f"eval.py no longer contains {old!r}; update the drift"
    source = source.replace(old, new)
    anchor = "from model import SoftmaxClassifier  # noqa: E402\n"
    assert anchor in source
    source = source.replace(anchor, anchor + helper)
    (bundle / f"eval_{name}.py").write_text(source, encoding="utf-8")
    out = f"outputs/eval_{name}.jsonl"
    result = run_script(
        bundle, f"eval_{name}.py", "--checkpoint", "outputs/model.json", "--out", out
    )
    assert result.returncode == 0, result.stderr
    return load_jsonl(bundle / out)


@pytest.fixture(scope="module")
def train_records(trained_demo_bundle: Path) -> list[dict]:
    return load_jsonl(trained_demo_bundle / "outputs" / "eval_train.jsonl")


class TestCompareEvalOnTheDemoJob:
    def test_unmodified_standalone_eval_passes(self, trained_demo_bundle, train_records):
        result = run_script(
            trained_demo_bundle,
            "eval.py",
            "--checkpoint",
            "outputs/model.json",
            "--out",
            "outputs/eval_standalone.jsonl",
        )
        assert result.returncode == 0, result.stderr
        report = compare_eval(
            train_records, load_jsonl(trained_demo_bundle / "outputs/eval_standalone.jsonl")
        )
        assert report.verdict == "pass", report.reasons
        assert report.reasons == [] and report.first_divergent == []
        assert report.n_records == len(train_records) > 50
        assert report.input_drift == report.parse_drift == 0
        assert report.accuracy_train == report.accuracy_eval > 0.85

    def test_raw_input_is_named_as_skipped_preprocessing(self, trained_demo_bundle, train_records):
        report = compare_eval(train_records, _drifted_eval(trained_demo_bundle, "raw_input"))
        assert report.verdict == "fail"
        assert report.input_drift == report.n_records
        assert any(
            r.startswith("input drift:") and "skipped preprocessing" in r for r in report.reasons
        )
        # Fed raw text, the model does clearly worse and answers off-format.
        assert report.accuracy_eval < report.accuracy_train - 0.1
        assert report.format_violations_eval > report.format_violations_train
        assert any(r.startswith("accuracy gap:") for r in report.reasons)
        first = report.first_divergent[0]
        assert "input_drift" in first.kinds and first.input_diff
        assert first.eval_model_input == next(
            r["raw_input"] for r in train_records if r["id"] == first.id
        )

    def test_first_token_parse_is_named_as_parse_drift(self, trained_demo_bundle, train_records):
        report = compare_eval(train_records, _drifted_eval(trained_demo_bundle, "first_token"))
        assert report.verdict == "fail"
        assert report.input_drift == 0
        assert report.parse_drift > report.n_records // 2
        reason = next(r for r in report.reasons if r.startswith("parse drift:"))
        assert "first word" in reason and "<output>(.*?)</output>" in reason
        diff = report.first_divergent[0]
        assert diff.kinds[0] == "parse_drift"
        assert diff.expected_parse == diff.train_prediction != diff.eval_prediction

    def test_other_truncation_length_is_named(self, trained_demo_bundle, train_records):
        report = compare_eval(train_records, _drifted_eval(trained_demo_bundle, "truncation"))
        assert report.verdict == "fail"
        assert 0 < report.input_drift < report.n_records
        reason = next(r for r in report.reasons if r.startswith("input drift:"))
        assert "truncation" in reason
        assert all(
            d.train_model_input.startswith(d.eval_model_input) for d in report.first_divergent
        )

    def test_other_whitespace_normalisation_is_named(self, trained_demo_bundle, train_records):
        report = compare_eval(train_records, _drifted_eval(trained_demo_bundle, "whitespace"))
        assert report.verdict == "fail"
        assert report.input_drift > 0
        reason = next(r for r in report.reasons if r.startswith("input drift:"))
        assert "whitespace" in reason

    def test_markdown_shows_verdict_counts_reasons_and_records(
        self, trained_demo_bundle, train_records
    ):
        report = compare_eval(train_records, _drifted_eval(trained_demo_bundle, "raw_input"))
        md = render_parity_markdown(report)
        assert md.startswith("## Eval parity: FAIL")
        assert f"| input drift (records) | | {report.input_drift} |" in md
        assert "input drift:" in md and report.first_divergent[0].id in md
        # Model answers and raw HTML are escaped, never rendered as tags.
        assert "&lt;output&gt;" in md and "<output>" not in md.split("\n", 3)[3]


class TestCompareEvalRules:
    @staticmethod
    def rec(rid, model_input="a b", raw_output="<output>x</output>", prediction="x", label="x"):
        return {
            "id": rid,
            "raw_input": model_input,
            "model_input": model_input,
            "raw_output": raw_output,
            "prediction": prediction,
            "label": label,
        }

    def test_missing_records_on_either_side_fail(self):
        report = compare_eval([self.rec(1), self.rec(2)], [self.rec(2), self.rec(3)])
        assert report.verdict == "fail"
        assert report.missing_in_eval == ["1"] and report.missing_in_train == ["3"]
        assert report.n_records == 1
        assert any(r.startswith("coverage:") for r in report.reasons)

    def test_no_common_record_fails(self):
        report = compare_eval([self.rec("a")], [self.rec("b")])
        assert report.verdict == "fail" and report.n_records == 0
        assert any(r.startswith("no records in common") for r in report.reasons)

    def test_gap_within_tolerance_passes_and_beyond_fails(self):
        train = [self.rec(i) for i in range(50)]
        wrong = [self.rec(i, raw_output="<output>y</output>", prediction="y") for i in range(1)]
        other = wrong + train[1:]
        assert compare_eval(train, other, tolerance=0.02).verdict == "pass"  # gap 0.02
        failed = compare_eval(train, other, tolerance=0.01)
        assert failed.verdict == "fail" and failed.reasons[0].startswith("accuracy gap:")
        assert failed.first_divergent[0].kinds == ["prediction"]

    def test_same_off_format_answer_on_both_sides_is_not_a_drift(self):
        unsure = self.rec(1, raw_output="not sure", prediction=None)
        report = compare_eval([unsure, self.rec(2)], [dict(unsure), self.rec(2)])
        assert report.verdict == "pass", report.reasons
        assert report.format_violations == report.format_violations_eval == 1

    def test_prediction_of_empty_string_equals_no_parse(self):
        train = [self.rec(1, raw_output="???", prediction=None)]
        other = [self.rec(1, raw_output="???", prediction="")]
        assert compare_eval(train, other).parse_drift == 0

    def test_training_side_parse_drift_points_at_output_format(self):
        train = [self.rec(1, raw_output="[[x]]", prediction="x")]
        report = compare_eval(train, [dict(train[0])])
        assert report.verdict == "fail"
        assert any("parse drift in training" in r and "output_format" in r for r in report.reasons)

    def test_case_only_drift_is_named(self):
        report = compare_eval([self.rec(1, "hello world")], [self.rec(1, "Hello World")])
        assert "letter case" in report.reasons[0]

    def test_custom_output_format(self):
        rec = self.rec(1, raw_output="LABEL=x;", prediction="x")
        assert compare_eval([rec], [dict(rec)], output_format=r"LABEL=(\w+);").verdict == "pass"
        assert compare_eval([rec], [dict(rec)]).verdict == "fail"

    def test_max_divergent_caps_the_side_by_side_records(self):
        train = [self.rec(i, "a") for i in range(10)]
        other = [self.rec(i, "b") for i in range(10)]
        report = compare_eval(train, other, max_divergent=3)
        assert report.input_drift == 10 and [d.id for d in report.first_divergent] == [
            "0",
            "1",
            "2",
        ]


def test_char_diff_marks_removed_and_added_text():
    assert char_diff("the cat sat", "the bat sat") == "the [-c-]{+b+}at sat"
    assert char_diff("a\tb", "a b") == "a[-\\t-]{+ +}b"
    long_same = "x" * 200
    assert "…" in char_diff(long_same + "1", long_same + "2")


class TestLoadJsonl:
    def test_missing_file_names_the_path(self, tmp_path):
        with pytest.raises(EvalParityError, match="nope.jsonl"):
            load_jsonl(tmp_path / "nope.jsonl")

    def test_bad_line_names_the_line(self, tmp_path):
        path = tmp_path / "e.jsonl"
        path.write_text('{"id": 1}\n\nnot json\n', encoding="utf-8")
        with pytest.raises(EvalParityError, match="line 3"):
            load_jsonl(path)


@pytest.fixture
def pod_console(local_pod):
    """A real PodConsole (PTY over SSH) on a real local gateway-mode pod."""
    from prefect_runpod.blocks.console.session import PodConsole

    _provider, handle, keypair = local_pod
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        yield console


@pytest.mark.slow
class TestRunStandaloneEval:
    """The bundle's own eval run through the pod console, as the flow runs it."""

    def test_runs_the_bundle_eval_unmodified(self, pod_console, trained_demo_bundle):
        out = "outputs/eval_console.jsonl"
        (trained_demo_bundle / out).write_text("stale\n", encoding="utf-8")
        result = run_standalone_eval(
            pod_console,
            str(trained_demo_bundle),
            "{python} -u eval.py --checkpoint outputs/model.json --out " + out,
            sys.executable,
            timeout_seconds=120,
            output_path=out,
        )
        assert result.exit_code == 0
        records = load_jsonl(trained_demo_bundle / out)  # the stale file was replaced
        assert f'"records": {len(records)}' in result.output
        train = load_jsonl(trained_demo_bundle / "outputs/eval_train.jsonl")
        assert compare_eval(train, records).verdict == "pass"

    def test_failing_eval_raises_with_its_output(self, pod_console, trained_demo_bundle):
        with pytest.raises(EvalParityError, match=r"exited 2(.|\n)*no-such-flag"):
            run_standalone_eval(
                pod_console,
                str(trained_demo_bundle),
                "{python} eval.py --no-such-flag",
                sys.executable,
                timeout_seconds=60,
            )

    def test_eval_that_writes_nothing_is_an_error(self, pod_console, trained_demo_bundle):
        with pytest.raises(EvalParityError, match="wrote no outputs/never.jsonl"):
            run_standalone_eval(
                pod_console,
                str(trained_demo_bundle),
                "{python} -c 'pass'",
                sys.executable,
                timeout_seconds=60,
                output_path="outputs/never.jsonl",
            )

    def test_no_eval_command_is_a_clear_error(self, trained_demo_bundle):
        with pytest.raises(EvalParityError, match="declares no eval command"):
            run_standalone_eval(None, str(trained_demo_bundle), " ", sys.executable, 10)


@pytest.mark.slow
class TestEvalParityTask:
    """The @task on a real Prefect API: artifact published, fail raises, warn_only returns."""

    @staticmethod
    def _artifacts(flow_run_id):
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            ArtifactFilter,
            ArtifactFilterKey,
            FlowRunFilter,
            FlowRunFilterId,
        )

        with get_client(sync_client=True) as client:
            return client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["eval-parity"])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            )

    def test_fail_raises_with_report_and_publishes_markdown(
        self, prefect_server, trained_demo_bundle
    ):
        from prefect import flow
        from prefect.context import get_run_context

        from prefect_runpod.tasks.eval_parity import eval_parity

        drifted = trained_demo_bundle / "outputs" / "eval_task_raw.jsonl"
        drifted.write_text(
            "".join(
                json.dumps(dict(r, model_input=r["raw_input"])) + "\n"
                for r in load_jsonl(trained_demo_bundle / "outputs/eval_train.jsonl")
            ),
            encoding="utf-8",
        )
        seen = {}

        @flow
        def parity_flow(warn_only: bool):
            seen["flow_run_id"] = get_run_context().flow_run.id
            return eval_parity(
                str(trained_demo_bundle / "outputs/eval_train.jsonl"),
                str(drifted),
                warn_only=warn_only,
                pod_id="pod-test1",
            )

        with pytest.raises(EvalParityError, match="pod-test1.*input drift") as info:
            parity_flow(warn_only=False)
        assert info.value.report.verdict == "fail"
        (artifact,) = self._artifacts(seen["flow_run_id"])
        assert artifact.type == "markdown"
        assert artifact.data.startswith("## Eval parity: FAIL")

        report = parity_flow(warn_only=True)
        assert report.verdict == "fail" and report.input_drift == report.n_records


@pytest.mark.slow
class TestCheckParityOnPod:
    """The whole stage on a real local pod: the bundle's eval run through the console,
    both files downloaded with a verified manifest, compared, the artifact published."""

    @staticmethod
    def _on_pod(handle, trained_demo_bundle: Path) -> str:
        import shutil

        run_dir = f"{handle.workdir}/prefect-runpod/parity-run"
        shutil.copytree(trained_demo_bundle, Path(run_dir) / "bundle")
        return run_dir

    def test_unmodified_eval_passes_and_both_files_come_home(
        self, prefect_server, local_pod, trained_demo_bundle, tmp_path
    ):
        from prefect import flow

        from prefect_runpod.tasks.bundle import load_bundle
        from prefect_runpod.tasks.eval_parity import check_parity_on_pod

        _provider, handle, keypair = local_pod
        run_dir = self._on_pod(handle, trained_demo_bundle)
        bundle = load_bundle(trained_demo_bundle)

        @flow
        def stage():
            return check_parity_on_pod(
                handle, keypair.private_key, bundle, run_dir, sys.executable,
                tmp_path / "parity", timeout_seconds=120,
            )  # fmt: skip

        report = stage()
        assert report.verdict == "pass" and report.n_records > 0
        train = load_jsonl(tmp_path / "parity" / "train.jsonl")
        standalone = load_jsonl(tmp_path / "parity" / "standalone.jsonl")
        assert len(train) == len(standalone) == report.n_records
        pod_standalone = Path(run_dir) / "bundle" / bundle.standalone_eval_jsonl
        assert load_jsonl(pod_standalone) == standalone  # written on the pod just now

    def test_drifted_eval_fails_with_the_report(
        self, prefect_server, local_pod, trained_demo_bundle, tmp_path
    ):
        from prefect import flow

        from prefect_runpod.tasks.bundle import load_bundle
        from prefect_runpod.tasks.eval_parity import check_parity_on_pod

        _provider, handle, keypair = local_pod
        run_dir = self._on_pod(handle, trained_demo_bundle)
        eval_py = Path(run_dir) / "bundle" / "eval.py"
        old, new, _ = DRIFTS["raw_input"]
        eval_py.write_text(eval_py.read_text(encoding="utf-8").replace(old, new), "utf-8")
        bundle = load_bundle(trained_demo_bundle)

        @flow
        def stage(warn_only: bool):
            return check_parity_on_pod(
                handle, keypair.private_key, bundle, run_dir, sys.executable,
                tmp_path / "parity", timeout_seconds=120, warn_only=warn_only,
            )  # fmt: skip

        with pytest.raises(EvalParityError, match=f"{handle.pod_id}.*input drift") as info:
            stage(warn_only=False)
        assert info.value.report.verdict == "fail"
        assert stage(warn_only=True).input_drift == info.value.report.n_records
