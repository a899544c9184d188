"""Lesson 1b (more on speculative decoding): the headline of notebooks/01b_speculative_more.ipynb, and the figures
its last cell records from the four experiments (the same drafter at two prices per draft token, sampling that
stays lossless, lesson 1's disk cells as a sweep, the suffix drafter on structured requests); the suffix drafter's
curve, its steps traced and its panel. The experiments themselves live in lessons.speculative,
measure.speculative, measure.suffix and lessonkit.sweep."""
from __future__ import annotations

import math

import pandas as pd

from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel, tables_html
from lessonkit.measure.suffix import STORE_SHARES, sized_store, trace_request, trace_summary

MODIFIED, BROKEN, FLOOR = ("modified rejection sampling", "broken: accept every draft",
                           "exact samples from p (noise floor)")


def _step(step_df: pd.DataFrame, which: str) -> dict:
    """The C or PyTorch step's row of `draft_step_comparison` as figures (None where it did not run)."""
    rows = step_df[step_df.drafter.str.endswith(f", {which} step")]
    r = rows.iloc[0] if len(rows) else None
    key = "c_step" if which == "C" else "torch_step"
    get = lambda col: None if r is None else float(r[col])
    return {f"{key}_c": get("c"), f"{key}_acceptance": get("acceptance_rate"),
            f"{key}_speedup": get("measured_speedup")}


def _suffix(df: pd.DataFrame | None, info: dict | None) -> dict:
    """The suffix drafter's curve as figures: the empty and the fullest store (None where it did not run)."""
    if df is None or not len(df):
        return {}
    empty, full = df.iloc[0], df.iloc[-1]
    return {"suffix_model": info["model"], "suffix_requests": len(info["heldout"]),
            "suffix_store_tokens": int(full.store_tokens), "suffix_tpv_empty": float(empty.tokens_per_verify),
            "suffix_tpv_full": float(full.tokens_per_verify), "suffix_speedup_empty": float(empty.speedup),
            "suffix_speedup_full": float(full.speedup), "suffix_identical": bool(df.identical_to_plain.all())}


def figures(step_df: pd.DataFrame, tv: pd.DataFrame, ran: dict, sweep_df: pd.DataFrame, *, draft: str,
            disk_words: str, suffix_df: pd.DataFrame | None = None, suffix_info: dict | None = None) -> dict:
    """What the lesson records: both steps' c, acceptance and speed-up, the samplers' total variation from the
    target, the sweep's cells (how many measured, kept and failed; the fastest measured cell) and the suffix
    drafter's curve (empty store against the fullest)."""
    tv_of = dict(zip(tv["sampler"], tv["TV(emitted, target)"]))
    ok = sweep_df[sweep_df.status == "ok"].dropna(subset=["speedup"]) if "speedup" in sweep_df else sweep_df.iloc[:0]
    best = ok.loc[ok.speedup.idxmax()] if len(ok) else None
    out = {"draft": draft, **_step(step_df, "C"), **_step(step_df, "PyTorch"),
           "steps_identical_to_plain": bool(step_df.identical_to_plain.all()),
           "tv_modified": float(tv_of[MODIFIED]), "tv_broken": float(tv_of[BROKEN]), "tv_floor": float(tv_of[FLOOR]),
           "sweep_points": int(ran["points"]), "sweep_measured": int(ran["done"]), "sweep_kept": int(ran["skipped"]),
           "sweep_failed": int(ran["failed"]), "disk_words": disk_words,
           "sweep_best_speedup": None if best is None else float(best.speedup),
           "sweep_best_acceptance": None if best is None else float(best.acceptance),
           "sweep_best_k": None if best is None else int(best.k), **_suffix(suffix_df, suffix_info)}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


# ---- the suffix drafter (section D) ----------------------------------------------------------------------------
SUFFIX_COLUMNS = {"store_tokens": "store (tokens)", "store_outputs": "store (outputs)",
                  "tokens_per_verify": "tokens per verify", "no_draft_share": "steps with no draft (%)",
                  "acceptance_rate": "acceptance (%)", "speedup": "speed-up over plain greedy (x)",
                  "spread": "speed-up, min .. max of rounds (x)", "identical_to_plain": "output == plain greedy"}


