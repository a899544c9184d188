"""Self-checks for the lesson 3 exercises (notebooks/exercises/03_grammar.ipynb).

Each check runs the student's function on fixed cases and seeded random ones, prints one plain
line (what is wrong on the first failing case, or how many cases passed) and returns True or
False. It never prints the expected answer. A stub that raises NotImplementedError gets
"not implemented yet"; no check raises.

    from lessonkit.exercises import grammar_checks as check
    check.forced_span(my_forced_span)
"""
from __future__ import annotations

import json
import random

from lessonkit.errors import LessonkitError
from lessonkit.grammar import Grammar, load_grammar

SEED = 2026

_SCHEMA = {"type": "object", "properties": {
    "level": {"enum": ["info", "warn", "error"]}, "status": {"enum": ["active", "activated", "inactive"]},
    "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["level", "n"], "additionalProperties": False}
_RECORDS = [{"level": "warn", "status": "activated", "n": 12, "ok": True},
            {"level": "info", "n": -3}, {"level": "error", "status": "inactive", "n": 0, "ok": False}]


def _schema_grammar() -> Grammar:
    from lessonkit.json_schema import schema_grammar
    return schema_grammar(_SCHEMA, whitespace="compact", ndjson=True, source="record schema")


def _call(name: str, fn, *args):
    """(result, None) or (None, message); the message is None-safe to print."""
    try:
        return fn(*args), None
    except NotImplementedError:
        return None, "not implemented yet"
    except Exception as e:  # the student's bug, reported, never raised
        return None, f"your function raised {type(e).__name__}: {e}"


def _report(name: str, problem: str | None, n: int) -> bool:
    if problem:
        print(f"{name}: {problem}")
        return False
    print(f"{name}: passed all {n} cases")
    return True


def _show(b: bytes) -> str:
    return repr(b) if len(b) <= 40 else repr(b[:40]) + "..."


# --------------------------------------------------------------------------- exercise 1

def _ref_forced(state) -> bytes:
    return state.forced_continuation(10_000)


def _forced_cases():
    tiny = Grammar('root ::= "{\\"id\\":" [0-9]+ "}" "\\n"?', "tiny")
    alts = Grammar('root ::= "status=" ( "active" | "activated" | "inactive" ) ";"', "alternatives")
    js = load_grammar("json-compact")
    rec = _schema_grammar()
    cases = [
        ("tiny grammar, at the start", tiny, b""),
        ("tiny grammar, inside the digits", tiny, b'{"id":42'),
        ("tiny grammar, after the closing brace (the parse could end here)", tiny, b'{"id":42}'),
        ("alternatives sharing a prefix", alts, b"status=a"),
        ("alternatives, after 'activ'", alts, b"status=activ"),
        ("alternatives, two ways on", alts, b"status="),
        ("compact JSON, after 'tr'", js, b"[tr"),
        ("compact JSON, nothing forced", js, b'{"a":1'),
    ]
    rng = random.Random(SEED)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in _RECORDS).encode()
    for i in range(12):
        cut = rng.randrange(len(text))
        cases.append((f"record schema, after {cut} bytes of valid records (random case {i + 1})", rec, text[:cut]))
    return cases


def forced_span(fn) -> bool:
    """Exercise 1: fn(state) -> bytes, the forced continuation of a GrammarState."""
    name = "forced_span"
    cases = _forced_cases()
    for label, grammar, prefix in cases:
        state = grammar.initial().advance_bytes(prefix)
        got, err = _call(name, fn, state)
        if err == "not implemented yet":
            return _report(name, err, 0)
        if err:
            return _report(name, f"on case '{label}': {err}", len(cases))
        want = _ref_forced(state)
        if isinstance(got, str):
            return _report(name, f"on case '{label}': returned str; expected bytes (use bytes([b]) / bytearray)",
                           len(cases))
        if not isinstance(got, (bytes, bytearray)):
            return _report(name, f"on case '{label}': returned {type(got).__name__}; expected bytes", len(cases))
        got = bytes(got)
        if got == want:
            continue
        if state.advance_bytes(got) is None:
            problem = f"returned {_show(got)}, which the grammar does not allow from here"
        elif want.startswith(got):
            problem = (f"returned {_show(got)} and stopped, but after it exactly one byte is legal "
                       "and the parse cannot end there, so the span goes on")
        else:
            problem = (f"returned {_show(got)}: it runs past a point where the parse could end "
                       "(is_complete) or where more than one byte is legal")
        return _report(name, f"on case '{label}': {problem}", len(cases))
    return _report(name, None, len(cases))


# --------------------------------------------------------------------------- exercise 2

def _complete_cases():
    js = load_grammar("json")
    nd = load_grammar("ndjson-compact")
    rec = _schema_grammar()
    good = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in _RECORDS).encode()
    cases = [
        ("JSON object with spaces", js, b'{ "a": [1, 2] }', True),
        ("JSON, cut inside an array (a valid prefix, not complete)", js, b'{"a": [1, 2', False),
        ("JSON, a byte the grammar forbids", js, b'{"a": 01}', False),
        ("JSON, trailing junk after a complete value", js, b'[1] x', False),
        ("JSON, empty input", js, b"", False),
        ("NDJSON compact, no records at all", nd, b"", True),
        ("NDJSON compact, record without its newline", nd, b'{"a":1}', False),
        ("record schema, three records", rec, good, True),
        ("record schema, missing required key", rec, b'{"level":"info"}\n', False),
        ("record schema, unknown enum value", rec, b'{"level":"debug","n":1}\n', False),
    ]
    rng = random.Random(SEED + 1)
    for i in range(10):
        cut = rng.randrange(1, len(good))
        data = good[:cut]
        cases.append((f"record schema, first {cut} bytes of valid records (random case {i + 1})", rec, data,
                      rec.matches(data)))
    return cases


