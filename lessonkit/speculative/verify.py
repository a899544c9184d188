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
Rejected positions are rolled back in the target's KV cache (and the drafter's). A drafter that reads the
target's hidden states (an MTP head, a feature head) gets them from the prefill and every verify forward
(speculative.states).

Depth gate (k="auto"): Cascade's test-then-set (speculative.gate.UtilityGate). A short test phase runs
k = 0 and the depth the cost model ranks first (E(k) / cost(k), E(k) = 1 + a1 + a1*a2 + ... from running
per-position acceptance, cost(k) = T(k+1 rows) + k * t_draft from the measured verify cost curve); the
longer set phase keeps the one whose measured whole steps gave more tokens per second; k = 0 means
"do not draft", so speculation switches itself off where it does not pay. A FirstOf's free parts (own_depth: the
suffix match of --draft auto) draft at their own depth outside the gate, whose steps and counts are the learned
drafter's alone (speculative.first_of, _draft_step).

Statistics use vLLM's names: num_drafts, num_draft_tokens, num_accepted_tokens,
num_accepted_tokens_per_pos, mean_acceptance_length (= 1 + accepted / drafts, counts the bonus token); and
num_reached_per_pos, the steps whose drafts reached position i with every earlier draft accepted (the denominator of
the acceptance at i where steps draft to different depths: speculative.gate.acceptance_by_position).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import (GenerationResult, SamplingParams, StopChecker, engine_counters,
                                       finish_stats, greedy_picks, probs_from_logits, request_cache, sample_token)
from lessonkit.engine.model import ROWWISE_MAX
from lessonkit.speculative.depth import AUTO, K_MAX, parse_draft_depth
from lessonkit.speculative.drafters import Drafter
from lessonkit.speculative.gate import DepthGate, UtilityGate, cost_curve, count_step
from lessonkit.speculative.states import forward_for, needs_states


def verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int]) -> tuple[int, int]:
    """Rows [k+1, V] of the target, k drafts -> (number accepted, the target's token after them)."""
    picks = greedy_picks(target_logits)
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


# ---- the loop ------------------------------------------------------------------------------------
@dataclass
class _Tally:
    """What one speculative run counts (vLLM's names), and its timings."""
    width: int                                # the most drafts a step can propose
    forwards: int = 1                         # the prefill
    unique: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    per_pos: list = field(default_factory=list)
    reached: list = field(default_factory=list)    # steps whose drafts reached position i, every earlier one accepted
    k_hist: Counter = field(default_factory=Counter)
    draft_s: float = 0.0
    verify_s: float = 0.0

    def __post_init__(self):
        self.per_pos = [0] * self.width
        self.reached = [0] * self.width

    def step(self, drafted: int, accepted: int, draft_s: float, verify_s: float, unique: int) -> None:
        self.forwards += 1
        self.unique += unique
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.k_hist[drafted] += 1
        if drafted:
            self.num_drafts += 1
            self.num_draft_tokens += drafted
            self.num_accepted += accepted
            count_step(self.per_pos, self.reached, drafted, accepted)

    def plain(self, steps: int, unique: int, seconds: float) -> None:
        """A plain run's steps (one row, no drafts)."""
        self.forwards += steps
        self.unique += unique
        self.verify_s += seconds
        self.k_hist[0] += steps

    def stats(self, *, prompt_tokens: int, emitted: int, kept: int, drafter, k, reset_s: float, gate) -> dict:
        extra = {
            "prompt_tokens": prompt_tokens, "drafter": getattr(drafter, "name", type(drafter).__name__),
            "k": k, "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted, "num_accepted_tokens_per_pos": self.per_pos,
            "num_reached_per_pos": self.reached,
            "mean_acceptance_length": 1 + self.num_accepted / self.num_drafts if self.num_drafts else None,
            "acceptance_rate": self.num_accepted / self.num_draft_tokens if self.num_draft_tokens else None,
            "tokens_per_forward": kept / max(self.forwards, 1),
            "tokens_per_verify": (emitted - 1) / (self.forwards - 1) if self.forwards > 1 else None,
            "draft_s": self.draft_s, "verify_s": self.verify_s, "drafter_reset_s": reset_s,
            "k_hist": {int(a): b for a, b in sorted(self.k_hist.items())},
        }
        if gate:
            extra["gate_acceptance"] = [round(a, 4) for a in gate.acceptance()]
            extra["gate"] = gate.summary()
        if getattr(drafter, "used", None) is not None:     # speculative.first_of: which drafter drafted how often
            extra["drafts_by"] = dict(drafter.used)
        return extra


