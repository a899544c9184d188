"""Grammar engine: text format, automaton answers, built-in JSON/NDJSON grammars, CLI."""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lessonkit.errors import LessonkitError
from lessonkit.cli import main
from lessonkit.grammar.automaton import BUILTIN_GRAMMARS, Grammar, load_grammar


def g(text):
    return Grammar(text, "t.gbnf")


# ---------------------------------------------------------------- text format

def test_literals_escapes_and_classes():
    gr = g(r'root ::= "a\n\"\\" [x-z] [^0-9a-z] "\x41" "é" [\xC3] [\xA9]')
    assert gr.matches(b'a\n"\\y-A\xc3\xa9\xc3\xa9')
    assert not gr.matches(b'a\n"\\y5A\xc3\xa9\xc3\xa9')      # negated class
    assert not gr.matches(b'a\n"\\w-A\xc3\xa9\xc3\xa9')      # outside the range


@pytest.mark.parametrize("rep,ok,bad", [
    ("*", ["", "a", "aaaa"], ["b"]),
    ("+", ["a", "aaa"], [""]),
    ("?", ["", "a"], ["aa"]),
    ("{3}", ["aaa"], ["aa", "aaaa"]),
    ("{2,}", ["aa", "aaaaaa"], ["a"]),
    ("{1,3}", ["a", "aa", "aaa"], ["", "aaaa"]),
    ("{0,2}", ["", "a", "aa"], ["aaa"]),
])
def test_repetition(rep, ok, bad):
    gr = g(f'root ::= "a"{rep}')
    for s in ok:
        assert gr.matches(s.encode()), (rep, s)
    for s in bad:
        assert not gr.matches(s.encode()), (rep, s)


def test_groups_alternation_multiline_rules_and_comments():
    gr = g('''# a comment
root ::= item ( "," item )*   # trailing comment
item ::= "x"
       | "y" ( "1" | "2" )+
''')
    assert gr.matches(b"x,y12,x") and not gr.matches(b"x,") and not gr.matches(b"y")


def test_dot_is_one_utf8_character():
    gr = g('root ::= "<" . ">"')
    assert gr.matches("<é>".encode()) and gr.matches("<😀>".encode()) and gr.matches(b"<a>")
    assert not gr.matches(b"<\xff>") and not gr.matches(b"<\xc3>") and not gr.matches("<ab>".encode())


