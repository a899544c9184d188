"""Lesson 6's model-drafter row predicted with lesson 1's formula (lessonkit.measure.stack_prediction): the
arithmetic on counts worked by hand, nothing predicted where the calibration items gave no verify step, and on
the trained tiny-moe judge a prediction from quantities measured apart, beside the measured row."""
import math
from dataclasses import replace

import pytest

from lessonkit.measure import stack as measure
from lessonkit.measure.stack_prediction import predicted_decode_speedup
from lessonkit.models.registry import MODELS_DIR
from lessonkit.stack import PRESETS


def test_lesson_1s_formula_on_counts_worked_by_hand():
    # 4 verify steps of 2 drafts each, 8 tokens emitted; T(1) = 0.5 s, T(3) = 1.0 s; 8 drafts took 0.4 s
    apart = {"steps": 4, "emitted": 8.0, "draft_tokens": 8, "draft_s": 0.4, "k_hist": {2: 4}}
    got = predicted_decode_speedup(apart, [0.5, 0.75, 1.0])
    assert got["E"] == 2.0 and got["verify_cost"] == 2.0
    assert got["c"] == pytest.approx(0.1)                       # 0.05 s a draft over 0.5 s a plain step
    assert got["step_cost"] == pytest.approx(2.2)               # T(3)/T(1) + c d = 2 + 0.1 x 2
    assert got["S"] == pytest.approx(2.0 / 2.2)                 # E over the step cost: a loss here


def test_mixed_depths_weigh_the_cost_curve_by_the_gates_choices():
    apart = {"steps": 4, "emitted": 6.0, "draft_tokens": 4, "draft_s": 0.0, "k_hist": {0: 2, 2: 2}}
    got = predicted_decode_speedup(apart, [1.0, 1.5, 2.0])
    assert got["verify_cost"] == (2 * 1.0 + 2 * 2.0) / 4 and got["S"] == 1.5 / 1.5


def test_no_verify_step_predicts_nothing():
    got = predicted_decode_speedup({"steps": 0, "emitted": 0.0, "draft_tokens": 0, "draft_s": 0.0, "k_hist": {}},
                                   [1.0, 1.2])
    assert all(math.isnan(v) for v in got.values())


@pytest.mark.skipif(not (MODELS_DIR / "tiny-moe-judge" / "adapter.json").exists(), reason="the tiny-moe judge ships")
@pytest.mark.parametrize("drafter", ["ngram", "tiny-draft"])
def test_the_drafter_row_carries_its_prediction(drafter):
    cfg = replace(PRESETS["small"], n_items=2, warm_items=0, calibration_items=1, progress=False)
    df, runs, _ = measure.ablation(measure.load_engine("tiny-moe-judge"), cfg, rows=["plain engine", "model drafter"],
                                   model_drafter=drafter)
    row = df.set_index("row").loc["model drafter"]
    assert row["model_drafter"] == drafter and row["E_apart"] >= 1.0 and row["c_apart"] >= 0.0
    # T(d+1)/T(1) is a ratio of two timings: on a loaded machine a cheap extra row can time below 1
    assert row["verify_cost_apart"] > 0.0 and 0.0 < row["decode_share"] <= 1.0
    assert 0.0 < row["predicted_speedup"] < 1.0 / (1.0 - row["decode_share"]) + 1e-9     # Amdahl bounds it
    assert df.set_index("row").loc["plain engine", ["predicted_speedup", "E_apart"]].isna().all()
    head = measure.headline(df)
    assert head["tiny_moe_judge_drafter_predicted_speedup"] == round(float(row["predicted_speedup"]), 3)


def test_combined_rows_broken_down_into_the_single_rows():
    """Plain 10 s; prefix cache 8 s (1.25x), grammar drafting 5 s (2x); together: the product 2.5x, or the savings
    2 s + 5 s on disjoint parts, 10 / 3 s; a third technique saving past the plain time predicts nothing."""
    import pandas as pd

    from lessonkit.measure.stack_prediction import combined_breakdown
    rows = [("plain engine", "none", 10.0), ("prefix cache", "prefix", 8.0), ("grammar drafting", "grammar", 5.0),
            ("lossless together", "prefix+grammar", 4.0)]
    df = pd.DataFrame([{"model": "m", "row": r, "techniques": t, "wall_s": w, "speedup": 10.0 / w, "judge_calls": 4}
                       for r, t, w in rows])
    got = combined_breakdown(df).iloc[0]
    assert got["row"] == "lossless together" and got["measured"] == 2.5
    assert got["product_of_single_rows"] == pytest.approx(2.5) and got["disjoint_savings"] == pytest.approx(10 / 3)
    df.loc[df.row == "grammar drafting", ["wall_s", "speedup"]] = [1.0, 10.0]     # saves 9 s, with the prefix's 2 s: 11 s
    got = combined_breakdown(df).iloc[0]
    assert math.isnan(got["disjoint_savings"]) and got["savings_text"].startswith("nothing: the savings (11.0 s)")
