"""`lessonkit bench suffix`: the suffix drafter (SuffixDecoding) on held-out structured requests (issue 58).

Sections, each side by side in one process (lessonkit.workloads.structured; the store warmed on its training split):
  smollm2-135m              one item a request (a record, a small table, a ticket: answers of 20-45 tokens);
  smollm2-135m, batches     BATCH items a request (longer answers behind a prompt of about the same length);
  smollm2-135m, behind a prefix cache   the first section's requests, store and contenders with a persistent prefix
                            cache in front of every arm (plain greedy too): each family's system turn and worked
                            example restored from disk, only the request's item prefilled, as a batch scorer runs them;
  tiny-moe                  one item a request, in plain text (it has no chat template).
Contenders in each: plain greedy (the baseline); prompt lookup (ngram, k=4), the other drafter that costs
nothing; the suffix drafter with an empty store (the request alone) and with a store holding 25%, 50% and 100%
of the training split's outputs (the store's size against its gain: SuffixDecoding's curve); and the full store
with the cost-aware depth (lessonkit.speculative.suffix: each draft cut where expected tokens per verify-second
peak, on this engine's measured verify cost curve). The batch section runs plain, prompt lookup and the full
store only.

The store is warmed with the suffix drafter itself (learning: the target's verified outputs) in a fresh temporary
folder (an empty store at the start of every run), saved and loaded back, then measured with learning off: no
held-out request is ever measured against a store that holds its own earlier output. (The cost-aware drafter's
four acceptance rates are learned online over the measured requests, as in use; the store's contents are not.)
The contenders take turns within each of >= 5 rounds (load drift on a shared machine hits all alike);
speed-ups are medians of the per-round ratios to plain greedy, with their spread (min .. max).

Each row is also a profile of where the time goes: tokens per verify, the share of steps with no draft,
acceptance, the mean draft depth and the verify cost T(k+1)/T(1) at that depth, the shares of the wall time spent
in prefill (time to first token), drafting and verify forwards (the rest: the loop's own work), and the breakdown:
the decode-phase speed-up the verify cost curve gives for the run's own steps at their depths (a breakdown of the
same run, not a prediction made apart from it). `depth_bound` per section: the decode-phase speed-up that no depth
rule over the suffix drafter's continuations could pass (an oracle replay of the plain outputs). `curve` lists the
store's size against its gain; `table_markdown` is the rows as tables.
"""
from __future__ import annotations

import statistics
import tempfile

import torch

from lessonkit.bench.common import goal
from lessonkit.engine import kernel
from lessonkit.errors import LessonkitError
from lessonkit.measure.speculative import plain_runner, spec_runner, speedup_ratios, take_turns
from lessonkit.measure.suffix import (STORE_SHARES, SUFFIX_K, SharedPrefix, step_profile, store_contenders,
                                     warm_suffix_store)
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import NGramDrafter
from lessonkit.speculative.gate import measure_cost_curve
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.workloads.structured import structured_prompts
from lessonkit.engine.machine import machine_record

BATCH = 4                           # items a request in the batch section
COST_AWARE = "suffix, full store, cost-aware depth"


def verify_costs(target, repeats: int = 30) -> list[float]:
    """Seconds of a verify forward of 1 .. SUFFIX_K+1 rows: the minimum of many interleaved rounds (on shared cores
    the minimum is the cost, the rest interference), made non-decreasing (a row more never costs less)."""
    cost = measure_cost_curve(target, SUFFIX_K, context_len=128, repeats=repeats)
    return [max(cost[:i + 1]) for i in range(len(cost))]


def _contenders(target, store, max_new: int, cost, shares=STORE_SHARES) -> tuple[dict, dict]:
    """name -> runner, and name -> the store of each suffix row (the curve's points; the empty store's when
    shares has more than one size)."""
    fns = {"plain greedy": plain_runner(target, max_new),
           "prompt lookup (ngram, k=4)": spec_runner(target, NGramDrafter(), 4, max_new)}
    suffix, stores = store_contenders(target, store, max_new, shares, empty=len(shares) > 1)
    fns |= suffix
    fns[COST_AWARE] = spec_runner(target, SuffixDrafter(store, learn=False, cost=cost), SUFFIX_K, max_new)
    stores[COST_AWARE] = store
    return fns, stores


def _profile(stats, cost) -> dict:
    """Where a contender's time went (shares of its wall time; the rest is the loop's own work) and its steps:
    tokens per verify, steps with no draft, acceptance, draft depth and its verify cost, and the breakdown: the
    decode-phase speed-up the verify cost curve gives for this run's own steps at their depths (plain: one 1-row
    forward a token; loop overheads left out). It explains the run from its parts; it predicts nothing."""
    wall = sum(s["wall_s"] for s in stats) or 1.0
    prof = {"prefill_share": round(sum(s["ttft_s"] for s in stats) / wall, 3)}
    if stats[0].get("k_hist") is None:
        return prof
    steps = step_profile(stats)
    n_steps = sum(sum(s["k_hist"].values()) for s in stats)
    spec_s = sum(n * cost[min(k, len(cost) - 1)] for s in stats for k, n in s["k_hist"].items())
    plain_s = sum(s["new_tokens"] - 1 for s in stats) * cost[0]
    return {**prof, "draft_share": round(sum(s["draft_s"] for s in stats) / wall, 4),
            "verify_share": round(sum(s["verify_s"] for s in stats) / wall, 3), **steps,
            "verify_cost": round(cost[min(round(steps["mean_draft_depth"]), len(cost) - 1)] / cost[0], 2),
            "draft_ms_per_step": round(1000 * sum(s["draft_s"] for s in stats) / max(n_steps, 1), 4),
            "breakdown_speedup": round(plain_s / spec_s, 3) if spec_s else None}


