"""Lesson 7, the coda (the open-vs-closed gap): the figures and widgets of notebooks/07_gap_analysis.ipynb.

Each function returns a matplotlib Figure; the widgets are a thin layer over the same functions."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lessonkit.gap.data import GROUPINGS, MEASURE_LABELS, MEASURES, EpochData, from_months, grouped, to_months
from lessonkit.gap.growth import compute_frontier, compute_growth
from lessonkit.gap.lag import estimate_lag, frontier, frontier_records, lag_series, time_reached
from lessonkit.lessons.headline import Column, Headline, Sentence

COLORS = {"open": "tab:orange", "closed": "tab:blue"}


def _window(table: pd.DataFrame, start, end) -> pd.DataFrame:
    t = table
    if start is not None:
        t = t[t["date"] >= pd.Timestamp(start)]
    if end is not None:
        t = t[t["date"] <= pd.Timestamp(end)]
    return t


def draw_frontier(ax, table: pd.DataFrame, measure: str, grouping: str = "open_weights",
                  start=None, end=None, family: str | None = None, log: bool = False) -> None:
    """Models as dots, each group's running max as a step line, its records ringed."""
    g = _window(grouped(table, grouping, family), start, end)
    last = g["date"].max() if len(g) else None
    for name in ("closed", "open"):
        part = g[g["group"] == name]
        ax.scatter(part["date"], part["value"], s=10, alpha=0.35, color=COLORS[name],
                   label=f"{name} models ({len(part)})")
        rec = frontier(part)
        if len(rec):
            x = list(rec["date"]) + [last]
            y = list(rec["value"]) + [rec["value"].iloc[-1]]
            ax.step(x, y, where="post", color=COLORS[name], lw=2, label=f"{name} frontier")
            ax.scatter(rec["date"], rec["value"], s=28, facecolors="none",
                       edgecolors=COLORS[name])
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("release date")
    ax.set_ylabel(MEASURE_LABELS[measure])
    ax.grid(alpha=0.3)


