"""`bench spec`'s Spec-Bench-style table (lessonkit.bench.spec_table): its structured category measures the suffix
drafter against a store warmed on the structured workload's training split only, and the measurement leaves that
store as it was, so no held-out request is measured against a store holding its own earlier output; every row's
output equals plain greedy's. A tiny run: these check what is measured, never how fast."""
from __future__ import annotations

import pytest

from lessonkit.bench.spec_table import SUFFIX_K, category_table, plain_step_s, warm_suffix_store
from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import NGramDrafter
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.workloads.structured import structured_prompts

MAX_NEW = 10


@pytest.fixture(scope="module")
def target():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def warm(target):
    train = structured_prompts(target, "train", 1)
    return train, warm_suffix_store(target, train, MAX_NEW)[0]


def test_the_warm_store_holds_the_training_outputs_only(target, warm):
    train, store = warm
    held = structured_prompts(target, "heldout", 1)
    assert not {tuple(p) for p in train} & {tuple(p) for p in held}
    assert list(store.outputs) == [generate(target, p, MAX_NEW).token_ids for p in train]
    assert store.path is not None and not store.path.exists()          # its folder was a fresh temporary one


def test_the_structured_category_leaves_the_store_as_it_was_and_equals_plain(target, warm):
    store = warm[1]
    before = [list(o) for o in store.outputs]
    rows = category_table(target, {"ngram k=4": (NGramDrafter(), 4)}, per_category=1, max_new=MAX_NEW, n_rounds=1,
                          k_max=2, categories=(), structured={"suffix (warm store)": (SuffixDrafter(store, learn=False),
                                                                                       SUFFIX_K)})
    assert [(r["category"], r["drafter"]) for r in rows] == [("structured", "ngram k=4"),
                                                             ("structured", "suffix (warm store)")]
    assert all(r["identical_to_plain"] for r in rows)
    assert [list(o) for o in store.outputs] == before                   # measured with learning off
    assert rows[-1]["tokens_per_verify"] > 1                            # the warm store drafted, and was right
    for r in rows:                   # the decode phase: wall less the prefills' time to first token, both sides
        assert 0 < r["decode_speedup_spread"][0] <= r["decode_speedup"] <= r["decode_speedup_spread"][1]


def test_c_is_over_the_same_rounds_plain_decode_step():
    """c's denominator: plain greedy's decode seconds (wall less time to first token) per forward after the prefill,
    over the round's requests; the prefill's seconds and forward stay out."""
    stats = [{"wall_s": 1.0, "ttft_s": 0.2, "forwards": 5}, {"wall_s": 0.5, "ttft_s": 0.1, "forwards": 3}]
    assert plain_step_s(stats) == pytest.approx((0.8 + 0.4) / (4 + 2))


def _contender(outputs_by_round: list):
    """A contender whose outputs per round are given (after one warm-up call); its stats count its calls."""
    calls = []

    def run(p):
        calls.append(p)
        rnd = max(0, (len(calls) - 2) // 2)            # 1 warm-up call, then 2 prompts a round
        return outputs_by_round[rnd][(len(calls) - 2) % 2], {"ttft_s": 0.0, "call": len(calls)}
    return run


@pytest.mark.parametrize("bad_round", [0, 1, 2])
def test_take_turns_says_a_contender_differed_in_any_round_not_only_the_last(bad_round):
    from lessonkit.measure.speculative import take_turns
    plain = [[[1, 2], [3]]] * 3
    other = [[[1, 2], [3]] if r != bad_round else [[1, 2], [4]] for r in range(3)]
    runs = take_turns({"plain": _contender(plain), "drafter": _contender(other)}, ["a", "b"], 3)
    assert runs["plain"][2] == [[1, 2], [3]]
    assert runs["drafter"][2] == [[1, 2], [4]] and runs["drafter"][2] != runs["plain"][2]
    same = take_turns({"plain": _contender(plain), "drafter": _contender(plain)}, ["a", "b"], 3)
    assert same["drafter"][2] == same["plain"][2]


def test_take_turns_keeps_every_rounds_stats_where_asked():
    from lessonkit.measure.speculative import take_turns
    plain = [[[1], [2]]] * 3
    last = take_turns({"plain": _contender(plain)}, ["a", "b"], 3)["plain"][3]
    every = take_turns({"plain": _contender(plain)}, ["a", "b"], 3, every_round=True)["plain"][3]
    assert [s["call"] for s in last] == [6, 7]
    assert [s["call"] for s in every] == [2, 3, 4, 5, 6, 7]
