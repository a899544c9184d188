"""Lesson 1's break-even: when speculation stops paying, measured and from a cost model.

The break-even acceptance a* of a draft depth k solves E(k) = T(k+1)/T(1) + k c; when the model is bound by
reading experts from disk, the cost curve comes from a model fed by measured inputs (verify cost, expert reads
per forward along accepted and rejected rows, read time per expert) and a few cells are measured for real to
validate it. The measurements are lessonkit.measure.break_even; notebook 1 calls both."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from lessonkit.engine.engine import Engine
from lessonkit.files.disk import parse_disk
from lessonkit.measure.break_even import _measured_cell, disk_label


def break_even_surface(model_dir, prompts: list[list[int]], *, error_rates=(0.0, 0.25, 0.5, 0.75, 1.0),
                       budget_experts=(2, 8, None), ks=(1, 2, 4), max_new_tokens: int = 24,
                       disk="warm", dtype=torch.float32):
    """Speed-up of greedy speculative decoding (oracle drafter, so acceptance ~ 1 - error rate) over plain
    greedy at the same expert budget (experts resident per model; None = all), for each depth k, every cell
    measured with expert misses read from `disk` (slow; lesson 1 uses `disk_cost_model` and measures only
    the cells in `validate_cost_model`). Each run starts from an empty expert cache. Returns (DataFrame, Figure)."""
    disk = parse_disk(disk)
    rows = []
    oracle_engine = Engine(model_dir, name="oracle", dtype=dtype)          # shared by every oracle drafter
    total = oracle_engine.config.n_layers * oracle_engine.config.n_experts
    for nb in budget_experts:
        for P in error_rates:
            for k in ks:
                rows.append(_measured_cell(model_dir, prompts, nb, P, k, max_new_tokens, disk, dtype,
                                           oracle_engine, total))
    df = pd.DataFrame(rows)
    return df, plot_break_even(df, disk_label(disk))


# ---- the disk-bound break-even surface from a cost model ------------------------------------------------
#   plain run:       P + (N - 1) * (T(1)   + R(1, B)   * t_read)
#   speculative run: P + (N - 1) / E(a, k) * (T(k+1) + R(k+1, B) * t_read)
# P: the prompt's prefill with its expert reads (the same on both sides), N new tokens (the first comes from
# the prefill), T(r): a forward of r rows with every expert resident (the verify cost curve) plus the measured
# per-step overhead of the decode loop (sampling, stop checks: plain pays it N - 1 times), R(r, B): expert
# misses per forward of r rows at budget B (measured), t_read: one expert miss (`read_seconds`: the page-cache
# read, measured, plus the bytes at the cold disk's measured rate; or for a simulated disk the bytes at its rate,
# if longer), E(a, k) = (1 - a^(k+1)) / (1 - a).


def plot_break_even(df: pd.DataFrame, disk: str = "page-cache reads", measured: pd.DataFrame | None = None):
    """Heat maps of the speed-up per (acceptance, depth), one per expert budget (disk: where the misses were
    read from, in words: `disk_label`); with the cost model's table
    (column a_star) a black line marks the break-even acceptance a* of each k, and cells measured for real
    (`measured`) carry their measured speed-up in a box."""
    budgets = sorted(df.budget_experts.unique())
    acc_col = "acceptance" if "acceptance" in df else None
    if acc_col is None:
        df = df.assign(acceptance=1 - df.error_rate)
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.4 * len(budgets), 3.9), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        sub = df[df.budget_experts == b].pivot_table(index="k", columns="acceptance", values="speedup")
        acc = np.array(sub.columns, dtype=float)
        im = ax.imshow(sub.values, origin="lower", aspect="auto", cmap="RdYlGn", vmin=0.5, vmax=2.0,
                       extent=[-0.5, len(acc) - 0.5, -0.5, len(sub.index) - 0.5])
        small = len(acc) > 6
        for i in range(sub.shape[0]):
            for j in range(sub.shape[1]):
                v = sub.values[i, j]
                ax.text(j, i, f"{v:.2f}" if small else f"{v:.2f}" + ("" if v >= 1 else "\nloses"),
                        ha="center", va="center", fontsize=5.5 if small else 7)
        step = max(1, len(acc) // 6)
        ax.set_xticks(range(0, len(acc), step), [f"{a:.1f}" for a in acc[::step]])
        ax.set_yticks(range(len(sub.index)), [str(k) for k in sub.index])
        if "a_star" in df:
            ys, xs = [], []
            for i, k in enumerate(sub.index):
                a_star = df[(df.budget_experts == b) & (df.k == k)].a_star.iloc[0]
                if a_star is not None and a_star == a_star:
                    xs.append(float(np.interp(a_star, acc, np.arange(len(acc)))))
                    ys.append(i)
            if xs:
                ax.plot(xs, ys, "k|-", lw=1.5, ms=14, label="break-even a*")
        if measured is not None:
            for r in measured[measured.budget_experts == b].itertuples():
                if r.k in list(sub.index):
                    j = float(np.interp(r.acceptance, acc, np.arange(len(acc))))
                    ax.annotate(f"{r.measured_speedup:.2f}", (j, list(sub.index).index(r.k)), fontsize=6.5,
                                ha="center", va="center", bbox={"boxstyle": "square,pad=0.15", "fc": "white"})
        if "plain_expert_hit_rate" in df and df[df.budget_experts == b].plain_expert_hit_rate.iloc[0] is not None:
            hr = df[df.budget_experts == b].plain_expert_hit_rate.iloc[0]
            ax.set_title(f"{b} experts resident (plain hit rate {hr:.0%})", fontsize=9)
        else:
            ax.set_title(f"{b} of {int(b / df[df.budget_experts == b].budget_frac.iloc[0])} experts resident",
                         fontsize=9)
        ax.set_xlabel("acceptance a")
        ax.set_ylabel("draft depth k")
    fig.colorbar(im, ax=axes[0].tolist(), label="speed-up over plain greedy (x)")
    if "a_star" in df:
        axes[0][0].legend(loc="upper left", fontsize=7)
    how = "cost model; boxed: measured" if "a_star" in df else "measured"
    fig.suptitle(f"Break-even: speculation loses below a*, sooner when few experts fit\n({disk}; {how})",
                 fontsize=10)
    return fig
