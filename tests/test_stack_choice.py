"""The capstone's choices (issue 52): the depth is the gate's, "grammar only" and "no drafts" can win the drafting
choice, and the lossless row is set apart from the row behind the lossy semantic cache."""
import pandas as pd

from lessonkit.measure.stack import NO_MODEL_DRAFTER, ROWS, techniques_for
from lessonkit.stack import StackConfig


def test_the_depth_is_the_gates_by_default():
    assert StackConfig().k == "auto"


def test_the_lossless_row_has_no_semantic_cache_and_the_all_row_has_it():
    assert "semcache" not in ROWS["lossless together"] and "semcache" in ROWS["all together"]
    assert set(ROWS["all together"]) - set(ROWS["lossless together"]) == {"semcache"}


def test_a_choice_without_a_model_drafter_reaches_the_combined_rows_only():
    assert techniques_for("lossless together", "grammar only") == ("prefix", "grammar")
    assert techniques_for("lossless together", "no drafts") == ("prefix",)
    assert techniques_for("all together", "no drafts") == ("semcache", "prefix")
    assert techniques_for("model drafter", "no drafts") == ("drafter",)          # the single row runs as named
    assert techniques_for("lossless together", "ngram") == ROWS["lossless together"]
    assert set(NO_MODEL_DRAFTER) == {"grammar only", "no drafts"}


def test_the_figure_promises_no_target():
    from lessonkit.lessons.stack import plot_ablation
    df = pd.DataFrame([{"model": "m", "row": r, "speedup": 1.0, "identical_to_plain": True, "answers_differing": 0,
                        "engine_answers_identical": True} for r in ROWS])
    fig = plot_ablation(df)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any("target" in t for t in labels)
