"""Lesson 2 (MTP heads): the measurements and figures of notebooks/02_mtp.ipynb."""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from lessonkit.engine.generate import generate
from lessonkit.engine.quant import fake_quantise
from lessonkit.lessons.figures import legend_beside
from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import show_panel
from lessonkit.measure.mtp import prompts_from_corpus
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.mtp.evaluate import acceptance_by_kind, pooled_acceptance
from lessonkit.mtp.head import MtpHead, Shared, eh_scale_ratio, load_head
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.speculative.vocab import frequent_tokens


def head_training(model: str) -> str:
    """The "trained:" line of the model's MTP head card (data/models/mtp/<model>.card.md): steps, tokens, threads."""
    from lessonkit import data_dir
    card = data_dir() / "models" / "mtp" / f"{model}.card.md"
    lines = card.read_text(encoding="utf-8").splitlines() if card.is_file() else []
    return next((ln.lstrip("- ") for ln in lines if ln.startswith("- trained:")), "training: no card")


def train_loss_figure(log: dict, title: str = ""):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    a1.plot(log["step"], log["loss"], lw=0.8, label="total")
    a1.plot(log["step"], log["ce"], lw=0.8, label="cross-entropy")
    a1.set_xlabel("step")
    a1.set_ylabel("loss (nats / smooth L1)")
    a1.legend()
    for kind in (log["eval_acceptance"][0] if log["eval_acceptance"] else {}):
        a2.plot(log["eval_step"], [100 * e[kind] for e in log["eval_acceptance"]], marker="o", label=kind)
    a2.set_xlabel("step")
    a2.set_ylabel("held-out acceptance, position 1 (%)")
    legend_beside(a2, fontsize=8, max_inside=0)      # a few evaluation points: "best" still lands on one
    fig.suptitle(title or "the MTP head learns the token after next")
    fig.tight_layout()
    return fig


def acceptance_figure(rows: dict, title: str, reported=(0.39, 0.59)):
    """rows: label -> list of acceptance per position. Bars per position, the reported band shaded."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels = list(rows)
    depth = max(len(v) for v in rows.values())
    width = 0.8 / max(len(labels), 1)
    for i, lab in enumerate(labels):
        v = rows[lab]
        ax.bar(np.arange(len(v)) + i * width, [100 * a for a in v], width, label=lab)
    ax.axhspan(100 * reported[0], 100 * reported[1], color="grey", alpha=0.15,
               label="39-59% reported for an int8 head (Colibri issue 8, Apple Silicon, 128 GB, cold cache; "
                     "issue 640: 43-44%, issue 163: 49%)")
    ax.set_xticks(np.arange(depth) + 0.4 - width / 2, [f"position {i + 1}" for i in range(depth)])
    ax.set_ylabel("teacher-forced acceptance (%)")
    ax.set_xlabel("draft position")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def scale_picture(head: MtpHead, schemes=("none", "int4", "int8", "int4-g32"), n_rows: int = 64):
    """|eh_proj| per column (mean over rows) before and after quantisation: hidden half vs embedding half."""
    D = head.cfg.dim
    fig, axes = plt.subplots(len(schemes), 1, figsize=(9, 1.9 * len(schemes)), sharex=True)
    for ax, s in zip(axes, schemes):
        w = fake_quantise(head.w["eh_proj"].float(), s)
        col = w.abs().mean(0)
        ax.semilogy(col.clamp_min(1e-6).numpy(), lw=0.6)
        ax.axvline(D, color="k", ls="--", lw=0.8)
        zero = float((w[:, D:] == 0).float().mean())
        ax.set_ylabel("mean |w|")
        ax.set_title(f"{s}: embedding half {100 * zero:.0f}% zeros", fontsize=9)
    axes[-1].set_xlabel(f"eh_proj column (0..{D - 1} hidden half, {D}..{2 * D - 1} embedding half)")
    fig.suptitle("per-row int4 wipes out the small embedding half of eh_proj; int8 and group-wise keep it")
    fig.tight_layout()
    return fig


def int4_by_hand(heads_by_label: dict) -> pd.DataFrame:
    """Per-row symmetric int4 worked by hand on eh_proj: each row's scale is s = max|w| / 7 (levels -7..7), so a
    weight rounds to 0 when |w| < s / 2 = max|w| / 14. For each head (label -> MtpHead): the median row's max|w|,
    s and that threshold, and the share of each half's weights that round to 0, computed from the weights."""
    rows = []
    for label, head in heads_by_label.items():
        w, b = head.w["eh_proj"].float(), head.cfg.eh_blocks()
        mx = w.abs().amax(dim=1, keepdim=True)
        zero = w.abs() < mx / 14                      # rounds to 0 under round-to-nearest with s = max|w| / 7
        rows.append({"head": label, "hidden / embedding scale": eh_scale_ratio(head),
                     "median row max|w|": float(mx.median()), "s = max|w| / 7": float(mx.median() / 7),
                     "zero below max|w| / 14": float(mx.median() / 14),
                     "hidden half rounded to 0 (%)": 100 * float(zero[:, b["hidden"]].float().mean()),
                     "embedding half rounded to 0 (%)": 100 * float(zero[:, b["embedding"]].float().mean())})
    return pd.DataFrame(rows).set_index("head")


