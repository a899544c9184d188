"""Wall-clock timing shared by the lessons and the benchmarks: the median of repeats after a warm-up."""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int = 3, warmup: int = 1) -> tuple[float, list[float]]:
    """(median seconds of `repeats` calls of fn, every call's seconds), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts
