"""The whole lossless stack on one workload: a monitoring judge over a stream of items.

Lesson 6 (capstone). Each item goes through, in order:

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

The workload (instruction, answer schema, items) is lessonkit.workloads.triage; the ablation that
measures each technique alone and all together is lessonkit.lessons.stack.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.drafter_registry import make_drafter
from lessonkit.grammar.drafter import GrammarDrafter
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.grammar.tokens import TokenGrammar
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.semcache.front import SemanticFront, front_safe_margin, front_scorer
from lessonkit.semcache.policies import load_embedder
from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.states import forward_for, record_parts, union_of
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.triage import ITEM_TEMPLATE, JUDGE_SCHEMA, STOP_STRINGS, Workload, needs_action

# ---- configuration ----------------------------------------------------------------------------------
@dataclass
class StackConfig:
    n_items: int = 24               # items of the stream judged
    warm_items: int = 0             # stream items before them that warm the semantic cache (untimed)
    max_new_tokens: int = 40        # answer length cap (one short NDJSON line)
    n_examples: int = 6             # few-shot examples in the shared prefix
    k: int | str = "auto"           # drafts per verify step: "auto" (the depth gate picks 0..8 per step) or a depth
    threshold: float = 0.85         # semantic cache cosine threshold (one-sided + guard)
    audit_rate: float = 0.1         # share of served hits re-judged after probation
    audit_first_n: int = 1          # hits of a new entry that are always audited
    drafters: tuple = ("mtp", "tiny-draft", "ngram")   # model drafter candidates, measured per model
    calibration_items: int = 2      # items (outside the stream slice) used to pick the drafter
    threads: int = 1                # torch threads while timing (steadier under contention)
    progress: bool = True


PRESETS = {
    "default": StackConfig(warm_items=300),
    "cold": StackConfig(),
    "small": StackConfig(n_items=12, max_new_tokens=40, n_examples=4, warm_items=300),
    "smoke": StackConfig(n_items=4, max_new_tokens=16, n_examples=2, calibration_items=1, progress=False),
}


TECHNIQUES = ("semcache", "prefix", "grammar", "drafter")
GATE_K_MAX = 8                      # the depth gate's deepest draft in the stack (k + 1 <= 16: the row-wise path)



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
        self.needs_states = union_of((grammar, model))
        self._last = None
        self.proposed = {"grammar": 0, "model": 0}
        self.accepted = {"grammar": 0, "model": 0}

    def reset(self, prompt_ids):
        for d in (self.grammar, self.model):
            if d is not None:
                d.reset(prompt_ids)

    def record(self, start, states):
        record_parts((self.grammar, self.model), start, states)

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

    def finish(self):
        """The run is over: each part ends its run (a suffix store learns)."""
        for d in (self.grammar, self.model):
            if d is not None:
                getattr(d, "finish", lambda: None)()


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
        self.width = GATE_K_MAX if k == "auto" else k        # the deepest draft a step can take
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
        g = GrammarDrafter(self.tg, max_draft=self.width) if self.tg is not None else None
        if g is None and self._model_drafter is None:
            return None
        return StackDrafter(g, self._model_drafter)

    def __call__(self, text: str) -> JudgeResult:
        eng = self.engine
        item_ids = eng.encode(ITEM_TEMPLATE.format(text=text))
        prompt = self.prefix_ids + item_ids
        P = len(self.prefix_ids)
        cache = eng.new_cache(len(prompt) + self.max_new + self.width + 2)
        restored = 0
        with torch.inference_mode():
            if self.prefix_cache is not None:
                restored = self.prefix_cache.lookup_and_restore(self.prefix_ids, cache, max_tokens=P)
                if restored != P:                 # only a whole prefix keeps the chunks of the plain engine
                    cache.rollback(0)
                    restored = 0
            drafter = self._drafter()
            if drafter is not None:                 # before the prefix's forward, which hands a head its states
                drafter.reset(list(prompt))
            forwards = 0
            if not restored:                        # chunk 1: the shared prefix
                forward_for(drafter, eng, self.prefix_ids, cache, last_only=True)
                forwards += 1
                if self.prefix_cache is not None:
                    self.prefix_cache.save(self.prefix_ids, cache)
            if drafter is None:
                res = generate(eng, prompt, self.max_new, cache=cache, stop_strings=STOP_STRINGS)
                ids, out_text, fw = res.token_ids, res.text, res.stats["forwards"]
            else:                                   # chunk 2 (the item) is prefilled by the speculative loop
                res = speculative_generate(eng, drafter, prompt, self.max_new, k=self.k, k_max=self.width, cache=cache,
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
        self._scorer = self._score_recorded = None       # the judge's log-odds, for the front's safe margin
        if "semcache" in techniques:
            if embeddings is None:
                raise LessonkitError("the semantic cache needs the items' embeddings (embed_items)")
            margin = front_safe_margin(engine, workload.prefix)
            self.front = SemanticFront(embeddings, workload.cache_texts, threshold=cfg.threshold,
                                       audit_rate=cfg.audit_rate, audit_first_n=cfg.audit_first_n, safe_margin=margin)
            if margin is not None:
                self._score_recorded, self._scorer = front_scorer(engine, workload.prefix)
        self.answers, self.sources, self.seconds = [], [], []
        self.answer_tokens = self.engine_tokens = self.forwards = self.expert_bytes = 0
        self._warm = (0, 0, 0, 0)               # (audits, audit losses, judge calls, entries) after the warm-up

    def _judge(self, text):
        r = self.judge(text)
        self.forwards += r.forwards
        self.engine_tokens += len(r.token_ids)
        self.answer_tokens += len(r.token_ids)
        return r

    def _score(self, text: str) -> float:
        """The judge's log-odds for text, live on the engine (a timed item's share of the cache's work)."""
        self.forwards += 1 + (not self._scorer.prefilled)          # the first call prefills the judge's prefix
        return self._scorer.score(text)

    def _cached(self, i: int, text: str, judge, score=None):
        """The semantic cache's part of an item: (answer, "cache" | "audit" | "engine"); judge(text) -> answer line,
        score(text) -> the judge's log-odds (for a stored "no" when the front has a safe margin)."""
        front = self.front
        found = front.lookup(text) if front is not None else None
        if found is None:
            ans = judge(text)
            if front is not None:
                front.put(text, ans, score or self._score)
            return ans, "engine"
        entry, sim = found
        if not front.auditor.should_audit(entry.audits):
            front.store.log_hit(entry, text, sim, True, False, None)
            return front.answers[entry.id], "cache"
        ans = judge(text)                         # the audit runs the judge; its fresh answer is served
        fresh = needs_action(ans)
        front.store.log_hit(entry, text, sim, True, True, fresh)
        front.auditor.record(fresh == entry.answer, i)
        if not front.auditor.entry_allows(entry.losses, entry.audits):
            front.store.retire(entry)
            front.retired += 1
        return ans, "audit"

    def warm_up(self, texts, recorded: dict | None = None, progress: bool = False) -> int:
        """Run the semantic cache over the stream before the timed items (a cache that has been running),
        untimed and uncounted: entries, hits and audits as a live run would make them. recorded: this judge's
        answer lines per text (lessonkit.semcache.judge.recorded_answers), the same bytes the engine gives;
        a text without one is judged live. Returns the number of judged-live texts."""
        if self.front is None or not texts:
            return 0
        recorded, live = recorded or {}, 0

        def judge(t):
            nonlocal live
            if t in recorded:
                return recorded[t]
            live += 1
            return self.judge(t).text
        for i, t in enumerate(tqdm(texts, desc=f"{self.name}: warm-up", disable=not progress, leave=False)):
            self._cached(i - len(texts), t, judge, self._score_recorded)
        if self._scorer is not None and not self._scorer.prefilled:
            self._scorer.score(texts[0])          # its prefix state, as in a cache that has been running
        a = self.front.auditor
        self._warm = (a.audits, a.losses, self.judge.calls, len(self.front.answers))
        return live

    def step(self, i: int, text: str) -> str:
        """Answer item i; returns the answer line."""
        b0 = self.engine.store.counters()["bytes_read"]
        t0 = time.perf_counter()
        ans, src = self._cached(i, text, lambda t: self._judge(t).text)
        if src == "cache":
            self.answer_tokens += len(self.engine.encode(ans))
        self.seconds.append(time.perf_counter() - t0)
        self.expert_bytes += self.engine.store.counters()["bytes_read"] - b0
        self.answers.append(ans)
        self.sources.append(src)
        return ans

    def finish(self) -> StackRun:
        w_audits, w_losses, w_calls, w_entries = self._warm
        run = StackRun(self.name, self.engine.name, self.answers, self.sources, sum(self.seconds), self.forwards,
                       self.expert_bytes, self.judge.calls - w_calls, self.answer_tokens, self.engine_tokens)
        run.extra["item_seconds"] = list(self.seconds)
        if self.front is not None:
            run.audits, run.audit_losses = self.front.auditor.audits - w_audits, self.front.auditor.losses - w_losses
            run.extra["warm_entries"] = w_entries
            run.extra["safe_margin"] = self.front.safe_margin
            run.extra["cache_serving"] = self.front.auditor.serving     # False: an audit loss stopped the cache
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


def embed_workload(wl: Workload) -> tuple:
    """(embeddings aligned with wl.cache_texts, seconds): the warm-up texts and the items; the seconds are the
    items' own embedding time (the warm-up's embedding happened before the timed stretch)."""
    emb, seconds = embed_items(wl.texts)
    if not wl.warm:
        return emb, seconds
    warm, _ = embed_items(wl.warm)
    return np.concatenate([np.asarray(warm), np.asarray(emb)]), seconds

