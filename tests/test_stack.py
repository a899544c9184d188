"""The capstone stack: engine answers byte-identical to the plain engine, the semantic cache never serves a
cached positive, the ablation table's columns, the bench smoke run."""
from __future__ import annotations

import json
from argparse import Namespace
from dataclasses import replace

import numpy as np
import pytest

from lessonkit import stack
from lessonkit.bench import bench_stack
from lessonkit.errors import LessonkitError
from lessonkit.models.registry import MODELS_DIR, load_model
from lessonkit.lessons import stack as lesson
from lessonkit.measure import stack as measure
from lessonkit.measure.prefix_cache import tiny_random_model
from lessonkit.speculative.drafters import Draft, OracleDrafter
from lessonkit.workloads.monitoring import MonitoringItem
from lessonkit.workloads.triage import Workload, make_workload, needs_action
from tests.hf_tiny import byte_tokenizer_json

CFG = replace(stack.PRESETS["smoke"], n_items=3, max_new_tokens=12, n_examples=2, calibration_items=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("stack") / "tiny"
    tiny_random_model(d, seed=3, vocab=300, tokenizer_json=byte_tokenizer_json())
    return load_model(str(d))


@pytest.fixture(scope="module")
def workload():
    wl = make_workload(CFG)
    # the byte tokenizer makes one token per byte: a short prefix keeps the tiny model's forwards cheap
    return Workload(wl.items, wl.examples, wl.calibration, wl.prefix[-240:])


def _answers(eng, wl, techniques, drafter=None, cfg=CFG, **kw):
    return stack.run_stack(eng, wl, techniques, cfg=cfg, model_drafter=drafter, **kw)


def test_stack_engine_output_identical_to_plain(tiny, workload, tmp_path):
    plain = _answers(tiny, workload, ())
    assert plain.sources == ["engine"] * CFG.n_items
    # prompt lookup, and an oracle whose drafts are partly wrong (acceptance and rejection both happen), at a fixed
    # depth: under the utility gate (k="auto") whether any draft is verified depends on the steps' measured seconds,
    # and a loaded machine can switch drafting off before the first acceptance (the gate's own tests: test_gate.py)
    oracle = OracleDrafter(tiny, 0.3, seed=1, horizon=16)
    for tech, drafter in [(("prefix",), None), (("grammar", "drafter"), "ngram"),
                          (("prefix", "grammar", "drafter"), oracle)]:
        run = _answers(tiny, workload, tech, drafter, cfg=replace(CFG, k=4), prefix_cache_dir=tmp_path / "pc")
        assert run.answers == plain.answers, tech
        assert run.judge_calls == CFG.n_items
    # the prefix cache was used (warm after the first item) and drafts were verified, some accepted
    assert run.extra["prefix_cache_hits"] > 0
    assert 0 < run.extra["model_accepted"] < run.extra["model_proposed"] and run.forwards < plain.forwards


@pytest.mark.skipif(not (MODELS_DIR / "tiny-moe" / "config.json").exists(), reason="tiny-moe not trained yet")
def test_stack_identical_on_tiny_moe(workload, tmp_path):
    eng = load_model("tiny-moe")
    plain = _answers(eng, workload, ())
    run = _answers(eng, workload, ("prefix", "grammar", "drafter"), "ngram", prefix_cache_dir=tmp_path)
    assert run.answers == plain.answers


class _FakeJudge:
    """Answers by rule: items mentioning 'fail' need action; everything else does not."""

    def __init__(self, engine, prefix, **kw):
        self.calls, self.drafter_stats, self.model_drafter_name = 0, {}, None

    def __call__(self, text):
        self.calls += 1
        yes = "fail" in text
        ans = json.dumps({"needs_action": yes, "severity": "high" if yes else "low", "reason": text},
                         separators=(",", ":"))
        return stack.JudgeResult(ans, [0] * 5, 5)

    def close(self):
        pass


def test_semantic_cache_never_serves_a_cached_positive(tiny, monkeypatch):
    monkeypatch.setattr(stack, "Judge", _FakeJudge)
    texts = ["web-04 failed its health check", "disk usage on lb-02 is at 80%"] * 6
    items = [MonitoringItem(i, t, "f", "alert", "original", None, None, False) for i, t in enumerate(texts)]
    wl = Workload(items, [], [], "prefix text")
    emb = np.tile(np.eye(1, 384, dtype=np.float32), (len(texts), 1))     # everything looks alike
    cfg = replace(CFG, n_items=len(texts), audit_rate=0.0, audit_first_n=1)
    run = stack.run_stack(tiny, wl, ("semcache",), cfg=cfg, embeddings=emb)
    served = [a for a, s in zip(run.answers, run.sources) if s == "cache"]
    assert served, "the repeated negative should be served from the cache"
    assert all(not needs_action(a) for a in served)
    assert run.extra["cached_positives_served"] == 0
    # every positive went to the judge, and the first hit of the negative was audited
    assert all(s != "cache" for t, s in zip(texts, run.sources) if "fail" in t)
    assert run.audits == 1 and run.audit_losses == 0
    assert run.judge_calls == 6 + 1 + 1          # positives + first negative + its audited hit


def test_warm_up_is_the_same_cache_as_running_the_earlier_items(tiny, monkeypatch):
    """Warming with recorded answers = running those items live first; the warm-up is not counted."""
    monkeypatch.setattr(stack, "Judge", _FakeJudge)
    texts = ["web-04 failed its health check", "disk usage on lb-02 is at 80%", "queue a is fine"] * 4
    items = [MonitoringItem(i, t, "f", "alert", "original", None, None, False) for i, t in enumerate(texts)]
    emb = np.tile(np.eye(1, 384, dtype=np.float32), (len(texts), 1))
    cfg = replace(CFG, n_items=6, audit_rate=0.0, audit_first_n=1)
    live = stack.run_stack(tiny, Workload(items, [], [], "p"), ("semcache",), cfg=replace(cfg, n_items=12),
                           embeddings=emb)
    recorded = {t: a for t, a, s in zip(texts, live.answers, live.sources) if s == "engine"}
    for rec in (recorded, None):               # recorded answers, or the judge live: the same cache either way
        p = stack.StackPipeline(tiny, Workload(items[6:], [], [], "p", texts[:6]), ("semcache",), cfg=cfg,
                                embeddings=emb)
        assert p.warm_up(texts[:6], rec) == (0 if rec else 6)   # 2 positives, 2 new negatives, 2 first-hit audits
        for i, t in enumerate(texts[6:]):
            p.step(i, t)
        run = p.finish()
        assert run.sources == live.sources[6:] and run.answers == live.answers[6:]
        assert run.hits == 4 and run.extra["warm_entries"] == 2
        assert run.judge_calls == 2 and run.audits == 0       # the warm-up's judge calls and audit are not counted
        assert run.extra["cache_serving"] is True


def test_front_safe_margin_reuses_only_confident_negatives(tiny, monkeypatch):
    """With a safe margin, a "no" stored close to the judge's boundary answers its own text only; a confident one
    also answers rewordings. The timed items score live (one forward each), the warm-up from recorded scores."""
    monkeypatch.setattr(stack, "Judge", _FakeJudge)
    monkeypatch.setattr(stack, "front_safe_margin", lambda engine, prefix: 5.0)
    odds = {"disk usage on lb-02 is at 80%": -9.0, "queue a is fine": -1.0, "Queue a is fine": -2.0}
    live_calls = []

    class _Live:
        prefilled = True

        def score(self, t):
            live_calls.append(t)
            return odds[t]
    monkeypatch.setattr(stack, "front_scorer", lambda engine, prefix: (odds.get, _Live()))
    texts = ["disk usage on lb-02 is at 80%", "queue a is fine",
             "Disk usage on lb-02 is at 80%", "Queue a is fine", "queue a is fine"]
    items = [MonitoringItem(i, t, "f", "alert", "original", None, None, False) for i, t in enumerate(texts)]
    emb = np.tile(np.eye(1, 384, dtype=np.float32), (len(texts), 1))      # everything looks alike
    cfg = replace(CFG, n_items=len(texts), audit_rate=0.0, audit_first_n=0)
    p = stack.StackPipeline(tiny, Workload(items, [], [], "p"), ("semcache",), cfg=cfg, embeddings=emb)
    for i, t in enumerate(texts):
        p.step(i, t)
    run = p.finish()
    assert run.extra["safe_margin"] == 5.0
    # the confident "no" (-9) answers its rewording; the unconfident one (-1) only its own text
    assert run.sources == ["engine", "engine", "cache", "engine", "cache"]
    assert live_calls == ["disk usage on lb-02 is at 80%", "queue a is fine", "Queue a is fine"]   # each stored "no"
    assert run.forwards == 3 * 5 + 3            # three judge calls of 5 forwards (the fake's), three live scores
    # without a margin (untrained judges) every stored "no" is reused, as before
    monkeypatch.setattr(stack, "front_safe_margin", lambda engine, prefix: None)
    run = stack.run_stack(tiny, Workload(items, [], [], "p"), ("semcache",), cfg=cfg, embeddings=emb)
    assert run.sources == ["engine", "engine", "cache", "cache", "cache"] and run.extra["safe_margin"] is None


@pytest.mark.skipif(not (MODELS_DIR / "tiny-moe-judge" / "adapter.json").exists(), reason="no trained judge")
def test_front_scorer_reads_the_judges_recorded_scores_and_they_are_the_live_ones():
    from lessonkit.semcache.policies import SAFE_MARGINS
    from lessonkit.semcache.judge import trained_prompt
    from lessonkit.workloads.triage import load_stream
    eng = load_model("tiny-moe-judge")
    prefix = trained_prompt("tiny-moe-judge")["prefix"]
    assert stack.front_safe_margin(eng, prefix) == SAFE_MARGINS["tiny-moe-judge"]
    assert stack.front_safe_margin(eng, prefix + " ") is None          # prompted otherwise: no calibrated margin
    recorded, live = stack.front_scorer(eng, prefix)
    for it in load_stream()[:3]:
        # lesson 5 records scores rounded to 5 decimals (semcache.judge.record_scores): equal to that rounding
        assert abs(recorded(it.text) - live.score(it.text)) <= 5e-6
    assert live.calls == 3                                              # the recorded ones were read, not recomputed


def test_front_safe_margins_cover_the_judges_calibration_spread():
    """Each trained judge's margin is its widest log-odds spread among rewordings on the calibration split
    (lesson 5's rule, from its recorded scores), rounded up to at most half a unit above it."""
    from lessonkit.lessons.semantic_cache import calibrate_safe_margin
    from lessonkit.semcache.policies import SAFE_MARGINS
    from lessonkit.semcache.judge import RecordedJudge, answers_path
    from lessonkit.workloads.triage import load_stream
    items = load_stream()[:300]
    for name, margin in SAFE_MARGINS.items():
        spread = calibrate_safe_margin(items, RecordedJudge.from_file(answers_path(name)))
        assert spread <= margin < spread + 0.5, name


def test_make_workload_warm_items_come_first():
    wl = make_workload(replace(CFG, warm_items=5))
    cold = make_workload(CFG)
    assert wl.warm == cold.texts[:3] + [it.text for it in make_workload(replace(CFG, n_items=5)).items][3:]
    assert wl.texts == [it.text for it in make_workload(replace(CFG, n_items=8)).items][5:]
    assert wl.cache_texts == wl.warm + wl.texts
    with pytest.raises(LessonkitError, match="warm-up"):
        make_workload(replace(CFG, warm_items=5000))


def test_semantic_front_stores_only_parseable_negatives():
    emb = np.tile(np.eye(1, 384, dtype=np.float32), (3, 1))
    front = stack.SemanticFront(emb, ["a 1", "a 2", "a 3"], threshold=0.5)
    assert not front.put("a 1", '{"needs_action":true,"severity":"high","reason":"x"}')
    assert not front.put("a 2", "not json at all")
    assert front.put("a 3", '{"needs_action":false,"severity":"low","reason":"x"}')
    assert len(front.store) == 1


class _Fixed:
    def __init__(self, name, toks):
        self.name, self.toks, self.updates = name, toks, []

    def reset(self, prompt):
        pass

    def propose(self, context, k):
        return Draft(self.toks[:k])

    def update(self, context, n):
        self.updates.append(n)


def test_stack_drafter_prefers_the_forced_span():
    g, m = _Fixed("grammar", [1, 2]), _Fixed("ngram", [7])
    d = stack.StackDrafter(g, m)
    assert d.propose([0], 4).tokens == [1, 2]
    d.update([0, 1, 2, 3], 2)
    assert d.accepted == {"grammar": 2, "model": 0} and m.updates == []
    g.toks = []
    assert d.propose([0], 4).tokens == [7]
    d.update([0, 7, 8], 1)
    assert d.accepted["model"] == 1 and m.updates == [1]
    ended = []
    m.finish = lambda: ended.append("ngram")
    d.finish()                          # both parts end their run (a head stops tapping; a grammar has no finish)
    assert ended == ["ngram"]
    with pytest.raises(ValueError):
        stack.StackDrafter(None, None)


def test_ablation_table_has_the_columns(tiny, workload):
    emb = np.tile(np.eye(1, 384, dtype=np.float32), (CFG.n_items, 1))
    df, runs, ddf = measure.ablation(tiny, CFG, embeddings=emb, workload=workload, model_drafter="ngram")
    for c in ["wall_s", "tokens_per_s", "forwards", "expert_bytes", "judge_calls", "identical_to_plain",
              "audited_losses", "actionable_losses"]:
        assert c in df.columns
    assert list(df["row"]) == list(measure.ROWS)
    engine_rows = df[~df["techniques"].str.contains("semcache")]
    assert engine_rows["identical_to_plain"].all()
    assert df.loc[df["row"] == "semantic cache", "actionable_losses"].iloc[0] == 0
    assert df.loc[df["row"] == "plain engine", "audited_losses"].isna().all()
    fig = lesson.plot_ablation(df)
    assert fig.axes[0].get_ylabel()


def test_bench_smoke_runs(tiny):
    res = bench_stack.bench(Namespace(smoke=True, json=True, model=str(tiny.model_dir), limit=3))
    json.dumps(res)
    assert res["bench"] == "stack" and res["rows"] and res["targets"]
    assert {"name", "tokens_per_s", "identical_to_plain"} <= set(res["rows"][0])
    assert all(r["identical_to_plain"] for r in res["rows"])


def test_bad_technique_is_one_clear_error(tiny, workload):
    with pytest.raises(ValueError, match="unknown technique"):
        stack.run_stack(tiny, workload, ("turbo",), cfg=CFG)


def test_recorded_answer_lines_belong_to_one_judge_prompt_and_cap(tiny, tmp_path):
    from lessonkit.semcache.judge import recorded_answers, write_answer_lines
    path = write_answer_lines(tiny, "prefix", 12, {"a": '{"needs_action":false}'}, tmp_path / "lines.json")
    assert recorded_answers(tiny, "prefix", 12, path) == {"a": '{"needs_action":false}'}
    assert recorded_answers(tiny, "other prefix", 12, path) == {}      # another prompt: warm up live
    assert recorded_answers(tiny, "prefix", 40, path) == {}            # another length cap
    assert recorded_answers(tiny, "prefix", 12, tmp_path / "missing.json") == {}
    path.write_text("{not json")
    with pytest.raises(LessonkitError, match="lines.json"):
        recorded_answers(tiny, "prefix", 12, path)
