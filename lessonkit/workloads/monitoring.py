"""Seeded generator of the labelled monitoring stream for lesson 5 (semantic caching).

A monitoring judge reads one item (a log line, an alert or an NDJSON event) and answers whether it
needs action. The stream mixes four relations to an earlier item:

- original: a fresh item drawn from one of the families below;
- exact_repeat: the same text again (monitoring streams repeat a lot);
- paraphrase: the same facts in other words (numbers, hosts, units and negation kept);
- hard_negative: looks alike but means something else. Perturbations: ``negation`` (adds or drops a
  "not"), ``number_swap`` (moves a number across the family's action threshold), ``entity_swap``
  (another host, service, domain or database) and ``unit_change`` (ms -> s, days -> hours, ...).

``needs_action`` is the generator's *intended* label. It is not the ground truth of the lesson:
the ground truth is whatever the judge answers fresh (see lessonkit.semcache.judge).
Everything is drawn from one ``random.Random(seed)``, so a seed gives the same stream everywhere.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError

HOSTS = [f"web-{i:02d}" for i in range(1, 13)] + [f"db-{i:02d}" for i in range(1, 7)] + \
    [f"cache-{i:02d}" for i in range(1, 5)] + ["lb-01", "lb-02", "batch-01"]
SERVICES = ["checkout-api", "payments-svc", "auth-service", "search-api", "inventory-svc",
            "mail-relay", "billing-worker", "image-resizer"]
DOMAINS = ["shop.example.com", "api.example.org", "status.example.net", "login.example.com",
           "cdn.example.org"]
DATABASES = ["orders-db", "users-db", "ledger-db", "analytics-db", "sessions-db"]
JOBS = ["nightly-export", "log-rotate", "invoice-run", "cache-warmup", "db-vacuum"]
QUEUES = ["email-outbound", "order-events", "thumbnail-jobs", "audit-trail"]


@dataclass(frozen=True)
class Family:
    """One kind of monitoring item. ``phrasings[0]`` is the canonical text; the rest paraphrase it.

    ``negated`` (same length as phrasings) holds the opposite-meaning versions, if the family has
    one. ``number``: (low, high, threshold, action_when_at_or_above). ``units``: (canonical, other,
    factor) meaning 1 canonical unit = factor other units; a unit change keeps the number and
    swaps the unit word (so the quantity changes by that factor).
    """
    name: str
    kind: str                      # log | alert | ndjson
    phrasings: tuple
    slots: tuple                   # entity slots used: host, service, domain, db, job, queue, ip
    number: tuple | None = None
    units: tuple | None = None
    negated: tuple | None = None
    action_if_negated: bool = False


FAMILIES = [
    Family("disk", "log", (
        "disk usage on {host} is at {n}%",
        "{host}: filesystem is {n}% full",
        "filesystem on {host} has reached {n}% of capacity",
        "{host} reports {n}% of its disk in use"), ("host",), number=(40, 99, 90, True)),
    Family("healthcheck", "alert", (
        "ALERT {service} health check failed on {host}",
        "ALERT health check for {service} on {host} failed",
        "ALERT {host}: the {service} health check failed",
        "ALERT {service} on {host} failed its health check"), ("service", "host"),
        negated=(
        "ALERT {service} health check did not fail on {host}",
        "ALERT health check for {service} on {host} did not fail",
        "ALERT {host}: the {service} health check did not fail",
        "ALERT {service} on {host} did not fail its health check"), action_if_negated=False),
    Family("latency", "alert", (
        "p99 latency of {service} is {n} ms",
        "{service} p99 latency measured at {n} ms",
        "p99 latency for {service}: {n} ms",
        "the p99 response time of {service} is {n} ms"), ("service",),
        number=(40, 900, 500, True), units=("ms", "s", 1 / 1000)),
    Family("cert", "alert", (
        "TLS certificate for {domain} expires in {n} days",
        "the TLS certificate of {domain} will expire in {n} days",
        "{domain}: TLS cert expiry in {n} days",
        "certificate for {domain} is valid for another {n} days"), ("domain",),
        number=(2, 90, 14, False), units=("days", "hours", 24)),
    Family("backup", "log", (
        "nightly backup of {db} completed",
        "the nightly {db} backup completed",
        "backup job for {db} completed overnight",
        "{db}: nightly backup completed"), ("db",),
        negated=(
        "nightly backup of {db} did not complete",
        "the nightly {db} backup did not complete",
        "backup job for {db} did not complete overnight",
        "{db}: nightly backup did not complete"), action_if_negated=True),
    Family("conn_error", "ndjson", (
        '{{"level":"error","service":"{service}","host":"{host}","msg":"connection refused","retries":{n}}}',
        '{{"service":"{service}","host":"{host}","level":"error","retries":{n},"msg":"connection refused"}}',
        '{{"host": "{host}", "service": "{service}", "level": "error", "msg": "connection refused", "retries": {n}}}'),
        ("service", "host"), number=(0, 12, 5, True)),
    Family("http_status", "ndjson", (
        '{{"path":"/api/orders","status":{n},"host":"{host}","service":"{service}"}}',
        '{{"host":"{host}","service":"{service}","path":"/api/orders","status":{n}}}',
        '{{"service": "{service}", "status": {n}, "path": "/api/orders", "host": "{host}"}}'),
        ("host", "service"), number=(200, 504, 500, True)),
    Family("memory", "alert", (
        "{service} resident memory is {n} MB",
        "resident memory of {service} stands at {n} MB",
        "{service}: RSS {n} MB",
        "memory used by {service} is {n} MB"), ("service",),
        number=(100, 3900, 3000, True), units=("MB", "GB", 1 / 1024)),
    Family("replication", "alert", (
        "replication lag on {db} is {n} seconds",
        "{db} replica is {n} seconds behind the primary",
        "{db}: replication lag of {n} seconds",
        "the {db} replica lags by {n} seconds"), ("db",),
        number=(1, 110, 60, True), units=("seconds", "minutes", 1 / 60)),
    Family("logins", "log", (
        "{n} failed login attempts for admin from {ip}",
        "admin had {n} failed login attempts from {ip}",
        "{ip}: {n} failed admin login attempts",
        "failed login attempts for admin from {ip}: {n}"), ("ip",), number=(1, 60, 20, True)),
    Family("cron", "log", (
        "cron job {job} on {host} exited with code {n}",
        "{host}: cron job {job} exited with code {n}",
        "the {job} cron job on {host} exited with code {n}",
        "exit code of cron job {job} on {host} was {n}"), ("job", "host"), number=(0, 1, 1, True)),
    Family("temperature", "alert", (
        "inlet temperature in rack {host} is {n} °C",
        "rack {host} inlet temperature reads {n} °C",
        "{host} rack inlet at {n} °C",
        "the inlet of rack {host} measures {n} °C"), ("host",),
        number=(18, 45, 35, True), units=("°C", "°F", 9 / 5)),
    Family("queue", "alert", (
        "consumers of queue {queue} are running",
        "queue {queue}: consumers are running",
        "the {queue} queue consumers are running",
        "consumers for the {queue} queue are running"), ("queue",),
        negated=(
        "consumers of queue {queue} are not running",
        "queue {queue}: consumers are not running",
        "the {queue} queue consumers are not running",
        "consumers for the {queue} queue are not running"), action_if_negated=True),
]
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}
PERTURBATIONS = ("negation", "number_swap", "entity_swap", "unit_change")


@dataclass
class MonitoringItem:
    id: int
    text: str
    family: str
    kind: str
    relation: str              # original | exact_repeat | paraphrase | hard_negative
    parent: int | None         # id of the item this one was derived from
    perturbation: str | None   # for hard negatives
    needs_action: bool         # the generator's intended label (not the ground truth)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StreamConfig:
    n_originals: int = 190
    seed: int = 0
    exact_repeats: tuple = (0, 1, 2, 2, 3, 4, 5)   # drawn per original
    paraphrases: tuple = (0, 1, 1, 2)
    hard_negatives: tuple = (0, 1, 1, 2)
    near_threshold: float = 0.0    # share of numbers drawn close to the family's threshold (training data)
    canonical_share: float = 0.6   # share of originals in the family's canonical phrasing (the rest: any phrasing)
    perturbation_weights: tuple = ()  # ((kind, weight), ...): a hard negative's kind drawn with these weights (others 1)


PRESETS = {"full": StreamConfig(), "tiny": StreamConfig(n_originals=20)}


def _pick(rng, values, exclude=None):
    choices = [v for v in values if v != exclude]
    return rng.choice(choices)


def _entity_pool(slot: str) -> list:
    return {"host": HOSTS, "service": SERVICES, "domain": DOMAINS, "db": DATABASES, "job": JOBS,
            "queue": QUEUES, "ip": [f"10.0.{a}.{b}" for a in (3, 7, 12) for b in (4, 19, 88, 201)]}[slot]


def _intended(fam: Family, slots: dict, negated: bool, unit: str | None) -> bool:
    if fam.negated is not None:
        return negated == fam.action_if_negated
    low, high, threshold, above = fam.number
    value = slots["n"]
    if fam.units and unit and unit != fam.units[0]:
        value = value / fam.units[2]         # back to canonical units
    return (value >= threshold) == above


def _render(fam: Family, phrasing: int, slots: dict, negated: bool, unit: str | None) -> str:
    table = fam.negated if negated else fam.phrasings
    text = table[phrasing % len(table)].format(**slots)
    if fam.units and unit and unit != fam.units[0]:
        text = text.replace(f" {fam.units[0]}", f" {unit}")
    return text


def _draw_number(rng, fam: Family, near_threshold: float = 0.0) -> int:
    """A number from the family's range; with probability near_threshold, one within a tenth of the range
    of the threshold (the shipped stream uses 0 and draws exactly as before)."""
    low, high, threshold, _ = fam.number
    if fam.name == "http_status":
        return rng.choice([200, 200, 201, 204, 301, 404, 500, 502, 503, 504])
    if fam.name == "cron":
        return rng.choice([0, 0, 0, 1, 2, 137])
    if near_threshold and rng.random() < near_threshold:
        w = max(2, (high - low) // 10)
        return rng.randint(max(low, threshold - w), min(high, threshold + w))
    return rng.randint(low, high)


def _swap_number(rng, fam: Family, n: int) -> int:
    """A number on the other side of the family's threshold."""
    low, high, threshold, _ = fam.number
    if fam.name == "http_status":
        return rng.choice([503, 500, 502]) if n < 500 else rng.choice([200, 204, 201])
    if fam.name == "cron":
        return rng.choice([1, 2, 137]) if n == 0 else 0
    if n >= threshold:
        return rng.randint(low, threshold - 1)
    return rng.randint(threshold, high)


