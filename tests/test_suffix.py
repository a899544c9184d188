"""The suffix drafter (issue 58): the trie counts what it holds, drafts are the most frequent continuation,
output equals plain greedy with the store empty, warm and reloaded (both numerics, threads 1 and 2, two
processes one after the other), and a bad store file (foreign, truncated, corrupt, oversized, a writer killed
mid-save) is refused by name or left whole."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lessonkit.engine import active, kernel
from lessonkit.engine.generate import generate
from lessonkit.errors import LessonkitError
from lessonkit.files.atomic import TMP_PREFIX
from lessonkit.models.registry import load_model
from lessonkit.speculative.suffix import SuffixDrafter, SuffixTrie, best_depth, greedy_path, spec_depth
from lessonkit.speculative.suffix_store import SuffixStore, store_key
from lessonkit.speculative.verify import speculative_generate
from lessonkit.drafter_registry import make_drafter
from lessonkit.workloads.structured import FAMILIES, HELDOUT_EVERY, structured_prompts, structured_requests

ROOT = Path(__file__).resolve().parents[1]
KEY = {"model": "m", "fingerprint": "f" * 64, "tokenizer": "t" * 64, "numerics": "exact", "vocab_size": 1000}
MAX_NEW = 20


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("LESSONKIT_HOME", str(h))
    return h


# ---- the structure --------------------------------------------------------------------------------------------
def _walk(trie, seq):
    """The node of `seq` in `trie`, or None."""
    node = trie.root
    for t in seq:
        node = (trie.kids[node] or {}).get(t)
        if node is None:
            return None
    return node


def _count(trie, seq) -> int:
    node = _walk(trie, seq)
    return 0 if node is None else trie.count[node]


def test_trie_counts_every_substring_and_remove_undoes_add():
    rng = random.Random(0)
    seqs = [[rng.randrange(4) for _ in range(rng.randint(1, 30))] for _ in range(6)]
    trie = SuffixTrie(depth=5)
    for s in seqs:
        trie.add(s)
    want = Counter(tuple(s[i:j]) for s in seqs for i in range(len(s)) for j in range(i + 1, min(i + 5, len(s)) + 1))
    assert trie.nodes == 1 + len(want)
    for sub, n in want.items():
        assert _count(trie, sub) == n, sub
    for s in seqs[:3]:
        trie.remove(s)
    rebuilt = SuffixTrie(depth=5)
    for s in seqs[3:]:
        rebuilt.add(s)
    assert trie.nodes == rebuilt.nodes
    for sub in want:
        assert _count(trie, sub) == _count(rebuilt, sub), sub


def test_a_trie_is_invisible_to_the_garbage_collector():
    """However many nodes, a trie adds a handful of objects to the ones Python's cyclic collector walks (a full pass
    over a warm store's nodes, one object each, took 83 ms inside a request's drafting)."""
    import gc
    rng = random.Random(1)
    trie = SuffixTrie(depth=24)
    before = len(gc.get_objects())
    for _ in range(20):
        trie.add([rng.randrange(50) for _ in range(60)])
    assert trie.nodes > 10_000
    assert len(gc.get_objects()) - before < 50


def test_draft_is_the_most_frequent_continuation_and_its_depth_follows_the_match():
    store = SuffixStore(None, KEY)
    for out in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 9]):
        store.add(out)
    d = SuffixDrafter(store, learn=False, alpha=1.0, min_prob=0.1)
    d.reset([7, 8])
    assert d.propose([7, 8, 1, 2], 8).tokens == [3, 4]          # match "1 2": two drafts (alpha * 2), 3 beats 9
    assert d.propose([7, 8, 1, 2, 3, 4], 8).tokens == [5]       # "1 2 3 4" went on with 5 only (and the output ended)
    toks, score = greedy_path(store.trie, _walk(store.trie, [1, 2]), 8, min_prob=0.0)
    assert toks == [3, 4, 5] and score == pytest.approx(3 * 2 / 3)
    assert spec_depth(1, 8, 1.0) == 1 and spec_depth(20, 8, 1.0) == 8 and spec_depth(3, 8, 2.0) == 6
    d.reset([5, 6, 7, 5, 6])                                    # the request: "5 6" went on with 7 before
    assert d.propose([5, 6, 7, 5, 6], 8).tokens == [7, 5]
    strict = SuffixDrafter(store, learn=False, alpha=1.0, min_prob=0.7)
    strict.reset([7, 8])
    assert strict.propose([7, 8, 1, 2], 8).tokens == []          # 3 follows "1 2" 2 times in 3: below 0.7


def test_cost_aware_depth_cuts_where_tokens_per_verify_second_peak_and_learns_acceptance():
    assert best_depth([0.9] * 4, [1.0] * 5) == (4, 1 + 0.9 + 0.81 + 0.729 + 0.6561)   # free rows: all of it
    assert best_depth([0.9] * 4, [1.0, 3.0, 5.0, 7.0, 9.0])[0] == 0                    # dear rows: none
    assert best_depth([1.0, 1.0, 0.1, 1.0], [1.0, 1.2, 1.4, 1.6, 1.8])[0] == 2          # stop before the unsure one
    assert best_depth([1.0] * 8, [1.0, 1.1, 1.2])[0] == 2                              # no deeper than the curve
    store = SuffixStore(None, KEY)
    for out in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6]):
        store.add(out)
    d = SuffixDrafter(store, learn=False, cost=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
    d.reset([7, 1, 2])
    assert d.propose([7, 1, 2], 8).tokens == [3, 4]            # 5 or 6 after "3 4": it went two ways, cut there
    before = {key: list(v) for key, v in d.acceptance.items()}
    d.update([7, 1, 2, 3, 9], 1)                               # the target emitted 3 (accepted), then 9 (not 4)
    # 3 followed a 2-token match, 4 a 3-token context: each learns in its own match bucket
    assert d.acceptance[("store", True, 0)] == [before[("store", True, 0)][0] + 1, before[("store", True, 0)][1] + 1]
    assert d.acceptance[("store", True, 1)] == [before[("store", True, 1)][0], before[("store", True, 1)][1] + 1]
    # a bucket that saw nothing borrows its source's rate over all lengths (1 of 2 here, on a prior of 0.8 x 4)
    assert d._rate(("store", True, 2)) == pytest.approx((0.8 * 4 + 1) / (4 + 2))
    with pytest.raises(LessonkitError, match="cost"):
        SuffixDrafter(store, cost=[1.0])


def test_the_store_keeps_its_newest_outputs_within_its_bound():
    store = SuffixStore(None, KEY, max_tokens=10)
    for i in range(6):
        store.add([i] * 4)
    assert list(store.outputs) == [[4] * 4, [5] * 4] and store.n_tokens == 8
    fresh = SuffixTrie(store.trie.depth)
    fresh.add([4] * 4)
    fresh.add([5] * 4)
    assert store.trie.nodes == fresh.nodes and _walk(store.trie, [0]) is None
    store.add(list(range(11)))                                  # longer than the bound: not kept
    assert store.n_tokens == 8


# ---- lossless -------------------------------------------------------------------------------------------------
def _check_equal(target, drafter, prompts, refs, **kw):
    """Speculative output == plain greedy's (refs: prompt -> plain tokens, filled on first use); drafts made."""
    drafted = 0
    for p in prompts:
        if tuple(p) not in refs:
            refs[tuple(p)] = generate(target, p, MAX_NEW).token_ids
        ref = refs[tuple(p)]
        r = speculative_generate(target, drafter, p, MAX_NEW, **kw)
        assert r.token_ids == ref
        drafted += r.stats["num_draft_tokens"]
    return drafted


