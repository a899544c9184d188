"""The lesson's headline figures: lag per measure over its latest window and at the dates of Epoch's
published findings, compute growth per group, the sensitivity table and the comparison with Epoch."""
from __future__ import annotations

import math
from dataclasses import asdict

import pandas as pd

from lessonkit.gap.data import GROUPINGS, MEASURES, EpochData, load_epoch
from lessonkit.gap.growth import compute_growth
from lessonkit.gap.lag import METHODS, estimate_lag

# Epoch AI's published figures (as given in data/epoch/README.md; not re-checked at epoch.ai).
PUBLISHED = [
    {"finding": "lag on benchmarks, Nov 2024", "measure": "mmlu, gpqa", "as_of": "2024-11-04",
     # the "5-22 months by benchmark" once quoted beside it was not found as stated in the report
     # (docs/sources.md): it is not Epoch's, so no range is given here
     "value": "about 12 months", "low": None, "high": None, "unit": "months",
     "source": "Cottier et al., 'How far behind are open models?', Epoch AI, 4 Nov 2024"},
    {"finding": "growth of open frontier compute", "measure": "compute", "as_of": "2025-01-15",
     "value": "4.7x per year (90% CI 3.6-6.1)", "low": 3.6, "high": 6.1, "unit": "x per year",
     "source": "Epoch AI, 15 Jan 2025"},
    {"finding": "lag on ECI, Oct 2025", "measure": "eci", "as_of": "2025-10-30",
     "value": "3.5 months (90% CI 1.1-5.3), about 7 ECI points", "low": 1.1, "high": 5.3,
     "unit": "months", "source": "Emberson, Epoch AI, 30 Oct 2025"},
]



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
         "why they differ": "Epoch's own runs of models released from 2023-03-14 (the earliest "
                            "release date; the runs date from 2025): dates whose open level the "
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
                            "re-estimated; Epoch averages across ECI levels over Jan 2023 - Oct 2025, "
                            "the lesson over the monthly dates of its window"},
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
