"""The suffix drafter measured (SuffixDecoding, lessonkit.speculative.suffix; issue 58), shared by lesson 1b and
`lessonkit bench suffix`: a store warmed on the structured workload's training split in a fresh temporary folder,
stores holding a share of it, the suffix drafter's steps as figures (tokens per verify, steps with no draft),
the store's size against its gain on held-out requests (SuffixDecoding's curve) and one request traced step by
step (which source drafted what, how much of it the target accepted).

Every held-out request is measured with learning off (`SuffixDrafter(store, learn=False)`): no request meets a
store that holds its own earlier output."""
from __future__ import annotations

import tempfile
import time

import pandas as pd

from lessonkit.engine.generate import generate, request_cache
from lessonkit.errors import LessonkitError
from lessonkit.measure.speculative import plain_runner, spec_runner, speedup_ratios, take_turns
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.speculative.drafters import common_prefix
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.speculative.suffix_store import SuffixStore
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.structured import FAMILIES, structured_prompts, structured_requests

SUFFIX_K = 8                # the most drafts a suffix step may verify; the drafter's own rule picks fewer
STORE_SHARES = (0.25, 0.5, 1.0)     # store sizes: these shares of the training split's outputs (0: the empty store)
EMPTY = "suffix, empty store"


def warm_suffix_store(target, train: list, max_new: int, k: int = SUFFIX_K) -> tuple[SuffixStore, float]:
    """A suffix store warmed on `train` (the suffix drafter learning from the target's verified outputs), in a
    fresh temporary folder (checked empty: a measurement starts from an empty store; removed afterwards), saved and
    loaded back as a restarted process would; (store, seconds). Measure with it through SuffixDrafter(store,
    learn=False)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="suffix-bench-") as folder:
        store = SuffixStore.for_target(target, folder, max_tokens=1 << 20)
        if len(store):
            raise LessonkitError(f"the benchmark's fresh store folder {folder} is not empty")
        drafter = SuffixDrafter(store)
        for p in train:
            speculative_generate(target, drafter, p, max_new, k=k)
        store.save()
        store = SuffixStore.for_target(target, folder, max_tokens=1 << 20)
    return store, time.perf_counter() - t0


def sized_store(full: SuffixStore, share: float) -> SuffixStore:
    """A store holding the first `share` of the full store's outputs (by tokens), not saved anywhere."""
    limit, store = int(full.n_tokens * share), SuffixStore(None, full.key, max_tokens=full.max_tokens)
    for out in full.outputs:
        if store.n_tokens + len(out) > limit:
            break
        store.add(out)
    return store


def store_contenders(target, store: SuffixStore, max_new: int, shares=STORE_SHARES,
                     empty: bool = True) -> tuple[dict, dict]:
    """The suffix drafter with an empty store (empty=True) and with each share of `store`, learning off: name ->
    runner (prompt -> (tokens, stats)), and name -> its store (the curve's points)."""
    fns, stores = {}, {}
    if empty:
        fns[EMPTY], stores[EMPTY] = spec_runner(target, SuffixDrafter(None, learn=False), SUFFIX_K, max_new), \
            SuffixStore(None, store.key)
    for share in shares:
        s = sized_store(store, share)
        name = f"suffix, store {s.n_tokens} tokens ({share:.0%} of the training split)"
        fns[name], stores[name] = spec_runner(target, SuffixDrafter(s, learn=False), SUFFIX_K, max_new), s
    return fns, stores


def shared_prefix_lengths(prompts: list[list[int]]) -> list[int]:
    """Per prompt, the longest prefix it shares with another of `prompts` (a structured family's system turn and
    worked example), at most its length less one: the last prompt token is prefilled, to give the first logits."""
    return [min(max((common_prefix(p, q) for j, q in enumerate(prompts) if j != i), default=0), len(p) - 1)
            for i, p in enumerate(prompts)]


class SharedPrefix:
    """A persistent prefix cache (lessonkit.prefix_cache) in front of structured requests, as a batch scorer runs them:
    each request's shared prefix (its family's system turn and worked example: shared_prefix_lengths over `prompts`)
    is prefilled once and saved into `folder`, then restored from disk before every run, so plain greedy and the
    drafters alike prefill only the request's own item. `runner` times the restore as part of the run's prefill."""

    def __init__(self, target, prompts: list[list[int]], folder):
        self.target, self.folder = target, folder
        self.cache = PrefixCache(folder, target)
        self.lengths = {tuple(p): n for p, n in zip(prompts, shared_prefix_lengths(prompts))}
        saved = set()
        for p in prompts:
            n = self.lengths[tuple(p)]
            if n and tuple(p[:n]) not in saved:
                saved.add(tuple(p[:n]))
                kv = target.new_cache(n)
                target.forward(list(p[:n]), kv, last_only=True)
                self.cache.save(p[:n], kv)

    def restore(self, prompt: list[int], max_new: int):
        """(a KV cache holding the prompt's shared prefix, read from the prefix cache, and the seconds it took)."""
        t0 = time.perf_counter()
        n = self.lengths[tuple(prompt)]
        kv = request_cache(self.target, len(prompt), max_new)
        got = self.cache.lookup_and_restore(prompt[:n], kv, max_tokens=n) if n else 0
        if got != n:
            raise LessonkitError(f"the prefix cache in {self.folder} restored {got} of the prompt's {n} shared tokens")
        return kv, time.perf_counter() - t0

    def runner(self, max_new: int, drafter=None, k: int = SUFFIX_K):
        """prompt -> (tokens, stats) behind the prefix cache: plain greedy (drafter None) or speculative decoding;
        the restore's seconds count in the run's wall time and its time to first token."""
        def run(p):
            kv, s = self.restore(p, max_new)
            r = generate(self.target, p, max_new, cache=kv) if drafter is None else \
                speculative_generate(self.target, drafter, p, max_new, k=k, cache=kv)
            return r.token_ids, {**r.stats, "ttft_s": r.stats["ttft_s"] + s, "wall_s": r.stats["wall_s"] + s,
                                 "restore_s": s}
        return run


