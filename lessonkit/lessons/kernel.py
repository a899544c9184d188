"""The row-invariant kernel in lessons 0 and 1: why a batched product rounds differently, what the
kernel does instead, the roofline, and the verify cost curve it buys.

  rounding_demo     one row inside an M-row MKL product vs the same row alone: which bits move
  summation_orders  the same dot product summed in the orders a GEMV and a GEMM tile use
  roofline          bytes of weights per token against measured copy bandwidth, per model
  cost_curves       T(k+1)/T(1) of a verify forward per model, with the kernel and with MKL row groups
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lessonkit.engine import kernel
from lessonkit.engine.registry import load_model
from lessonkit.engine.roofline import roofline as measure_roofline
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.lessons.figures import integer_axis, legend_beside


def rounding_demo(k: int = 576, n: int = 1536, rows=(1, 2, 3, 4, 8, 16), seed: int = 0) -> pd.DataFrame:
    """Row 0 of an M-row product against the same row alone, with MKL's plain matmul and with the kernel:
    how many of the n outputs differ in any bit, and by how much at most."""
    gen = torch.Generator().manual_seed(seed)
    w_t = torch.randn(k, n, generator=gen)
    rw = kernel.RowWeight(w_t)
    x = torch.randn(max(rows), k, generator=gen)
    alone_mkl, alone_kernel = x[:1] @ w_t, rw.rows(x[:1])
    out = []
    for m in rows:
        in_mkl, in_kernel = (x[:m] @ w_t)[:1], rw.rows(x[:m])[:1]
        out.append({"rows": m, "mkl_outputs_differing": int((in_mkl != alone_mkl).sum()),
                    "mkl_max_abs_diff": float((in_mkl - alone_mkl).abs().max()),
                    f"{kernel.BACKEND}_outputs_differing": int((in_kernel != alone_kernel).sum())})
    return pd.DataFrame(out)


def summation_orders(k: int = 576, seed: int = 0) -> pd.DataFrame:
    """One dot product in float32, summed three ways: one sequential FMA-like chain (the kernel), 8 lanes
    summed at the end (a vectorised GEMV), 4 blocked partial sums (a GEMM tile). Float addition is not
    associative, so each order may give other last bits, and a library picks the order by the row count."""
    gen = np.random.default_rng(seed)
    a, b = gen.standard_normal(k).astype(np.float32), gen.standard_normal(k).astype(np.float32)
    seq = np.float32(0)
    for i in range(k):
        seq = np.float32(seq + a[i] * b[i])
    lanes = (a * b).reshape(-1, 8).sum(axis=0, dtype=np.float32).sum(dtype=np.float32)
    blocks = (a * b).reshape(4, -1).sum(axis=1, dtype=np.float32).sum(dtype=np.float32)
    exact = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    rows = [("one sequential chain", seq), ("8 lanes, then across", lanes), ("4 blocks, then across", blocks)]
    return pd.DataFrame([{"order": o, "value": float(v), "bits": f"{np.float32(v).view(np.uint32):08x}",
                          "error_vs_float64": float(v) - exact} for o, v in rows])


def roofline(models=("tiny-moe", "smollm2-135m"), *, tokens: int = 16, repeats: int = 3,
             copy_mb: int = 256) -> tuple[pd.DataFrame, plt.Figure]:
    """Decode time per token against the time to stream its weights once at copy bandwidth."""
    rows = []
    for name in tqdm(models, desc="roofline", leave=False):
        rows.append({"model": name} | measure_roofline(load_model(name), tokens=tokens, repeats=repeats,
                                                       copy_mb=copy_mb))
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    y = np.arange(len(df))
    ax.barh(y + 0.2, df.decode_ms, height=0.4, label="measured decode step")
    ax.barh(y - 0.2, df.roofline_ms, height=0.4, label="weights once at copy bandwidth")
    ax.set_yticks(y, df.model)
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds per token (log)")
    ax.set_title("Decode against the memory roofline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return df, fig


def cost_curves(models=("tiny-moe", "smollm2-135m"), *, k_max: int = 7,
                repeats: int = 3) -> tuple[pd.DataFrame, plt.Figure]:
    """Verify cost T(k+1)/T(1) for k = 0..k_max per model, on the kernel and on MKL row groups."""
    paths = [kernel.BACKEND, "mkl"] if kernel.BACKEND != "mkl" else ["mkl"]
    rows = []
    for name in tqdm(models, desc="verify cost", leave=False):
        for path in paths:
            with kernel.using(path):
                eng = load_model(name)
            c = measure_cost_curve(eng, k_max, repeats=repeats)
            rows += [{"model": name, "path": path, "k": k, "rows": k + 1, "T_ms": t * 1e3, "T/T1": t / c[0]}
                     for k, t in enumerate(c)]
            del eng
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.4), squeeze=False)
    for ax, name in zip(axes[0], models):
        for path in paths:
            d = df[(df.model == name) & (df.path == path)]
            ax.plot(d.k, d["T/T1"], "o-", label=f"{path} (T1 {d.T_ms.iloc[0]:.1f} ms)")
        ax.plot(df.k.unique(), df.k.unique() + 1, ":", color="gray", label="a pass per row")
        ax.set_xlabel("drafts verified, k (rows = k + 1)")
        ax.set_ylabel("verify cost / decode step")
        ax.set_title(name)
        integer_axis(ax)
        legend_beside(ax, fontsize=8)
    fig.suptitle("Verify cost: weights read once (kernel) or per row group (MKL)", fontsize=10)
    fig.tight_layout()
    return df, fig
