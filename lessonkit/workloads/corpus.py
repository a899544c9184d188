"""The training corpus of the workbook's own models: prose, source code and NDJSON records.

Three kinds of text, because the lessons draft over all three:
  prose    English from the Python standard library: the language-reference topics that `pydoc`
           ships (pydoc_data/topics.py), long docstrings, and the stdlib's .txt/.rst documents.
  code     Python standard-library sources (a different half of the modules than the docstrings).
  records  NDJSON monitoring records (metric samples, alerts, log lines, deploy events) and a few
           pretty-printed JSON documents, from a seeded generator.
All stdlib text is under the PSF licence; the generated records are ours. See data/corpus/PROVENANCE.md.

Layout under data/corpus/: `{kind}.{split}.txt.gz` for kind in KINDS and split in ("train",
"heldout"); documents are joined by EOT ("<|endoftext|>"). The build is deterministic for a given
Python version (gzip with mtime 0, sorted file lists, seeded generators); the shipped files are the
reference, and `tokenizer.json` is trained on their train split.

Simplifications: documents are split by a hash of their text (1 in `heldout_every` is held out),
so held-out prose and code come from the same modules' neighbours, not from unseen projects.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import inspect
import io
import json
import platform
import random
import sysconfig
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from pydoc_data.topics import topics

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError

EOT = "<|endoftext|>"
KINDS = ("prose", "code", "records")
SPLITS = ("train", "heldout")
CORPUS_DIR = workbook_path("data", "corpus")

# Stdlib folders that are tests, vendored third-party code or generated tables.
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "ensurepip", "__pycache__",
               "encodings", "pydoc_data", "unicodedata", "turtledemo", "lib2to3"}


@dataclass(frozen=True)
class CorpusConfig:
    seed: int = 0
    prose_bytes: int = 2_000_000
    code_bytes: int = 1_900_000
    records_bytes: int = 1_600_000
    heldout_every: int = 30       # 1 document in 40 goes to the held-out split
    max_doc_bytes: int = 6_000    # long files are cut into documents at blank lines
    min_docstring_chars: int = 150


PRESETS = {"default": CorpusConfig(), "small": CorpusConfig(prose_bytes=60_000, code_bytes=60_000,
                                                            records_bytes=60_000, heldout_every=10)}


# ----------------------------------------------------------------------------- helpers
def _h(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_py_files() -> list[Path]:
    base = _stdlib_dir()
    files = [p for p in base.rglob("*.py")
             if not (set(p.relative_to(base).parts[:-1]) & _SKIP_PARTS)
             and not p.name.startswith("test_")]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def _chunks(text: str, max_bytes: int) -> list[str]:
    """Cut text into pieces of at most ~max_bytes at blank lines (single lines are never cut)."""
    out, cur, size = [], [], 0
    for para in text.split("\n\n"):
        n = len(para.encode("utf-8")) + 2
        if cur and size + n > max_bytes:
            out.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += n
    if cur:
        out.append("\n\n".join(cur))
    return [c.strip("\n") + "\n" for c in out if c.strip()]


def _clean(doc: str) -> str:
    return doc.replace(EOT, "<endoftext>").replace("\r\n", "\n").replace("\t", "    ")


def _take(docs: list[str], budget: int, seed: int) -> list[str]:
    """A seeded sample of docs totalling about `budget` bytes, kept in a stable order."""
    order = sorted(range(len(docs)), key=lambda i: (_h(f"{seed}:{docs[i]}"), i))
    chosen, total = [], 0
    for i in order:
        if total >= budget:
            break
        chosen.append(i)
        total += len(docs[i].encode("utf-8"))
    return [docs[i] for i in sorted(chosen)]


# ----------------------------------------------------------------------------- prose and code
def _module_half(path: Path) -> int:
    """0: the module's source goes to `code`; 1: its docstrings go to `prose`."""
    return _h(path.relative_to(_stdlib_dir()).as_posix()) % 2


