"""The engine behind a prefix cache: score many items behind one shared prefix, and generate resuming
a prompt from disk. Both give bit-identical results with and without the cache (see each docstring)."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import torch
from tqdm.auto import tqdm

from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.prefix_cache.cache import PrefixCache, PrefixCacheWarning

@dataclass
class ScoreResult:
    """Per item: log p(item tokens | prefix, earlier item tokens), and the logits after the item.

    logprobs[i] = sum of token_logprobs[i]; last_logits[i] is the next-token distribution after
    prefix + item i (float32 [V]). stats: mode (off / cold / warm), total_s, ttft_s (time until the
    first item is scored), prefill_s (prefix prefill actually run), restore_s, prefix_cache_queries
    and prefix_cache_hits (tokens), prefill_s_saved, save_s.
    """
    logprobs: list[float]
    token_logprobs: list[torch.Tensor]
    last_logits: torch.Tensor
    stats: dict = field(default_factory=dict)


def _rows_to_scores(rows: torch.Tensor, item: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [L+1, V]: logits at the last prefix position and at each item position."""
    lp = torch.log_softmax(rows[:-1], dim=-1)
    tok = lp.gather(1, torch.tensor(list(item), dtype=torch.long)[:, None])[:, 0] if len(item) else lp.new_zeros(0)
    return tok, rows[-1].clone()


def score(engine, prefix_ids: Sequence[int], items: Sequence[Sequence[int]], *, prefix_cache: PrefixCache | None = None,
          progress: bool = False) -> ScoreResult:
    """Score many items behind one shared prefix (a long system prompt, an instruction, few-shot examples).

    prefix_cache=None: the cache is off, every item pays a fresh prefill of the prefix (each request
    on its own, as without prefix caching). With a PrefixCache: the prefix is restored from disk if
    saved (warm), else prefilled once and saved (cold); then each item runs from the shared state.
    Scores are bit-identical in all modes: the restored K/V are the bytes the prefill wrote, and
    every mode prefills the prefix in the same chunks (all but its last token, then the last token
    together with the item), so each item runs the same computation with or without the cache.
    """
    prefix_ids = [int(t) for t in prefix_ids]
    items = [[int(t) for t in it] for it in items]
    if len(prefix_ids) < 1:
        raise LessonkitError("score needs a prefix of at least one token")
    if not items:
        raise LessonkitError("score needs at least one item")
    max_len = len(prefix_ids) + max(len(it) for it in items) + 1
    base = prefix_ids[:-1]                  # the shared state: all but the last prefix token
    st = {"mode": "off" if prefix_cache is None else "cold", "items": len(items), "prefix_tokens": len(prefix_ids),
          "item_tokens": sum(len(it) for it in items), "prefill_s": 0.0, "restore_s": 0.0, "save_s": 0.0,
          "prefix_cache_queries": 0, "prefix_cache_hits": 0, "prefill_s_saved": 0.0, "ttft_s": None}
    before = prefix_cache.stats.as_dict() if prefix_cache is not None else None
    t_start = time.perf_counter()
    cache = _shared_state(engine, base, max_len, prefix_cache, st) if prefix_cache is not None else None
    tok_lps, lasts = [], []
    for i, item in enumerate(tqdm(items, desc=f"score ({st['mode']})", leave=False, disable=not progress)):
        cache = _item_start(engine, base, max_len, cache, prefix_cache is not None, st)
        tok, last = _rows_to_scores(engine.forward([prefix_ids[-1]] + item, cache), item)
        tok_lps.append(tok)
        lasts.append(last)
        if i == 0:
            st["ttft_s"] = time.perf_counter() - t_start
            if prefix_cache is not None and st["mode"] == "cold":
                t0 = time.perf_counter()
                save_or_warn(prefix_cache, prefix_ids, cache, prefill_s=st["prefill_s"])
                st["save_s"] = time.perf_counter() - t0
    st["total_s"] = time.perf_counter() - t_start
    if prefix_cache is not None:
        after = prefix_cache.stats.as_dict()
        for k in ("prefix_cache_queries", "prefix_cache_hits", "restore_s", "prefill_s_saved"):
            st[k] = after[k] - before[k]
    return ScoreResult([float(t.sum()) for t in tok_lps], tok_lps, torch.stack(lasts), st)


