"""The whole lossless stack on one workload: a monitoring judge over a stream of items.

Lesson 7 (capstone). Each item goes through, in order:

  1. semantic cache (lessonkit.semcache): one-sided (only "needs_action": false answers are stored
     and served) + content guard, audited; a hit answers without the engine;
  2. the judge on the engine, behind a persistent prefix cache (lessonkit.prefix_cache): the long
     shared instruction + few-shot prefix is restored from disk instead of prefilled;
  3. the judge's answer is one NDJSON line following JUDGE_SCHEMA, decoded greedily with
     speculative decoding whose drafter is a composite (StackDrafter): the grammar's forced span
     when there is one (lessonkit.grammar.drafter), else the best model drafter for this model (MTP
     head, draft model or prompt lookup), chosen by measuring on calibration items.

Exactness. Every engine answer is byte-identical to the plain engine's, which prefills the same
prompt in the same two chunks (the shared prefix, then the item) and decodes one token per forward
(lessonkit.engine.generate.generate). The chunking matters: the engine's long-prefill GEMM rounds by
chunk (see lessonkit.engine.model), and a prefix cache can only ever serve whole prefixes. Verify
forwards have at most k + 1 <= 16 rows, the engine's row-wise path, bit-identical to decoding.
The semantic cache is not lossless by construction; its row reports audited losses and
actionable losses (a served "no" where the plain engine says "yes") instead.

Shape of the numbers: `ablation(...)` runs plain / each technique alone / all together on one
model and returns a DataFrame; `plot_ablation(df)` the Figure; `bench(args)` the benchmark.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from lessonkit.engine.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.engine.registry import load_model
from lessonkit.grammar.drafter import GrammarDrafter, resolve_grammar
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.grammar.tokens import TokenGrammar
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.mtp.head import head_path
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.semcache.audit import AuditConfig, Auditor
from lessonkit.semcache.policies import CosinePolicy, load_embedder
from lessonkit.semcache.store import CacheStore
from lessonkit.speculative.drafters import Draft, Drafter, ModelDrafter, NGramDrafter, OracleDrafter
from lessonkit.speculative.verify import speculative_generate

# ---- the workload ----------------------------------------------------------------------------------
JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"needs_action": {"type": "boolean"},
                   "severity": {"enum": ["low", "medium", "high"]},
                   "reason": {"type": "string"}},
    "required": ["needs_action", "severity", "reason"],
    "additionalProperties": False,
}

INSTRUCTION = """You triage monitoring items (alerts, log lines, metrics) for the on-call engineer of a \
small web shop. For each item, answer with exactly one line of JSON and nothing else: \
{"needs_action": true or false, "severity": "low", "medium" or "high", "reason": a short reason}. \
needs_action is true when a person must act now: a service is down or failing health checks, \
errors or refused connections repeat, a job exited with a non-zero code, replication lag, disk or \
memory is above its limit. It is false for routine, resolved or below-threshold items. Keep the \
reason short: quote the item's key fact. Answer every item the same way, however it is phrased.
"""

ITEM_TEMPLATE = "Item: {text}\nAnswer:\n"
STOP_STRINGS = ("\n",)


def example_answer(item) -> str:
    """The few-shot answer line for an item of the stream (its intended label, its own text as reason)."""
    return json.dumps({"needs_action": bool(item.needs_action),
                       "severity": "high" if item.needs_action else "low",
                       "reason": item.text}, separators=(",", ":"))


def build_prefix(examples) -> str:
    """Instruction + few-shot examples: the long prefix every judge call shares."""
    shots = "".join(ITEM_TEMPLATE.format(text=it.text) + example_answer(it) + "\n" for it in examples)
    return INSTRUCTION + "\n" + shots


def parse_answer(text: str) -> dict | None:
    """The answer as a dict when it is valid against JUDGE_SCHEMA's shape, else None."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("needs_action"), bool):
        return None
    return obj


def needs_action(text: str) -> bool:
    """Fail safe: an answer that does not parse counts as "needs action" (never cached, never a no)."""
    obj = parse_answer(text)
    return True if obj is None else obj["needs_action"]


# ---- configuration ----------------------------------------------------------------------------------
@dataclass
class StackConfig:
    n_items: int = 24               # items of the stream judged
    max_new_tokens: int = 40        # answer length cap (one short NDJSON line)
    n_examples: int = 6             # few-shot examples in the shared prefix
    k: int = 8                      # drafts per verify step (k + 1 <= 16: the row-wise path)
    threshold: float = 0.85         # semantic cache cosine threshold (one-sided + guard)
    audit_rate: float = 0.1         # share of served hits re-judged after probation
    audit_first_n: int = 1          # hits of a new entry that are always audited
    drafters: tuple = ("mtp", "tiny-draft", "ngram")   # model drafter candidates, measured per model
    calibration_items: int = 2      # items (outside the stream slice) used to pick the drafter
    threads: int = 1                # torch threads while timing (steadier under contention)
    progress: bool = True


