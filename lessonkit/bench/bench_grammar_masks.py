"""`lessonkit bench grammar-masks` (also a section of `bench grammar`): schema compile time and token-mask
time per token on the test schemas with SmolLM2's 49,152-token vocabulary, one thread, side by side:
the reference mask (one automaton step per trie node in Python, cached per state: the code before
issue 19), the depth-by-depth numpy walk (lessonkit.grammar.masks, cached per state), and llguidance
where it is installed.

Each schema's texts come from seeded walks through its grammar (`sample_text`), tokenised with the
tokenizer; a mask is computed before every token and once at the end, starting from a fresh grammar
(cold caches), so the figures include every first visit of a state.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

from lessonkit.bench.common import goal
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.grammar.measure import sample_text
from lessonkit.grammar.tokens import TokenGrammar, trie_levels, vocabulary_trie
from lessonkit.measure.grammar import _test_schema_dir
from lessonkit.models.registry import resolve_model_dir
from lessonkit.engine.machine import machine_record

MASK_TARGET_MS, COMPILE_TARGET_MS = 1.0, 2.0


def smollm2_tokenizer():
    """SmolLM2's tokenizer from the converted model folder (converted on first use)."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(resolve_model_dir("smollm2-135m")[1] / "tokenizer.json"))


def _median_ms(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def _mask_times(tg: TokenGrammar, texts: list[list[int]], reference: bool) -> list[float]:
    """Seconds per mask over the token sequences, the reference walk cached per state as the old code did."""
    cache: dict = {}
    out = []
    for ids in texts:
        s = tg.grammar.initial()
        for t in ids + [None]:
            t0 = time.perf_counter()
            if reference:                        # as token_mask did before: ids cached per state, a fresh tensor
                arr = cache.get(s)
                if arr is None:
                    arr = cache[s] = np.zeros(len(tg.table), dtype=np.bool_)
                    arr[tg.trie.allowed_ids(s)] = True
                torch.from_numpy(arr.copy())
            else:
                tg.token_mask(s)
            out.append(time.perf_counter() - t0)
            if t is not None:
                s = s.advance_bytes(tg.table[t])
    return out


def _llguidance_row(schema: dict, lltok, texts: list[list[int]], repeats: int) -> dict:
    import llguidance
    if isinstance(schema, bool):                 # llguidance wants an object to attach its options to
        schema = {} if schema else {"not": {}}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False})
    compile_ms = _median_ms(lambda: llguidance.LLMatcher(lltok, grammar, log_level=0), repeats)
    times, refused = [], 0
    for ids in texts:
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        for t in ids + [None]:
            t0 = time.perf_counter()
            m.compute_bitmask()
            times.append(time.perf_counter() - t0)
            if t is not None and not m.consume_token(t):
                refused += 1
                break
        if m.is_error():
            refused += 1
    return {"llg_compile_ms": compile_ms, "llg_mask_ms_median": 1e3 * statistics.median(times),
            "llg_mask_ms_mean": 1e3 * statistics.fmean(times), "llg_texts_refused": refused}


def schema_row(path, tok, lltok, *, n_texts: int, repeats: int, reference: bool) -> dict:
    schema = json.loads(path.read_text(encoding="utf-8"))
    g = schema_grammar(schema, whitespace="compact", source=path.name)
    texts = [tok.encode(sample_text(g, seed).decode("utf-8")).ids for seed in range(n_texts)]
    row = {"schema": path.stem, "tokens": sum(len(t) + 1 for t in texts),
           "compile_ms": _median_ms(lambda: schema_grammar(schema, whitespace="compact"), repeats)}
    fast = _mask_times(TokenGrammar(schema_grammar(schema, whitespace="compact"), tok), texts, False)
    row.update(mask_ms_median=1e3 * statistics.median(fast), mask_ms_mean=1e3 * statistics.fmean(fast))
    if reference:
        ref = _mask_times(TokenGrammar(schema_grammar(schema, whitespace="compact"), tok), texts, True)
        row.update(ref_mask_ms_median=1e3 * statistics.median(ref), ref_mask_ms_mean=1e3 * statistics.fmean(ref))
    if lltok is not None:
        row.update(_llguidance_row(schema, lltok, texts, repeats))
    return row


def _llguidance_tokenizer(tok):
    try:
        import llguidance
    except ImportError:
        return None
    return llguidance.LLTokenizer(tok.to_str())


def mask_section(smoke: bool = False, repeats: int = 5, reference: bool | None = None) -> dict:
    """Per-schema rows and the summary: medians over schemas of each figure (the slow reference walk is left
    out of smoke runs unless asked for)."""
    reference = not smoke if reference is None else reference
    pin_torch_threads(1)
    tok = smollm2_tokenizer()
    table, trie = vocabulary_trie(tok)
    trie_levels(trie, table)                     # once per tokenizer, not part of any schema's figures
    lltok = _llguidance_tokenizer(tok)
    paths = sorted(_test_schema_dir().glob("*.json"))[:3 if smoke else None]
    rows = [schema_row(p, tok, lltok, n_texts=1 if smoke else 3, repeats=repeats, reference=reference)
            for p in paths]
    keys = [k for k in rows[0] if k.endswith("_ms") or "_ms_" in k]
    summary = {f"{k}_over_schemas": {"median": statistics.median(r[k] for r in rows),
                                     "max": max(r[k] for r in rows)} for k in keys}
    return {"rows": rows, "summary": summary, "llguidance": lltok is not None}


def mask_targets(section: dict) -> list[dict]:
    s = section["summary"]
    mask = s["mask_ms_median_over_schemas"]["median"]
    comp = s["compile_ms_over_schemas"]["median"]
    return [goal("mask time per token (ms, median over tokens, median over test schemas, one thread)", mask,
                 MASK_TARGET_MS, mask <= MASK_TARGET_MS),
            goal("schema compile time (ms, median over test schemas)", comp, COMPILE_TARGET_MS,
                 comp <= COMPILE_TARGET_MS)]


def bench(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    section = mask_section(smoke, repeats=1 if smoke else max(3, int(getattr(args, "repeats", 5) or 5)))
    return {"bench": "grammar-masks", "machine": machine_record(), "smoke": smoke, "rows": section["rows"],
            "summary": section["summary"], "llguidance": section["llguidance"], "targets": mask_targets(section),
            "notes": [] if section["llguidance"] else ["llguidance is not installed: its columns are left out"]}
