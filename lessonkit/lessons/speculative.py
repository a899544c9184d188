"""Lesson 1 (speculative decoding): the experiments and figures of notebooks/01_speculative.ipynb.

Each experiment returns a DataFrame and a matplotlib Figure:
  acceptance_by_kind   acceptance and per-position acceptance for each drafter x kind of text
  speedup_vs_k         measured speed-up against k, next to Leviathan's formula (measured a, c) and the
                       refined prediction (per-position acceptance + measured verify cost curve)
  break_even_surface   speed-up over acceptance (oracle error rate) x expert budget x depth, with unique
                       experts and bytes read per emitted token: where speculation loses when disk-bound
  sampling_tv          the emitted distribution of the correct and of a broken sampler, against the target's
"""
from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lessonkit.engine.engine import Engine
from lessonkit.engine.errors import LessonkitError
from lessonkit.engine.generate import generate, probs_from_logits
from lessonkit.engine.registry import load_model
from lessonkit.engine.draft_step import why_not
from lessonkit.lessons.figures import integer_axis, legend_beside
from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.speculative.drafters import ModelDrafter, OracleDrafter
from lessonkit.speculative.gate import (conditional_per_pos, expected_tokens, expected_tokens_per_pos, leviathan_speedup,
                                        measure_cost_curve, predicted_speedup)
from lessonkit.speculative.verify import speculative_generate, total_stats, verify_sampling
from lessonkit.stack import make_drafter
from lessonkit.workloads.corpus import prompts_by_kind


def _verify_rows(target, drafter, context: list[int], k: int):
    """(draft, target picks) of one verify step after `context`."""
    drafter.reset(list(context))
    draft = list(drafter.propose(list(context), k).tokens)[:k]
    cache = target.new_cache(len(context) + k + 2)
    target.forward(context[:-1], cache)
    logits = target.forward([context[-1], *draft], cache)
    return draft, [int(torch.argmax(row)) for row in logits]


def trace_verify_step(target, drafter, prompt: list[int], *, k: int = 4, search: int = 24) -> pd.DataFrame:
    """One verify step, traced: the drafter proposes k tokens after the text so far; one forward of the target
    over the last token and the k drafts gives its own greedy pick at each of the k+1 rows; drafts are
    accepted while they equal the target's pick, and the first mismatch (or the row after the last draft)
    emits the target's pick instead: the bonus token. The step shown is the first one along the prompt's
    greedy continuation (up to `search` tokens in) where some drafts are accepted and one is rejected, else
    the first step. One row per position, with the tokens as text; attrs["context_tokens"] says where."""
    cont = generate(target, prompt, search).token_ids
    chosen = None
    for n in range(len(cont) + 1):
        draft, picks = _verify_rows(target, drafter, list(prompt) + cont[:n], k)
        acc = next((i for i, (d, t) in enumerate(zip(draft, picks)) if d != t), len(draft))
        if chosen is None or 0 < acc < len(draft):
            chosen = (n, draft, picks)
        if 0 < acc < len(draft):
            break
    n, draft, picks = chosen
    rows, accepting = [], True
    for i in range(len(draft) + 1):
        d = draft[i] if i < len(draft) else None
        ok = accepting and d is not None and d == picks[i]
        emitted = d if ok else (picks[i] if accepting else None)
        rows.append({"row": i, "drafted": "" if d is None else repr(target.decode([d])),
                     "target picks": repr(target.decode([picks[i]])),
                     "verdict": ("accepted" if ok else "rejected: target's pick is the bonus token" if d is not None
                                 else "bonus token (every draft accepted)") if accepting else "discarded",
                     "emitted": "" if emitted is None else repr(target.decode([emitted]))})
        accepting = ok
    df = pd.DataFrame(rows).set_index("row")
    df.attrs["context_tokens"] = len(prompt) + n
    return df


def first_result_sentence(spec, plain, k: int) -> str:
    """The first result of lesson 1 in words, from one speculative and one plain run of the same prompt."""
    st = spec.stats
    return (f"{st['new_tokens']} tokens in {st['forwards']} target forwards instead of {plain.stats['forwards']}: "
            f"{st['num_drafts']} verify steps of k = {k} drafts each, {st['num_accepted_tokens']} of "
            f"{st['num_draft_tokens']} drafted tokens accepted ({st['acceptance_rate']:.0%}), "
            f"{st['tokens_per_forward']:.2f} tokens per forward; identical to plain greedy: "
            f"{spec.token_ids == plain.token_ids}.")