PRESETS = {
    "default": StackConfig(),
    "small": StackConfig(n_items=12, max_new_tokens=40, n_examples=4),
    "smoke": StackConfig(n_items=4, max_new_tokens=16, n_examples=2, calibration_items=1, progress=False),
}

TECHNIQUES = ("semcache", "prefix", "grammar", "drafter")
ROWS = {                           # row name -> techniques on
    "plain engine": (),
    "semantic cache": ("semcache",),
    "prefix cache": ("prefix",),
    "grammar drafting": ("grammar",),
    "model drafter": ("drafter",),
    "all together": TECHNIQUES,
}


@dataclass
class Workload:
    items: list                     # MonitoringItem, judged in order
    examples: list                  # few-shot examples (disjoint from items)
    calibration: list               # drafter calibration items (disjoint from both)
    prefix: str

    @property
    def texts(self) -> list[str]:
        return [it.text for it in self.items]


def make_workload(cfg: StackConfig, stream=None) -> Workload:
    """The first n_items of the shipped stream; examples and calibration items from its far end."""
    from lessonkit.workloads.monitoring import load_stream
    stream = list(stream) if stream is not None else load_stream()
    need = cfg.n_items + cfg.n_examples + cfg.calibration_items
    if len(stream) < need:
        raise LessonkitError(f"the stream has {len(stream)} items, the stack needs {need}")
    items = stream[:cfg.n_items]
    seen = {it.text for it in items}
    tail = [it for it in reversed(stream[cfg.n_items:]) if it.text not in seen and it.relation == "original"]
    pos = [it for it in tail if it.needs_action]
    neg = [it for it in tail if not it.needs_action]
    examples = []
    for i in range(cfg.n_examples):                     # alternate yes / no
        src = pos if i % 2 == 0 else neg
        examples.append(src.pop(0))
    cal = [it for it in tail if it not in examples][:cfg.calibration_items]
    return Workload(items, examples, cal, build_prefix(examples))


# ---- drafters by name (`--draft NAME[:ARG]`, the stack's model drafter) -------------------------------
def _model_drafter(target, arg, **kw):
    eng = load_model(arg or "tiny-draft")
    d = ModelDrafter(eng, name=arg or "tiny-draft", **{k: v for k, v in kw.items() if k in ("temperature", "top_p", "seed")})
    d.check_vocab(target)
    return d


def _tiny_draft(target, arg, **kw):
    return _model_drafter(target, "tiny-draft", **kw)


def _ngram_drafter(target, arg, **kw):
    if arg is None:
        return NGramDrafter()
    try:
        n = int(arg)
    except ValueError:
        raise LessonkitError(f"ngram:N needs an integer n-gram size, got {arg!r}") from None
    return NGramDrafter(max_ngram=n)


def _oracle_drafter(target, arg, **kw):
    if arg is None:
        raise LessonkitError("the oracle drafter needs an error rate: oracle:P with P in [0, 1], e.g. oracle:0.3")
    try:
        p = float(arg)
    except ValueError:
        raise LessonkitError(f"oracle:P needs a number P in [0, 1], got {arg!r}") from None
    return OracleDrafter(target, p, seed=kw.get("seed", 0), horizon=kw.get("horizon", 128))


def _mtp_drafter(target, arg, **kw):
    """'mtp' (float head) or 'mtp:SCHEME' (quantised head, e.g. mtp:int8)."""
    return MtpDrafter(target, quant=arg or "none")


def _grammar_drafter(target, arg, **kw):
    """'grammar:NAME_OR_PATH' (a .json path is read as a JSON Schema)."""
    spec = arg or "json"
    g = resolve_grammar(schema=spec) if spec.endswith(".json") else resolve_grammar(grammar=spec)
    return GrammarDrafter(TokenGrammar(g, target.tokenizer, eos_ids=target.config.eos_ids))


# name -> factory(target, arg: str | None, **kw) -> Drafter
DRAFTERS = {
    "tiny-draft": _tiny_draft,
    "model": _model_drafter,          # model:NAME_OR_DIR
    "ngram": _ngram_drafter,          # ngram or ngram:N
    "oracle": _oracle_drafter,        # oracle:P
    "mtp": _mtp_drafter,              # mtp or mtp:SCHEME
    "grammar": _grammar_drafter,      # grammar or grammar:NAME_OR_PATH
}


def make_drafter(spec: str, target, **kw) -> Drafter:
    """A drafter from 'NAME[:ARG]': tiny-draft, model:DIR, ngram[:N], oracle:P, mtp[:SCHEME], grammar[:G]."""
    if not isinstance(spec, str) or not spec:
        raise LessonkitError(f"--draft needs a drafter name, got {spec!r}")
    name, _, arg = spec.partition(":")
    factory = DRAFTERS.get(name)
    if factory is None:
        raise LessonkitError(f"unknown drafter {spec!r}: known drafters are {', '.join(sorted(DRAFTERS))}")
    return factory(target, arg or None, **kw)


