"""Lesson 5 (semantic caching): the measurements and figures of notebooks/05_semantic_cache.ipynb.

Everything runs the real pipeline of lessonkit.semcache on the shipped stream
(data/semcache/stream.jsonl): the fresh answers of the judge are the ground truth, read from the
recorded ground-truth file when its judge fingerprint matches the live judge, else computed live.
"""
from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.measure.semcache import SMOKE_ITEMS
from lessonkit.semcache.audit import AuditConfig, clopper_pearson_upper
from lessonkit.semcache.judge import (DEFAULT_JUDGE, UNTRAINED_JUDGE, RecordedJudge, agreement, answers_path,
                                      ground_truth_judge)
from lessonkit.semcache.policies import POLICY_NAMES, embed_stream, make_policy, run_stream
from lessonkit.workloads.monitoring import load_stream


class LessonData:
    """What the notebook works on: the stream, the ground-truth judge (the trained smollm2-135m judge), the
    live judge, the untrained judge's recorded answers (the contrast), embeddings."""

    def __init__(self, smoke: bool, live: bool = True, progress: bool = True, judge: str = DEFAULT_JUDGE):
        self.items = load_stream(limit=SMOKE_ITEMS if smoke else None)
        self.texts = [it.text for it in self.items]
        if live:
            self.judge, self.live = ground_truth_judge("recorded", progress=progress, model=judge)
        else:
            self.judge, self.live = RecordedJudge.from_file(answers_path(judge)), None
        self.untrained = RecordedJudge.from_file(answers_path(UNTRAINED_JUDGE))
        self.embeddings = embed_stream(self.texts, progress=progress)


def judge_quality(items, judges: dict) -> pd.DataFrame:
    """Agreement of each judge (name -> judge) with the intended labels: overall, per perturbation, per family."""
    rows = []
    for name, judge in judges.items():
        a = agreement(items, {t: bool(judge(t)) for t in dict.fromkeys(it.text for it in items)})
        for group, key in (("overall", "overall"), ("perturbation", "perturbation"), ("relation", "relation"),
                           ("family", "family")):
            for k, v in a[key].items():
                rows.append({"judge": name, "group": group, "value": k if group != "overall" else "all items",
                             "items": v["n"], "agreement": v["accuracy"]})
    df = pd.DataFrame(rows)
    return df.pivot_table(index=["group", "value"], columns="judge", values="agreement", sort=False)


def plot_confusion(items, judges: dict):
    """One 2x2 confusion matrix per judge: intended needs_action (rows) against the judge's answer (columns)."""
    fig, axes = plt.subplots(1, len(judges), figsize=(3.6 * len(judges), 3.4), squeeze=False)
    for ax, (name, judge) in zip(axes[0], judges.items()):
        m = np.zeros((2, 2), dtype=int)
        for it in items:
            m[int(not it.needs_action), int(not judge(it.text))] += 1
        ax.imshow(m, cmap="Blues")
        for (r, c), v in np.ndenumerate(m):
            ax.text(c, r, str(v), ha="center", va="center", color="k" if v < m.max() / 2 else "w")
        ax.set_xticks([0, 1], ["judge: yes", "judge: no"])
        ax.set_yticks([0, 1], ["intended: yes", "intended: no"])
        ax.set_title(f"{name}\n{100 * np.trace(m) / m.sum():.1f}% agree", fontsize=9)
    fig.tight_layout()
    return fig


def stream_table(items, judge):
    """Counts per relation and perturbation, with the share the judge answers "yes"."""
    df = pd.DataFrame([{"relation": it.relation, "perturbation": it.perturbation or "",
                        "judge_yes": bool(judge(it.text))} for it in items])
    return df.groupby(["relation", "perturbation"]).agg(items=("judge_yes", "size"),
                                                        judge_yes_share=("judge_yes", "mean"))


def live_check(recorded, live, texts, n: int = 3):
    """The live judge against the recorded ground truth on ``n`` distinct items (and its call time)."""
    rows = []
    for t in list(dict.fromkeys(texts))[:n]:
        t0 = time.perf_counter()
        s = live.score(t)
        rows.append({"item": t[:60], "recorded_score": recorded.score(t), "live_score": s,
                     "same_answer": (s > live.bias) == recorded(t), "judge_ms": (time.perf_counter() - t0) * 1e3})
    return pd.DataFrame(rows)


def calibrate_safe_margin(items, judge) -> float:
    """Widest spread of the judge's log-odds within one meaning (an original, its repeats and paraphrases).

    A "no" stored at least this far below the judge's boundary stays a "no" for every rewording of
    the same facts seen here. Computed on the calibration split (the first SMOKE_ITEMS items).
    """
    groups: dict[int, list] = {}
    for it in items:
        if it.relation in ("original", "exact_repeat", "paraphrase"):
            groups.setdefault(it.id if it.parent is None else it.parent, []).append(judge.score(it.text))
    spreads = [max(g) - min(g) for g in groups.values() if len(g) > 1]
    return max(spreads) if spreads else 0.0


