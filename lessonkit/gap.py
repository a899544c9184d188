"""Lesson 6: how far open-weight models lag the closed frontier, measured on Epoch AI's data.

Data: data/epoch/ (Epoch AI, CC BY 4.0; see its README). Three tables are built from it:
ECI scores, MMLU (5-shot, externally reported) and GPQA Diamond (Epoch's runs), each one row
per model with columns model, date, value, access (Epoch's accessibility or a hand label),
organization; and a training-compute table in the same shape (value = FLOP).

Method, in the field's words:
- open = any "Open weights (...)" accessibility; closed = API access, hosted access, unreleased.
  Other groupings (GROUPINGS) are the sensitivity checks.
- frontier: the running maximum of a score over release dates, per group. Its records are the
  models that set a new best.
- horizontal lag at date t: how many months before t the closed frontier first reached the
  score the open frontier has at t. Default method "linear" draws each frontier as straight
  lines between its records (a step frontier adds the time since the last open record to every
  date, so it measures release cadence as much as the gap); method "step" is the literal one.
- vertical gap at t: closed running max minus open running max, in score points.
- summary: mean lag over a window of monthly dates; 90% CI by a seeded bootstrap that
  resamples models within each group.
- compute growth: log-linear OLS of log10(FLOP) on years over each group's compute frontier
  (models in the top k of their group at release); growth = 10**slope per year; 90% CI by a
  seeded pairs bootstrap.

Simplified relative to Epoch: one export (data vintage below), three benchmarks rather than
Epoch's set, and Epoch's exact windows and estimators are not published in the data README.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lessonkit.engine.errors import LessonkitError

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "epoch"
FILES = {
    "eci": "epoch_capabilities_index.csv",
    "mmlu": "mmlu_external.csv",
    "gpqa": "gpqa_diamond.csv",
}
MEASURES = ("eci", "mmlu", "gpqa")
MEASURE_LABELS = {
    "eci": "ECI score",
    "mmlu": "MMLU 5-shot accuracy (%)",
    "gpqa": "GPQA Diamond accuracy (%)",
    "compute": "training compute (FLOP)",
}
REQUIRED_COLUMNS = {
    "eci": ["Model version", "ECI Score", "Release date", "Organization", "Model accessibility",
            "Training compute (FLOP)", "Model name"],
    "mmlu": ["Model version", "EM", "Release date", "Organization", "Name", "Shots"],
    "gpqa": ["Model version", "mean_score", "Release date", "Organization"],
}
SCORE_COLUMN = {"eci": "ECI Score", "mmlu": "EM", "gpqa": "mean_score"}

OPEN_CATEGORIES = ("Open weights (unrestricted)", "Open weights (restricted use)",
                   "Open weights (non-commercial)")
CLOSED_CATEGORIES = ("API access", "Hosted access (no API)", "Unreleased")
HAND_OPEN = "Open weights (hand-labelled)"
HAND_CLOSED = "Closed (hand-labelled)"
# Scored models whose accessibility is blank in this export, labelled by this lesson (not by
# Epoch) from the developers' public releases. Off with hand_labels=False (a sensitivity row).
HAND_LABELS = {
    "GPT-5.2": HAND_CLOSED,          # OpenAI, served through its API and ChatGPT
    "o3-pro": HAND_CLOSED,           # OpenAI API
    "Gemini 3 Flash": HAND_CLOSED,   # Google API preview, like gemini-3-pro-preview ("API access")
    "DeepSeek-V3.2": HAND_OPEN,      # DeepSeek publishes V3.x weights
    "INTELLECT-1": HAND_OPEN,        # Prime Intellect published the weights
}
GROUPINGS = {
    # name: (categories counted as open, categories counted as closed); the rest are left out
    "open_weights": (OPEN_CATEGORIES + (HAND_OPEN,), CLOSED_CATEGORIES + (HAND_CLOSED,)),
    "unrestricted_only": (("Open weights (unrestricted)",), CLOSED_CATEGORIES + (HAND_CLOSED,)),
    "restricted_as_closed": (("Open weights (unrestricted)",),
                             CLOSED_CATEGORIES + (HAND_CLOSED, "Open weights (restricted use)",
                                                  "Open weights (non-commercial)")),
}
SUSPECT_DATE_DAYS = 180   # a version dated this far before every sibling version is a typo
DAYS_PER_MONTH = 365.25 / 12
CI_LEVEL = 0.90           # Epoch quotes 90% intervals
METHODS = ("linear", "step", "records")

# Epoch AI's published figures (as given in data/epoch/README.md; not re-checked at epoch.ai).
PUBLISHED = [
    {"finding": "lag on benchmarks, Nov 2024", "measure": "mmlu, gpqa", "as_of": "2024-11-04",
     "value": "about 12 months (5-22 by benchmark)", "low": 5.0, "high": 22.0, "unit": "months",
     "source": "Cottier et al., 'How far behind are open models?', Epoch AI, 4 Nov 2024"},
    {"finding": "growth of open frontier compute", "measure": "compute", "as_of": "2025-01-15",
     "value": "4.7x per year (90% CI 3.6-6.1)", "low": 3.6, "high": 6.1, "unit": "x per year",
     "source": "Epoch AI, 15 Jan 2025"},
    {"finding": "lag on ECI, Oct 2025", "measure": "eci", "as_of": "2025-10-30",
     "value": "3.5 months (90% CI 1.1-5.3), about 7 ECI points", "low": 1.1, "high": 5.3,
     "unit": "months", "source": "Emberson, Epoch AI, 30 Oct 2025"},
]


# --------------------------------------------------------------------------- loading

@dataclass
class DroppedRow:
    row: int          # 1-based data row in the CSV (the header is not counted)
    model: str
    reason: str       # a short category, e.g. "no release date"
    detail: str = ""  # what exactly was wrong


@dataclass
class LoadReport:
    """What one table kept and dropped, and the fixes applied on the way."""
    source: str
    rows_read: int = 0
    rows_kept: int = 0
    dropped: list[DroppedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def drop(self, row: int, model: str, reason: str, detail: str = "") -> None:
        self.dropped.append(DroppedRow(row, model, reason, detail))

    def by_reason(self) -> dict[str, int]:
        return dict(Counter(d.reason for d in self.dropped).most_common())

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(d) for d in self.dropped],
                            columns=["row", "model", "reason", "detail"])

    def __str__(self) -> str:
        reasons = ", ".join(f"{n} {r}" for r, n in self.by_reason().items()) or "none"
        text = f"{self.source}: read {self.rows_read} rows, kept {self.rows_kept}; dropped: {reasons}"
        return text + "".join(f"\n  note: {n}" for n in self.notes)


@dataclass
class EpochData:
    """The lesson's tables (one row per model) and the load report of each."""
    tables: dict[str, pd.DataFrame]
    reports: dict[str, LoadReport]
    data_dir: Path

    @property
    def latest_date(self) -> pd.Timestamp:
        return max(t["date"].max() for t in self.tables.values() if len(t))


