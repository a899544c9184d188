"""Prefix-KV cache: format, provenance, longest-prefix match, LRU, crash safety, concurrency, engine."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from lessonkit.bench import bench_prefix
from lessonkit.files import atomic
from lessonkit.errors import LessonkitError
from lessonkit.engine.kv_cache import KVCache
from lessonkit.files.safe_files import sha256_file
from lessonkit.measure.prefix_cache import tiny_random_model
from lessonkit.prefix_cache.cache import PrefixCache, PrefixCacheWarning
from lessonkit.prefix_cache.generate import generate_with_prefix_cache, results_identical, score
from lessonkit.prefix_cache.snapshot import block_hashes, encode_snapshot, fingerprint

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (2, 3, 4)          # n_layers, n_kv_heads, head_dim of the fake caches


def fake_cache(token_ids, max_len=256):
    """A KVCache whose K/V are a deterministic function of the token ids (exactness is checkable)."""
    L, H, D = SHAPE
    c = KVCache(L, max_len, H, D)
    ids = torch.tensor(token_ids, dtype=torch.float32)
    n = len(token_ids)
    c.k[:, :n] = ids[None, :, None, None] + torch.arange(L)[:, None, None, None] * 0.5 + torch.arange(D) * 1e-3
    c.v[:, :n] = -c.k[:, :n] + 0.25
    c.length = n
    return c


def empty_cache(max_len=256):
    return KVCache(SHAPE[0], max_len, SHAPE[1], SHAPE[2])


def make(tmp_path, fp="model-a", **kw):
    kw.setdefault("block_size", 4)
    return PrefixCache(tmp_path, fingerprint=fp, **kw)


def no_warnings():
    return warnings.catch_warnings(record=True)


# ---- provenance ------------------------------------------------------------------------------------
def test_fingerprint_catches_every_provenance_change(tmp_path):
    w = tmp_path / "dense.safetensors"
    w.write_bytes(b"weights-v1")
    tok = json.dumps({"model": {"vocab": {"a": 0, "b": 1}}, "normalizer": None})
    cfg = {"dim": 8, "n_layers": 2}
    base = fingerprint([w], tok, cfg, torch.float32, None)
    assert base == fingerprint([w], tok, dict(reversed(list(cfg.items()))), "float32", None)
    # whitespace / key order of tokenizer.json do not matter, its content does
    assert base == fingerprint([w], json.dumps(json.loads(tok), indent=2, sort_keys=True), cfg, torch.float32)
    changed = {
        "tokenizer": fingerprint([w], tok.replace('"b": 1', '"c": 1'), cfg, torch.float32),
        "config": fingerprint([w], tok, {**cfg, "dim": 16}, torch.float32),
        "dtype": fingerprint([w], tok, cfg, torch.bfloat16),
        "quant": fingerprint([w], tok, cfg, torch.float32, "int8-rowwise"),
    }
    w.write_bytes(b"weights-v2")            # same size, same name, other bytes
    changed["weights"] = fingerprint([w], tok, cfg, torch.float32)
    for what, fp in changed.items():
        assert fp != base, what
    assert len(set(changed.values())) == len(changed)
    # a manifest mapping name -> sha256 is accepted in place of the files
    assert fingerprint({"dense.safetensors": sha256_file(w)}, tok, cfg, torch.float32) == changed["weights"]
    with pytest.raises(LessonkitError):
        fingerprint([], tok, cfg, torch.float32)


def test_block_hashes_are_chained():
    a = list(range(40))
    b = a[:20] + [999] + a[21:]
    ha, hb = block_hashes(a, 8), block_hashes(b, 8)
    assert len(ha) == 5                      # 40 // 8 full blocks
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    assert all(x != y for x, y in zip(ha[3:], hb[3:]))   # a change poisons every later block
    assert block_hashes(a[:39], 8) == ha[:4]               # partial blocks get no hash
    assert block_hashes(a, 8, root="x") != ha              # the root (fingerprint) separates models
    # the same block content at another depth hashes differently (the chain carries the position)
    rep = [7] * 16
    h = block_hashes(rep, 8)
    assert h[0] != h[1]


# ---- save / restore -----------------------------------------------------------------------------------
def test_roundtrip_is_exact_and_partial_match_resumes_from_deepest_point(tmp_path):
    pc = make(tmp_path)
    ids = list(range(100, 130))              # 30 tokens: 7 full blocks of 4 + a tail of 2
    src = fake_cache(ids)
    path = pc.save(ids, src)
    assert path.exists() and path.suffix == ".safetensors"
    with no_warnings() as w:
        c = empty_cache()
        assert pc.lookup_and_restore(ids + [1, 2, 3], c) == 30       # exact end incl. the tail
        assert torch.equal(c.k[:, :30], src.k[:, :30]) and torch.equal(c.v[:, :30], src.v[:, :30])
        c = empty_cache()
        assert pc.lookup_and_restore(ids[:13] + [5, 5, 5], c) == 13  # shares only part: deepest point
        assert c.length == 13 and torch.equal(c.k[:, :13], src.k[:, :13])
        c = empty_cache()
        assert pc.lookup_and_restore(ids, c, max_tokens=len(ids) - 1) == 29
        c = empty_cache()
        assert pc.lookup_and_restore([1] + ids, c) == 0 and c.length == 0     # no shared first token
    assert not w
    s = pc.stats.as_dict()
    assert s["prefix_cache_queries"] == 33 + 16 + 30 + 31
    assert s["prefix_cache_hits"] == 30 + 13 + 29
    # a second process view (a new object) sees the same; saving again is idempotent
    pc2 = make(tmp_path)
    assert pc2.save(ids, src) == path
    assert len(pc2.entries()) == 1


def test_lookup_prefers_the_longest_of_several_snapshots(tmp_path):
    pc = make(tmp_path)
    base = list(range(50))
    for n in (8, 24, 40):
        pc.save(base[:n], fake_cache(base[:n]))
    pc.save([9] * 30, fake_cache([9] * 30))
    c = empty_cache()
    assert pc.lookup_and_restore(base[:33] + [0], c) == 33          # from the 40-token snapshot
    c = empty_cache()
    assert pc.lookup_and_restore(base[:24], c) == 24
    c = empty_cache()
    assert pc.lookup_and_restore([9] * 31, c) == 30


def test_lru_eviction_keeps_the_byte_budget(tmp_path):
    one = len(encode_snapshot({"k": torch.zeros(2, 20, 3, 4), "v": torch.zeros(2, 20, 3, 4),
                                   "token_ids": torch.zeros(20, dtype=torch.int64)},
                                  {"x": "y" * 300}))
    pc = make(tmp_path, budget_bytes=int(3.5 * one))
    prompts = [[p] * 20 for p in range(1, 6)]
    pc.save(prompts[0], fake_cache(prompts[0]))
    pc.save(prompts[1], fake_cache(prompts[1]))
    pc.save(prompts[2], fake_cache(prompts[2]))
    assert pc.lookup_and_restore(prompts[0], empty_cache()) == 20    # prompt 0 is now most recent
    pc.save(prompts[3], fake_cache(prompts[3]))                      # evicts the LRU: prompt 1
    assert pc.total_bytes() <= pc.budget_bytes
    assert pc.lookup_and_restore(prompts[1], empty_cache()) == 0
    assert pc.lookup_and_restore(prompts[0], empty_cache()) == 20
    assert pc.lookup_and_restore(prompts[3], empty_cache()) == 20
    assert pc.stats.evictions >= 1
    # a snapshot bigger than the whole budget is not saved
    tiny = make(tmp_path / "tiny", budget_bytes=100)
    assert tiny.save(prompts[4], fake_cache(prompts[4])) is None


def test_index_is_rebuilt_from_the_files(tmp_path):
    pc = make(tmp_path)
    ids = list(range(40))
    pc.save(ids, fake_cache(ids))
    (tmp_path / "index.json").write_text("{not json")
    with no_warnings() as w:
        c = empty_cache()
        assert make(tmp_path).lookup_and_restore(ids, c) == 40
    assert not w
    (tmp_path / "index.json").unlink()
    assert make(tmp_path).verify()["valid"] == 1


# ---- never serve a wrong state ---------------------------------------------------------------------------
def _saved(tmp_path, ids=tuple(range(200, 240))):
    pc = make(tmp_path)
    path = pc.save(list(ids), fake_cache(list(ids)))
    return pc, list(ids), path


def _edit_payload(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01                         # one bit in the V tensor
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _edit_header(path):
    data = path.read_bytes()
    old, new = b'n_tokens\\": 40', b'n_tokens\\": 41'
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def _garbage(path):
    path.write_bytes(os.urandom(300))


def _half_written(path):
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize("damage", [_edit_payload, _truncate, _edit_header, _garbage, _half_written])
def test_damaged_snapshot_is_reported_once_ignored_and_recomputed(tmp_path, damage):
    _, ids, path = _saved(tmp_path)
    damage(path)
    with pytest.warns(PrefixCacheWarning) as rec:
        pc = make(tmp_path)                  # a later process: noticed when opening or at lookup
        c = empty_cache()
        n = pc.lookup_and_restore(ids, c)
        assert pc.lookup_and_restore(ids, empty_cache()) == 0
    assert n == 0 and c.length == 0          # never used
    msgs = [str(r.message) for r in rec if issubclass(r.category, PrefixCacheWarning)]
    assert len(msgs) == 1 and str(path) in msgs[0]
    assert not path.exists()
    pc.save(ids, fake_cache(ids))            # recomputed and saved again
    with no_warnings() as w:
        assert pc.lookup_and_restore(ids, empty_cache()) == 40
    assert not w


def test_foreign_snapshot_of_same_shape_is_never_served(tmp_path):
    """Other weights, same shapes and vocabulary: a shape-keyed cache (Colibri) would serve it."""
    ids = list(range(300, 340))
    other = make(tmp_path / "b", fp="model-b")
    other_path = other.save(ids, fake_cache(ids))
    mine = make(tmp_path / "a", fp="model-a")
    my_path = mine.save(ids, fake_cache(ids))
    assert my_path.stat().st_size == other_path.stat().st_size
    my_path.write_bytes(other_path.read_bytes())      # same name, same size, other provenance
    with pytest.warns(PrefixCacheWarning, match="foreign") as rec:
        assert mine.lookup_and_restore(ids, empty_cache()) == 0
    assert str(my_path) in str(rec[0].message)
    # two models sharing one directory never see each other's snapshots
    shared_a, shared_b = make(tmp_path / "s", fp="model-a"), make(tmp_path / "s", fp="model-b")
    shared_a.save(ids, fake_cache(ids))
    with no_warnings() as w:
        assert shared_b.lookup_and_restore(ids, empty_cache()) == 0
        assert shared_a.lookup_and_restore(ids, empty_cache()) == 40
    assert not w


def test_shape_or_dtype_mismatch_is_rejected(tmp_path):
    _, ids, path = _saved(tmp_path)
    with pytest.warns(PrefixCacheWarning, match="dtype") as rec:
        c = KVCache(SHAPE[0], 256, SHAPE[1], SHAPE[2], dtype=torch.bfloat16)
        assert make(tmp_path).lookup_and_restore(ids, c) == 0
    assert len(rec) == 1 and str(path) in str(rec[0].message)


def test_full_disk_gives_a_clear_error_and_leaves_the_cache_consistent(tmp_path, monkeypatch):
    pc, ids, path = _saved(tmp_path)
    before = pc.verify()

    def full(fd, data):
        os.write(fd, bytes(memoryview(data)[:100]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "write_all", full)
    other = list(range(500, 540))
    with pytest.raises(LessonkitError, match="no space left"):
        pc.save(other, fake_cache(other))
    monkeypatch.undo()
    after = pc.verify()
    assert after == before and after["temp_files"] == [] and after["bad"] == []
    with no_warnings() as w:
        assert pc.lookup_and_restore(ids, empty_cache()) == 40
        assert pc.lookup_and_restore(other, empty_cache()) == 0
    assert not w


# ---- crash safety and concurrency (real processes) -------------------------------------------------------
CHILD_PRELUDE = textwrap.dedent("""
    import os, sys, time, warnings, torch
    warnings.simplefilter("error")
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from test_prefix_cache import fake_cache, empty_cache, make
    import lessonkit.files.atomic as atomic
    from pathlib import Path
    d = Path({d!r})