def sweep(texts, judge, embeddings, thresholds=(0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98),
          policies=("two-sided", "one-sided", "one-sided+guard"), no_margin: bool = True,
          progress: bool = True):
    """Hit rate and (actionable) loss rate of each policy as the threshold moves.

    With ``no_margin`` the one-sided policies also run with safe_margin 0 (every "no" reused).
    """
    rows = [run_stream(texts, make_policy("exact"), judge, embeddings=embeddings).summary()]
    grid = [(p, t, None) for p in policies for t in thresholds]
    if no_margin:
        grid += [(p, t, 0.0) for p in policies if p.startswith("one-sided") for t in thresholds]
    for p, t, m in tqdm(grid, desc="threshold sweep", disable=not progress):
        s = run_stream(texts, make_policy(p, t, m), judge, embeddings=embeddings).summary()
        if m is not None:
            s["policy"] += f" (margin {m:g})"
        rows.append(s)
    return pd.DataFrame(rows)


def losses_by_relation(result, items):
    """Served hits and losses split by how the query relates to its original."""
    rel = {k: (it.relation if it.relation != "hard_negative" else f"hard negative: {it.perturbation}")
           for k, it in enumerate(items)}
    df = pd.DataFrame([{"relation": rel[r.index], "hit": r.hit, "loss": r.loss, "actionable": r.actionable}
                       for r in result.records])
    return df.groupby("relation").agg(queries=("hit", "size"), hits=("hit", "sum"), losses=("loss", "sum"),
                                      actionable_losses=("actionable", "sum"))


