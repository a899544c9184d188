"""Training data and prompt of the trained monitoring judges (`lessonkit train judge`).

The shipped stream (data/semcache/stream.jsonl) is the evaluation set, so the training items come
from the same generator (lessonkit.workloads.monitoring.generate_stream) run on another vocabulary:

- its own seed (TRAIN_SEED, the shipped stream uses 0);
- its own entity pools (TRAIN_POOLS): every host, service, domain, database, job, queue and IP is
  a name the shipped pools do not contain, so no training item can equal a shipped item;
- its own phrasings (TRAIN_FAMILIES): the same 13 families with the same numbers, thresholds, units
  and negation rules (the task is the same), written in other words; no template string is shared.
- a wording grammar (GRAMMAR_PARTS, GRAMMAR_JSON) composes 20-57 wordings per family from parts; any of them
  sharing a run of four words with a shipped wording is dropped (near_shipped);
- Numbers are drawn from the same ranges (a threshold can only be learnt from numbers around it);
  an identical item is impossible anyway because every item names at least one entity.

`check_disjoint` verifies all of it (tests/test_judge_data.py runs it), and the training command
refuses to train when it fails.

The answer of a trained judge is one compact NDJSON line following stack.JUDGE_SCHEMA:
    {"needs_action":true,"severity":"high","reason":"disk nearly full"}
severity is "high" for a yes and "low" for a no; reason is a short phrase per family and answer.
"""
from __future__ import annotations

import functools
import itertools
import json
import random
import re
from dataclasses import replace

from lessonkit.errors import LessonkitError
from lessonkit.workloads.monitoring import (FAMILIES, FAMILY_BY_NAME, PERTURBATIONS, MonitoringItem, StreamConfig,
                                            _entity_pool, generate_stream)
from lessonkit.workloads.triage import INSTRUCTION, ITEM_TEMPLATE

TRAIN_SEED = 20261130
SHOT_SEED = 7
TRAIN_POOLS = {
    "host": [f"{p}-{i:02d}" for p in ("app", "node", "edge", "proxy") for i in range(1, 9)] +
            [f"redis-{i:02d}" for i in range(1, 5)] + ["gw-01", "gw-02", "etl-01"],
    "service": ["cart-api", "pricing-svc", "ledger-worker", "profile-api", "notify-svc", "report-builder",
                "upload-gateway", "geo-lookup", "shipping-api", "reco-engine", "sso-gateway", "media-transcoder"],
    "domain": ["portal.sample.io", "docs.sample.io", "pay.sample.net", "m.sample.org", "admin.sample.dev",
               "assets.sample.io"],
    "db": ["catalog-db", "events-db", "billing-db", "metrics-db", "tenants-db", "audit-db"],
    "job": ["weekly-report", "tmp-cleanup", "backup-verify", "index-rebuild", "cert-renew", "sitemap-gen"],
    "queue": ["sms-outbound", "payment-events", "video-jobs", "webhook-retry", "search-index"],
    "ip": [f"192.168.{a}.{b}" for a in (5, 40, 77) for b in (9, 23, 150, 240)],
}
# Many more names per slot, for a judge whose answer must not depend on the entity (an entity swap keeps the
# label): with 4-12 names per slot a small model can tie labels to names it has seen, and shipped names it has
# not seen (an IP's octets, a host's number) then move its answer. Still none of the shipped names.
WIDE_TRAIN_POOLS = {
    "host": [f"{p}-{i:02d}" for p in ("app", "node", "edge", "proxy", "worker", "api", "stor", "mq", "vm", "ci")
             for i in range(1, 41)] + [f"redis-{i:02d}" for i in range(1, 21)] + [f"gw-{i:02d}" for i in range(1, 21)]
            + ["etl-01", "etl-02"],
    "service": TRAIN_POOLS["service"] + [
        f"{a}-{b}" for a in ("quote", "stock", "tax", "fraud", "chat", "feed", "promo", "rating", "address", "coupon",
                             "wallet", "route", "ticket", "badge", "survey", "invoice")
        for b in ("svc", "worker", "gateway", "engine")],
    "domain": TRAIN_POOLS["domain"] + [f"{a}.{b}.{c}" for a in ("www", "app", "mail", "id", "files", "blog", "beta")
                                       for b in ("sample", "demo", "acme", "contoso") for c in ("io", "net", "dev")],
    "db": TRAIN_POOLS["db"] + [f"{a}-db" for a in ("invoices", "carts", "geo", "reviews", "tickets", "stock",
                                                    "profiles", "tokens", "jobs", "rates", "quotes", "media")],
    "job": TRAIN_POOLS["job"] + [f"{a}-{b}" for a in ("daily", "hourly", "monthly") for b in
                                  ("rollup", "purge", "sync", "digest", "compact", "reindex", "snapshot")],
    "queue": TRAIN_POOLS["queue"] + [f"{a}-{b}" for a in ("push", "refund", "import", "export", "alert", "billing")
                                     for b in ("outbound", "inbound", "retry", "dlq")],
    "ip": [f"192.168.{a}.{b}" for a in (2, 5, 14, 40, 61, 77, 130, 199, 250) for b in (1, 9, 23, 56, 99, 150, 201, 240)]
          + [f"172.16.{a}.{b}" for a in (0, 9, 31, 128) for b in (3, 12, 45, 88, 111, 177, 233, 254)],
}
# Training IPs in the shipped IPs' own network (10.x), in subnets the shipped pool does not use (it has 10.0.3,
# 10.0.7 and 10.0.12): the digits that stand next to a count in a shipped logins item then look like digits the
# judge was trained on, yet no address is shared. check_disjoint matches names as substrings, so none of these
# contains a shipped address either.
TEN_NET_IPS = ([f"10.0.{a}.{b}" for a in (1, 2, 5, 9, 14, 21, 33, 48) for b in (2, 6, 15, 27, 64, 99, 143, 230)]
               + [f"10.{a}.{b}.{c}" for a in (1, 4, 20, 128) for b in (0, 8) for c in (5, 77)])