def _row(label: str, name: str, run, plain, cost, store=None) -> dict:
    walls, decode, outs, stats = run
    plain_walls, plain_decode, ref = plain
    whole, dec = speedup_ratios(plain_walls, walls), speedup_ratios(plain_decode, decode)
    row = {"section": label, "name": f"{label}: {name}", "contender": name, "speedup": whole["median"],
           "speedup_min": whole["min"], "speedup_max": whole["max"], "decode_speedup": dec["median"],
           "decode_speedup_min": dec["min"], "decode_speedup_max": dec["max"],
           "wall_s": round(statistics.median(walls), 3), "identical_to_plain": outs == ref,
           "new_tokens": sum(len(o) for o in outs), **_profile(stats, cost)}
    if store is not None:
        row.update({"store_tokens": store.n_tokens, "store_outputs": len(store), "store_nodes": store.trie.nodes})
    return row


def _section(label: str, target, sizes: dict, repeats: int, out: dict, shares=STORE_SHARES) -> dict:
    """One section's rows, curve, depth bound and goals into `out`; returns what a section behind the prefix cache
    reuses (the requests, the warm store, the cost curve, plain greedy's outputs)."""
    per = sizes.get("per_request", 1)
    held = structured_prompts(target, "heldout", sizes["heldout"], per_request=per)
    train = structured_prompts(target, "train", sizes["train"], per_request=per)
    store, warm_s = warm_suffix_store(target, train, sizes["max_new"])
    cost = verify_costs(target)
    fns, stores = _contenders(target, store, sizes["max_new"], cost, shares)
    runs = take_turns(fns, held, repeats)
    out["notes"].append(
        f"{label}: store warmed on {len(train)} training requests ({store.n_tokens} tokens, {store.trie.nodes} trie "
        f"nodes) in {warm_s:.1f} s; measured on {len(held)} held-out requests of {per} item(s), {sizes['max_new']} "
        f"new tokens at most, {repeats} rounds; verify cost curve (1 .. {SUFFIX_K + 1} rows, ms): "
        + " ".join(f"{1000 * c:.2f}" for c in cost))
    plain = runs["plain greedy"][:3]
    out["depth_bound"][label] = depth_bound(store, held, plain[2], cost)
    rows = [_row(label, name, run, plain, cost, stores.get(name)) for name, run in runs.items()]
    out["rows"] += rows
    out["curve"] += [{"section": label, "store_tokens": r["store_tokens"], "contender": r["contender"],
                      **{k: r[k] for k in ("speedup", "decode_speedup", "tokens_per_verify", "no_draft_share")}}
                     for r in rows if "store_tokens" in r and r["contender"] != COST_AWARE]
    _goals(label, rows, out)
    return {"held": held, "train": train, "store": store, "cost": cost, "plain_outputs": plain[2]}


def _goals(label: str, rows: list[dict], out: dict) -> None:
    best = max((r for r in rows if r["contender"].startswith("suffix")), key=lambda r: r["speedup"])
    for what, key in (("speed-up", "speedup"), ("decode-phase speed-up", "decode_speedup")):
        out["targets"].append(goal(f"{label}: suffix drafter ({best['contender']}) {what} over plain greedy on "
                                   "held-out structured requests", best[key], ">= 2.0", best[key] >= 2.0))


def _prefix_section(label: str, target, made: dict, max_new: int, repeats: int, out: dict) -> None:
    """The same held-out requests with a persistent prefix cache in front of every arm (measure.suffix.SharedPrefix,
    in a fresh temporary folder): each family's system turn and worked example restored from disk, so plain greedy
    and the drafters prefill only the request's own item, as a batch scorer runs them. Plain greedy behind the cache
    is the baseline; the note says whether its outputs equal those of plain greedy without it."""
    store, cost, held = made["store"], made["cost"], made["held"]
    with tempfile.TemporaryDirectory(prefix="prefix-bench-") as folder:
        shared = SharedPrefix(target, held + made["train"], folder)
        fns = {"plain greedy": shared.runner(max_new),
               "prompt lookup (ngram, k=4)": shared.runner(max_new, NGramDrafter(), 4),
               "suffix, full store": shared.runner(max_new, SuffixDrafter(store, learn=False)),
               COST_AWARE: shared.runner(max_new, SuffixDrafter(store, learn=False, cost=cost))}
        runs = take_turns(fns, held, repeats)
    plain = runs["plain greedy"][:3]
    rows = [_row(label, name, run, plain, cost, store if name.startswith("suffix") else None)
            for name, run in runs.items()]
    out["rows"] += rows
    n = [shared.lengths[tuple(p)] for p in held]
    out["notes"].append(
        f"{label}: shared prefixes of {min(n)} .. {max(n)} tokens restored from the prefix cache before every run "
        f"(prompts of {min(map(len, held))} .. {max(map(len, held))} tokens); plain greedy's outputs behind the cache "
        f"{'equal' if plain[2] == made['plain_outputs'] else 'DIFFER from'} its outputs without it")
    _goals(label, rows, out)