def prose_documents(cfg: CorpusConfig) -> list[str]:
    base = _stdlib_dir()
    docs: list[str] = []
    for key in sorted(topics):
        docs.extend(_chunks(topics[key], cfg.max_doc_bytes))
    for rel in ("idlelib/NEWS.txt", "idlelib/NEWS2x.txt", "idlelib/README.txt", "idlelib/HISTORY.txt",
                "idlelib/TODO.txt", "idlelib/extend.txt", "email/architecture.rst"):
        p = base / rel
        if p.exists():
            docs.extend(_chunks(p.read_text("utf-8", errors="replace"), cfg.max_doc_bytes))
    for path in _stdlib_py_files():
        if _module_half(path) != 1:
            continue
        try:
            tree = ast.parse(path.read_text("utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                ds = ast.get_docstring(node, clean=True)
                if ds and len(ds) >= cfg.min_docstring_chars:
                    letters = sum(ch.isalpha() or ch == " " for ch in ds) / len(ds)
                    if letters > 0.75:
                        docs.extend(_chunks(inspect.cleandoc(ds), cfg.max_doc_bytes))
    return _take([_clean(d) for d in docs], cfg.prose_bytes, cfg.seed)


def code_documents(cfg: CorpusConfig) -> list[str]:
    docs: list[str] = []
    for path in _stdlib_py_files():
        if _module_half(path) != 0:
            continue
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        docs.extend(_chunks(text, cfg.max_doc_bytes))
    return _take([_clean(d) for d in docs], cfg.code_bytes, cfg.seed)


# ----------------------------------------------------------------------------- records
SERVICES = {
    "checkout": ("payments", ["POST /api/v1/checkout", "GET /api/v1/cart", "POST /api/v1/cart/items"]),
    "payments": ("payments", ["POST /api/v1/charges", "POST /api/v1/refunds", "GET /api/v1/charges/{id}"]),
    "search": ("discovery", ["GET /api/v2/search", "GET /api/v2/suggest"]),
    "inventory": ("supply", ["GET /api/v1/stock/{sku}", "PUT /api/v1/stock/{sku}"]),
    "auth": ("identity", ["POST /oauth/token", "GET /oauth/userinfo", "POST /login"]),
    "notifications": ("messaging", ["POST /api/v1/send", "GET /api/v1/templates"]),
    "ingest": ("data", ["POST /v1/events", "POST /v1/batch"]),
    "gateway": ("platform", ["GET /healthz", "GET /readyz", "*"]),
}
REGIONS = {"eu-west-1": "abc", "us-east-1": "abcdf", "us-west-2": "abc", "ap-southeast-2": "ab"}
METRICS = [  # name, unit, low, high, decimals
    ("cpu.utilization", "percent", 3.0, 97.0, 1),
    ("memory.used_bytes", "bytes", 2.1e8, 7.9e9, 0),
    ("disk.used_percent", "percent", 11.0, 93.0, 1),
    ("http.requests_per_s", "1/s", 0.5, 2400.0, 1),
    ("http.latency_p99_ms", "ms", 8.0, 2600.0, 1),
    ("http.error_rate", "ratio", 0.0, 0.2, 4),
    ("queue.depth", "messages", 0, 18000, 0),
    ("gc.pause_ms", "ms", 0.2, 180.0, 2),
    ("net.rx_bytes_per_s", "bytes/s", 1e3, 9.5e7, 0),
]
RULES = [  # rule, metric, threshold, comparator, summary template
    ("HighCpu", "cpu.utilization", 85.0, ">", "CPU utilization {v}% above {t}% for {d}m"),
    ("HighLatencyP99", "http.latency_p99_ms", 1000.0, ">", "p99 latency {v} ms above {t} ms for {d}m"),
    ("ErrorRateHigh", "http.error_rate", 0.05, ">", "error rate {v} above {t} for {d}m"),
    ("DiskAlmostFull", "disk.used_percent", 90.0, ">", "disk {v}% used, above {t}%"),
    ("QueueBacklog", "queue.depth", 10000, ">", "queue depth {v} messages above {t} for {d}m"),
    ("LowThroughput", "http.requests_per_s", 5.0, "<", "request rate {v}/s below {t}/s for {d}m"),
]
LOG_MESSAGES = {
    "DEBUG": ["cache lookup key={key} hit={hit}", "connection pool size={n} idle={m}",
              "retrying request attempt={a} backoff_ms={ms}"],
    "INFO": ["request completed", "user {user} logged in", "order {order} created",
             "flushed {n} events to storage", "config reloaded from {path}", "health check passed",
             "scheduled job {job} finished in {ms} ms"],
    "WARN": ["slow query took {ms} ms", "retrying upstream call to {svc} (attempt {a})",
             "connection pool {pct}% exhausted", "certificate for {host} expires in {d} days",
             "rate limit approaching for client {client}"],
    "ERROR": ["upstream timeout after {ms} ms", "payment declined: {reason}",
              "failed to write batch: disk quota exceeded", "connection refused by {svc}:{port}",
              "unhandled exception in worker {n}: KeyError('{key}')"],
}
REASONS = ["insufficient_funds", "card_expired", "do_not_honor", "fraud_suspected", "invalid_cvc"]
ACTORS = ["ci-bot", "alice", "bob", "deploy-pipeline", "carol", "dmitri", "oncall"]


class _RecordStream:
    """One seeded stream of monitoring activity for a service over a time window."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.service = rng.choice(sorted(SERVICES))
        self.team, self.routes = SERVICES[self.service]
        self.region = rng.choice(sorted(REGIONS))
        self.env = rng.choices(["prod", "staging", "dev"], [6, 3, 1])[0]
        n_hosts = rng.randint(1, 4)
        self.hosts = [f"{self.service}-{rng.randint(1, 24):02d}" for _ in range(n_hosts)]
        start = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=rng.randint(0, 365 * 86400))
        self.t = start
        self.version = f"{rng.randint(1, 4)}.{rng.randint(0, 30)}.{rng.randint(0, 12)}"
        self.incident = rng.random() < 0.4  # the stream drifts towards an alert

    def ts(self) -> str:
        self.t += timedelta(milliseconds=self.rng.randint(50, 45_000))
        return self.t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.t.microsecond // 1000:03d}Z"

    def hex(self, n: int) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def az(self) -> str:
        return self.region + self.rng.choice(REGIONS[self.region])

    def metric(self, progress: float) -> dict:
        name, unit, lo, hi, dec = self.rng.choice(METRICS)
        x = self.rng.betavariate(2, 5)
        if self.incident:
            x = min(1.0, x + 0.6 * progress)
        v = lo + (hi - lo) * x
        value = int(v) if dec == 0 else round(v, dec)
        return {"ts": self.ts(), "type": "metric", "host": self.rng.choice(self.hosts),
                "service": self.service, "region": self.region, "metric": name, "value": value,
                "unit": unit, "tags": {"env": self.env, "az": self.az(), "team": self.team}}

    def log(self) -> dict:
        level = self.rng.choices(["DEBUG", "INFO", "WARN", "ERROR"],
                                 [1, 6, 2, 3 if self.incident else 1])[0]
        tmpl = self.rng.choice(LOG_MESSAGES[level])
        msg = tmpl.format(key=f"{self.service}:{self.hex(6)}", hit=self.rng.choice(["true", "false"]),
                          n=self.rng.randint(1, 64), m=self.rng.randint(0, 16), a=self.rng.randint(1, 5),
                          ms=self.rng.randint(20, 9000), user=f"u{self.rng.randint(1000, 99999)}",
                          order=f"ord_{self.hex(10)}", path=f"/etc/{self.service}/config.yaml",
                          job=self.rng.choice(["reindex", "compact", "rollup", "gc-sweep"]),
                          svc=self.rng.choice(sorted(SERVICES)), pct=self.rng.randint(70, 99),
                          host=f"{self.service}.internal", d=self.rng.randint(1, 30),
                          client=f"cl_{self.hex(8)}", reason=self.rng.choice(REASONS),
                          port=self.rng.choice([443, 5432, 6379, 8080, 9092]))
        status = {"ERROR": self.rng.choice([500, 502, 503, 504]), "WARN": self.rng.choice([200, 429, 499])}
        rec = {"ts": self.ts(), "type": "log", "level": level, "service": self.service,
               "host": self.rng.choice(self.hosts), "logger": f"{self.team}.{self.service}.{self.rng.choice(['api', 'worker', 'db', 'http'])}",
               "msg": msg, "trace_id": self.hex(32)}
        if self.rng.random() < 0.7:
            rec["route"] = self.rng.choice(self.routes)
            rec["status"] = status.get(level, 200)
            rec["duration_ms"] = self.rng.randint(1, 3000 if level != "ERROR" else 9000)
        return rec

    def alert(self, state: str) -> dict:
        rule, metric, thr, cmp_, summary = self.rng.choice(RULES)
        over = self.rng.uniform(1.05, 2.5) if cmp_ == ">" else self.rng.uniform(0.05, 0.9)
        v = thr * over
        v = int(v) if isinstance(thr, int) else round(v, 4 if thr < 1 else 1)
        d = self.rng.choice([1, 5, 10, 15])
        sev = self.rng.choices(["info", "warning", "critical", "page"], [1, 4, 3, 1])[0]
        return {"ts": self.ts(), "type": "alert", "alert_id": str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
                "rule": rule, "severity": sev, "status": state, "service": self.service,
                "host": self.rng.choice(self.hosts), "region": self.region, "metric": metric,
                "value": v, "threshold": thr, "summary": summary.format(v=v, t=thr, d=d),
                "labels": {"env": self.env, "team": self.team}}

    def deploy(self) -> dict:
        old = self.version
        parts = old.split(".")
        parts[2] = str(int(parts[2]) + 1)
        self.version = ".".join(parts)
        status = self.rng.choices(["succeeded", "failed", "rolled_back"], [8, 1, 1])[0]
        return {"ts": self.ts(), "type": "deploy", "service": self.service, "env": self.env,
                "from_version": old, "to_version": self.version, "commit": self.hex(7),
                "actor": self.rng.choice(ACTORS), "status": status,
                "duration_s": self.rng.randint(30, 900)}

    def records(self, n: int) -> list[dict]:
        out, fired = [], False
        for i in range(n):
            p = i / max(1, n - 1)
            r = self.rng.random()
            if self.incident and not fired and p > 0.5 and r < 0.3:
                out.append(self.alert("firing"))
                fired = True
            elif fired and p > 0.85 and r < 0.2:
                a = self.alert("resolved")
                out.append(a)
                fired = False
            elif r < 0.45:
                out.append(self.metric(p))
            elif r < 0.93:
                out.append(self.log())
            elif r < 0.97:
                out.append(self.alert(self.rng.choice(["firing", "resolved"])))
            else:
                out.append(self.deploy())
        return out


def _pretty_document(rng: random.Random) -> str:
    """A pretty-printed JSON document: an alert rule or an incident summary."""
    s = _RecordStream(rng)
    if rng.random() < 0.5:
        rule, metric, thr, cmp_, summary = rng.choice(RULES)
        obj = {"rule": rule, "expr": f"{metric} {cmp_} {thr}", "for": f"{rng.choice([1, 5, 10])}m",
               "severity": rng.choice(["warning", "critical"]), "service": s.service,
               "labels": {"team": s.team, "env": s.env},
               "annotations": {"summary": summary.split(" for")[0].format(v="{{ $value }}", t=thr, d=5),
                               "runbook": f"https://runbooks.example.com/{s.team}/{rule.lower()}"},
               "notify": sorted(rng.sample(["pagerduty", "slack", "email", "webhook"], rng.randint(1, 3)))}
    else:
        recs = s.records(rng.randint(4, 10))
        obj = {"incident_id": f"INC-{rng.randint(1000, 9999)}", "service": s.service, "region": s.region,
               "opened_at": recs[0]["ts"], "closed_at": recs[-1]["ts"],
               "severity": rng.choice(["SEV1", "SEV2", "SEV3"]),
               "hosts": sorted(set(s.hosts)), "timeline": recs[:3], "resolved": rng.random() < 0.8}
    return json.dumps(obj, indent=2) + "\n"


def record_documents(cfg: CorpusConfig) -> list[str]:
    """Seeded NDJSON streams (compact, one record per line) plus ~8% pretty-printed JSON documents."""
    rng = random.Random(cfg.seed)
    docs, total = [], 0
    while total < cfg.records_bytes:
        if rng.random() < 0.08:
            doc = _pretty_document(rng)
        else:
            recs = _RecordStream(rng).records(rng.randint(4, 32))
            doc = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs)
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


# ----------------------------------------------------------------------------- build / load
def _write_gz(path: Path, text: str) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(text.encode("utf-8"))
    path.write_bytes(buf.getvalue())


def split_documents(docs: list[str], heldout_every: int) -> dict[str, list[str]]:
    out = {"train": [], "heldout": []}
    for d in docs:
        out["heldout" if _h(d) % heldout_every == 0 else "train"].append(d)
    return out


REFERENCE_PYTHON = "3.11.7"     # the CPython whose standard library the shipped corpus was built from


def check_reference_python(out_dir: str | Path) -> None:
    """Prose and code come from the running interpreter's standard library, so another Python version builds
    another corpus (and the models trained on it change). Rebuilding the shipped corpus is refused on any
    other version; a build into another folder is allowed (its stats name the version)."""
    running = platform.python_version()
    if running != REFERENCE_PYTHON and Path(out_dir).resolve() == CORPUS_DIR.resolve():
        raise LessonkitError(f"the shipped corpus ({CORPUS_DIR}) was built from CPython {REFERENCE_PYTHON}'s standard "
                             f"library; this is {running}, whose library differs: rebuild it with {REFERENCE_PYTHON}, "
                             "or build into another folder with --out")


def build_corpus(out_dir: str | Path = CORPUS_DIR, cfg: CorpusConfig = CorpusConfig()) -> dict:
    """Build the corpus files into out_dir; returns per kind/split document and byte counts, and the Python
    version whose standard library they came from (check_reference_python says why that matters)."""
    check_reference_python(out_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    makers = {"prose": prose_documents, "code": code_documents, "records": record_documents}
    stats: dict = {}
    for kind in KINDS:
        parts = split_documents(makers[kind](cfg), cfg.heldout_every)
        for split in SPLITS:
            text = EOT.join(parts[split])
            _write_gz(out_dir / f"{kind}.{split}.txt.gz", text)
            stats[f"{kind}.{split}"] = {"documents": len(parts[split]), "bytes": len(text.encode("utf-8"))}
    stats["python"] = platform.python_version()
    return stats


def load_documents(kind: str, split: str, corpus_dir: str | Path = CORPUS_DIR) -> list[str]:
    if kind not in KINDS or split not in SPLITS:
        raise LessonkitError(f"unknown corpus part {kind!r}.{split!r}; kinds {KINDS}, splits {SPLITS}")
    path = Path(corpus_dir) / f"{kind}.{split}.txt.gz"
    if not path.exists():
        raise LessonkitError(f"corpus file {path} is missing; build it with `lessonkit corpus build`")
    return gzip.decompress(path.read_bytes()).decode("utf-8").split(EOT)


# ----------------------------------------------------------------------------- tokenizer
def train_tokenizer(corpus_dir: str | Path = CORPUS_DIR, vocab_size: int = 4096):
    """Byte-level BPE (GPT-2 style pre-tokenisation) on the train split; EOT is id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)

    def texts():
        for kind in KINDS:
            yield from load_documents(kind, "train", corpus_dir)

    tok.train_from_iterator(texts(), trainer=trainer)
    return tok



def tokenizer_json(corpus_dir: str | Path = CORPUS_DIR) -> str:
    """The corpus tokenizer as JSON text: what a model folder's tokenizer.json holds (a tiny random model's)."""
    path = Path(corpus_dir) / "tokenizer.json"
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LessonkitError(f"{path}: cannot read the corpus tokenizer ({e})") from None


def load_tokenizer(corpus_dir: str | Path = CORPUS_DIR):
    path = Path(corpus_dir) / "tokenizer.json"
    if not path.exists():
        raise LessonkitError(f"tokenizer {path} is missing; build it with `lessonkit corpus build`")
    return Tokenizer.from_file(str(path))


# ----------------------------------------------------------------------------- prompts
def prompts_by_kind(engine=None, n: int = 20, max_tokens: int = 48, *, seed: int = 0, kinds=KINDS,
                    split: str = "heldout") -> dict[str, list[list[int]]]:
    """n prompts per kind of text from the held-out corpus, cut at line starts, at most max_tokens tokens.

    With an engine that has a tokenizer, its tokenizer encodes them; otherwise (tiny random test models)
    the corpus tokenizer does and ids are taken modulo the engine's vocabulary.
    """
    if engine is not None and engine.tokenizer is not None:
        encode = engine.encode
    else:
        tok = load_tokenizer()
        V = engine.config.vocab_size if engine is not None else None
        encode = (lambda s: [i % V for i in tok.encode(s).ids]) if V else (lambda s: tok.encode(s).ids)
    rng = random.Random(seed)
    out = {}
    for kind in kinds:
        text = "\n".join(load_documents(kind, split))
        prompts = []
        for _ in range(8 * n):
            s = text.find("\n", rng.randrange(max(len(text) - 800, 1))) + 1   # a random line start
            ids = encode(text[s:s + max_tokens * 8])[:max_tokens]
            if len(ids) >= 8:
                prompts.append(ids)
            if len(prompts) == n:
                break
        out[kind] = prompts
    return out


def spread_slots(n_slots: int, n: int, seed: int) -> list[int]:
    """n distinct window slots of 0 .. n_slots - 1, drawn with `seed`, in order: a sample of a whole token
    stream rather than of its first documents."""
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n_slots, generator=g)[:n].tolist())