TEN_NET_POOLS = {**WIDE_TRAIN_POOLS, "ip": WIDE_TRAIN_POOLS["ip"] + TEN_NET_IPS}
PHRASINGS = {
    "disk": ("{host}: disk {n}% used", "disk on {host} is {n}% full", "used disk space on {host}: {n}%",
             "{host} has filled {n}% of its disk"),
    "healthcheck": ("WARN {host} {service} health probe failed", "{service} failed the health probe on {host}",
                    "health probe of {service} failed ({host})", "WARN health probe failed: {service} at {host}"),
    "latency": ("{service} p99 is {n} ms", "99th percentile latency of {service}: {n} ms",
                "{service} responds in {n} ms at p99", "latency p99 for {service} reached {n} ms"),
    "cert": ("{domain} certificate expires in {n} days", "TLS cert on {domain}: {n} days until expiry",
             "{domain} TLS certificate has {n} days left", "{n} days remain on the {domain} certificate"),
    "backup": ("backup of {db} finished", "{db} backup run finished", "last night's {db} backup finished",
               "backup for {db} finished"),
    "conn_error": ('{{"ts":"02:10:07","level":"error","service":"{service}","host":"{host}","msg":"connection refused","retries":{n}}}',
                   '{{"level":"error","msg":"connection refused","retries":{n},"host":"{host}","service":"{service}"}}',
                   '{{"retries": {n}, "msg": "connection refused", "level": "error", "service": "{service}", "host": "{host}"}}'),
    "http_status": ('{{"path":"/api/cart","status":{n},"host":"{host}","service":"{service}","ms":12}}',
                    '{{"status":{n},"service":"{service}","host":"{host}","path":"/v2/users"}}',
                    '{{"host": "{host}", "path": "/api/search", "status": {n}, "service": "{service}"}}'),
    "memory": ("{service} RSS is {n} MB", "{service} is using {n} MB of memory", "memory of {service}: {n} MB",
               "{service} holds {n} MB resident"),
    "replication": ("{db} replica lag is {n} seconds", "{db}: replica {n} seconds behind",
                    "lag of the {db} replica: {n} seconds", "the {db} replica trails the primary by {n} seconds"),
    "logins": ("{n} failed admin logins from {ip}", "{ip} failed to log in as admin {n} times",
               "admin login failed {n} times from {ip}", "from {ip}: {n} failed logins for admin"),
    "cron": ("{job} on {host} finished with exit code {n}", "cron {job} ({host}) returned exit code {n}",
             "{host} cron {job}: exit code {n}", "scheduled job {job} on {host} ended with exit code {n}"),
    "temperature": ("rack {host} inlet is {n} °C", "{host} rack inlet temperature: {n} °C",
                    "inlet sensor of rack {host} shows {n} °C", "rack {host} intake air at {n} °C"),
    "queue": ("queue {queue} has its consumers running", "{queue} consumers running",
              "consumers on {queue} are running", "the consumers of {queue} are running"),
}
NEGATED = {
    "healthcheck": ("WARN {host} {service} health probe did not fail", "{service} did not fail the health probe on {host}",
                    "health probe of {service} did not fail ({host})", "WARN health probe did not fail: {service} at {host}"),
    "backup": ("backup of {db} did not finish", "{db} backup run did not finish", "last night's {db} backup did not finish",
               "backup for {db} did not finish"),
    "queue": ("queue {queue} has its consumers not running", "{queue} consumers not running",
              "consumers on {queue} are not running", "the consumers of {queue} are not running"),
}
TRAIN_FAMILIES = [replace(f, phrasings=PHRASINGS[f.name], negated=NEGATED.get(f.name)) for f in FAMILIES]
# More wordings per family, for a judge that must learn the words themselves (tiny-moe, trained on a small
# corpus, does not carry "completed" over from "finished"): still none of the shipped templates.
EXTRA_PHRASINGS = {
    "disk": ("{host} volume usage at {n}%", "storage on {host} is {n}% full", "{host}: {n}% of the filesystem used",
             "root partition of {host} at {n}%", "{host} disk utilisation {n}%", "the disk of {host} is at {n}% capacity"),
    "healthcheck": ("ALERT {host}: health check of {service} failed", "{service} health check on {host} failed",
                    "health check failed for {service} on {host}", "CRIT {service}@{host} health check failed",
                    "{host} reports a failed health check for {service}", "the {service} health check failed on {host}"),
    "latency": ("p99 of {service} at {n} ms", "{service}: p99 response time {n} ms",
                "slowest 1% of {service} requests take {n} ms", "{service} 99th percentile response time is {n} ms",
                "p99 latency {n} ms on {service}", "{service} answers in {n} ms at the 99th percentile"),
    "cert": ("certificate of {domain} expires in {n} days", "{domain}: certificate valid for {n} more days",
             "TLS for {domain} expires in {n} days", "{n} days until the {domain} TLS certificate expires",
             "the {domain} cert runs out in {n} days", "expiry of the {domain} certificate: {n} days"),
    "backup": ("{db} backup completed successfully", "nightly {db} backup succeeded", "backup of {db} completed last night",
               "the {db} backup job completed", "{db}: backup finished", "backup run for {db} completed"),
    "conn_error": ('{{"level":"error","host":"{host}","service":"{service}","msg":"connection refused","retries":{n}}}',
                   '{{"msg":"connection refused","service":"{service}","retries":{n},"host":"{host}","level":"error"}}',
                   '{{"service": "{service}", "level": "error", "retries": {n}, "host": "{host}", "msg": "connection refused"}}',
                   '{{"ts":"11:42:00","host":"{host}","level":"error","service":"{service}","retries":{n},"msg":"connection refused"}}',
                   '{{"level":"error","retries":{n},"service":"{service}","msg":"connection refused","host":"{host}"}}',
                   '{{"host":"{host}","msg":"connection refused","level":"error","service":"{service}","retries":{n}}}'),
    "http_status": ('{{"status":{n},"path":"/api/items","service":"{service}","host":"{host}"}}',
                    '{{"host":"{host}","status":{n},"service":"{service}","path":"/health"}}',
                    '{{"service":"{service}","path":"/v1/login","host":"{host}","status":{n}}}',
                    '{{"path": "/api/checkout", "host": "{host}", "service": "{service}", "status": {n}}}',
                    '{{"status": {n}, "host": "{host}", "path": "/api/users", "service": "{service}"}}',
                    '{{"ms":30,"status":{n},"host":"{host}","service":"{service}","path":"/api/pay"}}'),
    "memory": ("{service} resident set size is {n} MB", "RSS of {service}: {n} MB", "{service} memory usage {n} MB",
               "{service} now uses {n} MB of RAM", "resident memory for {service} at {n} MB",
               "{service} consumes {n} MB of memory"),
    "replication": ("{db} replication delay is {n} seconds", "replica of {db} is {n} seconds behind",
                    "{db}: replica lag {n} seconds", "the {db} replica is lagging {n} seconds",
                    "replication on {db} lags {n} seconds", "{db} standby is {n} seconds behind the primary"),
    "logins": ("{n} failed admin login attempts from {ip}", "{ip}: admin login failed {n} times",
               "failed admin logins from {ip}: {n}", "{n} unsuccessful admin logins from {ip}",
               "admin account: {n} failed logins from {ip}", "{ip} made {n} failed login attempts as admin"),
    "cron": ("cron job {job} on {host} returned exit code {n}", "{host}: {job} cron exited with code {n}",
             "the cron job {job} ({host}) ended with code {n}", "{job} cron on {host}: exit status {n}",
             "cron {job} on {host} exited with status {n}", "exit status of {job} on {host}: {n}"),
    "temperature": ("rack {host} inlet temperature is {n} °C", "inlet temperature of rack {host}: {n} °C",
                    "{host} rack intake reads {n} °C", "rack {host}: inlet {n} °C",
                    "the rack {host} inlet sensor reads {n} °C", "temperature at the inlet of rack {host} is {n} °C"),
    "queue": ("consumers of {queue} are running", "{queue} queue: consumers running", "the {queue} consumers are up",
              "queue {queue} consumers are running", "all consumers of {queue} are running",
              "{queue}: consumer processes running"),
}
EXTRA_NEGATED = {
    "healthcheck": ("ALERT {host}: health check of {service} did not fail", "{service} health check on {host} did not fail",
                    "health check did not fail for {service} on {host}", "CRIT {service}@{host} health check did not fail",
                    "{host} reports the health check for {service} did not fail",
                    "the {service} health check did not fail on {host}"),
    "backup": ("{db} backup did not complete", "nightly {db} backup did not succeed",
               "backup of {db} did not complete last night", "the {db} backup job did not complete",
               "{db}: backup did not finish", "backup run for {db} did not complete"),
    "queue": ("consumers of {queue} are not running", "{queue} queue: consumers not running",
              "the {queue} consumers are down", "queue {queue} consumers are not running",
              "no consumers of {queue} are running", "{queue}: consumer processes not running"),
}
WIDE_TRAIN_FAMILIES = [replace(f, phrasings=PHRASINGS[f.name] + EXTRA_PHRASINGS[f.name],
                               negated=(NEGATED[f.name] + EXTRA_NEGATED[f.name]) if f.name in NEGATED else None)
                       for f in FAMILIES]

