"""Lesson 1's main path (issue 59, items 3 and 4): a real drafter that pays and one that loses on smollm2-135m, each
predicted from parts measured apart beside its measurement; tiny-draft on the disk with the spread of its rounds on
one kernel thread; exactness counted in two arms, one of which can fork; a printed summary. The sentences are the
run's numbers: these tests feed the sentence functions tables and check what they say."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from lessonkit.lessons import exactness_arms, win_loss
from tests.test_lesson_length import main_path

ROOT = Path(__file__).resolve().parents[1]
NB = ROOT / "notebooks" / "01_speculative.ipynb"


def _main_code() -> str:
    return "\n".join("".join(c["source"]) for c in main_path(NB) if c["cell_type"] == "code")


def _win_df(speedups):
    return pd.DataFrame([{"category": "records", "drafter": d, "k": 2, "a1_apart": 0.8, "c": 0.1, "verify_cost": 1.3,
                          "E_predicted": 2.0, "tokens_per_verify": 2.0, "a_star": 0.3, "predicted_speedup": p,
                          "measured_speedup": m, "identical_to_plain": True, "requests": 3}
                         for d, (p, m) in speedups.items()])


# ---------------------------------------------------------------- item 3: the win and the loss
def test_the_main_path_measures_real_drafters_predicted_and_measured():
    code = _main_code()
    assert "win_loss.win_and_loss(" in code and "win_loss.win_loss_sentences(" in code
    assert "drafter_on_disk(" in code and "round_speedups" in code           # appendix J moved up
    assert "use_threads(DISK_THREADS" in code and "DISK_THREADS = 1" in code
    assert not any(s in label for label, (s, _) in win_loss.CANDIDATES.items() for s in ("oracle",))
    assert all(not spec.startswith("oracle") for spec, _ in win_loss.CANDIDATES.values())


def test_the_sentences_say_what_paid_and_what_lost_from_the_numbers():
    df = _win_df({"feature head": (1.08, 1.11), "distilled draft": (0.45, 0.51), "n-gram lookup": (1.2, 0.97)})
    lines = win_loss.win_loss_sentences(df)
    assert lines[0].startswith("paid: feature head") and "predicted 1.08x" in lines[0] and "measured 1.11x" in lines[0]
    assert lines[1].startswith("lost: distilled draft") and "measured 0.51x" in lines[1]
    assert "1 of 3" in lines[2] and "2 of 3 on the right side of 1x" in lines[2]


def test_when_nothing_pays_the_sentence_says_so():
    lines = win_loss.win_loss_sentences(_win_df({"feature head": (1.1, 0.93), "distilled draft": (0.4, 0.5)}))
    assert lines[0].startswith("nothing paid in this run; the best: feature head")
    assert "0 of 2" in lines[2]


def test_timed_and_apart_requests_are_disjoint():
    from lessonkit.measure.apart import Apart, InSample, predict_speedup
    from lessonkit.models.registry import load_model
    try:
        eng = load_model("tiny-moe")
    except Exception as e:  # noqa: BLE001 - a checkout without the trained model
        pytest.skip(f"tiny-moe not available: {e}")
    for cat, (timed, apart) in win_loss.held_out_split(eng, ("records", "rewrite"), 2, seed=0).items():
        assert len(timed) == len(apart) == 2, cat
        assert not {tuple(p) for p in timed} & {tuple(p) for p in apart}, cat
        with pytest.raises(InSample):           # the guard drafter_on_each's prediction goes through
            predict_speedup(Apart(prompts=tuple(timed), source="the timed half", acceptance=(0.5,)), 1, timed)


# ---------------------------------------------------------------- item 4: two arms
def _arms(lk, hf, fork=None, shift=1e-5, gap=0.05):
    return pd.DataFrame([
        {"arm": "lessonkit", "prompt": 0, "runs": 8, "new_tokens": 128, "distinct_completions": lk, "first_fork": None},
        {"arm": "transformers assisted", "prompt": 0, "runs": 8, "new_tokens": 128, "distinct_completions": hf,
         "first_fork": fork, "max_logit_shift": shift, "min_top2_gap": gap}])


def test_the_exactness_cell_prints_both_arms_and_the_price():
    code = _main_code()
    assert "exactness_arms.two_arms(" in code and "exactness_arms.arm_sentences(" in code
    assert "exactness_arms.price_of_exactness(cost_paths_df" in code
    lines = exactness_arms.arm_sentences(_arms(1, 3, fork=57))
    assert lines[0].startswith("lessonkit: 8 runs") and "at most 1 distinct" in lines[0] and "Why" not in lines[0]
    assert lines[1].startswith("transformers assisted") and "at most 3 distinct" in lines[1]
    assert "first fork at token 57" in lines[1]


def test_an_arm_that_gives_one_says_why():
    moved = exactness_arms.arm_sentences(_arms(1, 1, shift=4e-5, gap=0.02))[1]
    assert "Why 1 here" in moved and "4.0e-05" in moved and "2.0e-02" in moved
    same_bits = exactness_arms.arm_sentences(_arms(1, 1, shift=0.0))[1]
    assert "same bits" in same_bits


def test_first_fork():
    assert exactness_arms._first_fork([(1, 2, 3), (1, 2, 3)]) is None
    assert exactness_arms._first_fork([(1, 2, 3, 4), (1, 2, 3, 4), (1, 9, 3, 4), (1, 2, 3, 5)]) == 1


def test_the_price_of_exactness_reads_both_numerics():
    cost = pd.DataFrame([{"numerics": nm, "k": k, "rows": k + 1, "T_ms": t, "measured": t / t0}
                         for nm, t0, ts in (("exact", 10.0, (10.0, 23.0)), ("int8", 8.0, (8.0, 10.0)))
                         for k, t in zip((0, 3), ts)])
    line = exactness_arms.price_of_exactness(cost, 3)
    assert "2.30 plain steps (23.0 ms) on the exact numerics against 1.25 (10.0 ms) on int8" in line
    assert "0.80 of the exact one's" in line
    assert "needs both" in exactness_arms.price_of_exactness(cost[cost.numerics == "exact"], 3)


def test_the_transformers_arm_runs_and_counts():
    from lessonkit.models.registry import load_model
    pytest.importorskip("transformers")
    try:
        eng = load_model("tiny-moe")
    except Exception as e:  # noqa: BLE001 - a checkout without the trained model
        pytest.skip(f"tiny-moe not available: {e}")
    p = eng.encode("def add(a, b):\n    return")
    df = exactness_arms.two_arms(eng, [p], widths=(1, 2), threads=(1,), max_new_tokens=8)
    assert list(df.arm) == ["lessonkit", "transformers assisted"] and (df.runs == 2).all()
    assert (df.distinct_completions >= 1).all()
    hf = df.iloc[1]
    assert hf.min_top2_gap >= 0 and hf.max_logit_shift >= 0


# ---------------------------------------------------------------- the summary is printed from the run
def test_the_summary_is_a_printed_cell_with_the_runs_numbers():
    cells = json.loads(NB.read_text())["cells"]
    at = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Summary"))
    nxt = "".join(cells[at + 1]["source"])
    assert cells[at + 1]["cell_type"] == "code" and "win_loss.summary_lines(" in nxt and "print(" in nxt
    cost = pd.DataFrame([{"numerics": "exact", "k": 3, "measured": 2.3}, {"numerics": "int8", "k": 3, "measured": 1.4}])
    disk = pd.DataFrame([{"drafter": "tiny-draft", "k": 2, "budget_experts": 2, "predicted_speedup": 1.3,
                          "measured_speedup": 1.21, "round_speedups": [1.21, 0.98]}])
    lines = win_loss.summary_lines(cost, _win_df({"head": (1.1, 1.05), "draft": (0.5, 0.4)}), disk,
                                   _arms(1, 2, fork=3), "the cold disk", 3)
    text = "\n".join(lines)
    assert "2.30 plain steps on the exact numerics, 1.40 plain steps on the int8" in text
    assert "measured 1.21x (rounds 0.98-1.21x): paid" in text and "paid: head" in text and "lost: draft" in text
    assert "transformers assisted: at most 2 distinct" in text


def test_the_moved_appendices_live_in_lesson_1b():
    more = ROOT / "notebooks" / "01b_speculative_more.ipynb"
    text = "\n".join("".join(c["source"]) for c in json.loads(more.read_text())["cells"])
    for call in ("draft_step_comparison(", "sampling_tv(", "run_sweep("):
        assert call in text, call
    lesson = "\n".join("".join(c["source"]) for c in json.loads(NB.read_text())["cells"])
    assert "sampling_tv(" not in lesson and "run_sweep(" not in lesson and "01b_speculative_more.ipynb" in lesson


def test_lesson_1b_is_a_lesson_of_the_main_job():
    """01b runs headlessly in the main job (`lessonkit run`, SMOKE in tests/smoke_build.py) like every lesson, with
    its headline; a sweep's `lesson:01` still names lesson 1 alone."""
    from lessonkit.lessons.headline import headline_for
    from lessonkit.report.runner import lesson_notebooks
    from lessonkit.sweep.points import lesson_notebook
    stems = [p.stem for p in lesson_notebooks()]
    assert "01b_speculative_more" in stems and stems.index("01b_speculative_more") == stems.index("01_speculative") + 1
    assert headline_for("01b_speculative_more") is not None
    assert lesson_notebook("01").stem == "01_speculative" and lesson_notebook("01b").stem == "01b_speculative_more"