def plot_frontiers(data: EpochData, grouping: str = "open_weights", start=None, end=None,
                   family: str | None = None) -> Figure:
    """Frontier curves, open vs closed: ECI, MMLU, GPQA Diamond and training compute."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for ax, m in zip(axes.flat, MEASURES + ("compute",)):
        draw_frontier(ax, data.tables[m], m, grouping, start, end, family, log=m == "compute")
        ax.set_title(MEASURE_LABELS[m])
    axes[0, 0].legend(loc="lower right", fontsize=8)
    fig.suptitle("The open frontier climbs behind the closed one on every measure "
                 f"(grouping: {grouping})")
    return fig


def plot_lag(data: EpochData, grouping: str = "open_weights", measures=MEASURES,
             start=None, end=None, family: str | None = None) -> Figure:
    """Horizontal lag (months; linear and step) and vertical gap (points) over time."""
    fig, axes = plt.subplots(2, len(measures), figsize=(4.2 * len(measures), 6.5),
                             constrained_layout=True, sharex="col", squeeze=False)
    for k, m in enumerate(measures):
        t = data.tables[m]
        lin = lag_series(t, grouping=grouping, method="linear", family=family)
        stp = lag_series(t, grouping=grouping, method="step", family=family)
        lin, stp = _window(lin, start, end), _window(stp, start, end)
        ax = axes[0, k]
        ax.plot(lin["date"], lin["lag_months"], "-o", ms=3, label="linear frontiers")
        ax.plot(stp["date"], stp["lag_months"], "--", color="gray", label="step (running max)")
        g = grouped(t, grouping, family)
        o, c = g[g["group"] == "open"], g[g["group"] == "closed"]
        ot, oy, _ = frontier_records(to_months(o["date"]), o["value"].to_numpy())
        ct, cy, _ = frontier_records(to_months(c["date"]), c["value"].to_numpy())
        catch = ot - time_reached(ct, cy, oy, "step")
        cd = from_months(ot)
        keep = (np.isfinite(catch) & (cd >= (lin["date"].min() if len(lin) else cd.min()))
                & (cd <= (lin["date"].max() if len(lin) else cd.max())))
        ax.scatter(cd[keep], catch[keep], marker="x", color="k", label="catch-up at open records")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_title(MEASURE_LABELS[m])
        ax.set_ylabel("open lags closed by (months)")
        ax.grid(alpha=0.3)
        ax2 = axes[1, k]
        ax2.plot(lin["date"], lin["vertical_gap"], color="tab:purple")
        ax2.axhline(0, color="k", lw=0.5)
        ax2.set_ylabel("closed - open frontier (score points)")
        ax2.set_xlabel("date")
        ax2.grid(alpha=0.3)
        for label in ax2.get_xticklabels():
            label.set_rotation(30)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Open models trail by months, not years, on ECI and GPQA (grouping: {grouping})")
    return fig


def plot_growth(data: EpochData, grouping: str = "open_weights", top_k: int = 5,
                n_boot: int = 1000, seed: int = 0, start=None, end=None) -> Figure:
    """Training compute over time, each group's top-k-at-release models and their fit."""
    t = data.tables["compute"]
    fits = compute_growth(t, grouping, top_k, start, end, n_boot, seed)
    g = _window(grouped(t, grouping), start, end)
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    for name in ("closed", "open"):
        part = g[g["group"] == name]
        ax.scatter(part["date"], part["value"], s=10, alpha=0.3, color=COLORS[name])
        f = compute_frontier(part, top_k)
        ax.scatter(f["date"], f["value"], s=30, color=COLORS[name],
                   label=f"{name}: top {top_k} at release")
        if name in fits:
            fit = fits[name]
            x = pd.date_range(fit.start, fit.end, periods=50)
            ax.plot(x, fit.predict(x), color=COLORS[name], lw=2,
                    label=f"{name} fit: {fit.x_per_year:.1f}x/year "
                          f"(90% CI {fit.ci_low:.1f}-{fit.ci_high:.1f})")
    ax.set_yscale("log")
    ax.set_xlabel("release date")
    ax.set_ylabel("training compute (FLOP)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Frontier training compute grows several-fold a year, open and closed")
    return fig


def widgets(data: EpochData):
    """Date window, measure and accessibility grouping over the frontier and lag figures."""
    import ipywidgets as w
    from IPython.display import display

    lo, hi = min(t["date"].min() for t in data.tables.values()), data.latest_date
    months = list(pd.date_range(lo.to_period("M").to_timestamp(), hi, freq="MS"))
    window = w.SelectionRangeSlider(options=[(d.strftime("%Y-%m"), d) for d in months],
                                    index=(0, len(months) - 1), description="window",
                                    layout=w.Layout(width="600px"))
    measure = w.Dropdown(options=list(MEASURES) + ["compute"], value="eci",
                         description="measure")
    grouping = w.Dropdown(options=list(GROUPINGS), value="open_weights",
                          description="grouping")

    def show(window, measure, grouping):
        start, end = window
        fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
        draw_frontier(ax, data.tables[measure], measure, grouping, start, end,
                      log=measure == "compute")
        ax.legend(fontsize=8)
        if measure in MEASURES:
            e = estimate_lag(data.tables[measure], start, end, measure, grouping, n_boot=200)
            ax.set_title(f"{measure}: mean lag {e.lag_months:.1f} months "
                         f"(90% CI {e.ci_low:.1f}-{e.ci_high:.1f}), {e.n_dates} months defined")
        else:
            fits = compute_growth(data.tables["compute"], grouping, start=start, end=end,
                                      n_boot=200)
            ax.set_title("; ".join(f"{k} {f.x_per_year:.1f}x/year" for k, f in fits.items())
                         or "too few points for a fit")
        plt.show()

    out = w.interactive_output(show, {"window": window, "measure": measure,
                                      "grouping": grouping})
    display(w.VBox([window, w.HBox([measure, grouping]), out]))


