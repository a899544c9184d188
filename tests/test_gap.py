"""Lesson 7, the coda (lessonkit.gap): loading Epoch's files, frontiers, lag estimator, compute growth."""
import csv
import io
import json
import math
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest

from lessonkit.cli import main
from lessonkit.gap.data import FILES, classify, exclude_family, from_months, load_epoch, parse_number
from lessonkit.gap.growth import compute_frontier, fit_growth
from lessonkit.gap.lag import estimate_lag, frontier_records, lag_months, level_at
from lessonkit.gap.summary import comparison_table, headline, sensitivity
from lessonkit.errors import LessonkitError

ECI_HEADER = ["Model version", "ECI Score", "Release date", "Organization", "Country",
              "Model accessibility", "Training compute (FLOP)", "Confidence", "Model name",
              "Description", "Display name"]
MMLU_HEADER = ["Model version", "EM", "Release date", "Organization", "Country",
               "Training compute (FLOP)", "Training compute notes", "Name", "Shots", "Source",
               "Source link", "Notes", "id"]
GPQA_HEADER = ["Model version", "mean_score", "Best score (across scorers)", "Release date",
               "Organization", "Country", "Training compute (FLOP)", "Training compute notes",
               "stderr", "Log viewer", "Logs", "Started at", "id"]


def eci_row(version, score, date, access, flop="", name=None):
    return [version, score, date, "Org", "X", access, flop, "Likely", name or version.strip(), "", ""]


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow(r)


@pytest.fixture
def messy_dir(tmp_path):
    """A small copy of the three files with one malformed row of each kind."""
    rows = [
        eci_row("closed-a", "120", "2023-01-15", "API access", "1e24"),
        eci_row("closed-b", "130", "2024-01-15", "API access", "2.5e+24"),
        eci_row("open-a", "118", "2023-09-01", "Open weights (unrestricted)", "3,000,000e18"),
        eci_row("open-b ", "125", "2024-06-01", "Open weights (restricted use)", "~4e24"),
        eci_row("open-b-v2", "125", "2024-06-20", "Open weights (restricted use)", "~4e24",
                name="open-b"),                                      # duplicate version
        eci_row("no-date", "140", "", "API access", "1e25"),          # missing date
        eci_row("bad-date", "141", "2024-13-45", "API access"),       # impossible date
        eci_row("bad-score", "n/a", "2024-02-01", "API access"),      # score is text
        eci_row("bad-flop", "119", "2024-03-01", "API access", "a lot"),  # compute is text
        eci_row("no-access", "126", "2024-04-01", ""),                # blank accessibility
        eci_row("odd-access", "127", "2024-04-02", "Leaked"),         # unknown category
        eci_row("typo-0905", "125", "2023-06-20", "Open weights (restricted use)", "~4e24",
                name="open-b"),                                      # a year too early
        ["short-row", "100", "2024-01-01"],                          # wrong field count
    ]
    write_csv(tmp_path / FILES["eci"], ECI_HEADER, rows)
    mm = [
        ["closed-a", "0.80", "2023-01-15", "Org", "X", "", "", "A", "5", "s", "", "", "r1"],
        ["closed-a", "0.78", "2023-01-15", "Org", "X", "", "", "A", "5", "s2", "", "", "r2"],
        ["open-a", "0.70", "", "Org", "X", "", "", "B", "5", "s", "", "", "r3"],  # date from ECI
        ["open-a", "0.60", "2023-09-01", "Org", "X", "", "", "B", "0", "s", "", "", "r4"],
        ["", "0.50", "", "Org", "X", "", "", "Only a name", "5", "s", "", "", "r5"],
        ["unknown-model", "0.50", "2023-01-01", "Org", "X", "", "", "U", "5", "s", "", "", "r6"],
        ["closed-b", "80", "2024-01-15", "Org", "X", "", "", "C", "5", "s", "", "", "r7"],  # %
    ]
    write_csv(tmp_path / FILES["mmlu"], MMLU_HEADER, mm)
    gq = [
        ["closed-a", "0.40", "0.40", "2023-01-15", "Org", "X", "", "", "0.02", "", "", "", "g1"],
        ["open-b ", "0.35", "0.35", "2024-06-01", "Org", "X", "", "", "0.02", "", "", "", "g2"],
        ["typo-0905", "0.36", "0.36", "2023-06-20", "Org", "X", "", "", "0.02", "", "", "", "g3"],
    ]
    write_csv(tmp_path / FILES["gpqa"], GPQA_HEADER, gq)
    return tmp_path