# A wording grammar: each family's wordings composed from parts (subject x predicate, and for the negatable
# families a (positive, negated) predicate pair), so a judge sees dozens of wordings per family and has to read
# the content words and the number rather than one sentence shape. NDJSON families get key orders (shuffled,
# compact and spaced). Any wording that shares a run of NGRAM_GAP words with a shipped wording is dropped
# (`near_shipped`), so no grammar wording is a near-copy of an evaluation wording either (NDJSON: no key order
# equal to a shipped one, spaces aside).
GRAMMAR_PARTS = {
    "disk": (("disk on {host}", "the disk of {host}", "{host} disk", "storage on {host}", "root volume of {host}",
              "the data volume on {host}", "{host} root filesystem", "local disk of {host}"),
             ("is {n}% full", "is {n}% used", "usage: {n}%", "at {n}% capacity", "has {n}% used", "now at {n}%",
              "fill level {n}%")),
    "latency": (("p99 of {service}", "{service} p99", "99th percentile latency of {service}",
                 "{service} tail latency (p99)", "p99 request time for {service}", "the slowest 1% of {service} calls"),
                ("is {n} ms", "hit {n} ms", "= {n} ms", "now {n} ms", "measured {n} ms", "reads {n} ms", "took {n} ms")),
    "cert": (("cert for {domain}", "the {domain} certificate", "TLS on {domain}", "{domain} TLS cert",
              "SSL certificate of {domain}", "x509 cert for {domain}"),
             ("expires in {n} days", "runs out in {n} days", "is valid {n} more days", "has {n} days left",
              "has {n} days of validity left", "expiry: {n} days")),
    "memory": (("{service} RSS", "RSS of {service}", "memory of {service}", "{service} memory footprint",
                "resident set of {service}", "{service} working set"),
               ("is {n} MB", "at {n} MB", "now {n} MB", "reads {n} MB", "= {n} MB", "grew to {n} MB")),
    "replication": (("replica of {db}", "{db} replica", "the {db} standby", "{db} replication", "replication for {db}",
                     "{db} read replica"),
                    ("is {n} seconds behind", "lags {n} seconds", "delay: {n} seconds", "is behind by {n} seconds",
                     "trails by {n} seconds", "lag is {n} seconds")),
    "logins": (("{n} failed admin logins", "{n} failed logins as admin", "{n} bad admin passwords",
                "{n} rejected admin logins", "{n} admin authentication failures", "{n} failed admin sign-ins"),
               ("from {ip}", "by {ip}", "originating at {ip}", "(source {ip})", "seen from {ip}")),
    "cron": (("cron job {job} on {host}", "{job} on {host}", "{host} cron {job}", "scheduled task {job} ({host})",
              "the {job} job on {host}", "crontab entry {job} on {host}"),
             ("exited with code {n}", "returned {n}", "exit status {n}", "finished with status {n}",
              "ended with code {n}", "terminated with exit code {n}")),
    "temperature": (("rack {host} inlet", "inlet of rack {host}", "{host} rack intake", "front inlet sensor on rack {host}",
                     "cold-aisle inlet at rack {host}", "rack {host} intake air"),
                    ("is {n} °C", "reads {n} °C", "at {n} °C", "= {n} °C", "measures {n} °C", "now {n} °C")),
    "backup": (("backup of {db}", "{db} backup", "the daily {db} backup", "{db} snapshot backup",
                "yesterday's backup of {db}", "the scheduled backup for {db}", "backup job {db}"),
               (("finished", "did not finish"), ("completed", "did not complete"), ("succeeded", "did not succeed"),
                ("completed successfully", "did not complete successfully"), ("ran to completion", "did not run to completion"),
                ("is done", "is not done"))),
    "healthcheck": (("health check of {service} on {host}", "{service}@{host} health check", "{host} {service} liveness probe",
                     "readiness probe for {service} on {host}", "the {service} healthcheck on {host}",
                     "health endpoint of {service} ({host})"),
                    (("failed", "did not fail"), ("is failing", "is not failing"),
                     ("returned a failure", "did not return a failure"), ("reported a failure", "did not report a failure"))),
    "queue": (("consumers of {queue}", "{queue} consumers", "the {queue} workers", "consumer processes for {queue}",
               "{queue} queue consumers", "workers on queue {queue}"),
              (("are running", "are not running"), ("are up", "are not up"), ("are alive", "are not alive"),
               ("are active", "are not active"), ("are processing", "are not processing"))),
}
GRAMMAR_JSON = {   # family -> (fields as "key": value pairs, how many key orders to draw)
    "conn_error": ((("level", '"error"'), ("service", '"{service}"'), ("host", '"{host}"'),
                    ("msg", '"connection refused"'), ("retries", "{n}")), 24),
    "http_status": ((("path", '"/api/items"'), ("status", "{n}"), ("host", '"{host}"'), ("service", '"{service}"')), 24),
}
NGRAM_GAP = 4


