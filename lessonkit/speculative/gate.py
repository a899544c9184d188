"""How deep to draft: expected tokens per verify step, the verify cost curve, and the depth gate.

Leviathan et al. (2023): with i.i.d. acceptance a and k drafts a verify step yields
E(k) = (1 - a^(k+1)) / (1 - a) tokens; with per-position acceptance a_i (position i accepted given
1..i-1 were), E(k) = 1 + a1 + a1*a2 + ... The price of a step is the verify forward of k+1 rows,
T(k+1), plus k drafts. The depth gate (DepthGate) picks k maximising E(k) / (T(k+1) + k t_draft)
from running acceptance counts and the measured cost curve (refined online); k = 0 means "do not
draft"; every `probe_every` steps it probes one deeper than its choice, so it can notice when
drafting starts paying again.

The model leaves out what a step costs beyond the verify and the drafts (a drafter's fixed part per
turn, its bookkeeping, the loop itself), and its cost curve was measured before the run, on a machine
other work shares. Cascade (Saxena et al. 2025, arXiv:2506.20675) therefore measures utility, the
tokens a step gains over what the step costs, in short *test* phases and keeps the winner for a longer
*set* phase, switching speculation off (k = 0) where the utility is below one. UtilityGate, what
k="auto" runs, is that test-then-set on top of the depth gate: the depth gate names the depth worth
testing, the measured wall time of whole steps decides.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from lessonkit.errors import LessonkitError


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


def conditional_per_pos(per_pos: list[int], num_drafts: int) -> list[float]:
    """a_i = P(position i accepted | positions < i accepted), from vLLM-style cumulative counts."""
    out, prev = [], num_drafts
    for c in per_pos:
        out.append(c / prev if prev else 0.0)
        prev = c
    return out


def count_step(accepted: list, reached: list, n_drafted: int, n_accepted: int) -> None:
    """One verify step into per-position counts: position i was reached (drafted, every earlier draft accepted) for
    i < min(n_accepted + 1, n_drafted), and accepted for i < n_accepted. The gate and a run's stats count alike."""
    for i in range(min(n_accepted + 1, n_drafted)):
        reached[i] += 1
    for i in range(n_accepted):
        accepted[i] += 1


def acceptance_by_position(stats: dict) -> list[float]:
    """a_i = P(position i accepted | positions < i accepted) from a run's stats: the drafts accepted at i over the
    steps whose drafts reached i with every earlier one accepted (num_reached_per_pos). Where steps draft to
    different depths (a gate, a lookup that finds fewer tokens) a step that accepted i - 1 need not have drafted
    i, and conditional_per_pos, which assumes it did, reads deeper positions too low; stats without the counts
    (results saved before they were kept) take that reading. A position no step reached reads 0.0, as there."""
    reached = stats.get("num_reached_per_pos")
    if reached is None:
        return conditional_per_pos(stats["num_accepted_tokens_per_pos"], stats["num_drafts"])
    return [a / r if r else 0.0 for a, r in zip(stats["num_accepted_tokens_per_pos"], reached)]


def breakdown_speedup(plain: dict, spec: dict, k: int, cost: list[float]) -> float:
    """A run's speed-up rebuilt from its own measured parts (a breakdown, not a prediction: the parts come from the
    runs it explains): the plain run's prefill and per-token time, E(k) from the per-position acceptance, the cost
    curve T(k+1)/T(1) and the draft time per token.
      plain = ttft + (N - runs) * t_tok;   spec = ttft + (N - runs) / E(k) * (t_tok * T(k+1)/T(1) + k * t_draft)"""
    n_dec = plain["new_tokens"] - plain["runs"]               # tokens after the first of each run
    t_tok = (plain["wall_s"] - plain["ttft_s"]) / max(n_dec, 1)
    t_draft = spec["draft_s"] / spec["num_draft_tokens"] if spec["num_draft_tokens"] else 0.0
    e = expected_tokens_per_pos(acceptance_by_position(spec), k)
    step = t_tok * cost[k] / cost[0] + k * t_draft
    return plain["wall_s"] / (plain["ttft_s"] + n_dec / e * step)


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
    priors: tuple = (0.8, 0.6, 0.5)           # prior acceptance of positions 1-3 (this workbook's choice); deeper
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

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float, draft_s: float | None) -> None:
        count_step(self.accepted, self.reached, n_drafted, n_accepted)
        r = n_drafted                          # forward had n_drafted + 1 rows -> cost index n_drafted
        if self.learn_cost:
            self.cost[r] = (1 - self.ema) * self.cost[r] + self.ema * verify_s
        if n_drafted and draft_s is not None:    # None: the step's draft time is not its depth's (a catch-up)
            self.t_draft = (1 - self.ema) * self.t_draft + self.ema * draft_s / n_drafted if self.t_draft else draft_s / n_drafted


