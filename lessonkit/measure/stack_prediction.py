"""Lesson 6's rows predicted: the model-drafter row with lesson 1's formula, from quantities measured apart from
the stream; each combined row from the single-technique rows it combines (`combined_prediction`).

Lesson 1: a verify step emits E tokens and costs T(d+1)/T(1) + c d plain steps, so the decode phase speeds up by

    S = E / mean over verify steps of (T(d+1)/T(1) + c d)

where, on the calibration items (outside the stream: the items `measure.stack.choose_drafter` times drafters on),
decoded by the model drafter alone at the stack's depth gate:

    E   tokens per verify step: the bonus token plus the accepted drafts (the prefill forward left out);
    d   the drafts of each verify step (the gate's choices, its histogram);
    c   draft seconds per draft token over T(1);

and T(r) is this engine's verify cost curve after a context as long as a calibration prompt
(`speculative.gate.measure_cost_curve`). Only decode speeds up: the row's predicted time is the plain row's
prefill (its wall time less its decode forwards x T(1)) plus its decode time over S.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.speculative.verify import speculative_generate
from lessonkit.drafter_registry import make_drafter
from lessonkit.stack import GATE_K_MAX, StackRun
from lessonkit.workloads.triage import ITEM_TEMPLATE, STOP_STRINGS, Workload


def drafting_apart(engine, workload: Workload, model_drafter: str, *, max_new_tokens: int, k="auto") -> dict:
    """The model drafter alone on the calibration items: verify steps, tokens they emitted, drafts per step
    (histogram), draft seconds, and the longest prompt (the context the cost curve is measured after)."""
    items = workload.calibration or workload.items[:1]
    prefix = engine.encode(workload.prefix)
    out = {"steps": 0, "emitted": 0, "draft_tokens": 0, "draft_s": 0.0, "k_hist": {}, "context": 0}
    drafter = make_drafter(model_drafter, engine)          # one drafter, reset for each prompt
    try:
        results = [speculative_generate(engine, drafter, prefix + engine.encode(ITEM_TEMPLATE.format(text=it.text)),
                                        max_new_tokens, k=k, k_max=GATE_K_MAX, stop_strings=STOP_STRINGS)
                   for it in items]
    finally:
        if hasattr(drafter, "close"):
            drafter.close()
    for res in results:
        st = res.stats
        steps = st["forwards"] - 1                          # the prefill forward emitted the first token
        out["steps"] += steps
        out["emitted"] += (st["tokens_per_verify"] or 0.0) * steps    # lesson 1's count: the prefill's token left out
        out["draft_tokens"] += st["num_draft_tokens"]
        out["draft_s"] += st["draft_s"]
        for d, n in st["k_hist"].items():
            out["k_hist"][d] = out["k_hist"].get(d, 0) + n
        out["context"] = max(out["context"], st["prompt_tokens"])
    return out


def predicted_decode_speedup(apart: dict, cost: list[float]) -> dict:
    """S = E / mean step cost (module docstring), with E, the mean step cost and c spelled out; all NaN where
    the calibration items gave no verify step (an answer that ended at its first token)."""
    t1, steps = cost[0], apart["steps"]
    if steps == 0:
        return dict.fromkeys(("E", "c", "verify_cost", "step_cost", "S"), float("nan"))
    e = apart["emitted"] / steps
    c = apart["draft_s"] / apart["draft_tokens"] / t1 if apart["draft_tokens"] else 0.0
    verify = sum(n * cost[min(d, len(cost) - 1)] / t1 for d, n in apart["k_hist"].items()) / steps
    drafting = c * apart["draft_tokens"] / steps
    return {"E": e, "c": c, "verify_cost": verify, "step_cost": verify + drafting, "S": e / (verify + drafting)}


def drafter_row_prediction(engine, workload: Workload, model_drafter: str, plain: StackRun, *,
                           max_new_tokens: int, k="auto") -> dict:
    """The model-drafter row's speed-up over the plain row predicted by lesson 1's formula (module docstring)."""
    apart = drafting_apart(engine, workload, model_drafter, max_new_tokens=max_new_tokens, k=k)
    cost = measure_cost_curve(engine, GATE_K_MAX, context_len=apart["context"])
    parts = predicted_decode_speedup(apart, cost)
    decode_forwards = max(plain.forwards - 2 * plain.judge_calls, 0)   # each call: the prefix, then the item
    decode_s = min(decode_forwards * cost[0], plain.wall_s)
    predicted_s = plain.wall_s - decode_s + decode_s / parts["S"]       # NaN where S is
    return {**parts, "decode_share": decode_s / plain.wall_s if plain.wall_s else 0.0,
            "predicted_speedup": plain.wall_s / predicted_s if predicted_s > 0 else float("nan"),
            "calibration_items": len(workload.calibration or workload.items[:1])}


def combined_prediction(df) -> pd.DataFrame:
    """Predict each combined row (lossless together; all together) from the single-technique rows it combines,
    two ways, next to the measurement.

    multiply: the product of the single rows' speed-ups (each technique scales the whole time);
    disjoint savings: the engine techniques save Delta_i = plain - row_i seconds on different parts of the
    work (prefill, forced spans, drafted spans), and the semantic cache keeps a fraction q of the engine calls
    and adds its own overhead (embedding, lookups): T = q (plain - sum Delta_i) + (T_cache - q plain). When the
    single rows' savings add up to the plain time or more, they cannot be on disjoint parts: disjoint_savings
    is NaN and savings_text says so."""
    single_of = {"semcache": "semantic cache", "prefix": "prefix cache", "grammar": "grammar drafting",
                 "drafter": "model drafter"}
    rows = []
    for (m, row), g in _combined(df):
        r = g.set_index("row")
        plain = float(r.loc["plain engine", "wall_s"])
        techs = str(r.loc[row, "techniques"]).split("+")
        singles = [single_of[t] for t in techs if t in single_of and single_of[t] in r.index]
        product = float(np.prod([r.loc[n, "speedup"] for n in singles]))
        saved = sum(plain - float(r.loc[n, "wall_s"]) for n in singles if n != "semantic cache")
        if "semantic cache" in singles:
            q = float(r.loc["semantic cache", "judge_calls"]) / max(float(r.loc["plain engine", "judge_calls"]), 1.0)
            overhead = float(r.loc["semantic cache", "wall_s"]) - q * plain
        else:
            q, overhead = 1.0, 0.0
        t = q * (plain - saved) + overhead
        rows.append({"model": m, "row": row, "product_of_single_rows": product,
                     "disjoint_savings": plain / t if saved < plain and t > 0 else float("nan"),
                     "measured": float(r.loc[row, "speedup"]), "engine_calls_kept": q,
                     "cache_overhead_s": overhead, "engine_savings_s": saved, "plain_s": plain})
    df = pd.DataFrame(rows)
    if len(df):
        df["savings_text"] = [f"{v:.2f}x" if v == v else f"nothing: the savings ({s:.1f} s) add up past the plain "
                              f"time ({p:.1f} s), so they overlap" for v, s, p in
                              zip(df.disjoint_savings, df.engine_savings_s, df.plain_s)]
    return df


def _combined(df):
    """((model, combined row), that model's rows) for each combined row the table has."""
    for m, g in df.groupby("model", sort=False):
        for row in ("lossless together", "all together"):
            if row in set(g["row"]):
                yield (m, row), g
