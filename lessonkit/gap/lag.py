"""Frontiers (the running maximum of a score over release dates, per group) and the lag between them.

Horizontal lag at date t: how many months before t the closed frontier first reached the score the
open frontier has at t. Method "linear" (default) draws each frontier as straight lines between its
records; "step" is the literal running maximum; "records" counts catch-up time between records.
Vertical gap at t: closed running max minus open running max, in score points. A window's lag is the
mean over its monthly dates, with a 90% CI from a seeded bootstrap that resamples models per group.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lessonkit.errors import LessonkitError
from lessonkit.gap.data import grouped, to_months

CI_LEVEL = 0.90           # Epoch quotes 90% intervals

METHODS = ("linear", "step", "records")



def frontier_records(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records of the running maximum: (times, values, indices) of the points that beat
    every earlier point; on one date only the best counts."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    order = np.lexsort((-y, t))
    best = -np.inf
    keep = []
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    keep = np.asarray(keep, dtype=int)
    return t[keep], y[keep], keep


def frontier(table: pd.DataFrame) -> pd.DataFrame:
    """The frontier records of one group's table: date, value and the model that set it."""
    if len(table) == 0:
        return pd.DataFrame(columns=["date", "value", "model"])
    _, _, idx = frontier_records(to_months(table["date"]), table["value"].to_numpy())
    return table.iloc[idx][["date", "value", "model"]].reset_index(drop=True)


def level_at(rt: np.ndarray, ry: np.ndarray, t: np.ndarray, method: str = "linear") -> np.ndarray:
    """The frontier's value at times t: step (running max) or straight lines between records;
    flat after the last record, NaN before the first."""
    t = np.asarray(t, dtype=float)
    out = np.full(t.shape, np.nan)
    if len(rt) == 0:
        return out
    k = np.searchsorted(rt, t, side="right") - 1
    ok = k >= 0
    out[ok] = ry[k[ok]]
    if method == "linear" and len(rt) > 1:
        inside = ok & (k < len(rt) - 1)
        kk = k[inside]
        w = (t[inside] - rt[kk]) / (rt[kk + 1] - rt[kk])
        out[inside] = ry[kk] + w * (ry[kk + 1] - ry[kk])
    elif method not in ("linear", "step"):
        raise LessonkitError(f"unknown method {method!r}; use 'linear' or 'step'")
    return out


def time_reached(rt: np.ndarray, ry: np.ndarray, level: np.ndarray,
                 method: str = "linear") -> np.ndarray:
    """When the frontier first reached each level. NaN if it never did, and NaN if it was
    already there at its first record (the time before the data starts is unknown)."""
    level = np.asarray(level, dtype=float)
    out = np.full(level.shape, np.nan)
    if len(rt) == 0:
        return out
    j = np.searchsorted(ry, level, side="left")     # first record with value >= level
    ok = (j > 0) & (j < len(ry)) & np.isfinite(level)
    jj = j[ok]
    if method == "step":
        out[ok] = rt[jj]
    else:
        w = (level[ok] - ry[jj - 1]) / (ry[jj] - ry[jj - 1])
        out[ok] = rt[jj - 1] + w * (rt[jj] - rt[jj - 1])
    return out


def lag_months(open_t, open_y, closed_t, closed_y, at, method: str = "linear") -> np.ndarray:
    """Horizontal lag in months at each time in `at` (months): at - when the closed frontier
    first reached the open frontier's level at that time. Inputs are model points (months,
    score); frontiers are taken here. Negative: the open frontier was ahead.

    method "linear": frontiers as straight lines between records; "step": the literal running
    max; "records": one lag per open record inside [min(at), max(at)] (the catch-up time: the
    open record's date minus the first closed model at least as good)."""
    if method not in METHODS:
        raise LessonkitError(f"unknown method {method!r}; choose from {METHODS}")
    ot, oy, _ = frontier_records(open_t, open_y)
    ct, cy, _ = frontier_records(closed_t, closed_y)
    at = np.asarray(at, dtype=float)
    if method == "records":
        inside = (ot >= at.min()) & (ot <= at.max())
        return ot[inside] - time_reached(ct, cy, oy[inside], "step")
    return at - time_reached(ct, cy, level_at(ot, oy, at, method), method)


def monthly_grid(start, end) -> pd.DatetimeIndex:
    return pd.date_range(pd.Timestamp(start).to_period("M").to_timestamp(),
                         pd.Timestamp(end), freq="MS")


def lag_series(table: pd.DataFrame, dates=None, grouping: str = "open_weights",
               method: str = "linear", family: str | None = None) -> pd.DataFrame:
    """Per date: open and closed frontier (running max), vertical gap and horizontal lag."""
    g = grouped(table, grouping, family)
    if dates is None:
        dates = monthly_grid(g["date"].min(), g["date"].max())
    at = to_months(dates)
    o, c = g[g["group"] == "open"], g[g["group"] == "closed"]
    ot, oy, _ = frontier_records(to_months(o["date"]), o["value"].to_numpy())
    ct, cy, _ = frontier_records(to_months(c["date"]), c["value"].to_numpy())
    open_level = level_at(ot, oy, at, "step")
    closed_level = level_at(ct, cy, at, "step")
    lag = at - time_reached(ct, cy, level_at(ot, oy, at, method), method)
    return pd.DataFrame({"date": pd.DatetimeIndex(dates), "open": open_level,
                         "closed": closed_level, "vertical_gap": closed_level - open_level,
                         "lag_months": lag})


@dataclass
class LagEstimate:
    measure: str
    start: str
    end: str
    lag_months: float        # mean over the window's monthly dates
    ci_low: float
    ci_high: float
    vertical_gap: float      # mean closed - open running max, score points
    n_dates: int             # dates with a defined lag
    n_open: int
    n_closed: int
    method: str
    grouping: str
    family_left_out: str | None
    n_boot: int


def estimate_lag(table: pd.DataFrame, start, end, measure: str = "", grouping: str = "open_weights",
                 method: str = "linear", family: str | None = None, n_boot: int = 1000,
                 seed: int = 0) -> LagEstimate:
    """Mean horizontal lag over monthly dates in [start, end] with a bootstrap CI (models
    resampled with replacement within each group; seeded)."""
    g = grouped(table, grouping, family)
    dates = monthly_grid(start, end)
    at = to_months(dates)
    o, c = g[g["group"] == "open"], g[g["group"] == "closed"]
    o_t, o_y = to_months(o["date"]), o["value"].to_numpy(dtype=float)
    c_t, c_y = to_months(c["date"]), c["value"].to_numpy(dtype=float)
    lags = lag_months(o_t, o_y, c_t, c_y, at, method)
    gap = (level_at(*frontier_records(c_t, c_y)[:2], at, "step")
           - level_at(*frontier_records(o_t, o_y)[:2], at, "step"))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot if len(o) and len(c) else 0):
        i = rng.integers(0, len(o), len(o))
        j = rng.integers(0, len(c), len(c))
        b = lag_months(o_t[i], o_y[i], c_t[j], c_y[j], at, method)
        if np.isfinite(b).any():
            boots.append(np.nanmean(b))
    lo, hi = (np.quantile(boots, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2]) if boots
              else (math.nan, math.nan))
    ok = np.isfinite(lags)
    return LagEstimate(measure, str(pd.Timestamp(start).date()), str(pd.Timestamp(end).date()),
                       float(np.mean(lags[ok])) if ok.any() else math.nan, float(lo), float(hi),
                       float(np.nanmean(gap)) if np.isfinite(gap).any() else math.nan,
                       int(ok.sum()), len(o), len(c), method, grouping, family, n_boot)
