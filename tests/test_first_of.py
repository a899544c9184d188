"""speculative.first_of under the utility gate: the parts that size their own drafts (own_depth) draft at up to the
loop's widest depth outside the gate, the gate picks the depth only for the rest and counts only their steps, a
shorter own match drafts where the gate's step drafts nothing, and the output is plain greedy's whatever drafts."""
from __future__ import annotations

import pytest
import torch

from lessonkit.engine.generate import generate
from lessonkit.errors import LessonkitError
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.first_of import FirstOf
from lessonkit.speculative.verify import speculative_generate

torch.set_num_threads(1)
N = 24


class Scripted:
    """Drafts the reference continuation: `lengths[step % len]` tokens of it (a free match that is there or not),
    or, with lengths None, as many as it is asked (a learned drafter); keeps the depth of every ask."""

    def __init__(self, name, reference, lengths=None, wrong_from=None):
        self.name, self.reference, self.lengths, self.wrong_from, self.asked = name, reference, lengths, wrong_from, []

    def reset(self, prompt_ids):
        self.asked = []

    def propose(self, context, k):
        m = k if self.lengths is None else min(k, self.lengths[len(self.asked) % len(self.lengths)])
        self.asked.append(k)
        toks = self.reference[len(context):len(context) + m]
        if self.wrong_from is not None:           # from here on every draft is wrong
            toks = toks[:self.wrong_from] + [(t + 1) % 1000 for t in toks[self.wrong_from:]]
        return Draft(toks)

    def update(self, context, num_accepted):
        pass


@pytest.fixture(scope="module")
def sm():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def case(sm):
    prompt = sm.encode('{"host": "db1", "level": "warn", "msg": "disk full"}\nRewrite as one line of key=value pairs:')
    return prompt, generate(sm, prompt, N, use_eos=False).token_ids


def run(sm, prompt, drafter, k, steep=False):
    cost = [1.0 + (20.0 if steep else 0.1) * r for r in range(9)]     # steep: no depth of the learned part pays
    return speculative_generate(sm, drafter, prompt, N, k=k, use_eos=False, cost=cost, learn_cost=False)


def test_own_parts_draft_at_the_widest_depth_outside_the_gate(sm, case):
    prompt, plain = case
    ref = prompt + plain
    free, learned = Scripted("free", ref, lengths=[6, 0, 0]), Scripted("learned", ref)
    r = run(sm, prompt, FirstOf([(free, 2), (learned, 1)], own_depth=1), "auto", steep=True)
    assert r.token_ids == plain
    assert free.asked[0] == max(free.asked) == 8              # asked at the gate's k_max, not its depth (later: room)
    assert r.stats["drafts_by"]["free"] > 0
    gated = r.stats["gate"]["steps"]          # every step the free part did not draft is the gate's (a plain run's too)
    assert gated == r.stats["forwards"] - 1 - r.stats["drafts_by"]["free"]
    assert len(learned.asked) <= gated - r.stats["gate"]["plain_steps"]


def test_without_own_depth_the_gate_caps_the_free_part(sm, case):
    prompt, plain = case
    ref = prompt + plain
    free, learned = Scripted("free", ref, lengths=[6, 0, 0]), Scripted("learned", ref)
    r = run(sm, prompt, FirstOf([(free, 2), (learned, 1)]), "auto", steep=True)
    assert r.token_ids == plain
    assert max(free.asked) < 8                                # every ask is the gate's depth
    mine = run(sm, prompt, FirstOf([(Scripted("free", ref, lengths=[6, 0, 0]), 2), (Scripted("learned", ref), 1)],
                                   own_depth=1), "auto", steep=True)
    assert mine.stats["forwards"] < r.stats["forwards"]       # drafting past the gate's k = 0 verifies fewer times


def test_a_short_own_match_drafts_where_the_gate_drafts_nothing(sm, case):
    prompt, plain = case
    ref = prompt + plain
    free = Scripted("free", ref, lengths=[1])                 # always one token: below its min_tokens of 2
    learned = Scripted("learned", ref)
    r = run(sm, prompt, FirstOf([(free, 2), (learned, 1)], own_depth=1), "auto", steep=True)
    assert r.token_ids == plain
    by = r.stats["drafts_by"]
    assert by["free"] + by["learned"] == r.stats["num_drafts"]
    assert by["free"] > sum(1 for k in free.asked if k < 2)   # long enough only where the room is one token


