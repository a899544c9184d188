"""Lesson 1's section 2 (issue 52): the verify cost model (b + M)/(b + 1), b fitted from the 2-row step, and the
per-numerics drafter table whose speed-up is predicted from parts measured apart."""
import math

import pytest

from lessonkit.measure import numerics_paths as paths


@pytest.mark.parametrize("b", [0.0, 0.5, 3.0, 12.0])
def test_b_from_two_rows_inverts_the_cost_model(b):
    assert paths.b_from_two_rows(paths.cost_model(b, 2)) == pytest.approx(b)


def test_the_cost_model_at_its_ends():
    assert paths.cost_model(3.0, 5) == 2.0                 # docs/kernel.md: (3 + 5)/(3 + 1)
    assert paths.cost_model(0.0, 5) == 5.0                 # nothing shared: a pass per row
    assert math.isinf(paths.b_from_two_rows(1.0))          # a free second row: rows cost nothing


def test_drafter_table_predicts_from_parts_measured_apart():
    engines, notes = paths.load_on_each("tiny-moe")
    assert "exact" in engines
    cost_df, costs = paths.verify_costs(engines, k_max=2, repeats=1)
    assert set(cost_df.numerics) == set(engines) and (cost_df[cost_df.k == 0].measured == 1.0).all()
    eng = engines["exact"]
    timed, apart = [eng.encode("the cat sat on the mat. the cat sat on the")], [eng.encode("a b a b a b a b a")]
    df = paths.drafter_on_each({"exact": eng}, costs, {"n-gram": "ngram"}, timed, apart, k=2,
                               max_new_tokens=6, repeats=1)
    r = df.iloc[0]
    assert r.identical_to_plain and r.k == 2
    assert r.predicted_speedup == pytest.approx(r.E_predicted / (r.verify_cost + 2 * r.c))
    assert 1.0 <= r.E_predicted <= 3.0 and r.measured_speedup > 0


def test_the_batch_speedup_prediction_of_lesson_4():
    """Issue 52: lesson 4's batch speed-up predicted from the prefill and restore times and the cold run (issue 59:
    the uncached and warm runs it is compared with feed nothing)."""
    import pandas as pd
    from lessonkit.measure.prefix_cache import predicted_batch_speedup
    batch = pd.DataFrame([{"items": 10, "prefix tokens": 500, "total s": 99.0, "speed-up vs off": 1.0},
                          {"items": 10, "prefix tokens": 500, "total s": 1.0 + 10 * 0.1, "speed-up vs off": 1.0},
                          {"items": 10, "prefix tokens": 500, "total s": 2.2, "speed-up vs off": 5.0}])
    rvp = pd.DataFrame([{"prefix tokens": 64, "prefill s": 0.1, "restore s": 0.01},
                        {"prefix tokens": 552, "prefill s": 1.0, "restore s": 0.05}])
    p = predicted_batch_speedup(batch, rvp)
    assert p["rvp_prefix_tokens"] == 552 and p["item_s"] == pytest.approx(0.1)
    assert p["predicted"] == pytest.approx(11.0 / (0.05 + 1.0)) and p["measured"] == 5.0


def test_the_speedup_per_quantisation_scheme_of_lesson_2():
    """Issue 52: lesson 2 predicts each scheme's speed-up from its acceptance, the verify cost and the draft cost."""
    from lessonkit.measure.mtp import predicted_by_scheme
    from lessonkit.models.registry import load_model
    from lessonkit.mtp.head import load_head
    eng = load_model("tiny-moe")
    by = {"none": {"acceptance": [0.8, 0.5]}, "int4": {"acceptance": [0.1, 0.0]}}
    rows = predicted_by_scheme(eng, load_head(eng), by, {"prose": [eng.encode("the cat sat on the mat")]}, k=2,
                               max_new_tokens=6)
    none, int4 = rows
    assert none["E_predicted"] == pytest.approx(1 + 0.8 + 0.4) and int4["E_predicted"] == pytest.approx(1.1)
    assert none["predicted_speedup"] == pytest.approx(none["E_predicted"] / (none["verify_cost"] + 2 * none["c"]))
    assert none["identical_to_plain"] and int4["identical_to_plain"]
