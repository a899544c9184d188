"""Drafters: cheap sources of guesses that the target model verifies (one protocol for the workbook).

A drafter proposes k tokens after a context; `verify.speculative_generate` verifies them in one
(k+1)-row forward of the target and tells the drafter how many it kept. The protocol is the same
shape as Hugging Face's candidate generator (get_candidates / update_candidate_strategy):

    reset(prompt_ids)              a new sequence starts
    propose(context, k) -> Draft   up to k tokens after `context` (fewer or none is allowed)
    update(context, num_accepted)  context now holds the accepted drafts + the target's bonus token

A drafter that reads the target's hidden states (the MTP head, the feature head) also says which
(`needs_states`) and takes them with `record(start, states)` (lessonkit.speculative.states).

`Draft.probs` is the draft distribution q [len(tokens), V] the tokens were sampled from, when the
drafter samples; None means the tokens were chosen deterministically (q is one-hot), which is what
greedy drafters, prompt lookup and the oracle do. Modified rejection sampling needs q; greedy
verification ignores it.

Implementations here: ModelDrafter (a small model, e.g. tiny-draft, with its own KV cache rolled back
on rejection), NGramDrafter (prompt lookup), OracleDrafter (the target's own greedy tokens, each
corrupted with probability P, so acceptance can be dialled in). The MTP head (lessonkit.mtp.drafter)
and the grammar (lessonkit.grammar.drafter) implement the same protocol; `lessonkit.drafter_registry.DRAFTERS`
names them all for `--draft`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from lessonkit.engine.attention import attend
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import probs_from_logits
from lessonkit.engine.model import apply_rope, rms_norm


@dataclass
class Draft:
    tokens: list[int]
    probs: "torch.Tensor | None" = None   # [len(tokens), V] draft distribution when sampling, else None

    def __len__(self):
        return len(self.tokens)


@runtime_checkable
class Drafter(Protocol):
    name: str

    def reset(self, prompt_ids: list[int]) -> None: ...

    def propose(self, context: list[int], k: int) -> Draft: ...

    def update(self, context: list[int], num_accepted: int) -> None: ...


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens a and b start with in common."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@torch.inference_mode()
def lean_decode_step(model, token: int, cache) -> torch.Tensor:
    """One-token forward of an engine `Transformer` without the exactness rules of `model.forward`:
    plain matmuls and attention over exactly the cached positions, about a third of the ops.

    For drafting only: its logits can differ from `model.forward`'s in the last bits, which changes
    nothing downstream because the target verifies every draft. Returns float32 logits [V]."""
    c, w, wt = model.config, model.w, model.wt
    cache.check_room(1)
    pos = cache.length
    G, hd, rep = c.n_kv_heads, c.head_dim, c.n_heads // c.n_kv_heads
    nq, nkv = c.n_heads * hd, G * hd
    cos, sin = model.cos[pos:pos + 1].to(model.dtype), model.sin[pos:pos + 1].to(model.dtype)
    scale = hd ** -0.5
    x = w["embed"][token].view(1, -1)
    for l in range(c.n_layers):
        p = f"layers.{l}."
        q, k, v = (rms_norm(x, w[p + "attn_norm"], c.norm_eps) @ wt[p + "wqkv"]).split([nq, nkv, nkv], dim=-1)
        if c.clip_qkv is not None:
            q, k, v = (t.clamp(-c.clip_qkv, c.clip_qkv) for t in (q, k, v))
        if c.qk_norm:
            q, k = rms_norm(q, w[p + "q_norm"], c.norm_eps), rms_norm(k, w[p + "k_norm"], c.norm_eps)
        q = apply_rope(q.view(1, c.n_heads, hd), cos, sin)
        cache.k[l, pos] = apply_rope(k.view(1, G, hd), cos, sin)[0]
        cache.v[l, pos] = v.view(G, hd)
        keys, vals = cache.k[l, :pos + 1].transpose(0, 1), cache.v[l, :pos + 1].transpose(0, 1)   # [G, S, hd]
        o = attend(q.view(G, rep, hd), keys, vals, scale)                                       # [G, rep, hd]
        x = x + o.reshape(1, nq) @ wt[p + "wo"]
        h = rms_norm(x, w[p + "mlp_norm"], c.norm_eps)
        if c.is_moe:
            probs = torch.softmax((h @ wt[p + "router"]).float(), dim=-1)[0]
            topw, topi = torch.topk(probs, c.top_k)
            if c.norm_topk_prob:
                topw = topw / topw.sum()
            picks = list(zip(topi.tolist(), topw.to(x.dtype)))
        else:
            picks = [(0, None)]
        for e, gate_w in picks:
            ew = model.store.get(l, e)
            g, u = (h @ ew.gate_up_t).chunk(2, dim=-1)
            y = (F.silu(g) * u) @ ew.down_t
            x = x + (y if gate_w is None else y * gate_w)
    cache.length = pos + 1
    return model.full_logits((rms_norm(x, w["norm"], c.norm_eps) @ wt["lm_head"]).float()[0])


def c_step_why_not(engine) -> str | None:
    """None when `engine`'s model can draft on its own C forward (a greedy turn in one call), else why not."""
    fwd = getattr(engine.model, "c_forward", None)
    if fwd is None:
        return f"no C forward ({getattr(engine.model, 'forward_why', 'unknown')})"
    return fwd.why_no_draft()


