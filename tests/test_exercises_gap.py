"""Lesson 7 exercise checks: each rejects plausible wrong answers, passes the solutions, reports
a stub as not implemented, and never raises."""
import math

import numpy as np
import pytest

from lessonkit.exercises import gap_checks as check
from tests.exercise_util import run, solution_functions

NB = "07_gap"


# ---------------------------------------------------------------- plausible wrong answers

def rm_unsorted(dates, scores):          # forgets that the input is not in date order
    return np.maximum.accumulate(np.asarray(scores, float))


def rm_strictly_before(dates, scores):   # "on or before" read as "before", plus itself
    d, s = np.asarray(dates), np.asarray(scores, float)
    return [max([s[i]] + list(s[d < d[i]])) for i in range(len(s))]


def rm_sorted_output(dates, scores):     # right values, but returned in date order
    order = np.argsort(dates, kind="stable")
    return np.maximum.accumulate(np.asarray(scores, float)[order])


def rm_global_max(dates, scores):
    return [max(scores)] * len(scores)


def cu_every_open_model(ot, oy, ct, cy):  # a lag for every open model, not just records
    out = []
    for t, y in sorted(zip(ot, oy)):
        reached = [m for m, s in sorted(zip(ct, cy)) if s >= y]
        out.append(t - reached[0] if reached else math.nan)
    return out


def _records(ot, oy):
    best, out = -math.inf, []
    for t, y in sorted(zip(ot, oy), key=lambda p: (p[0], -p[1])):
        if y > best:
            best = y
            out.append((t, y))
    return out


def cu_strict(ot, oy, ct, cy):            # "at least as good" read as "better"
    out = []
    for t, y in _records(ot, oy):
        reached = [m for m, s in sorted(zip(ct, cy)) if s > y]
        out.append(t - reached[0] if reached else math.nan)
    return out


def cu_list_order(ot, oy, ct, cy):        # first closed model in list order, not date order
    out = []
    for t, y in _records(ot, oy):
        reached = [m for m, s in zip(ct, cy) if s >= y]
        out.append(t - reached[0] if reached else math.nan)
    return out


def cu_flipped(ot, oy, ct, cy):
    out = []
    for t, y in _records(ot, oy):
        reached = [m for m, s in sorted(zip(ct, cy)) if s >= y]
        out.append(reached[0] - t if reached else math.nan)
    return out


def cu_no_nan(ot, oy, ct, cy):            # crashes when the closed side never reached a score
    out = []
    for t, y in _records(ot, oy):
        out.append(t - [m for m, s in sorted(zip(ct, cy)) if s >= y][0])
    return out


def gr_slope(years, flop):
    return np.polyfit(years, np.log10(flop), 1)[0]


def gr_ln_slope(years, flop):
    return np.polyfit(years, np.log(flop), 1)[0]


def gr_exp_of_log10(years, flop):
    return math.exp(np.polyfit(years, np.log10(flop), 1)[0])


def gr_endpoints(years, flop):
    return (flop[-1] / flop[0]) ** (1 / (years[-1] - years[0]))


def gr_linear_space(years, flop):
    slope, icept = np.polyfit(years, flop, 1)
    return (icept + slope * max(years)) / (icept + slope * (max(years) - 1))


WRONG = [
    (check.running_max, rm_unsorted, "leaking in"),
    (check.running_max, rm_strictly_before, "same day"),
    (check.running_max, rm_sorted_output, "position"),
    (check.running_max, rm_global_max, "leaking in"),
    (check.catch_up_lags, cu_every_open_model, "open records"),
    (check.catch_up_lags, cu_strict, "equal counts"),
    (check.catch_up_lags, cu_list_order, "too short"),
    (check.catch_up_lags, cu_flipped, "sign is flipped"),
    (check.catch_up_lags, cu_no_nan, "IndexError"),
    (check.growth_per_year, gr_slope, "10 to that power"),
    (check.growth_per_year, gr_ln_slope, "ln(FLOP)"),
    (check.growth_per_year, gr_exp_of_log10, "power of e"),
    (check.growth_per_year, gr_endpoints, "two points"),
    (check.growth_per_year, gr_linear_space, "least-squares"),
]


@pytest.mark.parametrize("check_fn,wrong,phrase", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_each_check_rejects_a_plausible_wrong_answer(check_fn, wrong, phrase):
    ok, out = run(check_fn, wrong)
    assert ok is False
    assert phrase in out
    assert len(out.strip().splitlines()) == 1          # one plain line, the first failing case


@pytest.mark.parametrize("name", ["running_max", "catch_up_lags", "growth_per_year"])
def test_the_solutions_pass(name):
    fn = solution_functions(NB)[name]
    ok, out = run(getattr(check, name), fn)
    assert ok is True, out
    assert "passed all" in out


@pytest.mark.parametrize("name", ["running_max", "catch_up_lags", "growth_per_year"])
def test_a_stub_is_not_implemented_yet_and_nothing_raises(name):
    def stub(*args):
        raise NotImplementedError

    ok, out = run(getattr(check, name), stub)
    assert ok is False and out.strip() == f"{name}: not implemented yet"
    ok, out = run(getattr(check, name), lambda *a: "nonsense")
    assert ok is False and "returned" in out


def test_messages_do_not_give_the_answer():
    # the exact case "closed = open six months earlier": a wrong answer must not be told "6"
    ok, out = run(check.catch_up_lags, cu_flipped)
    assert not ok and "-6" in out and " 6 " not in out and "6.0" not in out
    ok, out = run(check.growth_per_year, gr_slope)
    assert not ok and "got 0.4771" in out and "3.0" not in out   # log10(3), never the 3x
