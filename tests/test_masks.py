"""The fast token masks (lessonkit.grammar.masks) equal the reference trie walk bit for bit.

The reference is `TokenTrie.allowed_ids`: one automaton step per trie node in Python, the code the
fast path replaced. States come from hypothesis-driven walks through several grammars; each mask is
computed by both the dense (whole depths) and the sparse (live children) walks, with the Python tail
switched on early, late and never, and compared with ==.
"""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lessonkit.grammar import masks
from lessonkit.grammar.automaton import load_grammar
from lessonkit.grammar.json_schema import schema_grammar
from lessonkit.grammar.tokens import TokenGrammar
from tests.hf_tiny import toy_bpe_tokenizer

SCHEMAS = Path(__file__).parent / "schemas"
TEXTS = ['{"id": 17, "name": "Ada Lovelace", "tags": ["math", "poetry"], "score": -0.5e-3, "ok": true}\n',
         '{"city":"Zürich","unit":"celsius","days":3}\n', "naïve café 😀 日本語 \\u00e9 \\n \"quoted\"",
         "2024-05-01T12:00:00Z 550e8400-e29b-41d4-a716-446655440000 ada@example.org"]


def _toy_tokenizer():
    return toy_bpe_tokenizer(TEXTS * 20, vocab_size=900)


@pytest.fixture(scope="module")
def toy():
    return _toy_tokenizer()


def _grammars():
    out = [load_grammar("json-compact"), load_grammar("ndjson")]
    for name in ("weather_args", "user_profile", "address", "semver", "uuid_list", "expression_tree"):
        out.append(schema_grammar(json.loads((SCHEMAS / f"{name}.json").read_text()), whitespace="compact"))
    return out


GRAMMARS = _grammars()


def _walk(data, grammar):
    """A state reached by a drawn walk of legal bytes (printable ones mostly, so strings get long)."""
    s = grammar.initial()
    for _ in range(data.draw(st.integers(0, 40))):
        allowed = s.allowed_bytes()
        if not allowed:
            break
        printable = [b for b in allowed if 0x20 <= b < 0x7F] or list(allowed)
        s = s.advance(data.draw(st.sampled_from(printable if data.draw(st.booleans()) else list(allowed))))
    return s


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data(), which=st.integers(0, len(GRAMMARS) - 1))
def test_successors_group_bytes_exactly_as_single_steps(data, which):
    g = GRAMMARS[which]
    s = _walk(data, g)
    got = {}
    for group, nxt in s.successors():
        for b in range(256):
            if group >> b & 1:
                assert b not in got
                got[b] = nxt
    assert got == {b: g._step(s, b) for b in s.allowed_bytes()}


def _reference(tg, state) -> list[int]:
    return sorted(tg.trie.allowed_ids(state))


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data(), which=st.integers(0, len(GRAMMARS) - 1), tail=st.sampled_from([0, 4, 48, 10**9]))
def test_dense_and_sparse_walks_equal_the_reference_walk(toy, data, which, tail):
    tg = TokenGrammar(GRAMMARS[which], toy, eos_ids=[toy.token_to_id("<eos>")])
    state = _walk(data, tg.grammar)
    levels = masks.TrieLevels(tg.table, tg.trie.root)
    old = masks._PY_TAIL
    masks._PY_TAIL = tail
    try:
        dense = masks._dense_walk(levels, masks.StateTable(), state)
        sparse = masks._sparse_walk(levels, masks.StateTable(), state)
    finally:
        masks._PY_TAIL = old
    ref = _reference(tg, state)
    assert np.flatnonzero(dense).tolist() == ref
    assert np.flatnonzero(sparse).tolist() == ref
    for py_nodes in (0, 10**9):                  # the dispatcher, Python walk forced on and off
        masks._PY_NODES, old = py_nodes, masks._PY_NODES
        try:
            chosen = masks.legal_tokens(levels, masks.StateTable(), state)
        finally:
            masks._PY_NODES = old
        assert np.flatnonzero(chosen).tolist() == ref


def test_token_mask_matches_reference_and_adds_eos_only_when_complete(toy):
    eos = toy.token_to_id("<eos>")
    tg = TokenGrammar(load_grammar("ndjson-compact"), toy, eos_ids=[eos])
    for prefix in [b"", b'{"a":', b'{"a":"caf\xc3', b'{"a":1', b'{"a":1}\n', b"[tr"]:
        s = tg.grammar.initial().advance_bytes(prefix)
        mask = tg.token_mask(s).numpy()
        expect = np.zeros(len(tg.table), dtype=bool)
        expect[_reference(tg, s)] = True
        expect[eos] = s.is_complete
        assert (mask == expect).all(), prefix
        assert sorted(tg.allowed_ids(s)) == np.flatnonzero(expect).tolist()
        assert tg.token_mask(s, 7).numpy().tolist() == expect[:7].tolist()


def test_a_shared_state_table_gives_the_same_masks_in_any_order(toy):
    """Masks computed one after another share the lazily filled transition table: order must not matter."""
    g = GRAMMARS[2]
    states = [g.initial().advance_bytes(p) for p in (b'{"city":"', b'{"city":"Z\xc3\xbc', b'{"city":"a"', b"{")]
    a, b = TokenGrammar(g, toy), TokenGrammar(g, toy)
    first = [np.flatnonzero(a.legal_array(s)).tolist() for s in states]
    second = [np.flatnonzero(b.legal_array(s)).tolist() for s in reversed(states)][::-1]
    assert first == second == [_reference(a, s) for s in states]


@pytest.mark.slow
def test_smollm2_vocabulary_masks_equal_the_reference():
    """The real 49,152-token vocabulary: deep tokens, partial UTF-8 tokens, long whitespace runs."""
    from tokenizers import Tokenizer

    from lessonkit.models.registry import resolve_model_dir
    tok = Tokenizer.from_file(str(resolve_model_dir("smollm2-135m")[1] / "tokenizer.json"))
    for g in GRAMMARS:
        tg = TokenGrammar(g, tok)
        for prefix in (b"", b'{"', b'{"city":"Z\xc3', b'{"city":"ab', b'["', b"[1", b"{}", b'"1.2'):
            s = g.initial().advance_bytes(prefix)
            if s is not None:
                assert np.flatnonzero(tg.legal_array(s)).tolist() == _reference(tg, s), (g.source, prefix)
