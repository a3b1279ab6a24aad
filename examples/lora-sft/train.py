"""LoRA fine-tune of a causal LM to label support tickets as ``<output>LABEL</output>``.

Usage on a GPU pod (gated models need ``HF_TOKEN`` in the environment)::

    python -u train.py --out outputs --model-id meta-llama/Llama-3.2-1B

and on a CPU, with no download, a 2-layer random Llama and a character tokenizer::

    python -u train.py --out outputs --tiny-random --max-train-examples 64

Writes ``<out>/adapter`` (the checkpoint: LoRA adapter + run config) and
``<out>/eval_train.jsonl``, the in-training eval (id, raw_input, model_input — the full
prompt —, raw_output, prediction, label) on the held-out split. Each optimizer step
prints a human progress line and a JSON line such as
``{"progress": 0.4, "step": 40, "total": 100, "epoch": 1, "epochs": 2, "loss": 0.31}``.

With ``--checkpoints DIR`` it checkpoints after every epoch into
``DIR/checkpoint-<step>/`` the way the Hugging Face Trainer does — adapter, optimizer,
scheduler and random generator state, ``COMPLETE`` written last (``resume.py``) — and
``--resume-from PATH`` continues from one (an empty PATH starts afresh), so a resumed
run ends with the adapter of a run that never stopped. ``--stop-after-epoch K`` exits
with status 3 once epoch K's checkpoint is written (for tests).
"""

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import modeling  # noqa: E402
import resume  # noqa: E402
import textproc  # noqa: E402
import torch  # noqa: E402
from sft import CharTokenizer, batches, collate, encode_example  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="LoRA fine-tune a causal LM on support tickets.")
    parser.add_argument("--out", default="outputs")
    parser.add_argument("--data", default=os.path.join(HERE, "data", "tickets.jsonl"))
    parser.add_argument(
        "--model-id",
        default="meta-llama/Llama-3.2-1B",
        help="Hugging Face model repo (gated ones need HF_TOKEN)",
    )
    parser.add_argument(
        "--tiny-random",
        action="store_true",
        help="a tiny random Llama and a char tokenizer: no download, CPU-fast",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="default 2e-4, or 3e-3 with --tiny-random"
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lora-dropout", type=float, default=0.05)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument(
        "--max-new-tokens", type=int, default=12, help="raised to fit the longest answer"
    )
    parser.add_argument("--max-train-examples", type=int, default=0, help="0 = all")
    parser.add_argument("--max-eval-examples", type=int, default=0, help="0 = all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoints", default="", help="checkpoint folder ('' for none)")
    parser.add_argument("--resume-from", default="", help="checkpoint to resume ('' afresh)")
    parser.add_argument(
        "--stop-after-epoch",
        type=int,
        default=None,
        help="exit with status 3 once epoch K is checkpointed (for resume tests)",
    )
    return parser.parse_args(argv)


def _emit(payload):
    print(json.dumps(payload, sort_keys=True), flush=True)


def evaluate(model, tokenizer, records, labels, max_new_tokens):
    """The in-training eval: same textproc and generation as ``eval.py``."""
    model.eval()
    rows = []
    for record in records:
        prompt = textproc.build_prompt(textproc.preprocess(record["text"]), labels)
        raw_output = modeling.generate_answer(model, tokenizer, prompt, max_new_tokens)
        prediction = textproc.parse_output(raw_output)
        rows.append(textproc.eval_record(record, prompt, raw_output, prediction))
    return rows


