"""The suffix drafter's reset keeps what the previous request shares with the new prompt (SuffixTrie.truncate) instead
of building the request's trie anew: every draft, trie and output must be the ones a trie built from scratch gives."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.suffix import SuffixDrafter, SuffixTrie
from lessonkit.speculative.suffix_store import SuffixStore
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.structured import structured_prompts

KEY = {"model": "m", "fingerprint": "f" * 64, "tokenizer": "t" * 64, "numerics": "exact", "vocab_size": 1000}
COST = [1.0 + 0.1 * j for j in range(9)]


class Fresh(SuffixDrafter):
    """The reference: every reset builds the request's trie from scratch (what reset did before it kept a prefix)."""

    def _kept(self, seen, prompt):
        return 0


def shape(trie, node=None):
    """A trie (below `node`, the root by default) as nested lists, children in their dict order (the order decides
    ties between equal counts): node numbers left out, which a trie that freed nodes hands out again in another order."""
    node = trie.root if node is None else node
    return [(t, trie.count[c], shape(trie, c)) for t, c in (trie.kids[node] or {}).items()]


def _same_state(a: SuffixDrafter, b: SuffixDrafter):
    assert a.seen == b.seen and a.prompt_len == b.prompt_len
    assert shape(a.trie) == shape(b.trie) and a.trie.nodes == b.trie.nodes
    assert [shape(a.trie, n) for n in a.frontier] == [shape(b.trie, n) for n in b.frontier]
    assert [a.trie.count[n] for n in a.frontier] == [b.trie.count[n] for n in b.frontier]
    if a.store is not None:         # each drafter has its own store, which learnt the same outputs
        assert shape(a.store.trie) == shape(b.store.trie)
        assert [shape(a.store.trie, n) for n in a.store_match] == [shape(b.store.trie, n) for n in b.store_match]
        assert [a.store.trie.count[n] for n in a.store_match] == [b.store.trie.count[n] for n in b.store_match]


def _serve(drafters, requests, k=4):
    """Each (prompt, output) request through every drafter the way speculative_generate drives it (reset, then
    propose / update as the context grows, finish): the drafts of all drafters, which must be equal."""
    drafts = []
    for prompt, output in requests:
        for d in drafters:
            d.reset(prompt)
            d._catch_up(list(prompt))        # the prompt is indexed when a draft is first asked for
        _same_state(*drafters)
        ctx = list(prompt)
        for t in output:
            step = [list(d.propose(ctx, k).tokens) for d in drafters]
            assert all(s == step[0] for s in step), (prompt, ctx, step)
            drafts.append(step[0])
            ctx.append(t)
            for d in drafters:
                d.update(ctx, 0)
        for d in drafters:
            d.finish()
        _same_state(*drafters)
    return drafts


def _pair(cost, max_tokens):
    """(reusing, fresh) drafters, each with its own learning store (they learn the same outputs)."""
    return [cls(SuffixStore(None, KEY, max_tokens=max_tokens), cost=cost) for cls in (SuffixDrafter, Fresh)]


tokens = st.lists(st.integers(0, 3), max_size=40)


@st.composite
def requests(draw):
    """Requests behind a shared prefix, mixed with unrelated ones, prefixes of the previous prompt and empty ones."""
    prefix = draw(st.lists(st.integers(0, 3), min_size=1, max_size=60))
    out, prev = [], []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["shared", "shared", "other", "prefix_of_previous", "empty"]))
        if kind == "shared":
            prompt = prefix + draw(tokens)
        elif kind == "other":
            prompt = draw(tokens)
        elif kind == "prefix_of_previous":
            prompt = prev[:draw(st.integers(0, len(prev)))]
        else:
            prompt = []
        out.append((prompt, draw(st.lists(st.integers(0, 3), max_size=12))))
        prev = prompt
    return out


@settings(max_examples=150, deadline=None, database=None)
@given(reqs=requests(), cost=st.sampled_from([None, COST]), max_tokens=st.sampled_from([30, 10**6]),
       depth=st.sampled_from([3, 24]))
