"""Lesson 6 exercise checks: each rejects plausible wrong answers, passes the solution, reports a stub as
not implemented, and never raises."""
import math

import pytest

from lessonkit.exercises import stack_checks as check
from tests.exercise_util import exercise_functions, run, solution_functions

NB = "06_stack"


def pc_multiply(plain, saved, q, overhead):          # multiplies the single rows' speed-ups
    return plain / (q * plain + overhead) * math.prod(plain / (plain - x) for x in saved)


def pc_all_calls(plain, saved, q, overhead):         # forgets that the cache skips engine calls
    return plain / (plain - sum(saved) + overhead)


def pc_no_overhead(plain, saved, q, overhead):       # forgets the cache's own time
    return plain / (q * (plain - sum(saved)))


def pc_returns_seconds(plain, saved, q, overhead):   # the composed time, not the speed-up
    return q * (plain - sum(saved)) + overhead


@pytest.mark.parametrize("wrong, says", [(pc_multiply, "multiplies"), (pc_all_calls, "fraction of the engine calls"),
                                         (pc_no_overhead, "own time"), (pc_returns_seconds, "not the speed-up")])
def test_wrong_answers_fail_with_a_reason(wrong, says):
    ok, out = run(check.compose_combined, wrong)
    assert not ok and says in out and out.count("\n") == 1


def test_the_solution_passes():
    ok, out = run(check.compose_combined, solution_functions(NB)["compose_combined"])
    assert ok and "passed" in out


def test_the_stub_is_not_implemented():
    ok, out = run(check.compose_combined, exercise_functions(NB)["compose_combined"])
    assert not ok and "not implemented yet" in out


def test_a_raising_function_is_reported_not_raised():
    def boom(*a):
        raise ZeroDivisionError("oops")
    ok, out = run(check.compose_combined, boom)
    assert not ok and "ZeroDivisionError" in out
