"""Lesson 4 (persistent prefix-KV cache): the figures of notebooks/04_prefix_cache.ipynb.

The experiments are lessonkit.measure.prefix_cache (the notebook calls them there), with
`tiny_random_model`, the lessons' stand-in models.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.measure.prefix_cache import restore_vs_prefill_table


def plot_batch_scoring(df):
    """Bar chart of total time and time to first score per mode (from batch_scoring_experiment)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, col in zip(axes, ("total s", "TTFT s")):
        ax.bar(df["mode"], df[col], color=["#999999", "#4477aa", "#228833"][: len(df)])
        ax.set_ylabel(f"{col.split()[0]} time (s)")
        ax.set_xlabel("prefix cache")
        for i, v in enumerate(df[col]):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=8)
    warm = df.iloc[-1]
    same = "identical scores" if bool(df["identical to off"].all()) else "SCORES DIFFER"
    fig.suptitle(f"{int(warm['items'])} items behind a {int(warm['prefix tokens'])}-token prompt: warm after a "
                 f"restart runs at {warm['speed-up vs off']:.1f}x the speed of no cache, {same}")
    fig.tight_layout()
    return fig


def restore_vs_prefill(engine, cache_dir, lengths=(64, 128, 256, 552), repeats: int = 3, progress: bool = True):
    """Prefill time vs restore time (fresh cache, full verification) as the prefix grows.

    Returns (DataFrame, Figure); the DataFrame is restore_vs_prefill_table's.
    """
    df = restore_vs_prefill_table(engine, cache_dir, lengths, repeats, progress)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df["prefix tokens"], df["prefill s"], "o-", label="prefill (compute)")
    ax.plot(df["prefix tokens"], df["restore s"], "s-", label="restore from disk (verified)")
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("time (s)")
    ax.set_yscale("log")
    ax.legend()
    last = df.iloc[-1]
    ax.set_title(f"{getattr(engine, 'name', 'model')}: restoring {int(last['prefix tokens'])} tokens costs "
                 f"{last['restore / prefill']:.1%} of their prefill")
    fig.tight_layout()
    return df, fig


def restore_table(df_rvp: pd.DataFrame, n: int) -> pd.DataFrame:
    """Lesson 4's panel, one prefix length: prefill against restore from restore_vs_prefill's table, with units."""
    r = df_rvp[df_rvp["prefix tokens"] == n].iloc[0]
    rows = [("prefill", f"{1e3 * r['prefill s']:.1f}", "ms"), ("restore", f"{1e3 * r['restore s']:.1f}", "ms"),
            ("restore / prefill", f"{100 * r['restore / prefill']:.1f}", "%"),
            ("on disk", f"{int(r['bytes on disk']):,}", "bytes")]
    return quantity_table(rows)


def restore_panel(df_rvp: pd.DataFrame) -> None:
    """A prefix-length slider over `restore_table`."""
    import ipywidgets as w
    show_panel({"n": w.SelectionSlider(options=list(df_rvp["prefix tokens"]), description="prefix tokens")},
               lambda n: restore_table(df_rvp, n), title="Restoring a cached prefix against computing it again")


HEADLINE = Headline(
    title="Persistent prefix-KV cache",
    sentences=(
        Sentence("{model}: restoring a {prefix_tokens}-token prefix from disk took {restore_s:.4f} s against "
                 "{prefill_s:.4f} s to prefill it: restore / prefill = {restore_over_prefill:.2f}."),
        Sentence("Scoring {batch_items} items behind one system prompt, a warm cache after a restart ran "
                 "{batch_speedup_warm_vs_off:.2f}x the uncached run, time to first token {ttft_off_s:.4f} s -> "
                 "{ttft_warm_s:.4f} s, scores {scores_identical:identical to|DIFFERENT from} the uncached run."),
        Sentence("A snapshot holds {kv_bytes_per_token:,} bytes of keys and values per cached token, plus its "
                 "header."),
        Sentence("A cache keyed by shapes only {shape_keyed_cache_changes_output:changed the output|left the output "
                 "unchanged} when handed another model's state; the provenance-keyed cache restored "
                 "{foreign_tokens_restored} tokens from it."),
    ),
    columns=(Column("mode", "cache"), Column("items", "items"), Column("prefix tokens", "prefix (tokens)"),
             Column("total s", "total (s)", ".4f"), Column("TTFT s", "time to first token (s)", ".4f"),
             Column("prefill s", "prefill (s)", ".4f"), Column("restore s", "restore (s)", ".4f"),
             Column("prefix_cache_hits", "prefix-cache hits (tokens)"),
             Column("speed-up vs off", "speed-up vs off (x)", ".2f"),
             Column("identical to off", "scores vs off", "identical|DIFFER")),
    caption="Batch scoring behind one long system prompt: off, cold, warm after a restart",
    figure="lesson.plot_batch_scoring(",
)
