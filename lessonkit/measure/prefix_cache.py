"""The prefix cache measured: batch scoring behind a cached prefix, restore against prefill by prefix length, KV bytes
per token, partial matches, and the provenance and corruption refusals. Lesson 4 draws these."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from lessonkit.measure.timing import median_time
from lessonkit.models.convert import convert_hf_state_dict
from lessonkit.models.registry import load_model
from lessonkit.prefix_cache.cache import PrefixCache, PrefixCacheWarning
from lessonkit.prefix_cache.generate import results_identical, score
from lessonkit.prefix_cache.snapshot import dtype_name
from lessonkit.prefix_cache.worker import score_in_new_process
from lessonkit.workloads.reviews import make_items, system_prompt_ids, word_tokenizer_json


def tiny_random_model(out_dir, seed: int = 0, vocab: int = 512, tokenizer_json: str | None = None) -> Path:
    """A tiny random OLMoE-style model in the streaming layout (2 layers, 4 experts): for fast demos
    and tests. Two seeds give two models with identical shapes and vocabulary, different weights."""
    g = torch.Generator().manual_seed(seed)
    D, I, H, KV, hd, E, L = 32, 32, 4, 2, 8, 4, 2
    cfg = dict(model_type="olmoe", vocab_size=vocab, hidden_size=D, intermediate_size=I, num_hidden_layers=L,
               num_attention_heads=H, num_key_value_heads=KV, num_experts=E, num_experts_per_tok=2,
               max_position_embeddings=2048, rms_norm_eps=1e-5)

    def r(*s):
        return torch.randn(*s, generator=g) * 0.5

    sd = {"model.embed_tokens.weight": r(vocab, D), "model.norm.weight": torch.ones(D), "lm_head.weight": r(vocab, D)}
    for l in range(L):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = torch.ones(D)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(D)
        for n, s in (("q_proj", (H * hd, D)), ("k_proj", (KV * hd, D)), ("v_proj", (KV * hd, D)), ("o_proj", (D, H * hd))):
            sd[p + f"self_attn.{n}.weight"] = r(*s)
        sd[p + "self_attn.q_norm.weight"] = torch.ones(H * hd)
        sd[p + "self_attn.k_norm.weight"] = torch.ones(KV * hd)
        sd[p + "mlp.gate.weight"] = r(E, D)
        for e in range(E):
            for n, s in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
                sd[p + f"mlp.experts.{e}.{n}.weight"] = r(*s)
    convert_hf_state_dict(cfg, sd, out_dir, tokenizer_json, source=f"tiny random model seed {seed}")
    return Path(out_dir)

def _load(model):
    if not isinstance(model, (str, os.PathLike)):
        return model
    return load_model(str(model))

def demo_models(directory) -> tuple[Path, Path]:
    """Two tiny random models with identical shapes, vocabulary and tokenizer, other weights (seeds 0, 1)."""
    d = Path(directory)
    tok = word_tokenizer_json()
    out = []
    for seed in (0, 1):
        p = d / f"tiny-random-{seed}"
        if not (p / "config.json").exists():
            tiny_random_model(p, seed=seed, tokenizer_json=tok)
        out.append(p)
    return out[0], out[1]

def batch_scoring_experiment(model, cache_dir, n_prefix: int = 552, n_items: int = 50, seed: int = 0,
                             progress: bool = True):
    """Cache off, cold, and warm after a restart (a second process): total time, TTFT, identical scores.

    Returns (DataFrame, results dict). The cache directory is cleared first so "cold" is cold.
    """
    eng = _load(model)
    prefix, items = system_prompt_ids(eng, n_prefix), make_items(eng, n_items, seed)
    pc = PrefixCache(cache_dir, eng)
    pc.clear()
    score(eng, prefix, items[:1])           # warm-up (kernel set-up for these shapes), not timed
    off = score(eng, prefix, items, progress=progress)
    cold = score(eng, prefix, items, prefix_cache=pc, progress=progress)
    model_ref = model if isinstance(model, (str, os.PathLike)) else str(eng.model_dir)
    warm = score_in_new_process(model_ref, cache_dir, prefix, items)
    res = {"off": off, "cold": cold, "warm after restart": warm}
    rows = []
    for mode, r in res.items():
        rows.append({"mode": mode, "items": r.stats["items"], "prefix tokens": r.stats["prefix_tokens"],
                     "total s": r.stats["total_s"], "TTFT s": r.stats["ttft_s"],
                     "prefill s": r.stats["prefill_s"], "restore s": r.stats["restore_s"],
                     "prefix_cache_hits": r.stats["prefix_cache_hits"],
                     "prefix_cache_queries": r.stats["prefix_cache_queries"],
                     "speed-up vs off": off.stats["total_s"] / r.stats["total_s"],
                     "identical to off": results_identical(off, r)})
    return pd.DataFrame(rows), res

def restore_vs_prefill_table(engine, cache_dir, lengths=(64, 128, 256, 552), repeats: int = 3,
                             progress: bool = True) -> pd.DataFrame:
    """Median prefill and restore seconds per prefix length, with the snapshot's bytes on disk. Restore includes
    reading the file, checking its SHA-256 and copying into the KV cache; the page cache is warm (the file was
    just written), as in a server restart."""
    ids = system_prompt_ids(engine, max(lengths))
    pc = PrefixCache(cache_dir, engine)
    rows = []
    for n in tqdm(list(lengths), desc="restore vs prefill", leave=False, disable=not progress):
        prefix = ids[:n]
        c = engine.new_cache(n)
        t_pre, _ = median_time(lambda: engine.forward(prefix, engine.new_cache(n), last_only=True), repeats, warmup=1)
        engine.forward(prefix, c, last_only=True)
        path = pc.save(prefix, c)

        def restore():
            got = pc.lookup_and_restore(prefix, engine.new_cache(n))
            assert got == n, got
        t_res, _ = median_time(restore, repeats, warmup=1)
        rows.append({"prefix tokens": n, "prefill s": t_pre, "restore s": t_res, "restore / prefill": t_res / t_pre,
                     "bytes on disk": path.stat().st_size, "bytes per token": path.stat().st_size / n})
    return pd.DataFrame(rows)

def kv_bytes_per_token(config, dtype=torch.float32) -> int:
    """K and V for one position: 2 x layers x kv heads x head dim x bytes per element."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * torch.empty(0, dtype=dtype).element_size()