def test_malformed_rows_are_dropped_and_reported(messy_dir):
    d = load_epoch(messy_dir)
    eci, rep = d.tables["eci"], d.reports["eci"]
    assert sorted(eci["model"]) == ["bad-flop", "closed-a", "closed-b", "open-a", "open-b"]
    reasons = {r.model: r.reason for r in rep.dropped}
    assert reasons["no-date"] == "no release date"
    assert reasons["bad-date"] == "bad release date"
    assert reasons["bad-score"] == "score not a number"
    assert reasons["no-access"] == "no accessibility"
    assert reasons["odd-access"] == "unknown accessibility"
    assert reasons["typo-0905"] == "suspect release date"
    assert reasons["short-row"] == "wrong field count"
    assert reasons["open-b-v2"] == "duplicate"
    assert rep.rows_read == 13 and rep.rows_kept == 5
    assert "kept 5" in str(rep) and "suspect release date" in str(rep)
    assert set(rep.table().columns) == {"row", "model", "reason", "detail"}
    # one row per model, at its earliest sound release date, trailing space stripped
    assert eci.set_index("model").at["open-b", "date"] == pd.Timestamp("2024-06-01")
    assert eci.set_index("model").at["open-b", "version"] == "open-b"

    comp, crep = d.tables["compute"], d.reports["compute"]
    by_model = comp.set_index("model")["value"]
    assert by_model["open-a"] == pytest.approx(3e24)       # commas in the text
    assert by_model["open-b"] == pytest.approx(4e24)       # a leading '~'
    assert {r.model: r.reason for r in crep.dropped}["bad-flop"] == "compute not a number"


def test_benchmarks_join_accessibility_and_report_drops(messy_dir):
    d = load_epoch(messy_dir)
    mmlu, rep = d.tables["mmlu"].set_index("model"), d.reports["mmlu"]
    assert mmlu.at["closed-a", "value"] == pytest.approx(80.0)   # best of two sources, in %
    assert mmlu.at["open-a", "date"] == pd.Timestamp("2023-09-01")  # filled from the ECI file
    assert mmlu.at["open-a", "access"] == "Open weights (unrestricted)"
    got = rep.by_reason()
    assert got["no model version"] == 1 and got["not in ECI file"] == 1
    assert got["not 5-shot"] == 1 and got["duplicate"] == 1
    assert got["score out of range"] == 1                      # 80 given where 0.80 belongs
    gq = d.reports["gpqa"].by_reason()
    assert gq == {"suspect release date": 1}


def test_missing_file_or_column_is_a_lessonkit_error(tmp_path, messy_dir):
    with pytest.raises(LessonkitError, match="no such file"):
        load_epoch(tmp_path / "nowhere")
    write_csv(messy_dir / FILES["gpqa"], ["Model version", "Release date"], [])
    with pytest.raises(LessonkitError, match="missing column"):
        load_epoch(messy_dir)


@pytest.mark.parametrize("text,value", [
    ("3.8e+25", 3.8e25), ("5.0000000000001e+26", 5.0000000000001e26), ("1,000", 1000.0),
    (" ~1e25 ", 1e25), ("≈2e24", 2e24), ("1.2×10^25", 1.2e25), ("2e24 FLOP", 2e24)])
def test_parse_number_reads_compute_text(text, value):
    assert parse_number(text) == pytest.approx(value)


def test_parse_number_blank_and_junk():
    assert parse_number("  ") is None
    assert math.isnan(parse_number("unknown"))


def test_frontier_records_are_the_running_max():
    t = np.array([3.0, 1.0, 2.0, 2.0, 5.0, 4.0])
    y = np.array([5.0, 1.0, 4.0, 2.0, 4.5, 6.0])
    rt, ry, _ = frontier_records(t, y)
    assert list(rt) == [1.0, 2.0, 3.0, 4.0] and list(ry) == [1.0, 4.0, 5.0, 6.0]
    step = level_at(rt, ry, np.array([0.5, 2.5, 4.5, 9.0]), "step")
    assert np.isnan(step[0]) and list(step[1:]) == [4.0, 6.0, 6.0]


def synthetic_pair(shift_months=6.0, seed=1, n=60):
    """Open models on a noisy rising trend; closed = the same models released earlier."""
    rng = np.random.default_rng(seed)
    t_open = np.sort(rng.uniform(0, 60, n))                   # months
    y = 100 + 0.8 * t_open + rng.normal(0, 3, n)              # scores, many below the frontier
    return t_open, y, t_open - shift_months, y.copy()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lag_estimator_recovers_a_six_month_shift(seed):
    ot, oy, ct, cy = synthetic_pair(6.0, seed)
    at = np.arange(12.0, 60.0, 1.0)
    lags = lag_months(ot, oy, ct, cy, at, "linear")
    assert np.isfinite(lags).sum() > 30
    assert np.nanmean(lags) == pytest.approx(6.0, abs=0.5)
    catch = lag_months(ot, oy, ct, cy, at, "records")
    assert np.nanmean(catch) == pytest.approx(6.0, abs=0.5)


