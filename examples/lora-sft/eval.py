"""The standalone eval: load the LoRA checkpoint and score the held-out tickets.

Usage::

    python -u eval.py --checkpoint outputs/adapter --out outputs/eval_standalone.jsonl

Same split, same ``textproc`` prompt and parsing, same greedy generation as the
in-training eval in ``train.py``; writes the same JSONL fields.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modeling  # noqa: E402
import textproc  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description="Score a LoRA checkpoint on held-out tickets.")
    parser.add_argument("--checkpoint", default="outputs/adapter")
    parser.add_argument("--data", default=os.path.join(HERE, "data", "tickets.jsonl"))
    parser.add_argument("--out", default="outputs/eval_standalone.jsonl")
    args = parser.parse_args(argv)
    model, tokenizer, run_config = modeling.load_checkpoint(args.checkpoint)
    records = textproc.load_split(args.data, "test")
    if run_config.get("max_eval_examples"):
        records = records[: run_config["max_eval_examples"]]
    labels = run_config["labels"]
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    correct = 0
    with open(args.out, "w", encoding="utf-8") as fh:
        for record in records:
            prompt = textproc.build_prompt(textproc.preprocess(record["text"]), labels)
            raw_output = modeling.generate_answer(
                model, tokenizer, prompt, run_config["max_new_tokens"]
            )
            prediction = textproc.parse_output(raw_output)
            correct += prediction == record["label"]
            row = textproc.eval_record(record, prompt, raw_output, prediction)
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    accuracy = correct / len(records) if records else 0.0
    print(f"eval: {len(records)} records, accuracy {accuracy:.4f} -> {args.out}", flush=True)
    print(json.dumps({"eval_accuracy": round(accuracy, 6), "records": len(records)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