def read_records(path: Path, required: list[str], report: LoadReport) -> list[tuple[int, dict]]:
    """CSV records as (row number, dict), with a real CSV parser (fields span lines).

    Records whose field count differs from the header's are dropped and reported."""
    path = Path(path)
    if not path.is_file():
        raise LessonkitError(f"{path}: no such file (the workbook ships it in data/epoch/; see data/epoch/README.md)")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as e:
        raise LessonkitError(f"{path}: not UTF-8 text ({e})") from None
    if not rows:
        raise LessonkitError(f"{path}: empty file")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in required if c not in header]
    if missing:
        raise LessonkitError(f"{path}: missing column(s) {missing}")
    out = []
    for i, rec in enumerate(rows[1:], start=1):
        if not any(v.strip() for v in rec):
            report.drop(i, "", "blank row")
            continue
        if len(rec) != len(header):
            report.drop(i, rec[0].strip() if rec else "", "wrong field count",
                        f"{len(rec)} fields, header has {len(header)}")
            continue
        out.append((i, dict(zip(header, rec))))
    report.rows_read = len(rows) - 1
    return out


def clean_text(s: str) -> str:
    """Strip and collapse inner whitespace (the source has trailing spaces and newlines)."""
    return " ".join((s or "").split())


_NUMBER_JUNK = re.compile(r"[,\s~≈]|flops?$", re.IGNORECASE)


