"""Progress and metrics out of training log lines (pure functions, by tables)."""

from __future__ import annotations

import pytest

from prefect_runpod.tasks.train_log import error_line, parse_metrics, parse_progress, strip_ansi

PROGRESS_TABLE = [
    # (line, fraction, step, total, unit)
    ("  40%|████      | 40/100 [00:04<00:06,  9.98it/s]", 0.40, 40, 100, "step"),
    ("Train:  40%|####      | 40/100 [00:04<00:06, 9.98it/s, loss=0.31]", 0.40, 40, 100, "step"),
    ("\x1b[32m100%|██████████| 250/250 [01:00<00:00]\x1b[0m", 1.0, 250, 250, "step"),
    ("  15%|#5        | 1.5k/10k [00:04<00:06]", 0.15, 1500, 10000, "step"),
    ("step 40/100", 0.40, 40, 100, "step"),
    ("Step 40 of 100 - loss 0.2", 0.40, 40, 100, "step"),
    ("[step: 7/10]", 0.70, 7, 10, "step"),
    ("epoch 2/5", 0.20, 2, 5, "epoch"),
    ("Epoch [3/4]", 0.50, 3, 4, "epoch"),
    ("epoch 2/4 step 5/10 loss=0.3", 0.375, 5, 10, "step"),
    ('{"progress": 0.4, "step": 40, "total": 100, "loss": 0.31}', 0.40, 40, 100, "step"),
    ('{"progress": 0.25}', 0.25, None, None, "fraction"),
    ('{"progress": 75}', 0.75, None, None, "fraction"),
    ('{"step": 3, "total": 12}', 0.25, 3, 12, "step"),
    ('{"epoch": 2, "epochs": 4}', 0.25, 2, 4, "epoch"),
    ("step 120/100 (overrun)", 1.0, 120, 100, "step"),
]


@pytest.mark.parametrize(("line", "fraction", "step", "total", "unit"), PROGRESS_TABLE)
def test_parse_progress(line, fraction, step, total, unit):
    progress = parse_progress(line)
    assert progress is not None
    assert progress.fraction == pytest.approx(fraction)
    assert (progress.step, progress.total, progress.unit) == (step, total, unit)
    assert progress.percent == pytest.approx(fraction * 100)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "loading model",
        "40it [00:04, 9.98it/s]",  # tqdm without a total
        "step 3/0",
        '{"loss": 0.3}',
        '{"progress": "soon"}',
        "{not json at all}",
        "2024-01-01 12:30:00 saved checkpoint",
        "epoch 2/0",
    ],
)
def test_parse_progress_says_nothing(line):
    assert parse_progress(line) is None


def test_demo_bundle_progress_line_combines_epoch_and_json():
    line = '{"progress": 0.4, "step": 40, "total": 100, "epoch": 2, "epochs": 5, "loss": 0.31}'
    progress = parse_progress(line)
    assert progress is not None
    assert (progress.fraction, progress.epoch, progress.epochs) == (0.4, 2, 5)


METRICS_TABLE = [
    ("loss=0.31", {"loss": 0.31}),
    ("step 40/100 loss=0.31 lr=5e-05 acc = 0.9", {"loss": 0.31, "lr": 5e-05, "acc": 0.9}),
    ("{'loss': 0.3, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.5}",
     {"loss": 0.3, "grad_norm": 1.5, "learning_rate": 5e-05}),
    ('{"progress": 0.4, "step": 40, "total": 100, "loss": 0.31, "ok": true, "tag": "x"}',
     {"loss": 0.31}),
    ('{"event": "eval", "metrics": {"eval_accuracy": 0.82, "eval_loss": 0.5}}',
     {"eval_accuracy": 0.82, "eval_loss": 0.5}),
    ("eval_accuracy: 0.8125 val_loss: -1.5", {"eval_accuracy": 0.8125, "val_loss": -1.5}),
    ("epoch 2/5 done: eval_accuracy=0.9000", {"eval_accuracy": 0.9}),
    (" 40%|####  | 40/100 [00:04<00:06,  9.98it/s, loss=0.31, acc=0.5]",
     {"loss": 0.31, "acc": 0.5}),
    ("\x1b[1mtrain_loss\x1b[0m=0.25", {"train_loss": 0.25}),
    ("2024-01-01 12:30:00 INFO: 3 items", {}),  # not a metric name after a colon
    ("loss=nan", {}),
    ("saving to outputs/model.json", {}),
    ("step=5 epoch=1 loss=2", {"loss": 2.0}),
]  # fmt: skip


@pytest.mark.parametrize(("line", "expected"), METRICS_TABLE)
def test_parse_metrics(line, expected):
    assert parse_metrics(line) == pytest.approx(expected)


def test_strip_ansi_removes_colours_cursor_moves_and_titles():
    text = "\x1b]0;title\x07\x1b[2K\x1b[1;32mok\x1b[0m \x1b[6n"
    assert strip_ansi(text) == "ok "


@pytest.mark.parametrize(
    ("tail", "line"),
    [
        (
            [
                "Traceback (most recent call last):",
                '  File "t.py", line 3',
                "ValueError: lr<0",
                "bye",
            ],
            "ValueError: lr<0",
        ),
        (
            ["step 3/10", "torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB"],
            "torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB",
        ),
        (["epoch 1/2", "CUDA out of memory", "cleaning up"], "CUDA out of memory"),
        (
            ["loading", "error: data/train.jsonl not found", "exiting"],
            "error: data/train.jsonl not found",
        ),
        (["UserWarning: slow tokenizer", "done, 3 steps"], "done, 3 steps"),
        (["", "  ", "last words  "], "last words"),
        ([], None),
    ],
)
def test_error_line_finds_the_cause_from_the_end(tail, line):
    assert error_line(tail) == line
