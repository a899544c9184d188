"""Structured requests: the work where a model writes the same shapes again and again.

Three families, each behind one system prompt with one worked example (a user turn and its answer):
  records  a key=value log record rewritten field by field as one JSON object (keys in a fixed order);
  ndjson   a small CSV table turned into NDJSON, one object per row;
  scoring  support tickets scored one by one, one JSON line each (id, urgency, team, summary).
The items are generated from fixed word lists with a seeded generator: the same on every machine.
A request holds one item, or `per_request` items of the same split (a batch: several log records, a longer
table, several tickets behind the one system prompt, answered one JSON line each): longer answers behind a
prompt of about the same length, the shape of batch scoring.

The split, written down: item i of a family is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1 (every
fourth), a training item otherwise; a generated item whose text equals an item already taken is skipped,
so no held-out request is also a training request (tests/test_suffix.py checks it). The training split
warms a suffix store (lessonkit.speculative.suffix_store); the held-out split is measured against that store
with learning off (lessonkit.bench.bench_suffix), so no request is measured against a store that holds its own
earlier output.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from lessonkit.errors import LessonkitError
from lessonkit.models.gguf_loader import apply_chat_template

FAMILIES = ("records", "ndjson", "scoring")
SPLITS = ("train", "heldout")
HELDOUT_EVERY = 4
SEED = 58

HOSTS = ("web", "api", "db", "cache", "queue", "auth", "search", "batch")
SERVICES = ("nginx", "api", "postgres", "redis", "kafka", "auth", "elastic", "cron")
LEVELS = ("info", "warn", "error")
MESSAGES = ("connection pool exhausted", "slow query on orders", "snapshot saved", "token expired",
            "disk usage above 90 percent", "request timed out", "worker restarted", "certificate renewed",
            "rate limit reached", "replica lag growing", "cache miss storm", "job finished")
REGIONS = ("eu", "us", "ap", "sa")
TICKETS = ("the checkout page returns 500 for every customer", "please change the logo colour on the about page",
           "password reset emails arrive an hour late", "the invoice PDF shows the wrong currency",
           "search returns no results for names with accents", "the mobile app crashes when opening settings",
           "export to CSV drops the last row", "a customer asks for a copy of their data",
           "dashboards load slowly on Monday mornings", "the status page is out of date")

SYSTEM = {
    "records": "You convert log records to JSON. Answer with one JSON object with the keys host, service, level, "
               "code and msg, in this order.",
    "ndjson": "You turn tables into NDJSON: one JSON object per row, one row per line, keys from the header.",
    "scoring": "You score support tickets for urgency. For each ticket answer one line of JSON with the keys id, "
               "urgency (1 to 5), team and summary.",
}
EXAMPLE = {
    "records": ("host=web-1 service=nginx level=warn code=429 msg=rate limit reached",
                '{"host": "web-1", "service": "nginx", "level": "warn", "code": 429, "msg": "rate limit reached"}'),
    "ndjson": ("name,region,cpu\napi-1,eu,41\napi-2,us,77",
               '{"name": "api-1", "region": "eu", "cpu": 41}\n{"name": "api-2", "region": "us", "cpu": 77}'),
    "scoring": ("ticket 4: the login page is slow in the morning",
                '{"id": 4, "urgency": 3, "team": "web", "summary": "login page slow in the morning"}'),
}
# a batch (several items a request): the system prompt asks for one line per item, the example has two items
SYSTEM_BATCH = {
    "records": "You convert log records to JSON lines. For each record, one per line, answer one JSON object with "
               "the keys host, service, level, code and msg, in this order, one object per line.",
    "ndjson": SYSTEM["ndjson"],
    "scoring": "You score support tickets for urgency. For each ticket, one per line, answer one line of JSON with "
               "the keys id, urgency (1 to 5), team and summary.",
}
EXAMPLE_BATCH = {
    "records": ("host=web-1 service=nginx level=warn code=429 msg=rate limit reached\n"
                "host=db-3 service=postgres level=error code=500 msg=slow query on orders",
                '{"host": "web-1", "service": "nginx", "level": "warn", "code": 429, "msg": "rate limit reached"}\n'
                '{"host": "db-3", "service": "postgres", "level": "error", "code": 500, "msg": "slow query on orders"}'),
    "ndjson": EXAMPLE["ndjson"],
    "scoring": ("ticket 4: the login page is slow in the morning\nticket 5: the invoice PDF shows the wrong currency",
                '{"id": 4, "urgency": 3, "team": "web", "summary": "login page slow in the morning"}\n'
                '{"id": 5, "urgency": 4, "team": "payments", "summary": "invoice PDF shows the wrong currency"}'),
}


def split_of(index: int) -> str:
    """The split of a family's item `index`: every HELDOUT_EVERY-th item is held out."""
    return "heldout" if index % HELDOUT_EVERY == HELDOUT_EVERY - 1 else "train"