def parse_number(text: str) -> float | None:
    """A float from Epoch's text fields: '3.8e+25', '1,000', '~1e25', '1.2×10^25', '2.1e25 FLOP'.

    Returns None for blank, NaN for text that is not a number."""
    s = (text or "").strip()
    if not s:
        return None
    s = s.replace("\u2212", "-").replace("×10^", "e").replace("x10^", "e").replace("*10^", "e")
    s = _NUMBER_JUNK.sub("", s)
    try:
        v = float(s)
    except ValueError:
        return math.nan
    return v if math.isfinite(v) else math.nan


def parse_date(text: str) -> pd.Timestamp | None:
    """A YYYY-MM-DD date; None for blank, NaT for anything else."""
    s = (text or "").strip()
    if not s:
        return None
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        return pd.NaT
    try:
        return pd.Timestamp(s)
    except ValueError:
        return pd.NaT


def _versions(path: Path, report: LoadReport) -> pd.DataFrame:
    """Clean per-version rows of the ECI file: every row that parses, scored or not."""
    rows = []
    for i, r in read_records(path, REQUIRED_COLUMNS["eci"], report):
        version = clean_text(r["Model version"])
        name = clean_text(r["Model name"]) or version
        date = parse_date(r["Release date"])
        eci = parse_number(r["ECI Score"])
        flop = parse_number(r["Training compute (FLOP)"])
        rows.append({"row": i, "version": version, "model": name,
                     "date": date if date is not None else pd.NaT,
                     "date_text": r["Release date"].strip(),
                     "eci": eci, "eci_text": r["ECI Score"].strip(),
                     "compute": flop, "compute_text": r["Training compute (FLOP)"].strip(),
                     "access": clean_text(r["Model accessibility"]),
                     "organization": clean_text(r["Organization"])})
    v = pd.DataFrame(rows, columns=["row", "version", "model", "date", "date_text", "eci",
                                    "eci_text", "compute", "compute_text", "access",
                                    "organization"])
    v["date"] = pd.to_datetime(v["date"])
    v["suspect_date"] = _suspect_dates(v)
    return v


def _suspect_dates(v: pd.DataFrame) -> pd.Series:
    """Versions dated more than SUSPECT_DATE_DAYS before every other dated version of their
    model (e.g. Kimi-K2-Instruct-0905 at 2024-09-05, a year before its 2025 siblings)."""
    flag = pd.Series(False, index=v.index)
    for _, g in v[v["date"].notna()].groupby("model"):
        if len(g) < 2:
            continue
        for idx in g.index:
            others = g["date"].drop(idx)
            if (others.min() - g.at[idx, "date"]).days > SUSPECT_DATE_DAYS:
                flag[idx] = True
    return flag


def _fill_access(v: pd.DataFrame, hand_labels: bool, report: LoadReport) -> pd.DataFrame:
    v = v.copy()
    if hand_labels:
        blank = v["access"].eq("") & v["model"].isin(HAND_LABELS)
        for name in sorted(v.loc[blank, "model"].unique()):
            report.notes.append(f"accessibility of '{name}' is blank in the export; "
                                f"labelled '{HAND_LABELS[name]}' by this lesson")
        v.loc[blank, "access"] = v.loc[blank, "model"].map(HAND_LABELS)
    return v