# ---- the composite drafter ---------------------------------------------------------------------------
class StackDrafter:
    """Drafter protocol: the grammar's forced span when there is one, else the model drafter.

    Either part may be None. update() goes to whichever part proposed the last draft (the grammar
    drafter also needs it to count acceptance); the model drafter re-syncs lazily on its next propose.
    """

    def __init__(self, grammar=None, model=None):
        if grammar is None and model is None:
            raise LessonkitError("StackDrafter needs a grammar drafter, a model drafter or both")
        self.grammar, self.model = grammar, model
        self.name = "+".join(d.name for d in (grammar, model) if d is not None)
        self._last = None
        self.proposed = {"grammar": 0, "model": 0}
        self.accepted = {"grammar": 0, "model": 0}

    def reset(self, prompt_ids):
        for d in (self.grammar, self.model):
            if d is not None:
                d.reset(prompt_ids)

    def propose(self, context, k):
        self._last = None
        if self.grammar is not None:
            d = self.grammar.propose(context, k)
            if d.tokens:
                self._last = "grammar"
                self.proposed["grammar"] += len(d.tokens)
                return d
        if self.model is not None:
            d = self.model.propose(context, k)
            if d.tokens:
                self._last = "model"
                self.proposed["model"] += len(d.tokens)
            return d
        return Draft([])

    def update(self, context, num_accepted):
        if self._last is not None:
            self.accepted[self._last] += int(num_accepted)
        if self.grammar is not None:
            self.grammar.update(context, num_accepted if self._last == "grammar" else 0)
        if self.model is not None and self._last == "model":
            self.model.update(context, num_accepted)


# ---- one judge call ------------------------------------------------------------------------------
@dataclass
class JudgeResult:
    text: str
    token_ids: list
    forwards: int
    restored: int = 0                # prefix tokens restored from the prefix cache


class Judge:
    """The generative judge on one engine: prefix (shared) + item -> one NDJSON answer line.

    prefix_cache: a PrefixCache or None; grammar: use grammar-forced drafts; model_drafter: a drafter
    factory name ('ngram', 'tiny-draft', 'mtp', ...), a drafter object, or None. With neither drafts nor a prefix
    cache this is exactly the plain engine: generate() after a prefill of the prefix.
    """

    def __init__(self, engine, prefix: str, *, max_new_tokens: int = 40, k: int = 8, prefix_cache=None,
                 grammar: bool = False, model_drafter: str | None = None, token_grammar=None):
        self.engine, self.max_new, self.k = engine, max_new_tokens, k
        self.prefix_ids = engine.encode(prefix)
        if len(self.prefix_ids) < 2:
            raise LessonkitError("the judge's shared prefix must be at least two tokens")
        self.prefix_cache = prefix_cache
        self.tg = token_grammar if grammar else None
        if grammar and self.tg is None:
            self.tg = judge_token_grammar(engine)
        self.model_drafter_name = model_drafter if isinstance(model_drafter, str) or model_drafter is None \
            else getattr(model_drafter, "name", type(model_drafter).__name__)
        self._model_drafter = None if isinstance(model_drafter, str) else model_drafter
        if isinstance(model_drafter, str) and model_drafter:
            self._model_drafter = make_drafter(model_drafter, engine)
        self.calls = 0
        self.drafter_stats = {"grammar_proposed": 0, "grammar_accepted": 0, "model_proposed": 0, "model_accepted": 0}

    def close(self):
        if self._model_drafter is not None and hasattr(self._model_drafter, "close"):
            self._model_drafter.close()

    def _drafter(self):
        g = GrammarDrafter(self.tg, max_draft=self.k) if self.tg is not None else None
        if g is None and self._model_drafter is None:
            return None
        return StackDrafter(g, self._model_drafter)

    def __call__(self, text: str) -> JudgeResult:
        eng = self.engine
        item_ids = eng.encode(ITEM_TEMPLATE.format(text=text))
        prompt = self.prefix_ids + item_ids
        P = len(self.prefix_ids)
        cache = eng.new_cache(len(prompt) + self.max_new + self.k + 2)
        restored = 0
        with torch.inference_mode():
            if self.prefix_cache is not None:
                restored = self.prefix_cache.lookup_and_restore(self.prefix_ids, cache, max_tokens=P)
                if restored != P:                 # only a whole prefix keeps the chunks of the plain engine
                    cache.rollback(0)
                    restored = 0
            drafter = self._drafter()
            if drafter is not None:                 # before any forward: an MTP head taps the target's hidden states
                drafter.reset(list(prompt))
            forwards = 0
            if not restored:
                eng.forward(self.prefix_ids, cache, last_only=True)      # chunk 1: the shared prefix
                forwards += 1
                if self.prefix_cache is not None:
                    self.prefix_cache.save(self.prefix_ids, cache)
            if drafter is None:
                res = generate(eng, prompt, self.max_new, cache=cache, stop_strings=STOP_STRINGS)
                ids, out_text, fw = res.token_ids, res.text, res.stats["forwards"]
            else:                                   # chunk 2 (the item) is prefilled by the speculative loop
                res = speculative_generate(eng, drafter, prompt, self.max_new, k=self.k, cache=cache,
                                           stop_strings=STOP_STRINGS, reset_drafter=False)
                ids, out_text, fw = res.token_ids, res.text, res.stats["forwards"]
                for part in ("grammar", "model"):
                    self.drafter_stats[f"{part}_proposed"] += drafter.proposed[part]
                    self.drafter_stats[f"{part}_accepted"] += drafter.accepted[part]
        self.calls += 1
        return JudgeResult(out_text, list(ids), forwards + fw, restored)


