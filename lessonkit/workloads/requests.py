"""Requests a small local model gets, in four categories, with a written train / held-out split.

The feature head (lessonkit.feature_head) learns from the target's own answers to the TRAIN requests; its
acceptance and speed-up are measured on the HELDOUT ones, and on the corpus' held-out prompts and the grounded
requests (lessonkit.workloads.grounded) that `bench spec` and the lessons use. The split, written down:

  chat      a question or instruction about a topic: TRAIN_TOPICS x TRAIN_ASKS, HELDOUT_TOPICS x HELDOUT_ASKS
            (disjoint topic lists and phrasings);
  code      "write a function that ..." (TRAIN_TASKS / HELDOUT_TASKS), and the opening lines of a code document
            to continue, from the corpus' train / held-out split;
  records   NDJSON lines to continue, and "convert this record to JSON", from the corpus' train / held-out split;
  rewrite   fix spelling, rename a variable, summarise reusing the words: over sentences and functions of the
            corpus' train / held-out split.

The corpus' split is by document (lessonkit.workloads.corpus), so no held-out request quotes a training document;
tests/test_feature_head.py checks that no evaluation prompt is among the training requests.
"""
from __future__ import annotations

import random
import re

from lessonkit.models.gguf_loader import apply_chat_template
from lessonkit.workloads.corpus import load_documents

CATEGORIES = ("chat", "code", "records", "rewrite")

TRAIN_TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the French revolution", "honey bees",
    "compound interest", "the immune system", "plate tectonics", "renewable energy", "the printing press",
    "coral reefs", "sleep", "the moon landing", "recycling", "rainbows", "the Roman empire", "vaccines",
    "electric cars", "the internet", "tides", "earthquakes", "DNA", "climate change", "the stock market",
    "gardening", "chess", "coffee", "the human heart", "bicycles", "solar panels", "the Great Wall of China",
    "penguins", "music theory", "public libraries", "email", "bread baking", "the Olympic games", "glaciers",
    "time zones", "batteries", "bird migration", "the piano", "microscopes", "deserts", "tea", "airplanes",
    "lightning", "the Silk Road", "whales", "the steam engine", "mushrooms", "the periodic table", "earthworms",
    "the Amazon river", "chocolate", "rockets", "the alphabet", "snow", "bees and flowers", "maps", "the telephone",
    "the Renaissance", "mountains", "cheese making", "owls", "the speed of light", "soap", "kites", "bridges",
    "the Sahara", "elephants", "yoga", "the calendar", "magnets", "ants", "lighthouses", "the violin", "salt",
    "trains", "umbrellas", "glass", "the printing of money", "sharks", "wool", "the compass",
    "the human brain", "photography", "submarines", "the Eiffel Tower", "bamboo", "the Arctic", "frogs",
    "cloud formation", "paper making", "the Nile", "sea turtles", "wolves", "the ancient Greeks", "vitamins",
    "the human skeleton", "fireworks", "hot air balloons", "the Milky Way", "comets", "autumn leaves", "spiders",
    "the Vikings", "the Industrial Revolution", "olive oil", "rice farming", "the human eye", "camels", "sand dunes",
    "the Andes", "marathons", "board games", "the guitar", "opera", "poetry", "the Mona Lisa", "museums", "zoos",
    "national parks", "wildfires", "floods", "drought", "irrigation", "tractors", "dams", "canals", "skyscrapers",
    "elevators", "traffic lights", "seat belts", "first aid", "blood types", "allergies", "the common cold",
    "handwashing", "dental care", "cotton", "silk", "coins", "banks", "taxes", "budgets", "inflation",
    "supply and demand", "elections", "the United Nations", "passports", "airports", "ships", "pirates", "castles",
    "knights", "the Middle Ages", "the Aztecs", "the Inca", "Mount Everest", "caves", "minerals", "diamonds", "gold",
    "copper", "steel", "plastic", "rubber", "clocks", "thermometers", "weather forecasts", "fog", "the seasons",
    "the equator", "latitude and longitude", "satellites", "GPS",
]
HELDOUT_TOPICS = [
    "rainforests", "the pyramids of Egypt", "nuclear fusion", "octopuses", "the metric system", "jazz",
    "antibiotics", "hurricanes", "the telescope", "wind turbines", "dinosaurs", "origami",
]
TRAIN_ASKS = [
    "Explain {t} in a few sentences.", "What is {t}? Answer briefly.", "Give three facts about {t}.",
    "Write a short paragraph about {t} for a child.", "Why does {t} matter?", "Describe {t} in simple words.",
    "List two common myths about {t} and correct them.", "Summarise what people should know about {t}.",
    "Write two sentences explaining {t}.", "What are the main ideas behind {t}?", "Share an interesting fact about {t}.",
    "What should a beginner learn first about {t}?",
]
HELDOUT_ASKS = ["Tell me about {t}.", "How would you explain {t} to a friend?"]

