"""A figure of the mechanism per lesson (issue 59, item 1): lessonkit.lessons.mechanisms draws each, every one renders
with a title that states it, the verify step is coloured by the acceptance rule, and every lesson 1-6 draws its
figure on the main path."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from lessonkit.lessons import mechanisms
from tests.test_lesson_length import main_path

ROOT = Path(__file__).resolve().parents[1]
TRACE = pd.DataFrame([
    {"drafted": "'a'", "target picks": "'a'", "verdict": "accepted", "emitted": "'a'"},
    {"drafted": "'b'", "target picks": "'c'", "verdict": "rejected: target's pick is the bonus token", "emitted": "'c'"},
    {"drafted": "'d'", "target picks": "'e'", "verdict": "discarded", "emitted": ""},
    {"drafted": "", "target picks": "'f'", "verdict": "discarded", "emitted": ""}])
FIGURES = {"01_speculative": ("draft_and_verify", lambda: mechanisms.draft_and_verify(TRACE)),
           "02_mtp": ("mtp_head", mechanisms.mtp_head),
           "03_grammar": ("forced_spans", lambda: mechanisms.forced_spans('[{"host":"]web-1[","level":"]warn["}]\n')),
           "04_prefix_cache": ("prefix_snapshot", lambda: mechanisms.prefix_snapshot(552, 40)),
           "05_semantic_cache": ("one_sided_cache", lambda: mechanisms.one_sided_cache(0.85)),
           "06_stack": ("the_stack", mechanisms.the_stack)}


@pytest.mark.parametrize("lesson", sorted(FIGURES))
def test_the_mechanism_figure_renders(lesson):
    fig = FIGURES[lesson][1]()
    try:
        fig.canvas.draw()
        assert fig.axes and fig.axes[0].get_title(), f"{lesson}: the figure states no claim"
    finally:
        matplotlib.pyplot.close(fig)


def _facecolours(fig) -> list[str]:
    return [matplotlib.colors.to_hex(p.get_facecolor()) for p in fig.axes[0].patches if hasattr(p, "get_boxstyle")]


def test_the_verify_step_is_coloured_by_the_rule():
    fig = mechanisms.draft_and_verify(TRACE)
    colours = _facecolours(fig)
    c = mechanisms.COLOURS
    drafts = [x for x in colours if x in (c["accepted"], c["rejected"], c["discarded"])]
    assert drafts == [c["accepted"], c["rejected"], c["discarded"]]           # three drafts: ok, wrong, thrown away
    assert colours.count(c["bonus"]) == 1                                     # one bonus token, at the rejected row
    assert "1 draft accepted" in fig.axes[0].get_title() and "2 tokens" in fig.axes[0].get_title()
    matplotlib.pyplot.close(fig)
    every = TRACE.assign(verdict=["accepted", "accepted", "accepted", "bonus token (every draft accepted)"])
    fig = mechanisms.draft_and_verify(every)
    assert "3 drafts accepted" in fig.axes[0].get_title() and "4 tokens" in fig.axes[0].get_title()
    matplotlib.pyplot.close(fig)


def test_forced_spans_counts_the_forced_bytes():
    fig = mechanisms.forced_spans("[ab]cd")
    assert "50%" in fig.axes[0].get_title()
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("lesson", sorted(FIGURES))
def test_every_lesson_draws_its_mechanism_on_the_main_path(lesson):
    cells = main_path(ROOT / "notebooks" / f"{lesson}.ipynb")
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert f"mechanisms.{FIGURES[lesson][0]}(" in code, f"{lesson}: no mechanism figure before the summary"


def test_lesson_0_draws_batch_union():
    cells = main_path(ROOT / "notebooks" / "00_engine.ipynb")
    assert any("lesson.batch_union(" in "".join(c["source"]) for c in cells)


def test_lesson_1_draws_speedup_against_acceptance():
    """Each regime a curve, each real drafter a predicted and a measured point (issue 59 item 1)."""
    from lessonkit.lessons.speculative import speedup_against_acceptance
    cost = pd.DataFrame([{"numerics": nm, "k": 3, "measured": m} for nm, m in (("exact", 2.0), ("int8", 1.3))])
    spd = pd.DataFrame([{"numerics": "int8", "drafter": "feature head", "k": 3, "E_predicted": 1.8,
                         "predicted_speedup": 1.1, "tokens_per_verify": 1.7, "measured_speedup": 1.0}])
    surf = pd.DataFrame([{"budget_experts": 2, "k": 2, "acceptance": a, "speedup": 0.5 + a} for a in (0.0, 0.5, 1.0)])
    fig = speedup_against_acceptance(cost, spd, surf)
    lines = fig.axes[0].get_lines()
    curves = [ln for ln in lines if len(ln.get_xdata()) > 1 and ln.get_linestyle() in ("-", "--")]
    assert len(curves) >= 3                                              # exact, int8, disk (and the 1.0 line)
    points = [ln for ln in lines if len(ln.get_xdata()) == 1]
    assert len(points) == 2 and {p.get_markerfacecolor() for p in points} != {"none"}   # hollow and filled
    fig.canvas.draw()
    matplotlib.pyplot.close(fig)
    cells = main_path(ROOT / "notebooks" / "01_speculative.ipynb")
    assert any("lesson.speedup_against_acceptance(" in "".join(c["source"]) for c in cells)