_TG_CACHE: dict = {}


def judge_token_grammar(engine):
    """TokenGrammar of JUDGE_SCHEMA (compact NDJSON) for this engine's tokenizer, built once per engine."""
    key = (engine.fingerprint(), id(engine.tokenizer))
    tg = _TG_CACHE.get(key)
    if tg is None:
        g = schema_grammar(JUDGE_SCHEMA, whitespace="compact", ndjson=True, source="stack.JUDGE_SCHEMA")
        tg = _TG_CACHE[key] = TokenGrammar(g, engine.tokenizer, eos_ids=engine.config.eos_ids)
    return tg


# ---- the semantic cache in front ---------------------------------------------------------------------
class SemanticFront:
    """One-sided + guard semantic cache with audits, in front of a judge.

    Only answers that parse with needs_action == false are stored, so a served answer is always a
    "no": a cached positive is never served. A hit is audited on its entry's first `audit_first_n`
    uses and at `audit_rate` after; an audited hit runs the judge and serves its fresh answer.
    """

    def __init__(self, embeddings, texts, *, threshold: float = 0.85, audit_rate: float = 0.1,
                 audit_first_n: int = 1, seed: int = 0):
        self.emb = {t: e for t, e in zip(texts, embeddings)}
        self.policy = CosinePolicy(threshold, one_sided=True, guard=True)
        self.store = CacheStore(":memory:", "stack")
        self.auditor = Auditor(AuditConfig(rate=audit_rate, first_n=audit_first_n, seed=seed))
        self.answers: dict[int, str] = {}        # entry id -> cached answer line
        self.retired = 0

    def lookup(self, text: str):
        if not self.auditor.serving:
            return None
        return self.policy.lookup(self.store, text, self.emb[text])

    def put(self, text: str, answer: str) -> bool:
        obj = parse_answer(answer)
        if obj is None or not self.policy.cacheable(obj["needs_action"]):
            return False
        e = self.store.put(text, self.emb[text], obj["needs_action"])
        self.answers[e.id] = answer
        return True


# ---- running a stream ----------------------------------------------------------------------------
@dataclass
class StackRun:
    name: str
    model: str
    answers: list                  # one answer line per item
    sources: list                  # "engine" | "cache" | "audit" per item
    wall_s: float
    forwards: int
    expert_bytes: int
    judge_calls: int
    answer_tokens: int
    engine_tokens: int
    audits: int = 0
    audit_losses: int = 0
    hits: int = 0
    extra: dict = field(default_factory=dict)


