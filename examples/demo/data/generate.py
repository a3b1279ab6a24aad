"""Regenerate ``tickets.jsonl``: synthetic support tickets with noisy markup.

The shipped ``tickets.jsonl`` came from this script with the default seed; running it
again rewrites the same file byte for byte. Each line is a JSON object::

    {"id": "t0001", "split": "train" | "test", "label": "billing", "text": "<p>Hi ..."}

The text carries the noise a real export has (HTML tags, entities, odd whitespace and
casing), so a model trained on cleaned text does clearly worse on the raw text.
Stdlib only; Python 3.8+.
"""

import argparse
import json
import random
from pathlib import Path

LABELS = ("billing", "shipping", "technical", "account")

SENTENCES = {
    "billing": [
        "I was charged twice for my last order",
        "my invoice shows the wrong amount",
        "please refund the duplicate payment",
        "the card was billed but the subscription says unpaid",
        "why did the monthly fee go up without notice",
        "I need a copy of the receipt for my expenses",
        "the promo code discount was not applied at checkout",
        "you took money from my account after I cancelled",
        "can I pay the balance in two instalments",
        "the tax on the invoice looks wrong",
        "my credit card payment was declined but the bank says it is fine",
        "I want my money back for the annual plan",
    ],
    "shipping": [
        "my parcel has not arrived yet",
        "the tracking number does not work",
        "the courier left the package at the wrong address",
        "the box arrived damaged and the item is broken",
        "how long does delivery take to Canada",
        "the order says shipped but tracking has not moved for a week",
        "can I change the delivery address before it ships",
        "the package was marked delivered but nothing came",
        "I received someone else's order in my parcel",
        "do you ship to a post office box",
        "the express shipping took ten days",
        "half of my order is missing from the delivery",
    ],
    "technical": [
        "the app crashes when I open the settings page",
        "I get error 500 when uploading a file",
        "the website is very slow and pages time out",
        "sync between my phone and laptop stopped working",
        "the export button produces an empty csv file",
        "after the update the app will not start",
        "notifications no longer show up on android",
        "the dashboard charts are blank in firefox",
        "the api returns a timeout for every request",
        "the search feature returns no results even for exact names",
        "video playback freezes after a few seconds",
        "the desktop client shows a white screen on launch",
    ],
    "account": [
        "I cannot log in to my account",
        "the password reset email never arrives",
        "please delete my account and all my data",
        "how do I change the email address on my profile",
        "my account was locked after too many attempts",
        "I want to add a second user to our team account",
        "two factor authentication codes are rejected",
        "someone else may have accessed my account",
        "how do I change my username",
        "I need to merge two accounts into one",
        "the verification link in the signup email has expired",
        "please update the phone number on my profile",
    ],
}

# Neutral chatter and words that belong to other topics, so the task is not trivial.
FILLER = [
    "thanks in advance",
    "this is the second time I write about this",
    "I have been a customer for years",
    "order number 48213",
    "sorry for the long message",
    "it happened again this morning",
    "my colleague has the same problem",
    "I tried on my phone and on my laptop",
    "please help as soon as possible",
    "I attached a screenshot",
]
GREETINGS = ["Hi", "Hello", "Dear support", "hey team", "Good morning", "HELLO", ""]
SIGNOFFS = ["Thanks", "Regards, Sam", "Cheers", "Best, A. Kumar", "thank you!!", ""]


def _case(rng, text):
    roll = rng.random()
    if roll < 0.2:
        return text.upper()
    if roll < 0.45:
        return text.title()
    if roll < 0.6:
        return text.capitalize()
    return text


def _markup(rng, parts):
    """Join sentences with the noise a web form or email export leaves behind."""
    joiners = [" ", "  ", "\n", "\n\n", "\t", " <br/> ", "<br>", " &nbsp; ", "&nbsp;"]
    out = []
    for part in parts:
        part = part.replace("'", rng.choice(["'", "&#39;", "&rsquo;"]))
        part = part.replace(" and ", rng.choice([" and ", " &amp; ", " AND "]))
        if rng.random() < 0.3:
            words = part.split(" ")
            k = rng.randrange(len(words))
            words[k] = (
                rng.choice(["<b>%s</b>", "<i>%s</i>", '<span class="hl">%s</span>']) % words[k]
            )
            part = " ".join(words)
        out.append(part)
        out.append(rng.choice(joiners))
    body = "".join(out).strip()
    wrapper = rng.choice(
        [
            "%s",
            "<p>%s</p>",
            '<div class="msg"><p>%s</p></div>',
            "<html><body>%s</body></html>",
            "  %s  ",
            "\n%s\n",
        ]
    )
    return wrapper % body


def make_ticket(rng, label):
    """One noisy ticket for ``label``: greeting, 1-3 topic sentences, fillers, sign-off."""
    parts = []
    greeting = rng.choice(GREETINGS)
    if greeting:
        parts.append(greeting + rng.choice([",", "", " !", "."]))
    topic = rng.sample(SENTENCES[label], rng.randint(1, 3))
    if rng.random() < 0.25:  # a stray sentence from another topic
        other = rng.choice([x for x in LABELS if x != label])
        topic.insert(rng.randrange(len(topic) + 1), rng.choice(SENTENCES[other]))
    for sentence in topic:
        parts.append(_case(rng, sentence) + rng.choice([".", "!", "?", "...", ""]))
    for _ in range(rng.randint(0, 2)):
        parts.append(_case(rng, rng.choice(FILLER)) + ".")
    signoff = rng.choice(SIGNOFFS)
    if signoff:
        parts.append(signoff)
    return _markup(rng, parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--out", default=str(Path(__file__).with_name("tickets.jsonl")))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8", newline="\n") as fh:
        for i in range(args.n):
            label = LABELS[i % len(LABELS)]
            split = "test" if rng.random() < args.test_fraction else "train"
            record = {
                "id": f"t{i + 1:04d}",
                "split": split,
                "label": label,
                "text": make_ticket(rng, label),
            }
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
