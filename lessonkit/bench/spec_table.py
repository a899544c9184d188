"""A Spec-Bench-style table (Xia et al. 2024, arXiv:2401.07851) for `bench spec`: per task category of held-out
requests (lessonkit.workloads.requests: chat, code, records, rewrite) and per drafter, plain greedy and the
drafter take turns within every round; the row reports mean accepted tokens per verify, acceptance by draft
position, the draft cost c (seconds per draft token over a plain step's), the verify cost T(k+1)/T(1) of the
chosen depth, the speed-up (median of rounds, with the spread) and whether the output equals plain greedy's.
"""
from __future__ import annotations

import statistics
import time

from lessonkit.engine.generate import generate
from lessonkit.speculative.gate import conditional_per_pos, measure_cost_curve
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.workloads.requests import CATEGORIES, requests


def rounds(fns: dict, prompts: list, n: int) -> dict:
    """Each contender over all prompts, n rounds, the contenders taking turns within a round (after one warm-up
    prompt each), so load drift on a shared machine hits baseline and contenders alike:
    name -> (wall seconds per round, outputs, stats of the last round)."""
    for fn in fns.values():
        fn(prompts[0])
    walls, last = {name: [] for name in fns}, {}
    for _ in range(n):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = [fn(p) for p in prompts]
            walls[name].append(time.perf_counter() - t0)
    return {name: (walls[name], [r[0] for r in last[name]], [r[1] for r in last[name]]) for name in fns}


def plain_runner(target, max_new: int):
    """prompt -> (plain greedy's tokens, stats)."""
    return lambda p: (lambda r: (r.token_ids, r.stats))(generate(target, p, max_new))


def spec_runner(target, drafter, k, max_new: int, **kw):
    """prompt -> (speculative decoding's tokens, stats) with `drafter` at depth k."""
    return lambda p: (lambda r: (r.token_ids, r.stats))(speculative_generate(target, drafter, p, max_new, k=k, **kw))


def category_table(target, drafters: dict, *, per_category: int = 3, max_new: int = 48, n_rounds: int = 5,
                   k_max: int = 6) -> list[dict]:
    """drafters: name -> (drafter, k). One row per (category, drafter), measured on held-out requests."""
    cost = measure_cost_curve(target, k_max, context_len=64)
    prompts = requests(target, "heldout", per_category)
    rows = []
    for cat in CATEGORIES:
        fns = {"plain": plain_runner(target, max_new)}
        fns |= {name: spec_runner(target, d, k, max_new, cost=cost) for name, (d, k) in drafters.items()}
        runs = rounds(fns, prompts[cat], n_rounds)
        plain_walls, ref, _ = runs["plain"]
        t1 = statistics.median(plain_walls) / max(1, sum(len(o) for o in ref))
        for name in drafters:
            walls, outs, stats = runs[name]
            t = total_stats(stats)
            ratios = sorted(p / w for p, w in zip(plain_walls, walls))
            verifies = max(1, t["num_drafts"])
            k_mean = t["num_draft_tokens"] / verifies
            kk = min(k_max, round(k_mean))
            rows.append({
                "category": cat, "drafter": name, "identical_to_plain": outs == ref,
                "tokens_per_verify": 1 + t["num_accepted_tokens"] / verifies,
                "acceptance_by_position": [round(a, 3) for a in conditional_per_pos(t["num_accepted_tokens_per_pos"],
                                                                                   t["num_drafts"])],
                "mean_draft_depth": round(k_mean, 2),
                "c": (t["draft_s"] / t["num_draft_tokens"]) / (cost[0]) if t["num_draft_tokens"] else None,
                "verify_cost": cost[kk] / cost[0], "plain_s_per_token": t1,
                "speedup": statistics.median(ratios), "speedup_spread": [ratios[0], ratios[-1]]})
    return rows


def table_markdown(rows: list[dict]) -> str:
    head = ("| category | drafter | tokens / verify | acceptance by position | c | T(k+1)/T(1) | speed-up (spread) "
            "| identical |\n|---|---|---|---|---|---|---|---|\n")
    fmt = lambda r: (f"| {r['category']} | {r['drafter']} | {r['tokens_per_verify']:.2f} | "
                     f"{', '.join(f'{a:.2f}' for a in r['acceptance_by_position'][:4])} | "
                     f"{'-' if r['c'] is None else format(r['c'], '.3f')} | {r['verify_cost']:.2f} | "
                     f"{r['speedup']:.2f}x ({r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}) | "
                     f"{'yes' if r['identical_to_plain'] else 'NO'} |")
    return head + "\n".join(fmt(r) for r in rows)
