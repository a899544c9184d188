"""When speculation pays, measured and modelled: verify cost against acceptance with experts read from a disk
(lessonkit.files.disk: cold past the page cache, warm from it, or a simulated slower disk), the break-even
acceptance of a cost ratio, the disk cost model's inputs measured from expert misses, its check against
measured cells (oracle drafter), and a real draft model on the same disk, predicted and measured. Lesson 1 draws
these."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lessonkit.engine.engine import Engine
from lessonkit.engine.generate import generate
from lessonkit.files.disk import MB, Disk, parse_disk
from lessonkit.measure.apart import Apart, InSample, check_apart, predict_times
from lessonkit.measure.disk import warm_up
from lessonkit.speculative.drafters import ModelDrafter, OracleDrafter
from lessonkit.speculative.gate import (acceptance_by_position, expected_tokens, expected_tokens_per_pos,
                                        measure_cost_curve)
from lessonkit.speculative.verify import speculative_generate, total_stats


def _budget_engine(model_dir, nb, expert_bytes: int, dtype, disk: Disk) -> Engine:
    """tiny-moe with nb experts resident (None = all), every expert miss read from `disk`."""
    mb = None if nb is None else nb * expert_bytes / 2**20
    return Engine(model_dir, name=f"budget-{nb or 'all'}", expert_budget_mb=mb, dtype=dtype, disk=disk)

def _timed_pair(eng, prompts, drafter_of, k: int, max_new_tokens: int, repeats: int) -> tuple[dict, dict, bool, list]:
    """Plain and speculative greedy over `prompts` on `eng`, each prompt from an empty expert cache, in turn
    within each of `repeats` rounds (load on shared cores hits both); drafter_of(eng) gives each round a fresh
    drafter. Returns the fastest round of each side, whether every speculative output equalled plain greedy's,
    and each round's own speed-up (plain seconds over speculative seconds: the spread of the rounds)."""
    def run(fn):
        out = []
        for p in prompts:
            eng.store.clear()
            out.append(fn(p))
        return out
    best, same, rounds = {}, True, []
    for _ in range(repeats):
        plain = run(lambda p: generate(eng, p, max_new_tokens))
        drafter = drafter_of(eng)
        spec = run(lambda p: speculative_generate(eng, drafter, p, max_new_tokens, k=k))
        same &= all(a.token_ids == b.token_ids for a, b in zip(plain, spec))
        walls = {}
        for side, res in (("plain", plain), ("spec", spec)):
            st = walls[side] = total_stats([r.stats for r in res])
            if side not in best or st["wall_s"] < best[side]["wall_s"]:
                best[side] = st
        rounds.append(walls["plain"]["wall_s"] / walls["spec"]["wall_s"])
    return best["plain"], best["spec"], same, rounds

def _measured_cell(model_dir, prompts, nb, P, k, max_new_tokens, disk: Disk, dtype, oracle_engine, total,
                   repeats: int = 1) -> dict:
    """One cell of the break-even surface, measured: plain and speculative greedy at budget nb (experts per
    model; None = all), oracle error rate P, depth k, every expert miss read from `disk`; plain and speculative
    in turn within each of `repeats` rounds, the fastest round of each counts (load on shared cores hits both)."""
    eng = _budget_engine(model_dir, nb, oracle_engine.expert_bytes, dtype, disk)
    oracle_of = lambda e: OracleDrafter(e, P, seed=0, horizon=max_new_tokens + k + 2, oracle_engine=oracle_engine)
    plain, t, _, _ = _timed_pair(eng, prompts, oracle_of, k, max_new_tokens, repeats)
    return {"budget_experts": nb or total, "budget_frac": (nb or total) / total, "error_rate": P,
            "acceptance": 1 - P, "k": k, "acceptance_rate": t["acceptance_rate"],
            "tokens_per_forward": t["tokens_per_forward"], "speedup": plain["wall_s"] / t["wall_s"],
            "unique_experts_per_token": t["unique_experts_per_token"],
            "plain_unique_experts_per_token": plain["unique_experts_per_token"],
            "bytes_read_per_token": t["bytes_read_per_token"],
            "plain_bytes_read_per_token": plain["bytes_read_per_token"],
            "expert_hit_rate": t["expert_hit_rate"], "plain_expert_hit_rate": plain["expert_hit_rate"],
            "disk": str(disk)}

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

