"""Lesson 0 (the worked engine): the experiments and figures of notebooks/00_engine.ipynb.

Each experiment returns data (a DataFrame) and a Figure; the measurements alone (token_path, decode_profile,
continuation_samples) are lessonkit.measure.engine. Also the figures of a shipped model's training log (loss
curve, expert load), drawn from train_log.json where a lesson asks: `lessonkit train` draws nothing."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lessonkit.engine.generate import generate
from lessonkit.lessons.figures import integer_axis
from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.measure.engine import decode_profile
from lessonkit.models.registry import load_model


def routing_heat(engine, texts: list[str]):
    """Tokens routed to each expert per layer over `texts` (load per expert), as a heat map."""
    c = engine.config
    counts = np.zeros((c.n_layers, c.n_experts))
    engine.model.routing_log = []
    try:
        for t in tqdm(texts, desc="routing", leave=False):
            engine.forward(engine.encode(t), engine.new_cache())
    finally:
        log, engine.model.routing_log = engine.model.routing_log, None
    for l, idx in log:
        counts[l] += np.bincount(idx.flatten().numpy(), minlength=c.n_experts)
    share = counts / counts.sum(1, keepdims=True)
    fig, ax = plt.subplots(figsize=(7, 3))
    im = ax.imshow(share, aspect="auto", cmap="viridis")
    integer_axis(ax, "xy")                   # ticks on the cells (expert 0, 1, ...), never between them
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_title(f"Routing load per expert ({engine.name}): no expert is starved (min share {share.min():.1%})")
    fig.colorbar(im, ax=ax, label="share of routed tokens")
    df = pd.DataFrame(share, index=[f"layer {l}" for l in range(c.n_layers)],
                      columns=[f"e{e}" for e in range(c.n_experts)])
    return df, fig


def budget_sweep(model: str, prompt: str, fractions=(0.125, 0.25, 0.5, 0.75, 1.0), n_new: int = 48):
    """Expert hit rate, bytes read per token and tokens per second against the expert-cache budget."""
    base = load_model(model)
    c = base.config
    n_total = c.n_layers * c.n_experts
    ids = base.encode(prompt)
    ref = generate(base, ids, n_new, use_eos=False).token_ids
    rows = []
    for f in tqdm(fractions, desc="budgets", leave=False):
        n_exp = max(1, int(round(f * n_total)))
        eng = load_model(model, expert_budget_mb=n_exp * base.expert_bytes / 2**20)
        r = generate(eng, ids, n_new, use_eos=False)
        decode_s = r.stats["wall_s"] - r.stats["ttft_s"]
        rows.append({"budget_experts": n_exp, "budget_fraction": n_exp / n_total,
                     "hit_rate": r.stats["expert_hit_rate"], "bytes_read_per_token": r.stats["bytes_read_per_token"],
                     "tokens_per_s": (r.stats["new_tokens"] - 1) / decode_s if decode_s > 0 else float("nan"),
                     "identical_tokens": r.token_ids == ref})
    df = pd.DataFrame(rows)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    a1.plot(df.budget_fraction * 100, df.hit_rate * 100, "o-", label="hit rate")
    a1.set_xlabel("expert budget (% of all experts)")
    a1.set_ylabel("expert hit rate (%)")
    a1b = a1.twinx()
    a1b.plot(df.budget_fraction * 100, df.bytes_read_per_token / 2**20, "s--", color="C1", label="MB read / token")
    a1b.set_ylabel("MB read from disk per token", color="C1")
    a1.set_title("A bigger budget turns disk reads into hits")
    a2.plot(df.budget_fraction * 100, df.tokens_per_s, "o-", color="C2")
    a2.set_xlabel("expert budget (% of all experts)")
    a2.set_ylabel("decode tokens per second")
    a2.set_title("Placement changes speed, never tokens" if df.identical_tokens.all() else "TOKENS CHANGED")
    fig.tight_layout()
    return df, fig


def independent_union(n_layers: int, n_experts: int, top_k: int, positions: int) -> float:
    """Unique experts a forward of `positions` rows would load if each row picked its top_k of n_experts per layer
    independently and uniformly: per layer, each expert is missed by all rows with chance (1 - top_k/n_experts)^N."""
    return n_layers * n_experts * (1 - (1 - top_k / n_experts) ** positions)


def batch_union(engine, text: str, sizes=(1, 2, 4, 8, 16, 32)):
    """Unique experts loaded per position when N positions share one forward (batch-union), next to the union that
    independent, uniform routing predicts (`independent_union`): routes that overlap more than chance load fewer."""
    c = engine.config
    ids = engine.encode(text)
    cache = engine.new_cache()
    engine.forward(ids, cache)                       # fill the cache once; each window rolls back to its start
    rows = []
    for n in sizes:
        if n > len(ids):
            break
        loads = []
        starts = list(range(0, len(ids) - n + 1, n))
        for s in starts[:: max(1, len(starts) // 12)]:   # at most ~12 windows per size
            cache.rollback(min(s, cache.length))
            if cache.length < s:                      # refill the gap up to this window
                engine.forward(ids[cache.length:s], cache)
            engine.forward(ids[s:s + n], cache)
            loads.append(engine.model.last_forward["unique_experts"])
        rows.append({"positions_per_forward": n, "unique_experts_per_forward": float(np.mean(loads)),
                     "experts_loaded_per_position": float(np.mean(loads)) / n,
                     "independent_routing_per_forward": independent_union(c.n_layers, c.n_experts, c.top_k, n),
                     "without_union": c.n_layers * c.top_k})
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df.positions_per_forward, df.experts_loaded_per_position, "o-", label="with batch-union (measured)")
    ax.plot(df.positions_per_forward, df.independent_routing_per_forward / df.positions_per_forward, "s:",
            label="independent routing (predicted)")
    ax.plot(df.positions_per_forward, df.without_union, "k--", label="one load per routed slot")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("positions sharing one forward")
    ax.set_ylabel("expert loads per position")
    ax.set_title("Batch-union: a shared forward loads each expert once")
    ax.legend()
    return df, fig


def budget_table(model: str, prompt: str, budget_pct: int = 25, n_new: int = 24) -> pd.DataFrame:
    """Lesson 0's panel, one run: decode `prompt` with budget_pct % of all experts resident (a fresh,
    empty expert cache); hit rate, speed and the text as a table with units."""
    base = load_model(model)
    n_total = base.config.n_layers * base.config.n_experts
    n = max(1, round(budget_pct / 100 * n_total))
    p = decode_profile(load_model(model, expert_budget_mb=n * base.expert_bytes / 2**20), prompt, n_new=n_new)
    rows = [("expert budget", f"{n} of {n_total}", "experts resident"),
            ("expert hit rate", f"{100 * p['expert_hit_rate']:.1f}", "% of expert reads"),
            ("decode speed", f"{p['tokens_per_s']:.1f}", "tokens / s"),
            ("expert I/O", f"{1e3 * p['io_s_per_token']:.2f}", "ms / token"),
            ("everything else", f"{1e3 * p['compute_s_per_token']:.2f}", "ms / token"),
            ("text", p["text"][:120], f"{n_new} new tokens")]
    return quantity_table(rows)


def budget_panel(model: str, prompt: str) -> None:
    """Sliders for the expert budget and the number of new tokens over `budget_table`."""
    import ipywidgets as w
    show_panel({"budget_pct": w.IntSlider(value=25, min=5, max=100, step=5, description="expert budget (% of all)"),
                "n_new": w.IntSlider(value=24, min=8, max=64, step=8, description="new tokens")},
               lambda **kw: budget_table(model, prompt, **kw), title="Expert budget: speed moves, tokens do not")


def expert_load_figure(load: list[list[float]], name: str = "tiny-moe"):
    """Bars of each expert's share of routed token slots, one group per layer; load is [layers][E]."""
    L, E = len(load), len(load[0])
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / L
    for l, row in enumerate(load):
        ax.bar([e + (l - (L - 1) / 2) * width for e in range(E)], [100 * v for v in row], width, label=f"layer {l}")
    ax.axhline(100 / E, color="gray", ls="--", lw=1, label=f"uniform ({100 / E:.1f}%)")
    ax.set_xticks(range(E))
    ax.set_xlabel("expert")
    ax.set_ylabel("share of routed token slots (%)")
    lo = min(min(r) for r in load)
    ax.set_title(f"{name}: routing is not collapsed (every expert gets >= {100 * lo:.1f}% of tokens)")
    ax.legend(fontsize=7, ncol=L + 1)
    fig.tight_layout()
    return fig


