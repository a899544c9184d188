"""Lesson 3 exercise checks: each rejects plausible wrong answers, passes the solutions, reports
a stub as not implemented, and never raises."""
import json
import math

import numpy as np
import pytest

from lessonkit.exercises import grammar_checks as check
from tests.exercise_util import ROOT, run, solution_functions

NB = "03_grammar"


# ---------------------------------------------------------------- plausible wrong answers

def fs_ignores_complete(state):          # keeps going where the parse could already end
    out = bytearray()
    while len(state.allowed_bytes()) == 1:
        b = state.allowed_bytes()[0]
        out.append(b)
        state = state.advance(b)
    return bytes(out)


def fs_one_byte(state):                  # only the next forced byte, not the whole span
    a = state.allowed_bytes()
    return a[:1] if len(a) == 1 and not state.is_complete else b""


def fs_as_text(state):                   # right bytes, wrong type
    out = bytearray()
    while not state.is_complete and len(state.allowed_bytes()) == 1:
        out.append(state.allowed_bytes()[0])
        state = state.advance(out[-1])
    return out.decode()


def fs_first_allowed(state):             # takes the smallest legal byte even when there is a choice
    out = bytearray()
    while not state.is_complete and state.allowed_bytes() and len(out) < 64:
        out.append(state.allowed_bytes()[0])
        state = state.advance(out[-1])
    return bytes(out)


def ic_prefix_only(grammar, data):       # a legal prefix is taken for a complete sentence
    return grammar.initial().advance_bytes(data) is not None


def ic_ignores_dead(grammar, data):      # stops at the first illegal byte and reports the state so far
    s = grammar.initial()
    for b in data:
        nxt = s.advance(b)
        if nxt is None:
            break
        s = nxt
    return s.is_complete


def eg_no_grammar_escape(values):        # forgets the grammar's own escaping
    return "root ::= " + " | ".join('"' + json.dumps(v, ensure_ascii=False) + '"' for v in values)


def eg_no_quotes(values):                # the bare values, not JSON strings
    return "root ::= " + " | ".join('"' + v + '"' for v in values)


def eg_ascii_escapes(values):            # json.dumps default ensure_ascii=True
    return "root ::= " + " | ".join(
        '"' + json.dumps(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)


def eg_open_ended(values):               # a prefix alternative that accepts too much
    alts = ['"' + json.dumps(v, ensure_ascii=False).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]
    return "root ::= ( " + " | ".join(alts) + ' ) " "?'


def gs_tokens_only(tokens_per_forward, rows_per_forward, cost):       # verify forwards priced as plain steps
    return tokens_per_forward


def gs_longest_verify(tokens_per_forward, rows_per_forward, cost):    # every forward at the deepest verify
    return tokens_per_forward / (cost[-1] / cost[0])


def gs_rounded_rows(tokens_per_forward, rows_per_forward, cost):      # reads the curve at ceil(r)
    return tokens_per_forward / (cost[min(math.ceil(rows_per_forward), len(cost)) - 1] / cost[0])


def gs_seconds(tokens_per_forward, rows_per_forward, cost):           # the curve in seconds, not plain steps
    return tokens_per_forward / float(np.interp(rows_per_forward, np.arange(1, len(cost) + 1), cost))


def gs_right(tokens_per_forward, rows_per_forward, cost):
    return tokens_per_forward / float(np.interp(rows_per_forward, np.arange(1, len(cost) + 1), np.asarray(cost) / cost[0]))


WRONG = [
    (check.forced_span, fs_ignores_complete), (check.forced_span, fs_one_byte),
    (check.forced_span, fs_as_text), (check.forced_span, fs_first_allowed),
    (check.is_complete, ic_prefix_only), (check.is_complete, ic_ignores_dead),
    (check.enum_grammar, eg_no_grammar_escape), (check.enum_grammar, eg_no_quotes),
    (check.enum_grammar, eg_ascii_escapes), (check.enum_grammar, eg_open_ended),
    (check.grammar_speedup, gs_tokens_only), (check.grammar_speedup, gs_longest_verify),
    (check.grammar_speedup, gs_rounded_rows), (check.grammar_speedup, gs_seconds),
]


@pytest.mark.parametrize("check_fn,fn", WRONG, ids=[f.__name__ for _, f in WRONG])
def test_wrong_implementations_are_rejected_with_a_reason(check_fn, fn):
    ok, out = run(check_fn, fn)
    assert ok is False
    assert "on case" in out and out.count("\n") == 1, out


def test_solutions_pass():
    ns = solution_functions(NB)
    for name in ("forced_span", "is_complete", "enum_grammar", "grammar_speedup"):
        ok, out = run(getattr(check, name), ns[name])
        assert ok is True and "passed all" in out, out


@pytest.mark.parametrize("name", ["forced_span", "is_complete", "enum_grammar", "grammar_speedup"])
def test_stubs_report_not_implemented_without_raising(name):
    def stub(*args):
        raise NotImplementedError

    ok, out = run(getattr(check, name), stub)
    assert ok is False and out.strip() == f"{name}: not implemented yet"


def test_checks_never_print_the_reference():
    """A wrong forced span is described by what the student returned, never by the expected bytes."""
    ok, out = run(check.forced_span, fs_one_byte)
    assert "b'{'" in out and '{"id":' not in out
    ok, out = run(check.enum_grammar, eg_no_quotes)
    assert "root ::=" not in out


def test_exercise_notebook_has_stubs_only():
    nb = json.loads((ROOT / "notebooks" / "exercises" / f"{NB}.ipynb").read_text())
    defs = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("def ")]
    assert len(defs) == 4 and all("raise NotImplementedError" in d for d in defs)


def test_on_this_run_judges_the_prediction_on_the_measured_numbers():
    """The check on this run's numbers (a small A/B on tiny-moe) passes the cost model and the solution, and fails
    a prediction that ignores the verify cost, naming the mistake."""
    ok, out = run(lambda fn: check.on_this_run(fn, smoke=True), gs_right)
    assert ok is True and "measured apart" in out and "your prediction" in out, out
    ok, out = run(lambda fn: check.on_this_run(fn, smoke=True), solution_functions(NB)["grammar_speedup"])
    assert ok is True, out
    ok, out = run(lambda fn: check.on_this_run(fn, smoke=True), gs_longest_verify)
    assert ok is False and "on this run's numbers" in out and "longest verify" in out, out
