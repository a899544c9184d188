"""Lesson 1's appendix A (issue 52): the same prompts decoded plainly and inside verify batches of several
widths, under several kernel thread counts, give one completion each; the float control can tell more than one."""
import torch

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
