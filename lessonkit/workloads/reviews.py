"""The batch-scoring workload of lesson 4: a long shop-review instruction (the shared prefix) and short
seeded reviews to score behind it; and a word-level tokenizer over its words, for tiny random models."""
from __future__ import annotations

import json
import random

SYSTEM_PROMPT = """You are a careful reviewer for an online shop. You read one customer review at a time and \
answer with a single word: positive, negative or mixed. Follow these rules exactly.
1. Judge the review as a whole, not its first sentence. Customers often start with praise and end with a \
complaint, or the other way round; the last word they leave you with usually carries the most weight.
2. A complaint about delivery, packaging or customer service counts, even when the product itself is fine. \
A late parcel that arrived intact is a mild complaint; a broken product is a strong one.
3. Sarcasm is common. "Great, it broke after two days" is negative. Read tone, not only words.
4. Comparisons matter: "better than my old one" is positive only if the old one was acceptable.
5. A refund or a replacement that was handled well can turn a negative experience into a mixed one, \
but rarely into a positive one.
6. Ignore star ratings quoted in the text; they are often inconsistent with what the customer writes.
7. If the review is about a different product than the one listed, answer mixed.
8. Reviews in other languages are judged the same way; do not translate them in your answer.
9. Never explain your answer, never add punctuation, never repeat the review.
10. When in doubt between two labels, prefer mixed over a strong label.
"""

_RULE_TOPICS = ["battery life", "noise", "size", "colour", "smell", "instructions", "warranty", "price",
                "weight", "setup time", "durability", "comfort", "the app", "spare parts", "the charger"]

_ITEM_TEMPLATES = ["Review: The {t} is {a}, and {b}.\nLabel:", "Review: {b}; the {t} was {a}.\nLabel:",
                   "Review: Honestly the {t} is {a}. {b}.\nLabel:"]

_ADJ = ["excellent", "terrible", "fine", "disappointing", "better than expected", "awful", "great"]

_TAIL = ["delivery was fast", "it broke after a week", "support never answered", "I would buy it again",
         "the box was crushed", "my kids love it", "it does the job"]



def system_prompt_ids(engine, n_tokens: int = 552) -> list[int]:
    """Exactly n_tokens of a long, realistic instruction (the shared prefix of a batch-scoring job)."""
    text, i = SYSTEM_PROMPT, 11
    ids = engine.encode(text)
    while len(ids) < n_tokens:
        t = _RULE_TOPICS[i % len(_RULE_TOPICS)]
        text += (f"{i}. Remarks about {t} count like any other remark: weigh them by how much they would "
                 f"matter to a typical buyer, not by how long the customer wrote about them.\n")
        i += 1
        ids = engine.encode(text)
    return ids[:n_tokens]


def make_items(engine, n: int, seed: int = 0) -> list[list[int]]:
    """n short reviews to score behind the system prompt (seeded)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tpl = rng.choice(_ITEM_TEMPLATES)
        out.append(engine.encode(tpl.format(t=rng.choice(_RULE_TOPICS), a=rng.choice(_ADJ), b=rng.choice(_TAIL))))
    return out


def word_tokenizer_json() -> str:
    """A word-level tokenizer over 512 ids and this workload's words (for tiny random models)."""
    vocab = {"[UNK]": 0}
    words = sorted({w.strip(".,;:!?\"'0123456789").lower() for w in
                    (SYSTEM_PROMPT + " ".join(_RULE_TOPICS + _ADJ + _TAIL) + " review label remarks count like any "
                     "other remark weigh them by how much they would matter to a typical buyer not long the customer "
                     "wrote about").split()} - {""})
    for w in words[:500]:
        vocab[w] = len(vocab)
    return json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
                       "pre_tokenizer": {"type": "Whitespace"}, "decoder": None})