def test_estimate_lag_on_tables_with_bootstrap_is_seeded():
    ot, oy, ct, cy = synthetic_pair(6.0, seed=4)
    rows = [("o%d" % i, t, v, "Open weights (unrestricted)") for i, (t, v) in enumerate(zip(ot, oy))]
    rows += [("c%d" % i, t, v, "API access") for i, (t, v) in enumerate(zip(ct, cy))]
    table = pd.DataFrame(rows, columns=["model", "t", "value", "access"])
    table["date"] = from_months(table["t"] + 12 * 40)     # months since 2010
    start, end = from_months([12 * 41, 12 * 45])
    e = estimate_lag(table, start, end, "synthetic", n_boot=200, seed=7)
    assert e.lag_months == pytest.approx(6.0, abs=0.5)
    assert e.ci_low <= e.ci_high and math.isfinite(e.ci_low)
    again = estimate_lag(table, start, end, "synthetic", n_boot=200, seed=7)
    assert (again.ci_low, again.ci_high) == (e.ci_low, e.ci_high)


def test_lag_is_negative_when_open_leads_and_nan_when_undefined():
    ot, oy, ct, cy = synthetic_pair(6.0, seed=5)
    at = np.arange(12.0, 50.0, 1.0)
    swapped = lag_months(ct, cy, ot, oy, at, "linear")   # "open" is now 6 months ahead
    assert np.nanmean(swapped) == pytest.approx(-6.0, abs=0.5)
    # levels the closed frontier had already passed at its first record: unknown, not zero
    early = lag_months(np.array([0.0]), np.array([1.0]), np.array([0.0]), np.array([9.0]),
                           np.array([1.0]), "linear")
    assert np.isnan(early).all()


def test_compute_fit_recovers_a_known_growth_rate():
    rng = np.random.default_rng(3)
    years = np.sort(rng.uniform(2018, 2025, 80))
    flop = 1e22 * 4.7 ** (years - 2018) * 10 ** rng.normal(0, 0.15, len(years))
    dates = from_months((years - 1970) * 12)
    fit = fit_growth(dates, flop, "open", n_boot=500, seed=0)
    assert fit.x_per_year == pytest.approx(4.7, rel=0.05)
    assert fit.ci_low < 4.7 < fit.ci_high
    assert fit.predict(dates[:1])[0] == pytest.approx(1e22 * 4.7 ** (years[0] - 2018), rel=0.3)


def test_compute_frontier_keeps_top_k_at_release():
    table = pd.DataFrame({"model": list("abcde"), "value": [10.0, 5.0, 20.0, 1.0, 15.0],
                          "date": pd.to_datetime(["2020-01-01", "2020-02-01", "2020-03-01",
                                                  "2020-04-01", "2020-05-01"])})
    assert list(compute_frontier(table, 1)["model"]) == ["a", "c"]
    assert list(compute_frontier(table, 2)["model"]) == ["a", "b", "c", "e"]


def test_groupings_and_family_exclusion():
    access = pd.Series(["Open weights (restricted use)", "API access", "Unreleased",
                        "Open weights (unrestricted)"])
    assert list(classify(access)) == ["open", "closed", "closed", "open"]
    strict = classify(access, "unrestricted_only")
    assert strict.isna().tolist() == [True, False, False, False]      # left out, not closed
    assert list(strict[1:]) == ["closed", "closed", "open"]
    assert list(classify(access, "restricted_as_closed"))[0] == "closed"
    with pytest.raises(LessonkitError):
        classify(access, "nope")
    t = pd.DataFrame({"model": ["Llama 3-70B", "LLaMA-65B", "Qwen2-72B", "Codellama"]})
    assert list(exclude_family(t, "Llama")["model"]) == ["Qwen2-72B", "Codellama"]


def test_real_data_loads_with_its_quirks_reported():
    d = load_epoch()
    eci = d.reports["eci"]
    dropped = {r.model: r for r in eci.dropped}
    assert dropped["Kimi-K2-Instruct-0905"].reason == "suspect release date"
    assert any("GPT-5.2" in n for n in eci.notes)             # blank accessibility, hand label
    assert not d.tables["eci"]["version"].str.endswith(" ").any()
    assert not d.tables["eci"]["model"].str.contains("\n").any()
    assert d.tables["eci"]["model"].is_unique
    assert str(d.latest_date.date()) == "2026-01-27"
    unlabelled = load_epoch(hand_labels=False)
    assert "GPT-5.2" not in set(unlabelled.tables["eci"]["model"])


def test_measure_and_cli_json():
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["gap", "--json", "--boot", "50"]) == 0
    fig = json.loads(buf.getvalue())
    assert fig["latest_date"] == "2026-01-27"
    assert set(fig["lag"]) == {"eci", "mmlu", "gpqa"}
    assert set(fig["compute_growth"]) == {"open", "closed"}
    for e in fig["lag"].values():
        assert e["ci_low"] <= e["ci_high"]
    assert fig["compute_growth"]["open"]["x_per_year"] > 1
    table = comparison_table(fig)
    assert len(table) == 4 and table["why they differ"].str.len().min() > 20
    assert all(isinstance(v, (str, int, float)) for v in headline(fig).values())


def test_sensitivity_table_has_every_variant():
    d = load_epoch()
    s = sensitivity(d, measures=("eci",), n_boot=20)
    assert {"baseline", "without Llama", "grouping: unrestricted_only",
            "blank accessibility dropped", "method: records"} <= set(s.index)