def suffix_table(df: pd.DataFrame) -> pd.DataFrame:
    """The store curve's rows (measure.suffix.store_curve) with units in the headers, rounded for reading."""
    t = df.set_index("contender").rename_axis(None)
    fmt = lambda col, spec, scale=1: [f"{scale * v:{spec}}" for v in t[col]]    # as the sentences write them
    t = t.assign(no_draft_share=fmt("no_draft_share", ".1f", 100), acceptance_rate=fmt("acceptance_rate", ".1f", 100),
                 tokens_per_verify=fmt("tokens_per_verify", ".2f"), speedup=fmt("speedup", ".2f"),
                 spread=[f"{a:.2f} .. {b:.2f}" for a, b in zip(t.speedup_min, t.speedup_max)])
    return t[list(SUFFIX_COLUMNS)].rename(columns=SUFFIX_COLUMNS)


def suffix_words(df: pd.DataFrame, info: dict) -> str:
    """What the curve measured, in a sentence from its numbers."""
    empty, full = df.iloc[0], df.iloc[-1]
    return (f"{info['model']} on {len(info['heldout'])} held-out structured request(s) ({info['repeats']} round(s), "
            f"store warmed on {info['train']} training requests in {info['warm_s']:.1f} s): tokens per verify "
            f"{empty.tokens_per_verify:.2f} with an empty store (the request alone), {full.tokens_per_verify:.2f} with "
            f"{full.store_tokens:,} tokens of earlier outputs; steps with no draft {empty.no_draft_share:.0%} -> "
            f"{full.no_draft_share:.0%}; speed-up over plain greedy {empty.speedup:.2f}x -> {full.speedup:.2f}x. "
            f"Every output == plain greedy's: {bool(df.identical_to_plain.all())}.")


def plot_store_curve(df: pd.DataFrame, info: dict):
    """SuffixDecoding's curve as this run measured it: the store's size against tokens per verify (left) and
    against the speed-up over plain greedy with the rounds' spread (right)."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = df.store_tokens
    ax1.plot(x, df.tokens_per_verify, "o-")
    ax1.set_ylabel("tokens per verify forward (tokens)")
    ax2.errorbar(x, df.speedup, yerr=[df.speedup - df.speedup_min, df.speedup_max - df.speedup], fmt="o-",
                 capsize=3, label="suffix drafter (median of rounds, min .. max)")
    ax2.axhline(1.0, color="grey", ls="--", lw=1, label="plain greedy")
    ax2.set_ylabel("speed-up over plain greedy (x)")
    ax2.legend(fontsize=7, loc="best")
    for ax in (ax1, ax2):
        ax.set_xlabel("store size (tokens of earlier verified outputs)")
        ax.grid(alpha=0.3)
    empty, full = df.iloc[0], df.iloc[-1]
    fig.suptitle(f"{info['model']}, {len(info['heldout'])} held-out structured request(s), {info['repeats']} round(s), "
                 f"from an empty store to {full.store_tokens:,} tokens of earlier outputs:\ntokens per verify "
                 f"{empty.tokens_per_verify:.2f} -> {full.tokens_per_verify:.2f}, speed-up {empty.speedup:.2f}x -> "
                 f"{full.speedup:.2f}x; outputs {'identical to' if df.identical_to_plain.all() else 'DIFFERENT from'} "
                 "plain greedy", fontsize=9)
    fig.tight_layout()
    return fig


def trace_table(target, steps: list[dict]) -> pd.DataFrame:
    """A traced request (measure.suffix.trace_request), one row per verify step: which source drafted, the drafts
    the target accepted, the rest it rejected, and its own token after them (as text)."""
    text = lambda ids: repr(target.decode(ids)) if ids else ""
    rows = [{"output tokens before": s["at"], "source": s["source"], "drafted (tokens)": len(s["drafted"]),
             "accepted drafts": text(s["drafted"][:s["accepted"]]),
             "rejected drafts": text(s["drafted"][s["accepted"]:]),
             "target's own token": text(s["emitted"][s["accepted"]:])} for s in steps]
    return pd.DataFrame(rows).rename_axis("step")


def trace_words(steps: list[dict], identical: bool) -> str:
    """The traced request in a sentence from its steps."""
    t = trace_summary(steps)
    by = "; ".join(f"the {src} drafted {t[src]['drafts']} step(s), {t[src]['accepted']} of {t[src]['drafted']} "
                   f"drafted tokens accepted" for src in ("store", "request"))
    return (f"{t['steps']} verify steps, {t['tokens_per_verify']:.2f} tokens per verify, "
            f"{t['no_draft_share']:.0%} with no draft; {by}. Output == plain greedy's: {identical}.")


def suffix_try_table(target, info: dict, *, share: float, request: int):
    """The panel's answer: held-out request `request` with the suffix drafter over `share` of the warmed store
    (learning off): a table of figures with units above the request's steps traced."""
    store = sized_store(info["store"], share)
    steps, same = trace_request(target, store, info["heldout"][request], info["max_new"])
    t = trace_summary(steps)
    rows = [("store", f"{store.n_tokens:,}", "tokens"), ("verify steps", str(t["steps"]), "forwards"),
            ("tokens per verify", f"{t['tokens_per_verify']:.2f}", "tokens"),
            ("steps with no draft", f"{100 * t['no_draft_share']:.0f}", "% of steps")]
    for src in ("store", "request"):
        rows.append((f"drafts from the {src}", f"{t[src]['accepted']} of {t[src]['drafted']}",
                     f"tokens accepted, in {t[src]['drafts']} steps"))
    rows.append(("output == plain greedy", "yes" if same else "NO", ""))
    return tables_html(quantity_table(rows), trace_table(target, steps))


