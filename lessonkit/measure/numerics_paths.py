"""Speculation on the two numerics of one model (lesson 1): the verify cost T(k+1)/T(1) predicted by the cost
model (b + M) / (b + 1) and measured, and a real drafter's decode speed-up predicted from parts measured apart
and measured, on the exact numerics (every weight built in float, then one FMA per row) and the int8 numerics
(integer block dots: an extra row costs little). docs/kernel.md derives the cost model; docs/numerics.md the two
numerics."""
from __future__ import annotations

import math

import pandas as pd

from lessonkit.engine import active, kernel
from lessonkit.engine.generate import generate
from lessonkit.errors import LessonkitError
from lessonkit.measure.break_even import break_even_acceptance
from lessonkit.models.registry import load_model
from lessonkit.measure.apart import predict_speedup
from lessonkit.measure.speculative import measure_apart
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.drafter_registry import make_drafter

NUMERICS = ("exact", "int8")
# docs/kernel.md: on the exact path a weight costs about 3 operations to build (widen, convert, the dequantising
# fma) and then one FMA per row, so a step of M rows costs about (3 + M) operations a weight
B_EXACT = 3.0


def cost_model(b: float, rows: int) -> float:
    """T(M)/T(1) when a step of M rows costs b + M units a weight: b to build or fetch the weight, one per row."""
    return (b + rows) / (b + 1)


def b_from_two_rows(r2: float) -> float:
    """The b that makes the cost model give a measured T(2)/T(1): (b + 2)/(b + 1) = r2. inf when a 2-row step
    costs no more than a 1-row step (rows free); 0 when it costs two."""
    return math.inf if r2 <= 1.0 else max((2.0 - r2) / (r2 - 1.0), 0.0)


def load_on_each(model: str) -> tuple[dict, list[str]]:
    """{numerics: engine} for every numerics this machine runs (int8 needs the C kernel), and a note per one left
    out."""
    engines, notes = {}, []
    for nm in NUMERICS:
        try:
            with active.use(numerics=nm):
                engines[nm] = load_model(model)
        except LessonkitError as e:
            notes.append(f"{model} on the {nm} numerics left out: {e}")
    return engines, notes


def verify_costs(engines: dict, k_max: int = 7, repeats: int = 5) -> tuple[pd.DataFrame, dict]:
    """Per numerics and k = 0..k_max: T(k+1) measured, T(k+1)/T(1) measured, the cost model's prediction with
    b = 3 (the exact path's operation count) and with b fitted to the 2-row step alone. Returns (table, {numerics:
    cost curve in seconds})."""
    rows, costs = [], {}
    for nm, eng in engines.items():
        c = costs[nm] = measure_cost_curve(eng, k_max, repeats=repeats)
        b = b_from_two_rows(c[1] / c[0])
        for k, t in enumerate(c):
            rows.append({"numerics": nm, "k": k, "rows": k + 1, "T_ms": 1e3 * t, "measured": t / c[0],
                         "model_b3": cost_model(B_EXACT, k + 1), "b_fit": b,
                         "model_b_fit": 1.0 if math.isinf(b) else cost_model(b, k + 1)})
    return pd.DataFrame(rows), costs


def _decode(st: dict) -> tuple[float, int]:
    """(decode seconds, decode tokens) of summed runs: the prefill forward and its token left out."""
    return st["wall_s"] - st["ttft_s"], st["new_tokens"] - st["runs"]


def drafter_on_each(engines: dict, costs: dict, drafters: dict, timed: list[list[int]], apart: list[list[int]], *,
                    k: int = 3, max_new_tokens: int = 32, repeats: int = 2) -> pd.DataFrame:
    """Each drafter ({label: drafter spec for stack.make_drafter}) on each numerics' engine. Predicted, from parts
    measured apart from the timed runs (`measure.apart.predict_speedup`): E(k) from the per-position acceptance on
    the `apart` prompts, the draft cost c (draft seconds per draft token over a plain decode step, both on `apart`)
    and the verify cost T(k+1)/T(1) of `costs`: speed-up = E(k) / (T(k+1)/T(1) + k c), and a* at that cost. Measured on the
    `timed` prompts: the decode-phase speed-up (prefill out on both sides: it is the same work) and tokens per
    verify step (the prefill forward left out); every output compared with plain greedy."""
    rows = []
    for nm, eng in engines.items():
        ref = {i: generate(eng, p, max_new_tokens).token_ids for i, p in enumerate(timed)}
        for label, spec in drafters.items():
            d = make_drafter(spec, eng)
            aside = measure_apart(eng, d, apart, k=k, max_new_tokens=max_new_tokens, cost=costs[nm],
                                  source="the apart prompts")
            pred = predict_speedup(aside, k, timed)
            best, same = {}, True
            for _ in range(repeats):                 # plain and speculative in turn; the fastest round counts
                plain = total_stats([generate(eng, p, max_new_tokens).stats for p in timed])
                res = [speculative_generate(eng, d, p, max_new_tokens, k=k) for p in timed]
                same &= all(r.token_ids == ref[i] for i, r in enumerate(res))
                spec_st = total_stats([r.stats for r in res])
                for key, st in (("plain", plain), ("spec", spec_st)):
                    if key not in best or _decode(st)[0] < _decode(best[key])[0]:
                        best[key] = st
            (p_s, p_n), (s_s, _) = _decode(best["plain"]), _decode(best["spec"])
            t_tok = p_s / max(p_n, 1)
            c, verify, a = aside.c, pred["verify_cost"], aside.acceptance
            st = best["spec"]
            rows.append({"numerics": nm, "drafter": label, "k": k, "plain_ms_per_token": 1e3 * t_tok,
                         "verify_cost": verify, "c": c, "a1_apart": a[0] if a else float("nan"),
                         "E_predicted": pred["E_predicted"],
                         "tokens_per_verify": (st["new_tokens"] - st["runs"]) / max(st["forwards"] - st["runs"], 1),
                         "a_star": break_even_acceptance(verify + k * c, k),
                         "predicted_speedup": pred["predicted_speedup"], "measured_speedup": p_s / s_s,
                         "identical_to_plain": same})
    return pd.DataFrame(rows)
