"""The engine measured: one token's path through the layers (router choices, expert bytes), a decode's time profile,
and continuations of held-out corpus prompts. Lesson 0 shows these."""
from __future__ import annotations

import pandas as pd
import torch

from lessonkit.engine.generate import generate
from lessonkit.workloads.corpus import KINDS, load_documents


def token_path(engine, text: str, top: int = 5) -> pd.DataFrame:
    """How the last token of `text` flows through the engine: per layer the experts its router picks
    (with weights), the residual-stream norm, and at the end the top next-token candidates."""
    c = engine.config
    ids = engine.encode(text)
    engine.model.routing_log = []
    cache = engine.new_cache()
    captured = {}
    orig = engine.model._moe

    def spy(l, x, stats, T):
        captured[l] = float(x[T - 1].float().norm())
        return orig(l, x, stats, T)

    engine.model._moe = spy
    try:
        logits = engine.forward(ids, cache)[-1]
    finally:
        engine.model._moe = orig
        log, engine.model.routing_log = engine.model.routing_log, None
    rows = []
    for l in range(c.n_layers):
        picks = [r for (ll, r) in log if ll == l]
        experts = picks[0][-1].tolist() if picks else [0]
        rows.append({"stage": f"layer {l}", "experts (top-k)": experts, "|x| entering MLP": round(captured.get(l, 0), 2)})
    p = torch.softmax(logits, -1)
    pv, pi = torch.topk(p, top)
    rows.append({"stage": "output head", "experts (top-k)": "-",
                 "|x| entering MLP": ", ".join(f"{engine.decode([int(i)])!r}: {float(v):.2f}" for v, i in zip(pv, pi))})
    return pd.DataFrame(rows)

def decode_profile(engine, prompt: str, n_new: int = 32) -> dict:
    """Where decode time goes: expert I/O vs everything else (seconds per token)."""
    r = generate(engine, engine.encode(prompt), n_new, use_eos=False)
    n = max(r.stats["new_tokens"], 1)
    return {"tokens_per_s": r.stats["tokens_per_s"], "io_s_per_token": r.stats["io_s"] / n,
            "compute_s_per_token": (r.stats["wall_s"] - r.stats["io_s"]) / n,
            "expert_hit_rate": r.stats["expert_hit_rate"], "text": r.text}

def continuation_prompts(n_per_kind: int = 1, prompt_chars: int = 160) -> list[dict]:
    """Held-out prompts per kind: a document's first ~prompt_chars characters (records: whole lines
    plus the start of the next record, '{"ts":"')."""
    out = []
    for kind in KINDS:
        docs = [d for d in load_documents(kind, "heldout") if len(d) > 2 * prompt_chars]
        if kind == "records":
            docs = [d for d in docs if not d.startswith("{\n")]
        for d in docs[:n_per_kind]:
            if kind == "records":
                lines = d.splitlines(keepends=True)
                prompt = "".join(lines[:2]) + '{"ts":"'
            else:
                cut = d.rfind(" ", 0, prompt_chars)
                prompt = d[: cut if cut > 0 else prompt_chars]
            out.append({"kind": kind, "prompt": prompt})
    return out

def continuation_samples(engine, n_per_kind: int = 1, max_new_tokens: int = 60) -> list[dict]:
    """Greedy continuations of held-out prompts of each kind (records stop at the end of the line)."""
    rows = []
    for p in continuation_prompts(n_per_kind):
        stop = ("\n",) if p["kind"] == "records" else ()
        r = generate(engine, engine.encode(p["prompt"]), max_new_tokens, stop_strings=stop)
        rows.append({**p, "continuation": r.text})
    return rows
