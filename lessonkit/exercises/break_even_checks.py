"""Self-check for lesson 1's break-even exercise (exercise 9 of notebooks/exercises/01_speculative.ipynb): the
acceptance a* at which speculation starts to pay, from a measured verify cost and draft cost.

    from lessonkit.exercises import break_even_checks as be_check
    be_check.break_even(my_break_even)

Speculation pays where E(a, k) > T(k+1)/T(1) + k c, with E(a, k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a); a* is
the a in [0, 1] where the two sides meet: 0 when a verify step costs at most one plain step (even no acceptance
pays), None when even a = 1 does not pay (k + 1 tokens for more than k + 1 plain steps).
"""
from __future__ import annotations

import math
import random

from lessonkit.exercises import number, run_cases

SEED = 2026 + 9
_TOL = 1e-4


def _e(a: float, k: int) -> float:
    return float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)


def _solve(e_of, step: float) -> float | None:
    """The a in [0, 1] with e_of(a) = step (e_of rising in a); 0 below, None above."""
    if e_of(0.0) >= step:
        return 0.0
    if e_of(1.0) <= step:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if e_of(mid) < step else (lo, mid)
    return (lo + hi) / 2


def _ref(verify_cost: float, c: float, k: int) -> float | None:
    return _solve(lambda a: _e(a, k), verify_cost + k * c)


# two plausible mistakes (and a third), each the same solve with one term wrong
MISTAKES = {
    "no_draft_cost": ("that leaves out the draft cost: a verify step costs T(k+1)/T(1) + k c plain steps, not "
                      "T(k+1)/T(1) alone", lambda v, c, k: _solve(lambda a: _e(a, k), v)),
    "no_bonus_token": ("that leaves out the bonus token: a step emits 1 + a + ... + a^k tokens (the target's own "
                       "token comes with every verify), not a + ... + a^k",
                       lambda v, c, k: _solve(lambda a: _e(a, k) - 1, v + k * c)),
    "linear": ("that counts 1 + k a tokens, as if later drafts were accepted even after a rejection; draft i counts "
               "only if drafts 1..i-1 were accepted: 1 + a + a^2 + ... + a^k", lambda v, c, k: _solve(lambda a: 1 + k * a, v + k * c)),
}


def _cases():
    cases = [("a cheap verify, free drafts", (1.2, 0.0, 4)),
             ("the draft cost decides it", (1.3, 0.1, 4)),
             ("one draft", (1.4, 0.05, 1)),
             ("a verify no dearer than a step: anything pays", (1.0, 0.0, 3)),
             ("never pays: k + 1 tokens cost more than k + 1 steps", (3.5, 0.2, 2)),
             ("two plain steps a verify, as on the exact numerics", (2.0, 0.04, 4))]
    rng = random.Random(SEED)
    for i in range(16):
        k = rng.randint(1, 6)
        cases.append((f"random #{i + 1} (k={k})", (rng.uniform(1.0, 2.5), rng.uniform(0.0, 0.2), k)))
    return cases


def _same(got, want) -> bool:
    if want is None or got is None:
        return got is None and want is None
    return math.isclose(got, want, abs_tol=_TOL)


def _judge(args, got):
    want = _ref(*args)
    if got is not None and number(got) is None:
        return "return a number in [0, 1], or None when no acceptance pays"
    got = None if got is None else number(got)
    if _same(got, want):
        return None
    shown = "None" if got is None else f"{got:.4f}"
    for message, wrong in MISTAKES.values():
        if _same(got, wrong(*args)) and not _same(wrong(*args), want):
            return f"got {shown}: {message}"
    if want is None:
        return f"got {shown}: here even a = 1 does not pay (k + 1 tokens for {args[0] + args[2] * args[1]:.2f} steps): return None"
    return f"got {shown}, but E(a*, k) should equal T(k+1)/T(1) + k c = {args[0] + args[2] * args[1]:.4f} at a* = {want:.4f}"


def break_even(fn) -> bool:
    """Exercise 9: fn(verify_cost, c, k) -> a*, the acceptance where E(a, k) = verify_cost + k c (verify_cost:
    T(k+1)/T(1); c: a draft token's cost in plain steps); 0 when anything pays, None when nothing does."""
    return run_cases("break_even", fn, _cases(), _judge)