def step_profile(stats: list[dict]) -> dict:
    """A speculative run's steps (stats of one or more requests): tokens per verify (the tokens after each
    prefill over the verify forwards), the share of steps with no draft, acceptance (accepted over drafted
    tokens) and the mean draft depth of the steps that drafted."""
    steps = sum(sum(s["k_hist"].values()) for s in stats)
    drafting = steps - sum(s["k_hist"].get(0, 0) for s in stats)
    drafted = sum(s["num_draft_tokens"] for s in stats)
    return {"tokens_per_verify": round(sum(s["new_tokens"] - 1 for s in stats) / max(steps, 1), 3),
            "no_draft_share": round(1 - drafting / max(steps, 1), 3),
            "acceptance_rate": round(sum(s["num_accepted_tokens"] for s in stats) / max(drafted, 1), 3),
            "mean_draft_depth": round(drafted / max(drafting, 1), 2)}


def store_curve(target, *, n_train: int, n_heldout: int, max_new: int, repeats: int, shares=STORE_SHARES,
                families=FAMILIES) -> tuple[pd.DataFrame, dict]:
    """SuffixDecoding's curve on this machine: a store warmed on the structured training split (n_train requests
    of each of `families`), then the held-out split (n_heldout of each) with plain greedy, an empty store and each
    share of the store, taking turns in `repeats` rounds. One row per store: its size (tokens, outputs), tokens per
    verify, steps with no draft, acceptance, speed-up over plain greedy (median of the per-round ratios, min .. max) and
    whether every output equals plain greedy's. Also (info) the store, the prompts and the sizes."""
    train = structured_prompts(target, "train", n_train, families)
    held = structured_prompts(target, "heldout", n_heldout, families)
    store, warm_s = warm_suffix_store(target, train, max_new)
    fns, stores = store_contenders(target, store, max_new, shares)
    runs = take_turns({"plain greedy": plain_runner(target, max_new), **fns}, held, repeats)
    plain_walls, _, ref, _ = runs["plain greedy"]
    rows = []
    for name, s in stores.items():
        walls, _, outs, stats = runs[name]
        sp = speedup_ratios(plain_walls, walls)
        rows.append({"contender": name, "store_tokens": s.n_tokens, "store_outputs": len(s),
                     **step_profile(stats), "speedup": sp["median"], "speedup_min": sp["min"],
                     "speedup_max": sp["max"], "identical_to_plain": outs == ref})
    info = {"model": target.name, "store": store, "warm_s": warm_s, "train": len(train), "heldout": held,
            "requests": structured_requests("heldout", n_heldout, families), "max_new": max_new, "repeats": repeats,
            "plain_s": min(plain_walls)}
    return pd.DataFrame(rows), info


class TracedSuffix(SuffixDrafter):
    """The suffix drafter, recording every verify step of a run in `steps`: where the step started (tokens after
    the prompt), the source that drafted (request, store or none), the drafted tokens, how many the target
    accepted and the tokens the step emitted."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.steps: list[dict] = []

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self._asked, self._at = None, len(prompt_ids)

    def propose(self, context: list[int], k: int):
        before = dict(self.sources)
        draft = super().propose(context, k)
        source = next((s for s, n in self.sources.items() if n != before.get(s)), "none")
        self._asked, self._at = (source if draft.tokens else "none", [int(t) for t in draft.tokens]), len(context)
        return draft

    def update(self, context: list[int], num_accepted: int) -> None:
        super().update(context, num_accepted)
        source, drafted = self._asked or ("none", [])
        self.steps.append({"at": self._at - self.prompt_len, "source": source, "drafted": drafted,
                           "accepted": int(num_accepted), "emitted": [int(t) for t in context[self._at:]]})
        self._asked, self._at = None, len(context)


def trace_request(target, store: SuffixStore | None, prompt: list[int], max_new: int) -> tuple[list[dict], bool]:
    """One request with the suffix drafter over `store` (learning off), step by step (TracedSuffix.steps), and
    whether its output equals plain greedy's."""
    drafter = TracedSuffix(store, learn=False)
    out = speculative_generate(target, drafter, prompt, max_new, k=SUFFIX_K).token_ids
    return drafter.steps, out == plain_runner(target, max_new)(prompt)[0]


def trace_summary(steps: list[dict]) -> dict:
    """A traced run (TracedSuffix.steps) in figures: verify steps, tokens per verify (the tokens the steps emitted
    over the steps; the prefill's first token left out), the share of steps with no draft, and per source (request,
    store) the steps it drafted, its drafted and its accepted tokens."""
    n = max(len(steps), 1)
    out = {"steps": len(steps), "tokens_per_verify": sum(len(s["emitted"]) for s in steps) / n,
           "no_draft_share": sum(s["source"] == "none" for s in steps) / n}
    for src in ("request", "store"):
        mine = [s for s in steps if s["source"] == src]
        out[src] = {"drafts": len(mine), "drafted": sum(len(s["drafted"]) for s in mine),
                    "accepted": sum(s["accepted"] for s in mine)}
    return out