def save_or_warn(prefix_cache: PrefixCache, token_ids, cache, **kw) -> None:
    """Save a computed state; a failure to save (full disk, unwritable directory) is one warning and
    never loses the result the state was computed for."""
    try:
        prefix_cache.save(token_ids, cache, **kw)
    except (LessonkitError, OSError) as e:
        warnings.warn(f"prefix cache: the result is kept, but the prefix was not saved: {e}", PrefixCacheWarning,
                      stacklevel=2)


def _shared_state(engine, base: list[int], max_len: int, prefix_cache: PrefixCache, st: dict):
    """A cache holding the shared state: restored from disk (warm) or prefilled (cold)."""
    cache = engine.new_cache(max_len)
    n = prefix_cache.lookup_and_restore(base, cache) if base else 0
    if n < len(base):
        t0 = time.perf_counter()
        engine.forward(base[n:], cache, last_only=True)
        st["prefill_s"] += time.perf_counter() - t0
    st["mode"] = "warm" if n else "cold"
    return cache


def _item_start(engine, base: list[int], max_len: int, cache, cached: bool, st: dict):
    """The state an item starts from: the shared state rolled back to, or (no cache) a fresh prefill."""
    if cached:
        cache.rollback(len(base))
        return cache
    cache = engine.new_cache(max_len)
    if base:
        t0 = time.perf_counter()
        engine.forward(base, cache, last_only=True)
        st["prefill_s"] += time.perf_counter() - t0
    return cache


def results_identical(a: ScoreResult, b: ScoreResult) -> bool:
    """Bit-identical scores (==, float32) for every item."""
    return (len(a.token_logprobs) == len(b.token_logprobs)
            and all(torch.equal(x, y) for x, y in zip(a.token_logprobs, b.token_logprobs))
            and torch.equal(a.last_logits, b.last_logits))


def generate_with_prefix_cache(engine, prompt_ids: Sequence[int], prefix_cache, **gen_kwargs):
    """lessonkit.engine.generate.generate(), resuming the prompt from the prefix cache and saving it after.

    prefix_cache: a PrefixCache, or a directory (as `lessonkit generate --prefix-cache DIR` gives).
    Restores at most len(prompt) - 1 tokens (the last prompt token is forwarded to get logits),
    runs generate() on the resumed cache, then saves the prompt's KV state if it was not already
    covered. Adds prefix_cache_queries / prefix_cache_hits (tokens), restore_s, prefill_s_saved,
    ttft_s (from the call, restore included) and total_s to the result's stats.

    Exactness: a resumed prompt continues from exactly the state a fresh prefill of the same chunks
    computes (the saved prompt, then the rest). Versus one single forward over the whole prompt, the
    engine's GEMM results can depend on chunk boundaries in the last bits (see lessonkit.engine.model).
    """
    prompt_ids = [int(t) for t in prompt_ids]
    if prefix_cache is None:
        return generate(engine, prompt_ids, **gen_kwargs)
    if not isinstance(prefix_cache, PrefixCache):
        prefix_cache = PrefixCache(prefix_cache, engine)
    if not prompt_ids:
        raise LessonkitError("generate needs a non-empty prompt")
    t_start = time.perf_counter()
    before = prefix_cache.stats.as_dict()
    max_new = int(gen_kwargs.get("max_new_tokens", 0) or 0)
    cache = gen_kwargs.pop("cache", None) or engine.new_cache(len(prompt_ids) + max_new + 1)
    n = prefix_cache.lookup_and_restore(prompt_ids, cache, max_tokens=len(prompt_ids) - 1)
    first = {}
    user_cb = gen_kwargs.pop("callback", None)

    def callback(*a, **k):
        first.setdefault("t", time.perf_counter())
        return user_cb(*a, **k) if user_cb is not None else None

    res = generate(engine, prompt_ids, cache=cache, callback=callback, **gen_kwargs)
    after = prefix_cache.stats.as_dict()
    if n < len(prompt_ids) - 1 and cache.length >= len(prompt_ids):
        save_or_warn(prefix_cache, prompt_ids, cache, prefill_s=(res.stats or {}).get("ttft_s") if n == 0 else None)
    stats = dict(res.stats or {})
    for k in ("prefix_cache_queries", "prefix_cache_hits", "restore_s", "prefill_s_saved"):
        stats[k] = after[k] - before[k]
    if "t" in first:
        stats["ttft_s"] = first["t"] - t_start
    stats["total_s"] = time.perf_counter() - t_start
    res.stats = stats
    return res