def _words(template: str) -> list[str]:
    return re.findall(r"\{\w+\}|[^\W_]+|[%°=@]", template.lower())


def _grams(template: str, n: int) -> set[tuple]:
    w = _words(template)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@functools.lru_cache(maxsize=None)
def _shipped_index(n: int) -> tuple[frozenset, frozenset]:
    """The shipped wordings without spaces, and every run of n words in them (computed once)."""
    shipped = [t for f in FAMILIES for t in f.phrasings + (f.negated or ())]
    return frozenset(t.replace(" ", "") for t in shipped), frozenset(g for t in shipped for g in _grams(t, n))


def near_shipped(template: str, n: int = NGRAM_GAP) -> bool:
    """True when the template shares a run of n words with a shipped wording (or equals one, spaces aside)."""
    squeezed, grams = _shipped_index(n)
    if template.replace(" ", "") in squeezed:
        return True
    if template.startswith("{{"):      # NDJSON: the words are the keys every event has; its wording is the key order
        return False
    return not grams.isdisjoint(_grams(template, n))


def _json_orders(fields, count: int, seed: int) -> list[str]:
    rng, out = random.Random(seed), []
    orders = sorted(itertools.permutations(range(len(fields))))
    rng.shuffle(orders)
    for k, order in enumerate(orders):
        sep = (",", ":") if k % 2 == 0 else (", ", ": ")
        body = sep[0].join(f'"{fields[i][0]}"{sep[1]}{fields[i][1]}' for i in order)
        t = "{{" + body + "}}"
        if not near_shipped(t):
            out.append(t)
        if len(out) == count:
            break
    return out


