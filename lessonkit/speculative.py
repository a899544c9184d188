"""Speculative decoding: draft k tokens cheaply, verify them in one (k+1)-row forward of the target.

One step: the target's last emitted token (not yet in its KV cache) plus the k drafts go through the
target in a single forward; row i holds the target's distribution for the position of draft i+1.
  greedy:   accept draft i while argmax(row i-1) == draft i; the first mismatch (or row k) gives the
            target's own token, the "bonus". Output is token-identical to plain greedy decoding,
            because the engine's forward is row-invariant (a k-row forward == k 1-row forwards, bit
            for bit; see lessonkit.engine.model).
  sampling: modified rejection sampling (Leviathan et al. 2023, Chen et al. 2023). p: target probs,
            q: draft probs. Accept x with probability min(1, p(x)/q(x)); on rejection sample from
            norm(max(p - q, 0)) and stop. The emitted tokens are distributed exactly as the target's.
Rejected positions are rolled back in the target's KV cache (and the drafter's).

Depth gate (k="auto"): pick k maximising E(k) / cost(k), with E(k) = 1 + a1 + a1*a2 + ... from running
per-position acceptance and cost(k) = T(k+1 rows) + k * t_draft from the measured cost curve of the
verify forward (refined online); k = 0 means "do not draft"; every `probe_every` steps it probes one
deeper than its choice, so it can notice when drafting starts paying again.

Statistics use vLLM's names: num_drafts, num_draft_tokens, num_accepted_tokens,
num_accepted_tokens_per_pos, mean_acceptance_length (= 1 + accepted / drafts, counts the bonus token).
"""
from __future__ import annotations

import importlib

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from lessonkit.drafters import DRAFTERS, Draft, Drafter
from lessonkit.engine.errors import LessonkitError
from lessonkit.engine.generate import (GenerationResult, SamplingParams, StopChecker, engine_counters, finish_stats, prefill,
                       probs_from_logits, sample_token)


# ---- the maths -----------------------------------------------------------------------------------
def expected_tokens(a: float, k: int) -> float:
    """Leviathan: expected tokens per verify step with i.i.d. acceptance a, k drafts: (1 - a^(k+1)) / (1 - a)."""
    if a >= 1.0:
        return float(k + 1)
    return (1 - a ** (k + 1)) / (1 - a)


def expected_tokens_per_pos(cond_accept: list[float], k: int) -> float:
    """E(k) = 1 + a1 + a1*a2 + ... + a1*...*ak with a_i the acceptance at position i given 1..i-1 accepted."""
    e, run = 1.0, 1.0
    for i in range(k):
        run *= cond_accept[i] if i < len(cond_accept) else (cond_accept[-1] if cond_accept else 0.0)
        e += run
    return e


def leviathan_speedup(a: float, k: int, c: float) -> float:
    """Leviathan's predicted wall-time gain: (1 - a^(k+1)) / ((1 - a)(k c + 1)); c = draft / target cost."""
    return expected_tokens(a, k) / (k * c + 1)


def conditional_acceptance(per_pos: list[int], num_drafts_reaching: list[int]) -> list[float]:
    return [a / r if r else 0.0 for a, r in zip(per_pos, num_drafts_reaching)]


# ---- verification ------------------------------------------------------------------------------
def verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int]) -> tuple[int, int]:
    """Rows [k+1, V] of the target, k drafts -> (number accepted, the target's token after them)."""
    picks = torch.argmax(target_logits, dim=-1).tolist()
    n = 0
    while n < len(draft_tokens) and picks[n] == draft_tokens[n]:
        n += 1
    return n, picks[n]


def verify_sampling(target_probs: torch.Tensor, draft_tokens: list[int], draft_probs: torch.Tensor | None,
                    gen: torch.Generator | None) -> tuple[int, int]:
    """Modified rejection sampling. target_probs [k+1, V] (p), draft_probs [k, V] (q) or None (q one-hot)."""
    for i, x in enumerate(draft_tokens):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[x] = 1.0
        else:
            q = draft_probs[i]
        px, qx = float(p[x]), float(q[x])
        r = float(torch.rand((), generator=gen))
        if qx > 0 and r * qx < px:            # accept with probability min(1, p(x) / q(x))
            continue
        residual = torch.clamp(p - q, min=0)
        s = float(residual.sum())
        residual = residual / s if s > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=gen))
    return len(draft_tokens), int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=gen))


