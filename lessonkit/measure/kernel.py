"""The kernel measured: how a BLAS's rounding changes with the number of rows, summation orders, and which engines
(weights path, forward) a roofline or verify-cost comparison loads. Lessons 0 and 1 draw these."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from lessonkit.engine import active, c_forward, kernel, row_weight
from lessonkit.models.registry import load_model


def blas_name() -> str:
    """The BLAS this PyTorch build multiplies with (from its build settings): 'mkl', 'openblas', ... or
    'unknown'. Which row counts share a summation order depends on it. Measured by `rounding_demo` (lesson 0),
    not documented by either library: MKL kept 1-3 rows in the one-row order, OpenBLAS already differed at 2."""
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
    rw = row_weight.RowWeight(w_t)
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
    with active.use(forward=forward):
        return load_model(name, **kw)

def forwards_to_compare(models) -> list[tuple[str, str, dict, str | None]]:
    """The engines above on the default forward, plus smollm2's native blocks on the PyTorch forward when the
    C forward runs: the same weights and products, the glue around them in Python and PyTorch."""
    out = [(name, label, kw, None) for name, label, kw in engines_to_compare(models)]
    if "smollm2-135m" in models and c_forward.requested_path() != "torch" and kernel.BACKEND != "mkl":
        out.append(("smollm2-135m", "native Q4_1, PyTorch forward", {"weights": "native"}, "torch"))
    return out

def cost_paths(models) -> list[tuple[str, str, dict]]:
    """(model, label, {"backend": ..., load_model kwargs}) for every path a verify forward can take."""
    out = []
    for name, label, kw in engines_to_compare(models):
        if kernel.BACKEND != "mkl":
            out.append((name, f"kernel, {label}" if name == "smollm2-135m" else kernel.BACKEND,
                        {"backend": kernel.BACKEND, **kw}))
    return out + [(name, "mkl", {"backend": "mkl", "weights": "f32"} if name == "smollm2-135m" else {"backend": "mkl"})
                  for name in models]
