"""Lesson 1's assembling exercise (issue 59, item 7): the check fails on the stub and on plausible broken decoders,
and passes with the solution, whose tokens are plain greedy's (compared with ==)."""
import pytest

from lessonkit.exercises import assemble_checks as assemble
from tests.exercise_util import ROOT, exercise_functions, run, solution_functions

NB = "01_speculative"


def _check(fn, predict=None):
    return run(lambda f: assemble.speculative_decoder(f, predict, smoke=True), fn)


def _variant(*changes):
    """The solution with some lines changed, (old, new) each: a plausible mistake."""
    sol = solution_functions(NB)
    nb_src = _solution_source()
    for old, new in changes:
        assert old in nb_src, old
        nb_src = nb_src.replace(old, new)
    ns = {"accept_greedy": sol["accept_greedy"]}
    exec(compile(nb_src, "variant", "exec"), ns)
    return ns["speculative_decode"]


def _solution_source() -> str:
    import json
    nb = json.loads((ROOT / "notebooks" / "solutions" / f"{NB}.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if "".join(c["source"]).startswith("def speculative_decode"))


def test_the_stub_is_reported_not_implemented():
    ok, out = _check(exercise_functions(NB)["speculative_decode"])
    assert not ok and out.strip() == "speculative_decoder: not implemented yet"


def test_the_solution_matches_plain_greedy_and_is_timed_against_the_prediction():
    sol = solution_functions(NB)
    ok, out = _check(sol["speculative_decode"], sol["predict_speedup"])
    assert ok, out
    assert "token for token plain greedy's" in out and "your prediction from a_i and c measured apart" in out


@pytest.mark.parametrize("changes", [
    [("cache.rollback(len(context) + len(accepted))", "pass")],                      # keeps the rejected rows
    [("out += list(accepted) + [bonus]", "out += list(accepted) + ([bonus] if not accepted else [])")],  # no bonus
    [("room = min(k, max_new_tokens - len(out) - 1)", "room = k"),                  # overshoots the length
     ("return out[:max_new_tokens]", "return out")],
], ids=["no rollback", "no bonus token", "too many tokens"])
def test_a_broken_decoder_fails(changes):
    ok, out = _check(_variant(*changes))
    assert not ok and out.startswith("speculative_decoder: "), out


def test_the_exercise_calls_the_check_with_the_students_own_prediction():
    import json
    for sub in ("exercises", "solutions"):
        cells = ["".join(c["source"]) for c in json.loads((ROOT / "notebooks" / sub / f"{NB}.ipynb").read_text())["cells"]]
        assert any("assemble.speculative_decoder(speculative_decode, predict_speedup" in c for c in cells), sub