def test_a_wrong_own_draft_changes_no_token(sm, case):
    prompt, plain = case
    ref = prompt + plain
    free = Scripted("free", ref, lengths=[8, 3], wrong_from=1)
    r = run(sm, prompt, FirstOf([(free, 2), (Scripted("learned", ref), 1)], own_depth=1), "auto")
    assert r.token_ids == plain and r.stats["num_accepted_tokens"] < r.stats["num_draft_tokens"]


def test_at_a_fixed_depth_own_depth_changes_nothing(sm, case):
    prompt, plain = case
    ref = prompt + plain
    runs = []
    for own in (0, 1):
        free, learned = Scripted("free", ref, lengths=[6, 1, 0]), Scripted("learned", ref)
        r = run(sm, prompt, FirstOf([(free, 2), (learned, 1)], own_depth=own), 3)
        runs.append((r.token_ids, r.stats["forwards"], r.stats["drafts_by"], free.asked, learned.asked))
    assert runs[0] == runs[1] and runs[0][0] == plain and set(runs[0][3]) <= {3, 2, 1}


def test_own_depth_past_the_parts_is_refused():
    with pytest.raises(LessonkitError, match="own_depth=3"):
        FirstOf([(object(), 2), (object(), 1)], own_depth=3)


def test_the_gate_switches_free_parts_off_where_they_do_not_pay(sm, case):
    prompt, plain = case
    ref = prompt + plain
    wrong = Scripted("free", ref, lengths=[8], wrong_from=0)     # deep drafts, every one wrong
    r = run(sm, prompt, FirstOf([(wrong, 2), (Scripted("learned", ref), 1)], own_depth=1), "auto")
    assert r.token_ids == plain
    # three steps measured (1 token each at T(9) = 1.8 T(1) in the cost model: utility 0.56), then off for 16
    assert len(wrong.asked) == 3 and r.stats["gate"]["free_utility"] < 1
    right = Scripted("free", ref, lengths=[8])
    r = run(sm, prompt, FirstOf([(right, 2), (Scripted("learned", ref), 1)], own_depth=1), "auto")
    assert r.token_ids == plain and r.stats["gate"]["free_utility"] > 1 and r.stats["drafts_by"]["free"] >= 3


def test_auto_drafts_with_the_head_where_experts_stream_from_disk():
    """--draft auto's learned part for tiny-moe: tiny-draft with every expert in memory, the feature head where the
    experts stream from disk (a budget below all of them): the drafter that paid in each regime."""
    from lessonkit.drafter_registry import auto_drafter, streams_experts
    from lessonkit.feature_head.drafter import FeatureHeadDrafter
    from lessonkit.models.registry import load_model
    from lessonkit.speculative.drafters import ModelDrafter
    from lessonkit.speculative.suffix import SuffixDrafter
    in_ram, on_disk = load_model("tiny-moe"), load_model("tiny-moe", expert_budget_mb=2)
    assert not streams_experts(in_ram) and streams_experts(on_disk)
    learned = {name: auto_drafter(eng, SuffixDrafter(None, learn=False)).drafters[1][0]
               for name, eng in (("ram", in_ram), ("disk", on_disk))}
    assert isinstance(learned["ram"], ModelDrafter) and isinstance(learned["disk"], FeatureHeadDrafter)
    assert not streams_experts(load_model("tiny-moe", expert_budget_mb=10_000))     # a budget that holds them all


def test_a_free_part_that_never_matches_pays_for_its_lookups(sm, case):
    """Steps on which the free part was asked and nothing drafted are counted as its steps (its lookups cost them),
    so the gate measures its utility and can switch it off, rather than charging them to k = 0."""
    prompt, plain = case
    ref = prompt + plain
    d = FirstOf([(Scripted("free", ref, lengths=[0]), 2), (Scripted("learned", ref, wrong_from=0), 1)], own_depth=1)
    r = run(sm, prompt, d, "auto", steep=True)
    assert r.token_ids == plain
    assert r.stats["drafts_by"]["free"] == 0 and r.stats["gate"]["free_utility"] is not None