def bytes_per_token_table(engines, cache_dir, n_tokens: int = 64):
    """Measured snapshot bytes per token for each model, next to the K/V formula."""
    rows = []
    for eng in engines:
        ids = system_prompt_ids(eng, n_tokens)
        c = eng.new_cache(n_tokens)
        eng.forward(ids, c, last_only=True)
        path = PrefixCache(cache_dir, eng).save(ids, c)
        size = path.stat().st_size
        cfg = eng.config
        rows.append({"model": eng.name, "layers": cfg.n_layers, "kv heads": cfg.n_kv_heads, "head dim": cfg.head_dim,
                     "dtype": dtype_name(c.k.dtype), "tokens": n_tokens, "file bytes": size,
                     "bytes per token (file)": size / n_tokens,
                     "bytes per token (2*L*kv*hd*elem)": kv_bytes_per_token(cfg, c.k.dtype)})
    return pd.DataFrame(rows)

def bytes_by_hand(config, n_tokens: int, dtype=torch.float32) -> str:
    """The snapshot size worked by hand for this config: 2 x layers x kv heads x head dim x bytes, then x tokens."""
    elem = torch.empty(0, dtype=dtype).element_size()
    per = kv_bytes_per_token(config, dtype)
    return (f"2 (K and V) x {config.n_layers} layers x {config.n_kv_heads} KV heads x {config.head_dim} (head dim) "
            f"x {elem} B = {per:,} B per token; x {n_tokens} tokens = {per * n_tokens:,} B "
            f"({per * n_tokens / 1e6:.1f} MB)")