class _CachedModel:
    """A model + KV cache that follows a context: rolls back to the common prefix, feeds the rest.

    lean=True is a drafter's model (its guesses need not be exact), step (`_path`): "C", the model's own C forward,
    one call a token and a greedy turn in one call (CForward.draft_greedy); "engine forward", a model whose C
    forward cannot take a turn in C (experts, an embedding looked up in Python), one call a token; "torch",
    `lean_decode_step` (asked for, or no C forward). lean=False keeps the engine's exact forward (the oracle must
    reproduce the target's greedy tokens)."""

    LEAN_CATCH_UP = 4        # feed up to this many new context tokens one by one on the lean path

    def __init__(self, engine, lean: bool = False, step: str = "auto"):
        self.engine = engine
        self.cache = engine.new_cache()
        self.ids: list[int] = []             # tokens whose K/V are in the cache
        self.forwards = 0
        # step="C" or "torch" asks for one lean step (lesson 1 compares them); "auto" takes the fastest the
        # model allows (_path)
        if step not in ("auto", "C", "torch"):
            raise ValueError(f"draft step {step!r}: expected auto, C or torch")
        if lean and step == "C" and c_step_why_not(engine):
            raise LessonkitError(f"no C draft step for {engine.name}: {c_step_why_not(engine)}")
        self.step_path = self._path(engine, lean, step)
        self.lean = self.step_path == "torch"
        self._step = lambda t: lean_decode_step(engine.model, t, self.cache)

    @staticmethod
    def _path(engine, lean: bool, step: str) -> str:
        """"exact forward" (lean=False), "C" (the model's C forward, a greedy turn in one call), "engine forward"
        (the C forward one call a token: a model whose turn cannot run in C) or "torch" (asked for, or no C
        forward at all)."""
        if not lean:
            return "exact forward"
        if step == "torch":
            return "torch"
        if c_step_why_not(engine) is None:
            return "C"
        return "engine forward" if getattr(engine.model, "c_forward", None) is not None else "torch"

    def reset(self):
        self.cache.rollback(0)
        self.ids = []

    def logits_after(self, context: list[int]) -> torch.Tensor:
        """Logits [V] for the position after `context`, reusing every cached position that still matches."""
        n = common_prefix(self.ids, context)
        n = min(n, len(context) - 1)           # the last token must be fed to get its logits
        if n < 0:
            raise LessonkitError("a drafter needs a non-empty context")
        self.cache.rollback(n)                 # rejection: forget the drafts the target did not keep
        self.ids = self.ids[:n]
        new = context[n:]
        if self.lean and len(new) <= self.LEAN_CATCH_UP:
            for t in new:
                logits = self._step(t)
        else:
            logits = self.engine.forward(new, self.cache, last_only=True)[-1]
        self.forwards += 1
        self.ids = list(context)
        return logits

    def greedy_after(self, context: list[int], k: int) -> list[int]:
        """k greedy drafts after `context` in one C call (the "C" step only): the context tokens the cache lacks
        and the k - 1 drafts fed through the model's C forward, each argmax in C (CForward.draft_greedy)."""
        n = min(common_prefix(self.ids, context), len(context) - 1)
        if n < 0:
            raise LessonkitError("a drafter needs a non-empty context")
        self.cache.rollback(n)
        self.ids = self.ids[:n]
        new = context[n:]
        self.cache.check_room(len(new) + k - 1)
        model = self.engine.model
        toks = model.c_forward.draft_greedy(new, self.cache, n, k, ids=model.head_ids)
        self.cache.length = n + len(new) + k - 1
        self.forwards += k
        self.ids = list(context) + toks[:-1]
        return toks

    def feed(self, token: int) -> torch.Tensor:
        if self.lean:
            logits = self._step(token)
        else:
            logits = self.engine.forward([token], self.cache)[-1]
        self.forwards += 1
        self.ids.append(token)
        return logits


