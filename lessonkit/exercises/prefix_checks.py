"""Self-checks for the lesson 4 exercises (notebooks/exercises/04_prefix_cache.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import prefix_checks as check
    check.fingerprint(my_fingerprint)
"""
from __future__ import annotations

import json
import random
import re

from lessonkit.exercises import call

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
