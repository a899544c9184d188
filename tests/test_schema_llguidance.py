"""llguidance as a second, development-only oracle (skipped where it is not installed).

For each test schema both compilers (lessonkit's, llguidance's, compact whitespace) judge the same
candidate texts as the differential harness (seeds and their mutations, compact serialisations in
the schema's key order and in the others). Where they disagree, jsonschema decides: a text we accept
and llguidance rejects must be valid (else it is a hole in ours); a text llguidance accepts that
jsonschema rejects is a hole in llguidance's, counted and reported, not failed. docs/grammar.md lists
what the disagreements were when this was written.
"""
import json
import random
from collections import Counter

import pytest

from tests.test_schema_differential import SCHEMAS, Checker, candidates, load, sample, serialisations

llguidance = pytest.importorskip("llguidance")


class _ByteTokenizer:
    """One token per byte (and an EOS): llguidance then judges raw bytes, as our grammars do."""

    def __init__(self):
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.eos_token_id, self.bos_token_id, self.special_token_ids = 256, None, [256]

    def __call__(self, data):
        return list(data)


@pytest.fixture(scope="module")
def byte_tokenizer():
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


def llg_grammar(schema, tok):
    """llguidance's grammar for `schema` (compact whitespace), or None where it refuses the schema."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    g = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False, "json_allow_general_unicode_escapes": True})
    err = llguidance.LLMatcher.validate_grammar(g, tok)
    return None if err and not err.startswith("WARNING") else g


def llg_accepts(grammar, tok, data: bytes) -> bool:
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    return m.consume_tokens(list(data)) and m.is_accepting() and not m.is_error()


def disagreements(name, tok) -> Counter:
    schema = load(name)
    grammar = llg_grammar(schema, tok)
    if grammar is None:
        return Counter({"llguidance refuses the schema": 1})
    chk, rnd = Checker(schema, name), random.Random(name)
    seen, out, holes = set(), Counter(), []
    for seed in [sample(schema, schema, rnd) for _ in range(3)]:
        for v in candidates(seed, schema, rnd, limit=60):
            valid = chk.validator.is_valid(v)
            for text, compact in serialisations(v, schema):
                data = text.encode()
                if not compact or data in seen:
                    continue
                seen.add(data)
                ours, theirs = chk.compact.matches(data), llg_accepts(grammar, tok, data)
                if ours and not theirs and not valid:
                    holes.append(text)
                if ours != theirs:
                    out[("lessonkit" if ours else "llguidance") + " alone accepts a " +
                        ("valid" if valid else "invalid") + " text"] += 1
    assert not holes, f"{name}: texts we accept that jsonschema and llguidance reject: {holes[:5]}"
    return out


@pytest.mark.parametrize("name", SCHEMAS)
def test_where_lessonkit_and_llguidance_disagree_jsonschema_sides_with_lessonkit(name, byte_tokenizer):
    found = disagreements(name, byte_tokenizer)
    print(name, json.dumps(dict(found)))
    assert all("lessonkit alone accepts a valid" in k or "llguidance" in k for k in found)
