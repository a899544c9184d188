"""`lessonkit bench mtp`: plain greedy vs MTP drafting (k = 1..3) on tiny-moe (and smollm2-135m unless smoke)."""
from __future__ import annotations

import statistics

from lessonkit.bench.common import goal
from lessonkit.models.registry import load_model
from lessonkit.measure.mtp import prompts_from_corpus, speed_comparison
from lessonkit.mtp.evaluate import HELDOUT_SAMPLE, acceptance_by_kind, heldout_sample, pooled_acceptance
from lessonkit.mtp.head import Shared, load_head
from lessonkit.engine.machine import machine_record

def bench(args) -> dict:
    """`lessonkit bench mtp`: plain greedy vs MTP drafting (k = 1..3) on tiny-moe (and smollm2-135m unless smoke)."""
    smoke = bool(getattr(args, "smoke", False))
    models = ["tiny-moe"] if smoke else ["tiny-moe", "smollm2-135m"]
    rows = []
    for m in models:
        eng = load_model(m)
        prompts = prompts_from_corpus(eng, 1, 32 if smoke else 48)
        if smoke:
            prompts = {k: v for k, v in list(prompts.items())[:1]}
        rows += speed_comparison(eng, None, prompts, 16 if smoke else 64, (1, 2) if smoke else (1, 2, 3),
                                 repeats=1 if smoke else 3)
    targets = [goal("MTP output identical to plain greedy", all(r["identical_to_plain"] for r in rows), "True",
                      all(r["identical_to_plain"] for r in rows))]
    for m in models:
        eng = load_model(m)
        per = acceptance_by_kind(load_head(eng), Shared.from_engine(eng), heldout_sample(eng, progress=False), 1)
        a1 = pooled_acceptance(per, 1)["acceptance"][0]
        sample = f"{HELDOUT_SAMPLE['n_per_kind']} x {HELDOUT_SAMPLE['seq_len']} tokens per kind, spread over the split"
        targets.append(goal(f"{m}: MTP position-1 acceptance, teacher-forced, held-out text ({sample}; "
                            + ", ".join(f"{k} {v['acceptance'][0]:.3f}" for k, v in per.items()) + ")",
                            round(a1, 3), ">= 0.55", a1 >= 0.55))
        ks = sorted({r["k"] for r in rows if r["model"] == m and r["k"] > 0})
        best = max((statistics.median(r["speedup"] for r in rows if r["model"] == m and r["k"] == k) for k in ks),
                   default=0.0)
        targets.append(goal(f"{m}: best MTP speed-up (median prompt)", round(best, 3), "> 1.0", best > 1.0))
    return {"bench": "mtp", "machine": machine_record(), "rows": rows, "targets": targets}