@pytest.mark.parametrize("text,fragment", [
    ('item ::= "x"', "no 'root' rule"),
    ('root ::= item', "undefined rule 'item'"),
    ('root ::= "abc', "unterminated string"),
    ('root ::= [a-', "unterminated character class"),
    ('root ::= [z-a]', "empty range"),
    ('root ::= "a"{3,1}', "max < min"),
    ('root ::= "a" )', "expected"),
    ('root ::= [é]', "single bytes"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= ( "a"? )*', "left-recursive"),
])
def test_errors_name_the_place(text, fragment):
    with pytest.raises(LessonkitError) as e:
        g(text)
    assert fragment in str(e.value) and str(e.value).startswith("t.gbnf"), str(e.value)


def test_error_position_is_line_and_column():
    with pytest.raises(LessonkitError, match=r"t.gbnf:2:11: unknown escape"):
        g('root ::= a\na    ::= "\\q"')


# ---------------------------------------------------------------- automaton

def test_allowed_bytes_complete_and_several_parses_at_once():
    gr = g('root ::= "abc" | "abd" | "ab"')
    s = gr.initial()
    assert s.allowed_bytes() == b"a" and not s.is_complete
    s = s.advance_bytes(b"ab")
    assert s.allowed_bytes() == b"cd" and s.is_complete   # three parses alive, one complete
    assert s.advance(ord("e")) is None
    assert s.advance(ord("c")).is_complete and s.advance(ord("c")).allowed_bytes() == b""


def test_forced_continuation_stops_where_the_parse_could_end():
    gr = g('root ::= "{\\"key\\":" [0-9]+ "}" "\\n"?')
    s = gr.initial()
    assert s.forced_continuation() == b'{"key":'
    s = s.advance_bytes(b'{"key":7')
    assert s.forced_continuation() == b""                 # a digit or "}"
    s = s.advance(ord("}"))
    assert s.is_complete and s.forced_continuation() == b""   # could end here, so nothing is forced


def test_forced_continuation_through_shared_prefix_of_alternatives():
    gr = g('root ::= "status\\":\\"" ( "active" | "activated" | "inactive" ) "\\""')
    s = gr.initial().advance_bytes(b'status":"a')
    assert s.forced_continuation() == b"ctiv"
    assert s.advance_bytes(b"ctivat").forced_continuation() == b'ed"'
    assert gr.initial().forced(max_bytes=3)[0] == b"sta"


def test_states_are_immutable_values_for_backtracking():
    gr = load_grammar("json")
    m = gr.matcher()
    assert m.accept_bytes(b'{"a":')
    saved = m.clone()
    assert m.accept_bytes(b"[1,2]")
    assert not m.accept_bytes(b"]]")          # all or nothing
    assert m.accept(ord("}")) and m.is_complete
    assert not saved.is_complete and saved.allowed_bytes().startswith(b"\t\n\r \"")
    assert gr.initial().advance_bytes(b'{"a":') is saved.state   # interned


def test_long_nesting_and_long_input():
    gr = load_grammar("json-compact")
    deep = b"[" * 200 + b"]" * 200
    assert gr.matches(deep) and not gr.matches(deep[:-1])
    big = json.dumps([{"id": i, "name": "x" * 50, "tags": ["a", "b"], "v": i / 7} for i in range(300)],
                     separators=(",", ":")).encode()
    assert gr.matches(big)


# ---------------------------------------------------------------- built-in grammars vs json.loads

def _strict_loads(data: bytes):
    def bad_constant(c):
        raise ValueError(c)
    return json.loads(data.decode("utf-8"), parse_constant=bad_constant)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(json_values, st.booleans(), st.integers(0, 10_000), st.binary(max_size=2))
def test_json_grammar_agrees_with_json_loads(value, ascii_, pos, junk):
    gr, gc = load_grammar("json"), load_grammar("json-compact")
    text = json.dumps(value, ensure_ascii=ascii_).encode()
    comp = json.dumps(value, ensure_ascii=ascii_, separators=(",", ":")).encode()
    assert gr.matches(text) and gc.matches(comp) and gr.matches(b" \n" + comp + b"\t")
    assert gc.matches(text) == (text == comp)
    # a corrupted text is in the language exactly when Python's strict parser takes it
    i = pos % (len(text) + 1)
    for bad in (text[:i] + junk + text[i:], text[:i] + text[i + 1:]):
        try:
            _strict_loads(bad)
            ok = True
        except (ValueError, UnicodeDecodeError):
            ok = False
        assert gr.matches(bad) == ok, bad


def test_ndjson_variants():
    nd, ndc = load_grammar("ndjson"), load_grammar("ndjson-compact")
    good = b'{"a":1}\n[2,"x"]\n"s"\n'
    assert nd.matches(good) and ndc.matches(good)
    sloppy = b' {"a": 1}\r\n[2, "x"]\t\n"s"'
    assert nd.matches(sloppy) and not ndc.matches(sloppy)
    assert not nd.matches(b'{"a":\n1}\n')              # a record may not span lines
    s = ndc.initial().advance_bytes(b'{"a":1}')
    assert s.forced_continuation() == b"\n"            # the only way on from a finished record
    assert set(BUILTIN_GRAMMARS) == {"json", "json-compact", "ndjson", "ndjson-compact"}


def test_forced_fraction_of_compact_ndjson_records():
    """Compact NDJSON with fixed keys: keys and punctuation are forced once the grammar knows them."""
    from lessonkit.grammar.json_schema import schema_grammar
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "level": {"enum": ["info", "warn"]},
                                               "msg": {"type": "string"}}, "required": ["id", "level", "msg"],
              "additionalProperties": False}
    gr = schema_grammar(schema, whitespace="compact", ndjson=True)
    data = b"".join(json.dumps({"id": i, "level": "warn" if i % 3 else "info", "msg": f"m{i}"},
                               separators=(",", ":")).encode() + b"\n" for i in range(20))
    s, forced, i = gr.initial(), 0, 0
    while i < len(data):
        f = s.forced_continuation()
        if f:
            assert data.startswith(f, i)
            forced += len(f)
            i += len(f)
            s = s.advance_bytes(f)
        else:
            s = s.advance(data[i])
            i += 1
    assert s.is_complete
    assert forced / len(data) > 0.6, forced / len(data)
    assert math.isclose(forced / len(data), forced / len(data))


