"""lessonkit.speculative.states: a drafter that reads the target's states gets them from the target's own forward,
the same bits as forward(return_hidden=...) and forward(taps=...); the speculative loop hands it every position it
runs; a composite drafter hands each part its own slots; nothing patches the target's forward."""
from __future__ import annotations

import pytest
import torch

from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import Draft, NGramDrafter
from lessonkit.speculative.first_of import FirstOf
from lessonkit.speculative.states import forward_for, union_of
from lessonkit.speculative.verify import speculative_generate

torch.set_num_threads(1)


class Recorder:
    """A drafter that drafts nothing and keeps every state row it is handed, by position."""

    def __init__(self, taps, name="rec"):
        self.needs_states, self.name, self.rows = taps, name, {}

    def reset(self, prompt_ids):
        self.rows = {}

    def record(self, start, states):
        for i, row in enumerate(states):
            self.rows[start + i] = row.clone()

    def propose(self, context, k):
        return Draft([])

    def update(self, context, num_accepted):
        pass


@pytest.fixture(scope="module")
def sm():
    return load_model("smollm2-135m")


def test_each_part_gets_its_own_slots_of_the_same_bits(sm):
    ids = sm.encode("def add(a, b):\n    return a + b\n\nprint(add(")
    last, mid, none = Recorder(()), Recorder((4, 15)), NGramDrafter()
    both = FirstOf([(none, 2), (last, 1), (mid, 1)])
    assert both.needs_states == union_of([last, mid]) == (4, 15) and union_of([none]) is None
    logits = forward_for(both, sm, ids, sm.new_cache(40))
    plain, top = sm.forward(ids, sm.new_cache(40), return_hidden=True)
    _, _, tapped = sm.forward(ids, sm.new_cache(40), taps=(4, 15))
    assert torch.equal(logits, plain)
    for p in range(len(ids)):
        assert torch.equal(last.rows[p], top[p:p + 1].float())
        assert torch.equal(mid.rows[p], torch.stack([tapped[0][p], tapped[1][p], top[p].float()]))
    assert torch.equal(forward_for(none, sm, ids, sm.new_cache(40)), plain)


def test_the_loop_hands_every_position_it_runs(sm):
    prompt = sm.encode("The capital of France is")
    rec = Recorder((8,))
    r = speculative_generate(sm, FirstOf([(NGramDrafter(), 1), (rec, 1)]), prompt, 12, k=3, use_eos=False)
    assert r.token_ids == generate(sm, prompt, 12, use_eos=False).token_ids
    assert sorted(rec.rows) == list(range(len(prompt) + len(r.token_ids) - 1))
    _, top, tapped = sm.forward(prompt, sm.new_cache(len(prompt)), taps=(8,))
    assert all(torch.equal(rec.rows[p], torch.stack([tapped[0][p], top[p].float()])) for p in range(len(prompt)))
    assert "forward" not in vars(sm)