def _row_checks(v: pd.DataFrame, value: str, text: str, report: LoadReport,
                lo: float = -math.inf, hi: float = math.inf) -> pd.DataFrame:
    """Drop rows with no usable value, date or accessibility, reporting each."""
    what = "compute" if value == "compute" else "score"
    keep = []
    for idx, r in v.iterrows():
        val = r[value]
        if val is None or (isinstance(val, float) and math.isnan(val) and r[text] == ""):
            report.drop(r["row"], r["version"], f"no {what}")
        elif isinstance(val, float) and math.isnan(val):
            report.drop(r["row"], r["version"], f"{what} not a number", repr(r[text]))
        elif not lo <= val <= hi:
            report.drop(r["row"], r["version"], f"{what} out of range",
                        f"{r[text]} not in [{lo}, {hi}]")
        elif pd.isna(r["date"]) and r["date_text"] == "":
            report.drop(r["row"], r["version"], "no release date")
        elif pd.isna(r["date"]):
            report.drop(r["row"], r["version"], "bad release date", repr(r["date_text"]))
        elif r["suspect_date"]:
            report.drop(r["row"], r["version"], "suspect release date",
                        f"{r['date'].date()} is over {SUSPECT_DATE_DAYS} days before every other "
                        f"version of '{r['model']}'")
        elif r["access"] == "":
            report.drop(r["row"], r["version"], "no accessibility")
        elif r["access"] not in OPEN_CATEGORIES + CLOSED_CATEGORIES + (HAND_OPEN, HAND_CLOSED):
            report.drop(r["row"], r["version"], "unknown accessibility", repr(r["access"]))
        else:
            keep.append(idx)
    return v.loc[keep]


def _one_per_model(v: pd.DataFrame, value: str, report: LoadReport,
                   how: str = "earliest") -> pd.DataFrame:
    """Collapse versions to one row per model. how="earliest": the versions share the value
    (ECI, compute), keep the earliest release; how="best": keep the best-scoring version."""
    if how == "earliest":
        v = v.sort_values(["date", "row"])
    else:
        v = v.sort_values([value, "date", "row"], ascending=[False, True, True])
    first = ~v.duplicated("model")
    for _, r in v[~first].iterrows():
        report.drop(r["row"], r["version"], "duplicate",
                    f"another version of '{r['model']}' kept (one row per model)")
    out = v[first].rename(columns={value: "value"})
    out = out[["model", "version", "date", "value", "access", "organization"]]
    return out.sort_values(["date", "model"]).reset_index(drop=True)


def load_epoch(data_dir: str | Path | None = None, hand_labels: bool = True) -> EpochData:
    """Load the three Epoch files into the lesson's four tables, reporting every drop."""
    d = Path(data_dir) if data_dir is not None else DATA_DIR
    reports: dict[str, LoadReport] = {}
    tables: dict[str, pd.DataFrame] = {}

    base = LoadReport(FILES["eci"])
    versions = _versions(d / FILES["eci"], base)

    for key, value, text in (("eci", "eci", "eci_text"), ("compute", "compute", "compute_text")):
        rep = LoadReport(f"{FILES['eci']} ({key})", rows_read=base.rows_read,
                         dropped=list(base.dropped))
        v = _fill_access(versions, hand_labels, rep)
        v = _row_checks(v, value, text, rep, lo=-math.inf if key == "eci" else 1.0)
        tables[key] = _one_per_model(v, value, rep, how="earliest")
        rep.rows_kept = len(tables[key])
        reports[key] = rep
    reports["compute"].notes.append("compute is stored as text; parsed as a float "
                                    "(commas, '~', '≈', '×10^' and 'FLOP' tolerated)")

    by_version = versions.drop_duplicates("version").set_index("version")
    for key in ("mmlu", "gpqa"):
        rep = LoadReport(FILES[key])
        tables[key] = _benchmark(d / FILES[key], key, by_version, hand_labels, rep)
        rep.rows_kept = len(tables[key])
        reports[key] = rep
    return EpochData(tables, reports, d)


