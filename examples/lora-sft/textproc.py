"""Text in, label out: the ONE place that shapes prompts and reads model outputs.

``train.py`` (training and the in-training eval) and ``eval.py`` (the standalone eval)
both import this module, so the two paths cannot drift apart: an eval that feeds raw
text, builds another prompt, or reads the first token instead of the
``<output>...</output>`` tag is exactly the mistake the eval-parity stage catches.
The cleaning rules are the demo bundle's. Stdlib only.
"""

import html
import json
import re

MAX_INPUT_CHARS = 200
"""Model inputs are cut to this many characters after cleaning."""

OUTPUT_FORMAT = r"<output>(.*?)</output>"
"""What the model was trained to emit; group 1 is the label."""

_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")
_OUTPUT = re.compile(OUTPUT_FORMAT, re.DOTALL)


def preprocess(raw, max_chars=MAX_INPUT_CHARS):
    """Clean one raw ticket into the model's input.

    Strips HTML tags, unescapes entities (``&amp;`` -> ``&``, ``&nbsp;`` -> space),
    lower-cases, collapses every run of whitespace to one space, and cuts the result
    to ``max_chars`` characters.

    Args:
        raw: the ticket text as exported (str).
        max_chars: the length cap, in characters.

    Returns:
        The model input (str), at most ``max_chars`` long.
    """
    text = _TAG.sub(" ", raw)
    text = html.unescape(text)
    text = text.lower()
    text = _SPACE.sub(" ", text).strip()
    return text[:max_chars].rstrip()


PROMPT_TEMPLATE = "Classify the support ticket as one of: {labels}.\nTicket: {ticket}\nAnswer: "
"""The prompt the model is fine-tuned on; ``{ticket}`` is the preprocessed text."""


def build_prompt(model_input, labels):
    """The prompt for one preprocessed ticket (``model_input``) and the label set."""
    return PROMPT_TEMPLATE.format(labels=", ".join(labels), ticket=model_input)


def format_target(label):
    """The completion the model learns to emit for ``label``."""
    return "<output>" + label + "</output>"


def parse_output(raw_output):
    """The label inside the first ``<output>...</output>`` of a model's answer.

    Args:
        raw_output: what the model generated (str).

    Returns:
        The stripped label (str), or None when the answer breaks the format.
    """
    match = _OUTPUT.search(raw_output or "")
    if match is None:
        return None
    return match.group(1).strip()


def load_split(path, split):
    """The records of one split (``train`` or ``test``) of a tickets JSONL file, in file order.

    Returns:
        A list of dicts with ``id``, ``text``, ``label``.
    """
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                record = json.loads(line)
                if record.get("split") == split:
                    records.append(record)
    return records


def eval_record(record, model_input, raw_output, prediction):
    """One line of an eval JSONL file, the shape both eval paths write."""
    return {
        "id": record["id"],
        "raw_input": record["text"],
        "model_input": model_input,
        "raw_output": raw_output,
        "prediction": prediction,
        "label": record["label"],
    }