@dataclass
class UtilityGate:
    """Cascade's test-then-set over whole steps, per request.

    test: k = 0 for `test_steps` steps, then the measured depth k >= 1 of highest utility (before any ran, the one
          the cost model ranks first) for as many, then twice that depth, and twice again while the deepest tested
          depth pays, or beats the one before it where the deeper one could still pay (a hill climb; at most three
          depths a phase; a depth whose remembered steps lost to the last one's is not tested again); a phase's first
          step at a new depth is not timed (_deeper, choose);
    set:  of the tested depths the one of highest utility u(k) = E(k) s(0) / s(k), where it is above `margin`, else
          k = 0, with E(k) from this run's per-position acceptance counts (every drafting step adds to them)
          and s(k) the measured seconds of a whole step at depth k (drafting, verify, bookkeeping), for `set_steps`
          steps, doubled while the choice repeats (Cascade's locality), at most `max_set`; then test again. A set phase
          at k > 0 ends early where its own last `test_steps` steps (their tokens, not the counts) fall below a
          utility of one (the request changed: records' drafts are right, prose's after them are not; the memory
          across requests carries the decision over).
    free: the steps a FirstOf's free parts drafted outside the gate (speculative.first_of) have a utility of their own,
          tokens per second over k = 0's; below one they are switched off for a span (set_steps, doubled while it
          repeats), then tested afresh (free_allowed).
    plain: k = 0's steps that ask no free part (the free parts off, or a drafter without them) run as plain
          decoding (plain_steps, the loop's plain run): s(0), every utility's yardstick, is plain decoding's, not that
          of a drafting loop that drafts nothing; a step on which the free parts were asked and nothing was drafted is
          theirs (their lookups cost it, the catch-up of the tokens a plain run emitted included).
    With measure=False, s(k) is the cost model's T(k+1) + k t_draft (deterministic, for tests)."""
    depth: DepthGate
    test_steps: int = 3
    set_steps: int = 16
    max_set: int = 128
    measure: bool = True
    margin: float = 1.1                           # drafting must promise 10% over k = 0 (the tests are short)
    window: int = 8
    step_s: dict = field(default_factory=dict)    # depth -> seconds of its whole steps, latest last
    step_tokens: dict = field(default_factory=dict)  # depth -> tokens its steps emitted, latest last
    set_run: int = 0                              # steps observed in the current set phase
    plan: list = field(default_factory=list)      # depths still to run in this phase
    stage: str = "set"
    tested: list = field(default_factory=list)
    last_set: int | None = None
    span: int = 0
    steps: int = 0
    plain: int = 0                                # of them, steps of plain runs (plain_steps: nothing asked)
    last_k: int = 0                               # the depth of the step before
    catch_up: bool = False                        # this step is a phase's first at a new depth (not timed)
    free_s: list = field(default_factory=list)    # the free parts' last `window` steps: (tokens, drafts, seconds)
    free_off: int = 0                             # steps left with the free parts off
    free_span: int = 0                            # the last such span (doubled while it repeats)

    @property
    def k_max(self) -> int:
        return self.depth.k_max

    def acceptance(self) -> list[float]:
        return self.depth.acceptance()

    def seconds(self, k: int) -> float:
        """A whole step's seconds at depth k: the median of its last `window` steps (other work on a shared machine
        lengthens some steps, not the median), or the cost model's where none ran."""
        if self.measure and self.step_s.get(k):
            return statistics.median(self.step_s[k])
        return self.depth.cost[k] + k * self.depth.t_draft

    def measured_acceptance(self) -> list[float]:
        """a_i from the counts alone (no priors: a set decision rests on what this run drafted); a position never
        reached takes the estimate of the one before."""
        out = []
        for acc, reached in zip(self.depth.accepted, self.depth.reached):
            out.append(acc / reached if reached else (out[-1] if out else 0.0))
        return out

    def tokens(self, k: int) -> float:
        """Tokens a step at depth k emits: E(k) from the per-position acceptance counts, which every drafting step
        adds to whatever its depth. A depth's own last `test_steps` steps are too few: at an acceptance near 0.5
        their mean moved by about 0.3 token between phases, and the set decision followed that noise
        (docs/speculative.md, "The utility gate against a fixed depth")."""
        return expected_tokens_per_pos(self.measured_acceptance(), k)

    def recent_tokens(self, k: int) -> float:
        """Tokens a step at depth k emitted over its last `test_steps` steps (what the drafts give on this request
        now, not on the ones before), else tokens(k)."""
        recent = self.step_tokens.get(k, [])[-self.test_steps:]
        return sum(recent) / len(recent) if recent else self.tokens(k)

    def utility(self, k: int, recent: bool = False) -> float:
        """Tokens per step at depth k over the step's cost in steps at k = 0: above 1, drafting pays. recent: from
        its last steps' tokens (recent_tokens) instead of the acceptance counts."""
        return (self.recent_tokens(k) if recent else self.tokens(k)) * self.seconds(0) / self.seconds(k)

    def free_utility(self) -> float | None:
        """Tokens per second of the steps a FirstOf's free parts drafted (speculative.first_of: outside the gate) over
        k = 0's, s(0): below 1 their drafts cost more verify rows than they save. None until `test_steps` ran. With
        measure=False a step's seconds are the cost model's T(drafts + 1)."""
        if len(self.free_s) < self.test_steps:
            return None
        secs = sum(s if self.measure else self.depth.cost[d] for _, d, s in self.free_s)
        return sum(t for t, _, _ in self.free_s) * self.seconds(0) / secs

    def free_allowed(self) -> bool:
        """Whether the free parts may draft this step: not for a span after their utility fell below 1 (set_steps,
        doubled while it repeats, at most max_set: Cascade's test-then-set for them), then tested afresh."""
        if self.free_off:
            self.free_off -= 1
            if not self.free_off:
                self.free_s = []
            return False
        u = self.free_utility()
        if u is None or u >= 1.0:
            if u is not None:                           # they pay: the next span off starts short again
                self.free_span = 0
            return True
        self.free_span = min(2 * self.free_span, self.max_set) if self.free_span else self.set_steps
        self.free_off = self.free_span - 1
        return False

    def observe_free(self, tokens: int, drafted: int, step_s: float) -> None:
        """A step the free parts drafted: the tokens it emitted, its drafts and its seconds."""
        self.free_s.append((tokens, drafted, step_s))
        del self.free_s[:-self.window]

    def plain_steps(self, own: bool) -> int:
        """How many of the coming steps run as plain decoding (the loop's plain run, speculative.verify): the leading
        k = 0 steps of the plan, where no free part is asked either (while the free parts are off, or for a drafter
        without them); 0 where the next step drafts or asks them (a suffix match drafts on most steps of records:
        a test phase's k = 0 steps asked nothing of it cost those steps' drafts). Their seconds are s(0), what every
        utility is measured against: plain decoding's, not a drafting loop's that drafts nothing (on tiny-moe in RAM
        that loop cost 9% a step over plain's); where none ran, the verify cost curve's one row."""
        if not self.plan:
            self._new_phase()
        if self.plan[0]:
            return 0
        n = next((i for i, k in enumerate(self.plan) if k), len(self.plan))
        return min(n, self.free_off) if own else n

    def observe_plain(self, seconds: list[float]) -> None:
        """The plain run's steps (plain_steps): their seconds are k = 0's, each emitted one token."""
        m = len(seconds)
        del self.plan[:m]
        self.steps, self.plain, self.last_k = self.steps + m, self.plain + m, 0
        times, emitted = self.step_s.setdefault(0, []), self.step_tokens.setdefault(0, [])
        times.extend(seconds)
        emitted.extend([1] * m)
        del times[:-self.window], emitted[:-self.window]
        if self.free_off:
            self.free_off = max(0, self.free_off - m)
            if not self.free_off:
                self.free_s = []

    def _deeper(self, last: int) -> bool:
        """Test twice the depth after `last`: where `last` paid; else where the deeper depth could still pay (its
        expected tokens from this run's acceptance over the seconds of `last`'s steps, a bound: deeper steps cost no
        less) and `last` was the first depth tested or measured better than the one before it (a hill climb: the cost
        model ranks the depths from a draft cost per token that it takes to be the same at every depth, and a
        drafter's fixed cost per call makes deeper drafts cheaper per token than it says). A drafter whose drafts are
        mostly wrong is not tried deeper: its tests cost steps that do not pay."""
        deeper = min(2 * last, self.k_max)
        if self.step_s.get(deeper) and self.utility(deeper) <= self.utility(last):
            return False                        # its remembered steps lost to `last`'s: not tested again
        if self.utility(last) > self.margin:
            return True
        bound = expected_tokens_per_pos(self.measured_acceptance(), deeper) * self.seconds(0) / self.seconds(last)
        if bound <= self.margin:
            return False
        return len(self.tested) == 1 or self.utility(last) > self.utility(self.tested[-2])

    def _next_plan(self) -> list[int]:
        if not self.k_max:
            return [0] * self.max_set
        if self.stage == "set":
            self.stage, self.tested = "test", []
            return [0] * self.test_steps
        if not self.tested:            # also after a set phase at k = 0
            self.tested = [self._first_depth()]
            return [self.tested[0]] * self.test_steps
        last = self.tested[-1]
        if len(self.tested) < 3 and last < self.k_max and self._deeper(last):
            self.tested.append(min(2 * last, self.k_max))
            return [self.tested[-1]] * self.test_steps
        k = max(self.tested, key=lambda j: (self.utility(j), -j))
        k = k if self.utility(k) > self.margin else 0
        self.span = min(2 * self.span, self.max_set) if k == self.last_set and self.span else self.set_steps
        self.stage, self.last_set, self.set_run = "set", k, 0
        return [k] * self.span

    def _first_depth(self) -> int:
        """A test phase's first depth k >= 1: of the depths whose steps were measured, the one of highest utility;
        before any was, the one the cost model ranks first (its seconds are a forward's alone, fewer than a whole
        step's, so a depth never run must not be compared with measured ones: it would always look better)."""
        measured = [k for k in range(1, self.k_max + 1) if self.step_s.get(k)]
        if measured:
            return max(measured, key=lambda k: (self.utility(k), -k))
        return max(range(1, self.k_max + 1), key=lambda k: (self.depth.value(k), -k))

    def choose(self) -> int:
        self.steps += 1
        if not self.plan:
            self._new_phase()
        self.last_k = self.plan[0]
        return self.plan.pop(0)

    def _new_phase(self) -> None:
        self.plan = self._next_plan()
        # a phase's first step catches up what the drafter did not see while it was off (a draft model prefills the
        # tokens of the steps before): its seconds are not the depth's, so they are not kept
        self.catch_up = bool(self.plan[0]) and self.plan[0] != self.last_k

    def summary(self) -> dict:
        """Why the run drafted as it did: the last set decision, the utility of each measured depth, the steps."""
        return {"set_k": self.last_set, "tested": list(self.tested), "steps": self.steps, "plain_steps": self.plain,
                "utility": {k: round(self.utility(k), 3) for k in sorted(self.step_s)},
                "free_utility": None if self.free_utility() is None else round(self.free_utility(), 3),
                "rule": f"test-then-set: draft at the depth of highest measured utility where it is above {self.margin}"}

    def memory(self) -> dict:
        """What the next request of the same drafter starts from: the acceptance counts (halved, so a new kind of
        request outweighs them soon), the step seconds, and the phase with the steps it has left."""
        return {"accepted": [a / 2 for a in self.depth.accepted], "reached": [r / 2 for r in self.depth.reached],
                "step_s": {k: list(v) for k, v in self.step_s.items()}, "last_set": self.last_set,
                "step_tokens": {k: list(v) for k, v in self.step_tokens.items()}, "set_run": self.set_run,
                "span": self.span, "t_draft": self.depth.t_draft, "plan": list(self.plan), "stage": self.stage,
                "tested": list(self.tested), "free_s": list(self.free_s), "free_off": self.free_off,
                "free_span": self.free_span}

    def resume(self, memory: dict | None) -> None:
        """Go on where the drafter's last request left off (Cascade's phases outlive a short request): the same
        phase, with the steps it had left."""
        if not memory or len(memory["accepted"]) != self.k_max or max(memory["plan"] + [0]) > self.k_max:
            return
        self.depth.accepted, self.depth.reached = list(memory["accepted"]), list(memory["reached"])
        self.depth.t_draft = memory["t_draft"]
        self.step_s = {k: list(v) for k, v in memory["step_s"].items()}
        self.step_tokens = {k: list(v) for k, v in memory.get("step_tokens", {}).items()}
        self.set_run = memory.get("set_run", 0)
        self.last_set, self.span, self.stage = memory["last_set"], memory["span"], memory["stage"]
        self.plan, self.tested = list(memory["plan"]), list(memory["tested"])
        self.free_s, self.free_off = list(memory.get("free_s", [])), memory.get("free_off", 0)
        self.free_span = memory.get("free_span", 0)

    def observe(self, n_drafted: int, n_accepted: int, verify_s: float, draft_s: float, *, asked: int | None = None,
                step_s: float | None = None) -> None:
        catch_up, self.catch_up = self.catch_up, False
        self.depth.observe(n_drafted, n_accepted, verify_s, None if catch_up else draft_s)
        k = n_drafted if asked is None else asked
        if step_s is not None and not catch_up:   # the last `window` steps of each depth (all seconds() reads)
            times = self.step_s.setdefault(k, [])
            times.append(step_s)
            del times[:-self.window]
        emitted = self.step_tokens.setdefault(k, [])
        emitted.append(n_accepted + 1)
        del emitted[:-self.window]
        self._end_set_where_it_stops_paying(k)

    def _end_set_where_it_stops_paying(self, k: int) -> None:
        """A set phase at k > 0 whose own last `test_steps` steps have a utility below one ends now (a test phase
        follows, its next span starting short): a request whose drafts are wrong does not pay for the last one's."""
        if self.stage != "set" or not self.last_set or k != self.last_set:
            return
        self.set_run += 1
        if self.set_run >= self.test_steps and self.plan and self.utility(k, recent=True) < 1.0:
            self.plan, self.span = [], 0