def _benchmark(path: Path, key: str, by_version: pd.DataFrame, hand_labels: bool,
               report: LoadReport) -> pd.DataFrame:
    """A benchmark file joined to the ECI file on Model version for model name and access."""
    rows = []
    for i, r in read_records(path, REQUIRED_COLUMNS[key], report):
        version = clean_text(r["Model version"])
        label = version or clean_text(r.get("Name", ""))
        if not version:
            report.drop(i, label, "no model version", "only a Name; nothing to join on")
            continue
        if key == "mmlu":
            shots = r["Shots"].strip()
            if shots != "5":
                report.drop(i, version, "not 5-shot", f"Shots={shots or 'blank'}")
                continue
        if version not in by_version.index:
            report.drop(i, version, "not in ECI file", "no accessibility to join")
            continue
        meta = by_version.loc[version]
        date = parse_date(r["Release date"])
        date_text = r["Release date"].strip()
        if date is None and pd.notna(meta["date"]):
            date, date_text = meta["date"], str(meta["date"].date())
            report.notes.append(f"{version}: release date taken from the ECI file")
        raw = r[SCORE_COLUMN[key]]
        score = parse_number(raw)
        rows.append({"row": i, "version": version, "model": meta["model"],
                     "date": date if date is not None else pd.NaT, "date_text": date_text,
                     "score": None if score is None else 100.0 * score,
                     "score_text": raw.strip(), "access": meta["access"],
                     "organization": clean_text(r["Organization"]) or meta["organization"],
                     "suspect_date": bool(meta["suspect_date"])})
    v = pd.DataFrame(rows, columns=["row", "version", "model", "date", "date_text", "score",
                                    "score_text", "access", "organization", "suspect_date"])
    v["date"] = pd.to_datetime(v["date"])
    v = _fill_access(v, hand_labels, report)
    v = _row_checks(v, "score", "score_text", report, lo=0.0, hi=100.0)
    return _one_per_model(v, "score", report, how="best")


def classify(access: pd.Series, grouping: str = "open_weights") -> pd.Series:
    """'open', 'closed' or missing (left out of both) for each accessibility value."""
    if grouping not in GROUPINGS:
        raise LessonkitError(f"unknown grouping {grouping!r}; choose from {sorted(GROUPINGS)}")
    opened, closed = GROUPINGS[grouping]
    return access.map(lambda a: "open" if a in opened else "closed" if a in closed else None)


def exclude_family(table: pd.DataFrame, family: str | None) -> pd.DataFrame:
    """Leave out one model family: models whose name matches `family` at a word start."""
    if not family:
        return table
    hit = table["model"].str.contains(rf"\b{re.escape(family)}", case=False, regex=True)
    return table[~hit]


# --------------------------------------------------------------------------- frontiers

def to_months(dates) -> np.ndarray:
    """Dates as float months since 1970-01-01 (a month = 365.25/12 days)."""
    d = pd.to_datetime(pd.Series(dates)).to_numpy(dtype="datetime64[s]").astype("int64")
    return d / 86400.0 / DAYS_PER_MONTH


def from_months(months) -> pd.DatetimeIndex:
    secs = np.round(np.asarray(months, dtype=float) * DAYS_PER_MONTH * 86400.0)
    return pd.to_datetime(secs.astype("int64"), unit="s")


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


def grouped(table: pd.DataFrame, grouping: str = "open_weights",
            family: str | None = None) -> pd.DataFrame:
    t = exclude_family(table, family).copy()
    t["group"] = classify(t["access"], grouping)
    return t[t["group"].notna()].reset_index(drop=True)


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


# --------------------------------------------------------------------------- compute growth

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


def to_years(dates) -> np.ndarray:
    return to_months(dates) / 12.0 + 1970.0


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


# --------------------------------------------------------------------------- the lesson's figures

def default_window(table: pd.DataFrame, months: int = 12, end=None) -> tuple[pd.Timestamp, pd.Timestamp]:
    """The `months` before `end` (default: the table's latest date); `end` is clipped to the
    table's latest date, since a frontier says nothing after its data stops."""
    last = table["date"].max()
    end = min(pd.Timestamp(end), last) if end is not None else last
    return end - pd.DateOffset(months=months), end