def acceptance_by_kind(target, drafters: dict, prompts: dict[str, list[list[int]]], *, k: int = 4,
                       max_new_tokens: int = 32):
    """Greedy runs of every drafter on every prompt; returns (DataFrame, Figure)."""
    rows = []
    jobs = [(dn, kind) for dn in drafters for kind in prompts]
    for dn, kind in tqdm(jobs, desc="acceptance", leave=False):
        sts = [speculative_generate(target, drafters[dn], p, max_new_tokens, k=k).stats for p in prompts[kind]]
        t = total_stats(sts)
        cond = conditional_per_pos(t["num_accepted_tokens_per_pos"], t["num_drafts"])
        rows.append({"drafter": dn, "kind": kind, "acceptance_rate": t["acceptance_rate"],
                     "mean_acceptance_length": t["mean_acceptance_length"],
                     "tokens_per_forward": t["tokens_per_forward"], "num_drafts": t["num_drafts"],
                     **{f"a{i + 1}": c for i, c in enumerate(cond)}})
    df = pd.DataFrame(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    piv = df.pivot(index="kind", columns="drafter", values="acceptance_rate")
    piv.plot.bar(ax=ax1, rot=0)
    ax1.set_ylabel("acceptance rate (accepted / drafted)")
    ax1.set_xlabel("kind of text")
    ax1.set_ylim(0, 1)
    legend_beside(ax1, max_inside=0)          # bars reach 1.0 in every group: no free corner inside
    for _, r in df.iterrows():
        ys = [r[f"a{i + 1}"] for i in range(k) if f"a{i + 1}" in r and pd.notna(r[f"a{i + 1}"])]
        ax2.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{r['drafter']} / {r['kind']}")
    ax2.set_xlabel("draft position i")
    ax2.set_ylabel("P(accept i | 1..i-1 accepted)")
    ax2.set_ylim(0, 1.05)
    integer_axis(ax2)
    legend_beside(ax2)
    fig.suptitle(f"Acceptance depends on the drafter and the kind of text (k={k}, greedy, {target.name})")
    fig.tight_layout()
    return df, fig


def _timed_runs(fn, prompts, repeats):
    best = None
    for _ in range(repeats):
        sts = [fn(p).stats for p in prompts]
        tot = total_stats(sts)
        if best is None or tot["wall_s"] < best["wall_s"]:
            best = tot
    return best


def speedup_vs_k(target, drafter, prompts: list[list[int]], *, ks=(1, 2, 3, 4, 6, 8), max_new_tokens: int = 32,
                 repeats: int = 2, cost: list[float] | None = None):
    """Measured speed-up of greedy speculative decoding vs plain greedy, for each k, with predictions.

    a: acceptance at the first draft position (Leviathan assumes i.i.d. acceptance);
    E_iid_a1: E(k) = (1 - a^(k+1)) / (1 - a) predicted from that a; E_tokens_per_verify: 1 + a1 + a1 a2 + ...
    from the per-position acceptance of the same run (next to the measured tokens_per_forward);
    c: measured draft seconds per draft token / plain seconds per token;
    Leviathan: (1 - a^(k+1)) / ((1 - a)(k c + 1));
    refined_speedup (a breakdown, not a prediction: fitted from the same run): `predicted_speedup`: E(k) from
    per-position acceptance, T(k+1)/T(1) from the measured cost curve, the draft time per token, and the
    prefill time that no drafting shortens.
    """
    kmax = max(ks)
    cost = cost if cost is not None else measure_cost_curve(target, kmax)
    best = {}
    for _ in tqdm(range(repeats), desc="speed-up vs k", leave=False):   # plain and every k in each round: drift
        for k in (0, *ks):                                                # lands on all alike; the fastest counts
            fn = (lambda p: generate(target, p, max_new_tokens)) if k == 0 else \
                (lambda p, k=k: speculative_generate(target, drafter, p, max_new_tokens, k=k))
            tot = _timed_runs(fn, prompts, 1)
            if k not in best or tot["wall_s"] < best[k]["wall_s"]:
                best[k] = tot
    plain, runs = best[0], {k: best[k] for k in ks}
    t_tok = plain["wall_s"] / plain["new_tokens"]
    deep = runs[kmax]
    cond = conditional_per_pos(deep["num_accepted_tokens_per_pos"], deep["num_drafts"])
    a = runs[min(ks)]["num_accepted_tokens_per_pos"][0] / max(runs[min(ks)]["num_drafts"], 1)
    rows = []
    for k in ks:
        r = runs[k]
        t_draft = r["draft_s"] / r["num_draft_tokens"] if r["num_draft_tokens"] else 0.0
        c = t_draft / t_tok
        cond_k = conditional_per_pos(r["num_accepted_tokens_per_pos"], r["num_drafts"])
        e_meas = expected_tokens_per_pos(cond_k, k)
        rows.append({"k": k, "measured_speedup": plain["wall_s"] / r["wall_s"],
                     "leviathan_speedup": leviathan_speedup(min(a, 0.999999), k, c),
                     "refined_speedup": predicted_speedup(plain, r, k, cost),
                     "a_first_pos": a, "c": c, "cost_ratio": cost[k] / cost[0],
                     "acceptance_rate": r["acceptance_rate"], "tokens_per_forward": r["tokens_per_forward"],
                     "E_iid_a1": expected_tokens(min(a, 0.999999), k), "E_tokens_per_verify": e_meas, "tokens_per_s": r["tokens_per_s"],
                     "plain_tokens_per_s": plain["tokens_per_s"]})
    df = pd.DataFrame(rows)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(df.k, df.measured_speedup, "o-", label="measured")
    ax1.plot(df.k, df.leviathan_speedup, "s--", label=f"Leviathan (a={a:.2f}, c={df.c.iloc[0]:.2f})")
    ax1.plot(df.k, df.refined_speedup, "^:", label="breakdown: this run's a_i, c and T(k+1)")
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xlabel("draft length k (tokens)")
    ax1.set_ylabel("speed-up over plain greedy (x)")
    legend_beside(ax1, fontsize=8)
    ax2.plot(range(1, len(cond) + 1), cond, "o-", label="P(accept i | previous accepted)")
    ax2.plot(range(1, kmax + 2), [x / cost[0] for x in cost[:kmax + 1]], "s-", label="verify cost T(k+1)/T(1)")
    ax2.set_xlabel("draft position i (acceptance) / verify rows k+1 (cost)")
    ax2.set_ylabel("acceptance probability / cost ratio (x)")
    legend_beside(ax2, fontsize=8)
    for ax in (ax1, ax2):
        integer_axis(ax)
    fig.suptitle(f"Speed-up vs k with {getattr(drafter, 'name', 'drafter')} on {target.name}: "
                 "the i.i.d. formula misses\ndecaying acceptance and rising verify cost")
    fig.tight_layout()
    return df, fig


# the drafters lesson 1 and 2 put side by side, per target: (label, lessonkit.stack.make_drafter spec)
COMPARED_DRAFTERS = {
    "tiny-moe": (("corpus-trained draft", "model:tiny-draft-corpus"), ("distilled draft", "tiny-draft"),
                 ("n-gram lookup", "ngram"), ("MTP head", "mtp"), ("oracle a=0.7", "oracle:0.3")),
    "smollm2-135m": (("distilled draft", "smollm2-draft"), ("n-gram lookup", "ngram"), ("MTP head", "mtp"),
                     ("oracle a=0.7", "oracle:0.3")),
}


def drafter_comparison(target, drafters: dict, prompts: list[list[int]], *, k: int = 4, max_new_tokens: int = 32,
                       repeats: int = 2, cost: list[float] | None = None):
    """Every drafter on one target at draft length k, side by side in one process: per-position acceptance
    a_1..a_k, acceptance rate, draft cost c (draft seconds per draft token / plain seconds per token),
    measured speed-up over plain greedy (the fastest of `repeats` rounds; plain and every drafter run in each
    round, so drift lands on all alike) and the breakdown from the same run's numbers (refined_speedup: fitted
    from that run, so it explains the measurement, it does not predict it).

    drafters: {label: Drafter}. Returns (DataFrame, Figure); identical_to_plain checks every run's tokens."""
    df = drafter_table(target, drafters, prompts, k=k, max_new_tokens=max_new_tokens, repeats=repeats, cost=cost)
    return df, plot_drafter_comparison(df)


def drafter_table(target, drafters: dict, prompts: list[list[int]], *, k: int = 4, max_new_tokens: int = 32,
                  repeats: int = 2, cost: list[float] | None = None) -> pd.DataFrame:
    """drafter_comparison's table, without its figure."""
    cost = cost if cost is not None else measure_cost_curve(target, k)
    ref = {i: generate(target, p, max_new_tokens).token_ids for i, p in enumerate(prompts)}
    best, same = {}, {name: True for name in drafters}
    for _ in tqdm(range(repeats), desc=f"drafters on {target.name}", leave=False):
        for name in ["plain", *drafters]:
            if name == "plain":
                res = [generate(target, p, max_new_tokens) for p in prompts]
            else:
                res = [speculative_generate(target, drafters[name], p, max_new_tokens, k=k) for p in prompts]
                same[name] &= all(r.token_ids == ref[i] for i, r in enumerate(res))
            tot = total_stats([r.stats for r in res])
            if name not in best or tot["wall_s"] < best[name]["wall_s"]:
                best[name] = tot
    plain = best["plain"]
    t_tok = plain["wall_s"] / plain["new_tokens"]
    rows = []
    for name in drafters:
        r = best[name]
        cond = conditional_per_pos(r["num_accepted_tokens_per_pos"], r["num_drafts"])
        rows.append({"model": target.name, "drafter": name, "k": k, "acceptance_rate": r["acceptance_rate"],
                     **{f"a{i + 1}": a for i, a in enumerate(cond)},
                     "c": (r["draft_s"] / r["num_draft_tokens"] / t_tok) if r["num_draft_tokens"] else 0.0,
                     "measured_speedup": plain["wall_s"] / r["wall_s"],
                     "refined_speedup": predicted_speedup(plain, r, k, cost),
                     "identical_to_plain": same[name]})
    return pd.DataFrame(rows)


def plot_drafter_comparison(df: pd.DataFrame):
    """Left: acceptance per draft position; right: measured speed-up next to the refined prediction."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    pos = sorted((c for c in df.columns if c[0] == "a" and c[1:].isdigit()), key=lambda c: int(c[1:]))
    for _, r in df.iterrows():
        ys = [r[c] for c in pos if pd.notna(r[c])]
        ax1.plot(range(1, len(ys) + 1), ys, marker="o", label=f"{r['model']}: {r['drafter']}")
    ax1.set_xlabel("draft position i")
    ax1.set_ylabel("P(accept i | 1..i-1 accepted)")
    ax1.set_ylim(0, 1.05)
    integer_axis(ax1)
    legend_beside(ax1)
    labels = [f"{r.model}\n{r.drafter}" for r in df.itertuples()]
    x = np.arange(len(df))
    ax2.bar(x - 0.2, df["measured_speedup"], 0.4, label="measured")
    ax2.bar(x + 0.2, df["refined_speedup"], 0.4, label="breakdown (same run's a_i, c, T)", alpha=0.6)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xticks(x, labels, rotation=30, ha="right", fontsize=7)
    ax2.set_ylabel("speed-up over plain greedy (x)")
    legend_beside(ax2, fontsize=8)
    fig.suptitle(f"Drafters side by side (k={int(df['k'].iloc[0])}, greedy): what a drafter's agreement with "
                 "its target buys, and what its cost takes back")
    fig.tight_layout()
    return fig


def compare_drafters(models=("tiny-moe", "smollm2-135m"), *, k: int = 4, n_prompts: int = 2, max_new_tokens: int = 32,
                     repeats: int = 2, seed: int = 0, only: tuple | None = None):
    """drafter_comparison for each model with its COMPARED_DRAFTERS (or the labels in `only`) on corpus prompts
    of the three kinds; a drafter that does not ship is left out with a note. Returns (DataFrame, Figure, notes)."""
    frames, notes = [], []
    for m in models:
        target = load_model(m)
        prompts = [p for ps in prompts_by_kind(target, n=n_prompts, max_tokens=48, seed=seed).values() for p in ps]
        drafters = {}
        for label, spec in COMPARED_DRAFTERS[m]:
            if only is not None and label not in only:
                continue
            try:
                drafters[label] = make_drafter(spec, target, seed=seed, horizon=max_new_tokens + k + 2) \
                    if spec.startswith("oracle") else make_drafter(spec, target)
            except LessonkitError as e:
                notes.append(f"{m}: {label} left out ({e})")
        frames.append(drafter_table(target, drafters, prompts, k=k, max_new_tokens=max_new_tokens, repeats=repeats))
    df = pd.concat(frames, ignore_index=True)
    return df, plot_drafter_comparison(df), notes


def draft_step_comparison(target_name: str = "tiny-moe", draft_name: str = "tiny-draft", *, k: int = 4,
                          n_prompts: int = 2, max_new_tokens: int = 32, repeats: int = 2, seed: int = 0):
    """One drafter, two implementations of its one-token step (drafter_comparison): one C call
    (engine.draft_step) and the PyTorch lean step. Same weights, same proposals; only the draft cost c
    differs, so the speed-up difference is what c alone does. Without the C kernel only the PyTorch row is
    measured and a note says why. Returns (DataFrame, Figure, notes)."""
    target, draft = load_model(target_name), load_model(draft_name)
    prompts = [p for ps in prompts_by_kind(target, n=n_prompts, max_tokens=48, seed=seed).values() for p in ps]
    drafters, notes = {}, []
    reason = why_not(draft.model)
    if reason:
        notes.append(f"{draft_name}: no C step ({reason}); only the PyTorch step is measured")
    else:
        drafters[f"{draft_name}, C step"] = ModelDrafter(draft, step="C")
    drafters[f"{draft_name}, PyTorch step"] = ModelDrafter(draft, step="torch")
    df, fig = drafter_comparison(target, drafters, prompts, k=k, max_new_tokens=max_new_tokens, repeats=repeats)
    return df, fig, notes


def simulate_disk(engine, mb_per_s: float | None) -> None:
    """Make every expert miss cost bytes / (mb_per_s MB/s) of extra wall time (a slow-disk model);
    None restores plain reads (which on this machine come from the page cache at memory speed)."""
    store = engine.store
    if not hasattr(store, "_real_read"):
        store._real_read = store._read
    real = store._real_read
    if mb_per_s is None:
        store._read = real
        return

    def slow_read(key):
        t0 = time.perf_counter()
        t = real(key)
        wait = store._entries[key][1] / (mb_per_s * 2**20) - (time.perf_counter() - t0)
        end = time.perf_counter() + max(wait, 0.0)
        while time.perf_counter() < end:        # busy-wait: sleep() granularity is too coarse here
            pass
        store.io_s += max(wait, 0.0)
        return t
    store._read = slow_read


def break_even_surface(model_dir, prompts: list[list[int]], *, error_rates=(0.0, 0.25, 0.5, 0.75, 1.0),
                       budget_experts=(2, 8, None), ks=(1, 2, 4), max_new_tokens: int = 24,
                       disk_mb_s: float | None = None, dtype=torch.float32):
    """Speed-up of greedy speculative decoding (oracle drafter, so acceptance ~ 1 - error rate) over plain
    greedy at the same expert budget (experts resident per model; None = all), for each depth k, every cell
    measured (a simulated disk busy-waits each miss: slow; lesson 1 uses `disk_cost_model` and measures only
    the cells in `validate_cost_model`). Each run starts from an empty expert cache. Returns (DataFrame, Figure)."""
    rows = []
    oracle_engine = Engine(model_dir, name="oracle", dtype=dtype)          # shared by every oracle drafter
    total = oracle_engine.config.n_layers * oracle_engine.config.n_experts
    for nb in budget_experts:
        for P in error_rates:
            for k in ks:
                rows.append(_measured_cell(model_dir, prompts, nb, P, k, max_new_tokens, disk_mb_s, dtype,
                                           oracle_engine, total))
    df = pd.DataFrame(rows)
    return df, plot_break_even(df, disk_mb_s)


def _measured_cell(model_dir, prompts, nb, P, k, max_new_tokens, disk_mb_s, dtype, oracle_engine, total) -> dict:
    """One cell of the break-even surface, measured: plain and speculative greedy at budget nb (experts per
    model; None = all), oracle error rate P, depth k, on a simulated disk of disk_mb_s MB/s (None: page cache)."""
    mb = None if nb is None else nb * oracle_engine.expert_bytes / 2**20
    eng = Engine(model_dir, name=f"budget-{nb or 'all'}", expert_budget_mb=mb, dtype=dtype)
    simulate_disk(eng, disk_mb_s)

    def run(fn):
        sts = []
        for p in prompts:
            eng.store.clear()
            sts.append(fn(p).stats)
        return total_stats(sts)
    plain = run(lambda p: generate(eng, p, max_new_tokens))
    oracle = OracleDrafter(eng, P, seed=0, horizon=max_new_tokens + k + 2, oracle_engine=oracle_engine)
    t = run(lambda p: speculative_generate(eng, oracle, p, max_new_tokens, k=k))
    return {"budget_experts": nb or total, "budget_frac": (nb or total) / total, "error_rate": P,
            "acceptance": 1 - P, "k": k, "acceptance_rate": t["acceptance_rate"],
            "tokens_per_forward": t["tokens_per_forward"], "speedup": plain["wall_s"] / t["wall_s"],
            "unique_experts_per_token": t["unique_experts_per_token"],
            "plain_unique_experts_per_token": plain["unique_experts_per_token"],
            "bytes_read_per_token": t["bytes_read_per_token"],
            "plain_bytes_read_per_token": plain["bytes_read_per_token"],
            "expert_hit_rate": t["expert_hit_rate"], "plain_expert_hit_rate": plain["expert_hit_rate"]}


# ---- the disk-bound break-even surface from a cost model ------------------------------------------------
#   plain run:       P + (N - 1) * (T(1)   + R(1, B)   * t_read)
#   speculative run: P + (N - 1) / E(a, k) * (T(k+1) + R(k+1, B) * t_read)
# P: the prompt's prefill with its expert reads (the same on both sides), N new tokens (the first comes from
# the prefill), T(r): a forward of r rows with every expert resident (the verify cost curve) plus the measured
# per-step overhead of the decode loop (sampling, stop checks: plain pays it N - 1 times), R(r, B): expert
# misses per forward of r rows at budget B (measured), t_read: one expert miss (page-cache read, measured,
# or bytes / disk speed, whichever is longer: what `simulate_disk` charges), E(a, k) = (1 - a^(k+1)) / (1 - a).

def break_even_acceptance(cost_ratio: float, k: int) -> float | None:
    """The acceptance a* at which E(a*, k) = cost_ratio: speculation at depth k pays for a > a*. cost_ratio is
    what one verify step costs in plain steps (T(k+1)/T(1) + k c, with expert reads when disk-bound).
    0.0 when even a = 0 pays (cost_ratio <= 1); None when no acceptance pays (cost_ratio >= k + 1)."""
    if cost_ratio <= 1.0:
        return 0.0
    if cost_ratio >= k + 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):                            # E(a, k) rises with a: bisect
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < cost_ratio else (lo, mid)
    return (lo + hi) / 2


def break_even_table(cost: list[float], c: float, ks) -> pd.DataFrame:
    """Per k: the verify cost T(k+1)/T(1), the draft cost k c, their sum (what a verify step costs in plain
    steps) and the break-even acceptance a* (speculation pays when E(a, k) is above the sum)."""
    rows = []
    for k in ks:
        ratio = cost[k] / cost[0] + k * c
        rows.append({"k": k, "verify_cost_ratio": cost[k] / cost[0], "draft_cost_kc": k * c,
                     "cost_per_verify_step": ratio, "a_star": break_even_acceptance(ratio, k)})
    return pd.DataFrame(rows)


def _continuation(engine, prompt: list[int], n: int) -> list[int]:
    return generate(engine, prompt, n).token_ids


def _misses_along(eng, prompts, rows_of, r: int, n_tokens: int) -> tuple[float, list[int]]:
    """Expert misses per forward of r rows (from an empty expert cache, after each prompt's prefill), the rows
    taken from rows_of(prompt index, position, r); and each prefill's misses."""
    n_fw = n_miss = 0
    pre = []
    for i, p in enumerate(prompts):
        eng.store.clear()
        eng.store.reset_counters()
        cache = eng.new_cache(len(p) + n_tokens + r + 2)
        eng.forward(p, cache)
        pre.append(eng.store.misses)
        eng.store.reset_counters()
        for pos in range(0, n_tokens - 1, r):
            eng.forward(rows_of(i, pos, r), cache)
            n_fw += 1
        n_miss += eng.store.misses
    return n_miss / max(n_fw, 1), pre


def cost_model_inputs(model_dir, prompts: list[list[int]], *, budget_experts=(2, 6, None), rows=(1, 2, 3, 5),
                      max_new_tokens: int = 48, dtype=torch.float32, repeats: int = 3,
                      cost: list[float] | None = None, seed: int = 0) -> dict:
    """The measured inputs of the disk cost model, in seconds: T(r) (the verify cost curve, every expert
    resident; `cost` if given), the prefill, and per budget the prefill's expert misses and R(r, B): misses per
    forward of r rows from an empty expert cache along each prompt's greedy continuation (the rows an accepted
    draft brings) and along random tokens after the first row (the rows a rejected draft brings: they route
    more widely); the page-cache read time and the bytes of one expert read. No disk is simulated: seconds."""
    full = Engine(model_dir, name="budget-all", dtype=dtype)
    total = full.config.n_layers * full.config.n_experts
    cost = cost if cost is not None else measure_cost_curve(full, max(rows) - 1, repeats=repeats)
    gens = [generate(full, p, max_new_tokens) for p in prompts]
    conts = [g.token_ids for g in gens]
    # a decode step is more than its forward (sampling, stop checks, the cache): that per-step overhead, measured
    step_s = sum(g.stats["wall_s"] - g.stats["ttft_s"] for g in gens) / max(sum(len(c) - 1 for c in conts), 1)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, full.config.vocab_size, (len(prompts), max_new_tokens + max(rows)), generator=gen).tolist()
    prefill_s = []
    for p in prompts:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            full.forward(p, full.new_cache(len(p) + 2))
            best = min(best, time.perf_counter() - t0)
        prefill_s.append(best)
    reads, prefill_reads, io_s, misses, nbytes = {}, {}, 0.0, 0, 0
    for nb in budget_experts:
        mb = None if nb is None else nb * full.expert_bytes / 2**20
        eng = Engine(model_dir, name=f"budget-{nb or 'all'}", expert_budget_mb=mb, dtype=dtype)
        b = nb or total
        for r in rows:
            reads[(b, r, "accepted")], pre = _misses_along(eng, prompts, lambda i, pos, r: conts[i][pos:pos + r], r,
                                                           max_new_tokens)
            reads[(b, r, "rejected")], _ = _misses_along(eng, prompts, lambda i, pos, r: conts[i][pos:pos + 1]
                                                         + noise[i][pos + 1:pos + r], r, max_new_tokens)
        prefill_reads[b] = float(np.mean(pre))
        io_s, misses, nbytes = io_s + eng.store.io_s, misses + eng.store.misses, nbytes + eng.store.bytes_read
    return {"T_s": {r: cost[r - 1] for r in rows}, "prefill_s": float(np.mean(prefill_s)),
            "step_overhead_s": max(0.0, step_s - cost[0]),
            "reads_per_forward": reads, "prefill_reads": prefill_reads, "budgets": [nb or total for nb in budget_experts],
            "total_experts": total, "read_bytes": nbytes / misses if misses else full.expert_bytes,
            "page_cache_read_s": io_s / misses if misses else 0.0, "new_tokens": max_new_tokens}


def _break_even_disk(ratio_of, k: int) -> float | None:
    """a* where E(a, k) = ratio_of(a) (the verify step's cost in plain steps may depend on a: rejected rows
    route more widely); None when no a in [0, 1] pays."""
    f = lambda a: expected_tokens(a, k) - ratio_of(a)
    if f(0.0) >= 0:
        return 0.0
    if f(1.0) <= 0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def disk_cost_model(inputs: dict, *, disk_mb_s: float | None, acceptances=tuple(np.round(np.linspace(0, 1, 11), 2)),
                    ks=(1, 2, 4)) -> pd.DataFrame:
    """The break-even surface predicted by the cost model (header above) from `cost_model_inputs`: one row per
    (budget, acceptance, k) with the predicted speed-up, E(a, k) and the break-even acceptance a* of that
    budget and k."""
    t_disk = inputs["read_bytes"] / (disk_mb_s * 2**20) if disk_mb_s else 0.0
    t_read = max(inputs["page_cache_read_s"], t_disk)
    T, R, n = inputs["T_s"], inputs["reads_per_forward"], inputs["new_tokens"]
    o = inputs.get("step_overhead_s", 0.0)            # per decode or verify step, besides its forward
    out = []
    for b in inputs["budgets"]:
        pre = inputs["prefill_s"] + inputs["prefill_reads"][b] * t_read
        plain_step = T[1] + o + R[(b, 1, "accepted")] * t_read
        plain = pre + (n - 1) * plain_step

        def verify_step(a, k):         # each of the k drafted rows is a rejected (random) token with chance 1 - a
            return T[k + 1] + o + (a * R[(b, k + 1, "accepted")] + (1 - a) * R[(b, k + 1, "rejected")]) * t_read
        for k in ks:
            a_star = _break_even_disk(lambda a: verify_step(a, k) / plain_step, k)
            for a in acceptances:
                e, step = expected_tokens(a, k), verify_step(a, k)
                out.append({"budget_experts": b, "budget_frac": b / inputs["total_experts"], "acceptance": float(a),
                            "k": k, "E_tokens_per_verify": e, "speedup": plain / (pre + (n - 1) / e * step),
                            "step_cost_ratio": step / plain_step, "a_star": a_star,
                            "reads_per_plain_step": R[(b, 1, "accepted")],
                            "reads_per_verify": (step - T[k + 1] - o) / t_read if t_read else 0.0,
                            "t_read_ms": t_read * 1e3})
    return pd.DataFrame(out)


def validate_cost_model(model_dir, prompts: list[list[int]], model_df: pd.DataFrame, cells, *, disk_mb_s: float | None,
                        max_new_tokens: int = 48, dtype=torch.float32) -> pd.DataFrame:
    """Measure a few cells of the surface for real (the simulated disk busy-waits every miss) and put each
    next to the cost model's prediction. cells: (budget experts or None, acceptance, k)."""
    oracle_engine = Engine(model_dir, name="oracle", dtype=dtype)
    total = oracle_engine.config.n_layers * oracle_engine.config.n_experts
    rows = []
    for nb, a, k in tqdm(cells, desc="cells measured for real", leave=False):
        m = _measured_cell(model_dir, prompts, nb, round(1 - a, 6), k, max_new_tokens, disk_mb_s, dtype,
                           oracle_engine, total)
        pred = model_df[(model_df.budget_experts == (nb or total)) & (model_df.k == k)
                        & (np.isclose(model_df.acceptance, a))]
        rows.append({"budget_experts": nb or total, "acceptance": a, "k": k,
                     "measured_acceptance_rate": m["acceptance_rate"], "predicted_speedup": float(pred.speedup.iloc[0]),
                     "measured_speedup": m["speedup"]})
    df = pd.DataFrame(rows)
    df["error"] = df.predicted_speedup / df.measured_speedup - 1
    return df


def plot_break_even(df: pd.DataFrame, disk_mb_s: float | None = None, measured: pd.DataFrame | None = None):
    """Heat maps of the speed-up per (acceptance, depth), one per expert budget; with the cost model's table
    (column a_star) a black line marks the break-even acceptance a* of each k, and cells measured for real
    (`measured`) carry their measured speed-up in a box."""
    budgets = sorted(df.budget_experts.unique())
    acc_col = "acceptance" if "acceptance" in df else None
    if acc_col is None:
        df = df.assign(acceptance=1 - df.error_rate)
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.4 * len(budgets), 3.9), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        sub = df[df.budget_experts == b].pivot_table(index="k", columns="acceptance", values="speedup")
        acc = np.array(sub.columns, dtype=float)
        im = ax.imshow(sub.values, origin="lower", aspect="auto", cmap="RdYlGn", vmin=0.5, vmax=2.0,
                       extent=[-0.5, len(acc) - 0.5, -0.5, len(sub.index) - 0.5])
        small = len(acc) > 6
        for i in range(sub.shape[0]):
            for j in range(sub.shape[1]):
                v = sub.values[i, j]
                ax.text(j, i, f"{v:.2f}" if small else f"{v:.2f}" + ("" if v >= 1 else "\nloses"),
                        ha="center", va="center", fontsize=5.5 if small else 7)
        step = max(1, len(acc) // 6)
        ax.set_xticks(range(0, len(acc), step), [f"{a:.1f}" for a in acc[::step]])
        ax.set_yticks(range(len(sub.index)), [str(k) for k in sub.index])
        if "a_star" in df:
            ys, xs = [], []
            for i, k in enumerate(sub.index):
                a_star = df[(df.budget_experts == b) & (df.k == k)].a_star.iloc[0]
                if a_star is not None and a_star == a_star:
                    xs.append(float(np.interp(a_star, acc, np.arange(len(acc)))))
                    ys.append(i)
            if xs:
                ax.plot(xs, ys, "k|-", lw=1.5, ms=14, label="break-even a*")
        if measured is not None:
            for r in measured[measured.budget_experts == b].itertuples():
                if r.k in list(sub.index):
                    j = float(np.interp(r.acceptance, acc, np.arange(len(acc))))
                    ax.annotate(f"{r.measured_speedup:.2f}", (j, list(sub.index).index(r.k)), fontsize=6.5,
                                ha="center", va="center", bbox={"boxstyle": "square,pad=0.15", "fc": "white"})
        if "plain_expert_hit_rate" in df and df[df.budget_experts == b].plain_expert_hit_rate.iloc[0] is not None:
            hr = df[df.budget_experts == b].plain_expert_hit_rate.iloc[0]
            ax.set_title(f"{b} experts resident (plain hit rate {hr:.0%})", fontsize=9)
        else:
            ax.set_title(f"{b} of {int(b / df[df.budget_experts == b].budget_frac.iloc[0])} experts resident",
                         fontsize=9)
        ax.set_xlabel("acceptance a")
        ax.set_ylabel("draft depth k")
    fig.colorbar(im, ax=axes[0].tolist(), label="speed-up over plain greedy (x)")
    if "a_star" in df:
        axes[0][0].legend(loc="upper left", fontsize=7)
    disk = f"disk modelled at {disk_mb_s:g} MB/s" if disk_mb_s else "page-cache reads"
    how = "cost model; boxed: measured" if "a_star" in df else "measured"
    fig.suptitle(f"Break-even: speculation loses below a*, sooner when few experts fit\n({disk}; {how})",
                 fontsize=10)
    return fig


def lesson_models(model: str = "tiny-moe", draft: str = "tiny-draft", *, expert_budget_mb=None):
    """(target, draft engine, a note naming them)."""
    return load_model(model, expert_budget_mb=expert_budget_mb), load_model(draft), f"{model} + {draft}"


# lesson 1's panel: expert budgets by label (None: every expert resident) and the drafters besides the model
PANEL_BUDGETS = {"all resident": None, "2 experts": 2, "6 experts": 6}
PANEL_DRAFTERS = ("ngram", "oracle:0.0", "oracle:0.3", "oracle:0.7")


def try_it_table(target, draft_engine, prompt: list[int], *, k: int = 4, drafter: str = "tiny-draft",
                 budget: str = "all resident", temperature: float = 0.0, seed: int = 0,
                 n_new: int = 32) -> pd.DataFrame:
    """Lesson 1's panel, one run: speculative decoding of `prompt` (drafter = draft_engine's name or one of
    PANEL_DRAFTERS) next to plain decoding at the same expert budget; a table with units."""
    nb = PANEL_BUDGETS[budget]
    eng = target if nb is None else Engine(target.model_dir, expert_budget_mb=nb * target.expert_bytes / 2**20)
    d = ModelDrafter(draft_engine, name=drafter) if drafter == draft_engine.name else \
        make_drafter(drafter, eng, seed=seed, horizon=n_new + k + 2)
    r = speculative_generate(eng, d, prompt, n_new, k=k, temperature=temperature, seed=seed)
    ref = generate(eng, prompt, n_new, temperature=temperature, seed=seed)
    st = r.stats
    same = ("yes" if r.token_ids == ref.token_ids else "NO") if temperature == 0 else \
        "not compared (sampling: same distribution, not the same tokens)"
    rows = [("acceptance rate", f"{100 * st['acceptance_rate']:.0f}", "% of drafted tokens"),
            ("mean acceptance length", f"{st['mean_acceptance_length']:.2f}", "tokens per draft"),
            ("tokens per forward", f"{st['tokens_per_forward']:.2f}", "tokens"),
            ("speculative speed", f"{st['tokens_per_s']:.1f}", "tokens / s"),
            ("plain speed", f"{ref.stats['tokens_per_s']:.1f}", "tokens / s"),
            ("unique experts", f"{st['unique_experts_per_token']:.1f}", "per emitted token"),
            ("bytes read", f"{st['bytes_read_per_token'] / 2**20:.2f}", "MiB per emitted token"),
            ("identical to plain", same, "")]
    return quantity_table(rows)


def try_it(target, draft_engine, prompt: list[int], *, k: int = 4, seed: int = 0) -> None:
    """Draft length, drafter, expert budget and temperature over `try_it_table`."""
    import ipywidgets as w
    show_panel({"k": w.IntSlider(value=k, min=0, max=8, description="draft length k"),
                "drafter": w.Dropdown(options=[draft_engine.name, *PANEL_DRAFTERS], description="drafter"),
                "budget": w.Dropdown(options=list(PANEL_BUDGETS), value="all resident", description="expert budget"),
                "temperature": w.FloatSlider(value=0.0, min=0.0, max=1.5, step=0.1, description="temperature")},
               lambda **kw: try_it_table(target, draft_engine, prompt, seed=seed, **kw),
               title="Speculative decoding against plain decoding, same prompt, same budget")


def sampling_tv(target, draft_engine, prompt: list[int], *, n: int = 20_000, temperature: float = 1.0, seed: int = 0):
    """Total-variation distance between the target's next-token distribution and the first token emitted
    by one speculative step (k=1, draft sampled from the drafter), for the correct sampler and for a broken
    one that accepts every draft. Returns a DataFrame."""
    p = probs_from_logits(target.forward(prompt, target.new_cache(), last_only=True)[-1], temperature)
    q = probs_from_logits(draft_engine.forward(prompt, draft_engine.new_cache(), last_only=True)[-1], temperature)
    gen = torch.Generator().manual_seed(seed)
    V = p.numel()
    rows = []
    for name in ("modified rejection sampling", "broken: accept every draft"):
        counts = torch.zeros(V)
        for _ in range(n):
            x = int(torch.multinomial(q, 1, generator=gen))
            if name.startswith("broken"):
                t = x
            else:
                n_acc, t = verify_sampling(torch.stack([p, p]), [x], q[None], gen)
                if n_acc == 1:                  # accepted: the first emitted token is the draft
                    t = x
            counts[t] += 1
        tv = 0.5 * float((counts / n - p).abs().sum())
        rows.append({"sampler": name, "samples": n, "TV(emitted, target)": tv})
    # sampling noise floor: TV of n exact samples from p
    exact = torch.bincount(torch.multinomial(p, n, replacement=True, generator=gen), minlength=V).float()
    rows.append({"sampler": "exact samples from p (noise floor)", "samples": n,
                 "TV(emitted, target)": 0.5 * float((exact / n - p).abs().sum())})
    rows.append({"sampler": "draft q itself", "samples": None, "TV(emitted, target)": 0.5 * float((q - p).abs().sum())})
    return pd.DataFrame(rows)


HEADLINE = Headline(
    title="Speculative decoding",
    sentences=(
        Sentence("{models}: speculative decoding ran {measured_speedup_best_k:.2f}x plain greedy at its best draft "
                 "length k = {best_k}; Leviathan's formula (first-position acceptance, i.i.d.) predicted "
                 "{leviathan_speedup_best_k:.2f}x; the breakdown fitted from the same run's a_i, c and verify cost "
                 "gives {refined_speedup_best_k:.2f}x."),
        Sentence("The draft model had {tiny_draft_acceptance_rate:.0%} of its drafted tokens accepted, n-gram lookup "
                 "{ngram_acceptance_rate:.0%}; every drafter's output was checked against plain greedy (table)."),
        Sentence("A verify forward at k = 4 cost {verify_cost_ratio_k4:.2f}x a plain one-token step."),
        Sentence("With experts streamed from a disk modelled at {disk_mb_s:g} MB/s, the cost model puts speculation "
                 "below plain speed in {break_even_cells_losing} of {break_even_cells} cells of the break-even surface "
                 "(acceptance x expert budget x depth); the cells measured for real were {validation_error_median:.0%} "
                 "off the model (median, {validation_cells} cells)."),
        Sentence("Sampling: the exact speculative sampler's tokens were {tv_correct_sampler:.3f} from the target "
                 "distribution in total variation (sampling noise), a broken sampler's {tv_broken_sampler:.3f}."),
    ),
    columns=(Column("model", "target"), Column("drafter", "drafter"),
             Column("acceptance_rate", "acceptance (%)", ".0f", scale=100),
             Column("c", "draft cost c (target steps)", ".3f"),
             Column("measured_speedup", "measured speed-up (x)", ".2f"),
             Column("refined_speedup", "breakdown (same run) (x)", ".2f"),
             Column("identical_to_plain", "output vs plain greedy", "identical|DIFFERS")),
    table="drafters",
    caption="Drafters side by side",
    figure="lesson.compare_drafters(",
)