def _draft_width(target, drafter, k, k_max: int, cost, probe_every: int,
                 learn_cost: bool) -> tuple[UtilityGate | None, int]:
    """(utility gate or None, the most drafts per step). k is a draft depth (lessonkit.speculative.depth);
    a library caller's bad one, or a gate deeper than K_MAX, is refused here naming the value and the limit.
    The gate picks up where this drafter's last request left off (drafter.gate_memory)."""
    k = parse_draft_depth(k)
    if k != AUTO:
        return None, k
    if isinstance(k_max, bool) or not isinstance(k_max, int) or not 0 <= k_max <= K_MAX:
        raise LessonkitError(f"k_max={k_max!r}: the depth gate's deepest draft must be an integer 0 .. K_MAX={K_MAX} "
                             f"(a verify forward of more than {ROWWISE_MAX} rows is not bit-identical to decoding)")
    if cost is not None:
        k_max = min(k_max, len(cost) - 1)          # a shorter measured curve bounds the depth
    depth = DepthGate(cost if cost is not None else cost_curve(target, k_max), k_max=k_max,
                      probe_every=probe_every, learn_cost=learn_cost)
    gate = UtilityGate(depth, measure=learn_cost)
    gate.resume(getattr(drafter, "gate_memory", None))
    return gate, k_max


def _finish(drafter, gate) -> None:
    """The drafter ends its run (a suffix store learns); the gate's memory stays with the drafter."""
    getattr(drafter, "finish", lambda: None)()
    if gate:
        drafter.gate_memory = gate.memory()


def _prepare_drafter(drafter, target, params: SamplingParams, prompt: list[int], reset: bool) -> float:
    """Check the drafter fits the target, let it sample like the target, reset it for this prompt;
    returns the reset's seconds (an oracle computes its look-ahead there)."""
    if hasattr(drafter, "check_vocab"):
        drafter.check_vocab(target)
    if hasattr(drafter, "configure"):
        drafter.configure(params.temperature, params.top_p, params.seed)
    t = time.perf_counter()
    if reset:
        drafter.reset(prompt)
    return time.perf_counter() - t


def _propose(drafter, context: list[int], kk: int, start: int = 0) -> tuple[list[int], torch.Tensor | None, float]:
    """Up to kk draft tokens, their draft distribution q (None: one-hot) and the seconds it took; start: the first
    part of a FirstOf to ask (speculative.first_of)."""
    if kk <= 0:                                       # a step the gate runs without drafting costs nothing here
        return [], None, 0.0
    td = time.perf_counter()
    draft = drafter.propose(list(context), kk, start=start) if start else drafter.propose(list(context), kk)
    return _tokens(draft, kk) + (time.perf_counter() - td,)


def _draft_step(drafter, gate, width: int, context: list[int], room: int):
    """A step's drafts: (tokens, q, seconds, asked). Under the gate, the parts of a FirstOf that size their own drafts
    (own_depth, speculative.first_of) are asked first at up to `width` tokens, outside the gate (asked None); the gate
    picks the depth only for the rest, and only where none of them matched; where that step drafts nothing, their
    shorter match drafts, outside the gate too. Their steps' utility switches them off for a span where it is below
    one (UtilityGate.free_allowed)."""
    own = getattr(drafter, "own_depth", 0) if gate else 0
    free = bool(own) and gate.free_allowed()          # the gate switches them off where they do not pay
    t0 = time.perf_counter()
    if free:
        draft = drafter.propose_own(list(context), min(width, room))
        if draft is not None:
            return _tokens(draft, min(width, room)) + (time.perf_counter() - t0, None)
    missed = time.perf_counter() - t0                 # a free match that was not there is the learned drafter's cost
    asked = min(gate.choose() if gate else width, room)
    d, dq, td = _propose(drafter, context, asked, start=own)
    short = drafter.take_fallback() if free and not d else None
    if short is not None:
        return _tokens(short, min(width, room)) + (td + missed, None)
    # a step without drafts after the free parts were asked is theirs (their lookups cost it), not k = 0's
    return d, dq, td + missed, None if free and not asked else asked


