"""Self-checks for the lesson 3 exercises (notebooks/exercises/03_grammar.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import grammar_checks as check
    check.forced_span(my_forced_span)
"""
from __future__ import annotations

import json
import math
import random

from lessonkit.errors import LessonkitError
from lessonkit.exercises import number, run_cases
from lessonkit.grammar.automaton import Grammar, GrammarState, load_grammar

SEED = 2026
_ON_RAISE = "{name}: on case '{label}': {error}"   # this lesson puts a colon after the case

_SCHEMA = {"type": "object", "properties": {
    "level": {"enum": ["info", "warn", "error"]}, "status": {"enum": ["active", "activated", "inactive"]},
    "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["level", "n"], "additionalProperties": False}
_RECORDS = [{"level": "warn", "status": "activated", "n": 12, "ok": True},
            {"level": "info", "n": -3}, {"level": "error", "status": "inactive", "n": 0, "ok": False}]


def _schema_grammar() -> Grammar:
    from lessonkit.grammar.json_schema import schema_grammar
    return schema_grammar(_SCHEMA, whitespace="compact", ndjson=True, source="record schema")


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
    return [(label, (grammar.initial().advance_bytes(prefix),)) for label, grammar, prefix in cases]


def _judge_forced(args, got):
    (state,) = args
    want = _ref_forced(state)
    if isinstance(got, str):
        return "returned str; expected bytes (use bytes([b]) / bytearray)"
    if not isinstance(got, (bytes, bytearray)):
        return f"returned {type(got).__name__}; expected bytes"
    got = bytes(got)
    if got == want:
        return None
    if state.advance_bytes(got) is None:
        return f"returned {_show(got)}, which the grammar does not allow from here"
    if want.startswith(got):
        return (f"returned {_show(got)} and stopped, but after it exactly one byte is legal "
                "and the parse cannot end there, so the span goes on")
    return (f"returned {_show(got)}: it runs past a point where the parse could end "
            "(is_complete) or where more than one byte is legal")


def forced_span(fn) -> bool:
    """Exercise 1: fn(state) -> bytes, the forced continuation of a GrammarState."""
    return run_cases("forced_span", fn, _forced_cases(), _judge_forced, shared=(GrammarState,), on_raise=_ON_RAISE)


# --------------------------------------------------------------------------- exercise 2

def _complete_cases():
    js = load_grammar("json")
    nd = load_grammar("ndjson-compact")
    rec = _schema_grammar()
    good = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in _RECORDS).encode()
    cases = [   # the reference is the grammar's own matcher (lessonkit.grammar.automaton.Grammar.matches)
        ("JSON object with spaces", js, b'{ "a": [1, 2] }'),
        ("JSON, cut inside an array (a valid prefix, not complete)", js, b'{"a": [1, 2'),
        ("JSON, a byte the grammar forbids", js, b'{"a": 01}'),
        ("JSON, trailing junk after a complete value", js, b'[1] x'),
        ("JSON, empty input", js, b""),
        ("NDJSON compact, no records at all", nd, b""),
        ("NDJSON compact, record without its newline", nd, b'{"a":1}'),
        ("record schema, three records", rec, good),
        ("record schema, missing required key", rec, b'{"level":"info"}\n'),
        ("record schema, unknown enum value", rec, b'{"level":"debug","n":1}\n'),
    ]
    rng = random.Random(SEED + 1)
    for i in range(10):
        cut = rng.randrange(1, len(good))
        cases.append((f"record schema, first {cut} bytes of valid records (random case {i + 1})", rec, good[:cut]))
    return [(label, (grammar, data)) for label, grammar, data in cases]


def _judge_complete(args, got):
    grammar, data = args
    if not isinstance(got, bool):
        return f"returned {type(got).__name__}; expected True or False"
    if got != grammar.matches(data):
        return ("said True, but the input is not a complete sentence of the grammar" if got else
                "said False, but the whole input is in the grammar's language")
    return None


def is_complete(fn) -> bool:
    """Exercise 2: fn(grammar, data: bytes) -> bool, True iff the whole of data is in the language."""
    return run_cases("is_complete", fn, _complete_cases(), _judge_complete, shared=(Grammar,), on_raise=_ON_RAISE)


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
    return [(label, (values,)) for label, values in cases]


def _judge_enum(args, got):
    (values,) = args
    if not isinstance(got, str):
        return f"returned {type(got).__name__}; expected grammar text (str)"
    try:
        g = Grammar(got, "your grammar")
    except LessonkitError as e:
        return f"your grammar does not compile: {e}"
    for v in values:
        text = json.dumps(v, ensure_ascii=False).encode()
        if not g.matches(text):
            return f"rejects the member {text.decode()}"
    probes = []
    for v in values:
        probes += [v.encode(), json.dumps(v + "x", ensure_ascii=False).encode(),
                   json.dumps(v[:-1], ensure_ascii=False).encode(), b'"' + v.encode(),
                   json.dumps(v, ensure_ascii=False).encode() + b" "]
    probes += [b'""', json.dumps("zz-not-a-member").encode()]
    members = {json.dumps(v, ensure_ascii=False).encode() for v in values}
    for p in probes:
        if p not in members and g.matches(p):
            return (f"accepts {p.decode(errors='replace')!r}, which is not one of the values written as a "
                    "JSON string")
    return None


def enum_grammar(fn) -> bool:
    """Exercise 3: fn(values: list[str]) -> str, grammar text whose language is exactly the JSON strings
    json.dumps(v, ensure_ascii=False) for v in values."""
    return run_cases("enum_grammar", fn, _enum_cases(), _judge_enum, on_raise=_ON_RAISE)


# --------------------------------------------------------------------------- exercise 4: the speed-up predicted

def _cost_ratio(r, cost) -> float:
    import numpy as np
    return float(np.interp(r, np.arange(1, len(cost) + 1), np.asarray(cost, dtype=float) / cost[0]))


def _ref_grammar_speedup(tokens_per_forward, rows_per_forward, cost) -> float:
    return tokens_per_forward / _cost_ratio(rows_per_forward, cost)


def _grammar_speedup_cases():
    cases = [("no draft ever accepted: one row, one token per forward", (1.0, 1.0, [0.01, 0.012, 0.013])),
             ("a whole number of rows per forward", (2.6, 3.0, [0.01, 0.011, 0.0125, 0.0145, 0.017])),
             ("rows between two points of the curve", (1.55, 1.7, [0.004, 0.005, 0.0055, 0.006])),
             ("the cost curve in milliseconds, steep", (2.1, 2.4, [5.0, 8.0, 11.0, 14.0])),
             ("rejected drafts: more rows than tokens", (1.3, 2.2, [0.02, 0.021, 0.023, 0.026]))]
    rng = random.Random(SEED + 4)
    for i in range(16):
        n = rng.randint(3, 9)
        cost = [rng.uniform(0.002, 0.05)]
        for _ in range(n - 1):
            cost.append(cost[-1] * rng.uniform(1.0, 1.3))
        rows = rng.uniform(1.0, n)
        cases.append((f"random #{i + 1}", (rng.uniform(1.0, rows), rows, cost)))
    return [(label, (tpf, rows, list(cost))) for label, (tpf, rows, cost) in cases]


def _judge_grammar_speedup(args, got):
    tpf, rows, cost = args
    if number(got) is None:
        return "return one number: the predicted speed-up over plain decoding"
    got, want = number(got), _ref_grammar_speedup(tpf, rows, cost)
    if math.isclose(got, want, rel_tol=1e-6):
        return None
    close = lambda x: math.isclose(got, x, rel_tol=1e-6) and not math.isclose(x, want, rel_tol=1e-6)  # noqa: E731
    if close(tpf):
        return f"got {got:.4g}: that counts tokens per forward only; a verify forward of r rows costs more than a plain step"
    if close(tpf * _cost_ratio(rows, cost)):
        return f"got {got:.4g}: the verify cost divides the tokens per forward, it does not multiply them"
    if close(tpf / (cost[-1] / cost[0])):
        return f"got {got:.4g}: that prices every forward at the longest verify; use this run's mean rows per forward"
    if close(tpf / _cost_ratio(math.ceil(rows), cost)) or close(tpf / _cost_ratio(math.floor(rows), cost)):
        return f"got {got:.4g}: the mean rows per forward is fractional; interpolate the curve between its points"
    if close(tpf / _cost_ratio(rows + 1, cost)) or close(tpf / _cost_ratio(rows - 1, cost)):
        return f"got {got:.4g}: off by one row on the cost curve (cost[i] is a forward of i + 1 rows)"
    if close(tpf / (_cost_ratio(rows, cost) * cost[0])):
        return f"got {got:.4g}: the curve is in seconds; T(r)/T(1) divides it by a plain step's cost[0]"
    if close(tpf / (sum(cost) / len(cost) / cost[0])):
        return f"got {got:.4g}: that averages the cost curve; read it at this run's rows per forward"
    return f"got {got:.4g}, which is not tokens per forward / (T(r)/T(1)) for this case"


def grammar_speedup(fn) -> bool:
    """Exercise 4: fn(tokens_per_forward, rows_per_forward, cost: seconds of a forward of 1, 2, ... rows) ->
    the speed-up lesson 1's cost model predicts for drafts that cost nothing: tokens per forward / (T(r)/T(1))."""
    return run_cases("grammar_speedup", fn, _grammar_speedup_cases(), _judge_grammar_speedup, on_raise=_ON_RAISE)


def on_this_run(fn, smoke: bool = False, seed: int = 0) -> bool:
    """Lesson 3's controlled A/B on tiny-moe (three held-out records as the prompt, plain and grammar-drafted
    interleaved), measured here; your prediction reads an untimed drafted run on three *other* records and the
    verify cost curve (`measure.apart.check_apart` refuses the timed prompt among them), and is printed next to
    the measured speed-up. True when your function gives the cost model's prediction on those numbers."""
    import torch

    from lessonkit.models.registry import load_model
    from lessonkit.exercises import NOT_IMPLEMENTED, call
    from lessonkit.grammar.records import monitoring_grammar
    from lessonkit.grammar.tokens import TokenGrammar
    from lessonkit.measure import grammar as measure
    from lessonkit.speculative.gate import measure_cost_curve
    torch.manual_seed(seed)
    engine = load_model("tiny-moe")
    tg = TokenGrammar(monitoring_grammar(), engine.tokenizer, eos_ids=engine.config.eos_ids)
    from lessonkit.measure.apart import check_apart
    records = measure.corpus_records(6)
    encode = lambda rs: engine.encode("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rs))  # noqa: E731
    prompt, n_new = encode(records[:3]), 24 if smoke else 96
    apart = measure.grammar_apart(engine, encode(records[3:]), n_new, tg)
    ab = measure.grammar_ab(engine, prompt, n_new, tg, repeats=1 if smoke else 3)
    cost = measure_cost_curve(engine, max(2, math.ceil(apart.rows_per_verify) + 1), repeats=2 if smoke else 5)
    check_apart(apart, [prompt])
    print(f"measured apart (other records): {apart.tokens_per_verify:.2f} tokens per forward, "
          f"{apart.rows_per_verify:.2f} rows per verify forward, T(r)/T(1) = "
          f"{', '.join(f'{t / cost[0]:.2f}' for t in cost)} for r = 1..{len(cost)}; timed: speed-up "
          f"{ab['speedup']:.2f}x (controlled, output identical: {ab['identical']})")
    args = (apart.tokens_per_verify, apart.rows_per_verify, list(cost))
    got, error = call(fn, args)
    problem = error and f"grammar_speedup: {error}" or _judge_grammar_speedup(args, got)
    if problem:
        print(problem if error else f"grammar_speedup: on this run's numbers: {problem}")
        return False
    got = float(got)
    print(f"grammar_speedup: your prediction {got:.2f}x, measured {ab['speedup']:.2f}x "
          f"({got / ab['speedup'] - 1:+.0%}; the prefill, which drafting does not shorten, is left out of the model)")
    return True
