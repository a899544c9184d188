"""Lesson 1b (more on speculative decoding): the headline of notebooks/01b_speculative_more.ipynb, and the figures
its last cell records from the three experiments (the same drafter at two prices per draft token, sampling that
stays lossless, lesson 1's disk cells as a sweep). The experiments themselves live in lessons.speculative,
measure.speculative and lessonkit.sweep."""
from __future__ import annotations

import math

import pandas as pd

from lessonkit.lessons.headline import Column, Headline, Sentence

MODIFIED, BROKEN, FLOOR = ("modified rejection sampling", "broken: accept every draft",
                           "exact samples from p (noise floor)")


def _step(step_df: pd.DataFrame, which: str) -> dict:
    """The C or PyTorch step's row of `draft_step_comparison` as figures (None where it did not run)."""
    rows = step_df[step_df.drafter.str.endswith(f", {which} step")]
    r = rows.iloc[0] if len(rows) else None
    key = "c_step" if which == "C" else "torch_step"
    get = lambda col: None if r is None else float(r[col])
    return {f"{key}_c": get("c"), f"{key}_acceptance": get("acceptance_rate"),
            f"{key}_speedup": get("measured_speedup")}


def figures(step_df: pd.DataFrame, tv: pd.DataFrame, ran: dict, sweep_df: pd.DataFrame, *, draft: str,
            disk_words: str) -> dict:
    """What the lesson records: both steps' c, acceptance and speed-up, the samplers' total variation from the
    target, and the sweep's cells (how many measured, kept and failed; the fastest measured cell)."""
    tv_of = dict(zip(tv["sampler"], tv["TV(emitted, target)"]))
    ok = sweep_df[sweep_df.status == "ok"].dropna(subset=["speedup"]) if "speedup" in sweep_df else sweep_df.iloc[:0]
    best = ok.loc[ok.speedup.idxmax()] if len(ok) else None
    out = {"draft": draft, **_step(step_df, "C"), **_step(step_df, "PyTorch"),
           "steps_identical_to_plain": bool(step_df.identical_to_plain.all()),
           "tv_modified": float(tv_of[MODIFIED]), "tv_broken": float(tv_of[BROKEN]), "tv_floor": float(tv_of[FLOOR]),
           "sweep_points": int(ran["points"]), "sweep_measured": int(ran["done"]), "sweep_kept": int(ran["skipped"]),
           "sweep_failed": int(ran["failed"]), "disk_words": disk_words,
           "sweep_best_speedup": None if best is None else float(best.speedup),
           "sweep_best_acceptance": None if best is None else float(best.acceptance),
           "sweep_best_k": None if best is None else int(best.k)}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


HEADLINE = Headline(
    title="More on speculative decoding: the price of a draft, lossless sampling, a sweep",
    sentences=(
        Sentence("The same draft model ({draft}) as one C call: c = {c_step_c:.3f} of a target step, acceptance "
                 "{c_step_acceptance:.3f}, {c_step_speedup:.2f}x plain greedy; as PyTorch operations: c = "
                 "{torch_step_c:.3f}, acceptance {torch_step_acceptance:.3f}, {torch_step_speedup:.2f}x."),
        Sentence("Every output of both steps was {steps_identical_to_plain:identical to|DIFFERENT from} plain greedy's."),
        Sentence("Sampling: the first emitted token's total variation from the target's distribution was "
                 "{tv_modified:.4f} with modified rejection sampling (exact samples from the target: {tv_floor:.4f}) "
                 "and {tv_broken:.4f} when every draft is accepted."),
        Sentence("Lesson 1's disk cells as a sweep on {disk_words}: {sweep_points} cells, {sweep_measured} measured "
                 "now, {sweep_kept} kept from an earlier run, {sweep_failed} failed; the fastest measured "
                 "{sweep_best_speedup:.2f}x (acceptance {sweep_best_acceptance:.2f}, k = {sweep_best_k})."),
    ),
    columns=(Column("drafter", "drafter"), Column("k", "draft length k (tokens)"),
             Column("c", "c (target steps per draft token)", ".3f"),
             Column("acceptance_rate", "acceptance (fraction)", ".3f"),
             Column("measured_speedup", "measured speed-up (x)", ".2f"),
             Column("breakdown_speedup", "breakdown, same run (x)", ".2f"),
             Column("identical_to_plain", "output vs plain greedy", "identical|DIFFERENT")),
    caption="The same draft model, its step in C and in PyTorch",
    figure="lesson.draft_step_comparison(",
)
