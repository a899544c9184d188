"""The pictures of a sweep (lessonkit.sweep): one recorded figure against one swept parameter (lines, every
repeat a dot, the mean a line) or two (a heat map of the mean). The sweep's report and lesson 1's appendix
draw with these."""
from __future__ import annotations

import base64
import io

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def _positions(values) -> tuple[list, list[str], bool]:
    """(values in axis order, their labels, numeric?): numbers sorted, anything else a category in its order."""
    uniq = list(dict.fromkeys(values))
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in uniq):
        return sorted(uniq), [f"{v:g}" for v in sorted(uniq)], True
    return uniq, [str(v) for v in uniq], False


def plot_lines(df: pd.DataFrame, x: str, y: str, *, title: str | None = None, hue: str | None = None):
    """y against x: each row a dot, the mean over repeats a line (one per value of hue)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    order, names, numeric = _positions(df[x].tolist())
    pos = dict(zip(order, order if numeric else range(len(order))))
    for label, g in (df.groupby(hue, sort=True) if hue else [(None, df)]):
        mean = g.groupby(x)[y].mean()
        line, = ax.plot([pos[v] for v in mean.index if v in pos], mean.values, marker="o",
                        label=None if label is None else f"{hue} = {label}")
        ax.scatter([pos[v] for v in g[x]], g[y], s=12, alpha=0.5, color=line.get_color())
    if not numeric or len(order) <= 12:          # few values: a tick at each, none between
        ax.set_xticks(list(pos.values()), names)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{y} against {x}")
    if hue:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_heatmap(df: pd.DataFrame, x: str, y: str, value: str, *, title: str | None = None):
    """The mean of value over each (x, y) cell (over repeats and any other swept parameter), numbers written in."""
    xs, xnames, _ = _positions(df[x].tolist())
    ys, ynames, _ = _positions(df[y].tolist())
    grid = df.groupby([y, x])[value].mean().unstack(x).reindex(index=ys, columns=xs)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    im = ax.imshow(grid.values.astype(float), origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(xs)), xnames)
    ax.set_yticks(range(len(ys)), ynames)
    for i in range(len(ys)):
        for j in range(len(xs)):
            v = grid.values[i, j]
            if v == v:
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8, color="white")
    fig.colorbar(im, ax=ax, label=value)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{value} over {x} and {y}")
    fig.tight_layout()
    return fig


def plot_sweep(df: pd.DataFrame, swept: list[str], value: str, *, title: str | None = None):
    """Lines for one swept parameter, a heat map for two or more (the first two, the mean over the rest)."""
    if len(swept) == 1:
        return plot_lines(df, swept[0], value, title=title)
    return plot_heatmap(df, swept[0], swept[1], value, title=title)


def png_base64(fig, dpi: int = 100) -> str:
    """The figure as a base64 PNG (for a self-contained HTML page); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()
