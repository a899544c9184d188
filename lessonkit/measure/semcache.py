"""The semantic cache measured: cache-side time of a hit and a miss with the query embedded live, a fresh judge
call's time, and the net time a stream saved. Lesson 5 shows these; `lessonkit bench semcache` reports them."""
from __future__ import annotations

import statistics
import time

from lessonkit.semcache.policies import load_embedder, run_stream
from lessonkit.semcache.store import CacheStore

SMOKE_ITEMS = 300

def time_hits(texts, policy, judge, embeddings, n: int = 40) -> dict:
    """Cache-side time per query on a hit and on a miss, with the query embedded live (medians over ``n``, ms).

    The stream runs once on precomputed embeddings to find its hits; then each of the first ``n``
    hits is replayed against the filled store: embed the query (MiniLM, one text), search, guard.
    """
    store = CacheStore(":memory:", "timing")
    result = run_stream(texts, policy, judge, embeddings=embeddings, store=store)
    embedder = load_embedder()
    embedder.embed_one("warm-up")
    hit_ms, miss_ms = [], []
    for r in [r for r in result.records if r.hit][:n]:
        t0 = time.perf_counter()
        policy.lookup(store, r.text, embedder.embed_one(r.text))
        hit_ms.append((time.perf_counter() - t0) * 1e3)
    for r in [r for r in result.records if not r.hit][:n]:      # a miss pays the lookup too, then the judge
        t0 = time.perf_counter()
        policy.lookup(store, r.text, embedder.embed_one(r.text))
        miss_ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_hit_ms": statistics.median(hit_ms) if hit_ms else None, "hits_timed": len(hit_ms),
            "median_miss_lookup_ms": statistics.median(miss_ms) if miss_ms else None, "misses_timed": len(miss_ms)}

def time_saved_s(summary: dict, judge_ms: float, hit_ms: float, miss_lookup_ms: float) -> float:
    """Net seconds the cache saved on a stream: the judge calls it saved, minus the lookup that every query
    pays (a hit's embed + search + guard, and a miss's embed + search before it goes to the judge anyway)."""
    misses = summary["queries"] - summary["hits"]
    return (summary["judge_calls_saved"] * judge_ms - summary["hits"] * hit_ms - misses * miss_lookup_ms) / 1e3

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