def measure(data: EpochData | None = None, n_boot: int = 1000, seed: int = 0,
            window_months: int = 12, grouping: str = "open_weights", top_k: int = 5,
            method: str = "linear") -> dict:
    """The headline figures: lag per measure over its latest window (method `method`, and the
    catch-up "records" method beside it), lag over the windows of Epoch's published figures,
    compute growth per group, the data's latest date."""
    data = data or load_epoch()
    methods = [method] + [m for m in ("records",) if m != method]
    lags: dict[str, dict] = {m: {} for m in methods}
    for meth in methods:
        for m in MEASURES:
            t = data.tables[m]
            start, end = default_window(t, window_months)
            lags[meth][m] = asdict(estimate_lag(t, start, end, m, grouping, meth,
                                                n_boot=n_boot, seed=seed))
    as_of = {}
    for pub in PUBLISHED:
        if pub["unit"] != "months":
            continue
        for m in (x.strip() for x in pub["measure"].split(",")):
            t = data.tables[m]
            start, end = default_window(t, window_months, pub["as_of"])
            as_of[f"{m}@{pub['as_of']}"] = {
                meth: asdict(estimate_lag(t, start, end, m, grouping, meth, n_boot=n_boot,
                                          seed=seed)) for meth in methods}
    growth = {k: asdict(v) for k, v in
              compute_growth(data.tables["compute"], grouping, top_k, n_boot=n_boot,
                             seed=seed).items()}
    return {"latest_date": str(data.latest_date.date()),
            "latest_date_by_measure": {m: str(t["date"].max().date())
                                       for m, t in data.tables.items()},
            "grouping": grouping, "method": method, "window_months": window_months,
            "n_boot": n_boot, "seed": seed,
            "lag": lags[method], "lag_records": lags["records"],
            "lag_at_published_dates": as_of, "compute_growth": growth,
            "dropped": {k: r.by_reason() for k, r in data.reports.items()}}


def sensitivity(data: EpochData, measures=MEASURES, window_months: int = 12, end=None,
                n_boot: int = 200, seed: int = 0, families=("Llama", "Qwen", "DeepSeek", "Kimi"),
                method: str = "linear") -> pd.DataFrame:
    """Lag per measure (months [90% CI]) under each variant: the other groupings, one model
    family left out, blank accessibility dropped instead of hand-labelled, other methods."""
    unlabelled = load_epoch(data.data_dir, hand_labels=False)
    variants = [("baseline", "open_weights", None, data, method)]
    variants += [(f"grouping: {g}", g, None, data, method) for g in GROUPINGS
                 if g != "open_weights"]
    variants += [(f"without {f}", "open_weights", f, data, method) for f in families]
    variants.append(("blank accessibility dropped", "open_weights", None, unlabelled, method))
    variants += [(f"method: {m}", "open_weights", None, data, m) for m in METHODS if m != method]
    rows = []
    for name, grouping, family, d, meth in variants:
        row = {"variant": name}
        for m in measures:
            t = d.tables[m]
            start, stop = default_window(t, window_months, end)
            e = estimate_lag(t, start, stop, m, grouping, meth, family, n_boot, seed)
            row[m] = _fmt_lag(e.lag_months, e.ci_low, e.ci_high)
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def _fmt_lag(v: float, lo: float, hi: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.1f} [{lo:.1f}, {hi:.1f}]"


def comparison_table(figures: dict) -> pd.DataFrame:
    """This notebook's figures beside Epoch's published ones, with why they differ."""
    pub = {p["finding"]: p for p in PUBLISHED}
    at = figures["lag_at_published_dates"]
    latest = figures["latest_date_by_measure"]
    meth = figures["method"]

    def lag(key, method):
        e = at[key][method]
        return (f"{e['lag_months']:.1f} months (90% CI {e['ci_low']:.1f}-{e['ci_high']:.1f}), "
                f"{e['start']}..{e['end']}")

    og = figures["compute_growth"].get("open")
    growth = (f"{og['x_per_year']:.1f}x per year (90% CI {og['ci_low']:.1f}-{og['ci_high']:.1f}; "
              f"{og['n']} models, {og['start'][:4]}-{og['end'][:4]})" if og else "too few points")
    bench = pub["lag on benchmarks, Nov 2024"]["value"]
    rows = [
        {"finding": "lag on MMLU, Nov 2024", "Epoch": bench,
         f"this notebook ({meth})": lag("mmlu@2024-11-04", meth),
         "this notebook (records)": lag("mmlu@2024-11-04", "records"),
         "why they differ": "one benchmark of Epoch's several; externally reported 5-shot scores "
                            "(few after mid-2024); GPT-4's 86.4 of Mar 2023 stood until an open "
                            "model passed it (the next cell computes how long), so the lag is long"},
        {"finding": "lag on GPQA Diamond, Nov 2024", "Epoch": bench,
         f"this notebook ({meth})": lag("gpqa@2024-11-04", meth),
         "this notebook (records)": lag("gpqa@2024-11-04", "records"),
         "why they differ": "Epoch's own runs, which start in 2023: dates whose open level the "
                            "closed frontier had passed before the data starts drop out"},
        {"finding": "open frontier compute growth",
         "Epoch": pub["growth of open frontier compute"]["value"],
         f"this notebook ({meth})": growth, "this notebook (records)": "",
         "why they differ": "only the models in the ECI file, not Epoch's full model database; "
                            "frontier = top 5 at release; compute to " + latest["compute"]},
        {"finding": "lag on ECI, Oct 2025", "Epoch": pub["lag on ECI, Oct 2025"]["value"],
         f"this notebook ({meth})": lag("eci@2025-10-30", meth) + "; vertical gap "
                                    f"{at['eci@2025-10-30'][meth]['vertical_gap']:.1f} points",
         "this notebook (records)": lag("eci@2025-10-30", "records"),
         "why they differ": "a later export (to " + latest["eci"] + ") whose ECI values were "
                            "re-estimated; the lesson's windows and estimators, not Epoch's "
                            "(not published with the data)"},
    ]
    return pd.DataFrame(rows)


