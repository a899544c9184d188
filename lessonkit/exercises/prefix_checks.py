"""Self-checks for the lesson 4 exercises (notebooks/exercises/04_prefix_cache.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import prefix_checks as check
    check.fingerprint(my_fingerprint)
"""
from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from types import SimpleNamespace

from lessonkit.exercises import call, number, run_cases

SEED = 2026

_BASE = {
    "weights": {"dense.safetensors": "1f" * 32, "experts.safetensors": "a0" * 32},
    "tokenizer_json": json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}),
    "config": {"vocab_size": 3, "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16},
    "dtype": "float32",
    "quant": None,
    "format_version": 1,
}


def _call(name: str, fn, *args):
    """(result, None) or (None, "<name>: <what went wrong>"), "<name>: not implemented yet" for a stub."""
    got, error = call(fn, args)
    return got, error and f"{name}: {error}"


def _args(d: dict) -> tuple:
    return (dict(d["weights"]), d["tokenizer_json"], dict(d["config"]), d["dtype"], d["quant"], d["format_version"])


# ---- exercise 1: the fingerprint -----------------------------------------------------------------
def _changes() -> list[tuple[str, dict]]:
    b = _BASE
    tok = json.loads(b["tokenizer_json"])
    tok2 = json.loads(b["tokenizer_json"])
    tok2["model"]["merges"] = []                       # same vocabulary, other merges: other token ids
    return [
        ("the weights (same file names and sizes, other bytes: a fine-tune)",
         {**b, "weights": {**b["weights"], "experts.safetensors": "a1" + "a0" * 31}}),
        ("the tokenizer (same vocabulary, other merges)", {**b, "tokenizer_json": json.dumps(tok2)}),
        ("the model config (rope_theta added)", {**b, "config": {**b["config"], "rope_theta": 500000.0}}),
        ("the dtype (float32 -> bfloat16)", {**b, "dtype": "bfloat16"}),
        ("the quantisation (none -> int8 per row)", {**b, "quant": "int8-rowwise"}),
        ("the cache format version (1 -> 2)", {**b, "format_version": 2}),
        ("which file has which hash (the two weight hashes swapped)",
         {**b, "weights": {"dense.safetensors": b["weights"]["experts.safetensors"],
                           "experts.safetensors": b["weights"]["dense.safetensors"]}}),
    ], tok


def fingerprint(fn) -> bool:
    """fn(weights: dict[name, sha256 hex], tokenizer_json: str, config: dict, dtype: str, quant, format_version: int) -> hex str."""
    name = "fingerprint"
    base, err = _call(name, fn, *_args(_BASE))
    if err:
        print(err)
        return False
    if not isinstance(base, str) or not re.fullmatch(r"[0-9a-f]{64}", base):
        print(f"{name}: returned {type(base).__name__} {str(base)[:20]!r}...; expected a SHA-256 hex digest "
              "(64 lowercase hex characters)")
        return False
    again, err = _call(name, fn, *_args(_BASE))
    if err or again != base:
        print(err or f"{name}: two calls with the same inputs gave different fingerprints")
        return False
    reordered = {**_BASE, "config": dict(reversed(list(_BASE["config"].items()))),
                 "weights": dict(reversed(list(_BASE["weights"].items())))}
    got, err = _call(name, fn, *_args(reordered))
    if err or got != base:
        print(err or f"{name}: the same config and weights given in another key order changed the fingerprint "
                     "(a process that builds its dicts in another order would never hit the cache)")
        return False
    changes, _ = _changes()
    for what, d in changes:
        got, err = _call(name, fn, *_args(d))
        if err:
            print(err)
            return False
        if got == base:
            print(f"{name}: changing {what} did not change your fingerprint: a cache keyed by it would serve "
                  "a state that belongs to another model")
            return False
    caught = ", ".join(w.split(" (")[0].replace("the ", "") for w, _ in changes)
    print(f"{name}: OK: deterministic, independent of dict order, and it catches changes to {caught}")
    return True


