"""Headline declarations and their formatting (lessonkit.lessons.headline), record_results and the report's
small helpers, without running a lesson (tests/test_runner.py checks the report of a real SMOKE run)."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from lessonkit.lessons.headline import (LESSON_MODULES, Column, Headline, Sentence, format_value, headline_for,
                                        main_table, missing_figures, sentence_texts)
from lessonkit.report.html import duration, machine_table
from lessonkit.lessons.results import record_results
from lessonkit.report.runner import lesson_notebooks

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, spec, text", [
    (None, "", "n/a"), (math.nan, ".2f", "n/a"), (True, "", "yes"), (False, "identical|DIFFERS", "DIFFERS"),
    (0.123456, "", "0.123"), (0.5, ".0%", "50%"), (3, "", "3"), (1234.5, ",.0f", "1,234"),
    ("3.6-6.8", ".1f", "3.6-6.8"), (["a", 2], "", "a, 2"), ("tiny-moe", "", "tiny-moe")])
def test_format_value(value, spec, text):
    assert format_value(value, spec) == text


def test_sentences_read_figure_names_whole_and_repeat_per_model():
    h = Headline("t", (Sentence("hit rate {two_sided_0.8_hit_rate:.0%}, lag {lag eci (linear, months):.1f} months"),
                       Sentence("{*}: {*_all_speedup:.2f}x, output {*_all_identical:identical|DIFFERENT}",
                                each="*_all_speedup"),
                       Sentence("judge {judge_ms:.0f} ms", when="judge_ms")))
    figures = {"two_sided_0.8_hit_rate": 0.25, "lag eci (linear, months)": 5.26, "tiny_moe_all_speedup": 1.5,
               "tiny_moe_all_identical": True, "smollm2_135m_all_speedup": 2.0, "smollm2_135m_all_identical": False,
               "judge_ms": None}
    assert sentence_texts(h, figures) == ["hit rate 25%, lag 5.3 months", "tiny-moe: 1.50x, output identical",
                                          "smollm2-135m: 2.00x, output DIFFERENT"]
    assert missing_figures(h, figures) == []
    assert missing_figures(h, {"tiny_moe_all_speedup": 1.0}) == [
        "two_sided_0.8_hit_rate", "lag eci (linear, months)", "tiny_moe_all_identical", "judge_ms"]


def test_main_table_formats_cells_with_units_in_the_headers():
    h = Headline("t", (), columns=(Column("mode", "cache"), Column("bytes", "read (MiB)", ".1f", scale=2**-20),
                                   Column("hit", "hit rate (%)", ".0f", scale=100), Column("ok", "output", "same|DIFF")))
    headers, rows = main_table(h, {}, [{"mode": "warm", "bytes": 3 * 2**20, "hit": 0.5, "ok": True},
                                       {"mode": "off", "bytes": None, "hit": 0.25, "ok": False}])
    assert headers == ["cache", "read (MiB)", "hit rate (%)", "output"]
    assert rows == [["warm", "3.0", "50", "same"], ["off", "\u2013", "25", "DIFF"]]
    from_figure = Headline("t", (), columns=(Column("x", "x (s)", ".1f"),), table="runs")
    assert main_table(from_figure, {"runs": [{"x": 1.26}]}, None) == (["x (s)"], [["1.3"]])
    assert main_table(None, {}, None) == ([], [])


def test_every_lesson_notebook_has_a_headline_whose_key_figure_it_draws():
    assert sorted(LESSON_MODULES) == [p.stem for p in lesson_notebooks()]
    for name in LESSON_MODULES:
        h = headline_for(name)
        assert h.title and 3 <= len(h.sentences) <= 6 and h.columns, name
        nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        assert any(h.figure in src for src in code), f"{name}: no cell calls {h.figure}"
        assert any(f'record_results("{name}"' in src for src in code), name
    assert headline_for("99_elsewhere") is None


def test_record_results_writes_the_table_and_returns_the_sentences(tmp_path):
    figures = {"model": "tiny-moe", "prefix_tokens": 64, "restore_over_prefill": 0.5, "restore_s": 0.001,
               "prefill_s": 0.002, "batch_items": 4, "batch_speedup_warm_vs_off": 1.8, "ttft_off_s": 0.009,
               "ttft_warm_s": 0.006, "scores_identical": True, "kv_bytes_per_token": 256,
               "shape_keyed_cache_changes_output": True, "foreign_tokens_restored": 0}
    table = pd.DataFrame({"TTFT s": [0.1, float("nan")]}, index=pd.Index(["off", "warm"], name="mode"))
    shown = record_results("04_prefix_cache", figures, table=table, build_dir=tmp_path)
    saved = json.loads((tmp_path / "results" / "04_prefix_cache.json").read_text())
    assert saved["figures"] == figures
    assert saved["table"] == [{"mode": "off", "TTFT s": 0.1}, {"mode": "warm", "TTFT s": None}]
    assert shown.sentences == sentence_texts(headline_for("04_prefix_cache"), figures)
    assert repr(shown).splitlines()[0] == "- " + shown.sentences[0]
    assert "tiny-moe: restoring a 64-token prefix" in shown._repr_markdown_()


def test_duration_and_machine_table(monkeypatch):
    assert [duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 5 s", "1 h 2 min"]
    monkeypatch.delenv("LESSONKIT_WEIGHTS", raising=False)
    info = machine_table()
    assert {"CPU", "cores", "kernel path", "versions"} <= set(info) and "torch" in info["versions"]
    monkeypatch.setenv("LESSONKIT_WEIGHTS", "native")
    assert machine_table()["weights path"].startswith("native (asked for")
    monkeypatch.setenv("LESSONKIT_WEIGHTS", "f32")
    assert machine_table()["weights path"].startswith("f32 (asked for")


# ---- the executed notebooks' pages work offline (lessons/offline.py) ---------------------------------------
def test_a_notebook_page_loads_nothing_from_the_network_and_renders_its_formulas(tmp_path):
    """nbconvert's page of lesson 1 (its markdown is where the formulas are; no execution needed): no script
    from a CDN is left, and every $...$ / $$...$$ became an inline SVG."""
    import re
    import shutil

    from lessonkit.report.html import render_notebooks
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "01_speculative.ipynb", tmp_path / "notebooks")
    page = (tmp_path / render_notebooks(tmp_path, ["01_speculative"])["01_speculative"]).read_text(encoding="utf-8")
    assert not re.findall(r'<script\b[^>]*\bsrc="(?:https?:)?//', page), "a script still comes from the network"
    assert not re.search(r"""import\s*\(\s*["']https?://""", page), "a script still imports from the network"
    assert "MathJax" not in page.split("<body", 1)[1].split("<svg", 1)[0]
    assert page.count('class="math"') >= 3 and "$$" not in page      # the lesson's main path holds three
    assert 'aria-label="\\mathrm{speed\\ up} \\approx \\frac{E(k)}{T(k+1)/T(1) + k\\,c},"' in page


def test_a_formula_mathtext_cannot_parse_stays_as_tex():
    from lessonkit.lessons.offline import render_math
    assert render_math("cost $\\unknowncommand{x}$ here") == 'cost <code class="math-source">\\unknowncommand{x}</code> here'
    assert render_math("price $5 and $6") == "price $5 and $6"          # money, not math


def test_the_report_names_the_settings_the_lessons_ran_with(tmp_path, monkeypatch):
    """`lessonkit run --numerics X`: every lesson adopts X from its SETTINGS parameter, and the report's machine table
    says X, not the numerics of the process that wrote it (it said exact for a run on the int8 numerics)."""
    from lessonkit.engine import kernel
    from lessonkit.engine.settings import RunSettings
    from lessonkit.report import runner
    other = "exact" if kernel.NUMERICS == "int8" else "int8"
    monkeypatch.setattr(runner, "lesson_notebooks", lambda: [lesson_notebooks()[0]])
    monkeypatch.setattr(runner, "execute_notebook", lambda *a, **k: None)
    assert runner.run_all(build_dir=tmp_path, settings=RunSettings(numerics=other)) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["machine"]["numerics"] .startswith(f"{other} (the run's settings")
    assert kernel.NUMERICS != other                     # and the process's own are back