# ---------------------------------------------------------------- CLI

def test_cli_check_and_compile(tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                                  "required": ["a"], "additionalProperties": False}))
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{ "a": 1 }\n')
    bad.write_text('{"a": "x"}')
    assert main(["grammar", "check", "--schema", str(schema), str(good)]) == 0
    assert main(["grammar", "check", "--schema", str(schema), str(good), str(bad), "--json"]) == 1
    out = capsys.readouterr().out.strip().splitlines()[-1]
    report = json.loads(out)
    assert report["all_ok"] is False and [f["ok"] for f in report["files"]] == [True, False]
    assert report["files"][1]["error_offset"] == 6
    assert main(["grammar", "check", "--grammar", "json", str(bad)]) == 0
    assert main(["grammar", "compile", str(schema)]) == 0
    assert "root ::=" in capsys.readouterr().out
    unsupported = tmp_path / "u.json"
    unsupported.write_text('{"type": "number", "minimum": 0.5}')
    assert main(["grammar", "compile", str(unsupported)]) == 2
    err = capsys.readouterr().err
    assert "'minimum'" in err and "#/minimum" in err and err.count("\n") == 1
    assert main(["grammar", "check", "--grammar", "nope", str(good)]) == 2


# ---------------------------------------------------------------- drafting and constrained decoding
# A fake target "wants to write" a fixed text: its logits put the canonical next token first while the
# generated bytes follow the text, so greedy decoding reproduces the text token by token.

from types import SimpleNamespace

import torch

from lessonkit.grammar.drafter import ConstrainedDecoder, GrammarDrafter, generate_with_grammar, grammar_depth
from lessonkit.grammar.measure import span_tokenisation_report
from lessonkit.grammar.tokens import TokenGrammar, token_byte_table
from lessonkit.grammar.json_schema import schema_grammar
from tests.hf_tiny import toy_bpe_tokenizer

RECORDS = [{"ts": f"2024-05-0{i % 9 + 1}T12:00:0{i % 10}Z", "level": ["info", "warn", "error"][i % 3],
            "service": ["api", "db"][i % 2], "msg": f"request {i} done é", "latency_ms": 17 * i} for i in range(12)]