def _misses_along(eng, prompts, rows_of, r: int, n_tokens: int) -> tuple[float, list[int]]:
    """Expert misses per forward of r rows (from an empty expert cache, after each prompt's prefill), the rows
    taken from rows_of(prompt index, position, r) in whole windows of r (a shorter last window would make fewer
    misses than a verify of r rows); and each prefill's misses."""
    n_fw = n_miss = 0
    pre = []
    for i, p in enumerate(prompts):
        eng.store.clear()
        eng.store.reset_counters()
        cache = eng.new_cache(len(p) + n_tokens + r + 2)
        eng.forward(p, cache)
        pre.append(eng.store.misses)
        eng.store.reset_counters()
        for pos in range(0, n_tokens - r + 1, r):
            eng.forward(rows_of(i, pos, r), cache)
            n_fw += 1
        n_miss += eng.store.misses
    return n_miss / max(n_fw, 1), pre

def _loop_s(full, prompts, r: int, n_tokens: int, t_forward: float, seed: int, repeats: int) -> float:
    """o(r): a step's seconds of r rows beyond T(r), every expert resident, the fastest of `repeats` passes over the
    prompts: plain greedy (r = 1), or the oracle drafting the continuation itself (every draft right, k = r - 1).
    What the loop does around the forward (sampling; drafts, acceptance, the cache's rollback), and what a forward
    inside the loop takes beyond the fastest of the cost curve's interleaved forwards."""
    def pass_s():
        if r == 1:
            runs = [generate(full, p, n_tokens).stats for p in prompts]
            steps = sum(s["new_tokens"] - 1 for s in runs)
        else:
            runs = [speculative_generate(full, OracleDrafter(full, 0.0, seed=seed, horizon=n_tokens + r + 2), p,
                                         n_tokens, k=r - 1).stats for p in prompts]
            steps = sum(s["forwards"] for s in runs)
        return sum(s["wall_s"] - s["ttft_s"] for s in runs) / max(steps, 1)
    return max(0.0, min(pass_s() for _ in range(repeats)) - t_forward)

def cost_model_inputs(model_dir, prompts: list[list[int]], *, budget_experts=(2, 6, None), rows=(1, 2, 3, 5),
                      max_new_tokens: int = 48, dtype=torch.float32, repeats: int = 3,
                      cost: list[float] | None = None, seed: int = 0) -> dict:
    """The measured inputs of the disk cost model, in seconds: T(r) (the verify cost curve, every expert
    resident; `cost` if given), o(r) (a step's seconds of r rows beyond T(r), `_loop_s`: the decode loop's at
    r = 1, the speculative loop's beyond), the prefill, and per budget the prefill's expert misses and R(r, B): misses
    per forward of r rows from an empty expert cache along each prompt's greedy continuation (the rows an accepted
    draft brings) and along random tokens after the first row (the rows a rejected draft brings: they route
    more widely); the page-cache read time, the bytes of one expert read, and the prompts (a prediction from these
    inputs refuses a timed run on one of them). No disk is simulated: seconds."""
    warm_up(Path(model_dir) / "experts.safetensors")      # page-cache reads: a cold run before may have emptied it
    full = Engine(model_dir, name="budget-all", dtype=dtype)
    total = full.config.n_layers * full.config.n_experts
    cost = cost if cost is not None else measure_cost_curve(full, max(rows) - 1, repeats=repeats)
    gens = [generate(full, p, max_new_tokens) for p in prompts]
    conts = [g.token_ids for g in gens]
    # a step is more than its forward (sampling, stop checks, the cache; a verify's drafts and acceptance): measured
    loop_s = {r: _loop_s(full, prompts, r, max_new_tokens, cost[r - 1], seed, repeats) for r in rows}
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
            "step_overhead_s": loop_s[1], "loop_s": loop_s,
            "reads_per_forward": reads, "prefill_reads": prefill_reads, "budgets": [nb or total for nb in budget_experts],
            "total_experts": total, "read_bytes": nbytes / misses if misses else full.expert_bytes,
            "page_cache_read_s": io_s / misses if misses else 0.0, "new_tokens": max_new_tokens,
            "prompts": [list(p) for p in prompts]}

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