def try_suffix(target, info: dict) -> None:
    """The store's share and a held-out request over `suffix_try_table`."""
    import ipywidgets as w
    shares = [(f"{s:.0%}", s) for s in (0.0, *STORE_SHARES)]
    reqs = [(f"{r.family} #{r.index}: {r.content.splitlines()[-1][:40]}", i) for i, r in enumerate(info["requests"])]
    show_panel({"share": w.SelectionSlider(options=shares, value=shares[-1][1],
                                           description="store (share of training outputs)"),
                "request": w.Dropdown(options=reqs, description="held-out request")},
               lambda **kw: suffix_try_table(target, info, **kw),
               title="The suffix drafter on one held-out request: what each source drafted, what the target kept")


HEADLINE = Headline(
    title="More on speculative decoding: the price of a draft, lossless sampling, a sweep, the suffix drafter",
    sentences=(
        Sentence("The same draft model ({draft}) as one C call: c = {c_step_c:.3f} of a target step, acceptance "
                 "{c_step_acceptance:.3f}, {c_step_speedup:.2f}x plain greedy; as PyTorch operations: c = "
                 "{torch_step_c:.3f}, acceptance {torch_step_acceptance:.3f}, {torch_step_speedup:.2f}x."),
        Sentence("Every output of both steps was {steps_identical_to_plain:identical to|DIFFERENT from} plain greedy's."),
        Sentence("Sampling: the first emitted token's total variation from the target's distribution was "
                 "{tv_modified:.4f} with modified rejection sampling (exact samples from the target: {tv_floor:.4f}) "
                 "and {tv_broken:.4f} when every draft is accepted."),
        Sentence("Lesson 1's disk cells as a sweep on {disk_words}: {sweep_points} cells, {sweep_measured} measured "
                 "now, {sweep_kept} kept from an earlier run, {sweep_failed} failed; the fastest measured "
                 "{sweep_best_speedup:.2f}x (acceptance {sweep_best_acceptance:.2f}, k = {sweep_best_k})."),
        Sentence("The suffix drafter on {suffix_requests} held-out structured request(s) ({suffix_model}): "
                 "{suffix_tpv_empty:.2f} tokens per verify with an empty store, {suffix_tpv_full:.2f} with "
                 "{suffix_store_tokens} tokens of earlier outputs; {suffix_speedup_empty:.2f}x and "
                 "{suffix_speedup_full:.2f}x plain greedy; outputs {suffix_identical:identical to|DIFFERENT from} "
                 "plain greedy's.", when="suffix_store_tokens"),
    ),
    columns=(Column("drafter", "drafter"), Column("k", "draft length k (tokens)"),
             Column("c", "c (target steps per draft token)", ".3f"),
             Column("acceptance_rate", "acceptance (fraction)", ".3f"),
             Column("measured_speedup", "measured speed-up (x)", ".2f"),
             Column("breakdown_speedup", "breakdown, same run (x)", ".2f"),
             Column("identical_to_plain", "output vs plain greedy", "identical|DIFFERENT")),
    caption="The same draft model, its step in C and in PyTorch",
    figure="lesson.draft_step_comparison(",
)