# ---- cost curve and depth gate -------------------------------------------------------------------
def measure_cost_curve(engine, k_max: int = 8, *, context_len: int = 64, repeats: int = 5, seed: int = 0) -> list[float]:
    """Seconds of a verify forward of r = 1 .. k_max+1 rows after a `context_len`-token context.

    Row counts are interleaved within each round (so load drift hits them alike) and the minimum over
    rounds is kept: on shared cores the minimum is the cost, the rest is interference."""
    g = torch.Generator().manual_seed(seed)
    V = engine.config.vocab_size
    ctx = torch.randint(0, V, (context_len,), generator=g).tolist()
    cache = engine.new_cache(context_len + k_max + 2)
    engine.forward(ctx, cache)
    best = [float("inf")] * (k_max + 1)
    for _ in range(repeats + 1):
        for r in range(1, k_max + 2):
            toks = torch.randint(0, V, (r,), generator=g).tolist()
            t0 = time.perf_counter()
            engine.forward(toks, cache)
            best[r - 1] = min(best[r - 1], time.perf_counter() - t0)
            cache.rollback(context_len)
    return best


def cost_curve(engine, k_max: int = 8) -> list[float]:
    """The measured cost curve, cached on the engine (measured once per engine and k_max)."""
    cache = getattr(engine, "_spec_cost_curves", None)
    if cache is None:
        cache = engine._spec_cost_curves = {}
    if k_max not in cache:
        cache[k_max] = measure_cost_curve(engine, k_max)
    return cache[k_max]