def _spec_step(target, drafter, gate, width: int, cache, context: list[int], room: int, params: SamplingParams, gen,
               emit, tally: _Tally) -> bool:
    """One drafting step: the drafts, one verify forward, the tokens it emits; the gate learns from it. Returns
    whether the run is done."""
    ts = time.perf_counter()
    d, dq, td, asked = _draft_step(drafter, gate, width, context, room)
    n, nxt, tv = _verify(target, drafter, cache, context, d, dq, params, gen)
    tally.step(len(d), n, td, tv, target.model.last_forward["unique_experts"])
    done = any(emit(t) for t in d[:n] + [nxt])
    drafter.update(list(context), n)
    if gate:
        _observe(gate, len(d), n, tv, td, asked, time.perf_counter() - ts)
    return done


def _plain_run(target, drafter, cache, context: list[int], n: int, params: SamplingParams, gen, emit,
               tally: _Tally, gate: UtilityGate) -> bool:
    """Up to n steps of plain decoding, where the gate drafts nothing and asks no free part (UtilityGate.plain_steps):
    one row a forward, the drafter handed the target's states and told of every token (update reads the context at
    once); the gate learns each step's seconds (observe_plain). As lean as `generate`'s loop: these seconds are
    s(0). Returns whether the run is done."""
    reads_states = needs_states(drafter) is not None
    ends, done, unique = [time.perf_counter()], False, 0
    while not done and len(ends) <= n:
        t = [context[-1]]
        logits = (forward_for(drafter, target, t, cache, last_only=True) if reads_states
                  else target.forward(t, cache, last_only=True))[-1]
        unique += target.model.last_forward["unique_experts"]
        done = emit(sample_token(logits, params, gen))
        drafter.update(context, 0)
        ends.append(time.perf_counter())
    tally.plain(len(ends) - 1, unique, ends[-1] - ends[0])
    gate.observe_plain([b - a for a, b in zip(ends, ends[1:])])
    return done


def _observe(gate, drafted: int, n: int, tv: float, td: float, asked: int | None, step_s: float) -> None:
    """The gate learns from a step: a step at its depth (the whole step's seconds: what the test-then-set compares),
    or a free part's step (asked None: their own utility)."""
    if asked is not None:
        gate.observe(drafted, n, tv, td, asked=asked, step_s=step_s)
    else:
        gate.observe_free(n + 1, drafted, step_s)


def _tokens(draft, kk: int) -> tuple[list[int], torch.Tensor | None]:
    """A draft's first kk tokens and their draft distribution q (None: one-hot)."""
    d = [int(t) for t in draft.tokens[:kk]]
    return d, draft.probs[:len(d)] if (draft.probs is not None and d) else None


def _verify(target, drafter, cache, context: list[int], d: list[int], dq, params: SamplingParams,
            gen: torch.Generator) -> tuple[int, int, float]:
    """One (k+1)-row forward of the target: (drafts accepted, the target's own next token, seconds).
    The cache keeps the last token and the accepted drafts; the rest is rolled back."""
    pos = cache.length                                # == len(context) - 1: the last token is not cached yet
    tv = time.perf_counter()
    rows = forward_for(drafter, target, [context[-1]] + d, cache)
    tv = time.perf_counter() - tv
    if params.greedy:
        n, nxt = verify_greedy(rows, d)
    else:
        n, nxt = verify_sampling(probs_from_logits(rows, params.temperature, params.top_p), d, dq, gen)
    cache.rollback(pos + 1 + n)
    return n, nxt, tv