@pytest.mark.parametrize("numerics", ["exact", "int8"])
@pytest.mark.parametrize("threads", [1, 2])
def test_output_is_plain_greedy_with_the_store_empty_warm_and_reloaded(home, tmp_path, numerics, threads):
    old = kernel.THREADS
    kernel.set_threads(threads)
    try:
        with active.use(numerics=numerics):
            target = load_model("smollm2-135m")
            held = structured_prompts(target, "heldout", 1, families=("records", "scoring"))
            train = structured_prompts(target, "train", 1)
            store, refs = SuffixStore.for_target(target, tmp_path / "store"), {}
            assert len(store) == 0
            _check_equal(target, SuffixDrafter(store, learn=False), held, refs, k=8)        # empty store
            _check_equal(target, SuffixDrafter(store), train, refs, k=4)                    # warms it
            assert len(store) == len(train)
            _check_equal(target, SuffixDrafter(store, learn=False), held, refs, k=8)        # warm
            store.save()
            again = SuffixStore.for_target(target, tmp_path / "store")                     # after a restart
            assert list(again.outputs) == list(store.outputs) and again.key["numerics"] == numerics
            assert _check_equal(target, SuffixDrafter(again, learn=False), held, refs, k="auto",
                                cost=[1.0 + 0.2 * j for j in range(9)], learn_cost=False) > 0
            costed = SuffixDrafter(again, learn=False, cost=[1.0 + 0.1 * j for j in range(9)])   # cost-aware depth
            assert _check_equal(target, costed, held + train, refs, k=8) > 0
    finally:
        kernel.set_threads(old)