def acceptance_interval(r: dict, pos: int = 0, z: float = 1.96) -> tuple[float, float]:
    """A 95% Wilson interval for one kind's acceptance at draft position pos + 1 (r: one kind of
    mtp.evaluate.acceptance_by_kind), from its evaluated positions taken as independent draws (neighbouring
    positions of a window are not quite, so the true interval is somewhat wider)."""
    p, n = float(r["acceptance"][pos]), max(int(r["n_positions"]), 1)
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def acceptance_by_scheme(head: MtpHead, sh: Shared, states: dict, schemes=("none", "int8", "int4", "int4-g64", "int4-g32"),
                         depth: int = 3) -> dict:
    """scheme -> pooled teacher-forced acceptance per position (all kinds of text together)."""
    out = {}
    for s in schemes:
        h = head.quantised(s) if s != "none" else head
        p = pooled_acceptance(acceptance_by_kind(h, sh, states, depth), depth)
        out[s] = {"acceptance": p["acceptance"], "rank_median": p["rank_median"]}
    return out


def scheme_table(by_scheme: dict) -> list[dict]:
    """One row per model and quantisation scheme: acceptance per drafted position and the median rank of
    the target's pick among the head's logits (the lesson's main table)."""
    return [{"model": m, "scheme": s, "rank_median": r["rank_median"],
             **{f"pos{i + 1}": a for i, a in enumerate(r["acceptance"])}}
            for m, by in by_scheme.items() for s, r in by.items()]


def numeric_path(engine, head: MtpHead, states: dict, depth: int = 1, bf16_target_states: dict | None = None) -> dict:
    """Acceptance at position 1 of the same head on other numeric paths than it was trained on (float32):
    head weights and activations in bfloat16; and (if given) hidden states from the target run in bfloat16."""
    sh = Shared.from_engine(engine)

    def pool(h, st):
        return pooled_acceptance(acceptance_by_kind(h, sh, st, depth), depth)["acceptance"][0]

    out = {"float32 head, float32 target": pool(head, states),
           "bfloat16 head, float32 target": pool(head.to(torch.bfloat16), states)}
    if bf16_target_states is not None:
        out["float32 head, bfloat16 target"] = pool(head, bf16_target_states)
    return out


def speed_figure(rows: list[dict], title: str = ""):
    df = pd.DataFrame(rows)
    g = df.groupby(["model", "name"], sort=False)["tokens_per_s"].median().unstack(0)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    g.plot.bar(ax=ax)
    ax.set_ylabel("tokens / s (median over prompts)")
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=0)
    ok = bool(df["identical_to_plain"].all())
    ax.set_title(title or f"MTP drafting vs plain greedy (output identical: {ok})")
    fig.tight_layout()
    return fig


def frequent_vocabulary(engine, head: MtpHead | None = None, prompts: dict | None = None, sizes=(0, 8192, 2048),
                        k: int = 2, max_new_tokens: int = 48, repeats: int = 1) -> pd.DataFrame:
    """FR-Spec on the head: its draft argmax over all rows of the target's output layer (size 0) or over the
    `size` most frequent tokens only. One row per size: share of the target's own greedy tokens inside the
    kept set (coverage), acceptance, draft milliseconds per draft token, speed-up over plain greedy (median
    of `repeats`, plain greedy in every round, all prompts pooled), output identical to plain greedy."""
    head = head if head is not None else load_head(engine)
    prompts = prompts if prompts is not None else prompts_from_corpus(engine)
    plist = [p for ps in prompts.values() for p in ps]
    V = engine.config.vocab_size
    drafters = {n: MtpDrafter(engine, head, draft_vocab=n or None) for n in sizes if n < V}
    plain_s, spec_s, stats, same, ref_tokens = [], {n: [] for n in drafters}, {n: [] for n in drafters}, {n: True for n in drafters}, []
    try:
        for rnd in range(repeats):
            t_plain, t_spec = 0.0, {n: 0.0 for n in drafters}
            for p in plist:
                ref = generate(engine, p, max_new_tokens, use_eos=False)
                t_plain += ref.stats["wall_s"]
                if rnd == 0:
                    ref_tokens += ref.token_ids
                for n, d in drafters.items():
                    r = speculative_generate(engine, d, p, max_new_tokens, k=k, use_eos=False)
                    t_spec[n] += r.stats["wall_s"]
                    same[n] &= r.token_ids == ref.token_ids
                    if rnd == 0:
                        stats[n].append(r.stats)
            plain_s.append(t_plain)
            for n in drafters:
                spec_s[n].append(t_spec[n])
    finally:
        for d in drafters.values():
            d.close()
    rows = []
    for n in drafters:
        t = total_stats(stats[n])
        kept = set(frequent_tokens(engine, n).tolist()) if n else None
        rows.append({"model": engine.name, "draft vocabulary": n or V, "k": k,
                     "coverage of target tokens": (sum(x in kept for x in ref_tokens) / len(ref_tokens)) if kept else 1.0,
                     "acceptance_rate": t["acceptance_rate"],
                     "draft ms per token": 1e3 * t["draft_s"] / max(t["num_draft_tokens"], 1),
                     "speedup": statistics.median(plain_s) / statistics.median(spec_s[n]),
                     "identical_to_plain": same[n]})
    return pd.DataFrame(rows)


