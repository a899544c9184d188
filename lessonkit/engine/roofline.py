"""The memory roofline of a decode step: bytes of weights it reads against measured copy bandwidth.

A batch-1 decode step reads every dense weight and the top-k experts of every layer once. When the
weights do not fit in cache, it cannot run faster than bytes / bandwidth; a verify forward that reads
them once for all its rows costs about the same, which is what makes speculation pay."""
from __future__ import annotations

import time

import torch


def weight_bytes_per_token(eng) -> int:
    """Bytes of weights one decode step reads: every dense matrix, the top-k experts of every layer."""
    m = eng.model
    c = m.config
    return sum(rw.nbytes for rw in m.wt.values()) + c.n_layers * c.top_k * eng.expert_bytes


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
    return {"weights_mib_per_token": nbytes / 2**20, "decode_ms": t * 1e3, "roofline_ms": nbytes / bw * 1e3,
            "fraction_of_roofline": nbytes / bw / t, "copy_gb_s": bw / 1e9}
