"""Shared pieces of every `lessonkit bench`: medians, goals, the readable table (the machine record is
lessonkit.engine.machine.machine_record)."""
from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd

from lessonkit.engine.generate import generate
from lessonkit.measure.timing import median_time


def median_times(fns: dict, repeats: int = 3, warmup: int = 1) -> dict:
    """Median seconds of each contender, run in turn within every repeat (baseline and contenders side by
    side: load drift on a shared machine hits all of them alike)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    ts = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            ts[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in ts.items()}


def decode_rate(eng, prompt_ids: list[int], n: int) -> float:
    """Greedy decode tokens/s of a lessonkit engine over its KV cache: n new tokens after the prompt, the
    first one (the prefill's) left out."""
    r = generate(eng, prompt_ids, n, use_eos=False)
    decode_s = r.stats["wall_s"] - r.stats["ttft_s"]
    return (r.stats["new_tokens"] - 1) / decode_s if decode_s > 0 else float("nan")


def prefill_rate(eng, ids: list[int]) -> float:
    """Prefill tokens/s of a lessonkit engine: one forward over ids into a fresh cache, last logits only."""
    t0 = time.perf_counter()
    eng.forward(ids, eng.new_cache(len(ids)), last_only=True)
    return len(ids) / (time.perf_counter() - t0)


def memcpy_bandwidth(mb: int = 256, repeats: int = 3) -> float:
    """Bytes per second moved (read + write) by a large numpy copy: this machine's memory bandwidth."""
    a = np.ones(mb * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    t, _ = median_time(lambda: np.copyto(b, a), repeats)
    return 2 * a.nbytes / t


def goal(name: str, value, wanted, met: bool) -> dict:
    """One row of a benchmark's goals: what was measured, the value it should reach, and whether it did."""
    return {"name": name, "value": value, "target": wanted, "met": bool(met)}


def format_table(result: dict) -> str:
    lines = [f"bench {result['bench']}"]
    if result.get("machine", {}).get("cpu"):
        m = result["machine"]
        lines.append(f"cpu: {m['cpu']}; kernel path {m.get('isa')}, numerics {m.get('numerics')}, "
                     f"{m.get('kernel_threads')} kernel thread(s)")
    if result.get("rows"):
        lines.append(pd.DataFrame(result["rows"]).to_string(index=False))
    for key, groups in result.items():
        if key.endswith("_by_op") and groups:
            nested = {k: v for k, v in groups.items() if isinstance(v, dict)} or {"": groups}
            for who, g in nested.items():
                lines.append(f"{key.replace('_', ' ')}{' (' + who + ')' if who else ''}: "
                             + ", ".join(f"{op} {v:.2f}" for op, v in g.items()))
    if result.get("table_markdown"):
        lines.append(result["table_markdown"])
    if result.get("targets"):
        lines.append("targets:")
        for t in result["targets"]:
            lines.append(f"  [{'met' if t['met'] else 'MISSED'}] {t['name']}: {t['value']} (target {t['target']})")
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
