"""Lesson 1's appendix J (issue 52): a real drafter (tiny-draft, c > 0) on the disk cost model's disk, predicted
and measured. Every output equals plain greedy; acceptance, c and both speed-ups are there and positive; and the
prediction is section 5's formula: its verify step less the k c of the drafts is the cost model's own step at
the acceptance measured apart. No timed assertion."""
import os
import shutil

import pytest

from lessonkit.measure.break_even import cost_model_inputs, disk_cost_model, drafter_on_disk
from lessonkit.models.registry import load_model, resolve_model_dir

RATE = 500.0          # a cold disk's read rate in MB/s, as disk_read_rate would measure it (any positive figure)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A private copy of tiny-moe (no other process warms or empties its expert file's pages), the draft model,
    two prompts to measure, one apart for the drafter's acceptance and c, and the cost model's inputs on two
    others (a prediction from the timed prompts' own reads would be in sample: InSample)."""
    src = resolve_model_dir("tiny-moe")[1]
    dst = tmp_path_factory.mktemp("tiny-moe-drafter")
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    target = load_model("tiny-moe")
    prompts = [target.encode("def add(a, b):\n    return a + b\n\ndef"), target.encode("the cat sat on the mat and")]
    apart = [target.encode("import os\nimport sys\n\nclass")]
    measured = [target.encode("The expert cache keeps the most recently used"), target.encode("for i in range(10):")]
    inputs = cost_model_inputs(dst, measured, budget_experts=(2,), rows=(1, 2, 3), max_new_tokens=8, repeats=1)
    return dst, load_model("tiny-draft"), prompts, apart, inputs


@pytest.mark.parametrize("disk", ["warm", "simulated:400", pytest.param("cold", marks=pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="--disk cold here needs posix_fadvise (Linux)"))])
def test_a_real_drafter_on_disk_is_predicted_and_measured(setup, disk):
    model_dir, draft, prompts, apart, inputs = setup
    df = drafter_on_disk(model_dir, draft, prompts, apart, inputs, budget_experts=2, ks=(1, 2), disk=disk,
                         read_mb_s=RATE if disk == "cold" else None)
    assert list(df.k) == [1, 2] and (df.drafter == "tiny-draft").all() and (df.disk == disk).all()
    assert df.identical_to_plain.all()                                 # tokens equal plain greedy, every k
    for col in ("predicted_speedup", "measured_speedup", "c", "measured_c", "cost_per_verify_step"):
        assert (df[col] > 0).all(), col
    assert ((df.acceptance_apart >= 0) & (df.acceptance_apart <= 1)).all()
    assert ((df.E_apart >= 1) & (df.E_apart <= df.k + 1)).all()
    model = disk_cost_model(inputs, disk=disk, read_mb_s=RATE if disk == "cold" else None,
                            acceptances=tuple(df.acceptance_apart), ks=(1, 2))
    for r in df.itertuples():
        step = model[(model.k == r.k) & (model.acceptance == r.acceptance_apart)].step_cost_ratio.iloc[0]
        assert r.cost_per_verify_step - r.k * r.c == pytest.approx(step)