@dataclass(frozen=True)
class StructuredRequest:
    family: str
    index: int              # the (first) item's number within its family (the split is decided by it)
    content: str            # the user turn
    items: tuple = ()       # a batch: the numbers of all its items (all of one split); () for one item

    @property
    def split(self) -> str:
        return split_of(self.index)

    def messages(self) -> list[dict]:
        system, example = (SYSTEM_BATCH, EXAMPLE_BATCH) if self.items else (SYSTEM, EXAMPLE)
        ex_user, ex_answer = example[self.family]
        return [{"role": "system", "content": system[self.family]}, {"role": "user", "content": ex_user},
                {"role": "assistant", "content": ex_answer}, {"role": "user", "content": self.content}]


def _item(family: str, rng: random.Random, i: int) -> str:
    if family == "records":
        h = rng.choice(HOSTS)
        return (f"host={h}-{rng.randint(1, 40)} service={rng.choice(SERVICES)} level={rng.choice(LEVELS)} "
                f"code={rng.choice((100, 200, 201, 301, 404, 429, 500, 503))} msg={rng.choice(MESSAGES)}")
    if family == "ndjson":
        rows = [f"{rng.choice(HOSTS)}-{rng.randint(1, 40)},{rng.choice(REGIONS)},{rng.randint(1, 99)}"
                for _ in range(rng.randint(2, 3))]
        return "\n".join(["name,region,cpu"] + rows)
    return f"ticket {10 + i}: {rng.choice(TICKETS)}"


def _family_items(family: str, split: str, n: int) -> list[tuple[int, str]]:
    """The first n (item number, text) of one family's split; an item whose text was generated before is skipped."""
    rng, seen, picked, i = random.Random(f"{SEED}-{family}"), set(), [], 0
    while len(picked) < n and i < 100 * (n + 1):
        text = _item(family, rng, i)
        if text not in seen:
            seen.add(text)
            if split_of(i) == split:
                picked.append((i, text))
        i += 1
    return picked


def _join(family: str, texts: list[str]) -> str:
    """Several items as one user turn: tables share one header; records and tickets one per line."""
    if family == "ndjson":
        return "\n".join(["name,region,cpu"] + [row for t in texts for row in t.split("\n")[1:]])
    return "\n".join(texts)


def structured_requests(split: str, n_per_family: int | None = None, families=FAMILIES,
                        per_request: int = 1) -> list[StructuredRequest]:
    """The requests of one split ("train" or "heldout"), n_per_family of each family (None: 12 held-out, 36
    training), families taking turns. per_request > 1: each request a batch of that many consecutive items of
    the split (the batch system prompt and example)."""
    if split not in SPLITS:
        raise LessonkitError(f"structured split {split!r}: expected one of {', '.join(SPLITS)}")
    if isinstance(per_request, bool) or not isinstance(per_request, int) or not 1 <= per_request <= 16:
        raise LessonkitError(f"structured per_request={per_request!r}: expected an integer 1 .. 16")
    n = n_per_family if n_per_family is not None else (12 if split == "heldout" else 36)
    by_family = []
    for family in families:
        if family not in FAMILIES:
            raise LessonkitError(f"structured family {family!r}: expected one of {', '.join(FAMILIES)}")
        items = _family_items(family, split, n * per_request)
        if per_request == 1:
            by_family.append([StructuredRequest(family, i, text) for i, text in items])
            continue
        groups = [items[j:j + per_request] for j in range(0, len(items) - per_request + 1, per_request)]
        by_family.append([StructuredRequest(family, g[0][0], _join(family, [t for _, t in g]), tuple(i for i, _ in g))
                          for g in groups])
    return [r for group in zip(*by_family) for r in group]


def render(engine, req: StructuredRequest) -> str:
    """The prompt text: the model's chat template, or (a model without one) the turns as plain lines."""
    if getattr(engine, "chat_template", None):
        return apply_chat_template(engine, req.messages())
    return "\n".join(f"{m['role']}: {m['content']}" for m in req.messages()) + "\nassistant: "


def structured_prompts(engine, split: str, n_per_family: int | None = None, families=FAMILIES,
                       per_request: int = 1) -> list[list[int]]:
    """Token ids of one split's requests, rendered for `engine`."""
    return [engine.encode(render(engine, r)) for r in structured_requests(split, n_per_family, families, per_request)]