""")


def _child(code, d, **kw):
    src = CHILD_PRELUDE.format(root=str(ROOT), tests=str(ROOT / "tests"), d=str(d)) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", src], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, **kw)


@pytest.mark.parametrize("where", ["mid_write", "after_rename"])
def test_writer_killed_mid_save_leaves_a_consistent_cache(tmp_path, where):
    pc, ids, _ = _saved(tmp_path)
    code = {
        "mid_write": """
            real = atomic.write_all
            def slow(fd, data):
                os.write(fd, bytes(memoryview(data)[: len(data) // 2]))
                print("MID", flush=True); time.sleep(60)
            atomic.write_all = slow
        """,
        "after_rename": """
            real = os.replace
            def replace_then_hang(a, b):
                real(a, b)
                if str(b).endswith(".safetensors"):
                    print("MID", flush=True); time.sleep(60)
            os.replace = replace_then_hang
        """,
    }[where]
    code = textwrap.dedent(code) + textwrap.dedent("""
        ids = list(range(600, 640))
        make(d).save(ids, fake_cache(ids))
        print("DONE", flush=True)
    """)
    p = _child(code, tmp_path)
    try:
        assert p.stdout.readline().strip() == "MID", p.stderr.read()
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(timeout=30)
        p.stdout.close()
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    with no_warnings() as w:
        pc2 = make(tmp_path)                 # a later process: removes the dead writer's temp file
        rep = pc2.verify()
        assert rep["bad"] == [] and rep["temp_files"] == [] and rep["index_matches_files"]
        assert pc2.lookup_and_restore(ids, empty_cache()) == 40
        new = list(range(600, 640))
        c = empty_cache()
        n = pc2.lookup_and_restore(new, c)
    assert not w
    if where == "mid_write":
        assert n == 0 and rep["valid"] == 1
    else:                                    # renamed but not indexed: the index is rebuilt from the file
        assert n == 40 and rep["valid"] == 2 and torch.equal(c.k[:, :40], fake_cache(new).k[:, :40])


def test_two_processes_share_a_directory_without_losing_or_tearing(tmp_path):
    make(tmp_path)
    code = """
        me, other = int(sys.argv[1]), 1 - int(sys.argv[1])
        pc = make(d, budget_bytes=1 << 30)
        prompt = lambda who, i: [1000 * (who + 1) + i] * 3 + list(range(i, i + 37))
        seen = set()
        for i in range(15):
            pc.save(prompt(me, i), fake_cache(prompt(me, i)))
            for j in range(15):
                if j in seen:
                    continue
                c = empty_cache()
                n = pc.lookup_and_restore(prompt(other, j), c)
                if n:
                    assert n == 40, n
                    ref = fake_cache(prompt(other, j))
                    assert torch.equal(c.k[:, :n], ref.k[:, :n]) and torch.equal(c.v[:, :n], ref.v[:, :n])
                    seen.add(j)
        print(len(seen), flush=True)
    """
    procs = []
    for who in (0, 1):
        src = CHILD_PRELUDE.format(root=str(ROOT), tests=str(ROOT / "tests"), d=str(tmp_path)) + textwrap.dedent(code)
        procs.append(subprocess.Popen([sys.executable, "-c", src, str(who)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    rep = make(tmp_path).verify()
    assert rep["valid"] == 30 and rep["bad"] == [] and rep["index_matches_files"] and rep["temp_files"] == []
    assert len(json.loads((tmp_path / "index.json").read_text())["entries"]) == 30


# ---- with the engine: a tiny random MoE (same shapes, other seeds = "other weights") ------------------
TOKENIZER = json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(512)},
                                                     "unk_token": "t0"}, "pre_tokenizer": {"type": "Whitespace"}})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"a": tiny_random_model(root / "a", seed=0, tokenizer_json=TOKENIZER),
            "b": tiny_random_model(root / "b", seed=1, tokenizer_json=TOKENIZER)}


def engine(path):
    from lessonkit.engine.engine import Engine
    return Engine(path)


PROMPT = [(7 * i + 3) % 500 + 1 for i in range(150)]


def greedy(e, cache, first_logits, n):
    out, logits = [], first_logits
    for _ in range(n):
        t = int(torch.argmax(logits[-1]))
        out.append(t)
        logits = e.forward([t], cache)
    return out


def test_resume_in_a_new_process_is_bit_identical_to_a_fresh_prefill(tmp_path, tiny):
    cache_dir = tmp_path / "pc"
    prompt, tail = PROMPT[:120], PROMPT[120:]
    writer = f"""
        import sys, torch; sys.path.insert(0, {str(ROOT)!r})
        from lessonkit.engine.engine import Engine
        from lessonkit.prefix_cache.cache import PrefixCache
        e = Engine({str(tiny['a'])!r}); c = e.new_cache()
        e.forward({prompt!r}, c, last_only=True)
        print(PrefixCache({str(cache_dir)!r}, e).save({prompt!r}, c))
    """
    reader = f"""
        import sys, torch, warnings; sys.path.insert(0, {str(ROOT)!r}); warnings.simplefilter("error")
        from safetensors.torch import save_file
        from lessonkit.engine.engine import Engine
        from lessonkit.prefix_cache.cache import PrefixCache
        e = Engine({str(tiny['a'])!r}); c = e.new_cache()
        ids = {prompt + tail!r}
        n = PrefixCache({str(cache_dir)!r}, e).lookup_and_restore(ids, c, max_tokens=len(ids) - 1)
        assert n == {len(prompt)}, n
        logits = e.forward(ids[n:], c)
        out = []
        for _ in range(12):
            t = int(torch.argmax(logits[-1])); out.append(t); logits = torch.cat([logits, e.forward([t], c)])
        save_file({{"logits": logits, "greedy": torch.tensor(out)}}, {str(tmp_path / 'out.safetensors')!r})
    """
    for code in (writer, reader):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
        assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file
    got = load_file(tmp_path / "out.safetensors")
    e = engine(tiny["a"])
    c = e.new_cache()
    e.forward(prompt, c, last_only=True)                     # a fresh prefill of the same tokens, same chunks
    fresh = e.forward(tail, c)
    out = greedy(e, c, fresh, 12)
    assert got["logits"].dtype == torch.float32
    assert torch.equal(got["logits"][: len(tail)], fresh)
    assert got["greedy"].tolist() == out
    # one forward over everything chunks the prefill differently: on the row kernel the bits cannot move;
    # on the MKL path (no compiler at set-up) any difference is GEMM rounding, not the cache
    one = e.forward(prompt + tail, e.new_cache())[len(prompt):]
    if e.model.wt["lm_head"].packed:
        assert torch.equal(one, fresh)
    else:
        assert torch.allclose(one, fresh, rtol=0, atol=1e-3)


def test_score_is_identical_off_cold_and_warm(tmp_path, tiny):
    e = engine(tiny["a"])
    items = [[(11 * i + j) % 400 + 1 for j in range(1 + i % 3)] for i in range(6)]
    off = score(e, PROMPT, items)
    cold = score(e, PROMPT, items, prefix_cache=PrefixCache(tmp_path, e, block_size=16))
    warm = score(e, PROMPT, items, prefix_cache=PrefixCache(tmp_path, e, block_size=16))
    assert (off.stats["mode"], cold.stats["mode"], warm.stats["mode"]) == ("off", "cold", "warm")
    assert results_identical(off, cold) and results_identical(off, warm)
    assert warm.stats["prefix_cache_hits"] == len(PROMPT) - 1 == warm.stats["prefix_cache_queries"]
    assert cold.stats["prefix_cache_hits"] == 0 and warm.stats["prefill_s"] == 0.0
    # a reference by hand: a fresh prefill of the prefix, then the last prefix token and the item
    c = e.new_cache()
    e.forward(PROMPT[:-1], c, last_only=True)
    rows = e.forward(PROMPT[-1:] + items[0], c)
    ref = torch.log_softmax(rows[:-1], -1).gather(1, torch.tensor(items[0])[:, None])[:, 0]
    assert torch.equal(ref, off.token_logprobs[0]) and torch.equal(rows[-1], warm.last_logits[0])


def test_other_weights_or_tokenizer_never_resume_the_state(tmp_path, tiny):
    import shutil
    a, b = engine(tiny["a"]), engine(tiny["b"])
    ctok = tmp_path / "a-other-tokenizer"
    shutil.copytree(tiny["a"], ctok)
    (ctok / "tokenizer.json").write_text(TOKENIZER.replace('"t1"', '"tone"'))
    a2 = engine(ctok)
    assert len({a.fingerprint(), b.fingerprint(), a2.fingerprint()}) == 3
    pa = PrefixCache(tmp_path / "pc", a)
    c = a.new_cache()
    a.forward(PROMPT, c, last_only=True)
    path_a = pa.save(PROMPT, c)
    with no_warnings() as w:
        for other in (b, a2):                 # same shapes, same vocabulary size: Colibri's check passes
            assert PrefixCache(tmp_path / "pc", other).lookup_and_restore(PROMPT, other.new_cache()) == 0
    assert not w
    # b's snapshot planted under a's name (a shape-keyed cache would serve it): caught, never used
    pb = PrefixCache(tmp_path / "pcb", b)
    cb = b.new_cache()
    b.forward(PROMPT, cb, last_only=True)
    path_a.write_bytes(pb.save(PROMPT, cb).read_bytes())
    with pytest.warns(PrefixCacheWarning, match="foreign") as rec:
        c = a.new_cache()
        assert PrefixCache(tmp_path / "pc", a).lookup_and_restore(PROMPT, c) == 0
    assert len(rec) == 1 and str(path_a) in str(rec[0].message) and c.length == 0


def test_generate_with_prefix_cache_equals_plain_generate(tmp_path, tiny):
    from lessonkit.engine.generate import generate
    e = engine(tiny["a"])
    other = PROMPT[:100] + [5, 6, 7]

    def plain_from(state_tokens, n_keep, prompt):   # plain generate() from a freshly computed prefix state
        c = e.new_cache()
        e.forward(state_tokens, c, last_only=True)
        c.rollback(n_keep)
        return generate(e, prompt, 10, cache=c)

    plain = generate(e, PROMPT, 10)
    r1 = generate_with_prefix_cache(e, PROMPT, str(tmp_path), max_new_tokens=10)   # a directory, as the CLI passes
    r2 = generate_with_prefix_cache(e, other, PrefixCache(tmp_path, e), max_new_tokens=10)
    r3 = generate_with_prefix_cache(e, PROMPT, PrefixCache(tmp_path, e), max_new_tokens=10)
    assert r1.token_ids == plain.token_ids                                  # cold: plain generate, then saved
    assert r2.token_ids == plain_from(PROMPT, 100, other).token_ids         # resumes 100 tokens of the saved state
    assert r3.token_ids == plain_from(PROMPT, len(PROMPT) - 1, PROMPT).token_ids
    assert r1.stats["prefix_cache_hits"] == 0 and r1.stats["prefix_cache_queries"] == len(PROMPT)
    assert r2.stats["prefix_cache_hits"] == 100          # shares 100 tokens with the saved prompt
    assert r3.stats["prefix_cache_hits"] == len(PROMPT) - 1
    assert r3.stats["ttft_s"] > 0 and r3.stats["restore_s"] > 0


def test_bench_smoke_runs_and_reports_targets():
    import argparse
    r = bench_prefix.bench(argparse.Namespace(smoke=True, repeats=1, model=None))
    assert r["bench"] == "prefix" and len(r["rows"]) == 5 and len(r["targets"]) == 3
    assert all(row["identical_to_plain"] for row in r["rows"])
    assert json.loads(json.dumps(r)) == r


# ---- deletion stays inside the cache, and inside the model's own entries (issue 21, item 1) ---------------
def test_clear_removes_this_models_snapshots_only(tmp_path):
    a, b = make(tmp_path, "model-a"), make(tmp_path, "model-b")
    pa = a.save(list(range(200, 240)), fake_cache(list(range(200, 240))))
    pb = b.save(list(range(300, 340)), fake_cache(list(range(300, 340))))
    assert a.clear() == 1
    assert not pa.exists() and pb.exists()
    assert len(make(tmp_path, "model-b").entries()) == 1


def test_clear_never_follows_a_symlink_out_of_the_cache(tmp_path):
    outside = tmp_path / "weights"
    outside.mkdir()
    victim = outside / "model.safetensors"
    victim.write_bytes(b"precious")
    cache_dir = tmp_path / "cache"
    pc = make(cache_dir)
    pc.save(list(range(200, 240)), fake_cache(list(range(200, 240))))
    (cache_dir / "kv" / "elsewhere").symlink_to(outside, target_is_directory=True)
    os.symlink(victim, cache_dir / "kv" / pc.subdir.name / "link.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pc.clear()
        make(cache_dir, "model-b").clear()
        PrefixCache(cache_dir, fingerprint="model-a", budget_bytes=1, block_size=4).save(
            list(range(400, 440)), fake_cache(list(range(400, 440))))    # evicts everything it may
    assert victim.read_bytes() == b"precious"