@dataclass
class DepthGate:
    """Chooses k per step from running per-position acceptance and the verify cost curve."""
    cost: list[float]                         # seconds of a verify forward with r = 1 .. k_max+1 rows
    k_max: int = 8
    probe_every: int = 16
    priors: tuple = (0.8, 0.6, 0.5)           # prior acceptance of positions 1-3 (Colibri's MTP priors); deeper
                                              # positions take the estimate of the position before as prior
    prior_weight: float = 2.0
    ema: float = 0.3
    learn_cost: bool = True                   # refine cost[] online from observed verify seconds
    t_draft: float = 0.0                      # seconds per draft token (running)
    accepted: list = field(default_factory=list)
    reached: list = field(default_factory=list)
    steps: int = 0

    def __post_init__(self):
        if len(self.cost) < self.k_max + 1:
            raise LessonkitError(f"cost curve has {len(self.cost)} points, the gate needs k_max+1 = {self.k_max + 1}")
        self.cost = list(self.cost)
        self.accepted = [0] * self.k_max
        self.reached = [0] * self.k_max

    def acceptance(self) -> list[float]:
        out = []
        for i in range(self.k_max):
            # beyond the listed priors, a position's prior is the estimate for the position before it
            prior = self.priors[i] if i < len(self.priors) else out[-1]
            out.append((self.accepted[i] + self.prior_weight * prior) / (self.reached[i] + self.prior_weight))
        return out

    def value(self, k: int, acc: list[float] | None = None) -> float:
        acc = self.acceptance() if acc is None else acc
        return expected_tokens_per_pos(acc, k) / (self.cost[k] + k * self.t_draft)

    def best(self) -> int:
        acc = self.acceptance()
        return max(range(self.k_max + 1), key=lambda k: (self.value(k, acc), -k))

    def choose(self) -> int:
        self.steps += 1
        k = self.best()
        if self.steps % self.probe_every == 0:
            k = min(k + 1, self.k_max)        # probe one deeper now and then
        return k

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float, draft_s: float) -> None:
        for i in range(min(n_accepted + 1, n_drafted)):
            self.reached[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1
        r = n_drafted                          # forward had n_drafted + 1 rows -> cost index n_drafted
        if self.learn_cost:
            self.cost[r] = (1 - self.ema) * self.cost[r] + self.ema * verify_s
        if n_drafted:
            self.t_draft = (1 - self.ema) * self.t_draft + self.ema * draft_s / n_drafted if self.t_draft else draft_s / n_drafted


# ---- the loop ------------------------------------------------------------------------------------
def speculative_generate(target, drafter: Drafter, prompt_ids: list[int], max_new_tokens: int, *,
                         k: int | str = 4, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         stop_token_ids=(), stop_strings=(), callback: Callable[[int], None] | None = None,
                         use_eos: bool = True, k_max: int = 8, probe_every: int = 16,
                         cost: list[float] | None = None, learn_cost: bool = True,
                         cache=None, reset_drafter: bool = True) -> GenerationResult:
    """Generate with drafts verified by `target`. Greedy: token-identical to `generate`; sampling: same distribution.

    cache: a KV cache that already holds a prefix of the prompt (e.g. restored from the prefix cache);
    only the rest of the prompt is prefilled, exactly as `generate(..., cache=cache)` does.
    reset_drafter=False: the caller already reset the drafter (e.g. before prefilling that prefix, so an
    MTP head saw its hidden states).

    k: drafts per step, or "auto" for the depth gate, which uses `cost` (seconds of a verify forward of
    1 .. k_max+1 rows; measured once per engine when None) and refines it online unless learn_cost=False.
    """
    params = SamplingParams(temperature, top_p, seed)
    if max_new_tokens < 0:
        raise LessonkitError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    try:
        from lessonkit.engine.model import ROWWISE_MAX
    except ImportError:                                 # older engine: every forward row-invariant
        ROWWISE_MAX = 1 << 30
    kmax_allowed = ROWWISE_MAX - 1
    if (k == "auto" and k_max > kmax_allowed) or (isinstance(k, int) and k > kmax_allowed):
        raise LessonkitError(f"draft length {k_max if k == 'auto' else k} too long: a verify forward of more than "
                             f"{ROWWISE_MAX} rows takes the GEMM path, which is not bit-identical to decoding; "
                             f"use k <= {kmax_allowed}")
    gate = None
    if k == "auto" and cost is not None:
        k_max = min(k_max, len(cost) - 1)              # a shorter measured curve bounds the depth
    if k == "auto":
        gate = DepthGate(cost if cost is not None else cost_curve(target, k_max), k_max=k_max, probe_every=probe_every,
                         learn_cost=learn_cost)
        width = k_max
    elif isinstance(k, int) and not isinstance(k, bool) and k >= 0:
        width = k
    else:
        raise LessonkitError(f"draft length k must be a non-negative integer or 'auto', got {k!r}")
    if hasattr(drafter, "check_vocab"):
        drafter.check_vocab(target)
    if hasattr(drafter, "configure"):
        drafter.configure(temperature, top_p, seed)
    prompt = list(prompt_ids)
    stops = list(stop_token_ids) + (target.config.eos_ids if use_eos else [])
    checker = StopChecker(target, stops, stop_strings)
    if cache is None:
        cache = target.new_cache()
    if cache.length >= len(prompt):
        raise LessonkitError(f"the cache already holds {cache.length} positions: the prompt ({len(prompt)} tokens) "
                             "needs at least one new token")
    held = cache.length
    gen = torch.Generator().manual_seed(seed)

    t_r = time.perf_counter()
    if reset_drafter:
        drafter.reset(prompt)
    reset_s = time.perf_counter() - t_r

    before = engine_counters(target)
    t0 = time.perf_counter()
    logits = prefill(target, prompt, cache) if held == 0 else target.forward(prompt[held:], cache, last_only=True)[-1]
    ttft = time.perf_counter() - t0
    forwards, unique = 1, 0
    num_drafts = num_draft_tokens = num_accepted = 0
    per_pos = [0] * width
    k_hist: Counter = Counter()
    draft_s = verify_s = 0.0
    out: list[int] = []
    context = list(prompt)

    def emit(t: int) -> bool:
        out.append(t)
        context.append(t)
        if callback is not None:
            callback(t)
        return checker.done(out) or len(out) >= max_new_tokens

    done = max_new_tokens == 0 or emit(sample_token(logits, params, gen))
    while not done:
        room = max_new_tokens - len(out) - 1          # the step emits up to k drafts + 1 own token
        kk = min(gate.choose() if gate else width, room)
        td = time.perf_counter()
        draft = drafter.propose(list(context), kk) if kk > 0 else Draft([])
        d = [int(t) for t in draft.tokens[:kk]]
        dq = draft.probs[:len(d)] if (draft.probs is not None and d) else None
        td = time.perf_counter() - td
        pos = cache.length                            # == len(context) - 1: the last token is not cached yet
        tv = time.perf_counter()
        rows = target.forward([context[-1]] + d, cache)
        tv = time.perf_counter() - tv
        forwards += 1
        unique += target.model.last_forward["unique_experts"]
        if params.greedy:
            n, nxt = verify_greedy(rows, d)
        else:
            n, nxt = verify_sampling(probs_from_logits(rows, temperature, top_p), d, dq, gen)
        cache.rollback(pos + 1 + n)                   # keep last token + accepted drafts; forget the rest
        draft_s += td
        verify_s += tv
        k_hist[len(d)] += 1
        if d:
            num_drafts += 1
            num_draft_tokens += len(d)
            num_accepted += n
            for i in range(n):
                per_pos[i] += 1
        if gate:
            gate.observe(len(d), n, tv, td)
        for t in d[:n] + [nxt]:
            if emit(t):
                done = True
                break
        drafter.update(list(context), n)
    ids, text = checker.trim(out)
    extra = {
        "prompt_tokens": len(prompt), "drafter": getattr(drafter, "name", type(drafter).__name__),
        "k": k, "num_drafts": num_drafts, "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted, "num_accepted_tokens_per_pos": per_pos,
        "mean_acceptance_length": 1 + num_accepted / num_drafts if num_drafts else None,
        "acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else None,
        "tokens_per_forward": len(ids) / max(forwards, 1),
        "tokens_per_verify": (len(out) - 1) / (forwards - 1) if forwards > 1 else None,
        "draft_s": draft_s, "verify_s": verify_s, "drafter_reset_s": reset_s,
        "k_hist": {int(a): b for a, b in sorted(k_hist.items())},
    }
    if gate:
        extra["gate_acceptance"] = [round(a, 4) for a in gate.acceptance()]
    stats = finish_stats(target, before, new_tokens=len(ids), forwards=forwards, t_start=t0, ttft=ttft,
                         unique_experts=unique, extra=extra)
    return GenerationResult(ids, text, stats)


# ---- CLI helpers (the lead wires `generate --draft ... --draft-k ...`) -----------------------------
DRAFT_HELP = "drafter: tiny-draft, ngram[:N], oracle:P, model:NAME_OR_DIR, or one registered later (mtp, grammar)"


# drafters that live in their own technique module and register themselves on import
_PLUGIN_DRAFTERS = {"mtp": "lessonkit.mtp", "grammar": "lessonkit.grammar_draft"}


def make_drafter(spec: str, target, **kw) -> Drafter:
    """'tiny-draft' | 'ngram' | 'ngram:N' | 'oracle:P' | 'model:DIR' | any name in drafters.DRAFTERS ('name[:arg]')."""
    if not isinstance(spec, str) or not spec:
        raise LessonkitError(f"--draft needs a drafter name, got {spec!r}")
    name, _, arg = spec.partition(":")
    if name in _PLUGIN_DRAFTERS and name not in DRAFTERS:
        importlib.import_module(_PLUGIN_DRAFTERS[name])   # registers itself in DRAFTERS
    factory = DRAFTERS.get(name)
    if factory is None:
        raise LessonkitError(f"unknown drafter {spec!r}: known drafters are {', '.join(sorted(DRAFTERS))}")
    return factory(target, arg or None, **kw)


def parse_draft_k(value) -> int | str:
    """'auto' or a non-negative integer (for --draft-k)."""
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise LessonkitError(f"--draft-k must be a non-negative integer or 'auto', got {value!r}") from None
    if k < 0:
        raise LessonkitError(f"--draft-k must be a non-negative integer or 'auto', got {value!r}")
    return k
