"""The row-invariant kernel in lessons 0 and 1: why a batched product rounds differently, what the
kernel does instead, the roofline, and the verify cost curve it buys.

  rounding_demo     one row inside an M-row BLAS product vs the same row alone: which bits move
  rounding_sentence that table in words, for this machine's BLAS
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

from lessonkit.engine import c_forward, kernel
from lessonkit.engine.machine import cpu_name
from lessonkit.models.registry import load_model
from lessonkit.measure.roofline import roofline as measure_roofline
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.lessons.figures import integer_axis, legend_beside


def blas_name() -> str:
    """The BLAS this PyTorch build multiplies with (from its build settings): 'mkl', 'openblas', ... or
    'unknown'. Which row counts share a summation order depends on it: MKL keeps 1-3 rows on its GEMV path,
    OpenBLAS (Linux arm64 wheels, conda-forge's macOS builds) already differs at 2 rows."""
    import re
    m = re.search(r"BLAS_INFO=([A-Za-z0-9_]+)", torch.__config__.show())
    return m.group(1).lower() if m else "unknown"


def rounding_demo(k: int = 576, n: int = 1536, rows=(1, 2, 3, 4, 8, 16), seed: int = 0) -> pd.DataFrame:
    """Row 0 of an M-row product against the same row alone, with the BLAS's plain matmul (torch's `@`) and
    with the engine's short-forward path (`kernel.BACKEND`: the row kernel, or the BLAS in row groups):
    how many of the n outputs differ in any bit, and by how much at most. The two columns have their own
    names whatever the backend, so neither overwrites the other."""
    gen = torch.Generator().manual_seed(seed)
    w_t = torch.randn(k, n, generator=gen)
    rw = kernel.RowWeight(w_t)
    x = torch.randn(max(rows), k, generator=gen)
    alone_blas, alone_engine = x[:1] @ w_t, rw.rows(x[:1])
    out = []
    for m in rows:
        in_blas, in_engine = (x[:m] @ w_t)[:1], rw.rows(x[:m])[:1]
        out.append({"rows": m, "blas_outputs_differing": int((in_blas != alone_blas).sum()),
                    "blas_max_abs_diff": float((in_blas - alone_blas).abs().max()),
                    "engine_outputs_differing": int((in_engine != alone_engine).sum())})
    df = pd.DataFrame(out)
    df.attrs.update(blas=blas_name(), engine_path=kernel.BACKEND)
    return df


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


def engines_to_compare(models) -> list[tuple[str, str, dict]]:
    """(model, label, load_model kwargs): a quantised model on both of its paths (native blocks, float32)."""
    out = []
    for name in models:
        if name == "smollm2-135m" and kernel.BACKEND != "mkl":
            out += [(name, "native Q4_1", {"weights": "native"}), (name, "float32", {"weights": "f32"})]
        else:
            out.append((name, "float32", {}))
    return out


def load_on(name: str, kw: dict, forward: str | None = None):
    """load_model(name, **kw), built for forward "c" or "torch" (None: the default)."""
    if forward is None:
        return load_model(name, **kw)
    with c_forward.using(forward):
        return load_model(name, **kw)


def forwards_to_compare(models) -> list[tuple[str, str, dict, str | None]]:
    """The engines above on the default forward, plus smollm2's native blocks on the PyTorch forward when the
    C forward runs: the same weights and products, the glue around them in Python and PyTorch."""
    out = [(name, label, kw, None) for name, label, kw in engines_to_compare(models)]
    if "smollm2-135m" in models and c_forward.requested_path() != "torch" and kernel.BACKEND != "mkl":
        out.append(("smollm2-135m", "native Q4_1, PyTorch forward", {"weights": "native"}, "torch"))
    return out


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


def cost_paths(models) -> list[tuple[str, str, dict]]:
    """(model, label, {"backend": ..., load_model kwargs}) for every path a verify forward can take."""
    out = []
    for name, label, kw in engines_to_compare(models):
        if kernel.BACKEND != "mkl":
            out.append((name, f"kernel, {label}" if name == "smollm2-135m" else kernel.BACKEND,
                        {"backend": kernel.BACKEND, **kw}))
    return out + [(name, "mkl", {"backend": "mkl", "weights": "f32"} if name == "smollm2-135m" else {"backend": "mkl"})
                  for name in models]


def cost_curves(models=("tiny-moe", "smollm2-135m"), *, k_max: int = 7,
                repeats: int = 3) -> tuple[pd.DataFrame, plt.Figure]:
    """Verify cost T(k+1)/T(1) for k = 0..k_max per model: on the kernel (a quantised model on its native
    blocks and on float32) and on MKL row groups."""
    rows = []
    for name, label, kw in tqdm(cost_paths(models), desc="verify cost", leave=False):
        with kernel.using(kw.pop("backend")):
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