class ModelDrafter:
    """A small language model as drafter (tiny-draft for tiny-moe), with its own KV cache.

    Greedy (temperature 0) it proposes its argmax tokens; with temperature > 0 it samples them and
    returns q. `speculative_generate` calls `configure(temperature, top_p, seed)` so the drafter
    samples at the same temperature as the target (any q is lossless; a matching one accepts more).
    Its cache keeps every position whose token the target accepted; the rest is rolled back.
    """

    def __init__(self, engine, *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, name: str | None = None,
                 step: str = "auto"):
        self.engine = engine
        self.name = name or f"model:{engine.name}"
        self.model = _CachedModel(engine, lean=True, step=step)   # step: "auto", "C" or "torch" (_CachedModel)
        self.configure(temperature, top_p, seed)

    def configure(self, temperature: float, top_p: float = 1.0, seed: int = 0) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.gen = torch.Generator().manual_seed(seed + 1_000_003)

    def check_vocab(self, target) -> None:
        if self.engine.config.vocab_size != target.config.vocab_size:
            raise LessonkitError(f"drafter {self.engine.name} has a vocabulary of {self.engine.config.vocab_size} tokens, "
                                 f"target {target.name} has {target.config.vocab_size}: they must share a tokenizer")

    def reset(self, prompt_ids: list[int]) -> None:
        self.model.reset()

    def propose(self, context: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        if self.temperature == 0 and self.model.step_path == "C":
            return Draft(self.model.greedy_after(context, k))      # k steps and their argmax in one C call
        logits = self.model.logits_after(context)
        toks, rows = [], []
        for i in range(k):
            if self.temperature == 0:
                t = int(torch.argmax(logits))
            else:
                q = probs_from_logits(logits, self.temperature, self.top_p)
                t = int(torch.multinomial(q, 1, generator=self.gen))
                rows.append(q)
            toks.append(t)
            if i + 1 < k:
                logits = self.model.feed(t)
        return Draft(toks, torch.stack(rows) if rows else None)

    def update(self, context: list[int], num_accepted: int) -> None:
        pass                                   # rollback happens lazily in the next propose


class NGramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n from
    max_ngram down to min_ngram) and propose the tokens that followed it. Costs no forward at all;
    pays off on input-grounded text (code edits, records, quoting)."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, name: str = "ngram"):
        if not 1 <= min_ngram <= max_ngram:
            raise LessonkitError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.name = max_ngram, min_ngram, name

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        L = len(context)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            tail = context[L - n:]
            for start in range(L - n - 1, -1, -1):          # latest match first
                if context[start:start + n] == tail:
                    follow = context[start + n:start + n + k]
                    if follow:
                        return Draft(list(follow))
        return Draft([])

    def update(self, context: list[int], num_accepted: int) -> None:
        pass


class OracleDrafter:
    """Proposes the target's own greedy next tokens, each replaced by a wrong token with probability
    `error_rate`: acceptance under greedy verification is then (1 - error_rate) per position, dialled in.

    It runs a private copy of the target (own expert store, so the target's expert cache and counters
    are untouched). On reset it computes `horizon` greedy tokens ahead before the clock starts, so
    within a greedy run proposing costs nothing: a free drafter (c = 0), which isolates the cost of
    verification. If the context leaves the greedy path (sampling), it recomputes from there.
    """

    def __init__(self, target, error_rate: float, seed: int = 0, *, horizon: int = 128, chunk: int = 32,
                 oracle_engine=None):
        if not 0.0 <= error_rate <= 1.0:
            raise LessonkitError(f"oracle error rate must be between 0 and 1, got {error_rate}")
        self.error_rate, self.seed, self.horizon, self.chunk = float(error_rate), seed, horizon, chunk
        self.name = f"oracle:{error_rate:g}"
        self.vocab = target.config.vocab_size
        # a private copy of the target (pass oracle_engine to share one between oracles; never the target itself)
        self.engine = oracle_engine or Engine(target.model_dir, name=f"{target.name}-oracle", dtype=target.dtype)
        self.model = _CachedModel(self.engine)
        self.base: list[int] = []              # context the truth continues
        self.truth: list[int] = []             # the target's greedy tokens after base
        self.rng = random.Random(seed)
        self.reset_s = 0.0

    def _extend_from(self, context: list[int], n: int) -> None:
        self.base, self.truth = list(context), []
        logits = self.model.logits_after(context)
        for i in range(n):
            t = int(torch.argmax(logits))
            self.truth.append(t)
            if i + 1 < n:
                logits = self.model.feed(t)

    def reset(self, prompt_ids: list[int]) -> None:
        t0 = time.perf_counter()
        self.rng = random.Random(self.seed)
        self.model.reset()
        self._extend_from(list(prompt_ids), self.horizon)
        self.reset_s = time.perf_counter() - t0

    def greedy_after(self, context: list[int], k: int) -> list[int]:
        nb = len(self.base)
        m = len(context) - nb
        on_path = m >= 0 and context[:nb] == self.base and context[nb:] == self.truth[:m]
        if not on_path:
            self._extend_from(context, k)
            return self.truth[:k]
        if m + k > len(self.truth):            # ran out of look-ahead: extend along the path
            logits = self.model.logits_after(self.base + self.truth)
            for i in range(m + k - len(self.truth) + self.chunk):
                t = int(torch.argmax(logits))
                self.truth.append(t)
                logits = self.model.feed(t)
        return self.truth[m:m + k]

    def propose(self, context: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        toks = self.greedy_after(list(context), k)
        out = []
        for t in toks:
            if self.rng.random() < self.error_rate:
                t = (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab   # any token but the right one
            out.append(t)
        return Draft(out)

    def update(self, context: list[int], num_accepted: int) -> None:
        pass