class StackPipeline:
    """One configuration of the stack over a workload, fed one item at a time (step), so that several
    configurations can be interleaved item by item on one engine and share the machine's drift."""

    def __init__(self, engine, workload: Workload, techniques=TECHNIQUES, *, cfg: StackConfig = StackConfig(),
                 embeddings=None, model_drafter=None, prefix_cache_dir=None, token_grammar=None,
                 name: str | None = None):
        techniques = tuple(techniques)
        bad = set(techniques) - set(TECHNIQUES)
        if bad:
            raise LessonkitError(f"unknown technique(s) {sorted(bad)}: choose from {', '.join(TECHNIQUES)}")
        self.engine, self.techniques, self.name = engine, techniques, name or "+".join(techniques) or "plain"
        self._tmp = None
        self.pc = None
        if "prefix" in techniques:
            if prefix_cache_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="lessonkit-stack-pc-")
                prefix_cache_dir = self._tmp.name
            self.pc = PrefixCache(prefix_cache_dir, engine, fsync=False)
        self.judge = Judge(engine, workload.prefix, max_new_tokens=cfg.max_new_tokens, k=cfg.k, prefix_cache=self.pc,
                           grammar="grammar" in techniques,
                           model_drafter=model_drafter if "drafter" in techniques else None, token_grammar=token_grammar)
        self.front = None
        if "semcache" in techniques:
            if embeddings is None:
                raise LessonkitError("the semantic cache needs the items' embeddings (embed_items)")
            self.front = SemanticFront(embeddings, workload.texts, threshold=cfg.threshold,
                                       audit_rate=cfg.audit_rate, audit_first_n=cfg.audit_first_n)
        self.answers, self.sources, self.seconds = [], [], []
        self.answer_tokens = self.engine_tokens = self.forwards = self.expert_bytes = 0

    def _judge(self, text):
        r = self.judge(text)
        self.forwards += r.forwards
        self.engine_tokens += len(r.token_ids)
        self.answer_tokens += len(r.token_ids)
        return r

    def step(self, i: int, text: str) -> str:
        """Answer item i; returns the answer line."""
        front = self.front
        b0 = self.engine.store.counters()["bytes_read"]
        t0 = time.perf_counter()
        found = front.lookup(text) if front is not None else None
        if found is not None:
            entry, sim = found
            audited = front.auditor.should_audit(entry.audits)
            if not audited:
                front.store.log_hit(entry, text, sim, True, False, None)
                ans, src = front.answers[entry.id], "cache"
                self.answer_tokens += len(self.engine.encode(ans))
            else:                                   # the audit runs the judge; its fresh answer is served
                ans, src = self._judge(text).text, "audit"
                fresh = needs_action(ans)
                front.store.log_hit(entry, text, sim, True, True, fresh)
                front.auditor.record(fresh == entry.answer, i)
                if not front.auditor.entry_allows(entry.losses, entry.audits):
                    front.store.retire(entry)
                    front.retired += 1
        else:
            ans, src = self._judge(text).text, "engine"
            if front is not None:
                front.put(text, ans)
        self.seconds.append(time.perf_counter() - t0)
        self.expert_bytes += self.engine.store.counters()["bytes_read"] - b0
        self.answers.append(ans)
        self.sources.append(src)
        return ans

    def finish(self) -> StackRun:
        run = StackRun(self.name, self.engine.name, self.answers, self.sources, sum(self.seconds), self.forwards,
                       self.expert_bytes, self.judge.calls, self.answer_tokens, self.engine_tokens)
        run.extra["item_seconds"] = list(self.seconds)
        if self.front is not None:
            run.audits, run.audit_losses = self.front.auditor.audits, self.front.auditor.losses
            run.hits = sum(s == "cache" for s in self.sources)
            run.extra["entries_retired"] = self.front.retired
            run.extra["cached_positives_served"] = sum(
                1 for a, s in zip(self.answers, self.sources) if s == "cache" and needs_action(a))
        if self.pc is not None:
            run.extra["prefix_cache_hits"] = self.pc.stats.prefix_cache_hits
        run.extra.update(self.judge.drafter_stats)
        run.extra["model_drafter"] = self.judge.model_drafter_name
        self.judge.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return run


def run_stack(engine, workload: Workload, techniques=TECHNIQUES, *, cfg: StackConfig = StackConfig(),
              embeddings=None, model_drafter=None, prefix_cache_dir=None, token_grammar=None,
              name: str | None = None) -> StackRun:
    """Judge the workload's items with the given techniques on; returns answers and counters."""
    from tqdm.auto import tqdm
    p = StackPipeline(engine, workload, techniques, cfg=cfg, embeddings=embeddings, model_drafter=model_drafter,
                      prefix_cache_dir=prefix_cache_dir, token_grammar=token_grammar, name=name)
    for i, text in enumerate(tqdm(workload.texts, desc=p.name, disable=not cfg.progress, leave=False)):
        p.step(i, text)
    return p.finish()


def embed_items(texts: list[str]) -> tuple:
    """(unit embeddings [n, 384], seconds): all-MiniLM-L6-v2, as lesson 5."""
    emb = load_embedder()
    emb.embed(list(texts[:1]))                  # warm-up: first-call costs are not per-item costs
    t0 = time.perf_counter()
    out = emb.embed(list(texts))
    return out, time.perf_counter() - t0


# ---- choosing the model drafter by measuring ---------------------------------------------------------
def drafter_candidates(engine, names=("mtp", "tiny-draft", "ngram")) -> list[str]:
    """The model drafters that exist for this engine (an MTP head trained for it, a draft model with
    its vocabulary, prompt lookup always)."""
    out = []
    for n in names:
        if n == "mtp":
            try:
                if head_path(engine.name).exists():
                    out.append(n)
            except Exception:
                pass
        elif n == "tiny-draft":
            from lessonkit.engine.registry import MODELS_DIR
            from lessonkit.engine.config import ModelConfig
            cfg_path = MODELS_DIR / "tiny-draft" / "config.json"
            if engine.name != "tiny-draft" and cfg_path.exists() and \
                    ModelConfig.load(cfg_path).vocab_size == engine.config.vocab_size:
                out.append(n)
        else:
            out.append(n)
    return out


