"""Lesson 5 measurements, figures, CLI (`lessonkit semcache run`) and bench (`lessonkit bench semcache`).

Everything here runs the real pipeline of lessonkit.semcache on the shipped stream
(data/semcache/stream.jsonl): the fresh answers of the judge are the ground truth, read from the
recorded ground-truth file when its judge fingerprint matches the live judge, else computed live.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from lessonkit.engine.errors import LessonkitError
from lessonkit.workloads.judge import GROUND_TRUTH_PATH, RecordedJudge, RuleJudge, instruction_fingerprint
from lessonkit.workloads.monitoring import load_stream
from lessonkit.semcache import (AUDIT_OFF, POLICY_NAMES, CacheStore, load_embedder, make_policy,
                                run_stream, scope_key)
from lessonkit.semcache_audit import AuditConfig, clopper_pearson_upper

SMOKE_ITEMS = 300


# ---------------------------------------------------------------- inputs


def ground_truth_judge(kind: str = "recorded", path=GROUND_TRUTH_PATH, progress: bool = True):
    """The judge whose fresh answers are the ground truth.

    kind: "real" (smollm2-135m live on the engine), "recorded" (the recorded file, checked against
    the live judge's fingerprint and completed live where items are missing; if the live judge is
    a different one, its answers replace the file's), or "rule" (the fast fake, for tests).
    """
    if kind == "rule":
        return RuleJudge(), None
    from lessonkit.workloads.judge import load_judge
    live = load_judge()
    if kind == "real":
        return live, live
    try:
        rec = RecordedJudge.from_file(path)
    except LessonkitError:
        return RecordedJudge({}, live.score_fingerprint, live.bias, live), live
    if rec.score_fingerprint != live.score_fingerprint:
        print(f"note: recorded scores are from judge {rec.score_fingerprint}, the live judge is "
              f"{live.score_fingerprint}; judging live instead", file=sys.stderr)
        return RecordedJudge({}, live.score_fingerprint, live.bias, live), live
    return RecordedJudge(rec.scores, rec.score_fingerprint, live.bias, live), live


def embed_stream(texts: list[str], progress: bool = True) -> np.ndarray:
    """Unit embeddings of ``texts`` (each distinct text embedded once)."""
    unique = list(dict.fromkeys(texts))
    emb = load_embedder().embed(unique, progress=progress)
    row = {t: i for i, t in enumerate(unique)}
    return emb[[row[t] for t in texts]]


# ---------------------------------------------------------------- measurements and figures


class LessonData:
    """What the notebook works on: the stream, the ground-truth judge, the live judge, embeddings."""

    def __init__(self, smoke: bool, live: bool = True, progress: bool = True):
        self.items = load_stream(limit=SMOKE_ITEMS if smoke else None)
        self.texts = [it.text for it in self.items]
        if live:
            self.judge, self.live = ground_truth_judge("recorded", progress=progress)
        else:
            self.judge, self.live = RecordedJudge.from_file(), None
        self.embeddings = embed_stream(self.texts, progress=progress)


def stream_table(items, judge):
    """Counts per relation and perturbation, with the share the judge answers "yes"."""
    import pandas as pd
    df = pd.DataFrame([{"relation": it.relation, "perturbation": it.perturbation or "",
                        "judge_yes": bool(judge(it.text))} for it in items])
    return df.groupby(["relation", "perturbation"]).agg(items=("judge_yes", "size"),
                                                        judge_yes_share=("judge_yes", "mean"))


def live_check(recorded, live, texts, n: int = 3):
    """The live judge against the recorded ground truth on ``n`` distinct items (and its call time)."""
    import pandas as pd
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
    import pandas as pd
    from tqdm.auto import tqdm
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
    import pandas as pd
    rel = {k: (it.relation if it.relation != "hard_negative" else f"hard negative: {it.perturbation}")
           for k, it in enumerate(items)}
    df = pd.DataFrame([{"relation": rel[r.index], "hit": r.hit, "loss": r.loss, "actionable": r.actionable}
                       for r in result.records])
    return df.groupby("relation").agg(queries=("hit", "size"), hits=("hit", "sum"), losses=("loss", "sum"),
                                      actionable_losses=("actionable", "sum"))


def plot_tradeoff(df):
    import matplotlib.pyplot as plt
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
    import matplotlib.pyplot as plt
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
    """The audit's upper bound on the loss rate as audits accumulate, against the rule of three."""
    import matplotlib.pyplot as plt
    traj = result.auditor.trajectory
    fig, ax = plt.subplots(figsize=(7, 4.5))
    n = np.arange(1, max(len(traj), 2) + 1)
    ax.plot(n, [clopper_pearson_upper(0, int(k), confidence) for k in n], "k:",
            label="0 losses in n audits (Clopper-Pearson)")
    ax.plot(n, np.minimum(3.0 / n, 1.0), color="grey", linestyle="--", label="3/n (rule of three)")
    if traj:
        ax.plot([t[1] for t in traj], [t[3] for t in traj], "-", linewidth=2,
                label=f"{result.policy} audits (losses so far: {traj[-1][2]})")
    ax.axhline(result.audit.limit, color="tab:red", linewidth=1, label=f"stop limit {result.audit.limit:g}")
    ax.set_xscale("log")
    ax.set_xlabel("audited hits n")
    ax.set_ylabel(f"{int(confidence * 100)}% upper bound on the loss rate")
    ax.set_title("Zero losses in n audits bounds the loss rate by about 3/n, not by zero")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def time_hits(texts, policy, judge, embeddings, n: int = 40) -> dict:
    """Cache-side time per query on a hit, with the query embedded live (median over ``n`` hits, ms).

    The stream runs once on precomputed embeddings to find its hits; then each of the first ``n``
    hits is replayed against the filled store: embed the query (MiniLM, one text), search, guard.
    """
    store = CacheStore(":memory:", "timing")
    result = run_stream(texts, policy, judge, embeddings=embeddings, store=store)
    embedder = load_embedder()
    embedder.embed_one("warm-up")
    hit_ms = []
    for r in [r for r in result.records if r.hit][:n]:
        t0 = time.perf_counter()
        policy.lookup(store, r.text, embedder.embed_one(r.text))
        hit_ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_hit_ms": statistics.median(hit_ms) if hit_ms else None, "hits_timed": len(hit_ms)}


def time_judge(judge, texts, n: int = 15) -> float:
    """Median wall time of a fresh judge call in ms (the real judge, not the recorded file).

    One untimed warm-up call first: it runs the constant instruction head once for the snapshot.
    """
    judge(texts[0])
    times = []
    for t in texts[:n]:
        t0 = time.perf_counter()
        judge(t)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ---------------------------------------------------------------- CLI


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("semcache", help="semantic cache over the monitoring stream (lesson 5)")
    sub = p.add_subparsers(dest="semcache_cmd", required=True)
    r = sub.add_parser("run", help="run one policy over the shipped stream")
    r.add_argument("--policy", default="one-sided+guard", choices=POLICY_NAMES)
    r.add_argument("--threshold", type=float, default=None, help="cosine threshold (policy default if omitted)")
    r.add_argument("--audit-rate", type=float, default=0.05, help="share of hits re-judged after probation")
    r.add_argument("--audit-first", type=int, default=None,
                   help="hits of a new entry always audited (default 2, or 0 with --audit-rate 0: audit off)")
    r.add_argument("--audit-limit", type=float, default=0.10, help="stop serving above this loss bound")
    r.add_argument("--limit", type=int, default=None, help="use only the first N items of the stream")
    r.add_argument("--judge", default="recorded", choices=("recorded", "real", "rule"))
    r.add_argument("--store", default=":memory:", help="SQLite file for the cache (default: in memory)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cli_run)
    rec = sub.add_parser("record", help="recompute the judge ground-truth file with the real judge")
    rec.add_argument("--batched", action="store_true", help="score in transformers batches, check on the engine")
    rec.add_argument("--check", type=int, default=3, help="items re-scored by the engine (with --batched)")
    rec.set_defaults(func=cli_record)


def cli_run(args) -> int:
    items = load_stream(limit=args.limit)
    texts = [it.text for it in items]
    judge, _ = ground_truth_judge(args.judge, progress=not args.json)
    if args.judge == "rule":
        judge = RuleJudge({it.text: it.needs_action for it in items})
    policy = make_policy(args.policy, args.threshold)
    first = args.audit_first if args.audit_first is not None else (2 if args.audit_rate > 0 else 0)
    audit = AuditConfig(rate=args.audit_rate, first_n=first, limit=args.audit_limit, seed=args.seed)
    embedder = load_embedder()
    embeddings = None if args.policy == "exact" else embed_stream(texts, progress=not args.json)
    scope = scope_key(judge.fingerprint, instruction_fingerprint(), embedder.fingerprint)
    store = CacheStore(args.store, scope)
    s = run_stream(texts, policy, judge, embeddings=embeddings, audit=audit, store=store,
                   progress=not args.json).summary()
    store.close()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"policy {s['policy']} @ {s['threshold']:g}, audit rate {s['audit_rate']:g}, {s['queries']} queries")
        print(f"  hits {s['hits']} ({100 * s['hit_rate']:.1f}%), judge calls saved {s['judge_calls_saved']}")
        print(f"  losses {s['losses']}, actionable losses {s['actionable_losses']}")
        print(f"  audits {s['audits']} with {s['audit_losses']} losses: 95% upper bound on the loss rate "
              f"{s['audit_upper_bound']:.3f}; entries retired {s['entries_retired']}; "
              f"policy stopped at query {s['policy_stopped_at']}")
    return 0


def cli_record(args) -> int:
    path = record_ground_truth(batched=args.batched, n_check=args.check)
    print(f"wrote {path}")
    return 0


def record_ground_truth(batched: bool = True, n_check: int = 3, path=GROUND_TRUTH_PATH) -> "Path":
    """Score every distinct item of the shipped stream with the real judge and write the file.

    batched: same weights and token ids run in batches by transformers (much faster on a CPU),
    then ``n_check`` items re-scored by the engine itself; the largest difference is recorded.
    """
    from lessonkit.engine import gguf_loader
    from lessonkit.workloads.judge import load_judge, record_scores, score_batched_transformers, write_ground_truth
    judge = load_judge()
    texts = list(dict.fromkeys(it.text for it in load_stream()))
    if not batched:
        return record_scores(judge, texts, path)
    hf = gguf_loader.to_transformers(gguf_loader.load_smollm2(progress=False))
    scores = score_batched_transformers(judge, hf, texts)
    diffs = [abs(judge.score(t) - scores[t]) for t in texts[:n_check]]
    check = {"computed_with": "transformers, batched, same weights and token ids",
             "engine_rescored_items": len(diffs), "max_abs_diff_vs_engine": max(diffs) if diffs else None}
    return write_ground_truth(judge, scores, path, check)


# ---------------------------------------------------------------- bench


def _machine_info() -> dict:
    try:
        from lessonkit.bench.common import machine_info
        return machine_info()
    except ImportError:
        import os
        import platform
        return {"python": platform.python_version(), "cpu_count": os.cpu_count(), "machine": platform.machine()}


def bench(args) -> dict:
    """One-sided+guard vs exact, two-sided 0.8 and one-sided on the same stream, audit off."""
    smoke = bool(getattr(args, "smoke", False))
    items = load_stream(limit=SMOKE_ITEMS if smoke else None)
    texts = [it.text for it in items]
    try:
        judge, live = ground_truth_judge("recorded", progress=False)
    except (ImportError, LessonkitError) as exc:
        if not smoke:
            raise LessonkitError(f"bench semcache needs the real judge (smollm2-135m): {exc}") from None
        judge, live = RuleJudge({it.text: it.needs_action for it in items}), None
    emb = embed_stream(texts, progress=False)
    rows = []
    for name in ("exact", "two-sided", "one-sided", "one-sided+guard"):
        s = run_stream(texts, make_policy(name), judge, embeddings=emb, audit=AUDIT_OFF).summary()
        s.pop("median_hit_ms")        # lookup only (precomputed embeddings); the timed row is below
        rows.append({"name": f"{name}@{s['threshold']:g}", "tokens_per_s": None,
                     "identical_to_plain": s["losses"] == 0, **s})
    guard_row, two_row = rows[3], rows[1]
    timing = time_hits(texts, make_policy("one-sided+guard"), judge, emb, n=20 if smoke else 60)
    judge_ms = time_judge(live, texts[:2 if smoke else 5]) if live is not None else None
    guard_row.update(timing)
    ratio = guard_row["hit_rate"] / two_row["hit_rate"] if two_row["hit_rate"] else 0.0
    hit_share = (timing["median_hit_ms"] / judge_ms
                 if judge_ms and timing["median_hit_ms"] is not None else None)
    targets = [
        {"name": "one-sided+guard actionable losses", "value": guard_row["actionable_losses"],
         "target": 0, "met": guard_row["actionable_losses"] == 0},
        {"name": "one-sided+guard hit rate / two-sided 0.8 hit rate", "value": ratio,
         "target": 0.25, "met": ratio >= 0.25},
        {"name": "two-sided 0.8 actionable losses (shown, no target)", "value": two_row["actionable_losses"],
         "target": None, "met": True},
        {"name": "time per query on a hit / judge call", "value": hit_share, "target": 0.05,
         "met": hit_share is not None and hit_share <= 0.05},
    ]
    return {"bench": "semcache", "machine": _machine_info(), "judge": judge.fingerprint,
            "judge_call_ms": judge_ms, "queries": len(texts), "rows": rows, "targets": targets}