CHILD = r"""
import json, sys
from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.speculative.suffix_store import SuffixStore
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.structured import structured_prompts
folder, split = sys.argv[1], sys.argv[2]
target = load_model("smollm2-135m")
store = SuffixStore.for_target(target, folder)
before = len(store)
d = SuffixDrafter(store, autosave=True)
same = []
for p in structured_prompts(target, split, 1):
    same.append(speculative_generate(target, d, p, 16, k=8).token_ids == generate(target, p, 16).token_ids)
print(json.dumps({"before": before, "after": len(SuffixStore.for_target(target, folder)), "same": same}))
"""


def _child(folder, split, home):
    env = {**os.environ, "LESSONKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", CHILD, str(folder), split], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_two_processes_share_the_store_one_after_the_other(home, tmp_path):
    first = _child(tmp_path / "store", "train", home)
    second = _child(tmp_path / "store", "heldout", home)
    n = len(FAMILIES)
    assert first == {"before": 0, "after": n, "same": [True] * n}
    assert second == {"before": n, "after": 2 * n, "same": [True] * n}


def test_the_stack_names_it(home, tmp_path):
    target = load_model("smollm2-135m")
    d = make_drafter(f"suffix:{tmp_path / 'dir'}", target)
    assert isinstance(d, SuffixDrafter) and d.store.path.parent == tmp_path / "dir" and d.autosave
    p = structured_prompts(target, "train", 1)[0]
    speculative_generate(target, d, p, 8, k=4)
    assert len(SuffixStore.for_target(target, tmp_path / "dir")) == 1          # saved at the end of the run


# ---- faults ---------------------------------------------------------------------------------------------------
def _saved(path, outputs, key=KEY, **kw):
    store = SuffixStore(path, key, **kw)
    for out in outputs:
        store.add(out)
    store.save()
    return store


def _refused(path, key=KEY, **kw) -> str:
    with pytest.raises(LessonkitError) as e:
        SuffixStore(path, key, **kw).load()
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    return msg


def test_a_truncated_or_corrupt_store_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "s.suffix"
    _saved(path, [[1, 2, 3], [4, 5, 6, 7]])
    whole = path.read_bytes()
    for cut in (3, 11, 40, len(whole) - 1):
        path.write_bytes(whole[:cut])
        msg = _refused(path)
        assert "truncated" in msg or "corrupt" in msg, (cut, msg)
    flipped = bytearray(whole)
    flipped[-2] ^= 1
    path.write_bytes(bytes(flipped))
    assert "checksum" in _refused(path)
    path.write_bytes(b"not a store at all")
    assert "bad magic" in _refused(path)
    path.write_bytes(whole)
    assert "oversized" in _refused(path, max_tokens=5)
    assert list(_load(path).outputs) == [[1, 2, 3], [4, 5, 6, 7]]


def _load(path, key=KEY):
    s = SuffixStore(path, key)
    s.load()
    return s


