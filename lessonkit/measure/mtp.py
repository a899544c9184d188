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
                        max_new_tokens: int = 32, apart_prompts: dict | None = None) -> list[dict]:
    """Per quantisation scheme of the head: the decode speed-up predicted from parts measured apart, then measured.
    Apart from the timed runs (`measure.apart.predict_speedup`): E(k) = 1 + a1 + a1 a2 + ... from the
    teacher-forced acceptance per position (`by_scheme`, held-out windows, no timing), the verify cost T(k+1)/T(1)
    (its own forwards) and c, the head's draft seconds per draft token over a plain decode step, both timed on
    `apart_prompts` (default: held-out prompts further into the split than `prompts`). Measured: plain and MTP
    decoding of `prompts`, the prefill left out on both sides; every output compared with plain greedy."""
    from lessonkit.measure.apart import Apart, predict_speedup
    from lessonkit.speculative.gate import measure_cost_curve
    from lessonkit.speculative.verify import total_stats
    cost = measure_cost_curve(engine, k, repeats=5)
    flat = [p for ps in prompts.values() for p in ps]
    aside = [p for ps in (apart_prompts or _apart_prompts(engine, prompts)).values() for p in ps]
    plain, plain_apart = [_decode(generate(engine, p, max_new_tokens, use_eos=False) for p in ps) for ps in (flat, aside)]
    rows = []
    for scheme, r in by_scheme.items():
        drafter = MtpDrafter(engine, head, quant=scheme)
        try:
            res = [speculative_generate(engine, drafter, p, max_new_tokens, k=k, use_eos=False) for p in flat]
            sa = total_stats([speculative_generate(engine, drafter, p, max_new_tokens, k=k, use_eos=False).stats
                              for p in aside])
        finally:
            drafter.close()
        c = (sa["draft_s"] / sa["num_draft_tokens"]) / plain_apart["t_tok"] if sa["num_draft_tokens"] else 0.0
        apart = Apart(prompts=tuple(tuple(p) for p in aside), source="held-out windows and prompts past the timed ones",
                      cost=tuple(cost), acceptance=tuple(r["acceptance"]), c=c)
        pred = predict_speedup(apart, k, flat)
        st = total_stats([x.stats for x in res])
        rows.append({"model": engine.name, "scheme": scheme, "k": k, "a1": r["acceptance"][0],
                     "E_predicted": pred["E_predicted"], "verify_cost": pred["verify_cost"], "c": c,
                     "predicted_speedup": pred["predicted_speedup"],
                     "measured_speedup": plain["decode_s"] / (st["wall_s"] - st["ttft_s"]),
                     "identical_to_plain": all(x.token_ids == y for x, y in zip(res, plain["token_ids"]))})
    return rows


def _decode(results) -> dict:
    """Summed decode phase of plain runs (the prefill and its token left out), seconds per token, the outputs."""
    from lessonkit.speculative.verify import total_stats
    results = list(results)
    st = total_stats([r.stats for r in results])
    decode_s = st["wall_s"] - st["ttft_s"]
    return {"decode_s": decode_s, "t_tok": decode_s / max(st["new_tokens"] - st["runs"], 1),
            "token_ids": [r.token_ids for r in results]}


def _apart_prompts(engine, prompts: dict) -> dict:
    """Held-out prompts per kind past those of `prompts` (the windows after them), for the parts timed apart."""
    n = max(len(v) for v in prompts.values())
    length = max(len(p) for v in prompts.values() for p in v)
    return {k: text_windows(engine, k, "heldout", 2 * n, length, skip=40).tolist()[n:] for k in KINDS}