TRAIN_TASKS = [
    "returns the sum of a list of numbers", "reverses a string", "checks whether a number is prime",
    "counts the vowels in a string", "returns the largest value in a list", "merges two sorted lists",
    "computes the factorial of n", "removes duplicates from a list while keeping order",
    "converts Celsius to Fahrenheit", "returns the n-th Fibonacci number", "checks whether a string is a palindrome",
    "flattens a nested list", "counts the words in a text", "returns the average of a list",
    "finds the index of an item in a list", "capitalises every word in a sentence", "reads a file and returns its lines",
    "returns the even numbers of a list", "computes the greatest common divisor of two numbers",
    "groups a list of words by their first letter", "returns the smallest value in a list",
    "counts how often each character appears in a string", "checks whether a list is sorted",
    "returns the squares of a list of numbers", "joins a list of strings with commas", "rounds a price to two decimals",
    "returns the last n items of a list", "checks whether a year is a leap year", "converts a string to title case",
    "sums the digits of a number", "returns the intersection of two lists", "removes the spaces from a string",
    "counts the lines of a file", "returns the keys of a dictionary sorted by value", "swaps the keys and values of a dictionary",
    "returns the longest word in a sentence", "computes the power of a number without using **", "splits a list into chunks of size n",
    "checks whether a number is even", "returns the product of a list of numbers",
    "returns the second largest value in a list", "counts the even numbers in a list", "reverses the words of a sentence",
    "checks whether a string contains only digits", "returns the first n prime numbers",
    "converts a list of strings to integers", "removes the vowels from a string", "returns the cumulative sum of a list",
    "finds the most common item in a list", "checks whether all items of a list are unique",
    "returns the distance between two points", "converts hours and minutes to minutes",
    "returns a dictionary counting the words of a text", "pads a string with zeros to length n",
    "returns the difference between the largest and smallest values", "checks whether a number is a perfect square",
    "returns the positive numbers of a list", "zips two lists into a dictionary",
    "returns the characters at even positions of a string", "converts kilometres to miles",
    "computes the area of a circle", "returns the number of days in a month",
    "checks whether a password has at least eight characters", "returns the initials of a full name",
    "repeats each item of a list twice", "returns the sum of the squares of a list", "checks whether a list is empty",
    "removes the None values from a list", "returns the middle item of a list", "counts the uppercase letters in a string",
    "rotates a list by k positions", "returns the union of two lists without duplicates", "converts a number to binary",
    "returns the absolute values of a list", "finds the longest common prefix of a list of strings",
    "checks whether a sentence contains every letter of the alphabet", "returns the average word length of a sentence",
    "multiplies every item of a list by n", "returns the index of the largest value in a list",
    "removes the punctuation from a string",
]
HELDOUT_TASKS = ["sorts a list of tuples by their second item", "returns the median of a list",
                 "checks whether two strings are anagrams", "transposes a matrix given as a list of lists"]

_TYPOS = {"the": "teh", "receive": "recieve", "which": "wich", "their": "thier", "because": "becuase",
          "separate": "seperate", "until": "untill", "address": "adress", "before": "befor", "always": "allways"}


def _chat(engine, text: str) -> list[int]:
    if getattr(engine, "chat_template", None):
        text = apply_chat_template(engine, [{"role": "user", "content": text}])
    return engine.encode(text)


