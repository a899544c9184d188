"""Self-checks for the lesson 7 exercises (notebooks/exercises/07_gap.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import gap_checks as check
    check.running_max(my_running_max)
"""
from __future__ import annotations

import math

import numpy as np

from lessonkit.exercises import run_cases

SEED = 2026
_REL = 1e-6


def _as_floats(got, what: str):
    """(array, None) or (None, problem)."""
    if isinstance(got, (str, bytes)) or got is None:
        return None, f"returned {type(got).__name__}; expected a sequence of {what}"
    try:
        arr = np.asarray(got, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        return None, f"returned something that is not a sequence of {what} ({type(got).__name__})"
    if np.ndim(got) == 0:
        return None, f"returned a single number; expected a sequence of {what}"
    return arr, None


def _close(a: float, b: float, rel: float = _REL) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


# --------------------------------------------------------------------------- exercise 1

def _ref_running_max(dates, scores):
    d = np.asarray(dates)
    s = np.asarray(scores, dtype=float)
    return np.array([s[d <= d[i]].max() for i in range(len(s))])


def _days(strings):
    return np.array(strings, dtype="datetime64[D]")


def _running_max_cases():
    cases = [
        ("three models in date order", (_days(["2023-01-01", "2023-06-01", "2024-01-01"]),
                                        np.array([60.0, 55.0, 70.0]))),
        ("one model", (_days(["2024-05-05"]), np.array([42.0]))),
        ("input not sorted by date", (_days(["2024-03-01", "2023-01-01", "2023-09-01", "2022-05-01"]),
                                      np.array([80.0, 70.0, 65.0, 50.0]))),
        ("two models released the same day", (_days(["2023-01-01", "2023-05-01", "2023-05-01",
                                                     "2023-09-01"]),
                                              np.array([50.0, 52.0, 61.0, 58.0]))),
    ]
    rng = np.random.default_rng(SEED)
    for k in range(20):
        n = int(rng.integers(2, 25))
        days = np.datetime64("2022-01-01") + rng.integers(0, 900, n).astype("timedelta64[D]")
        if k % 3 == 0:   # force shared dates
            days[rng.integers(0, n, n // 2)] = days[0]
        cases.append((f"random {k + 1} ({n} models)", (days, np.round(rng.uniform(20, 90, n), 1))))
    return cases


def _judge_running_max(args, got):
    dates, scores = args
    arr, problem = _as_floats(got, "numbers (one frontier value per model)")
    if problem:
        return problem
    if len(arr) != len(scores):
        return f"returned {len(arr)} values for {len(scores)} models (one per model, in input order)"
    ref = _ref_running_max(dates, scores)
    for i in range(len(scores)):
        if _close(arr[i], ref[i]):
            continue
        where = f"position {i} (released {dates[i]}, score {scores[i]:g}) got {arr[i]:g}"
        if arr[i] < scores[i] - 1e-9:
            return (f"{where}, below that model's own score: the frontier at a date counts every "
                    "model released on or before it, the model itself included")
        if arr[i] > ref[i]:
            return (f"{where}, higher than any score released on or before that date: a model "
                    "released later is leaking in (is the input sorted by date?)")
        same_day_better = (dates == dates[i]) & (scores > arr[i])
        if same_day_better.any():
            return (f"{where}: a model released the same day scored higher, and 'on or before' "
                    "includes the same day")
        return (f"{where}: a model released earlier scored higher; the frontier never goes down")
    return None


def running_max(fn) -> bool:
    """Exercise 1: fn(dates, scores) -> the frontier value (best score released on or before the
    model's date) for each model, in input order."""
    return run_cases("running_max", fn, _running_max_cases(), _judge_running_max)


# --------------------------------------------------------------------------- exercise 2

def _ref_catch_up(open_months, open_scores, closed_months, closed_scores):
    ot, oy = np.asarray(open_months, float), np.asarray(open_scores, float)
    ct, cy = np.asarray(closed_months, float), np.asarray(closed_scores, float)
    order = np.lexsort((-oy, ot))
    corder = np.argsort(ct, kind="stable")
    best, out = -math.inf, []
    for i in order:
        if oy[i] > best:
            best = oy[i]
            reached = [ct[j] for j in corder if cy[j] >= oy[i]]
            out.append(ot[i] - reached[0] if reached else math.nan)
    return np.array(out)


def _catch_up_cases():
    cases = [
        ("closed models are the open ones, released earlier",
         (np.array([6.0, 12.0, 18.0, 24.0]), np.array([50.0, 55.0, 62.0, 70.0]),
          np.array([0.0, 6.0, 12.0, 18.0]), np.array([50.0, 55.0, 62.0, 70.0]))),
        ("some open models do not beat an earlier one",
         (np.array([3.0, 5.0, 9.0, 14.0, 20.0]), np.array([40.0, 38.0, 47.0, 45.0, 52.0]),
          np.array([0.0, 2.0, 7.0, 11.0]), np.array([41.0, 48.0, 50.0, 60.0]))),
        ("closed models not in date order",
         (np.array([10.0, 20.0]), np.array([55.0, 65.0]),
          np.array([15.0, 1.0, 8.0, 4.0]), np.array([70.0, 50.0, 66.0, 56.0]))),
        ("a tie: a closed model scored exactly the open record",
         (np.array([12.0, 30.0]), np.array([60.0, 71.0]),
          np.array([0.0, 5.0, 20.0]), np.array([55.0, 60.0, 75.0]))),
        ("the open frontier pulls ahead",
         (np.array([10.0, 22.0]), np.array([58.0, 90.0]),
          np.array([0.0, 4.0]), np.array([50.0, 60.0]))),
    ]
    rng = np.random.default_rng(SEED + 1)
    for k in range(15):
        n = int(rng.integers(4, 30))
        shift = float(rng.uniform(2, 15))
        t = np.round(rng.uniform(0, 60, n), 2)
        y = np.round(40 + 0.7 * t + rng.normal(0, 4, n), 1)
        ct = np.concatenate([t - shift, [-30.0]])
        cy = np.concatenate([y + rng.normal(0, 1, n).round(1), [0.0]])
        perm = rng.permutation(len(ct))
        cases.append((f"random {k + 1} ({n} open models)",
                      (t, y, ct[perm], cy[perm])))
    return cases


def _judge_catch_up(args, got):
    ot, oy = args[0], args[1]
    arr, problem = _as_floats(got, "lags in months (one per open record)")
    if problem:
        return problem
    ref = _ref_catch_up(*args)
    if len(arr) != len(ref):
        return (f"returned {len(arr)} lags, but the number of open records differs: return one "
                "lag per open model that beats every earlier open model, in date order")
    order = np.lexsort((-np.asarray(oy), np.asarray(ot)))
    records = []
    best = -math.inf
    for i in order:
        if oy[i] > best:
            best = oy[i]
            records.append(i)
    for k, (g, r) in enumerate(zip(arr, ref)):
        if _close(g, r):
            continue
        i = records[k]
        where = f"record {k} (open model at month {ot[i]:g}, score {oy[i]:g}) got {g:g}"
        if math.isnan(r):
            return f"{where}: no closed model ever reached this score, so its lag is NaN"
        if math.isnan(g):
            return f"{where}: a closed model did reach this score, so the lag is a number"
        if _close(g, -r):
            return (f"{where}: the sign is flipped; a lag is the open date minus the closed date, "
                    "positive when the open model came later")
        if g < r:
            return (f"{where}: too short; you matched a closed model that came later than the "
                    "first one at least as good (equal counts as reaching it; take the earliest "
                    "by date, not by list position)")
        return (f"{where}: too long; no closed model scoring at least that high was released "
                "that early (did you use a closed model with a lower score?)")
    return None


def catch_up_lags(fn) -> bool:
    """Exercise 2: fn(open_months, open_scores, closed_months, closed_scores) -> for each open
    record in date order, its month minus the month of the first closed model scoring at least
    as high (NaN if none did)."""
    return run_cases("catch_up_lags", fn, _catch_up_cases(), _judge_catch_up)


# --------------------------------------------------------------------------- exercise 3

def _ref_growth(years, flop):
    slope = np.polyfit(np.asarray(years, float), np.log10(np.asarray(flop, float)), 1)[0]
    return float(10 ** slope)


def _growth_cases():
    yrs = np.array([2019.0, 2020.0, 2021.0, 2022.0, 2023.0])
    cases = [
        ("exact exponential, five yearly points", (yrs, 1e22 * 3.0 ** (yrs - 2019))),
        ("exact exponential, years not in order",
         (yrs[[3, 0, 4, 1, 2]], 1e20 * 10.0 ** (yrs[[3, 0, 4, 1, 2]] - 2019))),
        ("exact exponential, shrinking", (yrs, 1e24 * 0.5 ** (yrs - 2019))),
    ]
    rng = np.random.default_rng(SEED + 2)
    for k in range(8):
        n = int(rng.integers(8, 60))
        years = np.round(rng.uniform(2017, 2025.5, n), 3)
        rate = float(rng.uniform(1.5, 8))
        flop = 1e21 * rate ** (years - 2017) * 10 ** rng.normal(0, 0.3, n)
        cases.append((f"noisy {k + 1} ({n} models)", (years, flop)))
    return cases


def _judge_growth(args, got):
    years, flop = np.asarray(args[0], float), np.asarray(args[1], float)
    try:
        g = float(got)
    except (TypeError, ValueError):
        return f"returned {type(got).__name__}; expected one number (the growth factor per year)"
    ref = _ref_growth(years, flop)
    if _close(g, ref, 1e-4):
        return None
    slope10 = math.log10(ref)
    if _close(g, slope10, 1e-3):
        return (f"got {g:.4g}: that is the slope of log10(FLOP) per year (orders of magnitude a "
                "year); the growth factor is 10 to that power")
    if _close(g, slope10 * math.log(10), 1e-3):
        return f"got {g:.4g}: that is the slope of ln(FLOP) per year, not a growth factor"
    if _close(g, math.exp(slope10), 1e-3):
        return f"got {g:.4g}: the slope was fitted on log10 but raised as a power of e"
    i, j = int(np.argmin(years)), int(np.argmax(years))
    ends = (flop[j] / flop[i]) ** (1 / (years[j] - years[i]))
    first_last = (flop[-1] / flop[0]) ** (1 / (years[-1] - years[0])) if years[-1] != years[0] else None
    if _close(g, ends, 1e-3) or (first_last is not None and _close(g, first_last, 1e-3)):
        return (f"got {g:.4g}: that is the growth between two points only; fit a line to "
                "log10(FLOP) against year through all the points (least squares)")
    return (f"got {g:.4g}, which is not the least-squares growth of log10(FLOP) against year "
            "(fit in log space, not on FLOP itself)")


def growth_per_year(fn) -> bool:
    """Exercise 3: fn(years, flop) -> growth factor per year from a least-squares line through
    log10(flop) against years."""
    return run_cases("growth_per_year", fn, _growth_cases(), _judge_growth)