def main(argv=None):
    args = parse_args(argv)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    train = textproc.load_split(args.data, "train")
    test = textproc.load_split(args.data, "test")
    if args.max_train_examples:
        train = train[: args.max_train_examples]
    if args.max_eval_examples:
        test = test[: args.max_eval_examples]
    labels = sorted({r["label"] for r in train})
    device, dtype = modeling.device_and_dtype()
    prompts = [textproc.build_prompt(textproc.preprocess(r["text"]), labels) for r in train]
    targets = [textproc.format_target(r["label"]) for r in train]
    if args.tiny_random:
        tokenizer = CharTokenizer.from_texts(prompts + targets)
        model = modeling.tiny_random_model(tokenizer, args.seed)
        modeling.save_tiny_base(model, os.path.join(args.out, "adapter"))
        learning_rate = args.learning_rate or 3e-3
    else:
        print(f"loading {args.model_id} ({dtype}, {device})", flush=True)
        tokenizer, model = modeling.load_pretrained(args.model_id, dtype)
        learning_rate = args.learning_rate or 2e-4
    model = modeling.add_lora(
        model, args.lora_rank, args.lora_alpha, args.lora_dropout, args.tiny_random
    )
    model.to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    examples = [
        encode_example(tokenizer, prompts[i], targets[i], args.max_tokens)
        for i in range(len(train))
    ]
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=learning_rate
    )
    total = len(batches(examples, args.batch_size)) * args.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: max(0.0, 1.0 - done / total)
    )  # linear decay to 0, the Trainer's default
    print(
        f"training {trainable} LoRA parameters on {len(train)} tickets, {total} steps", flush=True
    )
    rng = random.Random(args.seed)
    step, first_epoch = 0, 1
    if args.resume_from:
        step, done_epoch = resume.load(args.resume_from, model, optimizer, scheduler, rng)
        first_epoch = done_epoch + 1
        print(f"resumed from {args.resume_from} at step {step}, epoch {done_epoch}", flush=True)
    started = time.monotonic()
    for epoch in range(first_epoch, args.epochs + 1):
        model.train()
        order = list(examples)  # each epoch's order from the data's own: a resume redraws it
        rng.shuffle(order)
        for batch in batches(order, args.batch_size):
            tensors = {
                k: torch.tensor(v, device=device)
                for k, v in collate(batch, tokenizer.pad_token_id).items()
            }
            loss = model(**tensors).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            value = float(loss.detach().cpu())
            print(
                f"epoch {epoch}/{args.epochs} {step}/{total} loss={value:.4f} "
                f"[{time.monotonic() - started:.0f}s]",
                flush=True,
            )
            _emit(
                {
                    "progress": round(step / total, 4),
                    "step": step,
                    "total": total,
                    "epoch": epoch,
                    "epochs": args.epochs,
                    "loss": round(value, 6),
                }
            )
        if args.checkpoints:
            resume.save(args.checkpoints, step, epoch, model, optimizer, scheduler, rng)
        if args.stop_after_epoch is not None and epoch >= args.stop_after_epoch:
            print(f"error: stopping after epoch {epoch} as asked (--stop-after-epoch)",
                  file=sys.stderr, flush=True)  # fmt: skip
            return 3
    # Room for the longest answer plus EOS, whatever the tokenizer (a char tokenizer
    # spends one token per character).
    longest = max(len(tokenizer.encode(textproc.format_target(x))) for x in labels)
    max_new_tokens = max(args.max_new_tokens, longest + 1)
    adapter_dir = os.path.join(args.out, "adapter")
    run_config = {
        "model_id": "" if args.tiny_random else args.model_id,
        "tiny_random": args.tiny_random,
        "labels": labels,
        "max_new_tokens": max_new_tokens,
        "max_eval_examples": args.max_eval_examples,
    }
    modeling.save_checkpoint(model, tokenizer, adapter_dir, run_config)
    rows = evaluate(model, tokenizer, test, labels, max_new_tokens)
    accuracy = sum(r["prediction"] == r["label"] for r in rows) / max(len(rows), 1)
    with open(os.path.join(args.out, "eval_train.jsonl"), "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    _emit({"progress": 1.0, "step": step, "total": total, "eval_accuracy": round(accuracy, 6)})
    print(
        f"saved {adapter_dir} and eval_train.jsonl ({len(rows)} records, accuracy {accuracy:.4f})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