def speculative_generate(target, drafter: Drafter, prompt_ids: list[int], max_new_tokens: int, *,
                         k: int | str = 4, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         stop_token_ids=(), stop_strings=(), callback: Callable[[int], None] | None = None,
                         use_eos: bool = True, k_max: int = 8, probe_every: int = 16,
                         cost: list[float] | None = None, learn_cost: bool = True,
                         cache=None, reset_drafter: bool = True) -> GenerationResult:
    """Generate with drafts verified by `target`. Greedy: token-identical to `generate`; sampling: same distribution.

    cache: a KV cache holding a prefix of the prompt (e.g. restored from the prefix cache): only the rest is
    prefilled, as `generate(..., cache=cache)` does. reset_drafter=False: the caller already reset the drafter
    (e.g. before prefilling that prefix through speculative.states.forward_for, so an MTP head got its states).
    k: a draft depth (speculative.depth): at most k drafts per step, or "auto": the utility gate, whose cost model
    uses `cost` (seconds of a verify forward of 1 .. k_max+1 rows; measured when None); learn_cost=False: decide
    from the cost model alone, never from measured seconds (deterministic)."""
    if max_new_tokens < 0:
        raise LessonkitError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    params = SamplingParams(temperature, top_p, seed)
    gate, width = _draft_width(target, drafter, k, k_max, cost, probe_every, learn_cost)
    prompt = list(prompt_ids)
    checker = StopChecker(target, list(stop_token_ids) + (target.config.eos_ids if use_eos else []), stop_strings)
    cache = request_cache(target, len(prompt), max_new_tokens) if cache is None else cache
    if cache.length >= len(prompt):
        raise LessonkitError(f"the cache already holds {cache.length} positions: the prompt ({len(prompt)} tokens) "
                             "needs at least one new token")
    held, gen = cache.length, torch.Generator().manual_seed(seed)
    reset_s = _prepare_drafter(drafter, target, params, prompt, reset_drafter)
    before = engine_counters(target)
    t0 = time.perf_counter()
    logits = forward_for(drafter, target, prompt[held:], cache, last_only=True)[-1]
    ttft = time.perf_counter() - t0
    tally, out, context = _Tally(width), [], list(prompt)

    def emit(t: int) -> bool:
        out.append(t)
        context.append(t)
        if callback is not None:
            callback(t)
        return checker.done(out) or len(out) >= max_new_tokens

    try:
        done = max_new_tokens == 0 or emit(sample_token(logits, params, gen))
        while not done:
            plain = gate.plain_steps(bool(getattr(drafter, "own_depth", 0))) if gate else 0
            room = max_new_tokens - len(out) - 1          # a step emits up to k drafts + 1 own token
            done = (_plain_run(target, drafter, cache, context, plain, params, gen, emit, tally, gate) if plain else
                    _spec_step(target, drafter, gate, width, cache, context, room, params, gen, emit, tally))
    finally:
        _finish(drafter, gate)
    ids, text = checker.trim(out)
    extra = tally.stats(prompt_tokens=len(prompt), emitted=len(out), kept=len(ids), drafter=drafter, k=k,
                        reset_s=reset_s, gate=gate)
    stats = finish_stats(target, before, new_tokens=len(ids), forwards=tally.forwards, t_start=t0, ttft=ttft,
                         unique_experts=tally.unique, extra=extra)
    return GenerationResult(ids, text, stats)


def _add_lists(a: list, b: list) -> list:
    """Element-wise sum of two count lists, the shorter padded with zeros."""
    return [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]


def total_stats(results) -> dict:
    """The stats of several runs added up, with acceptance, tokens per forward and per-token rates recomputed."""
    tot = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "new_tokens": 0, "forwards": 0,
           "wall_s": 0.0, "ttft_s": 0.0, "runs": 0, "draft_s": 0.0, "verify_s": 0.0, "bytes_read": 0, "unique_experts": 0,
           "expert_hits": 0, "expert_misses": 0}
    per_pos, reached = [], []
    for st in results:
        st = {**st, "runs": 1}
        for key in tot:
            tot[key] += st.get(key) or 0
        per_pos = _add_lists(per_pos, st.get("num_accepted_tokens_per_pos") or [])
        if reached is not None:              # kept only where every run counted them
            reached = _add_lists(reached, st["num_reached_per_pos"]) if "num_reached_per_pos" in st else None
    tot["num_accepted_tokens_per_pos"] = per_pos
    if reached is not None:
        tot["num_reached_per_pos"] = reached
    tot["acceptance_rate"] = tot["num_accepted_tokens"] / tot["num_draft_tokens"] if tot["num_draft_tokens"] else None
    tot["mean_acceptance_length"] = 1 + tot["num_accepted_tokens"] / tot["num_drafts"] if tot["num_drafts"] else None
    tot["tokens_per_forward"] = tot["new_tokens"] / tot["forwards"] if tot["forwards"] else None
    tot["tokens_per_s"] = tot["new_tokens"] / tot["wall_s"] if tot["wall_s"] else None
    n = tot["new_tokens"] or 1
    tot["unique_experts_per_token"] = tot["unique_experts"] / n
    tot["bytes_read_per_token"] = tot["bytes_read"] / n
    hm = tot["expert_hits"] + tot["expert_misses"]
    tot["expert_hit_rate"] = tot["expert_hits"] / hm if hm else None
    return tot
