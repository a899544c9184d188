"""Lesson 1 (speculative decoding): the experiments and figures of notebooks/01_speculative.ipynb.

Each experiment returns a DataFrame and a matplotlib Figure:
  acceptance_by_kind   acceptance and per-position acceptance for each drafter x kind of text
  speedup_vs_k         measured speed-up against k, next to Leviathan's formula (a and c measured on other
                       prompts: a prediction) and the breakdown of the same run (its a_i, c and verify cost curve)

The break-even is lessonkit.lessons.break_even (its figures) and lessonkit.measure.break_even; the
measurements alone (trace_verify_step, per_position_acceptance, sampling_tv: the emitted distribution of
the correct and of a broken sampler, against the target's) are lessonkit.measure.speculative.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.lessons.figures import integer_axis, legend_beside
from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.measure import numerics_paths as paths
from lessonkit.measure.speculative import _timed_runs, drafter_table
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import ModelDrafter, c_step_why_not
from lessonkit.measure.apart import Apart, predict_speedup
from lessonkit.speculative.gate import acceptance_by_position, measure_cost_curve
from lessonkit.speculative.gate import breakdown_speedup
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.drafter_registry import make_drafter
from lessonkit.workloads.corpus import prompts_by_kind


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
        cond = acceptance_by_position(t)
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


def two_numerics(model: str = "smollm2-135m", drafters=None, *, k: int = 3, k_max: int = 7, n_prompts: int = 1,
                 max_new_tokens: int = 32, repeats: int = 2, seed: int = 0):
    """Section 2's experiment: `model` loaded on each numerics (measure.numerics_paths), its verify cost curve
    against the cost model, and each drafter's predicted and measured decode speed-up on each. The timed prompts
    and the prompts the acceptance is measured on apart are drawn with different seeds. Returns (cost table,
    drafter table, Figure, notes)."""
    drafters = drafters or {"distilled draft": "smollm2-draft", "n-gram lookup": "ngram", "feature head": "head"}
    engines, notes = paths.load_on_each(model)
    cost_df, costs = paths.verify_costs(engines, k_max, repeats=3 * repeats + 1)
    first = next(iter(engines.values()))
    timed, apart = ([p for ps in prompts_by_kind(first, n=n_prompts, max_tokens=48, seed=s).values() for p in ps]
                    for s in (seed, seed + 1))
    spd = paths.drafter_on_each(engines, costs, drafters, timed, apart, k=k, max_new_tokens=max_new_tokens,
                                repeats=repeats)
    return cost_df, spd, plot_two_numerics(cost_df, spd, model), notes


def plot_two_numerics(cost_df: pd.DataFrame, spd: pd.DataFrame, model: str):
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, (nm, d) in enumerate(cost_df.groupby("numerics", sort=False)):
        ax.plot(d.k, d.measured, "o", color=f"C{i}", label=f"{nm}: measured (T1 {d.T_ms.iloc[0]:.1f} ms)")
        ax.plot(d.k, d.model_b_fit, "-", color=f"C{i}", label=f"{nm}: (b + M)/(b + 1), b = {d.b_fit.iloc[0]:.1f} from T(2)")
    ax.plot(d.k, cost_df[cost_df.numerics == d.numerics.iloc[0]].model_b3, ":", color="gray", label="b = 3 (exact's op count)")
    ax.set_xlabel("drafts verified, k (rows M = k + 1)")
    ax.set_ylabel("verify cost T(k+1)/T(1)")
    ax.set_title(f"{model}: what a verify row costs")
    integer_axis(ax)
    legend_beside(ax, fontsize=8)
    labels = [f"{r.drafter}\n{r.numerics}" for r in spd.itertuples()]
    x = np.arange(len(spd))
    bx.bar(x - 0.2, spd.predicted_speedup, 0.4, label="predicted (parts measured apart)")
    bx.bar(x + 0.2, spd.measured_speedup, 0.4, label="measured (decode phase)")
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_xticks(x, labels, fontsize=8)
    bx.set_ylabel("speed-up over plain greedy (x)")
    bx.set_title(f"k = {int(spd.k.iloc[0])}: above 1 pays, below 1 loses")
    legend_beside(bx, fontsize=8)
    fig.tight_layout()
    return fig


def _iid_acceptance(e: float, k: int) -> float:
    """The a at which E(a, k) = 1 + a + ... + a^k equals e (an i.i.d. drafter emitting the same tokens a verify)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < e else (lo, mid)
    return (lo + hi) / 2


