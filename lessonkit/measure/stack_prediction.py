"""Lesson 6's rows predicted: the model-drafter row with lesson 1's formula, from quantities measured apart from
the stream; each combined row broken down into the single-technique rows it combines (`combined_breakdown`).

Lesson 1: a verify step emits E tokens and costs T(d+1)/T(1) + c d plain steps, so the decode phase speeds up by

    S = E / mean over verify steps of (T(d+1)/T(1) + c d)

where, on the calibration items (outside the stream: the items `measure.stack.choose_drafter` times drafters on),
decoded by the model drafter alone at the stack's depth gate:

    E   tokens per verify step: the bonus token plus the accepted drafts (the prefill forward left out);
    d   the drafts of each verify step (the gate's choices, its histogram);
    c   draft seconds per draft token over T(1);

and T(r) is this engine's verify cost curve after a context as long as a calibration prompt
(`speculative.gate.measure_cost_curve`). Only decode speeds up: with s the decode share of plain decoding on the
same calibration items (its wall time less its first token's, over its wall time), the row is predicted to take
(1 - s) + s / S of the plain row's time. Nothing of the timed rows enters (`measure.apart.predict_times` refuses a
stream item among the calibration items).

The combined rows are not predictions: they are composed from the single-technique rows of the same timed run,
so `combined_breakdown` labels them breakdowns.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from lessonkit.engine.generate import generate
from lessonkit.measure.apart import Apart, InSample, predict_times
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.speculative.verify import speculative_generate
from lessonkit.drafter_registry import make_drafter
from lessonkit.stack import GATE_K_MAX
from lessonkit.workloads.triage import ITEM_TEMPLATE, STOP_STRINGS, Workload


def _prompt(engine, workload: Workload, item) -> list[int]:
    return engine.encode(workload.prefix) + engine.encode(ITEM_TEMPLATE.format(text=item.text))


def drafting_apart(engine, workload: Workload, model_drafter: str, *, max_new_tokens: int, k="auto") -> dict:
    """The model drafter alone on the calibration items: verify steps, tokens they emitted, drafts per step
    (histogram), draft seconds, and the longest prompt (the context the cost curve is measured after); and plain
    decoding of the same items: its decode share (wall time less the first token's, over the wall time)."""
    items = workload.calibration or workload.items[:1]
    prompts = [_prompt(engine, workload, it) for it in items]
    out = {"steps": 0, "emitted": 0, "draft_tokens": 0, "draft_s": 0.0, "k_hist": {}, "context": 0,
           "prompts": prompts}
    drafter = make_drafter(model_drafter, engine)          # one drafter, reset for each prompt
    try:
        results = [speculative_generate(engine, drafter, p, max_new_tokens, k=k, k_max=GATE_K_MAX,
                                        stop_strings=STOP_STRINGS) for p in prompts]
    finally:
        if hasattr(drafter, "close"):
            drafter.close()
    plain = [generate(engine, p, max_new_tokens, stop_strings=STOP_STRINGS).stats for p in prompts]
    wall = sum(st["wall_s"] for st in plain)
    out["decode_share"] = sum(st["wall_s"] - st["ttft_s"] for st in plain) / wall if wall > 0 else 0.0
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


def drafter_row_prediction(engine, workload: Workload, model_drafter: str, *, max_new_tokens: int, k="auto") -> dict:
    """The model-drafter row's speed-up over the plain row predicted by lesson 1's formula (module docstring), from
    the calibration items alone; NaN where there are none (the first stream item would stand in: in sample). It
    reads nothing of the timed rows it is compared with."""
    apart = drafting_apart(engine, workload, model_drafter, max_new_tokens=max_new_tokens, k=k)
    cost = measure_cost_curve(engine, GATE_K_MAX, context_len=apart["context"])
    parts = predicted_decode_speedup(apart, cost)
    share = apart["decode_share"]
    stats = Apart(prompts=tuple(map(tuple, apart["prompts"])), cost=tuple(cost), c=parts["c"],
                  tokens_per_verify=parts["E"], source="the model drafter and plain decoding on the calibration items")
    try:
        pred = predict_times(stats, [_prompt(engine, workload, it) for it in workload.items], 1.0,
                             (1 - share) + share / parts["S"])                 # NaN where S is
    except InSample:
        pred = {"predicted_speedup": float("nan")}
    return {**parts, "decode_share": share, "predicted_speedup": pred["predicted_speedup"],
            "calibration_items": len(workload.calibration)}


def combined_breakdown(df) -> pd.DataFrame:
    """Each combined row (lossless together; all together) composed from the single-technique rows it combines,
    two ways, next to the measurement. A breakdown, not a prediction: the single rows and the plain row are timed
    rows of the same run.

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