HEADLINE = Headline(
    title="The worked engine",
    sentences=(
        Sentence("{model} with a quarter of its experts cached: {hit_rate_at_25pct_budget:.0%} of expert loads hit "
                 "the cache, and decoding ran at {decode_tokens_per_s_25pct_budget:.1f} tokens/s."),
        Sentence("The generated tokens were {tokens_identical_across_budgets:the same|NOT the same} at every expert "
                 "budget: the budget moves speed and bytes read, never the output."),
        Sentence("Batch-union: a forward over 16 positions loaded {expert_loads_per_position_16_rows:.2f} experts per "
                 "position, each expert its positions share being read once."),
        Sentence("Routing is uneven but spread: the least-used expert of any layer still took "
                 "{min_expert_share:.1%} of that layer's routing."),
    ),
    columns=(Column("budget_experts", "budget (experts cached)"),
             Column("budget_fraction", "budget (% of experts)", ".0f", scale=100),
             Column("hit_rate", "hit rate (%)", ".0f", scale=100),
             Column("bytes_read_per_token", "expert bytes read per token (MiB)", ".2f", scale=2**-20),
             Column("tokens_per_s", "decode (tokens/s)", ".1f"),
             Column("identical_tokens", "tokens as at full budget", "identical|DIFFER")),
    caption="Decoding against the expert budget",
    figure="lesson.budget_sweep(",
)
