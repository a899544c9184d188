"""The mechanism, right (issue 59, item 6): lesson 1's disk formula is the code's, lesson 0 prints the union that
independent routing predicts beside the measured one, lesson 1 prints tiny-moe's experts per verify beside its curve,
and the break-even exercise names two plausible mistakes."""
from __future__ import annotations

import json
import math

import pytest

from lessonkit.exercises import break_even_checks as be_check
from lessonkit.lessons.engine import independent_union
from lessonkit.measure.break_even import disk_cost_model
from tests.exercise_util import ROOT, exercise_functions, run, solution_functions

NB = "01_speculative"


def _cells(nb: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads((ROOT / "notebooks" / f"{nb}.ipynb").read_text())["cells"]]


# ---------------------------------------------------------------- the formula shown is the code's
def _inputs():
    reads = {}
    for b in (2, 32):
        for r in (1, 2, 3, 5):
            reads[(b, r, "accepted")] = (4.0 + r) * (3 if b == 2 else 0)
            reads[(b, r, "rejected")] = (5.0 + 1.5 * r) * (3 if b == 2 else 0)
    return {"T_s": {1: 0.004, 2: 0.0046, 3: 0.005, 5: 0.0061}, "reads_per_forward": reads, "step_overhead_s": 0.001,
            "loop_s": {1: 0.001, 2: 0.0013, 3: 0.0016, 5: 0.0019},
            "prefill_s": 0.02, "prefill_reads": {2: 30.0, 32: 0.0}, "budgets": [2, 32], "new_tokens": 24,
            "total_experts": 32, "page_cache_read_s": 2e-4, "read_bytes": 1 << 20}


def _as_written(inp, b, a, k, t_read):
    """Lesson 1 section 5's formula, transcribed from its markdown."""
    T, R, o, n = inp["T_s"], inp["reads_per_forward"], inp["loop_s"], inp["new_tokens"]
    P = inp["prefill_s"] + inp["prefill_reads"][b] * t_read
    e = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0
    r_a = a * R[(b, k + 1, "accepted")] + (1 - a) * R[(b, k + 1, "rejected")]
    return ((P + (n - 1) * (T[1] + o[1] + R[(b, 1, "accepted")] * t_read))
            / (P + (n - 1) / e * (T[k + 1] + o[k + 1] + r_a * t_read)))


def test_lesson_1_disk_formula_is_the_codes():
    section = next(c for c in _cells(NB) if c.startswith("## 5. When disk-bound"))
    assert "T(1) + o(1) + R(1, B) t_read" in section and "T(k+1) + o(k+1) + R_a(k+1, B) t_read" in section
    assert "R_a = a R_accepted + (1 - a) R_rejected" in section and "E(a, k) = (1 - a^(k+1))/(1 - a)" in section
    inp = _inputs()
    df = disk_cost_model(inp, disk="warm", ks=(1, 2, 4))
    t_read = inp["page_cache_read_s"]
    for r in df.itertuples():
        assert r.speedup == pytest.approx(_as_written(inp, r.budget_experts,
                                                      r.acceptance, r.k, t_read), rel=1e-12)


def test_a_formula_with_one_loop_overhead_is_caught():
    """The check can fail: pricing a verify step's loop at the decode step's o(1) (the formula before) differs."""
    inp = _inputs()
    r = disk_cost_model(inp, disk="warm", ks=(4,)).query("budget_experts == 2 and acceptance == 0.5").iloc[0]
    one_o = dict(inp, loop_s={k: inp["loop_s"][1] for k in inp["loop_s"]})
    assert not math.isclose(r.speedup, _as_written(one_o, 2, 0.5, 4, inp["page_cache_read_s"]), rel_tol=1e-3)
    assert r.speedup == pytest.approx(_as_written(inp, 2, 0.5, 4, inp["page_cache_read_s"]), rel=1e-12)


def test_a_formula_without_the_rejected_rows_is_caught():
    """The check can fail: the formula as lesson 1 showed it before (one R per row count) differs from the code."""
    inp = _inputs()
    df = disk_cost_model(inp, disk="warm", ks=(2,))
    r = df[(df.budget_experts == 2) & (df.acceptance == 0.5)].iloc[0]
    T, R, n, t = inp["T_s"], inp["reads_per_forward"], inp["new_tokens"], inp["page_cache_read_s"]
    P = inp["prefill_s"] + inp["prefill_reads"][2] * t
    old = (P + (n - 1) * (T[1] + R[(2, 1, "accepted")] * t)) / (P + (n - 1) / 1.75 * (T[3] + R[(2, 3, "accepted")] * t))
    assert not math.isclose(r.speedup, old, rel_tol=1e-3)


# ---------------------------------------------------------------- union and experts per verify
def test_independent_union():
    assert independent_union(4, 8, 2, 1) == pytest.approx(8)                 # one row: top-2 in each of 4 layers
    assert independent_union(4, 8, 2, 1000) == pytest.approx(32)             # many rows: every expert
    assert independent_union(4, 8, 2, 2) == pytest.approx(4 * 8 * (1 - 0.75 ** 2))


def test_lessons_print_the_mechanism_beside_the_curve():
    l0 = "\n".join(_cells("00_engine"))
    assert "independent_routing_per_forward" in l0 and "routed independently" in l0
    l1 = _cells(NB)
    assert any("measure.experts_per_forward(" in c for c in l1)
    section2 = next(c for c in l1 if c.startswith("## 2. The formula"))
    assert "tiny-moe** is float32" in section2 and "union" in section2


def test_experts_per_forward_grows_with_rows(tiny_moe=None):
    from lessonkit.measure.speculative import experts_per_forward
    from lessonkit.models.registry import load_model
    try:
        target = load_model("tiny-moe")
    except Exception as e:  # noqa: BLE001 - a checkout without the trained model
        pytest.skip(f"tiny-moe not available: {e}")
    prompt = target.encode("def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, x):")
    got = experts_per_forward(target, prompt, rows=(1, 3, 5))
    c = target.config
    assert got[1] == c.n_layers * c.top_k and got[1] <= got[3] <= got[5] <= c.n_layers * c.n_experts


# ---------------------------------------------------------------- the break-even exercise
def be_no_draft_cost(v, c, k):
    return be_check.MISTAKES["no_draft_cost"][1](v, c, k)


def be_no_bonus(v, c, k):
    return be_check.MISTAKES["no_bonus_token"][1](v, c, k)


def test_break_even_stub_fails_solution_passes():
    ok, out = run(be_check.break_even, exercise_functions(NB)["break_even"])
    assert ok is False and "not implemented" in out
    ok, out = run(be_check.break_even, solution_functions(NB)["break_even"])
    assert ok is True and "passed all" in out, out


@pytest.mark.parametrize("wrong, words", [(be_no_draft_cost, "leaves out the draft cost"),
                                          (be_no_bonus, "leaves out the bonus token")])
def test_break_even_names_two_plausible_mistakes(wrong, words):
    ok, out = run(be_check.break_even, wrong)
    assert ok is False and words in out, out
