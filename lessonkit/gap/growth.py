"""Compute growth: a log-linear OLS of log10(FLOP) on years over each group's compute frontier (models
in the top k of their group at release); growth = 10**slope per year, 90% CI by a seeded pairs
bootstrap."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lessonkit.errors import LessonkitError
from lessonkit.gap.data import grouped, to_years
from lessonkit.gap.lag import CI_LEVEL

@dataclass
class GrowthFit:
    group: str
    x_per_year: float        # 10 ** slope
    ci_low: float
    ci_high: float
    slope_log10: float       # orders of magnitude per year
    n: int
    start: str
    end: str
    top_k: int
    n_boot: int
    intercept_log10: float   # log10(FLOP) at year 0 of the fit

    def predict(self, dates) -> np.ndarray:
        """Fitted FLOP at the given dates."""
        return 10 ** (self.intercept_log10 + self.slope_log10 * to_years(dates))


def fit_growth(dates, flop, group: str = "", top_k: int = 0, n_boot: int = 1000,
               seed: int = 0) -> GrowthFit:
    """Log-linear OLS of log10(FLOP) on calendar years; growth in x per year with a 90% CI
    from a seeded pairs bootstrap."""
    x = to_years(dates)
    y = np.log10(np.asarray(flop, dtype=float))
    if len(x) < 3:
        raise LessonkitError(f"need at least 3 points to fit a growth rate, got {len(x)}")
    slope, icept = np.polyfit(x, y, 1)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, len(x), len(x))
        if np.ptp(x[i]) > 0:
            boots.append(np.polyfit(x[i], y[i], 1)[0])
    lo, hi = (np.quantile(boots, [(1 - CI_LEVEL) / 2, (1 + CI_LEVEL) / 2]) if boots
              else (math.nan, math.nan))
    d = pd.to_datetime(pd.Series(dates))
    return GrowthFit(group, float(10 ** slope), float(10 ** lo), float(10 ** hi), float(slope),
                     len(x), str(d.min().date()), str(d.max().date()), top_k, n_boot,
                     float(icept))


def compute_frontier(table: pd.DataFrame, top_k: int = 5) -> pd.DataFrame:
    """Models that were in the top k of their group's training compute when released."""
    t = table.sort_values("date").reset_index(drop=True)
    keep = []
    for i, r in t.iterrows():
        earlier = t.loc[t["date"] <= r["date"], "value"]
        if (earlier > r["value"]).sum() < top_k:
            keep.append(i)
    return t.loc[keep]


def compute_growth(table: pd.DataFrame, grouping: str = "open_weights", top_k: int = 5,
                   start=None, end=None, n_boot: int = 1000, seed: int = 0,
                   family: str | None = None) -> dict[str, GrowthFit]:
    """Growth of frontier training compute per group (open, closed)."""
    g = grouped(table, grouping, family)
    if start is not None:
        g = g[g["date"] >= pd.Timestamp(start)]
    if end is not None:
        g = g[g["date"] <= pd.Timestamp(end)]
    out = {}
    for name in ("open", "closed"):
        f = compute_frontier(g[g["group"] == name], top_k)
        if len(f) >= 3:
            out[name] = fit_growth(f["date"], f["value"], name, top_k, n_boot, seed)
    return out