def plot_tradeoff(df):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, g in df.groupby("policy", sort=False):
        g = g.sort_values("threshold")
        ax.plot(100 * g["hit_rate"], 100 * g["actionable_loss_rate"], "o-", label=name)
        if name != "exact":
            for _, r in g.iterrows():
                ax.annotate(f"{r['threshold']:g}", (100 * r["hit_rate"], 100 * r["actionable_loss_rate"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("hit rate (% of queries served from cache)")
    ax.set_ylabel("actionable losses (% of queries)")
    ax.set_title("Only the guarded one-sided cache buys hits without hiding alerts")
    ax.legend()
    fig.tight_layout()
    return fig


def similarity_to_parent(items, embeddings) -> dict[str, np.ndarray]:
    """Cosine of each derived item to its original, grouped by relation / perturbation."""
    index = {it.id: k for k, it in enumerate(items)}
    groups: dict[str, list] = {}
    for k, it in enumerate(items):
        if it.parent is None or it.parent not in index:
            continue
        label = it.relation if it.relation != "hard_negative" else f"hard negative: {it.perturbation}"
        groups.setdefault(label, []).append(float(embeddings[k] @ embeddings[index[it.parent]]))
    return {k: np.array(v) for k, v in sorted(groups.items())}


def plot_similarity(groups: dict[str, np.ndarray], threshold: float = 0.8):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bins = np.linspace(min(0.5, min(v.min() for v in groups.values())), 1.0, 41)
    for name, v in groups.items():
        if name == "exact_repeat":
            continue
        ax.hist(v, bins=bins, histtype="step", linewidth=1.6, label=f"{name} (n={len(v)})")
    ax.axvline(threshold, color="k", linestyle="--", label=f"GPTCache default {threshold}")
    ax.set_xlabel("cosine similarity to the original item")
    ax.set_ylabel("items")
    ax.set_title("Hard negatives score as high as paraphrases: a threshold cannot separate them")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_audit(result, confidence: float = 0.95):
    """The audit's upper bound on the loss rate as audits accumulate, against the zero-loss references
    (Clopper-Pearson and the rule of three). The title says what this run's audits showed; with no audit
    at all the figure says so instead of drawing an empty chart."""
    traj = result.auditor.trajectory if result.auditor else []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    n = np.arange(1, max(len(traj), 50) + 1)              # the references over a readable range, always
    ax.plot(n, [clopper_pearson_upper(0, int(k), confidence) for k in n], color="0.75", linewidth=6,
            label="0 losses in n audits (Clopper-Pearson)", zorder=1)
    ax.plot(n, np.minimum(3.0 / n, 1.0), color="k", linestyle="--", linewidth=1, label="3/n (rule of three)",
            zorder=2)
    if result.audit is not None:
        ax.axhline(result.audit.limit, color="tab:red", linewidth=1, label=f"stop limit {result.audit.limit:g}")
    if traj:
        ax.plot([t[1] for t in traj], [t[3] for t in traj], "o-", color="tab:blue", markersize=4, linewidth=1.5,
                label=f"{result.policy}: its audits", zorder=3)
    else:
        ax.text(0.5, 0.5, f"{result.policy}: no hit was audited in this run", transform=ax.transAxes,
                ha="center", va="center")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("audited hits n")
    ax.set_ylabel(f"{int(confidence * 100)}% upper bound on the loss rate")
    ax.set_title(_audit_title(result, traj), fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def _audit_title(result, traj) -> str:
    """What the run's audits showed, in one line."""
    if not traj:
        return f"{result.policy}: no audits, so no bound on its loss rate"
    _, audits, losses, upper = traj[-1]
    if losses == 0:
        return (f"{result.policy}: 0 losses in {audits} audits bounds the loss rate by {upper:.3f} "
                "(about 3/n), not by zero")
    stopped = result.auditor.stopped_at
    return (f"{result.policy}: {losses} loss{'es' if losses != 1 else ''} in {audits} audit{'s' if audits != 1 else ''}, "
            f"upper bound {upper:.2f}" + (f" > limit {result.audit.limit:g}: stopped serving at query {stopped}"
                                          if stopped is not None else ""))


def policy_table(data, *, policy: str, threshold: float, audit_rate: float, seed: int = 0) -> pd.DataFrame:
    """Lesson 5's panel, one setting: the stream served by `policy` at `threshold`, audited at `audit_rate`."""
    r = run_stream(data.texts, make_policy(policy, threshold), data.judge, embeddings=data.embeddings,
                   audit=AuditConfig(rate=audit_rate, seed=seed)).summary()
    bound = f"{100 * r['audit_upper_bound']:.1f}" + (" (no audits: nothing is known)" if not r["audits"] else "")
    rows = [("hits", f"{r['hits']} ({100 * r['hit_rate']:.1f}%)", "queries served from the cache"),
            ("losses", f"{r['losses']}", "hits whose answer differs from the judge's"),
            ("actionable losses", f"{r['actionable_losses']}", "served 'no' hiding a fresh 'yes'"),
            ("audits", f"{r['audits']}", "hits checked against the judge"),
            ("audit upper bound", bound, "% loss rate (95%)"),
            ("stopped serving at", "never" if r["policy_stopped_at"] is None else f"query {r['policy_stopped_at']}", "")]
    return quantity_table(rows)


def policy_panel(data, seed: int = 0) -> None:
    """Policy, similarity threshold and audit rate over `policy_table`."""
    import ipywidgets as w
    show_panel({"policy": w.Dropdown(options=POLICY_NAMES, value="one-sided+guard", description="policy"),
                "threshold": w.FloatSlider(value=0.85, min=0.6, max=1.0, step=0.01, description="threshold"),
                "audit_rate": w.FloatSlider(value=0.05, min=0.0, max=1.0, step=0.01, description="audit rate")},
               lambda **kw: policy_table(data, seed=seed, **kw), title="Serving from the cache, and what the audit sees")


HEADLINE = Headline(
    title="Semantic caching",
    sentences=(
        Sentence("On {items} stream items, a two-sided cache at cosine 0.8 served {two_sided_0.8_hit_rate:.0%} of "
                 "requests from cache and made {two_sided_0.8_actionable_losses} actionable losses (a served "
                 "answer that would have changed the action)."),
        Sentence("The one-sided policy with its guard served {one_sided_guard_hit_rate:.0%} "
                 "({guard_hit_rate_share_of_two_sided:.0%} of the two-sided hit rate) with "
                 "{one_sided_guard_actionable_losses} actionable losses; without the guard it made "
                 "{one_sided_actionable_losses}."),
        Sentence("The audit bounds the guarded cache's loss rate below {guarded_audit_upper_bound:.1%} (95% "
                 "Clopper-Pearson upper bound)."),
        Sentence("Audited the same way, the two-sided cache was stopped at stream item "
                 "{two_sided_audited_stopped_at}.", when="two_sided_audited_stopped_at"),
        Sentence("The judge {judge} agreed with the labels on {judge_agreement:.1%} of items (worst perturbation "
                 "family {judge_min_perturbation_agreement:.1%}; the untrained model {untrained_judge_agreement:.1%}, "
                 "with which the two-sided cache made {untrained_two_sided_0.8_actionable_losses} actionable losses)."),
        Sentence("Serving a hit took {hit_ms:.1f} ms, a live judge call {judge_call_ms:.0f} ms.", when="judge_call_ms"),
    ),
    columns=(Column("policy", "policy"), Column("threshold", "cosine threshold", ".2f"), Column("hits", "hits"),
             Column("hit_rate", "hit rate (%)", ".1f", scale=100), Column("judge_calls_saved", "judge calls saved"),
             Column("losses", "losses"), Column("actionable_losses", "actionable losses")),
    caption="Four policies on the same stream",
    figure="lesson.plot_tradeoff(",
)
