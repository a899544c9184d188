"""Epoch AI's data as three score tables (ECI, MMLU, GPQA Diamond) and a training-compute table, one row
per model with columns model, date, value, access, organization; every dropped row is reported with its
reason. Also the accessibility groupings (open / closed) and date arithmetic in months and years."""
from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError

DATA_DIR = workbook_path("data", "epoch")

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
    except csv.Error as e:           # a field over csv.field_size_limit() (131,072 characters), a NUL byte
        raise LessonkitError(f"{path}: not a readable CSV file ({e})") from None
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
    for key, t in tables.items():    # a truncated or header-only file: say so, not fail later on an empty table
        if t.empty:
            raise LessonkitError(f"{d / FILES.get(key, FILES['eci'])}: no usable rows for {key} ({reports[key]})")
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


# --------------------------------------------------------------------------- groups and dates

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


def grouped(table: pd.DataFrame, grouping: str = "open_weights",
            family: str | None = None) -> pd.DataFrame:
    t = exclude_family(table, family).copy()
    t["group"] = classify(t["access"], grouping)
    return t[t["group"].notna()].reset_index(drop=True)


def to_months(dates) -> np.ndarray:
    """Dates as float months since 1970-01-01 (a month = 365.25/12 days)."""
    d = pd.to_datetime(pd.Series(dates)).to_numpy(dtype="datetime64[s]").astype("int64")
    return d / 86400.0 / DAYS_PER_MONTH


def from_months(months) -> pd.DatetimeIndex:
    secs = np.round(np.asarray(months, dtype=float) * DAYS_PER_MONTH * 86400.0)
    return pd.to_datetime(secs.astype("int64"), unit="s")


def to_years(dates) -> np.ndarray:
    return to_months(dates) / 12.0 + 1970.0
