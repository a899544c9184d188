"""Lesson 2 (MTP heads): the measurements and figures of notebooks/02_mtp.ipynb."""
from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from lessonkit.engine.generate import generate
from lessonkit.engine.quant import fake_quantise
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.mtp.evaluate import acceptance_by_kind, pooled_acceptance, text_windows
from lessonkit.mtp.head import MtpHead, Shared, load_head
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.corpus import KINDS

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
    a2.legend()
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
               label="39-59% reported for an int8 head (Colibri issue 8; 43-57% in issues 12, 113, 163, 640)")
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


def acceptance_by_scheme(head: MtpHead, sh: Shared, states: dict, schemes=("none", "int8", "int4", "int4-g64", "int4-g32"),
                         depth: int = 3) -> dict:
    """scheme -> pooled teacher-forced acceptance per position (all kinds of text together)."""
    out = {}
    for s in schemes:
        h = head.quantised(s) if s != "none" else head
        p = pooled_acceptance(acceptance_by_kind(h, sh, states, depth), depth)
        out[s] = {"acceptance": p["acceptance"], "rank_median": p["rank_median"]}
    return out


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