def read_seconds(inputs: dict, disk: Disk, read_mb_s: float | None = None) -> float:
    """t_read, one expert miss in seconds: the page-cache miss measured in `inputs` (warm); that plus the bytes
    at the disk's measured rate read_mb_s (cold); or the bytes at the simulated rate, if longer (what a
    simulated disk charges)."""
    pc, nbytes = inputs["page_cache_read_s"], inputs["read_bytes"]
    if disk.mode == "simulated":
        return max(pc, nbytes / (disk.mb_s * MB))
    if disk.mode == "cold":
        if not read_mb_s:
            raise ValueError("a cold disk's cost model needs its measured read rate (read_mb_s)")
        return pc + nbytes / (read_mb_s * MB)
    return pc

def disk_label(disk: Disk | str, read_mb_s: float | None = None) -> str:
    """The disk in words, for figures and sentences."""
    disk = parse_disk(disk)
    if disk.mode == "simulated":
        return f"a simulated disk of {disk.mb_s:g} MB/s"
    if disk.mode == "cold":
        return f"a cold disk, {read_mb_s:.0f} MB/s measured" if read_mb_s else "a cold disk"
    return "page-cache reads (warm)"

def _step_seconds(inputs: dict, b: int, t_read: float):
    """The cost model at budget b, in seconds: (the prefill with its reads, a plain step, verify_step(a, k)).
    Each of a verify's k drafted rows is a rejected (random) token with chance 1 - a: they route more widely. A step
    of r rows costs T(r) + o(r) besides its reads: o(1) the decode loop's, o(r > 1) the speculative loop's
    (`loop_s`; inputs without it take o(1) for every r)."""
    T, R = inputs["T_s"], inputs["reads_per_forward"]
    o_plain = inputs.get("step_overhead_s", 0.0)      # o(1): a decode step's seconds beyond T(1)
    o = lambda r: inputs.get("loop_s", {}).get(r, o_plain)
    pre = inputs["prefill_s"] + inputs["prefill_reads"][b] * t_read

    def verify_step(a, k):
        return T[k + 1] + o(k + 1) + (a * R[(b, k + 1, "accepted")] + (1 - a) * R[(b, k + 1, "rejected")]) * t_read
    return pre, T[1] + o(1) + R[(b, 1, "accepted")] * t_read, verify_step

def disk_cost_model(inputs: dict, *, disk: Disk | str, read_mb_s: float | None = None,
                    acceptances=tuple(np.round(np.linspace(0, 1, 11), 2)), ks=(1, 2, 4)) -> pd.DataFrame:
    """The break-even surface predicted by the cost model (header above) from `cost_model_inputs`, with expert
    misses read from `disk` (a cold disk at its measured rate read_mb_s: `measure.disk.disk_read_rate`): one row
    per (budget, acceptance, k) with the predicted speed-up, E(a, k) and the break-even acceptance a* of that
    budget and k."""
    t_read = read_seconds(inputs, parse_disk(disk), read_mb_s)
    R, n = inputs["reads_per_forward"], inputs["new_tokens"]
    out = []
    for b in inputs["budgets"]:
        pre, plain_step, verify_step = _step_seconds(inputs, b, t_read)
        plain = pre + (n - 1) * plain_step
        for k in ks:
            a_star = _break_even_disk(lambda a: verify_step(a, k) / plain_step, k)
            for a in acceptances:
                e, step = expected_tokens(a, k), verify_step(a, k)
                out.append({"budget_experts": b, "budget_frac": b / inputs["total_experts"], "acceptance": float(a),
                            "k": k, "E_tokens_per_verify": e, "speedup": plain / (pre + (n - 1) / e * step),
                            "step_cost_ratio": step / plain_step, "a_star": a_star,
                            "reads_per_plain_step": inputs["reads_per_forward"][(b, 1, "accepted")],
                            "reads_per_verify": a * R[(b, k + 1, "accepted")] + (1 - a) * R[(b, k + 1, "rejected")],
                            "t_read_ms": t_read * 1e3})
    return pd.DataFrame(out)

