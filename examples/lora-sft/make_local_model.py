"""Build a small local Hugging Face model directory (random 2-layer Llama plus a
byte-level BPE fast tokenizer trained on the tickets) to dry-run the real ``--model-id``
code path without a download::

    python make_local_model.py --out /tmp/local-llama
    python -u train.py --out outputs --model-id /tmp/local-llama

Needs torch, transformers and tokenizers (a transformers dependency).
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden-size", type=int, default=64)
    args = parser.parse_args(argv)
    with open(os.path.join(HERE, "data", "tickets.jsonl"), encoding="utf-8") as fh:
        texts = [json.loads(line)["text"].lower() for line in fh if line.strip()]
    texts += [f"<output>{x}</output>" for x in ("billing", "shipping", "technical", "account")]
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(args.out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=2 * args.hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(args.out)
    print(f"wrote {args.out} (vocab {len(tokenizer)})")


if __name__ == "__main__":
    main()
