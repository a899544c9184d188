"""Prompt lookup on input-grounded requests (lessonkit.workloads.grounded), for lesson 1 and `bench spec`:
plain greedy vs n-gram drafting at several k, side by side in one process, byte-identical output
checked on every run.

The prompt's prefill is the same work on both sides, so the speed-up is reported twice: over the whole
request and over the decode phase alone (what speculation changes)."""
from __future__ import annotations

import statistics

from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import NGramDrafter
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.grounded import grounded_prompts


def _run(fn, prompts) -> tuple[list, float, float]:
    outs = [fn(p) for p in prompts]
    wall = sum(o.stats["wall_s"] for o in outs)
    return outs, wall, wall - sum(o.stats["ttft_s"] for o in outs)


def grounded_rows(model: str = "smollm2-135m", *, ks=(4, 8, "auto"), max_new_tokens: int = 96,
                  repeats: int = 3, n_prompts: int | None = None) -> tuple[list[dict], dict]:
    eng = load_model(model)
    prompts = grounded_prompts(eng, n_prompts)
    contenders = {"plain greedy": lambda p: generate(eng, p, max_new_tokens)}
    for k in ks:
        contenders[f"prompt lookup k={k}"] = lambda p, k=k: speculative_generate(eng, NGramDrafter(), p, max_new_tokens, k=k)
    ref = [o.token_ids for o in _run(contenders["plain greedy"], prompts)[0]]
    times = {name: ([], []) for name in contenders}
    stats = {}
    for _ in range(repeats):                        # interleaved: load drift hits every contender alike
        for name, fn in contenders.items():
            outs, wall, decode = _run(fn, prompts)
            times[name][0].append(wall)
            times[name][1].append(decode)
            stats[name] = (outs, [o.token_ids for o in outs] == ref)
    base_wall, base_dec = (statistics.median(v) for v in times["plain greedy"])
    rows = []
    for name, (walls, decs) in times.items():
        outs, same = stats[name]
        n_tok = sum(len(o.token_ids) for o in outs)
        fwd = sum(o.stats.get("forwards", 0) for o in outs)
        rows.append({"model": model, "name": name, "identical_to_plain": same, "new_tokens": n_tok,
                     "tokens_per_forward": n_tok / max(fwd, 1),
                     "speedup_request": base_wall / statistics.median(walls),
                     "speedup_decode": base_dec / statistics.median(decs)})
    best = max(rows[1:], key=lambda r: r["speedup_decode"])
    return rows, best