def is_complete(fn) -> bool:
    """Exercise 2: fn(grammar, data: bytes) -> bool, True iff the whole of data is in the language."""
    name = "is_complete"
    cases = _complete_cases()
    for label, grammar, data, want in cases:
        got, err = _call(name, fn, grammar, data)
        if err == "not implemented yet":
            return _report(name, err, 0)
        if err:
            return _report(name, f"on case '{label}': {err}", len(cases))
        if not isinstance(got, bool):
            return _report(name, f"on case '{label}': returned {type(got).__name__}; expected True or False",
                           len(cases))
        if got != want:
            why = ("said True, but the input is not a complete sentence of the grammar" if got else
                   "said False, but the whole input is in the grammar's language")
            return _report(name, f"on case '{label}': {why}", len(cases))
    return _report(name, None, len(cases))


# --------------------------------------------------------------------------- exercise 3

def _enum_cases():
    rng = random.Random(SEED + 2)
    cases = [
        ("three colours", ["red", "green", "blue"]),
        ("values that are prefixes of each other", ["a", "ab", "abc"]),
        ("a value with a double quote and one with a backslash", ['say "hi"', "back\\slash"]),
        ("non-ASCII values", ["é", "naïve", "日本"]),
        ("one value", ["only"]),
    ]
    letters = "abcdefghij"
    for i in range(5):
        vals = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(2, 6))})
        cases.append((f"random words (random case {i + 1})", vals))
    return cases


def enum_grammar(fn) -> bool:
    """Exercise 3: fn(values: list[str]) -> str, grammar text whose language is exactly the JSON strings
    json.dumps(v, ensure_ascii=False) for v in values."""
    name = "enum_grammar"
    cases = _enum_cases()
    for label, values in cases:
        got, err = _call(name, fn, list(values))
        if err == "not implemented yet":
            return _report(name, err, 0)
        if err:
            return _report(name, f"on case '{label}': {err}", len(cases))
        if not isinstance(got, str):
            return _report(name, f"on case '{label}': returned {type(got).__name__}; expected grammar text (str)",
                           len(cases))
        try:
            g = Grammar(got, "your grammar")
        except LessonkitError as e:
            return _report(name, f"on case '{label}': your grammar does not compile: {e}", len(cases))
        for v in values:
            text = json.dumps(v, ensure_ascii=False).encode()
            if not g.matches(text):
                return _report(name, f"on case '{label}': rejects the member {text.decode()}", len(cases))
        probes = []
        for v in values:
            probes += [v.encode(), json.dumps(v + "x", ensure_ascii=False).encode(),
                       json.dumps(v[:-1], ensure_ascii=False).encode(), b'"' + v.encode(),
                       json.dumps(v, ensure_ascii=False).encode() + b" "]
        probes += [b'""', json.dumps("zz-not-a-member").encode()]
        members = {json.dumps(v, ensure_ascii=False).encode() for v in values}
        for p in probes:
            if p not in members and g.matches(p):
                return _report(name, f"on case '{label}': accepts {p.decode(errors='replace')!r}, "
                                     "which is not one of the values written as a JSON string", len(cases))
    return _report(name, None, len(cases))
