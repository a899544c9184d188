"""The row-invariant kernel in lessons 0 and 1: why a batched product rounds differently, what the
kernel does instead, the roofline, and the verify cost curve it buys.

  rounding_sentence lessonkit.measure.kernel's rounding_demo (one row inside an M-row BLAS product vs the
                    same row alone: which bits move) in words, for this machine's BLAS
  roofline          bytes of weights per token against measured copy bandwidth, per model
  cost_curves       T(k+1)/T(1) of a verify forward per model, with the kernel and with MKL row groups

The measurements alone (rounding_demo, summation_orders: the same dot product summed in the orders a GEMV
and a GEMM tile use) are lessonkit.measure.kernel; the notebooks call them there.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lessonkit.engine import kernel
from lessonkit.engine.active import use
from lessonkit.engine.machine import cpu_name
from lessonkit.lessons.figures import integer_axis, legend_beside
from lessonkit.measure.kernel import blas_name, cost_paths, forwards_to_compare, load_on
from lessonkit.measure.roofline import roofline as measure_roofline
from lessonkit.models.registry import load_model
from lessonkit.speculative.gate import measure_cost_curve


def rounding_sentence(df: pd.DataFrame) -> str:
    """rounding_demo's table in words, from its numbers: where this BLAS first moves row 0's bits, and whether
    the engine's path kept them (a BLAS-dependent fact, so it is computed, never typed)."""
    blas, path = df.attrs.get("blas", blas_name()), df.attrs.get("engine_path", kernel.BACKEND)
    moved = df[df.blas_outputs_differing > 0]
    first = (f"from {int(moved.rows.min())} rows on (max difference {moved.blas_max_abs_diff.max():.1e})"
             if len(moved) else "at none of these row counts")
    same = df[df.rows < moved.rows.min()].rows.tolist() if len(moved) else df.rows.tolist()
    kept = df.engine_outputs_differing.eq(0).all()
    return (f"This PyTorch's BLAS ({blas}) changed row 0's bits {first}; row counts {same} kept one summation "
            f"order. The engine's path ({path}) " + ("kept every bit at every row count."
                                                     if kept else "changed bits too: it is not row-invariant here."))


def roofline(models=("tiny-moe", "smollm2-135m"), *, tokens: int = 16, repeats: int = 3,
             copy_mb: int = 256) -> tuple[pd.DataFrame, plt.Figure]:
    """Decode time per token against the memory line (weights once at copy bandwidth) and the compute line
    (multiply-adds at the kernel's in-cache rate), for each model on each of its weight paths."""
    rows = []
    for name, label, kw, fwd in tqdm(forwards_to_compare(models), desc="roofline", leave=False):
        eng = load_on(name, kw, fwd)
        rows.append({"model": name, "weights": label, "forward": "C" if eng.model.c_forward else "PyTorch"}
                    | measure_roofline(eng, tokens=tokens, repeats=repeats, copy_mb=copy_mb))
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.8 * len(df)))
    y = np.arange(len(df))
    ax.barh(y + 0.27, df.decode_ms, height=0.27, label="measured decode step")
    ax.barh(y, df.roofline_ms, height=0.27, label="memory line: weights once at copy bandwidth")
    ax.barh(y - 0.27, df.compute_ms.fillna(0), height=0.27, label="compute line: multiply-adds at the in-cache rate")
    ax.set_yticks(y, [f"{m}\n{w}" for m, w in zip(df.model, df.weights)])
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds per token (log)")
    ax.set_title(f"Decode against the memory and compute lines\n{cpu_name()}", fontsize=10)
    legend_beside(ax, fontsize=8)
    fig.tight_layout()
    return df, fig


def cost_curves(models=("tiny-moe", "smollm2-135m"), *, k_max: int = 7,
                repeats: int = 3) -> tuple[pd.DataFrame, plt.Figure]:
    """Verify cost T(k+1)/T(1) for k = 0..k_max per model: on the kernel (a quantised model on its native
    blocks and on float32) and on MKL row groups."""
    rows = []
    for name, label, kw in tqdm(cost_paths(models), desc="verify cost", leave=False):
        with use(kernel=kw.pop("backend")):
            eng = load_model(name, **kw)
        c = measure_cost_curve(eng, k_max, repeats=repeats)
        rows += [{"model": name, "path": label, "k": k, "rows": k + 1, "T_ms": t * 1e3, "T/T1": t / c[0]}
                 for k, t in enumerate(c)]
        del eng
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.4), squeeze=False)
    for ax, name in zip(axes[0], models):
        for path in df[df.model == name].path.unique():
            d = df[(df.model == name) & (df.path == path)]
            ax.plot(d.k, d["T/T1"], "o-", label=f"{path} (T1 {d.T_ms.iloc[0]:.1f} ms)")
        ax.plot(df.k.unique(), df.k.unique() + 1, ":", color="gray", label="a pass per row")
        ax.set_xlabel("drafts verified, k (rows = k + 1)")
        ax.set_ylabel("verify cost / decode step")
        ax.set_title(name)
        integer_axis(ax)
        legend_beside(ax, fontsize=8)
    fig.suptitle("Verify cost: weights read once (kernel; native blocks dequantise per call) or per row group (MKL)",
                 fontsize=10)
    fig.tight_layout()
    return df, fig