def measured_cell(model: str, *, budget_experts: int, acceptance: float, k: int, disk: Disk | str,
                  max_new_tokens: int, prompts: int, seed: int = 0, dtype=torch.float32) -> dict:
    """One cell of the break-even surface measured on its own, as a sweep's point does (lessonkit.sweep):
    budget_experts 0 means every expert resident; the prompts are the first of each kind of text."""
    from lessonkit.models.registry import resolve_model_dir
    from lessonkit.workloads.corpus import prompts_by_kind
    _, model_dir = resolve_model_dir(model)
    oracle_engine = Engine(model_dir, name="oracle", dtype=dtype)
    total = oracle_engine.config.n_layers * oracle_engine.config.n_experts
    chosen = [ps[0] for ps in prompts_by_kind(oracle_engine, n=1, max_tokens=48, seed=seed).values()][:prompts]
    return _measured_cell(model_dir, chosen, budget_experts or None, round(1 - acceptance, 6), k, max_new_tokens,
                          parse_disk(disk), dtype, oracle_engine, total)

def inputs_apart(inputs: dict, *, also=(), source: str = "the disk cost model's inputs (cost_model_inputs)",
                 **stats) -> Apart:
    """The cost model's inputs as statistics measured apart: the prompts they were measured on (with `also`, the
    prompts of other statistics beside them), so a prediction refuses a timed run on one of them."""
    if "prompts" not in inputs:
        raise InSample("the cost model's inputs do not say which prompts they were measured on (cost_model_inputs "
                       "records them): a prediction from them cannot be shown to be out of sample")
    return Apart(prompts=tuple(tuple(p) for p in [*inputs["prompts"], *also]), source=source, **stats)

def validate_cost_model(model_dir, prompts: list[list[int]], inputs: dict, cells, *, disk: Disk | str,
                        read_mb_s: float | None = None, dtype=torch.float32, repeats: int = 1) -> pd.DataFrame:
    """Measure a few cells of the surface for real on `prompts`, every expert miss read from `disk` (cold: from the
    disk itself, at its measured rate read_mb_s), and put each next to the speed-up the cost model predicts from
    `inputs` (`cost_model_inputs`, whose new tokens the runs use). The prompts must be others than the inputs'
    (InSample before any run otherwise). cells: (budget experts or None, acceptance, k); repeats: rounds of each
    cell (the fastest counts)."""
    disk, apart = parse_disk(disk), inputs_apart(inputs)
    check_apart(apart, prompts)
    t_read, n = read_seconds(inputs, disk, read_mb_s), inputs["new_tokens"]
    oracle_engine = Engine(model_dir, name="oracle", dtype=dtype)
    total = oracle_engine.config.n_layers * oracle_engine.config.n_experts
    rows = []
    for nb, a, k in tqdm(cells, desc="cells measured for real", leave=False):
        m = _measured_cell(model_dir, prompts, nb, round(1 - a, 6), k, n, disk, dtype, oracle_engine, total, repeats)
        pre, plain_step, verify_step = _step_seconds(inputs, nb or total, t_read)
        pred = predict_times(apart, prompts, pre + (n - 1) * plain_step,
                             pre + (n - 1) / expected_tokens(a, k) * verify_step(a, k))
        rows.append({"disk": str(disk), "budget_experts": nb or total, "acceptance": a, "k": k,
                     "measured_acceptance_rate": m["acceptance_rate"], "predicted_speedup": pred["predicted_speedup"],
                     "measured_speedup": m["speedup"]})
    df = pd.DataFrame(rows)
    df["error"] = df.predicted_speedup / df.measured_speedup - 1
    return df

