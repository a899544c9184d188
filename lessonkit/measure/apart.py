"""Predictions out of sample (issue 59, item 5). Every `predicted_*` figure of the lessons and exercises comes from
`predict_speedup`, which takes the statistics of runs measured *apart* from the timed runs explicitly (`Apart`) and
refuses them when they were measured on a prompt the timed runs use. What is computed from the timed run itself
explains that run; it is called a breakdown (`breakdown_*` columns), never a prediction.

The formula is lesson 1's: S = E / (T(r)/T(1) + k c), with E the tokens per verify step (1 + a1 + a1 a2 + ... from
the per-position acceptance, or counted directly for a drafter whose drafts cost nothing, the grammar), T(r)/T(1)
the verify cost curve at r rows, k drafts per step and c the draft seconds per draft token over a plain step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class InSample(ValueError):
    """A prediction was about to read a statistic of the very runs it is compared with."""


def _key(prompt) -> tuple:
    return tuple(int(t) for t in prompt)


@dataclass(frozen=True)
class Apart:
    """What runs measured apart from the timed ones found. prompts: what they ran on (token ids), so
    `predict_speedup` can check that no timed prompt is among them; source: one line saying what those runs were.
    acceptance: a_1..a_k, each given the earlier positions accepted; tokens_per_verify: E counted directly (then
    `rows_per_verify`, the mean rows of a verify forward, prices it); c: draft seconds per draft token over a plain
    decode step; cost: seconds of a forward of 1, 2, ... rows (the verify cost curve, its own untimed forwards)."""
    prompts: tuple
    source: str
    cost: tuple = ()
    acceptance: tuple = ()
    c: float = 0.0
    tokens_per_verify: float | None = None
    rows_per_verify: float | None = None
    keys: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "keys", frozenset(_key(p) for p in self.prompts))


def expected_tokens(acceptance, k: int) -> float:
    """E(k) = 1 + a1 + a1 a2 + ... + a1...ak; positions past the measured ones take the last one's acceptance."""
    e, run = 1.0, 1.0
    for i in range(k):
        run *= acceptance[i] if i < len(acceptance) else (acceptance[-1] if acceptance else 0.0)
        e += run
    return e


def verify_cost(cost, rows: float) -> float:
    """T(rows)/T(1) on the measured curve (cost[i]: seconds of i + 1 rows), interpolated between its points."""
    cost = np.asarray(cost, dtype=float)
    return float(np.interp(rows, np.arange(1, len(cost) + 1), cost / cost[0]))


def check_apart(apart: Apart, timed_prompts) -> None:
    """Raise InSample when a timed prompt is among the prompts the apart statistics were measured on."""
    if not isinstance(apart, Apart):
        raise InSample(f"a prediction takes an Apart (statistics of runs apart from the timed ones), got {type(apart)}")
    shared = apart.keys & {_key(p) for p in timed_prompts}
    if shared:
        raise InSample(f"{len(shared)} timed prompt(s) are among the prompts of '{apart.source}': a prediction from "
                       "them is a breakdown of the same run, not a prediction")


def predict_speedup(apart: Apart, k: int, timed_prompts, *, iid: bool = False, free_verify: bool = False) -> dict:
    """The speed-up over plain decoding that `apart` predicts for runs on `timed_prompts` at k drafts a step.
    iid=True: Leviathan's E = (1 - a1^(k+1)) / (1 - a1) from the first position's acceptance alone;
    free_verify=True: Leviathan's verify cost of one plain step. Returns E, the verify cost, c and the speed-up."""
    check_apart(apart, timed_prompts)
    if apart.tokens_per_verify is not None:
        e, rows = float(apart.tokens_per_verify), float(apart.rows_per_verify or k + 1)
    else:
        a1 = min(float(apart.acceptance[0]), 0.999999) if apart.acceptance else 0.0
        e = (1 - a1 ** (k + 1)) / (1 - a1) if iid else expected_tokens(list(apart.acceptance), k)
        rows = k + 1
    ratio = 1.0 if free_verify or not apart.cost else verify_cost(apart.cost, rows)
    return {"E_predicted": e, "verify_cost": ratio, "c": float(apart.c), "rows": rows,
            "predicted_speedup": e / (ratio + k * float(apart.c)), "apart": apart.source}


def predict_times(apart: Apart, timed_prompts, slow_s: float, fast_s: float) -> dict:
    """A speed-up predicted as slow_s / fast_s, two times a model predicts from `apart`'s statistics (lesson 1's
    disk cost model: the prefill and each step with its expert reads; lesson 6's decode share with the drafter's
    decode speed-up). Raises InSample when a timed prompt is among the prompts `apart` was measured on."""
    check_apart(apart, timed_prompts)
    return {"predicted_speedup": slow_s / fast_s if fast_s > 0 else float("nan"), "apart": apart.source}


def predict_ratio(slow_s: float, fast_s: float, *, inputs: dict, timed) -> dict:
    """A speed-up predicted as a ratio of two predicted times, slow_s / fast_s, for predictions that are not
    lesson 1's formula (lesson 4's batch: n (prefill + item) against restore + n item). inputs: {quantity: the run
    it was measured in}; timed: the runs the prediction is compared with. Raises InSample when a quantity comes
    from a timed run."""
    shared = {q: run for q, run in inputs.items() if run in set(timed)}
    if shared:
        raise InSample(f"predicted from the timed runs themselves: {shared}; that is a breakdown, not a prediction")
    return {"predicted_speedup": slow_s / fast_s if fast_s > 0 else float("nan"), "inputs": dict(inputs)}