def depth_bound(store, prompts, outputs, cost, k: int = SUFFIX_K) -> float:
    """The decode-phase speed-up no depth rule over these drafts can pass: the plain outputs replayed, each step
    verifying exactly the longer accepted prefix of the two sources' most frequent continuations (an oracle for
    the depth and the source), at the cost curve's price; plain pays T(1) a token. Loop overheads left out."""
    drafter, spec_s, plain_s = SuffixDrafter(store, learn=False), 0.0, 0.0
    for prompt, ref in zip(prompts, outputs):
        drafter.reset(prompt)
        context, pos = list(prompt) + ref[:1], 1
        while pos < len(ref):
            room = min(k, len(ref) - pos - 1, len(cost) - 1)
            n = 0
            for _, toks, _ in (drafter.continuations(context, room) if room > 0 else []):
                m = next((i for i, (a, b) in enumerate(zip(toks, ref[pos:])) if a != b), min(len(toks), len(ref) - pos))
                n = max(n, m)
            context += ref[pos:pos + n + 1]
            pos += n + 1
            spec_s += cost[n]
        plain_s += (len(ref) - 1) * cost[0]
    return round(plain_s / spec_s, 3) if spec_s else 1.0


def _fmt(r: dict, key: str, spec: str = ".2f", unit: str = "") -> str:
    v = r.get(key)
    return "-" if v is None else f"{v:{spec}}{unit}"


def table_markdown(rows: list[dict]) -> str:
    """One markdown table per section: speed-ups with their spread, then the profile."""
    head = ("| {s} | speed-up | decode phase | tokens / verify | no draft | acceptance | draft depth | T(k+1)/T(1) "
            "| prefill | drafting | breakdown | identical |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    parts = []
    for section in dict.fromkeys(r["section"] for r in rows):
        lines = [head.format(s=section)]
        for r in (r for r in rows if r["section"] == section):
            lines.append(
                f"| {r['contender']} | {r['speedup']:.2f}x ({r['speedup_min']:.2f} .. {r['speedup_max']:.2f}) "
                f"| {r['decode_speedup']:.2f}x ({r['decode_speedup_min']:.2f} .. {r['decode_speedup_max']:.2f}) "
                f"| {_fmt(r, 'tokens_per_verify')} | {_fmt(r, 'no_draft_share', '.1%')} | {_fmt(r, 'acceptance_rate')} "
                f"| {_fmt(r, 'mean_draft_depth')} | {_fmt(r, 'verify_cost')} | {_fmt(r, 'prefill_share', '.0%')} "
                f"| {_fmt(r, 'draft_share', '.1%')} | {_fmt(r, 'breakdown_speedup', '.2f', 'x')} "
                f"| {'yes' if r['identical_to_plain'] else 'NO'} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def bench(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    repeats = 1 if smoke else max(5, int(getattr(args, "repeats", 5) or 5))
    sizes = ({"heldout": 1, "train": 1, "max_new": 12} if smoke else {"heldout": 4, "train": 36, "max_new": 48})
    batch = ({"heldout": 1, "train": 1, "max_new": 24} if smoke else {"heldout": 2, "train": 9, "max_new": 192})
    out = {"rows": [], "targets": [], "notes": [], "curve": [], "depth_bound": {}}
    sm = load_model(getattr(args, "model", None) or "smollm2-135m")
    made = _section(sm.name, sm, sizes, repeats, out)
    _prefix_section(f"{sm.name}, behind a prefix cache", sm, made, sizes["max_new"], repeats, out)
    _section(f"{sm.name}, batches of {BATCH}", sm, {**batch, "per_request": BATCH}, repeats, out, shares=(1.0,))
    try:
        moe = load_model("tiny-moe", weights="q8_0" if kernel.NUMERICS == "int8" else None)
    except LessonkitError as e:
        out["notes"].append(f"tiny-moe skipped: {e}")
    else:
        moe_sizes = {**sizes, "max_new": min(sizes["max_new"], 32)}
        made = _section("tiny-moe", moe, moe_sizes, repeats, out)
        _prefix_section("tiny-moe, behind a prefix cache", moe, made, moe_sizes["max_new"], repeats, out)
    for r in out["rows"]:
        if not r["identical_to_plain"]:
            out["notes"].append(f"NOT IDENTICAL: {r['name']}")
    return {"bench": "suffix", "machine": {**machine_record(), "torch_threads": torch.get_num_threads()},
            "smoke": smoke, **out, "table_markdown": table_markdown(out["rows"])}