# ---- exercise 2: chained block hashes --------------------------------------------------------------
def block_hashes(fn) -> bool:
    """fn(token_ids: list[int], block_size: int, root: str) -> list of hashes, one per FULL block, chained."""
    name = "block_hashes"
    rng = random.Random(SEED)
    for bs in (4, 16):
        ids = [rng.randrange(50_000) for _ in range(bs * 6 + bs // 2)]
        hs, err = _call(name, fn, list(ids), bs, "root-a")
        if err:
            print(err)
            return False
        if not isinstance(hs, (list, tuple)):
            print(f"{name}: returned {type(hs).__name__}; expected a list of hashes")
            return False
        if len(hs) != len(ids) // bs:
            print(f"{name}: {len(ids)} tokens with block size {bs} gave {len(hs)} hashes; only full blocks get one")
            return False
        if len(set(map(str, hs))) != len(hs):
            print(f"{name}: two blocks of random tokens got the same hash")
            return False
        again, _ = _call(name, fn, list(ids), bs, "root-a")
        if list(again) != list(hs):
            print(f"{name}: two calls with the same tokens gave different hashes (use hashlib, not hash())")
            return False
        for k in range(0, len(ids) + 1, max(1, bs // 2)):
            pre, err = _call(name, fn, list(ids[:k]), bs, "root-a")
            if err or list(pre) != list(hs[: k // bs]):
                print(err or f"{name}: the hashes of the first {k} tokens are not the first {k // bs} hashes of the "
                             "whole sequence (a block's hash must depend only on the tokens up to its end)")
                return False
        j = 2
        edited = list(ids)
        edited[j * bs + 1] += 1
        he, err = _call(name, fn, edited, bs, "root-a")
        if err:
            print(err)
            return False
        if list(he[:j]) != list(hs[:j]):
            print(f"{name}: editing a token in block {j} changed the hash of an earlier block")
            return False
        same_after = [i for i in range(j, len(hs)) if he[i] == hs[i]]
        if same_after:
            print(f"{name}: editing a token in block {j} left the hash of block {same_after[0]} unchanged: "
                  "each hash must cover its parent's hash (a chain), or a prompt that differs early would "
                  "match a later block")
            return False
        other_root, err = _call(name, fn, list(ids), bs, "root-b")
        if err or any(a == b for a, b in zip(other_root, hs)):
            print(err or f"{name}: another root (another model's fingerprint) gave an equal hash: the root must "
                         "be the parent of the first block")
            return False
    rep = [7, 7, 7, 7] * 3
    hr, err = _call(name, fn, rep, 4, "root-a")
    if err or len(set(map(str, hr))) != 3:
        print(err or f"{name}: three identical blocks at depths 0, 1, 2 got equal hashes (the chain must make "
                     "depth part of the hash)")
        return False
    a, err1 = _call(name, fn, [1, 23, 4, 5], 4, "root-a")
    b, err2 = _call(name, fn, [12, 3, 4, 5], 4, "root-a")
    if err1 or err2 or list(a) == list(b):
        print(err1 or err2 or f"{name}: tokens [1, 23, 4, 5] and [12, 3, 4, 5] got the same hash: encode each token "
                              "unambiguously (fixed-width bytes, or a separator)")
        return False
    print(f"{name}: OK: one hash per full block, deterministic, chained, root- and depth-sensitive, unambiguous")
    return True


# ---- exercise 3: longest-prefix match ---------------------------------------------------------------
def _ref_match(query, saved, bs):
    best, best_n = None, 0
    for name, ids in saved.items():
        n = 0
        while n + bs <= min(len(query), len(ids)) and query[n:n + bs] == ids[n:n + bs]:
            n += bs
        if n > best_n:
            best, best_n = name, n
    return best, best_n


def _match_cases():
    rng = random.Random(SEED + 1)
    base = [rng.randrange(1000) for _ in range(64)]
    saved = {"short": base[:16], "long": base[:48], "other": [rng.randrange(1000) for _ in range(40)],
             "late-same": [999] * 16 + base[16:48]}      # equal blocks 1-2 but a different block 0
    cases = [("the exact saved prompt", base[:48], saved),
             ("a longer prompt that starts with a saved one", base + [1, 2, 3], saved),
             ("a prompt sharing 2 full blocks and a few more tokens", base[:35] + [5] * 9, saved),
             ("a prompt whose first block differs", [5] + base[1:48], saved),
             ("an empty cache", base[:32], {}),
             ("a prompt shorter than one block", base[:7], saved)]
    for i in range(6):
        q = base[: rng.randrange(8, 64)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 10))]
        cases.append((f"random prompt #{i}", q, saved))
    return cases


def longest_prefix_match(fn, block_size: int = 8) -> bool:
    """fn(query_ids: list[int], saved: dict[name, list[int]], block_size: int) -> (name or None, n tokens)."""
    name = "longest_prefix_match"
    for label, query, saved in _match_cases():
        got, err = _call(name, fn, list(query), {k: list(v) for k, v in saved.items()}, block_size)
        if err:
            print(err)
            return False
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            print(f"{name}: returned {type(got).__name__}; expected a pair (name or None, number of tokens)")
            return False
        gname, gn = got
        _, ref_n = _ref_match(query, saved, block_size)
        if not isinstance(gn, int):
            print(f"{name}: on '{label}': the token count is {type(gn).__name__}, expected int")
            return False
        if gn % block_size:
            print(f"{name}: on '{label}': {gn} tokens is not a whole number of blocks of {block_size}")
            return False
        if gn != ref_n:
            print(f"{name}: on '{label}': matched {gn} tokens, which is "
                  f"{'more than the prompt truly shares with any saved one' if gn > ref_n else 'not the longest shared prefix'}")
            return False
        if gn == 0:
            if gname is not None:
                print(f"{name}: on '{label}': nothing is shared, so the name should be None (got {gname!r})")
                return False
            continue
        ids = saved.get(gname)
        if ids is None or ids[:gn] != list(query[:gn]):
            print(f"{name}: on '{label}': the entry {gname!r} does not share {gn} tokens with the prompt")
            return False
    print(f"{name}: OK on {len(_match_cases())} prompts (exact, longer, partial, first block different, empty cache)")
    return True


# ---- exercise 4: a snapshot's bytes per token --------------------------------------------------------
def _ref_bytes(config, elem) -> int:
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * elem


def _bytes_cases():
    def cfg(layers, heads, kv, hd):
        return SimpleNamespace(n_layers=layers, n_heads=heads, n_kv_heads=kv, head_dim=hd, dim=heads * hd)
    cases = [("SmolLM2-135M's shape, float32", (cfg(30, 9, 3, 64), 4)),
             ("the same shape in bfloat16", (cfg(30, 9, 3, 64), 2)),
             ("multi-head attention (as many KV heads as query heads)", (cfg(4, 8, 8, 32), 4)),
             ("one KV head for all query heads (multi-query)", (cfg(12, 16, 1, 128), 2))]
    rng = random.Random(SEED + 4)
    for i in range(8):
        kv = rng.choice([1, 2, 4, 8])
        cases.append((f"random #{i + 1}", (cfg(rng.randint(2, 48), kv * rng.choice([2, 3, 4, 8]), kv,
                                                 rng.choice([32, 64, 80, 128])), rng.choice([1, 2, 4]))))
    return cases


def _judge_bytes(args, got):
    config, elem = args
    want = _ref_bytes(config, elem)
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not float(got).is_integer():
        return f"returned {got!r}; expected a whole number of bytes"
    if got == want:
        return None
    kv = config.n_layers * config.n_kv_heads * config.head_dim * elem
    if got == kv:
        return f"got {got}: a token's snapshot holds its keys and its values"
    if got == 2 * config.n_layers * config.n_heads * config.head_dim * elem or got == 2 * config.n_layers * config.dim * elem:
        return f"got {got}: that counts every query head; the cache keeps only the KV heads (grouped-query attention)"
    if got == 8 * want:
        return f"got {got}: that is bits, not bytes"
    if got == 2 * config.n_kv_heads * config.head_dim * elem:
        return f"got {got}: every layer keeps its own K and V"
    return f"got {got}, which is not the K and V bytes one token adds to a snapshot"


def snapshot_bytes_per_token(fn) -> bool:
    """Exercise 4: fn(config, bytes_per_element) -> bytes of K and V one token adds to a snapshot."""
    return run_cases("snapshot_bytes_per_token", fn, _bytes_cases(), _judge_bytes)


# ---- exercise 5: when a restore beats a re-prefill -----------------------------------------------------
def _ref_break_even(bytes_per_token, prefill_s_per_token) -> float:
    return bytes_per_token / prefill_s_per_token / 1e6


def _break_even_cases():
    cases = [("SmolLM2's snapshot, a fast prefill", (46_080.0, 0.002)),
             ("SmolLM2's snapshot, a slow prefill", (46_080.0, 0.05)),
             ("a large model's snapshot", (327_680.0, 0.02)),
             ("a tiny model, prefill in microseconds", (1_024.0, 4e-5))]
    rng = random.Random(SEED + 5)
    for i in range(8):
        cases.append((f"random #{i + 1}", (rng.uniform(1e3, 1e6), rng.uniform(1e-5, 0.1))))
    return cases


def _judge_break_even(args, got):
    b, s = args
    if number(got) is None:
        return f"returned {type(got).__name__}; expected one number of MB/s"
    got, want = number(got), _ref_break_even(b, s)
    if math.isclose(got, want, rel_tol=1e-6):
        return None
    if math.isclose(got, b / s, rel_tol=1e-6):
        return f"got {got:.4g}: that is bytes per second; the unit asked for is MB/s (10^6 bytes per second)"
    if math.isclose(got, b / s / 2 ** 20, rel_tol=1e-6):
        return f"got {got:.4g}: that is MiB/s (2^20 bytes); the unit asked for is MB/s (10^6 bytes)"
    if math.isclose(got, s / b * 1e6, rel_tol=1e-6) or math.isclose(got, s / b, rel_tol=1e-6):
        return f"got {got:.4g}: upside down; the break-even is the bandwidth that reads a token's bytes in its prefill time"
    if math.isclose(got, b / (s * 1e3) / 1e6, rel_tol=1e-6) or math.isclose(got, b / (s / 1e3) / 1e6, rel_tol=1e-6):
        return f"got {got:.4g}: the prefill time is in seconds per token"
    return f"got {got:.4g}, which is not the read bandwidth at which restoring takes as long as prefilling"


def restore_break_even_mb_s(fn) -> bool:
    """Exercise 5: fn(bytes_per_token, prefill_s_per_token) -> the read bandwidth, in MB/s, below which reading a
    snapshot takes longer than computing its tokens again."""
    return run_cases("restore_break_even_mb_s", fn, _break_even_cases(), _judge_break_even)


def on_this_machine(bytes_fn, break_even_fn, smoke: bool = False, seed: int = 0) -> bool:
    """Lesson 4's model (a tiny random one in SMOKE): prefill a prefix, save it, restore it, here; then your bytes per
    token next to the snapshot file's, and your break-even bandwidth from this run's prefill next to the bandwidth the
    restore moved. True when both functions agree with the formulas on this run's numbers."""
    import tempfile

    import torch

    from lessonkit.measure import prefix_cache as measured
    torch.manual_seed(seed)
    work = Path(tempfile.mkdtemp(prefix="exercise04-"))
    engine = measured._load(measured.demo_models(work / "models")[0] if smoke else "smollm2-135m")
    n = 32 if smoke else 128
    df = measured.restore_vs_prefill_table(engine, work / "cache", [n], repeats=1 if smoke else 3, progress=False)
    be = measured.restore_break_even(df)
    elem = engine.new_cache(1).k.element_size()
    print(f"measured here ({engine.name}, {n} tokens): prefill {1e3 * be['prefill_s_per_token']:.2f} ms per token; "
          f"snapshot file {be['bytes_per_token']:,.0f} B per token; restore {float(df.iloc[0]['restore s']):.3f} s "
          f"({be['restore_mb_s']:.0f} MB/s, page cache warm)")
    ok = True
    got, err = _call("snapshot_bytes_per_token", bytes_fn, engine.config, elem)
    problem = err or _judge_bytes((engine.config, elem), got)
    if problem:
        print(problem if err else f"snapshot_bytes_per_token: on this model's config: {problem}")
        ok = False
    else:
        print(f"snapshot_bytes_per_token: yours {int(got):,} B per token; the file holds "
              f"{be['bytes_per_token'] - int(got):,.0f} B per token more (the token ids and the header)")
    got, err = _call("restore_break_even_mb_s", break_even_fn, be["bytes_per_token"], be["prefill_s_per_token"])
    problem = err or _judge_break_even((be["bytes_per_token"], be["prefill_s_per_token"]), got)
    if problem:
        print(problem if err else f"restore_break_even_mb_s: on this run's numbers: {problem}")
        return False
    got = float(got)
    wins = be["restore_mb_s"] > got
    print(f"restore_break_even_mb_s: yours {got:.1f} MB/s from this run's file and prefill; the restore moved "
          f"{be['restore_mb_s']:.0f} MB/s, so restoring {'wins' if wins else 'loses'} here"
          + (f" (a disk slower than {got:.1f} MB/s would lose)" if wins else ""))
    return ok