def headline(figures: dict) -> dict:
    """Flat {name: value} figures for record_results and the summary."""
    out = {"data latest date": figures["latest_date"]}
    for key, label in (("lag", figures["method"]), ("lag_records", "records")):
        for m, e in figures[key].items():
            out[f"lag {m} ({label}, months)"] = round(e["lag_months"], 1)
            out[f"lag {m} ({label}) 90% CI"] = f"{e['ci_low']:.1f}-{e['ci_high']:.1f}"
    for m, e in figures["lag"].items():
        out[f"vertical gap {m} (points)"] = round(e["vertical_gap"], 1)
    for k, by in figures["lag_at_published_dates"].items():
        for meth, e in by.items():
            out[f"lag {k} ({meth}, months)"] = round(e["lag_months"], 1)
    for g, f in figures["compute_growth"].items():
        out[f"compute growth {g} (x/year)"] = round(f["x_per_year"], 2)
        out[f"compute growth {g} 90% CI"] = f"{f['ci_low']:.2f}-{f['ci_high']:.2f}"
    return out


# --------------------------------------------------------------------------- CLI

def format_figures(fig: dict) -> str:
    lines = [f"Epoch AI data to {fig['latest_date']} (grouping {fig['grouping']}, "
             f"{fig['window_months']}-month windows, 90% bootstrap CIs, {fig['n_boot']} resamples)"]
    for key, label in (("lag", fig["method"]), ("lag_records", "records")):
        for m, e in fig[key].items():
            lines.append(f"  lag {m:4s} {label:7s} {e['lag_months']:5.1f} months (90% CI "
                         f"{e['ci_low']:.1f}-{e['ci_high']:.1f}) {e['start']}..{e['end']}; "
                         f"vertical gap {e['vertical_gap']:.1f} points")
    for k, by in fig["lag_at_published_dates"].items():
        for meth, e in by.items():
            lines.append(f"  lag {k:15s} {meth:7s} {e['lag_months']:5.1f} months (90% CI "
                         f"{e['ci_low']:.1f}-{e['ci_high']:.1f})")
    for g, f in fig["compute_growth"].items():
        lines.append(f"  compute growth {g:6s} {f['x_per_year']:.2f}x/year (90% CI "
                     f"{f['ci_low']:.2f}-{f['ci_high']:.2f}), {f['n']} models {f['start']}.."
                     f"{f['end']}")
    return "\n".join(lines)


def json_safe(obj):
    """NaN and infinities as null, so the JSON is standard."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _run_cli(args: argparse.Namespace) -> int:
    data = load_epoch(args.data)
    fig = measure(data, n_boot=args.boot, seed=args.seed)
    print(json.dumps(json_safe(fig), indent=2) if args.json else format_figures(fig))
    return 0


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add `gap [--json]` to a lessonkit CLI; the handler is set as `func` (returns an exit code)."""
    p = subparsers.add_parser("gap", help="open-vs-closed lag and compute growth from Epoch AI data")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--data", default=None, help=f"folder with the Epoch CSVs (default {DATA_DIR})")
    p.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_cli)
    return p