def speedup_against_acceptance(cost_df: pd.DataFrame, spd: pd.DataFrame, surf_df: pd.DataFrame | None = None):
    """Lesson 1's one picture of when speculation pays: speed-up against acceptance a for a free drafter in each
    regime (the resident model on each numerics, at section 2's k and measured verify cost; the disk-bound model of
    section 5 at its smallest budget), and each real drafter as a pair of points at the i.i.d. acceptance that
    gives its tokens per verify: predicted (hollow, from parts measured apart) and measured (filled)."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    a = np.linspace(0.0, 0.99, 100)
    k = int(spd.k.iloc[0])
    for i, (nm, d) in enumerate(cost_df[cost_df.k == k].groupby("numerics", sort=False)):
        ratio = float(d.measured.iloc[0])
        ax.plot(a, [sum(x ** j for j in range(k + 1)) / ratio for x in a], "-", color=f"C{i}",
                label=f"resident, {nm} numerics (verify {ratio:.2f} steps, k = {k})")
    if surf_df is not None and len(surf_df):
        b, kd = surf_df.budget_experts.min(), surf_df.k.max()
        g = surf_df[(surf_df.budget_experts == b) & (surf_df.k == kd)].sort_values("acceptance")
        ax.plot(g.acceptance, g.speedup, "--", color="C3", label=f"disk-bound tiny-moe ({b} experts resident, k = {kd})")
    colours = {nm: f"C{i}" for i, nm in enumerate(cost_df.numerics.unique())}
    markers = dict(zip(spd.drafter.unique(), "osD^v"))
    for r in spd.itertuples():
        c, m = colours.get(r.numerics, "k"), markers.get(r.drafter, "o")
        ax.plot(_iid_acceptance(r.E_predicted, k), r.predicted_speedup, m, mfc="none", color=c)
        ax.plot(_iid_acceptance(r.tokens_per_verify, k), r.measured_speedup, m, color=c,
                label=f"{r.drafter} ({r.numerics}): hollow predicted, filled measured")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("acceptance a (a real drafter at the i.i.d. a that gives its tokens per verify)")
    ax.set_ylabel("speed-up over plain decoding (x)")
    ax.set_title("Where speculation pays: each regime's curve for a free drafter; real drafters pay their draft cost "
                 "below it", fontsize=9)
    legend_beside(ax, fontsize=7)
    fig.tight_layout()
    return fig


def two_numerics_sentences(cost_df: pd.DataFrame, spd: pd.DataFrame) -> list[str]:
    """Section 2's sentences, from the run's numbers: the verify cost measured and predicted per numerics, and
    for each drafter where it paid and where it lost."""
    out = []
    for nm, d in cost_df.groupby("numerics", sort=False):
        r = d[d.rows == 5].iloc[0] if (d.rows == 5).any() else d.iloc[-1]
        out.append(f"{nm} numerics: a {int(r.rows)}-row verify costs {r.measured:.2f} plain steps (one step "
                   f"{d.T_ms.iloc[0]:.1f} ms); the cost model predicts {r.model_b3:.2f} with b = 3 and "
                   f"{r.model_b_fit:.2f} with b = {r.b_fit:.1f} fitted to the 2-row step alone")
    for dr, g in spd.groupby("drafter", sort=False):
        won = [f"{r.numerics} {r.measured_speedup:.2f}x (predicted {r.predicted_speedup:.2f}x, a* {_a(r.a_star)}, "
               f"a1 measured apart {r.a1_apart:.2f}, c {r.c:.2f})" for r in g.itertuples()]
        pays = g[g.measured_speedup > 1].numerics.tolist()
        verdict = ("pays on neither numerics in this run" if not pays else
                   "pays on both numerics in this run" if len(pays) == len(g) else
                   f"pays on the {', '.join(pays)} numerics and loses on the "
                   f"{', '.join(n for n in g.numerics if n not in pays)} in this run")
        out.append(f"{dr} at k = {int(g.k.iloc[0])}: " + "; ".join(won) + f"; it {verdict}")
    out.append("every speculative output identical to plain greedy on its own numerics: "
               f"{bool(spd.identical_to_plain.all())}")
    return out


def _a(a) -> str:
    return "never" if a is None or a != a else f"{a:.2f}"


def speedup_vs_k(target, drafter, prompts: list[list[int]], *, apart: Apart, ks=(1, 2, 3, 4, 6, 8),
                 max_new_tokens: int = 32, repeats: int = 2, cost: list[float] | None = None):
    """Measured speed-up of greedy speculative decoding vs plain greedy, for each k, with predictions.

    apart: what runs on other prompts measured (measure.speculative.measure_apart): the per-position acceptance and
    c a prediction may read (`measure.apart.predict_speedup` refuses them if a timed prompt is among theirs).
    Predicted from it: E_apart = 1 + a1 + a1 a2 + ... (next to tokens_per_verify, measured with the prefill forward
    and its token left out) and Leviathan's (1 - a^(k+1)) / ((1 - a)(k c + 1)) from its first-position a and c.
    breakdown_speedup (fitted from the same run, so it explains the measurement, it predicts nothing): E(k) from
    this run's per-position acceptance, T(k+1)/T(1) from the cost curve, this run's draft time per token and the
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
    cond = acceptance_by_position(runs[kmax])
    rows = []
    for k in ks:
        r = runs[k]
        lev = predict_speedup(apart, k, prompts, iid=True, free_verify=True)
        rows.append({"k": k, "measured_speedup": plain["wall_s"] / r["wall_s"],
                     "leviathan_speedup": lev["predicted_speedup"],
                     "breakdown_speedup": breakdown_speedup(plain, r, k, cost),
                     "a_first_pos": apart.acceptance[0] if apart.acceptance else float("nan"), "c": apart.c,
                     "c_this_run": (r["draft_s"] / r["num_draft_tokens"] / t_tok) if r["num_draft_tokens"] else 0.0,
                     "cost_ratio": cost[k] / cost[0],
                     "acceptance_rate": r["acceptance_rate"], "tokens_per_forward": r["tokens_per_forward"],
                     "E_iid_a1": lev["E_predicted"], "tokens_per_s": r["tokens_per_s"],
                     "E_apart": predict_speedup(apart, k, prompts)["E_predicted"],
                     "tokens_per_verify": (r["new_tokens"] - r["runs"]) / max(r["forwards"] - r["runs"], 1),
                     "plain_tokens_per_s": plain["tokens_per_s"]})
    df = pd.DataFrame(rows)
    a = df.a_first_pos.iloc[0]
    return df, plot_speedup_vs_k(df, cond, cost, kmax, a, title=f"Speed-up vs k with {getattr(drafter, 'name', 'drafter')} "
                                 f"on {target.name}: the i.i.d. formula misses\ndecaying acceptance and rising verify cost")