def _sentences(split: str, rng: random.Random, n: int) -> list[str]:
    """n prose sentences of 8-40 words from the corpus split."""
    text = " ".join(load_documents("prose", split))
    found = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 8 <= len(s.split()) <= 40 and "*" not in s]
    rng.shuffle(found)
    return found[:n]


def _functions(split: str, rng: random.Random, n: int) -> list[str]:
    """n short top-level functions (3-12 lines) from the corpus' code split."""
    out = []
    for doc in load_documents("code", split):
        for m in re.finditer(r"^def \w+\(.*?(?=^\S|\Z)", doc, flags=re.S | re.M):
            body = m.group(0).rstrip()
            if 3 <= body.count("\n") + 1 <= 12:
                out.append(body + "\n")
    rng.shuffle(out)
    return out[:n]


def _openings(kind: str, split: str, rng: random.Random, n: int, lines: int, starts: str = "") -> list[str]:
    """n runs of `lines` lines starting at a line start (one beginning with `starts`) of the corpus split."""
    docs = [d for d in load_documents(kind, split) if d.count("\n") > lines + 2]
    out = []
    while len(out) < n:
        d = docs[rng.randrange(len(docs))].split("\n")
        s = rng.randrange(len(d) - lines)
        if d[s].startswith(starts):
            out.append("\n".join(d[s:s + lines]) + "\n")
    return out


def _rewrite_texts(split: str, rng: random.Random, n: int) -> list[str]:
    sents, funcs = _sentences(split, rng, n), _functions(split, rng, n)
    out = []
    for i in range(n):
        which = i % 3
        if which == 0 and sents:
            s = sents.pop()
            for a, b in _TYPOS.items():
                s = re.sub(rf"\b{a}\b", b, s, count=1)
            out.append(f"Fix the spelling in this sentence and return the corrected sentence only: {s}")
        elif which == 1 and funcs:
            f = funcs.pop()
            name = re.search(r"\(\s*(\w+)", f)
            var = name.group(1) if name and name.group(1) != "self" else "value"
            out.append(f"Rename the variable {var} to item in this function and return the code:\n{f}")
        elif sents:
            out.append(f"Summarise in one sentence, reusing the words of the text: {sents.pop()}")
    return out


def _distinct_first(items: list[str], n: int, fill: bool = True) -> list[str]:
    """n items without repeats while there are enough; beyond that repeats (fill) or fewer (not fill): a repeated
    prompt gives the same greedy answer, so it adds no training data."""
    if n <= len(items) or not fill:
        return items[:n]
    return (items * (1 + n // len(items)))[:n]


def requests(engine, split: str, per_category: int, seed: int = 0) -> dict[str, list[list[int]]]:
    """Token ids of `per_category` requests per category from `split` ("train" or "heldout"), seeded."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split {split!r}: expected train or heldout")
    rng = random.Random(seed + (0 if split == "train" else 7919))
    topics, asks, tasks = ((TRAIN_TOPICS, TRAIN_ASKS, TRAIN_TASKS) if split == "train"
                           else (HELDOUT_TOPICS, HELDOUT_ASKS, HELDOUT_TASKS))
    chat = [a.format(t=t) for t in topics for a in asks]
    rng.shuffle(chat)
    code_asks = [f"Write a Python function that {t}." for t in tasks]
    half = per_category // 2
    code = [_chat(engine, c) for c in _distinct_first(code_asks, half, fill=False)]
    code += [engine.encode(t) for t in _openings("code", split, rng, per_category - len(code), 6)]
    recs = [engine.encode(t) for t in _openings("records", split, rng, half, 2)]
    for line in _openings("records", split, rng, per_category - half, 1, '{"'):
        recs.append(_chat(engine, f"Convert this record to JSON with the keys in the same order: {line.strip()}"))
    return {"chat": [_chat(engine, c) for c in _distinct_first(chat, per_category)],
            "code": code, "records": recs,
            "rewrite": [_chat(engine, t) for t in _rewrite_texts(split, rng, per_category)]}
