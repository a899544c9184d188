"""Lesson 5 exercise checks: each rejects plausible wrong answers, passes the solutions, reports a stub
as not implemented, never raises, and never prints the reference."""
import math
import re

import pytest

from lessonkit.exercises import semcache_checks as check
from tests.exercise_util import exercise_functions, run, solution_functions

NB = "05_semantic_cache"


# ---- plausible wrong answers ---------------------------------------------------------------------
def ub_wald(k, n, c):                       # normal approximation: 0 for zero losses
    from scipy.stats import norm
    p = k / n
    return min(1.0, p + norm.ppf(c) * math.sqrt(p * (1 - p) / n))


def ub_rule_of_three(k, n, c):
    return min(1.0, (k + 3) / n)


def ub_two_sided(k, n, c):                  # alpha/2 in the tail: the two-sided interval's end
    from scipy.stats import beta
    return 1.0 if k == n else float(beta.ppf(1 - (1 - c) / 2, k + 1, n - k))


def ub_off_by_one(k, n, c):
    from scipy.stats import beta
    return 1.0 if k == n else float(beta.ppf(c, max(k, 1e-9), n - k + 1))


def serve_observed_rate(k, n, limit, c):
    return n == 0 or k / n <= limit


def serve_bound_only(k, n, limit, c):       # also stops before any loss was seen
    from lessonkit.semcache.audit import clopper_pearson_upper
    return n > 0 and clopper_pearson_upper(k, n, c) <= limit


def serve_two_sided(k, n, limit, c):
    return k == 0 or ub_two_sided(k, n, c) <= limit


def ms_two_sided(query, cached, answer, sim, threshold):            # GPTCache: any answer
    nums = lambda t: sorted(re.findall(r"\d+(?:\.\d+)?", t))
    neg = lambda t: sorted(re.findall(r"\bnot\b|n't\b|\bno\b|\bnever\b", t))
    return sim >= threshold and nums(query) == nums(cached) and neg(query) == neg(cached)


def ms_no_guard(query, cached, answer, sim, threshold):
    return answer is False and sim >= threshold


def ms_numbers_only(query, cached, answer, sim, threshold):
    nums = lambda t: sorted(re.findall(r"\d+(?:\.\d+)?", t))
    return answer is False and sim >= threshold and nums(query) == nums(cached)


def ms_digit_sets(query, cached, answer, sim, threshold):           # sets of digit runs
    neg = lambda t: sorted(re.findall(r"\bnot\b|n't\b", t))
    return (answer is False and sim >= threshold and set(re.findall(r"\d+", query)) ==
            set(re.findall(r"\d+", cached)) and neg(query) == neg(cached))


def ms_strict_threshold(query, cached, answer, sim, threshold):
    nums = lambda t: sorted(re.findall(r"\d+(?:\.\d+)?", t))
    neg = lambda t: sorted(re.findall(r"\bnot\b|n't\b", t))
    return answer is False and sim > threshold and nums(query) == nums(cached) and neg(query) == neg(cached)


@pytest.mark.parametrize("wrong", [ub_wald, ub_rule_of_three, ub_two_sided, ub_off_by_one])
def test_upper_bound_check_rejects(wrong):
    ok, out = run(check.clopper_pearson_upper, wrong)
    assert not ok and "on case" in out


@pytest.mark.parametrize("wrong", [serve_observed_rate, serve_bound_only, serve_two_sided])
def test_serving_check_rejects(wrong):
    ok, out = run(check.allows_serving, wrong)
    assert not ok and "on case" in out


@pytest.mark.parametrize("wrong", [ms_two_sided, ms_no_guard, ms_numbers_only, ms_digit_sets,
                                   ms_strict_threshold])
def test_may_serve_check_rejects(wrong):
    ok, out = run(check.may_serve, wrong)
    assert not ok and "on case" in out


def test_wrong_answers_get_plain_messages():
    assert "zero" in run(check.clopper_pearson_upper, ub_wald)[1]
    assert "observed rate" in run(check.allows_serving, serve_observed_rate)[1]
    assert "cached 'yes'" in run(check.may_serve, ms_two_sided)[1]
    assert "negated" in run(check.may_serve, ms_numbers_only)[1]


def test_solutions_pass_and_stubs_report_not_implemented():
    sol = solution_functions(NB)
    stub = exercise_functions(NB)
    for name, fn_name in [("clopper_pearson_upper", "upper_bound"), ("allows_serving", "allows_serving"),
                          ("may_serve", "may_serve")]:
        ok, out = run(getattr(check, name), sol[fn_name])
        assert ok, out
        ok, out = run(getattr(check, name), stub[fn_name])
        assert not ok and "not implemented yet" in out


def test_checks_never_raise_on_garbage():
    for c in (check.clopper_pearson_upper, check.allows_serving, check.may_serve):
        ok, out = run(c, lambda *a: "nonsense")
        assert not ok
        ok, out = run(c, lambda *a: 1 / 0)
        assert not ok and "ZeroDivisionError" in out