COMPACT = "".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n" for r in RECORDS)
SLOPPY = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS)
RECORD_SCHEMA = {"type": "object", "properties": {
    "ts": {"type": "string", "format": "date-time"}, "level": {"enum": ["info", "warn", "error"]},
    "service": {"type": "string"}, "msg": {"type": "string"}, "latency_ms": {"type": "integer"}},
    "required": ["ts", "level", "service", "msg", "latency_ms"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    return toy_bpe_tokenizer([COMPACT, SLOPPY, "prompt: write records\n", "naïve café 😀"] * 5, vocab_size=600)


class FakeCache:
    max_len = 1 << 20            # the KVCache interface: room for any test sequence

    def __init__(self):
        self.tokens = []

    @property
    def length(self):
        return len(self.tokens)

    def rollback(self, n):
        del self.tokens[n:]


class FakeTarget:
    def __init__(self, tok, text):
        self.name, self.tokenizer = "fake", tok
        self.eos = tok.token_to_id("<eos>")
        self.config = SimpleNamespace(eos_ids=[self.eos], max_seq_len=1 << 20)
        self.model = SimpleNamespace(last_forward={"unique_experts": 0})
        self.store = SimpleNamespace(counters=lambda: {"expert_hits": 0, "expert_misses": 0, "bytes_read": 0, "io_s": 0.0},
                                     clear=lambda: None)
        self.table = token_byte_table(tok)
        self.V = tok.get_vocab_size()
        self.want = text.encode()
        self.canon = tok.encode(text).ids
        self.prompt_len = None
        self.noise = torch.linspace(0, 1, self.V)[torch.randperm(self.V, generator=torch.Generator().manual_seed(0))]

    def new_cache(self):
        return FakeCache()

    def decode(self, ids):
        return self.tokenizer.decode(list(ids))

    def next_token(self, ctx):
        gen = ctx[self.prompt_len:]
        if gen == self.canon[:len(gen)]:
            return self.canon[len(gen)] if len(gen) < len(self.canon) else self.eos
        done = b"".join(self.table[t] or b"?" for t in gen)
        rest = self.want[len(done):]
        if not self.want.startswith(done) or not rest:
            return self.eos
        best = max((t for t in range(self.V) if self.table[t] and rest.startswith(self.table[t])),
                   key=lambda t: len(self.table[t]))
        return best

    def forward(self, tokens, cache, last_only=False):
        if cache.length == 0:
            self.prompt_len = len(tokens)
        rows = []
        for t in tokens:
            cache.tokens.append(t)
            row = self.noise.clone()
            row[self.next_token(cache.tokens)] = 5.0
            rows.append(row)
        return torch.stack(rows)


def _plain(target, prompt, n):
    from lessonkit.engine.generate import generate
    return generate(target, prompt, n)


def test_token_bytes_are_exact_even_for_partial_utf8(tok):
    table = token_byte_table(tok)
    for text in ["naïve café 😀", COMPACT[:200]]:
        ids = tok.encode(text).ids
        assert b"".join(table[i] for i in ids) == text.encode()
    assert table[tok.token_to_id("<eos>")] is None
    assert any(b and b[-1] >= 0xC0 for b in table) or any(b == b"\xc3" for b in table)   # partial UTF-8 tokens exist


def test_token_mask_is_exactly_the_legal_tokens(tok):
    tg = TokenGrammar(load_grammar("ndjson-compact"), tok, eos_ids=[tok.token_to_id("<eos>")])
    for prefix in [b"", b'{"a":', b'{"a":"x', b'{"a":1', b'{"a":1}\n', b'[tr']:
        s = tg.grammar.initial().advance_bytes(prefix)
        mask = tg.token_mask(s)
        for t, b in enumerate(tg.table):
            legal = b is not None and s.advance_bytes(b) is not None
            if t in tg.eos_ids:
                legal = s.is_complete
            assert bool(mask[t]) == legal, (prefix, t, b)


@pytest.mark.parametrize("text,grammar", [(COMPACT, "ndjson-compact"), (SLOPPY, "ndjson"), (SLOPPY, "ndjson-compact")])
def test_draft_mode_is_byte_identical_to_plain_greedy(tok, text, grammar):
    prompt = tok.encode("prompt: write records\n").ids
    target = FakeTarget(tok, text)
    plain = _plain(target, prompt, 1000)
    assert plain.token_ids[:len(target.canon)] == target.canon
    res = generate_with_grammar(target, prompt, 1000, grammar=grammar)
    assert res.token_ids == plain.token_ids
    st = res.stats
    if grammar == "ndjson-compact" and text is SLOPPY:
        assert st["resyncs"] >= text.count("\n") - 1                    # lost at each line's first space, back at its end
        once = generate_with_grammar(target, prompt, 1000, grammar=grammar, resync=None)
        assert once.token_ids == plain.token_ids
        assert once.stats["left_grammar"] and once.stats["forced_tokens"] <= 2   # without resync: lost for good
    elif grammar == "ndjson-compact":                                   # generic NDJSON forces little
        assert st["forced_tokens"] > 0 and st["complete"] and not st["left_grammar"]
    else:
        assert st["forced_tokens"] == 0 and not st["left_grammar"]      # sloppy grammar: nothing is forced


def test_schema_drafting_forces_more_than_plain_ndjson(tok):
    prompt = tok.encode("prompt: write records\n").ids
    target = FakeTarget(tok, COMPACT)
    plain = _plain(target, prompt, 1000)
    g = schema_grammar(RECORD_SCHEMA, whitespace="compact", ndjson=True)
    res = generate_with_grammar(target, prompt, 1000, grammar="ndjson-compact")
    drafter = GrammarDrafter(g, tok)
    from lessonkit.speculative.verify import speculative_generate
    res2 = speculative_generate(target, drafter, prompt, 1000, k=grammar_depth())
    assert res2.token_ids == plain.token_ids
    st = drafter.stats()
    assert st["accepted"] > 5 * res.stats["accepted"] and st["grammar_acceptance"] > 0.9
    assert res2.stats["tokens_per_forward"] > 1.5 > res.stats["tokens_per_forward"]


def test_drafter_switches_off_below_min_acceptance(tok):
    d = GrammarDrafter(load_grammar("json-compact"), tok, warmup=4, backoff_tokens=0)
    prompt = [5]
    d.reset(prompt)
    ctx = prompt + tok.encode("[tr").ids
    for i in range(4):
        draft = d.propose(ctx, 8)
        assert tok.decode(draft.tokens) == "ue"
        d.update(ctx, 0)                                   # the target rejects everything
    assert not d.enabled and d.disabled_after == 4
    assert d.propose(ctx, 8).tokens == []
    assert d.stats()["grammar_acceptance"] == 0.0


def test_backoff_drops_the_last_token_of_a_span(tok):
    g = load_grammar("ndjson-compact")
    ctx = tok.encode('{"ab').ids
    full = GrammarDrafter(g, tok, backoff_tokens=0)
    full.reset([])
    back = GrammarDrafter(g, tok, backoff_tokens=1)
    back.reset([])
    s = g.initial().advance_bytes(b'[tr')
    assert s.forced_continuation() == b"ue"
    a, b = full.propose(tok.encode("[tr").ids, 8).tokens, back.propose(tok.encode("[tr").ids, 8).tokens
    assert len(a) >= 1 and (b == a[:-1] or (len(a) == 1 and b == a))
    assert ctx  # the tokenizer is usable on partial records


def test_constrained_mode_always_parses_but_changes_what_the_model_says(tok):
    prompt = tok.encode("prompt: write records\n").ids
    target = FakeTarget(tok, SLOPPY)                   # the model wants spaces the compact schema forbids
    g = schema_grammar(RECORD_SCHEMA, whitespace="compact", ndjson=True)
    plain = _plain(target, prompt, 120)
    con = ConstrainedDecoder(g, tok).generate(target, prompt, 120)
    out = b"".join(token_byte_table(tok)[t] for t in con.token_ids)
    assert con.token_ids != plain.token_ids
    assert g.initial().advance_bytes(out) is not None        # every prefix is legal: it always parses
    assert con.stats["forced_tokens"] > 0 and con.stats["tokens_per_forward"] > 1.0
    # draft mode with the same grammar never changes the output
    drafted = generate_with_grammar(target, prompt, 120, schema=None, grammar="ndjson-compact")
    assert drafted.token_ids == plain.token_ids
    # a model that wants compact records gets the same bytes, and they validate
    target = FakeTarget(tok, COMPACT)
    con = ConstrainedDecoder(g, tok).generate(target, prompt, 1000)
    out = b"".join(token_byte_table(tok)[t] for t in con.token_ids)
    assert out == COMPACT.encode() and g.matches(out)
    assert all(jsonschema_valid(json.loads(line)) for line in out.splitlines())


def jsonschema_valid(v):
    import jsonschema
    return jsonschema.Draft202012Validator(RECORD_SCHEMA, format_checker=jsonschema.FormatChecker()).is_valid(v)


def test_span_tokenisation_report_counts_spans_and_backoff(tok):
    tg = TokenGrammar(schema_grammar(RECORD_SCHEMA, whitespace="compact", ndjson=True), tok)
    rep = span_tokenisation_report(tg, [COMPACT])
    assert rep["spans"] > 20
    by = rep["by_backoff"]
    assert by[0]["drafted"] >= by[1]["drafted"] and by[0]["drafted"] >= by[2]["drafted"]
    assert 0 <= rep["noncanonical_spans"] <= rep["spans"]


@pytest.mark.parametrize("confounded", [False, True])
def test_grammar_ab_reports_identity_and_gain(tok, confounded):
    from lessonkit.measure.grammar import grammar_ab
    prompt = tok.encode("prompt: write records\n").ids
    target = FakeTarget(tok, COMPACT)
    tg = TokenGrammar(schema_grammar(RECORD_SCHEMA, whitespace="compact", ndjson=True), tok, eos_ids=[target.eos])
    ab = grammar_ab(target, prompt, 1000, tg, repeats=1, confounded=confounded)
    assert ab["identical"] and ab["confounded"] is confounded
    assert ab["tokens_per_forward"] > 1.5 and ab["grammar_acceptance"] > 0.9
    assert ab["plain_tokens_per_forward"] <= 1.0 + 1e-9


def test_byte_sources_label_drafted_forced_and_free(tok):
    import matplotlib
    from lessonkit.grammar.measure import byte_sources
    from lessonkit.lessons.grammar import plot_byte_sources
    from lessonkit.speculative.verify import speculative_generate
    prompt = tok.encode("prompt: write records\n").ids
    target = FakeTarget(tok, COMPACT)
    tg = TokenGrammar(schema_grammar(RECORD_SCHEMA, whitespace="compact", ndjson=True), tok, eos_ids=[target.eos])
    d = GrammarDrafter(tg)
    res = speculative_generate(target, d, prompt, 1000, k=grammar_depth())
    gen = [t for t in res.token_ids if t != target.eos]
    assert len(d.provenance) >= len(gen)
    assert d.provenance.count("drafted") == d.stats()["accepted"]
    src = byte_sources(tg, gen, d.provenance)
    assert bytes(b for b, _ in src) == COMPACT.encode()
    labels = {lab for _, lab in src}
    assert labels == {"drafted", "forced", "free"} or labels == {"drafted", "free"}
    assert src[0][1] == "free"                       # "{" of the first record: the stream could also end here
    fig = plot_byte_sources(src[:200])
    assert isinstance(fig, matplotlib.figure.Figure) and "grammar drafts" in fig.axes[0].get_title()


def test_ndjson_drafter_resyncs_at_the_next_line(tok):
    """Once the output leaves a line-oriented grammar, drafting resumes at the next record (NDJSON)."""
    g = load_grammar("ndjson-compact")
    assert g.line_oriented and not load_grammar("json-compact").line_oriented
    prompt = [5]
    ctx = prompt + tok.encode('{"a":1}}\n[tr').ids           # an extra brace leaves the grammar
    d = GrammarDrafter(g, tok)
    d.reset(prompt)
    state = d.sync(ctx)
    assert state is not None and d.stats()["resyncs"] == 1
    assert tok.decode(d.propose(ctx, 8).tokens) == "ue"      # the next record is drafted again
    off = GrammarDrafter(g, tok, resync=None)
    off.reset(prompt)
    assert off.sync(ctx) is None and off.propose(ctx, 8).tokens == []
    with pytest.raises(LessonkitError, match="single byte"):
        GrammarDrafter(g, tok, resync="ab")