def _draw_perturbation(rng, kinds: list, weights: tuple) -> str:
    """A hard negative's kind: uniform (the shipped stream's draw), or with ((kind, weight), ...) weights."""
    if not weights:
        return rng.choice(kinds)
    w = dict(weights)
    return rng.choices(kinds, [w.get(k, 1.0) for k in kinds])[0]


def generate_stream(config: StreamConfig | str = "full", families: list | None = None,
                    pools: dict | None = None) -> list[MonitoringItem]:
    """The labelled stream; families / pools replace FAMILIES and the entity pools (judge_data's training data)."""
    families, pool = families or FAMILIES, _entity_pool if pools is None else pools.__getitem__
    if isinstance(config, str):
        if config not in PRESETS:
            raise LessonkitError(f"unknown stream preset {config!r}; choose from {sorted(PRESETS)}")
        config = PRESETS[config]
    rng = random.Random(config.seed)
    # each record: (sort key, fields); ids assigned after ordering
    records = []
    for k in range(config.n_originals):
        fam = rng.choice(families)
        slots = {s: rng.choice(pool(s)) for s in fam.slots}
        if fam.number:
            slots["n"] = _draw_number(rng, fam, config.near_threshold)
        negated = fam.negated is not None and rng.random() < 0.3
        unit = fam.units[0] if fam.units else None
        phr = 0 if rng.random() < config.canonical_share else rng.randrange(len(fam.phrasings))
        t0 = rng.random()
        base = dict(family=fam.name, kind=fam.kind, slots=slots, negated=negated, unit=unit,
                    phrasing=phr)
        records.append((t0, k, "original", None, base))
        for _ in range(rng.choice(config.exact_repeats)):
            records.append((t0 + (1 - t0) * rng.random(), k, "exact_repeat", None, base))
        for _ in range(rng.choice(config.paraphrases)):
            other = _pick(rng, range(len(fam.phrasings)), exclude=phr)
            records.append((t0 + (1 - t0) * rng.random(), k, "paraphrase", None,
                            dict(base, phrasing=other)))
        kinds = [p for p in PERTURBATIONS if
                 (p == "negation" and fam.negated) or (p == "number_swap" and fam.number) or
                 (p == "entity_swap") or (p == "unit_change" and fam.units)]
        for _ in range(rng.choice(config.hard_negatives)):
            p = _draw_perturbation(rng, kinds, config.perturbation_weights)
            var = dict(base, slots=dict(slots))
            if rng.random() < 0.3:
                var["phrasing"] = rng.randrange(len(fam.phrasings))
            if p == "negation":
                var["negated"] = not negated
            elif p == "number_swap":
                var["slots"]["n"] = _swap_number(rng, fam, slots["n"])
            elif p == "entity_swap":
                s = rng.choice(fam.slots)
                var["slots"][s] = _pick(rng, pool(s), exclude=slots[s])
            else:
                var["unit"] = fam.units[1]
            records.append((t0 + (1 - t0) * rng.random(), k, "hard_negative", p, var))
    records.sort(key=lambda r: (r[0], r[2] != "original"))
    first_id: dict[int, int] = {}
    items = []
    for i, (_, k, relation, pert, f) in enumerate(records):
        fam = next(x for x in families if x.name == f["family"])
        if relation == "original":
            first_id[k] = i
        text = _render(fam, f["phrasing"], f["slots"], f["negated"], f["unit"])
        items.append(MonitoringItem(
            id=i, text=text, family=fam.name, kind=fam.kind, relation=relation,
            parent=None if relation == "original" else first_id[k], perturbation=pert,
            needs_action=_intended(fam, f["slots"], f["negated"], f["unit"])))
    return items


def write_jsonl(items: list[MonitoringItem], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it.to_dict(), ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[MonitoringItem]:
    path = Path(path)
    if not path.exists():
        raise LessonkitError(f"monitoring stream not found: {path}")
    items = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                items.append(MonitoringItem(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise LessonkitError(f"{path}:{lineno}: not a monitoring item ({exc})") from None
    return items


STREAM_PATH = workbook_path("data", "semcache", "stream.jsonl")


def load_stream(path: str | Path | None = None, limit: int | None = None) -> list[MonitoringItem]:
    """The shipped stream (data/semcache/stream.jsonl), optionally its first ``limit`` items."""
    items = read_jsonl(path or STREAM_PATH)
    return items[:limit] if limit else items


if __name__ == "__main__":   # regenerate the shipped file: python -m lessonkit.workloads.monitoring
    out = write_jsonl(generate_stream("full"), STREAM_PATH)
    print(f"wrote {out}")
