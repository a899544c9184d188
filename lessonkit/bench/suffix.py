"""`lessonkit bench suffix`: the suffix drafter (SuffixDecoding) on held-out structured requests (issue 58).

Per model (smollm2-135m; tiny-moe on the same requests in plain text), side by side in one process:
  plain greedy                      the baseline;
  prompt lookup (ngram, k=4)        the other drafter that costs nothing;
  suffix, empty store               the request alone (prompt and output so far);
  suffix, store of N tokens         warmed on the training split (lessonkit.workloads.structured), a few sizes
                                    (the store's size against its gain: SuffixDecoding's curve).
The store is warmed with the suffix drafter itself (learning: the target's verified outputs), saved to a
fresh temporary folder and loaded back, then measured with learning off: no held-out request is ever
measured against a store that holds its own earlier output. The contenders take turns within each of
>= 5 rounds (load drift on a shared machine hits all alike); speed-ups are medians of the per-round ratios
to plain greedy, with their spread (min .. max). Each row reports tokens per verify, the share of verify
steps with no draft, the drafter's time per step and whether every output equals plain greedy's.
"""
from __future__ import annotations

import statistics
import tempfile
import time

import torch

from lessonkit.bench.common import goal, machine_info
from lessonkit.bench.spec_table import plain_runner, spec_runner
from lessonkit.engine import kernel
from lessonkit.errors import LessonkitError
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import NGramDrafter
from lessonkit.speculative.gate import cost_curve
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.speculative.suffix_store import SuffixStore
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.structured import structured_prompts

SUFFIX_K = 8                        # the most drafts a step may verify; the drafter's own rule picks fewer
STORE_SHARES = (0.125, 0.5, 1.0)    # store sizes: these shares of the training split's outputs


def _rounds(fns: dict, prompts, repeats: int) -> dict:
    """Each contender over all prompts, `repeats` rounds, taking turns within a round (after one warm-up
    prompt each): name -> (per-round seconds, per-round decode seconds (wall less the prefills' time to
    first token), outputs, stats) of the last round."""
    for fn in fns.values():
        fn(prompts[0])
    walls, decode, last = {name: [] for name in fns}, {name: [] for name in fns}, {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = [fn(p) for p in prompts]
            walls[name].append(time.perf_counter() - t0)
            decode[name].append(walls[name][-1] - sum(r[1]["ttft_s"] for r in last[name]))
    return {name: (walls[name], decode[name], [r[0] for r in last[name]], [r[1] for r in last[name]]) for name in fns}


def _warm(target, train, max_new: int) -> tuple[SuffixStore, float]:
    """A store warmed on the training split (the suffix drafter learning from the target's verified outputs),
    saved in a fresh folder and loaded back as a restarted process would; (store, seconds)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="suffix-bench-") as folder:
        store = SuffixStore.for_target(target, folder, max_tokens=1 << 20)
        if len(store):
            raise LessonkitError(f"the benchmark's fresh store folder {folder} is not empty")
        drafter = SuffixDrafter(store)
        for p in train:
            speculative_generate(target, drafter, p, max_new, k=SUFFIX_K)
        store.save()
        store = SuffixStore.for_target(target, folder, max_tokens=1 << 20)
    return store, time.perf_counter() - t0


def _sized(full: SuffixStore, share: float) -> SuffixStore:
    """A store holding the first `share` of the full store's outputs (by tokens), not saved anywhere."""
    limit, store = int(full.n_tokens * share), SuffixStore(None, full.key, max_tokens=full.max_tokens)
    for out in full.outputs:
        if store.n_tokens + len(out) > limit:
            break
        store.add(out)
    return store


def _contenders(target, store, max_new: int) -> tuple[dict, dict]:
    plain, spec = plain_runner(target, max_new), lambda drafter, k: spec_runner(target, drafter, k, max_new)
    fns = {"plain greedy": plain, "prompt lookup (ngram, k=4)": spec(NGramDrafter(), 4),
           "suffix, empty store": spec(SuffixDrafter(None, learn=False), SUFFIX_K)}
    stores = {}
    for share in STORE_SHARES:
        s = _sized(store, share)
        name = f"suffix, store {s.n_tokens} tokens"
        stores[name] = s
        fns[name] = spec(SuffixDrafter(s, learn=False), SUFFIX_K)
    return fns, stores


def _step_stats(stats, cost) -> dict:
    """Tokens per verify, share of steps with no draft, acceptance, drafter ms per step, and the speed-up the
    verify cost curve predicts from the steps' depths (plain: one 1-row forward a token; loop overheads left out)."""
    steps = sum(sum(s["k_hist"].values()) for s in stats)
    verifies = sum(s["forwards"] - 1 for s in stats)
    drafted = sum(s["num_draft_tokens"] for s in stats)
    spec_s = sum(n * cost[min(k, len(cost) - 1)] for s in stats for k, n in s["k_hist"].items())
    plain_s = sum(s["new_tokens"] - 1 for s in stats) * cost[0]
    return {"tokens_per_verify": round(sum(s["new_tokens"] - 1 for s in stats) / max(verifies, 1), 3),
            "no_draft_share": round(sum(s["k_hist"].get(0, 0) for s in stats) / max(steps, 1), 3),
            "acceptance_rate": round(sum(s["num_accepted_tokens"] for s in stats) / max(drafted, 1), 3),
            "draft_ms_per_step": round(1000 * sum(s["draft_s"] for s in stats) / max(steps, 1), 4),
            "predicted_speedup": round(plain_s / spec_s, 3) if spec_s else None}


def _ratios(plain, walls) -> dict:
    r = [p / w for p, w in zip(plain, walls)]
    return {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3)}