def frequent_vocabulary_figure(df: pd.DataFrame):
    """Draft cost and speed-up against the size of the head's draft vocabulary."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [f"{n:,}" for n in df["draft vocabulary"]]
    axes[0].bar(labels, df["draft ms per token"], color="tab:orange")
    axes[0].set_ylabel("draft ms per draft token")
    axes[1].bar(labels, df["speedup"], color="tab:blue")
    axes[1].axhline(1.0, color="gray", lw=0.8)
    axes[1].set_ylabel("speed-up over plain greedy")
    for ax in axes:
        ax.set_xlabel("rows of the output layer the head drafts from")
    fig.suptitle(f"{df['model'].iloc[0]}: FR-Spec on the MTP head (k={df['k'].iloc[0]}, "
                 f"identical to plain greedy: {bool(df['identical_to_plain'].all())})")
    fig.tight_layout()
    return fig


# lesson 2's panel: the head's weights as trained or quantised
QUANT_SCHEMES = ("none", "int8", "int4", "int4 group-wise")


def quant_acceptance_table(heads: dict, shared: dict, states: dict, *, model: str, scheme: str = "none",
                           group: int = 32, depth: int = 2) -> pd.DataFrame:
    """Lesson 2's panel, one choice: the MTP head of `model` quantised with `scheme` (group size `group` for
    int4 group-wise), its teacher-forced acceptance per draft position and kind of text, in %."""
    s = f"int4-g{group}" if scheme == "int4 group-wise" else scheme
    head = heads[model] if s == "none" else heads[model].quantised(s)
    r = acceptance_by_kind(head, shared[model], states[model], depth)
    return pd.DataFrame({kind: [round(100 * a, 1) for a in v["acceptance"]] for kind, v in r.items()},
                        index=[f"position {i + 1} (% accepted)" for i in range(depth)])


def quant_panel(heads: dict, shared: dict, states: dict) -> None:
    """Model, quantisation scheme, group size and depth over `quant_acceptance_table`."""
    import ipywidgets as w
    show_panel({"model": w.Dropdown(options=list(heads), description="model"),
                "scheme": w.Dropdown(options=QUANT_SCHEMES, description="head weights"),
                "group": w.Dropdown(options=[16, 32, 64, 128], value=32, description="int4 group size"),
                "depth": w.IntSlider(value=2, min=1, max=4, description="draft positions")},
               lambda **kw: quant_acceptance_table(heads, shared, states, **kw),
               title="How quantising the MTP head moves its acceptance")


HEADLINE = Headline(
    title="Multi-token-prediction heads",
    sentences=(
        Sentence("{*}: the float MTP head's first drafted token was accepted {*_float_acceptance_pos1:.0%} of the "
                 "time; per-row int4 cut that to {*_int4_acceptance_pos1:.0%}, while int8 kept "
                 "{*_int8_acceptance_pos1:.0%} and int4 in groups of 32 {*_int4_g32_acceptance_pos1:.0%}.",
                 each="*_float_acceptance_pos1"),
        Sentence("Per-row int4 rounds {int4_embedding_half_zero_frac:.0%} of the embedding half of eh_proj to zero: "
                 "the head loads and generates fine, and drafts badly."),
        Sentence("{*}: MTP drafting ran at best {*_mtp_speedup_median:.2f}x plain greedy (median over kinds of "
                 "text), output {mtp_output_identical_to_plain:identical to|DIFFERENT from} plain greedy.",
                 each="*_mtp_speedup_median"),
    ),
    columns=(Column("model", "model"), Column("scheme", "head quantisation"),
             Column("pos1", "accepted at position 1 (%)", ".1f", scale=100),
             Column("pos2", "at position 2 (%)", ".1f", scale=100),
             Column("pos3", "at position 3 (%)", ".1f", scale=100),
             Column("rank_median", "median rank of the target's pick", ".0f")),
    caption="Acceptance of the head per quantisation scheme (teacher-forced, held-out text)",
    figure="lesson.scale_picture(",
)
