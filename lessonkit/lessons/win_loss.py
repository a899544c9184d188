"""Lesson 1, section 3 (issue 59, item 3): real drafters on smollm2-135m, each predicted from parts measured apart and
then measured, on held-out requests (lessonkit.workloads.requests: the feature head never trained on them). The
best measured one is the drafter that paid on this machine, the worst the one that lost; the sentences say which,
from the run's numbers, and say so when none paid.

Each request category draws its held-out requests once and splits them: the first half is timed, the second half
gives the statistics a prediction may read (`measure.apart`: the acceptance at each position and c), so no timed
request feeds its own prediction. The suffix drafter (and `--draft auto`, which tries it first) is left out: its
store learns from every output, so a second timed round would find the first round's answer in it.
"""
from __future__ import annotations

import pandas as pd

from lessonkit.measure import numerics_paths as paths
from lessonkit.models.registry import load_model
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.workloads.requests import requests

# label -> (drafter spec for drafter_registry.make_drafter, k): each at the depth docs/feature_head.md measured best
CANDIDATES = {"feature head": ("head", 2), "n-gram lookup": ("ngram", 4), "distilled draft": ("smollm2-draft", 2)}
CATEGORIES = ("records", "rewrite")


def held_out_split(engine, categories, per_category: int, seed: int) -> dict:
    """{category: (timed requests, apart requests)}: 2 x per_category held-out requests drawn once, split in halves."""
    drawn = requests(engine, "heldout", 2 * per_category, seed=seed)
    return {c: (drawn[c][:per_category], drawn[c][per_category:]) for c in categories}


def win_and_loss(model: str = "smollm2-135m", candidates=None, categories=CATEGORIES, *, per_category: int = 2,
                 max_new_tokens: int = 32, repeats: int = 2, seed: int = 0) -> pd.DataFrame:
    """Every candidate drafter on every category of held-out requests, on the default numerics: predicted (E(k) from
    a_i and c measured on the apart half, the verify cost curve measured on its own forwards) and measured (decode
    phase, plain and speculative in turn, the fastest round each), every output compared with plain greedy."""
    candidates = candidates or CANDIDATES
    eng = load_model(model)
    cost = measure_cost_curve(eng, max(k for _, k in candidates.values()), repeats=3 * repeats + 1)
    frames = []
    for cat, (timed, apart) in held_out_split(eng, categories, per_category, seed).items():
        for label, (spec, k) in candidates.items():
            d = paths.drafter_on_each({"default": eng}, {"default": cost}, {label: spec}, timed, apart, k=k,
                                      max_new_tokens=max_new_tokens, repeats=repeats)
            frames.append(d.drop(columns="numerics").assign(category=cat, requests=len(timed)))
    cols = ["category", "drafter", "k", "a1_apart", "c", "verify_cost", "E_predicted", "tokens_per_verify",
            "a_star", "predicted_speedup", "measured_speedup", "identical_to_plain", "requests"]
    return pd.concat(frames, ignore_index=True)[cols]


def _row_words(r) -> str:
    return (f"{r.drafter} on {r.category} requests at k = {int(r.k)}: predicted {r.predicted_speedup:.2f}x from a1 "
            f"{r.a1_apart:.2f} and c {r.c:.2f} measured apart, measured {r.measured_speedup:.2f}x")


def win_loss_sentences(df: pd.DataFrame) -> list[str]:
    """What paid and what did not, from the table's numbers: the best and the worst measured row, how many rows
    paid, whether each prediction called its side of 1 right, and the exactness check."""
    best, worst = df.loc[df.measured_speedup.idxmax()], df.loc[df.measured_speedup.idxmin()]
    paid = df[df.measured_speedup > 1]
    right = int(((df.predicted_speedup > 1) == (df.measured_speedup > 1)).sum())
    out = [("paid: " if best.measured_speedup > 1 else "nothing paid in this run; the best: ") + _row_words(best),
           ("lost: " if worst.measured_speedup < 1 else "even the worst did not lose: ") + _row_words(worst),
           f"{len(paid)} of {len(df)} (drafter, category) pairs paid"
           + (f" ({', '.join(f'{r.drafter} on {r.category}' for r in paid.itertuples())})" if len(paid) else "")
           + f"; the prediction put {right} of {len(df)} on the right side of 1x",
           f"every speculative output identical to plain greedy: {bool(df.identical_to_plain.all())}"]
    return out


def headline_figures(win_df: pd.DataFrame, arms_df: pd.DataFrame) -> dict:
    """The figures the report's headline reads: the best and the worst measured drafter, each arm's most distinct
    completions per prompt."""
    best, worst = win_df.loc[win_df.measured_speedup.idxmax()], win_df.loc[win_df.measured_speedup.idxmin()]
    out = {}
    for side, r in (("win", best), ("loss", worst)):
        out.update({f"{side}_drafter": r.drafter, f"{side}_category": r.category, f"{side}_k": int(r.k),
                    f"{side}_predicted_speedup": float(r.predicted_speedup),
                    f"{side}_measured_speedup": float(r.measured_speedup)})
    most = arms_df.groupby("arm").distinct_completions.max()
    out["distinct_completions_lessonkit"] = int(most.get("lessonkit", -1))
    out["distinct_completions_transformers"] = int(most.get("transformers assisted", -1))
    return out


def summary_lines(cost_df: pd.DataFrame, win_df: pd.DataFrame, disk_df: pd.DataFrame, arms_df: pd.DataFrame,
                  disk_words: str, k: int) -> list[str]:
    """Lesson 1's summary, each line from this run's tables: the verify cost per numerics, what paid and what
    lost, the real drafter on the disk, and the two arms of exactness."""
    at = cost_df[cost_df.k == k]
    out = ["a verify of " + f"{k + 1} rows cost " + ", ".join(f"{r.measured:.2f} plain steps on the {r.numerics} numerics"
                                                            for r in at.itertuples())]
    out += win_loss_sentences(win_df)[:2]
    for r in disk_df.itertuples():
        out.append(f"{r.drafter} on {disk_words} (k = {int(r.k)}, {int(r.budget_experts)} experts resident): "
                   f"predicted {r.predicted_speedup:.2f}x, measured {r.measured_speedup:.2f}x (rounds "
                   f"{min(r.round_speedups):.2f}-{max(r.round_speedups):.2f}x): "
                   + ("paid" if r.measured_speedup > 1 else "did not pay"))
    for arm, g in arms_df.groupby("arm", sort=False):
        out.append(f"{arm}: at most {int(g.distinct_completions.max())} distinct completion(s) per prompt over "
                   f"{int(g.runs.iloc[0])} runs of {int(g.new_tokens.iloc[0])} tokens")
    return out
