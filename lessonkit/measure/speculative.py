"""Speculative decoding measured: one verify step traced row by row, drafters timed against plain greedy on the same
prompts (outputs compared; contenders taking turns within rounds, `take_turns`), the lesson's models, and the
total-variation distance of sampled speculation from the target's own sampling. Lesson 1 draws these."""
from __future__ import annotations

import math
import statistics
import time

import pandas as pd
import torch
from tqdm.auto import tqdm

from lessonkit.drafter_registry import draft_weights
from lessonkit.engine.generate import generate, probs_from_logits
from lessonkit.models.registry import load_model
from lessonkit.measure.apart import Apart
from lessonkit.speculative.gate import acceptance_by_position, measure_cost_curve
from lessonkit.speculative.gate import breakdown_speedup
from lessonkit.speculative.verify import speculative_generate, total_stats, verify_sampling


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

def _timed_runs(fn, prompts, repeats):
    best = None
    for _ in range(repeats):
        sts = [fn(p).stats for p in prompts]
        tot = total_stats(sts)
        if best is None or tot["wall_s"] < best["wall_s"]:
            best = tot
    return best

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
        cond = acceptance_by_position(r)
        rows.append({"model": target.name, "drafter": name, "k": k, "acceptance_rate": r["acceptance_rate"],
                     **{f"a{i + 1}": a for i, a in enumerate(cond)},
                     "c": (r["draft_s"] / r["num_draft_tokens"] / t_tok) if r["num_draft_tokens"] else 0.0,
                     "measured_speedup": plain["wall_s"] / r["wall_s"],
                     "breakdown_speedup": breakdown_speedup(plain, r, k, cost),
                     "identical_to_plain": same[name]})
    return pd.DataFrame(rows)

def per_position_acceptance(target, drafter, prompts: list[list[int]], *, k: int = 4,
                            max_new_tokens: int = 32) -> list[float]:
    """The conditional acceptance a_1..a_k of `drafter` on `prompts` (untimed): measured apart from the runs whose
    tokens per verify step it predicts."""
    tot = total_stats([speculative_generate(target, drafter, p, max_new_tokens, k=k).stats for p in prompts])
    return acceptance_by_position(tot)

def measure_apart(target, drafter, prompts: list[list[int]], *, k: int = 4, max_new_tokens: int = 32,
                  cost=(), source: str = "other prompts") -> Apart:
    """The statistics a prediction may read, from runs on `prompts` apart from the timed ones: the conditional
    acceptance a_1..a_k and c (draft seconds per draft token over a plain decode step, both on these prompts, the
    prefill forward left out); `cost`, the verify cost curve, is passed through (its own untimed forwards)."""
    spec = total_stats([speculative_generate(target, drafter, p, max_new_tokens, k=k).stats for p in prompts])
    plain = total_stats([generate(target, p, max_new_tokens).stats for p in prompts])
    t_tok = (plain["wall_s"] - plain["ttft_s"]) / max(plain["new_tokens"] - plain["runs"], 1)
    c = spec["draft_s"] / spec["num_draft_tokens"] / t_tok if spec["num_draft_tokens"] else 0.0
    return Apart(prompts=tuple(tuple(p) for p in prompts), source=source, cost=tuple(cost), c=c,
                 acceptance=tuple(acceptance_by_position(spec)))

def plain_runner(target, max_new: int):
    """prompt -> (plain greedy's tokens, stats)."""
    return lambda p: (lambda r: (r.token_ids, r.stats))(generate(target, p, max_new))


def spec_runner(target, drafter, k, max_new: int, **kw):
    """prompt -> (speculative decoding's tokens, stats) with `drafter` at depth k."""
    return lambda p: (lambda r: (r.token_ids, r.stats))(speculative_generate(target, drafter, p, max_new, k=k, **kw))


def take_turns(fns: dict, prompts, repeats: int, every_round: bool = False) -> dict:
    """Each contender (prompt -> (tokens, stats), e.g. plain_runner) over all prompts, `repeats` rounds, taking
    turns within a round (after one warm-up prompt each), so load drift on a shared machine hits all alike:
    name -> (per-round seconds, per-round decode seconds (wall less the prefills' time to first token; NaN for a
    contender that reports no stats), outputs, stats). Outputs: the last round's, or, where a contender's outputs
    differed from the first contender's (the baseline's) in some round, that round's: compared with the baseline's,
    they say whether every round was identical (a gated drafter drafts differently from round to round). Stats: the
    last round's, or every round's (every_round: a gated drafter's acceptance over all its rounds)."""
    for fn in fns.values():
        fn(prompts[0])
    base = next(iter(fns))
    walls, decode, stats = {name: [] for name in fns}, {name: [] for name in fns}, {name: [] for name in fns}
    last, differed = {}, {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = [fn(p) for p in prompts]
            walls[name].append(time.perf_counter() - t0)
            decode[name].append(walls[name][-1] - sum(r[1]["ttft_s"] if r[1] else math.nan for r in last[name]))
            stats[name] = (stats[name] if every_round else []) + [r[1] for r in last[name]]
            outs = [r[0] for r in last[name]]
            if name not in differed and outs != [r[0] for r in last[base]]:
                differed[name] = outs
    return {name: (walls[name], decode[name], differed.get(name, [r[0] for r in last[name]]), stats[name])
            for name in fns}


def speedup_ratios(plain: list[float], walls: list[float]) -> dict:
    """The per-round speed-ups over plain (plain's seconds over the contender's, round by round): median, min, max."""
    r = [p / w for p, w in zip(plain, walls)]
    return {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3)}


def lesson_models(model: str = "tiny-moe", draft: str = "tiny-draft", *, expert_budget_mb=None):
    """(target, draft engine, a note naming them). The draft model takes the numerics' blocks as `--draft` loads it
    (drafter_registry.draft_weights: Q8_0 on the int8 numerics), so a lesson's pair costs what the commands' does."""
    weights = draft_weights()
    note = f"{model} + {draft}" + (f" ({weights} blocks)" if weights else "")
    return load_model(model, expert_budget_mb=expert_budget_mb), load_model(draft, weights=weights), note

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

def experts_per_forward(target, prompt: list[int], rows=(1, 2, 3, 4, 5)) -> dict[int, float]:
    """Unique experts a forward of r rows of `prompt` runs, for each r in `rows` (a mixture of experts: every row
    routes its own top-k, so a verify of r rows runs the union of their experts). Each forward starts after the
    same prefix, rolled back in between; the rows are the prompt's own next tokens, so they route as text does."""
    longest = max(rows)
    if len(prompt) <= longest:
        raise ValueError(f"experts_per_forward needs a prompt longer than {longest} tokens")
    start = len(prompt) - longest
    cache = target.new_cache(len(prompt) + 1)
    target.forward(prompt[:start], cache)
    out = {}
    for r in rows:
        cache.rollback(start)
        target.forward(prompt[start:start + r], cache)
        out[r] = float(target.model.last_forward["unique_experts"])
    return out
