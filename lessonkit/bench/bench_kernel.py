"""`lessonkit bench kernel`: the row-invariant C kernel against MKL's GEMV path, side by side in one process.

Three views, medians of several repeats, interleaved so that load drift hits both sides alike:
  shapes       one-row product per matrix shape, kernel vs MKL (x @ w_t), and the kernel's M-row cost
  verify cost  T(k+1)/T(1) of a whole verify forward, per model, with the kernel and with the MKL path
  roofline     decode time against (bytes of weights per token) / (single-thread copy bandwidth)
"""
from __future__ import annotations

import time

import torch

from lessonkit.bench.common import goal
from lessonkit.engine import active, kernel, row_weight
from lessonkit.models.registry import load_model
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.measure.roofline import roofline
from lessonkit.engine.machine import machine_record

ROWS = (1, 2, 4, 8, 16)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def shape_rows(shapes, repeats: int = 9, seed: int = 0) -> list[dict]:
    """Per (in, out): MKL one-row GEMV time, kernel time for 1 and M rows (medians, interleaved)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, n in shapes:
        w_t = torch.randn(k, n, generator=gen)
        rw = row_weight.RowWeight(w_t)
        xs = {m: torch.randn(m, k, generator=gen) for m in ROWS}
        times = {("mkl", 1): []} | {("kernel", m): [] for m in ROWS}
        for _ in range(repeats + 1):
            for (kind, m), ts in times.items():
                x = xs[m]
                t0 = time.perf_counter()
                x @ w_t if kind == "mkl" else rw.rows(x)
                ts.append(time.perf_counter() - t0)
        med = {key: _median(ts[1:]) for key, ts in times.items()}
        row = {"shape": f"{k}x{n}", "mkl_1row_us": med["mkl", 1] * 1e6, "kernel_1row_us": med["kernel", 1] * 1e6,
               "kernel_speed_vs_mkl": med["mkl", 1] / med["kernel", 1]}
        row |= {f"kernel_T{m}/T1": med["kernel", m] / med["kernel", 1] for m in ROWS[1:]}
        out.append(row)
    return out


def cost_curves(model: str, k_max: int, repeats: int) -> dict:
    """Verify cost T(k+1)/T(1) for k = 1..k_max on the kernel and on the MKL path (two loads, one process)."""
    curves = {}
    for name in (kernel.BACKEND, "mkl") if kernel.BACKEND != "mkl" else ("mkl",):
        with active.use(kernel=name):
            eng = load_model(model)
        c = measure_cost_curve(eng, k_max, repeats=repeats)
        curves[name] = {"T1_ms": c[0] * 1e3, "ratios": [round(t / c[0], 3) for t in c[1:]]}
        del eng
    return curves


def bench(args) -> dict:
    smoke = getattr(args, "smoke", False)
    repeats = 2 if smoke else max(3, getattr(args, "repeats", 5))
    models = ["tiny-moe"] if smoke else ["tiny-moe", "smollm2-135m"]
    k_max = 3 if smoke else 7
    info = active.describe()
    rows, targets, notes, per_model = [], [], [], {}
    for model in models:
        shapes = shape_rows(load_model(model).config.matrix_shapes(), repeats=repeats)
        curves = cost_curves(model, k_max, repeats)
        roof = roofline(load_model(model), tokens=4 if smoke else 16, repeats=repeats, copy_mb=64 if smoke else 256)
        per_model[model] = {"verify_cost": curves, "roofline": roof}
        rows += [{"model": model} | r for r in shapes]
        for path, c in curves.items():
            notes.append(f"{model} verify T(k+1)/T(1), {path}: T1 {c['T1_ms']:.1f} ms, "
                         + " ".join(f"k={k}: {r:.2f}" for k, r in enumerate(c["ratios"], 1)))
        notes.append(f"{model} decode {roof['decode_ms']:.1f} ms/token, roofline {roof['roofline_ms']:.1f} ms "
                     f"({roof['weights_mib_per_token']:.0f} MiB of weights at {roof['copy_gb_s']:.1f} GB/s copy): "
                     f"{roof['fraction_of_roofline']:.2f} of the roofline")
        if model == "smollm2-135m" and info["backend"] != "mkl":
            targets += _smollm2_targets(shapes, curves[info["backend"]]["ratios"], roof)
    return {"bench": "kernel", "machine": machine_record(), "kernel": info, "repeats": repeats, "rows": rows,
            "models": per_model, "targets": targets, "notes": notes}


def _smollm2_targets(shapes, ratios, roof) -> list[dict]:
    worst = min(r["kernel_speed_vs_mkl"] for r in shapes)
    frac = roof["fraction_of_roofline"]
    return [goal("smollm2: kernel / MKL one-row speed, worst shape", round(worst, 3), ">= 0.9", worst >= 0.9),
            goal("smollm2: decode / memcpy roofline", round(frac, 3), ">= 0.6", frac >= 0.6),
            goal("smollm2: verify T(k+1)/T(1), k <= 3", max(ratios[:3]), "<= 1.15", max(ratios[:3]) <= 1.15),
            goal("smollm2: verify T(8)/T(1)", ratios[6], "<= 1.35", ratios[6] <= 1.35)]
