"""MTP drafting measured: plain greedy vs MTP drafts with k per verify on held-out corpus prompts, output
compared token by token. Lesson 2 draws it; `lessonkit bench mtp` reports it."""
from __future__ import annotations

import statistics

from lessonkit.engine.generate import generate
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.mtp.evaluate import text_windows
from lessonkit.mtp.head import MtpHead, load_head
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.corpus import KINDS


def prompts_from_corpus(engine, n_per_kind: int = 1, prompt_len: int = 48) -> dict[str, list[list[int]]]:
    """Held-out prompts per kind of text (the first tokens of held-out windows not used for acceptance)."""
    return {k: text_windows(engine, k, "heldout", n_per_kind, prompt_len, skip=40).tolist() for k in KINDS}

def speed_comparison(engine, head: MtpHead | None = None, prompts: dict | None = None, max_new_tokens: int = 64,
                     ks=(1, 2, 3), quant: str = "none", repeats: int = 1) -> list[dict]:
    """Plain greedy vs MTP drafting with k drafts per verify, same prompts, same process; output compared
    token by token. One row per (kind, contender). Times are medians over `repeats`."""
    head = head if head is not None else load_head(engine)
    prompts = prompts if prompts is not None else prompts_from_corpus(engine)
    drafter = MtpDrafter(engine, head, quant=quant)
    rows = []
    try:
        for kind, plist in prompts.items():
            for p in plist:
                ts, ref = [], None
                for _ in range(repeats):
                    r = generate(engine, p, max_new_tokens, use_eos=False)
                    ts.append(r.stats["wall_s"])
                    ref = r.token_ids
                base = statistics.median(ts)
                rows.append({"model": engine.name, "kind": kind, "name": "plain greedy", "k": 0,
                             "tokens_per_s": len(ref) / base, "identical_to_plain": True,
                             "acceptance_rate": None, "tokens_per_forward": 1.0, "speedup": 1.0})
                for k in ks:
                    ts, res = [], None
                    for _ in range(repeats):
                        res = speculative_generate(engine, drafter, p, max_new_tokens, k=k, use_eos=False)
                        ts.append(res.stats["wall_s"])
                    t = statistics.median(ts)
                    rows.append({"model": engine.name, "kind": kind, "name": f"mtp k={k}" + (f" {quant}" if quant != "none" else ""),
                                 "k": k, "tokens_per_s": len(res.token_ids) / t,
                                 "identical_to_plain": res.token_ids == ref,
                                 "acceptance_rate": res.stats["acceptance_rate"],
                                 "tokens_per_forward": res.stats["tokens_per_forward"], "speedup": base / t})
    finally:
        drafter.close()
    return rows


def predicted_by_scheme(engine, head: MtpHead, by_scheme: dict, prompts: dict, *, k: int = 2,
                        max_new_tokens: int = 32) -> list[dict]:
    """Per quantisation scheme of the head: the decode speed-up predicted from parts measured apart, then measured.
    E(k) = 1 + a1 + a1 a2 + ... from the teacher-forced acceptance per position (`by_scheme`, held-out windows, no
    timing), the verify cost T(k+1)/T(1) measured here, and c, the head's draft seconds per draft token over a
    plain decode step; predicted = E(k) / (T(k+1)/T(1) + k c). Measured: plain and MTP decoding of `prompts`, the
    prefill left out on both sides; every output compared with plain greedy."""
    from lessonkit.speculative.gate import expected_tokens_per_pos, measure_cost_curve
    from lessonkit.speculative.verify import total_stats
    cost = measure_cost_curve(engine, k, repeats=5)
    flat = [p for ps in prompts.values() for p in ps]
    plain = [generate(engine, p, max_new_tokens, use_eos=False) for p in flat]
    pst = total_stats([r.stats for r in plain])
    p_s = pst["wall_s"] - pst["ttft_s"]
    t_tok = p_s / max(pst["new_tokens"] - pst["runs"], 1)
    rows = []
    for scheme, r in by_scheme.items():
        drafter = MtpDrafter(engine, head, quant=scheme)
        try:
            res = [speculative_generate(engine, drafter, p, max_new_tokens, k=k, use_eos=False) for p in flat]
        finally:
            drafter.close()
        st = total_stats([x.stats for x in res])
        c = (st["draft_s"] / st["num_draft_tokens"]) / t_tok if st["num_draft_tokens"] else 0.0
        e = expected_tokens_per_pos(list(r["acceptance"]), k)
        rows.append({"model": engine.name, "scheme": scheme, "k": k, "a1": r["acceptance"][0], "E_predicted": e,
                     "verify_cost": cost[k] / cost[0], "c": c, "predicted_speedup": e / (cost[k] / cost[0] + k * c),
                     "measured_speedup": p_s / (st["wall_s"] - st["ttft_s"]),
                     "identical_to_plain": all(x.token_ids == y.token_ids for x, y in zip(res, plain))})
    return rows