def plot_speedup_vs_k(df: pd.DataFrame, cond, cost, kmax: int, a: float, title: str):
    """Left: measured speed-up vs k against Leviathan's prediction and the breakdown; right: acceptance and verify cost."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(df.k, df.measured_speedup, "o-", label="measured")
    ax1.plot(df.k, df.leviathan_speedup, "s--", label=f"predicted: Leviathan (a={a:.2f}, c={df.c.iloc[0]:.2f}, other prompts)")
    ax1.plot(df.k, df.breakdown_speedup, "^:", label="breakdown: this run's a_i, c and T(k+1)")
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
    fig.suptitle(title)
    fig.tight_layout()
    return fig


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
    round, so drift lands on all alike) and the breakdown from the same run's numbers (breakdown_speedup: fitted
    from that run, so it explains the measurement, it does not predict it).

    drafters: {label: Drafter}. Returns (DataFrame, Figure); identical_to_plain checks every run's tokens."""
    df = drafter_table(target, drafters, prompts, k=k, max_new_tokens=max_new_tokens, repeats=repeats, cost=cost)
    return df, plot_drafter_comparison(df)


def plot_drafter_comparison(df: pd.DataFrame):
    """Left: acceptance per draft position; right: measured speed-up next to the same run's breakdown."""
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
    ax2.bar(x + 0.2, df["breakdown_speedup"], 0.4, label="breakdown (same run's a_i, c, T)", alpha=0.6)
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
    """One drafter, two implementations of its steps (drafter_comparison): the draft model's own C forward (a
    greedy turn of k drafts in one C call, CForward.draft_greedy) and the PyTorch lean step. Same weights, the
    same proposals up to ties in the last bits; only the draft cost c differs, so the speed-up difference is what
    c alone does. Without the C forward only the PyTorch row is measured and a note says why. Returns
    (DataFrame, Figure, notes)."""
    target, draft = load_model(target_name), load_model(draft_name)
    prompts = [p for ps in prompts_by_kind(target, n=n_prompts, max_tokens=48, seed=seed).values() for p in ps]
    drafters, notes = {}, []
    reason = c_step_why_not(draft)
    if reason:
        notes.append(f"{draft_name}: no C step ({reason}); only the PyTorch step is measured")
    else:
        drafters[f"{draft_name}, C step"] = ModelDrafter(draft, step="C")
    drafters[f"{draft_name}, PyTorch step"] = ModelDrafter(draft, step="torch")
    df, fig = drafter_comparison(target, drafters, prompts, k=k, max_new_tokens=max_new_tokens, repeats=repeats)
    return df, fig, notes


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


