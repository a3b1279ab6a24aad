"""Train the demo ticket classifier and write its in-training eval.

Usage::

    python -u train.py --out outputs [--epochs 5] [--seed 0]
        [--checkpoints checkpoints] [--resume-from checkpoints/step-20]

Writes ``<out>/model.json`` (the model) and ``<out>/eval_train.jsonl`` (one line
per held-out ticket: id, raw_input, model_input, raw_output, prediction, label).
With ``--checkpoints DIR`` it checkpoints after every epoch into ``DIR/step-<step>/``
(``model.json``, and ``state.json``: step, epoch, the data order and the random
generator's state), written as ``step-<step>.tmp/`` and renamed when whole: the rename
is what says the checkpoint is complete. ``--resume-from PATH`` continues from one
(an empty PATH starts afresh), so a resumed run ends with the same model, byte for
byte, as one that never stopped.
Each SGD step prints a human progress line and a JSON line such as
``{"progress": 0.4, "step": 40, "total": 100, "epoch": 2, "epochs": 5, "loss": 0.31}``.
``--fail-at-epoch K`` exits with status 3 at the start of epoch K and
``--sleep-per-epoch-seconds S`` sleeps S seconds per epoch (both for tests).
Stdlib only; Python 3.8+; deterministic for a given seed.
"""

import argparse
import json
import os
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import textproc  # noqa: E402
from model import SoftmaxClassifier  # noqa: E402

BATCH_SIZE = 16
KEEP_ON_POD = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Train the demo ticket classifier.")
    parser.add_argument("--out", default="outputs", help="output directory")
    parser.add_argument("--data", default=os.path.join(HERE, "data", "tickets.jsonl"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--l2", type=float, default=1e-4)
    parser.add_argument(
        "--fail-at-epoch",
        type=int,
        default=None,
        help="exit with status 3 when epoch K starts (for failure tests)",
    )
    parser.add_argument(
        "--sleep-per-epoch-seconds",
        type=float,
        default=0.0,
        help="sleep this long each epoch (for tests that need a longer run)",
    )
    parser.add_argument("--checkpoints", default="", help="checkpoint folder ('' for none)")
    parser.add_argument("--resume-from", default="", help="checkpoint to resume ('' afresh)")
    return parser.parse_args(argv)


def save_checkpoint(folder, model, step, epoch, order, rng):
    """Write ``folder/step-<step>/`` whole: into ``.tmp`` first, renamed at the end."""
    final = os.path.join(folder, f"step-{step}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save(os.path.join(tmp, "model.json"))
    version, internal, gauss = rng.getstate()
    state = {"step": step, "epoch": epoch, "order": order,
             "rng": [version, list(internal), gauss]}  # fmt: skip
    with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as fh:
        json.dump(state, fh, sort_keys=True)
    os.rename(tmp, final)  # the job's signal: the checkpoint is complete
    done = sorted(
        (int(n[5:]), n) for n in os.listdir(folder) if n.startswith("step-") and n[5:].isdigit()
    )
    for _, name in done[:-KEEP_ON_POD]:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def load_checkpoint(path, rng):
    """The model, step, epoch and data order of a checkpoint; ``rng`` set to its state
    (a checkpoint without one leaves ``rng`` freshly seeded, and says so)."""
    model = SoftmaxClassifier.load(os.path.join(path, "model.json"))
    with open(os.path.join(path, "state.json"), encoding="utf-8") as fh:
        state = json.load(fh)
    if "rng" in state:
        version, internal, gauss = state["rng"]
        rng.setstate((version, tuple(internal), gauss))
    else:
        print("warning: the checkpoint holds no random state: the data order will differ",
              flush=True)  # fmt: skip
    return model, state["step"], state["epoch"], state["order"]


def _bar(done, total, width=20):
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _emit(payload):
    print(json.dumps(payload, sort_keys=True), flush=True)


def evaluate(model, records):
    """Run held-out records through textproc and the model; returns (rows, accuracy)."""
    rows = []
    correct = 0
    for record in records:
        model_input = textproc.preprocess(record["text"])
        raw_output = model.generate(model_input)
        prediction = textproc.parse_output(raw_output)
        correct += prediction == record["label"]
        rows.append(textproc.eval_record(record, model_input, raw_output, prediction))
    return rows, (correct / len(records) if records else 0.0)


def main(argv=None):
    args = parse_args(argv)
    rng = random.Random(args.seed)
    train = textproc.load_split(args.data, "train")
    test = textproc.load_split(args.data, "test")
    if not train or not test:
        print(f"error: {args.data} has no train/test records", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    labels = sorted({r["label"] for r in train})
    model = SoftmaxClassifier(labels)
    examples = [(textproc.preprocess(r["text"]), r["label"]) for r in train]
    order = list(range(len(examples)))
    steps_per_epoch = (len(examples) + BATCH_SIZE - 1) // BATCH_SIZE
    total = steps_per_epoch * args.epochs
    print(
        f"training on {len(train)} tickets, holding out {len(test)};"
        f" {len(labels)} labels; {total} steps",
        flush=True,
    )
    step, first_epoch = 0, 1
    if args.resume_from:
        model, step, done_epoch, order = load_checkpoint(args.resume_from, rng)
        first_epoch = done_epoch + 1
        print(f"resumed from {args.resume_from} at step {step}, epoch {done_epoch}", flush=True)
    if args.checkpoints:
        os.makedirs(args.checkpoints, exist_ok=True)
    for epoch in range(first_epoch, args.epochs + 1):
        if args.fail_at_epoch is not None and epoch >= args.fail_at_epoch:
            print(
                f"error: failing at epoch {epoch} as asked (--fail-at-epoch)",
                file=sys.stderr,
                flush=True,
            )
            return 3
        rng.shuffle(order)
        for start in range(0, len(order), BATCH_SIZE):
            batch = [examples[i] for i in order[start : start + BATCH_SIZE]]
            loss = model.sgd_step(batch, args.learning_rate, args.l2)
            step += 1
            print(
                f"epoch {epoch}/{args.epochs} {_bar(step, total)} {step}/{total} loss={loss:.4f}",
                flush=True,
            )
            _emit(
                {
                    "progress": round(step / total, 4),
                    "step": step,
                    "total": total,
                    "epoch": epoch,
                    "epochs": args.epochs,
                    "loss": round(loss, 6),
                }
            )
        _, accuracy = evaluate(model, test)
        print(f"epoch {epoch}/{args.epochs} done: eval_accuracy={accuracy:.4f}", flush=True)
        _emit(
            {
                "progress": round(step / total, 4),
                "step": step,
                "total": total,
                "epoch": epoch,
                "epochs": args.epochs,
                "eval_accuracy": round(accuracy, 6),
            }
        )
        if args.checkpoints:
            save_checkpoint(args.checkpoints, model, step, epoch, order, rng)
        if args.sleep_per_epoch_seconds > 0:
            time.sleep(args.sleep_per_epoch_seconds)
    checkpoint = os.path.join(args.out, "model.json")
    model.save(checkpoint)
    rows, accuracy = evaluate(model, test)
    eval_path = os.path.join(args.out, "eval_train.jsonl")
    with open(eval_path, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(
        f"saved {checkpoint} and {eval_path} ({len(rows)} records, accuracy {accuracy:.4f})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