def beside_epoch(data: EpochData, figures: dict, grouping: str = "open_weights") -> list[str]:
    """Section 6's sentences, from this run's figures (gap.summary.measure) set beside Epoch's published ones:
    the ECI lag at Epoch's date, MMLU and GPQA Diamond against Epoch's central figure, why MMLU runs long, which
    GPQA months count, and the open compute growth against Epoch's interval."""
    from lessonkit.gap.data import DAYS_PER_MONTH
    from lessonkit.gap.lag import monthly_grid
    from lessonkit.gap.summary import PUBLISHED
    pub = {p["measure"]: p for p in PUBLISHED}
    eci = figures["lag_at_published_dates"]["eci@2025-10-30"]
    out = [f"ECI, Oct 2025: Epoch {pub['eci']['value']}, averaged across ECI levels over Jan 2023 - Oct 2025; here, "
           f"averaged over the monthly dates {eci['linear']['start']} to {eci['linear']['end']}, "
           f"{eci['records']['lag_months']:.1f} months by catch-up time, {eci['linear']['lag_months']:.1f} with linear "
           f"frontiers, and a vertical gap of {eci['linear']['vertical_gap']:.1f} points. The linear estimator assumes "
           "the closed frontier rose steadily between its records, so it dates the closed side's arrival at a level "
           "earlier than the first closed model that scored that high."]
    central = pub["mmlu, gpqa"]["value"]            # Epoch's central figure only (its range is unverified)
    for m in ("mmlu", "gpqa"):
        e = figures["lag_at_published_dates"][f"{m}@2024-11-04"]["linear"]
        out.append(f"{m.upper()}, Nov 2024: {e['lag_months']:.1f} months, against Epoch's {central} across benchmarks "
                   "(a per-benchmark range once quoted for Epoch was not found in its report and is not used).")
    g = grouped(data.tables["mmlu"], grouping)           # why MMLU runs long: how long early 2023's best closed score stood
    closed_rec = frontier(g[g["group"] == "closed"])
    gpt4 = closed_rec[closed_rec["date"] <= "2023-12-31"].iloc[-1]
    opened = g[(g["group"] == "open") & (g["value"] >= gpt4["value"])].sort_values("date").iloc[0]
    out.append(f"  MMLU: {gpt4['model']} ({gpt4['value']:.1f}, {gpt4['date'].date()}) was first passed by an open model, "
               f"{opened['model']}, {(opened['date'] - gpt4['date']).days / DAYS_PER_MONTH:.0f} months later.")
    gq = grouped(data.tables["gpqa"], grouping)
    e = figures["lag_at_published_dates"]["gpqa@2024-11-04"]["linear"]
    started = pd.read_csv(data.data_dir / "gpqa_diamond.csv", usecols=["Started at"])["Started at"].dropna()
    counted = lag_series(data.tables["gpqa"], monthly_grid(e["start"], e["end"]), grouping,
                         "linear").dropna(subset=["lag_months"])
    out.append(f"  GPQA: its earliest date, {gq['date'].min().date()}, is the release date of the earliest model Epoch "
               f"evaluated (column `Release date`); the runs themselves (`Started at`) date from {started.min()[:10]}. "
               f"Open levels below the first closed score in the data have no defined lag, so only {e['n_dates']} of "
               "the window's months count"
               + (f": {counted['date'].min():%b %Y} to {counted['date'].max():%b %Y}, with lags of "
                  f"{counted['lag_months'].min():.1f} to {counted['lag_months'].max():.1f} months." if len(counted) else "."))
    og, pc = figures["compute_growth"]["open"], pub["compute"]
    overlap = og["ci_low"] <= pc["high"] and pc["low"] <= og["ci_high"]
    out.append(f"Open compute growth: Epoch {pc['value']}; here {og['x_per_year']:.1f}x per year (90% CI "
               f"{og['ci_low']:.1f}-{og['ci_high']:.1f}) on {og['n']} models from the ECI file; the intervals "
               f"{'overlap' if overlap else 'do not overlap'}.")
    return out


