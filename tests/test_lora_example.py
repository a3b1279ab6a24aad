"""The real LoRA example bundle (examples/lora-sft): its pure parts always; a full tiny
CPU run (random 2-layer Llama, char tokenizer, real peft LoRA) when torch, transformers
and peft import in the interpreter named by ``PREFECT_RUNPOD_LORA_PYTHON`` (default:
this one)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_runpod.tasks.bundle import load_bundle
from prefect_runpod.tasks.parity_compare import compare_eval, load_jsonl

LORA_BUNDLE = Path(__file__).resolve().parents[1] / "examples" / "lora-sft"
DEMO_BUNDLE = LORA_BUNDLE.parent / "demo"


def _load(bundle: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"{bundle.name}_{name}", bundle / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


textproc = _load(LORA_BUNDLE, "textproc")
sft = _load(LORA_BUNDLE, "sft")
LABELS = ["account", "billing", "shipping", "technical"]


@pytest.mark.parametrize("path", sorted(LORA_BUNDLE.glob("*.py")), ids=lambda p: p.name)
def test_scripts_parse_as_python_3_8(path: Path):
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=(3, 8))


def test_bundle_toml_declares_requirements_and_model():
    spec = load_bundle(LORA_BUNDLE)
    assert spec.requirements == ["transformers>=4.46", "peft>=0.13", "torch>=2.4"]
    assert spec.model_id == "meta-llama/Llama-3.2-1B"
    assert f"--model-id {spec.model_id}" in spec.train
    assert "--checkpoint outputs/adapter" in spec.eval


def test_cleaning_rules_are_the_demo_bundles():
    demo = _load(DEMO_BUNDLE, "textproc")
    texts = [
        json.loads(line)["text"]
        for line in (LORA_BUNDLE / "data" / "tickets.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
    ]
    assert all(textproc.preprocess(t) == demo.preprocess(t) for t in texts)


class TestPrompt:
    def test_prompt_holds_the_cleaned_ticket_and_the_labels(self):
        prompt = textproc.build_prompt(
            textproc.preprocess("<p>My  PARCEL&nbsp;is late</p>"), LABELS
        )
        assert "Ticket: my parcel is late\n" in prompt
        assert "account, billing, shipping, technical" in prompt
        assert prompt.endswith("Answer: ")

    def test_target_round_trips_through_the_parser(self):
        for label in LABELS:
            assert textproc.parse_output("noise " + textproc.format_target(label)) == label
        assert textproc.parse_output("<output>billing") is None


class TestEncoding:
    tok = sft.CharTokenizer.from_texts(["abcdefghijklmnopqrstuvwxyz <>/:"])

    def test_loss_covers_only_the_answer_and_eos(self):
        ex = sft.encode_example(self.tok, "q: ab", "<output>a</output>", max_tokens=64)
        answer = self.tok.encode("<output>a</output>") + [self.tok.eos_token_id]
        assert len(ex["input_ids"]) == len(ex["labels"]) == 5 + len(answer)
        assert ex["labels"][:5] == [sft.IGNORE_INDEX] * 5
        assert ex["labels"][5:] == answer == ex["input_ids"][5:]

    def test_long_prompt_is_cut_never_the_answer(self):
        ex = sft.encode_example(self.tok, "x" * 100, "ab", max_tokens=10)
        assert len(ex["input_ids"]) == 10
        assert ex["labels"][-3:] == self.tok.encode("ab") + [self.tok.eos_token_id]
        with pytest.raises(ValueError, match="cannot hold"):
            sft.encode_example(self.tok, "x", "abcdef", max_tokens=5)

    def test_collate_right_pads_with_masks(self):
        a = sft.encode_example(self.tok, "ab", "c", 32)
        b = sft.encode_example(self.tok, "abcdef", "c", 32)
        batch = sft.collate([a, b], pad_token_id=self.tok.pad_token_id)
        assert [len(row) for row in batch["input_ids"]] == [len(b["input_ids"])] * 2
        assert batch["attention_mask"][0] == [1] * len(a["input_ids"]) + [0] * 4
        assert batch["labels"][0][-4:] == [sft.IGNORE_INDEX] * 4
        assert batch["input_ids"][0][-4:] == [self.tok.pad_token_id] * 4

    def test_char_tokenizer_round_trip_save_and_unknowns(self, tmp_path):
        assert self.tok.decode(self.tok.encode("<output>ab</output>")) == "<output>ab</output>"
        assert self.tok.encode("é") == [self.tok.unk_token_id]
        self.tok.save(tmp_path / "t.json")
        again = sft.CharTokenizer.load(tmp_path / "t.json")
        assert again.encode("hello") == self.tok.encode("hello")
        assert again.vocab_size == self.tok.vocab_size

    def test_batches(self):
        assert sft.batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


def test_readme_says_how_to_run_it_on_a_pod():
    text = (LORA_BUNDLE / "README.md").read_text(encoding="utf-8")
    assert "prefect-runpod finetune" in text and "--bundle examples/lora-sft" in text
    assert "HF_TOKEN" in text and "--tiny-random" in text


def _lora_python() -> str:
    return os.environ.get("PREFECT_RUNPOD_LORA_PYTHON") or sys.executable


@pytest.fixture(scope="module")
def lora_python() -> str:
    python = _lora_python()
    probe = subprocess.run(
        [python, "-c", "import torch, transformers, peft"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        pytest.skip(f"torch/transformers/peft not importable in {python}")
    return python


@pytest.mark.lora
@pytest.mark.slow
@pytest.mark.timeout(1800)  # two CPU runs, 600 s each at most: the suite's 300 s would cut them
def test_tiny_random_run_trains_and_both_evals_agree(lora_python, tmp_path):
    bundle = tmp_path / "lora-sft"
    shutil.copytree(LORA_BUNDLE, bundle, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env["HF_HUB_OFFLINE"] = "1"  # proves the tiny run needs no download
    env["DEVICE"] = "mps"  # never there on Linux: device.py falls back to CPU, and says so
    train = subprocess.run(
        [
            lora_python,
            "-u",
            "train.py",
            "--out",
            "outputs",
            "--tiny-random",
            "--max-train-examples",
            "24",
            "--max-eval-examples",
            "4",
            "--epochs",
            "1",
        ],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert "warning: mps was requested (env DEVICE) but is not available here" in train.stderr
    progress = [json.loads(x) for x in train.stdout.splitlines() if x.startswith("{")]
    steps = [p for p in progress if "loss" in p]
    assert [p["step"] for p in steps] == [1, 2, 3] and steps[-1]["progress"] == 1.0
    adapter = bundle / "outputs" / "adapter"
    for name in ("adapter_config.json", "adapter_model.safetensors", "lora_sft.json"):
        assert (adapter / name).is_file(), name
    evaluate = subprocess.run(
        [
            lora_python,
            "-u",
            "eval.py",
            "--checkpoint",
            "outputs/adapter",
            "--out",
            "outputs/eval_standalone.jsonl",
        ],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    train_rows = load_jsonl(bundle / "outputs" / "eval_train.jsonl")
    assert len(train_rows) == 4
    assert all(r["model_input"].startswith("Classify the support ticket") for r in train_rows)
    report = compare_eval(train_rows, load_jsonl(bundle / "outputs" / "eval_standalone.jsonl"))
    assert report.verdict == "pass", report.reasons


@pytest.mark.lora
@pytest.mark.slow
@pytest.mark.timeout(2400)  # three CPU runs, 600 s each at most
def test_model_id_path_with_a_local_hf_model_and_bpe_tokenizer(lora_python, tmp_path):
    """The real ``--model-id`` path (AutoTokenizer, AutoModelForCausalLM, BOS handling),
    on a small local model directory instead of a Hub download."""
    bundle = tmp_path / "lora-sft"
    shutil.copytree(LORA_BUNDLE, bundle, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env["HF_HUB_OFFLINE"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [lora_python, "-u", *args],
            cwd=bundle,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    made = run("make_local_model.py", "--out", str(tmp_path / "local-llama"))
    assert made.returncode == 0, made.stderr[-3000:]
    train = run(
        "train.py",
        "--out",
        "outputs",
        "--model-id",
        str(tmp_path / "local-llama"),
        "--max-train-examples",
        "16",
        "--max-eval-examples",
        "3",
        "--epochs",
        "1",
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    run_config = json.loads((bundle / "outputs/adapter/lora_sft.json").read_text())
    assert run_config["model_id"] == str(tmp_path / "local-llama")
    assert run_config["tiny_random"] is False
    assert not (bundle / "outputs" / "base-model").exists()
    evaluate = run("eval.py", "--checkpoint", "outputs/adapter", "--out", "outputs/e.jsonl")
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    report = compare_eval(
        load_jsonl(bundle / "outputs/eval_train.jsonl"), load_jsonl(bundle / "outputs/e.jsonl")
    )
    assert report.verdict == "pass" and report.n_records == 3, report.reasons


def _tiny_run(lora_python: str, bundle: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """One tiny-random CPU run of ``train.py`` in ``bundle`` (2 epochs of 2 steps)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env["HF_HUB_OFFLINE"] = "1"
    env["DEVICE"] = "cpu"
    args = ["--out", "outputs", "--tiny-random", "--max-train-examples", "16",
            "--max-eval-examples", "1", "--epochs", "2", *more]  # fmt: skip
    return subprocess.run(
        [lora_python, "-u", "train.py", *args],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _copy_bundle(dest: Path) -> Path:
    shutil.copytree(LORA_BUNDLE, dest, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    return dest


def test_the_bundle_declares_its_checkpoints_and_marker():
    import tomllib

    job = tomllib.loads((LORA_BUNDLE / "bundle.toml").read_text())["job"]
    assert job["checkpoints"] == "checkpoints" and job["checkpoint_marker"] == "COMPLETE"
    assert "--checkpoints checkpoints --resume-from {resume_from}" in job["train"]


@pytest.mark.lora
@pytest.mark.slow
@pytest.mark.timeout(2400)  # four CPU runs, 600 s each at most
def test_a_resumed_run_ends_with_the_uninterrupted_adapter_and_not_without_its_rng(
    lora_python, tmp_path
):
    """Issue 25: the LoRA example checkpoints adapter, optimizer, scheduler and random
    state each epoch as the Hugging Face Trainer does (``COMPLETE`` last); a run stopped
    after epoch 1 and resumed from that checkpoint ends with the adapter of a run that
    never stopped, byte for byte — the job loads every file of it with
    ``weights_only=True`` (torch 2.6's default), so the random state loads that way —
    and resuming without its random state trains another adapter."""
    plain = _copy_bundle(tmp_path / "plain")
    done = _tiny_run(lora_python, plain, "--checkpoints", "checkpoints")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    uninterrupted = (plain / "outputs" / "adapter" / "adapter_model.safetensors").read_bytes()

    stopped = _copy_bundle(tmp_path / "stopped")
    first = _tiny_run(
        lora_python, stopped, "--checkpoints", "checkpoints", "--stop-after-epoch", "1"
    )
    assert first.returncode == 3, first.stderr[-2000:]
    (checkpoint,) = (stopped / "checkpoints").glob("checkpoint-*")
    assert checkpoint.name == "checkpoint-2"
    for name in ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt",
                 "scheduler.pt", "rng_state.pth", "trainer_state.json", "COMPLETE"):  # fmt: skip
        assert (checkpoint / name).is_file(), name
    resumed = _tiny_run(lora_python, stopped, "--checkpoints", "checkpoints", "--resume-from",
                        f"checkpoints/{checkpoint.name}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resumed from checkpoints/{checkpoint.name} at step 2, epoch 1" in resumed.stdout
    steps = [json.loads(x)["step"] for x in resumed.stdout.splitlines() if '"loss"' in x]
    assert steps == [3, 4]  # only epoch 2 was trained again
    adapter = (stopped / "outputs" / "adapter" / "adapter_model.safetensors").read_bytes()
    assert adapter == uninterrupted

    # The control: the same checkpoint without its random state trains another adapter.
    (tmp_path / "no-rng").mkdir()
    blind = _copy_bundle(tmp_path / "no-rng" / "b")
    shutil.copytree(checkpoint, blind / "ck")
    (blind / "ck" / "rng_state.pth").unlink()
    again = _tiny_run(lora_python, blind, "--resume-from", "ck")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "holds no rng_state.pth" in again.stdout
    assert (blind / "outputs" / "adapter" / "adapter_model.safetensors").read_bytes() != (
        uninterrupted
    )


@pytest.mark.lora
@pytest.mark.slow
def test_an_incomplete_lora_checkpoint_is_never_resumed_from(lora_python, tmp_path):
    """Without ``COMPLETE`` (a checkpoint cut off while written) the job refuses it."""
    probe = subprocess.run(
        [lora_python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import resume\n"
         "try:\n    resume.load(sys.argv[2], None, None, None, None)\n"
         "except ValueError as exc:\n    print(exc)",
         str(LORA_BUNDLE), str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "has no COMPLETE marker: it is not a complete checkpoint" in probe.stdout
