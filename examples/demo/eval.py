"""The standalone eval: load a trained checkpoint and score the held-out tickets.

Usage::

    python -u eval.py --checkpoint outputs/model.json --out outputs/eval_standalone.jsonl

Runs the same held-out split as ``train.py`` through the same ``textproc`` module and
writes the same JSONL fields (id, raw_input, model_input, raw_output, prediction, label).
Stdlib only; Python 3.8+.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import textproc  # noqa: E402
from model import SoftmaxClassifier  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description="Score a trained checkpoint on held-out tickets.")
    parser.add_argument("--checkpoint", default="outputs/model.json")
    parser.add_argument("--data", default=os.path.join(HERE, "data", "tickets.jsonl"))
    parser.add_argument("--out", default="outputs/eval_standalone.jsonl")
    args = parser.parse_args(argv)
    model = SoftmaxClassifier.load(args.checkpoint)
    records = textproc.load_split(args.data, "test")
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    correct = 0
    with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            model_input = textproc.preprocess(record["text"])
            raw_output = model.generate(model_input)
            prediction = textproc.parse_output(raw_output)
            correct += prediction == record["label"]
            row = textproc.eval_record(record, model_input, raw_output, prediction)
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    accuracy = correct / len(records) if records else 0.0
    print(f"eval: {len(records)} records, accuracy {accuracy:.4f} -> {args.out}", flush=True)
    print(json.dumps({"eval_accuracy": round(accuracy, 6), "records": len(records)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