def takeaway(data: EpochData, figures: dict, grouping: str = "open_weights") -> str:
    """The coda's closing sentence, computed from the data: the best open-weight model on ECI, the date the
    closed frontier first scored as high, the months between, and the lag this run measured."""
    from lessonkit.gap.data import DAYS_PER_MONTH
    g = grouped(data.tables["eci"], grouping)
    best = g[g["group"] == "open"].sort_values(["value", "date"], ascending=[False, True]).iloc[0]
    closed = g[(g["group"] == "closed") & (g["value"] >= best["value"])].sort_values("date")
    lag = figures["lag"]["eci"]
    tail = (f"Over the last {figures['window_months']} months of the data the open frontier trailed by "
            f"{lag['lag_months']:.1f} months on average (90% CI {lag['ci_low']:.1f}-{lag['ci_high']:.1f}). The "
            "earlier lessons make such a model faster on hardware you own, and the lossless techniques leave its "
            "answers unchanged: they buy speed, not capability, so running locally means running a model about "
            "that far behind.")
    if not len(closed):
        return (f"Takeaway: the best open-weight model in this data, {best['model']} (ECI {best['value']:.1f}, "
                f"{best['date'].date()}), has no closed model at or above its score yet. " + tail)
    first = closed.iloc[0]
    months = (best["date"] - first["date"]).days / DAYS_PER_MONTH
    return (f"Takeaway: the best open-weight model in this data, {best['model']} (ECI {best['value']:.1f}, released "
            f"{best['date'].date()}), scores what the closed frontier first reached with {first['model']} on "
            f"{first['date'].date()}, {months:.0f} months earlier. " + tail)


HEADLINE = Headline(
    title="The open-vs-closed gap",
    sentences=(
        Sentence("In Epoch AI's data (to {data latest date}) open-weight models trail the closed frontier by "
                 "{lag eci (linear, months):.1f} months on ECI (90% CI {lag eci (linear) 90% CI}), "
                 "{lag mmlu (linear, months):.1f} on MMLU ({lag mmlu (linear) 90% CI}) and "
                 "{lag gpqa (linear, months):.1f} on GPQA Diamond ({lag gpqa (linear) 90% CI}; "
                 "linear estimator)."),
        Sentence("Counted from record to record instead, the lags are {lag eci (records, months):.1f}, "
                 "{lag mmlu (records, months):.1f} and {lag gpqa (records, months):.1f} months."),
        Sentence("On the same dates the open frontier is {vertical gap eci (points):.1f} points behind on ECI, "
                 "{vertical gap mmlu (points):.1f} on MMLU and {vertical gap gpqa (points):.1f} on GPQA Diamond."),
        Sentence("At Epoch's own dates: {lag mmlu@2024-11-04 (linear, months):.1f} months on MMLU in November 2024 "
                 "(Epoch: about 12) and {lag eci@2025-10-30 (linear, months):.1f} on ECI in October 2025 "
                 "(Epoch: 3.5)."),
        Sentence("Frontier training compute grows {compute growth open (x/year):.2f}x a year for open models "
                 "(90% CI {compute growth open 90% CI}) and {compute growth closed (x/year):.2f}x for closed ones "
                 "({compute growth closed 90% CI})."),
    ),
    columns=(Column("measure", "benchmark"), Column("method", "estimator"), Column("window", "window (dates)"),
             Column("lag (months)", "lag (months)", ".1f"), Column("90% CI", "90% CI (months)"),
             Column("vertical gap (points)", "vertical gap (points)", ".1f"),
             Column("open models", "open models"), Column("closed models", "closed models")),
    caption="The lag, in months and in points",
    figure="lesson.plot_lag(",
)