@pytest.mark.parametrize("field", ["model", "tokenizer", "numerics", "fingerprint"])
def test_a_foreign_store_is_refused_by_name(tmp_path, field):
    path = tmp_path / "s.suffix"
    _saved(path, [[1, 2, 3]], key={**KEY, field: "other"})
    msg = _refused(path)
    assert "foreign" in msg and field in msg


def test_another_models_store_is_refused_by_name(home, tmp_path):
    moe, sm = load_model("tiny-moe"), load_model("smollm2-135m")
    theirs = SuffixStore.for_target(moe, tmp_path / "a")
    theirs.add([1, 2, 3])
    theirs.save()
    mine = SuffixStore(tmp_path / "a" / theirs.path.name, store_key(sm))
    with pytest.raises(LessonkitError, match="foreign") as e:
        mine.load()
    assert str(theirs.path) in str(e.value)


SAVER = r"""
import os, sys, time
import lessonkit.files.atomic as atomic
from lessonkit.speculative.suffix_store import SuffixStore
def slow(fd, data):
    view = memoryview(bytes(data))
    while view:
        n = os.write(fd, view[:256])
        view = view[n:]
        time.sleep(0.002)
atomic.write_all = slow
key = {"model": "m", "fingerprint": "f" * 64, "tokenizer": "t" * 64, "numerics": "exact", "vocab_size": 1000}
store = SuffixStore(sys.argv[1], key)
store.load()
for i in range(300):
    store.add([(i * 7 + j) % 1000 for j in range(20)])
print("saving", flush=True)
store.save()
print("saved", flush=True)
"""


def test_a_writer_killed_mid_save_leaves_the_old_store_readable(tmp_path):
    path = tmp_path / "s.suffix"
    old = _saved(path, [[1, 2, 3], [4, 5]])
    before = path.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "saving"
        deadline = time.time() + 30
        while not list(tmp_path.glob(f"{TMP_PREFIX}*")) and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)                                  # inside the write (about 0.5 s of slow writes)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(tmp_path.glob(f"{TMP_PREFIX}*")), "the kill did not land inside the save"
    assert path.read_bytes() == before
    assert list(_load(path).outputs) == list(old.outputs)
    _saved(path, [[9, 9]])                                # the next writer clears the dead writer's temporary file
    assert not list(tmp_path.glob(f"{TMP_PREFIX}*")) and list(_load(path).outputs) == [[9, 9]]


# ---- the workload's split -------------------------------------------------------------------------------------
def test_no_heldout_request_is_a_training_request():
    train, held = structured_requests("train"), structured_requests("heldout")
    assert len(held) == 12 * len(FAMILIES) and len(train) == 36 * len(FAMILIES)
    assert not {r.content for r in held} & {r.content for r in train}
    assert all(r.index % HELDOUT_EVERY == HELDOUT_EVERY - 1 for r in held)
    assert all(r.split == "train" for r in train) and {r.family for r in held} == set(FAMILIES)
    with pytest.raises(LessonkitError, match="split"):
        structured_requests("test")


def test_a_batch_holds_items_of_one_split_only():
    """Batches (several items a request) keep the split: every item of a held-out batch is held out, none is in a
    training batch, and one-item requests are the same items as before batching existed."""
    train, held = structured_requests("train", 9, per_request=4), structured_requests("heldout", 3, per_request=4)
    assert len(held) == 3 * len(FAMILIES) and all(len(r.items) == 4 for r in held + train)
    assert all(i % HELDOUT_EVERY == HELDOUT_EVERY - 1 for r in held for i in r.items)
    assert not {(r.family, i) for r in held for i in r.items} & {(r.family, i) for r in train for i in r.items}
    lines = lambda reqs: {line for r in reqs if r.family != "ndjson" for line in r.content.split("\n")}
    assert not lines(held) & lines(train)
    for r in held + train:
        assert r.split == ("heldout" if r in held else "train") and r.messages()[0]["content"].startswith("You")
    singles = {(r.family, r.index) for r in structured_requests("heldout", 12)}
    assert {(r.family, i) for r in held for i in r.items} <= singles
    assert "\n" in held[0].content and held[0].content.count("\n") == 3               # four records, one a line
    with pytest.raises(LessonkitError, match="per_request"):
        structured_requests("train", 1, per_request=0)