def test_drafts_and_tries_equal_a_trie_built_from_scratch(reqs, cost, max_tokens, depth):
    a, b = (cls(SuffixStore(None, KEY, max_tokens=max_tokens), cost=cost, depth=depth, max_match=2)
            for cls in (SuffixDrafter, Fresh))
    _serve([a, b], reqs)
    assert a.sources == b.sources and a.acceptance == b.acceptance


def test_the_named_cases_and_that_the_prefix_is_kept():
    a, b = _pair(None, 10**6)
    prefix = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5] * 6
    reqs = [(prefix + [7, 1, 2], [3, 1, 2, 3]), (prefix + [8, 1], [2, 3, 1, 2])]
    _serve([a, b], reqs)
    trie = a.trie
    _serve([a, b], [(prefix + [9], [1, 2, 3])])
    assert a.trie is trie                                           # kept, not built anew
    _serve([a, b], [(prefix[:20], [1, 2])])                         # a prefix of the previous prompt
    _serve([a, b], [([6, 6, 5, 6], [6, 5])])                        # shares nothing: built anew
    assert a.trie is not trie
    _serve([a, b], [([], [1, 2, 1, 2]), ([], []), (prefix, [1, 2, 3])])     # empty prompts
    _serve([a, b], [(prefix + [7], [1, 2]), (prefix + [7, 1], [2, 3])])


def test_requests_of_two_kinds_taking_turns_go_on_from_their_own_kinds_trie():
    """Requests behind two system prompts, taking turns (bench suffix's families): each goes on from the trie its own
    kind left (parked while the other kind ran), never from scratch; drafts and tries equal a fresh build's (_serve)."""
    a, b = _pair(COST, 10**6)
    p1, p2 = [1, 2, 3, 1, 2, 4] * 8, [5, 6, 7, 5, 6, 8] * 8
    _serve([a, b], [(p1 + [9], [1, 2, 3])])
    t1 = a.trie
    _serve([a, b], [(p2 + [9], [5, 6])])
    t2 = a.trie
    assert t2 is not t1
    _serve([a, b], [(p1 + [7, 1], [2, 3])])
    assert a.trie is t1
    _serve([a, b], [(p2 + [7], [5]), (p1, [1]), (p2 + [1], [5])])
    assert a.trie is t2 and len(a.parked) <= 4


def test_truncate_leaves_the_trie_of_the_kept_text():
    text = [1, 2, 1, 2, 3, 1, 2, 1, 2, 3, 4, 1]
    for keep in range(1, len(text) + 1):
        for depth in (2, 3, 5, 24):
            trie = SuffixTrie(depth)
            frontier = [trie.root]
            for t in text:
                frontier = trie.extend(frontier, t)
            want = SuffixTrie(depth)
            wf = [want.root]
            for t in text[:keep]:
                wf = want.extend(wf, t)
            got = trie.truncate(text, keep)
            assert shape(trie) == shape(want) and trie.nodes == want.nodes, (keep, depth)
            assert [shape(trie, n) for n in got] == [shape(want, n) for n in wf] and len(got) == len(wf)
            assert len(trie.count) - len(trie.free) == trie.nodes              # every freed number is on the list


@pytest.mark.parametrize("cost", [None, COST])
def test_outputs_and_drafts_over_requests_behind_one_prompt_equal_a_fresh_trie(cost):
    target = load_model("smollm2-135m")
    base, other = structured_prompts(target, "heldout", 1, families=("records", "scoring"))[:2]
    prompts = [base, base + other[-12:], base + other[-30:-20], base[:60],      # behind one prompt; a prefix of it
               other, base + other[-12:]]                                       # unrelated; a repeat
    a, b = _pair(cost, 10**6)
    for p in prompts:
        ref = generate(target, p, 12).token_ids
        ra, rb = (speculative_generate(target, d, p, 12, k=4) for d in (a, b))
        assert ra.token_ids == rb.token_ids == ref
        assert ra.stats["num_draft_tokens"] == rb.stats["num_draft_tokens"]
        assert ra.stats["forwards"] == rb.stats["forwards"]
        _same_state(a, b)