HEADLINE = Headline(
    title="Speculative decoding",
    sentences=(
        Sentence("{models}: speculative decoding ran {measured_speedup_best_k:.2f}x plain greedy at its best draft "
                 "length k = {best_k}; Leviathan's formula (first-position acceptance and c from other prompts, i.i.d.) predicted "
                 "{leviathan_speedup_best_k:.2f}x; the breakdown fitted from the same run's a_i, c and verify cost "
                 "gives {breakdown_speedup_best_k:.2f}x."),
        Sentence("The draft model had {tiny_draft_acceptance_rate:.0%} of its drafted tokens accepted, n-gram lookup "
                 "{ngram_acceptance_rate:.0%}; every drafter's output was checked against plain greedy (table)."),
        Sentence("A verify forward at k = 4 cost {verify_cost_ratio_k4:.2f}x a plain one-token step."),
        Sentence("{path_model} at k = {k_path}: a verify cost {verify_cost_k_path_exact:.2f} plain steps on the exact "
                 "numerics and {verify_cost_k_path_int8:.2f} on the int8 numerics; prompt lookup ran "
                 "{speedup_exact_ngram:.2f}x (exact) and {speedup_int8_ngram:.2f}x (int8) plain greedy's decode, the "
                 "distilled draft {speedup_exact_draft:.2f}x and {speedup_int8_draft:.2f}x.", when="path_model"),
        Sentence("With experts streamed from {disk_words}, the cost model puts speculation "
                 "below plain speed in {break_even_cells_losing} of {break_even_cells} cells of the break-even surface "
                 "(acceptance x expert budget x depth); the cells measured for real were {validation_error_median:.0%} "
                 "off the model (median, {validation_cells} cells)."),
        Sentence("On held-out requests, {win_drafter} on {win_category} ran {win_measured_speedup:.2f}x plain greedy "
                 "(predicted {win_predicted_speedup:.2f}x from parts measured apart); {loss_drafter} on {loss_category} "
                 "{loss_measured_speedup:.2f}x (predicted {loss_predicted_speedup:.2f}x). Distinct completions per "
                 "prompt over verify widths and threads: lessonkit {distinct_completions_lessonkit}, transformers' "
                 "assisted generation {distinct_completions_transformers}."),
    ),
    columns=(Column("model", "target"), Column("drafter", "drafter"),
             Column("acceptance_rate", "acceptance (%)", ".0f", scale=100),
             Column("c", "draft cost c (target steps)", ".3f"),
             Column("measured_speedup", "measured speed-up (x)", ".2f"),
             Column("breakdown_speedup", "breakdown (same run) (x)", ".2f"),
             Column("identical_to_plain", "output vs plain greedy", "identical|DIFFERS")),
    table="drafters",
    caption="Drafters side by side",
    figure="lesson.compare_drafters(",
)
