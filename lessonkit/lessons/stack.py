"""Lesson 6 (the whole stack, the capstone): the figures of notebooks/06_stack.ipynb.

The ablation itself is measurement (lessonkit.measure.stack: `ablation_all` runs the plain engine, each
technique alone and all together on each model, item by item interleaved, and returns a DataFrame);
`plot_ablation(df)` draws it and `ablation_panel(df)` shows one model at a time (the predictions of its rows:
lessonkit.measure.stack_prediction).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import show_panel


def plot_ablation(df, title: str | None = None):
    """Speed-up over the plain engine per row (bars, one group per model); hatched = some answer (any item,
    the semantic cache's included) not byte-identical to the plain engine's."""
    models = list(dict.fromkeys(df["model"]))
    names = list(dict.fromkeys(df["row"]))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.8 / max(len(models), 1)
    x = np.arange(len(names))
    for j, m in enumerate(models):
        sub = df[df["model"] == m].set_index("row")
        vals = [float(sub.loc[n, "speedup"]) if n in sub.index else 0.0 for n in names]
        bars = ax.bar(x + (j - (len(models) - 1) / 2) * w, vals, w, label=m)
        for b, n in zip(bars, names):
            if n in sub.index and not bool(sub.loc[n, "identical_to_plain"]):
                b.set_hatch("//")
    ax.axhline(1.0, color="grey", lw=0.8)
    if "lossless together" in names:            # the lossless rows left of the line, the lossy cache's right of it
        ax.axvline(names.index("lossless together") + 0.5, color="black", lw=0.8, ls=":")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("speed-up over the plain engine (x, wall time)")
    ax.set_xlabel("techniques on")
    if title is None:
        title = ablation_title(df)
    ax.set_title(title or "Stack ablation", fontsize=9, wrap=True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def ablation_title(df) -> str:
    """The figure's claim, from the table: each model's lossless speed-up (prefix cache and drafting) and its
    speed-up behind the (lossy, audited) semantic cache, whether the engine's answers kept their bytes, and how
    many answers the cache changed. Two short lines."""
    all_rows = df[df["row"] == "all together"]
    if not len(all_rows):
        return "Stack ablation"
    lossless = df[df["row"] == "lossless together"].set_index("model")["speedup"]
    speed = ", ".join(f"{r.model} {lossless[r.model]:.1f}x lossless, {r.speedup:.1f}x with the cache"
                      if r.model in lossless.index else f"{r.model} {r.speedup:.1f}x" for r in all_rows.itertuples())
    same = all_rows.get("engine_answers_identical", all_rows["identical_to_plain"])   # older tables: one column
    eng = "engine answers byte-identical" if bool(same.all()) else "engine answers DIFFER"
    diff = int(all_rows["answers_differing"].sum()) if "answers_differing" in all_rows else 0
    cache = "no answer changed by the cache" if diff == 0 else f"{diff} answer(s) changed by the semantic cache (hatched)"
    return f"Together: {speed}\n{eng}; {cache}"


def ablation_panel(df) -> None:
    """A model picker over plot_ablation: the ablation of one model at a time."""
    import ipywidgets as w
    show_panel({"model": w.Dropdown(options=list(dict.fromkeys(df["model"])), description="model")},
               lambda model: plot_ablation(df[df["model"] == model]), title="The stack's ablation, per model")


HEADLINE = Headline(
    title="The techniques together: lossless, then behind the lossy cache",
    sentences=(
        Sentence("{*}: the lossless techniques together ({*_lossless_techniques}, the drafting chosen by measuring, "
                 "the depth by the gate) ran {*_lossless_speedup:.2f}x the plain engine; every answer "
                 "{*_lossless_identical:byte-identical to|DIFFERENT from} plain greedy.", each="*_lossless_speedup"),
        Sentence("{*}: behind the semantic cache as well, all together ran {*_all_speedup:.2f}x the plain engine ({*_plain_tokens_per_s:.1f} "
                 "tokens/s plain); {*_all_answers_differing} of {items} answers differed from plain (the semantic "
                 "cache is lossy, audited), {*_all_actionable_losses} actionable losses, {*_all_judge_calls} judge "
                 "calls.", each="*_all_speedup"),
        Sentence("{*}: every answer the engine wrote, each technique alone or together, was "
                 "{*_engine_rows_identical:identical to|DIFFERENT from} plain greedy (the lossless part).",
                 each="*_engine_rows_identical"),
        Sentence("{*}: broken down into the single-technique rows of the same run, multiplying their speed-ups gives "
                 "{*_breakdown_product:.2f}x, adding the seconds each saves gives {*_breakdown_savings}; measured "
                 "{*_all_speedup:.2f}x.", each="*_breakdown_product"),
        Sentence("Timed on {timing_threads} thread(s) with {items} items per row."),
    ),
    columns=(Column("model", "model"), Column("row", "row"), Column("techniques", "techniques"),
             Column("lossless", "lossless", "yes|no: the semantic cache"),
             Column("wall_s", "wall time (s)", ".2f"), Column("speedup", "speed-up (x)", ".2f"),
             Column("tokens_per_s", "tokens/s", ".1f"), Column("forwards", "forwards"),
             Column("judge_calls", "judge calls"), Column("cache_hits", "cache hits"),
             Column("actionable_losses", "actionable losses", ".0f"),
             Column("answers_differing", "answers differing from plain"),
             Column("engine_answers_identical", "engine's answers vs plain", "identical|DIFFER")),
    caption="The ablation: plain engine, each technique alone, the lossless ones together, all behind the lossy cache",
    figure="lesson.plot_ablation(",
)