def grammar_phrasings() -> dict[str, tuple[tuple, tuple | None]]:
    """family -> (wordings, negated wordings or None), composed from GRAMMAR_PARTS / GRAMMAR_JSON, near-copies of
    shipped wordings dropped. Deterministic."""
    out = {}
    for name, (subjects, predicates) in GRAMMAR_PARTS.items():
        if isinstance(predicates[0], tuple):     # (positive, negated) pairs
            pairs = [(f"{s} {p}", f"{s} {q}") for s in subjects for p, q in predicates]
            pairs = [(p, q) for p, q in pairs if not near_shipped(p) and not near_shipped(q)]
            out[name] = (tuple(p for p, _ in pairs), tuple(q for _, q in pairs))
        else:
            first = name == "logins"             # "{n} failed ... from {ip}": count phrase first
            ts = [f"{s} {p}" for s in subjects for p in predicates] + \
                 ([f"{{ip}}: {s}" for s in subjects] if first else [])
            out[name] = (tuple(t for t in ts if not near_shipped(t)), None)
    for k, (name, (fields, count)) in enumerate(GRAMMAR_JSON.items()):
        out[name] = (tuple(_json_orders(fields, count, TRAIN_SEED + k)), None)
    return out


def _grammar_families() -> list:
    """The wide families (hand-written wordings) followed by the grammar's wordings they do not already have."""
    g, out = grammar_phrasings(), []
    for f in WIDE_TRAIN_FAMILIES:
        pos, neg = g[f.name]
        keep = [i for i, t in enumerate(pos) if t not in f.phrasings]
        out.append(replace(f, phrasings=f.phrasings + tuple(pos[i] for i in keep),
                           negated=f.negated + tuple(neg[i] for i in keep) if f.negated else None))
    return out