def choose_drafter(engine, workload: Workload, cfg: StackConfig = StackConfig(), token_grammar=None):
    """Time grammar + each candidate on the calibration items (behind a warm prefix cache, as in the full
    stack); returns (best name, DataFrame of the measurements)."""
    import pandas as pd
    cands = drafter_candidates(engine, cfg.drafters)
    cal = Workload(workload.calibration or workload.items[:1], [], [], workload.prefix)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lessonkit-stack-cal-") as d:
        c = replace(cfg, progress=False)
        run_stack(engine, cal, ("prefix",), cfg=c, prefix_cache_dir=d, token_grammar=token_grammar)   # warm
        for name in cands:
            try:
                r = run_stack(engine, cal, ("prefix", "grammar", "drafter"), cfg=c, model_drafter=name,
                              prefix_cache_dir=d, token_grammar=token_grammar)
            except LessonkitError as e:            # e.g. a head that does not fit this model
                rows.append({"drafter": name, "wall_s": None, "tokens_per_s": None, "note": str(e)})
                continue
            rows.append({"drafter": name, "wall_s": r.wall_s, "tokens_per_s": r.engine_tokens / r.wall_s,
                         "forwards": r.forwards, "model_accepted": r.extra["model_accepted"],
                         "model_proposed": r.extra["model_proposed"], "note": ""})
    df = pd.DataFrame(rows)
    ok = df.dropna(subset=["wall_s"]) if len(df) else df
    if not len(ok):
        return None, df
    best = ok.sort_values("wall_s").iloc[0]["drafter"]
    return str(best), df


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with n torch threads (one thread is far steadier than two on an oversubscribed CPU)."""
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def one_item(engine, workload: Workload, cfg: StackConfig = StackConfig(), index: int = 0,
             model_drafter: str | None = "ngram"):
    """One item, plain engine vs the engine techniques together: the answers side by side (DataFrame)."""
    import pandas as pd
    wl = Workload(workload.items[index:index + 1], [], [], workload.prefix)
    c = replace(cfg, progress=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lessonkit-stack-one-") as d, torch_threads(cfg.threads):
        run_stack(engine, wl, (), cfg=c)        # warm-up (first-touch of weights, allocator)
        for name, tech in [("plain engine", ()), ("prefix cache, cold", ("prefix", "grammar", "drafter")),
                           ("prefix cache, warm", ("prefix", "grammar", "drafter"))]:
            r = run_stack(engine, wl, tech, cfg=c, model_drafter=model_drafter, prefix_cache_dir=d, name=name)
            rows.append({"run": name, "answer": r.answers[0], "forwards": r.forwards, "wall_s": r.wall_s,
                         "grammar_accepted": r.extra.get("grammar_accepted"),
                         "model_accepted": r.extra.get("model_accepted")})
    df = pd.DataFrame(rows)
    df["identical_to_plain"] = df["answer"] == df["answer"].iloc[0]
    return df


# ---- the ablation ------------------------------------------------------------------------------------
ABLATION_COLUMNS = ["model", "row", "techniques", "wall_s", "speedup", "tokens_per_s", "forwards", "expert_bytes",
                    "judge_calls", "identical_to_plain", "cache_hits", "audits", "audited_losses",
                    "actionable_losses", "model_drafter"]


def _losses(run: StackRun, plain: StackRun) -> tuple[int, int]:
    """(losses, actionable losses) of answers served from the cache, against the plain engine."""
    loss = act = 0
    for a, s, p in zip(run.answers, run.sources, plain.answers):
        if s != "cache":
            continue
        served, fresh = needs_action(a), needs_action(p)
        loss += served != fresh
        act += fresh and not served
    return loss, act


def ablation(engine, cfg: StackConfig | str = "default", *, rows=None, embeddings=None, embed_s: float = 0.0,
             workload=None, model_drafter: str | None = "auto") -> tuple:
    """Plain engine, each technique on its own, all together, on one engine.

    Returns (DataFrame with ABLATION_COLUMNS, dict of the StackRuns, drafter DataFrame). Timing runs
    with torch.set_num_threads(cfg.threads); the embedding time (once per stream) is added to the
    rows that use the semantic cache.
    """
    import pandas as pd
    cfg = PRESETS[cfg] if isinstance(cfg, str) else cfg
    rows = list(ROWS) if rows is None else list(rows)
    if "plain engine" not in rows:
        rows.insert(0, "plain engine")
    for r in rows:
        if r not in ROWS:
            raise LessonkitError(f"unknown ablation row {r!r}: choose from {', '.join(ROWS)}")
    wl = workload or make_workload(cfg)
    with torch_threads(cfg.threads):
        tg = judge_token_grammar(engine)
        if any("semcache" in ROWS[r] for r in rows) and embeddings is None:
            embeddings, embed_s = embed_items(wl.texts)
        draft_df = None
        if model_drafter == "auto":
            model_drafter, draft_df = choose_drafter(engine, wl, cfg, tg)
        # warm-up: one item through the plain engine (allocator, expert cache, tokenizer)
        run_stack(engine, Workload(wl.items[:1], [], [], wl.prefix), (), cfg=replace(cfg, progress=False))
        # every configuration runs item by item, interleaved (order rotated per item), so that the
        # machine's drift (other processes) lands on all rows alike
        pipes = {r: StackPipeline(engine, wl, ROWS[r], cfg=cfg, embeddings=embeddings, model_drafter=model_drafter,
                                  token_grammar=tg, name=r) for r in rows}
        from tqdm.auto import tqdm
        for i, text in enumerate(tqdm(wl.texts, desc=f"ablation {engine.name}", disable=not cfg.progress)):
            for j in range(len(rows)):
                pipes[rows[(i + j) % len(rows)]].step(i, text)
        runs = {r: p.finish() for r, p in pipes.items()}
        for r in rows:
            if "semcache" in ROWS[r]:
                runs[r].wall_s += embed_s
    plain = runs["plain engine"]
    out = []
    for r in rows:
        run = runs[r]
        eng_items = [i for i, s in enumerate(run.sources) if s != "cache"]
        identical = all(run.answers[i] == plain.answers[i] for i in eng_items)
        loss, act = _losses(run, plain)
        out.append({"model": engine.name, "row": r, "techniques": "+".join(ROWS[r]) or "none",
                    "wall_s": run.wall_s, "speedup": plain.wall_s / run.wall_s,
                    "tokens_per_s": run.answer_tokens / run.wall_s, "forwards": run.forwards,
                    "expert_bytes": run.expert_bytes, "judge_calls": run.judge_calls,
                    "identical_to_plain": identical, "cache_hits": run.hits, "audits": run.audits,
                    "audited_losses": run.audit_losses if "semcache" in ROWS[r] else None,
                    "actionable_losses": act if "semcache" in ROWS[r] else None,
                    "losses": loss if "semcache" in ROWS[r] else None,
                    "model_drafter": model_drafter if "drafter" in ROWS[r] else None,
                    "cached_positives_served": run.extra.get("cached_positives_served")})
    df = pd.DataFrame(out)
    return df, runs, draft_df


def plot_ablation(df, title: str | None = None):
    """Speed-up over the plain engine per row (bars, one group per model); hatched = not byte-identical."""
    import matplotlib.pyplot as plt
    import numpy as np
    models = list(dict.fromkeys(df["model"]))
    names = list(dict.fromkeys(df["row"]))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.8 / max(len(models), 1)
    x = np.arange(len(names))
    for j, m in enumerate(models):
        sub = df[df["model"] == m].set_index("row")
        vals = [float(sub.loc[n, "speedup"]) if n in sub.index else 0.0 for n in names]
        bars = ax.bar(x + (j - (len(models) - 1) / 2) * w, vals, w, label=m)
        for b, n in zip(bars, names):
            if n in sub.index and not bool(sub.loc[n, "identical_to_plain"]):
                b.set_hatch("//")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(2.0, color="tab:red", lw=0.8, ls="--", label="target 2x")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("speed-up over the plain engine (x, wall time)")
    ax.set_xlabel("techniques on")
    all_rows = df[df["row"] == "all together"]
    if title is None and len(all_rows):
        title = "All techniques together: " + ", ".join(
            f"{r.model} {r.speedup:.1f}x" for r in all_rows.itertuples()) + " faster, same bytes"
    ax.set_title(title or "Lossless stack ablation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def smoke_engine():
    """The engine of smoke runs: tiny-moe."""
    return load_model("tiny-moe")


def available_models(smoke: bool = False) -> list[str]:
    from lessonkit.engine.registry import MODELS_DIR
    if smoke:
        return ["smoke"]
    out = ["tiny-moe"] if (MODELS_DIR / "tiny-moe" / "config.json").exists() else []
    return out + ["smollm2-135m"]


def load_engine(name: str):
    """A named model, a checkpoint directory, or "smoke" (smoke_engine())."""
    if name == "smoke":
        return smoke_engine()
    from lessonkit.engine.registry import load_model
    return load_model(name)


def ablation_all(models=None, cfg: StackConfig | str = "default", *, smoke: bool = False) -> tuple:
    """ablation() on each model (tiny-moe when trained, smollm2-135m); the stream is embedded once.

    Returns (DataFrame, Figure, {model: drafter DataFrame}).
    """
    import pandas as pd
    cfg = PRESETS[cfg] if isinstance(cfg, str) else cfg
    models = models or available_models(smoke)
    wl = make_workload(cfg)
    emb, embed_s = embed_items(wl.texts)
    frames, drafts = [], {}
    for m in models:
        eng = load_engine(m)
        df, runs, ddf = ablation(eng, cfg, embeddings=emb, embed_s=embed_s, workload=wl)
        frames.append(df)
        drafts[eng.name] = ddf
    df = pd.concat(frames, ignore_index=True)
    return df, plot_ablation(df), drafts


def headline(df) -> dict:
    """The figures the lesson records: per model, all-together speed-up and exactness, plus cache losses."""
    out = {}
    for m, sub in df.groupby("model", sort=False):
        s = sub.set_index("row")
        key = m.replace("-", "_").replace(".", "_")
        if "all together" in s.index:
            a = s.loc["all together"]
            out[f"{key}_all_speedup"] = round(float(a["speedup"]), 3)
            out[f"{key}_all_identical"] = bool(a["identical_to_plain"])
            out[f"{key}_all_actionable_losses"] = int(a["actionable_losses"] or 0)
            out[f"{key}_all_judge_calls"] = int(a["judge_calls"])
        out[f"{key}_plain_tokens_per_s"] = round(float(s.loc["plain engine", "tokens_per_s"]), 3)
        out[f"{key}_engine_rows_identical"] = bool(
            sub[~sub["techniques"].str.contains("semcache")]["identical_to_plain"].all())
    return out


# ---- CLI and bench ------------------------------------------------------------------------------------
def _cfg_from_args(args, smoke: bool) -> StackConfig:
    cfg = PRESETS["smoke" if smoke else "default"]
    if getattr(args, "limit", None):
        cfg = replace(cfg, n_items=int(args.limit))
    if getattr(args, "json", False):
        cfg = replace(cfg, progress=False)
    return cfg


def bench(args) -> dict:
    """`lessonkit bench stack`: the plain engine vs all techniques together on the stream, one run."""
    from lessonkit.bench.common import machine_info
    smoke = bool(getattr(args, "smoke", False))
    cfg = _cfg_from_args(args, smoke)
    model = getattr(args, "model", None)
    models = [model] if model else available_models(smoke)
    wl = make_workload(cfg)
    emb, embed_s = embed_items(wl.texts)
    rows, targets = [], []
    for m in models:
        eng = load_engine(m)
        df, runs, ddf = ablation(eng, cfg, rows=["plain engine", "all together"], embeddings=emb, embed_s=embed_s,
                                 workload=wl)
        plain_w = float(df.loc[df["row"] == "plain engine", "wall_s"].iloc[0])
        for r in df.to_dict("records"):
            rows.append({"name": f"{eng.name}: {r['row']}", "tokens_per_s": r["tokens_per_s"],
                         "identical_to_plain": bool(r["identical_to_plain"]), "wall_s": r["wall_s"],
                         "forwards": int(r["forwards"]), "expert_bytes": int(r["expert_bytes"]),
                         "judge_calls": int(r["judge_calls"]), "cache_hits": int(r["cache_hits"]),
                         "audited_losses": r["audited_losses"], "actionable_losses": r["actionable_losses"],
                         "model_drafter": r["model_drafter"]})
        a = df[df["row"] == "all together"].iloc[0]
        sp = plain_w / float(a["wall_s"])
        targets += [
            {"name": f"{eng.name}: all together speed-up over the plain engine", "value": round(sp, 3),
             "target": ">= 2.0", "met": bool(sp >= 2.0)},
            {"name": f"{eng.name}: engine outputs byte-identical to the plain engine",
             "value": bool(a["identical_to_plain"]), "target": True, "met": bool(a["identical_to_plain"])},
            {"name": f"{eng.name}: actionable losses from the semantic cache", "value": int(a["actionable_losses"]),
             "target": 0, "met": int(a["actionable_losses"]) == 0},
        ]
    return {"bench": "stack", "machine": {**machine_info(), "timing_threads": cfg.threads}, "smoke": smoke,
            "items": cfg.n_items, "max_new_tokens": cfg.max_new_tokens, "embed_s": embed_s,
            "rows": rows, "targets": targets}


def _cmd_run(args) -> int:
    cfg = _cfg_from_args(args, bool(getattr(args, "smoke", False)))
    models = [args.model] if args.model else available_models(bool(getattr(args, "smoke", False)))
    df, fig, drafts = ablation_all(models, cfg)
    if args.json:
        print(json.dumps({"config": asdict(cfg), "rows": json.loads(df.to_json(orient="records")),
                          "headline": headline(df)}))
    else:
        import pandas as pd
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(df.to_string(index=False))
        for k, v in headline(df).items():
            print(f"{k}: {v}")
    return 0


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("stack", help="the whole lossless stack on the monitoring stream (lesson 7)")
    sub = p.add_subparsers(dest="stack_cmd", required=True)
    r = sub.add_parser("run", help="ablation: plain engine, each technique alone, all together")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--model", default=None, help="one model (default: tiny-moe when trained, and smollm2-135m)")
    r.add_argument("--limit", type=int, default=None, help="judge only the first N items of the stream")
    r.add_argument("--smoke", action="store_true", help="a tiny quick run")
    r.set_defaults(func=_cmd_run)


__all__ = ["JUDGE_SCHEMA", "StackConfig", "PRESETS", "ROWS", "TECHNIQUES", "Workload", "make_workload", "StackDrafter",
           "Judge", "JudgeResult", "SemanticFront", "StackPipeline", "load_engine", "smoke_engine", "available_models", "run_stack", "embed_items", "choose_drafter", "drafter_candidates", "one_item", "ablation",
           "ablation_all", "plot_ablation", "headline", "bench", "register_cli", "parse_answer", "needs_action"]
