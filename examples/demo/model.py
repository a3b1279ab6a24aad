"""A small real text classifier: softmax regression over word uni- and bigrams.

It answers like a generative model would, as text: ``<output>LABEL</output>``, sometimes
after a short preamble, and off-format ("I could not tell ...") when it is unsure, as
a language model fed an input shape it never saw tends to do. The answer is a pure
function of the model input, so two eval paths that feed the same input get the same
answer. Stdlib only; Python 3.8+.
"""

import json
import math
import zlib

_PREAMBLES = ("", "Category: ", "This ticket is about {label}. ")
_UNSURE = "I could not tell what this ticket is about."


def features(model_input):
    """Sparse features of a model input: space-separated words and word bigrams.

    The model relies on preprocessing: it splits on single spaces and matches words
    exactly, so raw text (tags, entities, capitals, tabs) mostly misses its vocabulary.
    """
    words = [w.strip(".,!?;:") for w in model_input.split(" ")]
    words = [w for w in words if w]
    feats = ["w=" + w for w in words]
    feats += ["b=" + words[i] + "_" + words[i + 1] for i in range(len(words) - 1)]
    feats.append("bias")
    return feats


class SoftmaxClassifier:
    """Multiclass logistic regression trained by SGD on sparse binary features.

    Attributes:
        labels: the class names, in weight-column order.
        weights: feature -> list of one weight per label.
        unsure_below: answers whose top probability is below this are off-format.
    """

    def __init__(self, labels, weights=None, unsure_below=0.4):
        self.labels = list(labels)
        self.weights = weights if weights is not None else {}
        self.unsure_below = unsure_below

    def probabilities(self, model_input):
        """Softmax probabilities, one per label, for one model input."""
        scores = [0.0] * len(self.labels)
        for feat in features(model_input):
            row = self.weights.get(feat)
            if row is not None:
                for k, w in enumerate(row):
                    scores[k] += w
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        total = sum(exps)
        return [e / total for e in exps]

    def sgd_step(self, batch, learning_rate, l2):
        """One SGD step on a batch of ``(model_input, label)``; returns the mean cross-entropy."""
        loss = 0.0
        for model_input, label in batch:
            probs = self.probabilities(model_input)
            target = self.labels.index(label)
            loss -= math.log(max(probs[target], 1e-12))
            for feat in features(model_input):
                row = self.weights.setdefault(feat, [0.0] * len(self.labels))
                for k in range(len(row)):
                    grad = probs[k] - (1.0 if k == target else 0.0)
                    row[k] -= learning_rate * (grad / len(batch) + l2 * row[k])
        return loss / max(len(batch), 1)

    def generate(self, model_input):
        """The model's answer as text: ``<output>LABEL</output>``, with a preamble for
        some inputs, or an off-format sentence when the top probability is low."""
        probs = self.probabilities(model_input)
        best = max(range(len(probs)), key=lambda k: probs[k])
        if probs[best] < self.unsure_below:
            return _UNSURE
        label = self.labels[best]
        preamble = _PREAMBLES[zlib.crc32(model_input.encode("utf-8")) % len(_PREAMBLES)]
        return preamble.format(label=label) + "<output>" + label + "</output>"

    def save(self, path):
        """Write the checkpoint as JSON (floats round-trip exactly)."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(
                {"labels": self.labels, "unsure_below": self.unsure_below, "weights": self.weights},
                fh,
                sort_keys=True,
            )

    @classmethod
    def load(cls, path):
        """Read a checkpoint written by ``save``."""
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return cls(data["labels"], data["weights"], data.get("unsure_below", 0.4))