REASONS = {        # family -> (reason of a yes, reason of a no)
    "disk": ("disk nearly full", "disk usage normal"), "healthcheck": ("health check failed", "health check passed"),
    "latency": ("latency too high", "latency normal"), "cert": ("certificate expires soon", "certificate valid"),
    "backup": ("backup failed", "backup completed"), "conn_error": ("connections keep failing", "few retries"),
    "http_status": ("server error", "request ok"), "memory": ("memory too high", "memory normal"),
    "replication": ("replica lagging", "replication ok"), "logins": ("possible brute force", "few failed logins"),
    "cron": ("cron job failed", "cron job ok"), "temperature": ("rack too hot", "temperature normal"),
    "queue": ("consumers down", "consumers running"),
}
GRAMMAR_TRAIN_FAMILIES = _grammar_families()
TRAIN_STREAM = StreamConfig(n_originals=1200, seed=TRAIN_SEED, exact_repeats=(0,), paraphrases=(0, 1),
                            hard_negatives=(1, 1, 2), near_threshold=0.5)
N_SHOTS = 4


def judge_answer(item: MonitoringItem) -> str:
    """The answer line a trained judge is taught for an item (its intended label)."""
    yes = bool(item.needs_action)
    return json.dumps({"needs_action": yes, "severity": "high" if yes else "low",
                       "reason": REASONS[item.family][0 if yes else 1]}, separators=(",", ":"))