def prefill_growth(df_rvp: pd.DataFrame) -> dict:
    """How prefill time grew with the prefix in this run: the time per token at the longest prefix over the
    time per token at the shortest (1.0 = linear; above 1: faster than linearly), and the fitted exponent b of
    time ~ tokens^b between them."""
    first, last = df_rvp.iloc[0], df_rvp.iloc[-1]
    per_first = first["prefill s"] / first["prefix tokens"]
    per_last = last["prefill s"] / last["prefix tokens"]
    b = float(np.log(last["prefill s"] / first["prefill s"]) / np.log(last["prefix tokens"] / first["prefix tokens"]))
    return {"per_token_ratio": float(per_last / per_first), "exponent": b,
            "shortest": int(first["prefix tokens"]), "longest": int(last["prefix tokens"])}

def restore_break_even(df_rvp: pd.DataFrame) -> dict:
    """When a restore beats a re-prefill, from the longest prefix of this run: the prefill's seconds per token,
    the snapshot's bytes per token, and the read bandwidth below which reading the snapshot would take longer
    than computing it again (bytes per token / prefill seconds per token; hashing and copying aside)."""
    last = df_rvp.iloc[-1]
    prefill_per_token = last["prefill s"] / last["prefix tokens"]
    return {"prefill_s_per_token": float(prefill_per_token), "bytes_per_token": float(last["bytes per token"]),
            "break_even_mb_s": float(last["bytes per token"] / prefill_per_token / 1e6),
            "restore_mb_s": float(last["bytes on disk"] / last["restore s"] / 1e6)}

def partial_match_demo(engine, cache_dir, prefix_ids, question_ids):
    """How much of each prompt variant resumes from a saved prompt (longest prefix, chained blocks)."""
    pc = PrefixCache(cache_dir, engine)
    full = list(prefix_ids) + list(question_ids)
    c = engine.new_cache(len(full))
    engine.forward(full, c, last_only=True)
    pc.save(full, c)
    mid = len(prefix_ids) // 2
    edited = list(prefix_ids)
    edited[mid] = (edited[mid] + 1) % engine.config.vocab_size
    variants = {"the saved prompt itself": full,
                "same system prompt, another question": list(prefix_ids) + list(question_ids[::-1]) + [question_ids[0]],
                f"one token edited at position {mid}": edited + list(question_ids),
                "first token different": [(full[0] + 1) % engine.config.vocab_size] + full[1:]}
    rows = []
    for name, ids in variants.items():
        n = pc.lookup_and_restore(ids, engine.new_cache(len(ids)), max_tokens=len(ids) - 1)
        rows.append({"prompt": name, "prompt tokens": len(ids), "restored tokens": n,
                     "prefilled tokens": len(ids) - n})
    return pd.DataFrame(rows)