def _row(label: str, name: str, run, plain, cost, store=None) -> dict:
    walls, decode, outs, stats = run
    plain_walls, plain_decode, ref = plain
    whole, dec = _ratios(plain_walls, walls), _ratios(plain_decode, decode)
    row = {"name": f"{label}: {name}", "speedup": whole["median"], "speedup_min": whole["min"],
           "speedup_max": whole["max"], "decode_speedup": dec["median"], "decode_speedup_min": dec["min"],
           "decode_speedup_max": dec["max"], "wall_s": round(statistics.median(walls), 3),
           "identical_to_plain": outs == ref, "new_tokens": sum(len(o) for o in outs)}
    if stats and stats[0].get("k_hist") is not None:
        row.update(_step_stats(stats, cost))
    if store is not None:
        row.update({"store_tokens": store.n_tokens, "store_outputs": len(store), "store_nodes": store.trie.nodes})
    return row


def _section(label: str, target, sizes: dict, repeats: int, rows, targets, notes) -> None:
    held = structured_prompts(target, "heldout", sizes["heldout"])
    train = structured_prompts(target, "train", sizes["train"])
    store, warm_s = _warm(target, train, sizes["max_new"])
    notes.append(f"{label}: store warmed on {len(train)} training requests ({store.n_tokens} tokens, "
                 f"{store.trie.nodes} trie nodes) in {warm_s:.1f} s; measured on {len(held)} held-out requests, "
                 f"{sizes['max_new']} new tokens at most, {repeats} rounds")
    fns, stores = _contenders(target, store, sizes["max_new"])
    runs = _rounds(fns, held, repeats)
    cost = cost_curve(target, SUFFIX_K)
    notes.append(f"{label}: verify cost curve (1 .. {SUFFIX_K + 1} rows, ms): " + " ".join(f"{1000 * c:.2f}" for c in cost))
    plain = runs["plain greedy"][0], runs["plain greedy"][1], runs["plain greedy"][2]
    for name, run in runs.items():
        rows.append(_row(label, name, run, plain, cost, stores.get(name)))
    best = max((r for r in rows if r["name"].startswith(f"{label}: suffix, store")), key=lambda r: r["speedup"])
    for what, key in (("speed-up", "speedup"), ("decode-phase speed-up", "decode_speedup")):
        targets.append(goal(f"{label}: suffix drafter (warm store) {what} over plain greedy on held-out structured "
                            "requests", best[key], ">= 2.0", best[key] >= 2.0))


def bench(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    repeats = 1 if smoke else max(5, int(getattr(args, "repeats", 5) or 5))
    sizes = ({"heldout": 1, "train": 1, "max_new": 12} if smoke else {"heldout": 4, "train": 36, "max_new": 48})
    rows, targets, notes = [], [], []
    _section("smollm2-135m", load_model(getattr(args, "model", None) or "smollm2-135m"), sizes, repeats,
             rows, targets, notes)
    try:
        moe = load_model("tiny-moe", weights="q8_0" if kernel.NUMERICS == "int8" else None)
    except LessonkitError as e:
        notes.append(f"tiny-moe skipped: {e}")
    else:
        _section("tiny-moe", moe, {**sizes, "max_new": min(sizes["max_new"], 32)}, repeats, rows, targets, notes)
    for r in rows:
        if not r["identical_to_plain"]:
            notes.append(f"NOT IDENTICAL: {r['name']}")
    return {"bench": "suffix", "machine": {**machine_info(), "torch_threads": torch.get_num_threads()},
            "smoke": smoke, "rows": rows, "targets": targets, "notes": notes}
