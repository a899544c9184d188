"""Grammar engine: text format, automaton answers, built-in JSON/NDJSON grammars, CLI."""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lessonkit.errors import LessonkitError
from lessonkit.grammar import BUILTIN_GRAMMARS, Grammar, load_grammar, main


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
    from lessonkit.json_schema import schema_grammar
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
    unsupported.write_text('{"type": "integer", "minimum": 3}')
    assert main(["grammar", "compile", str(unsupported)]) == 2
    err = capsys.readouterr().err
    assert "'minimum'" in err and "#/minimum" in err and err.count("\n") == 1
    assert main(["grammar", "check", "--grammar", "nope", str(good)]) == 2