def provenance_demo(engine_a, engine_b, prompt_ids, cache_dir, n_new: int = 8) -> dict:
    """What a cache keyed only by shape would serve after swapping weights, and what ours does.

    engine_b has the same shapes and vocabulary as engine_a, other weights. The state saved by b is
    restored into a (a shape check passes) and a continues greedily: the continuation differs from
    a fresh prefill by a. Our PrefixCache, keyed by the fingerprint, refuses b's state.
    """
    prompt_ids = list(prompt_ids)

    def greedy_from(cache, logits):
        out = []
        for _ in range(n_new):
            t = int(torch.argmax(logits[-1]))
            out.append(t)
            logits = engine_a.forward([t], cache)
        return out

    fresh_cache = engine_a.new_cache(len(prompt_ids) + n_new + 1)
    fresh_logits = engine_a.forward(prompt_ids, fresh_cache)
    fresh = greedy_from(fresh_cache, fresh_logits)
    cb = engine_b.new_cache(len(prompt_ids))
    engine_b.forward(prompt_ids[:-1], cb, last_only=True)
    snap = cb.snapshot()
    shape_ok = snap["k"].shape[2:] == engine_a.new_cache(1).k.shape[2:] and snap["k"].shape[0] == engine_a.config.n_layers
    wrong_cache = engine_a.new_cache(len(prompt_ids) + n_new + 1)
    wrong_cache.restore(snap)                   # what a shape-keyed cache would do
    wrong_logits = engine_a.forward(prompt_ids[-1:], wrong_cache)
    wrong = greedy_from(wrong_cache, wrong_logits)
    PrefixCache(cache_dir, engine_b).save(prompt_ids[:-1], cb)
    ours = PrefixCache(cache_dir, engine_a).lookup_and_restore(prompt_ids, engine_a.new_cache(len(prompt_ids)))
    return {"same shapes and vocabulary": bool(shape_ok and engine_a.config.vocab_size == engine_b.config.vocab_size),
            "fingerprints differ": engine_a.fingerprint() != engine_b.fingerprint(),
            "fresh greedy continuation": fresh, "continuation from the other model's state": wrong,
            "shape-keyed cache changes the output": fresh != wrong,
            "max |logit difference| at the next token": float((fresh_logits[-1] - wrong_logits[-1]).abs().max()),
            "tokens our cache restored from the other model's state": ours}

def corruption_demo(engine, cache_dir, prefix_ids) -> dict:
    """Flip one bit in a saved snapshot: the next lookup warns (naming the file), restores nothing."""
    pc = PrefixCache(cache_dir, engine)
    ids = list(prefix_ids)
    c = engine.new_cache(len(ids))
    engine.forward(ids, c, last_only=True)
    path = pc.save(ids, c)
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x10
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = PrefixCache(cache_dir, engine).lookup_and_restore(ids, engine.new_cache(len(ids)))
    msgs = [str(w.message) for w in rec if issubclass(w.category, PrefixCacheWarning)]
    return {"restored tokens": n, "warnings": msgs, "file still there": path.exists()}


def predicted_batch_speedup(df_batch: pd.DataFrame, df_rvp: pd.DataFrame) -> dict:
    """Lesson 4's batch speed-up, predicted before it is read off: the uncached run pays the prefix's prefill for
    every item, T_off = n (t_prefill + t_item); the warm run restores it once, T_warm = t_restore + n t_item. The
    prefill and restore times come from the restore-vs-prefill measurement (the prefix length closest to the
    batch's), t_item from the cold run (one prefill and save, then the items) with the prefill taken out; the
    uncached and warm runs, whose ratio is the measured speed-up, feed nothing (`measure.apart.predict_ratio`)."""
    from lessonkit.measure.apart import predict_ratio
    off, cold, warm = df_batch.iloc[0], df_batch.iloc[1], df_batch.iloc[-1]
    n, p = int(off["items"]), int(off["prefix tokens"])
    r = df_rvp.iloc[int((df_rvp["prefix tokens"] - p).abs().argmin())]
    t_prefill, t_restore = float(r["prefill s"]), float(r["restore s"])
    t_item = max((float(cold["total s"]) - t_prefill) / n, 0.0)
    pred = predict_ratio(n * (t_prefill + t_item), t_restore + n * t_item, timed={"off", "warm"},
                         inputs={"prefill_s": "restore vs prefill", "restore_s": "restore vs prefill", "item_s": "cold"})
    return {"items": n, "prefix_tokens": p, "rvp_prefix_tokens": int(r["prefix tokens"]), "prefill_s": t_prefill,
            "restore_s": t_restore, "item_s": t_item, "predicted": pred["predicted_speedup"],
            "measured": float(warm["speed-up vs off"])}