def drafter_on_disk(model_dir, draft_engine, prompts: list[list[int]], apart_prompts: list[list[int]], inputs: dict, *,
                    budget_experts: int, ks=(2,), disk: Disk | str, read_mb_s: float | None = None,
                    repeats: int = 1, dtype=torch.float32, drafter_of=None) -> pd.DataFrame:
    """A real drafter (the draft model `draft_engine`, or `drafter_of(target engine)` such as a feature head: its
    drafts cost c > 0) on the cost model's disk. Per depth
    k: its acceptance a_1..a_k and seconds per draft token measured apart (on `apart_prompts`, every expert
    resident); the speed-up the cost model predicts from `inputs` (`cost_model_inputs`, whose new tokens the runs
    use) with k c added to each verify step, c = a draft token's seconds over a plain step's at the budget;
    and the speed-up measured on `prompts` with budget_experts resident, every miss read from `disk`. The timed
    prompts must be others than the inputs' and the apart ones (InSample before any run otherwise)."""
    disk = parse_disk(disk)
    check_apart(inputs_apart(inputs, also=apart_prompts), prompts)
    n, b = inputs["new_tokens"], budget_experts
    pre, plain_step, verify_step = _step_seconds(inputs, b, read_seconds(inputs, disk, read_mb_s))
    full = Engine(model_dir, name="budget-all", dtype=dtype)
    eng = _budget_engine(model_dir, b, full.expert_bytes, dtype, disk)
    if drafter_of is None:
        drafter_of = lambda _: ModelDrafter(draft_engine, name=draft_engine.name)
    rows = []
    for k in ks:
        drafters = [drafter_of(full) for _ in apart_prompts]           # a fresh drafter per prompt
        apart = total_stats([speculative_generate(full, d, p, n, k=k).stats for d, p in zip(drafters, apart_prompts)])
        name = drafters[0].name if drafters else draft_engine.name
        a, per_pos = apart["acceptance_rate"], acceptance_by_position(apart)
        e, c = expected_tokens_per_pos(per_pos, k), apart["draft_s"] / apart["num_draft_tokens"] / plain_step
        ratio = verify_step(a, k) / plain_step + k * c       # a verify step's cost in plain steps, drafts included
        stats = inputs_apart(inputs, also=apart_prompts, acceptance=tuple(per_pos), c=c,
                             source="the cost model's inputs and the drafter alone on other prompts")
        pred = predict_times(stats, prompts, pre + (n - 1) * plain_step, pre + (n - 1) / e * ratio * plain_step)
        plain, spec, same, rounds = _timed_pair(eng, prompts, drafter_of, k, n, repeats)
        plain_tok_s = (plain["wall_s"] - plain["ttft_s"]) / max(plain["new_tokens"] - plain["runs"], 1)
        rows.append({"drafter": name, "budget_experts": b, "k": k, "disk": str(disk),
                     "acceptance_apart": a, "E_apart": e, "c": c, "cost_per_verify_step": ratio,
                     "predicted_speedup": pred["predicted_speedup"],
                     "measured_acceptance": spec["acceptance_rate"],
                     "measured_tokens_per_verify": (spec["new_tokens"] - spec["runs"]) / max(spec["num_drafts"], 1),
                     "measured_c": spec["draft_s"] / max(spec["num_draft_tokens"], 1) / plain_tok_s,
                     "measured_speedup": plain["wall_s"] / spec["wall_s"], "round_speedups": rounds,
                     "identical_to_plain": same})
    df = pd.DataFrame(rows)
    df["error"] = df.predicted_speedup / df.measured_speedup - 1
    return df