def training_items(config: StreamConfig = TRAIN_STREAM, wide: bool = False, wide_entities: bool = False,
                   grammar: bool = False, ten_net_ips: bool = False) -> list[MonitoringItem]:
    """Distinct training items (first occurrence of each text), from the training vocabulary; wide: with
    EXTRA_PHRASINGS too, drawn evenly (canonical_share 0.1) rather than mostly in the canonical wording;
    grammar: the wide wordings and the wording grammar's (GRAMMAR_TRAIN_FAMILIES), drawn evenly;
    wide_entities: names drawn from WIDE_TRAIN_POOLS; ten_net_ips (with wide_entities): IPs from TEN_NET_IPS too."""
    families = GRAMMAR_TRAIN_FAMILIES if grammar else WIDE_TRAIN_FAMILIES if wide else TRAIN_FAMILIES
    if wide or grammar:
        config = replace(config, canonical_share=0.1)
    if ten_net_ips and not wide_entities:
        raise LessonkitError("ten_net_ips widens the wide names: it needs wide_entities=True")
    pools = (TEN_NET_POOLS if ten_net_ips else WIDE_TRAIN_POOLS) if wide_entities else TRAIN_POOLS
    seen, out = set(), []
    for it in generate_stream(config, families, pools):
        if it.text not in seen:
            seen.add(it.text)
            out.append(it)
    return out


def few_shot_items(n: int = N_SHOTS) -> list[MonitoringItem]:
    """n training-vocabulary originals of different families, alternating yes / no (the prompt's examples)."""
    pool = generate_stream(StreamConfig(n_originals=200, seed=SHOT_SEED), TRAIN_FAMILIES, TRAIN_POOLS)
    random.Random(SHOT_SEED).shuffle(pool)
    shots, families = [], set()
    if n == 0:
        return shots
    for it in pool:
        if it.relation == "original" and it.family not in families and it.needs_action == (len(shots) % 2 == 0):
            shots.append(it)
            families.add(it.family)
        if len(shots) == n:
            return shots
    raise LessonkitError(f"could not draw {n} few-shot examples")


def judge_prefix(n_shots: int = N_SHOTS) -> str:
    """The trained judge's shared prompt prefix: the triage instruction and n_shots examples."""
    shots = "".join(ITEM_TEMPLATE.format(text=it.text) + judge_answer(it) + "\n" for it in few_shot_items(n_shots))
    return INSTRUCTION + "\n" + shots


def check_disjoint(train: list[MonitoringItem], shipped: list[MonitoringItem]) -> dict:
    """Raises LessonkitError if training and shipped data share an entity name, a template or an item."""
    problems = []
    for slot, names in TEN_NET_POOLS.items():
        shared = set(names) & set(_entity_pool(slot))
        if shared:
            problems.append(f"{slot} names in both pools: {sorted(shared)}")
    shipped_tpl = {t for f in FAMILIES for t in f.phrasings + (f.negated or ())}
    train_tpl = {t for f in GRAMMAR_TRAIN_FAMILIES for t in f.phrasings + (f.negated or ())}
    if shipped_tpl & train_tpl:
        problems.append(f"phrasings in both: {sorted(shipped_tpl & train_tpl)[:3]}")
    near = [t for t in set(train_tpl) - {t for f in WIDE_TRAIN_FAMILIES for t in f.phrasings + (f.negated or ())}
            if near_shipped(t)]
    if near:
        problems.append(f"grammar wordings near a shipped one: {sorted(near)[:3]}")
    for f in GRAMMAR_TRAIN_FAMILIES:
        g = FAMILY_BY_NAME[f.name]
        if (f.number, f.units, f.slots, f.action_if_negated) != (g.number, g.units, g.slots, g.action_if_negated):
            problems.append(f"family {f.name}: rules differ from the shipped family")
    names = {n for v in TEN_NET_POOLS.values() for n in v}
    shipped_names = {n for s in TRAIN_POOLS for n in _entity_pool(s)}
    same = {it.text for it in train} & {it.text for it in shipped}
    if same:
        problems.append(f"{len(same)} identical items, e.g. {sorted(same)[0]!r}")
    leaks = [it.text for it in train if any(n in it.text for n in shipped_names - names)]
    if leaks:
        problems.append(f"{len(leaks)} training items name a shipped entity, e.g. {leaks[0]!r}")
    if problems:
        raise LessonkitError("judge training data is not disjoint from the shipped stream: " + "; ".join(problems))
    return {"train_items": len(train), "shipped_items": len(shipped), "shared_items": 0, "shared_names": 0,
            "shared_phrasings": 0, "perturbations": list(PERTURBATIONS)}
