"""The default demo bundle: a real stdlib classifier that trains in seconds, prints the
progress protocol, writes the checkpoint and both eval files, and runs on Python 3.8."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from prefect_runpod.tasks.bundle import load_bundle
from tests.fixtures.demo_bundle import DEMO_BUNDLE, copy_demo_bundle, run_script

EVAL_FIELDS = {"id", "raw_input", "model_input", "raw_output", "prediction", "label"}


def _load(name: str):
    """Import one of the bundle's modules under a private name (no sys.path change)."""
    spec = importlib.util.spec_from_file_location(f"demo_{name}", DEMO_BUNDLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


textproc = _load("textproc")
model_mod = _load("model")


@pytest.mark.parametrize("path", sorted(DEMO_BUNDLE.rglob("*.py")), ids=lambda p: p.name)
def test_every_script_parses_as_python_3_8(path: Path):
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 8))


def test_bundle_toml_declares_the_job():
    spec = load_bundle(DEMO_BUNDLE)
    assert spec.command(spec.train, "python3") == (
        "python3 -u train.py --out outputs --checkpoints checkpoints --resume-from ''"
    )
    assert spec.command(spec.train, "py", "checkpoints/step-20").endswith(
        "--resume-from checkpoints/step-20"
    )
    assert (spec.checkpoints, spec.checkpoint_marker, spec.keep_checkpoints) == (
        "checkpoints",
        "",
        2,
    )
    assert spec.command(spec.eval, "py") == (
        "py -u eval.py --checkpoint outputs/model.json --out outputs/eval_standalone.jsonl"
    )
    assert spec.requirements == [] and spec.model_id == ""
    assert spec.output_format == textproc.OUTPUT_FORMAT


class TestTextproc:
    def test_preprocess_strips_markup_entities_whitespace_and_case(self):
        raw = '<div class="m"><p>Hi&nbsp;THERE,\n\tmy <b>Refund</b> &amp; invoice&#39;s</p></div>'
        assert textproc.preprocess(raw) == "hi there, my refund & invoice's"

    def test_preprocess_truncates_to_the_fixed_length(self):
        out = textproc.preprocess("word " * 100)
        assert len(out) <= textproc.MAX_INPUT_CHARS == 200
        assert textproc.preprocess("abcdef", max_chars=3) == "abc"

    def test_parse_output_reads_the_first_tag_only(self):
        assert textproc.parse_output("Category: <output> billing </output>") == "billing"
        assert textproc.parse_output("<output>a</output><output>b</output>") == "a"
        assert textproc.parse_output("<output>multi\nline</output>") == "multi\nline"
        assert textproc.parse_output("I could not tell.") is None
        assert textproc.parse_output(None) is None


class TestData:
    def test_dataset_is_labelled_noisy_and_split(self):
        lines = (DEMO_BUNDLE / "data" / "tickets.jsonl").read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        assert len(records) >= 300
        assert {r["label"] for r in records} == {"billing", "shipping", "technical", "account"}
        assert {r["split"] for r in records} == {"train", "test"}
        texts = [r["text"] for r in records]
        assert sum(bool(re.search(r"<[a-z]+", t)) for t in texts) > len(texts) // 3
        assert sum("&" in t and ";" in t for t in texts) > len(texts) // 5
        assert sum(bool(re.search(r"\s{2,}|\t|\n", t)) for t in texts) > len(texts) // 3

    def test_generator_rewrites_the_shipped_file_byte_for_byte(self, tmp_path):
        out = tmp_path / "t.jsonl"
        result = run_script(DEMO_BUNDLE / "data", "generate.py", "--out", str(out))
        assert result.returncode == 0, result.stderr
        assert out.read_bytes() == (DEMO_BUNDLE / "data" / "tickets.jsonl").read_bytes()


