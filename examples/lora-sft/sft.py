"""The pure parts of the LoRA fine-tune: tokenising a prompt/answer pair with the loss
mask, batching, and the small character tokenizer of ``--tiny-random`` runs.

No torch here: batches are plain lists, so these functions are tested without a GPU
stack. ``modeling.py`` turns them into tensors.
"""

import json

IGNORE_INDEX = -100
"""Label value the loss skips (``torch.nn.CrossEntropyLoss``'s default ``ignore_index``)."""


class CharTokenizer:
    """A character-level tokenizer built from the training texts (no download).

    Ids 0, 1, 2 are pad, end-of-sequence and unknown; every character seen in the
    texts gets its own id after them.
    """

    pad_token_id = 0
    eos_token_id = 1
    unk_token_id = 2
    bos_token_id = None

    def __init__(self, chars):
        self.chars = list(chars)
        self._index = {c: i + 3 for i, c in enumerate(self.chars)}

    @classmethod
    def from_texts(cls, texts):
        return cls(sorted(set("".join(texts))))

    @property
    def vocab_size(self):
        return len(self.chars) + 3

    def encode(self, text):
        return [self._index.get(c, self.unk_token_id) for c in text]

    def decode(self, ids):
        return "".join(self.chars[i - 3] for i in ids if i >= 3)

    def save(self, path):
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"chars": self.chars}, fh, ensure_ascii=False)

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as fh:
            return cls(json.load(fh)["chars"])


def prompt_ids(tokenizer, prompt):
    """Token ids of a prompt as the model sees it at eval time (BOS first when the
    tokenizer has one)."""
    ids = tokenizer.encode(prompt)
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    return ids


def encode_example(tokenizer, prompt, target, max_tokens):
    """One training example: ``prompt`` then ``target`` then EOS.

    The loss covers only the target and EOS (prompt labels are ``IGNORE_INDEX``). When
    the pair is longer than ``max_tokens`` the prompt is cut, never the target.

    Returns:
        ``{"input_ids": [...], "labels": [...]}``, equal lengths, at most ``max_tokens``.
    """
    answer = tokenizer.encode(target) + [tokenizer.eos_token_id]
    if len(answer) >= max_tokens:
        raise ValueError(f"max_tokens={max_tokens} cannot hold the {len(answer)}-token answer")
    question = prompt_ids(tokenizer, prompt)[: max_tokens - len(answer)]
    return {
        "input_ids": question + answer,
        "labels": [IGNORE_INDEX] * len(question) + answer,
    }


def collate(examples, pad_token_id):
    """Right-pad a batch of ``encode_example`` results to its longest member.

    Returns:
        ``{"input_ids", "attention_mask", "labels"}``, each a list of equal-length lists
        (padding: ``pad_token_id`` / 0 / ``IGNORE_INDEX``).
    """
    width = max(len(e["input_ids"]) for e in examples)
    batch = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        pad = width - len(e["input_ids"])
        batch["input_ids"].append(e["input_ids"] + [pad_token_id] * pad)
        batch["attention_mask"].append([1] * len(e["input_ids"]) + [0] * pad)
        batch["labels"].append(e["labels"] + [IGNORE_INDEX] * pad)
    return batch


def batches(items, batch_size):
    """Consecutive slices of ``items`` of at most ``batch_size``."""
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
