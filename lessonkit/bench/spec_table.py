"""A Spec-Bench-style table (Xia et al. 2024, arXiv:2401.07851) for `bench spec`: per task category of held-out
requests (lessonkit.workloads.requests: chat, code, records, rewrite; and `structured` from
lessonkit.workloads.structured: records rewritten field by field, NDJSON lines, tickets scored behind one system
prompt) and per drafter, plain greedy and the drafter take turns within every round; the row reports mean accepted
tokens per verify, acceptance by draft position, the draft cost c (seconds per draft token over a plain decode step's
of the same rounds; these three over every round, as a gated drafter drafts differently from round to round), the
verify cost T(k+1)/T(1) of the chosen depth, the speed-up end to end and in the decode phase (wall less the prefills'
time to first token, which no drafter shortens; medians of rounds, with the spread) and whether the output equals
plain greedy's in every round.

The structured category also measures the suffix drafter with a store warmed on the workload's training split
(`measure.suffix.warm_suffix_store`: a fresh temporary folder, so every benchmark starts from an empty store) and
measured with learning off, so no held-out request meets a store that holds its own earlier output.
"""
from __future__ import annotations

import statistics

from lessonkit.measure.speculative import plain_runner, spec_runner, take_turns
from lessonkit.measure.suffix import SUFFIX_K, warm_suffix_store  # noqa: F401  (bench spec's, from here)
from lessonkit.speculative.gate import acceptance_by_position, measure_cost_curve
from lessonkit.speculative.verify import total_stats
from lessonkit.workloads.requests import CATEGORIES, requests
from lessonkit.workloads.structured import structured_prompts


def plain_step_s(stats: list[dict]) -> float:
    """Plain greedy's seconds per decode step over runs' stats (wall less time to first token, over the forwards
    after the prefill's): c's denominator, from the same rounds as the draft seconds, so a host whose speed drifts
    between the cost curve's measurement and the round moves both alike."""
    return (sum(s["wall_s"] - s["ttft_s"] for s in stats) / max(1, sum(s["forwards"] - 1 for s in stats)))


def _category_rows(cat: str, runs: dict, drafters, cost) -> list[dict]:
    """The rows of one category from its rounds (cost: the verify cost curve, seconds of 1 .. K+1 rows)."""
    plain_walls, plain_decode, ref, plain_stats = runs["plain"]
    t1 = statistics.median(plain_walls) / max(1, sum(len(o) for o in ref))
    step = plain_step_s(plain_stats)
    rows = []
    for name in drafters:
        walls, decode, outs, stats = runs[name]
        t = total_stats(stats)
        ratios = sorted(p / w for p, w in zip(plain_walls, walls))
        decode_ratios = sorted(p / w for p, w in zip(plain_decode, decode))
        verifies = max(1, t["num_drafts"])
        k_mean = t["num_draft_tokens"] / verifies
        kk = min(len(cost) - 1, round(k_mean))
        rows.append({
            "category": cat, "drafter": name, "identical_to_plain": outs == ref,
            "tokens_per_verify": 1 + t["num_accepted_tokens"] / verifies,
            "acceptance_by_position": [round(a, 3) for a in acceptance_by_position(t)],
            "mean_draft_depth": round(k_mean, 2),
            "c": (t["draft_s"] / t["num_draft_tokens"]) / step if t["num_draft_tokens"] else None,
            "verify_cost": cost[kk] / cost[0], "plain_s_per_token": t1,
            "speedup": statistics.median(ratios), "speedup_spread": [ratios[0], ratios[-1]],
            "decode_speedup": statistics.median(decode_ratios),
            "decode_speedup_spread": [decode_ratios[0], decode_ratios[-1]]})
    return rows


def category_table(target, drafters: dict, *, per_category: int = 3, max_new: int = 48, n_rounds: int = 5,
                   k_max: int = 6, categories=CATEGORIES, structured: dict | None = None) -> list[dict]:
    """drafters: name -> (drafter, k). One row per (category, drafter), measured on held-out requests.
    structured: name -> (drafter, k), measured besides `drafters` on the structured category (per_category
    held-out requests, the families taking turns); None leaves that category out."""
    fixed = [k for _, k in (drafters | (structured or {})).values() if isinstance(k, int)]
    cost = measure_cost_curve(target, max([k_max, *fixed]), context_len=64)    # T(k+1) of every fixed depth too
    prompts = requests(target, "heldout", per_category) if categories else {}
    todo = [(cat, prompts[cat], drafters) for cat in categories]
    if structured is not None:
        held = structured_prompts(target, "heldout", -(-per_category // 3))[:per_category]
        todo.append(("structured", held, drafters | structured))
    rows = []
    for cat, cat_prompts, cat_drafters in todo:
        for d, _ in cat_drafters.values():      # each category is a session of its own: the utility gate starts
            d.gate_memory = None                # afresh (its memory would carry the last category's decision)
        fns = {"plain": plain_runner(target, max_new)}           # the depth gates' curve stops at k_max
        fns |= {name: spec_runner(target, d, k, max_new, cost=cost[:k_max + 1])
                for name, (d, k) in cat_drafters.items()}
        rows += _category_rows(cat, take_turns(fns, cat_prompts, n_rounds, every_round=True), cat_drafters, cost)
    return rows


def table_markdown(rows: list[dict]) -> str:
    head = ("| category | drafter | tokens / verify | acceptance by position | c | T(k+1)/T(1) | speed-up (spread) "
            "| decode phase (spread) | identical |\n|---|---|---|---|---|---|---|---|---|\n")
    fmt = lambda r: (f"| {r['category']} | {r['drafter']} | {r['tokens_per_verify']:.2f} | "
                     f"{', '.join(f'{a:.2f}' for a in r['acceptance_by_position'][:4])} | "
                     f"{'-' if r['c'] is None else format(r['c'], '.3f')} | {r['verify_cost']:.2f} | "
                     f"{r['speedup']:.2f}x ({r['speedup_spread'][0]:.2f}-{r['speedup_spread'][1]:.2f}) | "
                     f"{r['decode_speedup']:.2f}x ({r['decode_speedup_spread'][0]:.2f}-{r['decode_speedup_spread'][1]:.2f}) | "
                     f"{'yes' if r['identical_to_plain'] else 'NO'} |")
    return head + "\n".join(fmt(r) for r in rows)
