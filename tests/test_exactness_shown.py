"""Lesson 1's appendix A (issue 52): the same prompts decoded plainly and inside verify batches of several
widths, under several kernel thread counts, give one completion each; the float control can tell more than one;
llama.cpp's count, where it is built, and one line saying how to build it where it is not."""
import subprocess

import pytest
import torch

from lessonkit.measure import llamacpp
from lessonkit.measure.llamacpp import Sample, distinct
from lessonkit.measure.llamacpp import distinct_completions as llamacpp_distinct_completions
from lessonkit.measure.exactness import distinct_completions, float_row_control
from lessonkit.models.registry import load_model


def test_one_completion_per_prompt_whatever_the_width_and_threads():
    eng = load_model("tiny-moe")
    prompts = [eng.encode("the cat sat on the mat"), eng.encode("def f(x):\n    return")]
    n = torch.get_num_threads()
    df = distinct_completions(eng, prompts, widths=(2, 5), threads=(1, 2), max_new_tokens=8)
    assert (df.runs == 6).all() and (df.distinct_completions == 1).all()
    assert torch.get_num_threads() == n                      # torch's count restored


def test_the_float_control_counts_bit_patterns():
    df = float_row_control(d_in=64, d_out=32, widths=(1, 2), threads=(1,))
    assert len(df) == 1 and 1 <= int(df.distinct_rows.iloc[0]) <= 2


# ---- the same count in llama.cpp, where it is built (lessonkit.measure.llamacpp.distinct_completions) ----
def test_outputs_that_agree_up_to_the_limit_count_as_one():
    at_limit, at_eos = (lambda text: Sample(text, 0, 0.0, at_limit=True)), (lambda text: Sample(text, 0, 0.0))
    assert distinct([at_limit("abc"), at_limit("abcdef"), at_limit("abc")]) == 1    # speculative runs on past -n
    assert distinct([at_limit("abc"), at_limit("abd")]) == 2
    assert distinct([at_eos("ab"), at_limit("abc")]) == 2                          # it ended; the other went on
    assert distinct([]) == 0


def test_without_llamacpp_the_count_is_one_line_saying_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))

    def refuse(*a, **k):
        raise AssertionError(f"ran {a}")
    monkeypatch.setattr(subprocess, "run", refuse)
    got = llamacpp_distinct_completions(["the cat sat"])
    assert got["built"] is False and got["rows"] == []
    assert "\n" not in got["note"] and "not built" in got["note"] and "lessonkit bench llamacpp --build" in got["note"]


@pytest.mark.skipif(not llamacpp.is_built(), reason="llama.cpp is not built here (`lessonkit bench llamacpp --build`)")
@pytest.mark.budget(120, "two llama.cpp processes, loading smollm2-135m three times (llama-speculative drafts with it)")
def test_llamacpp_counts_its_completions_where_it_is_built():
    got = llamacpp_distinct_completions(["def add(a, b):\n    return"], runs=((0, 1), (3, 2)), n_new=8)
    assert got["built"] and got["runs"] == "plain x 1 thread(s), verify width 4 x 2 thread(s)"
    (row,) = got["rows"]
    assert row["runs"] == 2 and row["distinct_speculative"] == 1 and row["distinct_completions"] in (1, 2)
