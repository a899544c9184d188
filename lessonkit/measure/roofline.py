"""The roofline of a decode step: bytes of weights it reads against measured copy bandwidth (the memory
line), and multiply-adds against the rate the kernel computes them at from cache (the compute line).

A batch-1 decode step reads every dense weight and the top-k experts of every layer once. When the
weights do not fit in cache, it cannot run faster than bytes / bandwidth; a verify forward that reads
them once for all its rows costs about the same, which is what makes speculation pay. Native Q4_1 blocks
read a fifth of the bytes but dequantise every weight before its multiply-add, so the compute line moves
up towards the memory line: which one binds decides what an extra verify row costs."""
from __future__ import annotations

import time

import torch


def weight_bytes_per_token(eng) -> int:
    """Bytes of weights one decode step reads: every dense matrix, the top-k experts of every layer."""
    m = eng.model
    c = m.config
    return sum(rw.nbytes for rw in m.wt.values()) + c.n_layers * c.top_k * eng.expert_bytes


def macs_per_token(eng) -> int:
    """Multiply-adds of one decode step's products: every dense matrix, the top-k experts of every layer."""
    m, c = eng.model, eng.config
    return sum(rw.k * rw.n for rw in m.wt.values()) + c.n_layers * c.top_k * 3 * c.intermediate_size * c.dim


def compute_rate(native: bool, k: int = 576, n: int = 576, calls: int = 400) -> float:
    """Multiply-adds per second of a one-row product on a cache-resident k x n matrix: float32 strips, or
    Q4_1 blocks (dequantised in the kernel) when native."""
    from lessonkit.engine import blocks
    from lessonkit.engine.row_weight import RowWeight
    g = torch.Generator().manual_seed(0)
    if native:
        d_m = (torch.rand(n, k // 32, 2, generator=g) * 0.01).half().view(torch.uint8)
        codes = torch.randint(0, 256, (n, k // 32, 16), generator=g, dtype=torch.uint8)
        w = blocks.NativeWeight(torch.cat([d_m, codes], dim=-1).reshape(n, -1), k, "q4_1")
    else:
        w = RowWeight(torch.randn(k, n, generator=g))
    x = torch.randn(1, k, generator=g)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            w.rows(x)
        best = min(best, (time.perf_counter() - t0) / calls)
    return k * n / best


def copy_bandwidth(mb: int = 256, repeats: int = 3) -> float:
    """Bytes per second a large float32 copy moves (read + write) on this thread: the roofline's bandwidth."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def decode_seconds(eng, tokens: int = 16, repeats: int = 3) -> float:
    """Seconds per decode step (the minimum over repeats of `tokens` steps after a one-token context)."""
    cache = eng.new_cache()
    eng.forward([1], cache)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(tokens):
            eng.forward([2 + i % 64], cache)
        best = min(best, (time.perf_counter() - t0) / tokens)
        cache.rollback(1)
    return best


def roofline(eng, *, tokens: int = 16, repeats: int = 3, copy_mb: int = 256) -> dict:
    nbytes, bw = weight_bytes_per_token(eng), copy_bandwidth(copy_mb)
    t = decode_seconds(eng, tokens, repeats)
    native = getattr(eng, "weights", "f32") == "native"
    macs, rate = macs_per_token(eng), compute_rate(native) if eng.model.wt["lm_head"].packed else None
    compute_ms = macs / rate * 1e3 if rate else None
    mem_ms = nbytes / bw * 1e3
    return {"weights_mib_per_token": nbytes / 2**20, "decode_ms": t * 1e3, "roofline_ms": mem_ms,
            "fraction_of_roofline": nbytes / bw / t, "copy_gb_s": bw / 1e9, "macs_per_token": macs,
            "compute_ms": compute_ms, "binds": "compute" if compute_ms and compute_ms > mem_ms else "memory"}
