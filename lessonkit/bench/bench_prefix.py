"""`lessonkit bench prefix`: prefill vs restore of a 552-token prefix; batch scoring off / cold / warm."""
from __future__ import annotations

import tempfile
from pathlib import Path

from lessonkit.bench.common import goal
from lessonkit.models.registry import load_model
from lessonkit.measure.timing import median_time
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.prefix_cache.generate import results_identical, score
from lessonkit.workloads.reviews import make_items, system_prompt_ids
from lessonkit.engine.machine import machine_record

def bench(args) -> dict:
    """`lessonkit bench prefix`: prefill vs restore of a 552-token prefix; batch scoring off / cold / warm."""
    smoke = bool(getattr(args, "smoke", False))
    repeats = max(1, int(getattr(args, "repeats", 3) or 3))
    n_prefix, n_items = (96, 6) if smoke else (552, 50)
    with tempfile.TemporaryDirectory() as tmp:
        model = getattr(args, "model", None) or ("tiny-moe" if smoke else "smollm2-135m")
        eng = load_model(model)
        prefix, items = system_prompt_ids(eng, n_prefix), make_items(eng, n_items, 0)
        cdir = Path(tmp) / "cache"
        pc = PrefixCache(cdir, eng)
        t_pre, _ = median_time(lambda: eng.forward(prefix, eng.new_cache(n_prefix), last_only=True),
                               repeats, warmup=0 if not smoke else 1)
        c = eng.new_cache(n_prefix)
        eng.forward(prefix, c, last_only=True)
        size = pc.save(prefix, c).stat().st_size

        def restore():
            assert PrefixCache(cdir, eng).lookup_and_restore(prefix, eng.new_cache(n_prefix)) == n_prefix
        t_res, _ = median_time(restore, repeats, warmup=1)
        pc.clear()
        score(eng, prefix, items[:1])       # warm-up (kernel set-up for these shapes), not timed
        off = score(eng, prefix, items)
        cold = score(eng, prefix, items, prefix_cache=PrefixCache(cdir, eng))
        warms = [score(eng, prefix, items, prefix_cache=PrefixCache(cdir, eng)) for _ in range(repeats)]
        warm = sorted(warms, key=lambda r: r.stats["total_s"])[len(warms) // 2]
    rows = []
    for name, r in (("cache off", off), ("cold (prefill + save)", cold), ("warm (restore)", warm)):
        rows.append({"name": f"score {n_items} items: {name}", "tokens_per_s": (r.stats["item_tokens"] + n_items) / r.stats["total_s"],
                     "total_s": r.stats["total_s"], "ttft_s": r.stats["ttft_s"],
                     "prefix_cache_hits": r.stats["prefix_cache_hits"],
                     "prefix_cache_queries": r.stats["prefix_cache_queries"],
                     "identical_to_plain": results_identical(off, r)})
    rows.append({"name": f"prefill {n_prefix} tokens", "tokens_per_s": n_prefix / t_pre, "total_s": t_pre,
                 "identical_to_plain": True})
    rows.append({"name": f"restore {n_prefix} tokens", "tokens_per_s": n_prefix / t_res, "total_s": t_res,
                 "bytes_on_disk": size, "bytes_per_token": size / n_prefix, "identical_to_plain": True})
    ratio, speedup = t_res / t_pre, off.stats["total_s"] / warm.stats["total_s"]
    ident = all(r["identical_to_plain"] for r in rows)
    return {"bench": "prefix", "machine": machine_record(),
            "model": getattr(eng, "name", str(model)), "smoke": smoke, "repeats": repeats,
            "rows": rows,
            "targets": [goal(f"restore / prefill time, {n_prefix}-token prefix", round(ratio, 4), "<= 0.05", ratio <= 0.05),
                        goal(f"batch scoring {n_items} items: off / warm total time", round(speedup, 2), ">= 3", speedup >= 3),
                        goal("scores identical (==) off / cold / warm", ident, "True", ident)]}
