"""Grammar-forced drafting measured: plain greedy vs grammar-drafted on the same prompt (interleaved, medians),
schema compile times, and the corpus's held-out monitoring records. Lesson 3 draws these; `lessonkit bench grammar`
reports them."""
from __future__ import annotations

import json
import time
from pathlib import Path

from lessonkit.engine.generate import generate
from lessonkit.files.resources import workbook_path
from lessonkit.grammar.drafter import GrammarDrafter, grammar_depth
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.grammar.tokens import TokenGrammar
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.corpus import load_documents


def _test_schema_dir() -> Path:
    return workbook_path("tests", "schemas")

def schema_compile_times(repeats: int = 3) -> dict[str, float]:
    """Best-of-`repeats` compile time (schema -> grammar text -> automaton) per test schema, in seconds."""
    out = {}
    for p in sorted(_test_schema_dir().glob("*.json")):
        schema = json.loads(p.read_text(encoding="utf-8"))
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            schema_grammar(schema, whitespace="compact", source=p.name)
            best = min(best, time.perf_counter() - t)
        out[p.stem] = best
    return out

def _clear_experts(eng) -> None:
    store = getattr(eng, "store", None)
    if store is not None and hasattr(store, "clear"):
        store.clear()

def grammar_ab(eng, prompt_ids: list[int], max_new_tokens: int, tg: TokenGrammar, *, repeats: int = 3,
               confounded: bool = False, **drafter_kw) -> dict:
    """Plain greedy vs grammar-drafted on the same prompt, interleaved, medians of `repeats`.

    controlled: the expert cache is cleared before every run of either arm, so both start alike.
    confounded=True reproduces the withdrawn figure's mistake: the plain arm starts cold every time
    while the grammar arm keeps the experts the previous runs loaded (warm in one arm only).
    """

    plain_t, draft_t = [], []
    plain = drafted = drafter = None
    k = grammar_depth()
    generate(eng, prompt_ids, 4)                      # process warm-up (kernels, allocator), both arms alike
    speculative_generate(eng, GrammarDrafter(tg, **drafter_kw), prompt_ids, 4, k=k)

    def run_plain():
        nonlocal plain
        _clear_experts(eng)                           # cold in both designs
        t = time.perf_counter()
        plain = generate(eng, prompt_ids, max_new_tokens)
        plain_t.append(time.perf_counter() - t)

    def run_drafted():
        nonlocal drafted, drafter
        if confounded:                                # the mistake: this arm's experts are already loaded
            speculative_generate(eng, GrammarDrafter(tg, **drafter_kw), prompt_ids, max_new_tokens, k=k)
        else:
            _clear_experts(eng)
        drafter = GrammarDrafter(tg, **drafter_kw)
        t = time.perf_counter()
        drafted = speculative_generate(eng, drafter, prompt_ids, max_new_tokens, k=grammar_depth(drafter.max_draft))
        draft_t.append(time.perf_counter() - t)

    for r in range(repeats):                          # alternate the order so drift hits both arms
        for arm in ((run_plain, run_drafted) if r % 2 == 0 else (run_drafted, run_plain)):
            arm()
    med = lambda xs: sorted(xs)[len(xs) // 2]   # noqa: E731
    st = drafter.stats()
    n_plain, n_draft = len(plain.token_ids), len(drafted.token_ids)
    return {
        "confounded": confounded, "identical": drafted.token_ids == plain.token_ids,
        "plain_s": med(plain_t), "drafted_s": med(draft_t), "speedup": med(plain_t) / med(draft_t),
        "plain_tokens_per_s": n_plain / med(plain_t), "drafted_tokens_per_s": n_draft / med(draft_t),
        "plain_tokens_per_forward": n_plain / max(plain.stats.get("forwards", n_plain), 1),
        "tokens_per_forward": drafted.stats["tokens_per_forward"],
        "rows_per_forward": 1 + drafted.stats.get("num_draft_tokens", 0) / max(drafted.stats.get("forwards", 1), 1),
        "forced_tokens": st["forced_tokens"], "grammar_acceptance": st["grammar_acceptance"],
        "resyncs": st["resyncs"],
        "forced_fraction": st["accepted"] / max(n_draft, 1),
        "plain_expert_hit_rate": plain.stats.get("expert_hit_rate"),
        "drafted_expert_hit_rate": drafted.stats.get("expert_hit_rate"),
        "token_ids": drafted.token_ids, "text": drafted.text, "provenance": list(drafter.provenance),
    }

def corpus_records(n: int = 50, split: str = "heldout") -> list[dict]:
    """The first `n` NDJSON monitoring records of the corpus (held-out split by default)."""
    out = []
    for doc in load_documents("records", split):
        if not doc.startswith("{") or "\n  " in doc:       # skip the pretty-printed documents
            continue
        for line in doc.splitlines():
            out.append(json.loads(line))
            if len(out) >= n:
                return out
    return out


def grammar_apart(eng, prompt_ids: list[int], max_new_tokens: int, tg: TokenGrammar, cost=(), **drafter_kw):
    """What a prediction of the grammar's speed-up may read (`measure.apart.Apart`), from one untimed drafted run
    on `prompt_ids`, which must not be the timed A/B's prompt: tokens per verify forward and rows per verify
    forward (the prefill forward counted as the runs count it), with the verify cost curve `cost` (its own
    forwards). Grammar drafts cost no model forward, so c = 0."""
    from lessonkit.measure.apart import Apart
    drafter = GrammarDrafter(tg, **drafter_kw)
    st = speculative_generate(eng, drafter, prompt_ids, max_new_tokens, k=grammar_depth(drafter.max_draft)).stats
    forwards = max(st.get("forwards", 1), 1)
    return Apart(prompts=(tuple(prompt_ids),), source="a drafted run on other records", cost=tuple(cost),
                 tokens_per_verify=st["tokens_per_forward"], rows_per_verify=1 + st.get("num_draft_tokens", 0) / forwards)