class TestTraining:
    def test_train_writes_checkpoint_and_eval_and_eval_matches(self, trained_demo_bundle):
        outputs = trained_demo_bundle / "outputs"
        assert (outputs / "model.json").is_file()
        train_lines = (outputs / "eval_train.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in train_lines]
        assert rows and all(set(r) == EVAL_FIELDS for r in rows)
        accuracy = sum(r["prediction"] == r["label"] for r in rows) / len(rows)
        assert accuracy > 0.85
        assert all(r["model_input"] == textproc.preprocess(r["raw_input"]) for r in rows)
        # Some answers carry a preamble, so a first-word parser would be wrong.
        assert any(not r["raw_output"].startswith("<output>") for r in rows)
        result = run_script(
            trained_demo_bundle,
            "eval.py",
            "--checkpoint",
            "outputs/model.json",
            "--out",
            "outputs/eval_again.jsonl",
        )
        assert result.returncode == 0, result.stderr
        assert (outputs / "eval_again.jsonl").read_text(
            encoding="utf-8"
        ).splitlines() == train_lines

    def test_progress_lines_human_and_json_for_every_step(self, tmp_path):
        bundle = copy_demo_bundle(tmp_path / "b")
        result = run_script(bundle, "train.py", "--out", "o", "--epochs", "3")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        progress = [json.loads(x) for x in lines if x.startswith("{")]
        steps = [p for p in progress if "loss" in p]
        human = [x for x in lines if re.match(r"epoch \d+/3 \[[#.]+\] \d+/\d+ loss=", x)]
        assert len(steps) == len(human) == steps[-1]["total"] > 0
        assert [p["step"] for p in steps] == list(range(1, len(steps) + 1))
        assert steps[-1]["progress"] == 1.0 and steps[-1]["epoch"] == 3
        assert all(0 < p["progress"] <= 1 for p in progress)
        assert steps[-1]["loss"] < steps[0]["loss"]
        assert [p["epoch"] for p in progress if "eval_accuracy" in p] == [1, 2, 3]

    def test_same_seed_same_bytes(self, tmp_path):
        bundle = copy_demo_bundle(tmp_path / "b")
        for out in ("a", "b"):
            assert run_script(bundle, "train.py", "--out", out, "--seed", "7").returncode == 0
        for name in ("model.json", "eval_train.jsonl"):
            assert (bundle / "a" / name).read_bytes() == (bundle / "b" / name).read_bytes()

    def test_resumed_from_a_checkpoint_it_trains_the_same_model_byte_for_byte(self, tmp_path):
        """Issue 25: stopped at epoch 4 of 6 and resumed from its last checkpoint, the
        demo ends with the model an uninterrupted run with the same seed trains."""
        bundle = copy_demo_bundle(tmp_path / "b")
        args = ("--epochs", "6", "--seed", "3")
        assert run_script(bundle, "train.py", "--out", "plain", *args).returncode == 0
        first = run_script(
            bundle, "train.py", "--out", "o", *args, "--checkpoints", "ck", "--fail-at-epoch", "4"
        )
        assert first.returncode == 3 and not (bundle / "o" / "model.json").exists()
        assert sorted(p.name for p in (bundle / "ck").iterdir()) == [
            "step-20",
            "step-40",
            "step-60",
        ]
        resumed = run_script(
            bundle, "train.py", "--out", "o", *args, "--checkpoints", "ck", "--resume-from",
            "ck/step-60",
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed from ck/step-60 at step 60, epoch 3" in resumed.stdout
        plain, again = bundle / "plain" / "model.json", bundle / "o" / "model.json"
        assert again.read_bytes() == plain.read_bytes()
        # The job keeps its last three checkpoints on the pod, each whole (renamed).
        assert sorted(p.name for p in (bundle / "ck").iterdir()) == [
            "step-100",
            "step-120",
            "step-80",
        ]

    def test_resumed_without_the_random_state_it_trains_another_model(self, tmp_path):
        """The control: the byte identity above needs the saved random state."""
        bundle = copy_demo_bundle(tmp_path / "b")
        args = ("--epochs", "6", "--seed", "3", "--checkpoints", "ck")
        assert run_script(bundle, "train.py", "--out", "plain", *args[:4]).returncode == 0
        assert run_script(bundle, "train.py", "--out", "o", *args, "--fail-at-epoch", "4")
        state_file = bundle / "ck" / "step-60" / "state.json"
        state = json.loads(state_file.read_text())
        del state["rng"]
        state_file.write_text(json.dumps(state))
        resumed = run_script(bundle, "train.py", "--out", "o", *args, "--resume-from", "ck/step-60")
        assert resumed.returncode == 0 and "holds no random state" in resumed.stdout
        plain, again = bundle / "plain" / "model.json", bundle / "o" / "model.json"
        assert again.read_bytes() != plain.read_bytes()

    def test_fail_at_epoch_exits_non_zero_without_a_checkpoint(self, tmp_path):
        bundle = copy_demo_bundle(tmp_path / "b")
        result = run_script(
            bundle,
            "train.py",
            "--out",
            "o",
            "--fail-at-epoch",
            "2",
            "--sleep-per-epoch-seconds",
            "0.01",
        )
        assert result.returncode == 3
        assert "failing at epoch 2" in result.stderr
        assert "epoch 1/5 done" in result.stdout and "epoch 2/5 [" not in result.stdout
        assert not (bundle / "o" / "model.json").exists()

    def test_cleaned_text_model_does_clearly_worse_on_raw_text(self, trained_demo_bundle):
        model = model_mod.SoftmaxClassifier.load(trained_demo_bundle / "outputs" / "model.json")
        test = textproc.load_split(DEMO_BUNDLE / "data" / "tickets.jsonl", "test")

        def accuracy(shape):
            answers = [textproc.parse_output(model.generate(shape(r["text"]))) for r in test]
            return sum(a == r["label"] for a, r in zip(answers, test, strict=True)) / len(test)

        assert accuracy(textproc.preprocess) - accuracy(lambda raw: raw) > 0.1


def test_scripts_run_from_another_working_directory(trained_demo_bundle, tmp_path):
    """The pod may start the eval from anywhere: imports and data resolve from the bundle."""
    out = tmp_path / "e.jsonl"
    result = run_script(
        tmp_path,
        str(trained_demo_bundle / "eval.py"),
        "--checkpoint",
        str(trained_demo_bundle / "outputs" / "model.json"),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) > 50
