"""The workbook's own models: corpus, tokenizer, and the quality of the shipped tiny-moe / tiny-draft.

No training here: these tests read data/corpus/ and data/models/ and run the lessonkit engine (and
transformers on the exported checkpoints) on a few fixed held-out windows.
"""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lessonkit.workloads import corpus

from lessonkit.training import tiny_models as train
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError

MODELS = train.MODELS_DIR
KNOWN_KEYS = {
    "metric": ["ts", "type", "host", "service", "region", "metric", "value", "unit", "tags"],
    "log": ["ts", "type", "level", "service", "host", "logger", "msg", "trace_id", "route", "status",
            "duration_ms"],
    "alert": ["ts", "type", "alert_id", "rule", "severity", "status", "service", "host", "region", "metric",
              "value", "threshold", "summary", "labels"],
    "deploy": ["ts", "type", "service", "env", "from_version", "to_version", "commit", "actor", "status",
               "duration_s"],
}


@pytest.fixture(scope="module")
def tokenizer():
    return train.load_tokenizer()


@pytest.fixture(scope="module")
def windows(tokenizer):
    return train.heldout_windows(tokenizer, 2, 256)


@pytest.fixture(scope="module")
def moe():
    return Engine(MODELS / "tiny-moe")


@pytest.fixture(scope="module")
def draft():
    return Engine(MODELS / "tiny-draft")


def engine_logits(engine, ids) -> torch.Tensor:
    return engine.forward(list(map(int, ids)), engine.new_cache(len(ids) + 8))


@pytest.fixture(scope="module")
def heldout_logits(windows, moe, draft):
    """{model: {kind: [logits [T, V] per window]}} from the engine, computed once."""
    corpus_draft = Engine(MODELS / "tiny-draft-corpus")
    return {name: {kind: [engine_logits(eng, x[:-1]) for x in w] for kind, w in windows.items()}
            for name, eng in (("tiny-moe", moe), ("tiny-draft", draft), ("tiny-draft-corpus", corpus_draft))}


def engine_loss(logits, windows) -> dict:
    out = {kind: float(torch.stack([F.cross_entropy(lg, x[1:]) for lg, x in zip(logits[kind], w)]).mean())
           for kind, w in windows.items()}
    out["mean"] = sum(out[k] for k in windows) / len(windows)
    return out


def greedy(engine, prompt: str, max_new_tokens: int, stop: str | None = None) -> str:
    ids = engine.encode(prompt)
    cache = engine.new_cache(len(ids) + max_new_tokens + 8)
    logits = engine.forward(ids, cache)[-1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        t = int(logits.argmax())
        out.append(t)
        if stop is not None and stop in engine.decode(out):
            break
        logits = engine.forward([t], cache)[-1]
    return engine.decode(out)


# ----------------------------------------------------------------------------- corpus and tokenizer
def test_corpus_split_is_disjoint_and_small():
    total = 0
    for kind in corpus.KINDS:
        tr = corpus.load_documents(kind, "train")
        ho = corpus.load_documents(kind, "heldout")
        assert len(tr) > 100 and len(ho) >= 5, kind
        assert not set(tr) & set(ho), kind
        assert all(corpus._h(d) % corpus.CorpusConfig().heldout_every == 0 for d in ho)
        total += sum((corpus.CORPUS_DIR / f"{kind}.{s}.txt.gz").stat().st_size for s in corpus.SPLITS)
    assert total < 8 * 2**20
    prov = (corpus.CORPUS_DIR / "PROVENANCE.md").read_text()
    assert "PSF" in prov and "seeded generator" in prov


def test_records_are_seeded_ndjson():
    cfg = corpus.PRESETS["small"]
    a, b = corpus.record_documents(cfg), corpus.record_documents(cfg)
    assert a == b
    shipped = corpus.load_documents("records", "train")
    n = 0
    for doc in shipped[:50]:
        if doc.startswith("{\n"):  # pretty-printed document
            json.loads(doc)
            continue
        for line in doc.splitlines():
            rec = json.loads(line)
            assert list(rec) == [k for k in KNOWN_KEYS[rec["type"]] if k in rec]
            n += 1
    assert n > 300


def test_corpus_build_is_deterministic(tmp_path):
    cfg = corpus.CorpusConfig(prose_bytes=20_000, code_bytes=20_000, records_bytes=20_000, heldout_every=5)
    corpus.build_corpus(tmp_path / "a", cfg)
    corpus.build_corpus(tmp_path / "b", cfg)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_load_documents_names_the_missing_file(tmp_path):
    with pytest.raises(LessonkitError, match="prose.train.txt.gz"):
        corpus.load_documents("prose", "train", tmp_path)
    with pytest.raises(LessonkitError, match="poetry"):
        corpus.load_documents("poetry", "train")


def test_tokenizer_is_shipped_with_each_model_and_round_trips(tokenizer):
    ref = (corpus.CORPUS_DIR / "tokenizer.json").read_bytes()
    for name in ("tiny-moe", "tiny-draft", "tiny-draft-corpus"):
        assert (MODELS / name / "tokenizer.json").read_bytes() == ref, name
    assert tokenizer.get_vocab_size() == 4096
    assert tokenizer.token_to_id(corpus.EOT) == 0
    for kind in corpus.KINDS:
        for doc in corpus.load_documents(kind, "heldout")[:3]:
            assert tokenizer.decode(tokenizer.encode(doc).ids) == doc
    s = '  tabs\tand "ünïcode" → {"a":[1,2.5e-3,null]}\n\n    return x'
    assert tokenizer.decode(tokenizer.encode(s).ids) == s


# ----------------------------------------------------------------------------- shipped models
def test_shipped_files_are_small_and_documented():
    total = 0
    for name in ("tiny-moe", "tiny-draft", "tiny-draft-corpus"):
        d = MODELS / name
        total += sum(p.stat().st_size for p in d.iterdir())
        card = (d / "card.md").read_text()
        assert f"lessonkit train {name}" in card and "Held-out loss" in card
        log = json.loads((d / "train_log.json").read_text())
        assert log["heldout_loss"]["mean"] < log["unigram_loss"]["mean"]
        assert log["steps"] and log["eval"]          # the loss curve, as data (training draws no figure)
    assert total < 40 * 2**20


def test_shipped_cut_drafter_borrows_its_embedding_and_learnt_from_its_start():
    """smollm2-draft ships two fine-tuned layers of smollm2-135m and a reduced output layer, not the embedding
    (borrow.json names it); its held-out agreement rose well above the untrained cut's; all shipped models
    together stay under 80 MB."""
    from safetensors import safe_open

    from lessonkit.models.integrity import verify_manifest
    d = MODELS / "smollm2-draft"
    assert json.loads((d / "borrow.json").read_text()) == {"base": "smollm2-135m", "tensors": ["embed"]}
    with safe_open(str(d / "dense.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "embed" not in keys and {"lm_head", "lm_head_ids"} <= keys
    assert set(verify_manifest(d).values()) == {"ok"}
    log = json.loads((d / "train_log.json").read_text())
    assert log["kind"] == "cut" and log["config"]["target"] == "smollm2-135m"
    after, before = log["heldout_agreement_with_smollm2-135m"], log["initial_agreement"]
    assert set(after) == set(before) and all(after[k] > before[k] + 0.1 for k in after), (before, after)
    card = (d / "card.md").read_text()
    assert "lessonkit train smollm2-draft" in card and "Held-out agreement" in card
    assert f"{log['speculative']['acceptance']['mean']:.3f}" in card
    assert sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file()) < 80 * 2**20


def test_heldout_loss_moe_below_draft_below_unigram(tokenizer, windows, heldout_logits):
    """tiny-moe is far below the unigram baseline. tiny-draft is distilled on tiny-moe's top-k (issue 16),
    which leaves little probability on tokens outside them: on corpus text it stays below the baseline on
    average and far below it on records, but its agreement with the target (next test) is what it is for."""
    uni = train.unigram_loss(tokenizer, windows)
    lm, ld = (engine_loss(heldout_logits[n], windows) for n in ("tiny-moe", "tiny-draft"))
    assert lm["mean"] < uni["mean"] - 2.0 and lm["mean"] < ld["mean"] < uni["mean"], (lm, ld, uni)
    assert ld["records"] < uni["records"] - 2.0, (ld, uni)


def test_drafter_agrees_often_but_not_always(windows, heldout_logits):
    same = total = 0
    for kind in windows:
        for lm, ld in zip(heldout_logits["tiny-moe"][kind], heldout_logits["tiny-draft"][kind]):
            a, b = lm.argmax(-1), ld.argmax(-1)
            same += int((a == b).sum())
            total += len(a)
    assert 0.7 < same / total < 0.95, same / total          # distilled: 0.58 when it learnt from the corpus


def test_corpus_draft_predicts_the_text_distilled_draft_predicts_the_target(windows, heldout_logits):
    """Lesson 1's contrast: the same drafter trained on the corpus text has the lower loss on that text, the
    one trained on tiny-moe's predictions agrees far more often with tiny-moe's greedy pick."""
    def agreement(name):
        pairs = [(lm.argmax(-1), ld.argmax(-1)) for kind in windows
                 for lm, ld in zip(heldout_logits["tiny-moe"][kind], heldout_logits[name][kind])]
        return sum(int((a == b).sum()) for a, b in pairs) / sum(len(a) for a, _ in pairs)
    corpus_loss, distilled_loss = (engine_loss(heldout_logits[n], windows)["mean"]
                                   for n in ("tiny-draft-corpus", "tiny-draft"))
    assert corpus_loss < distilled_loss, (corpus_loss, distilled_loss)
    assert agreement("tiny-draft") > agreement("tiny-draft-corpus") + 0.1


def test_ndjson_continuations_are_valid_records(moe):
    """tiny-moe, prompted with two held-out records and the start of a third, writes a valid record
    with the corpus's keys (greedy). 16 of 16 such prompts passed when the models were shipped; a
    3-record context once ended a log record with an extra '}', so the test allows one miss."""
    docs = [d for d in corpus.load_documents("records", "heldout") if not d.startswith("{\n")]
    prompts = ["".join(d.splitlines(keepends=True)[:2]) + '{"ts":"' for d in docs]
    prompts.append('{"ts":"2025-06-01T12:00:00.000Z","type":"metric",')
    good, bad = 0, []
    for prompt in prompts:
        line = (prompt.splitlines()[-1] + greedy(moe, prompt, 140, stop="\n")).split("\n")[0]
        try:
            rec = json.loads(line)
            ok = rec["type"] in KNOWN_KEYS and set(rec) <= set(KNOWN_KEYS[rec["type"]]) \
                and {"ts", "type", "service"} <= set(rec)
        except (ValueError, KeyError, TypeError):
            ok = False
        good += ok
        if not ok:
            bad.append(line)
    assert len(prompts) >= 8 and good >= len(prompts) - 1, bad


def test_prose_and_code_continuations_look_like_the_corpus(moe):
    prose = greedy(moe, "The default value of this argument is", 40)
    assert sum(c.isalpha() or c in " ,.\n'\"()" for c in prose) / len(prose) > 0.85, prose
    assert len(prose.split()) >= 8, prose
    code = greedy(moe, "    def __repr__(self):\n        return ", 40)
    lines = code.split("\n")
    assert len(lines) >= 2 and code.isascii(), code
    assert all(len(ln) - len(ln.lstrip(" ")) in (0, 4, 8, 12, 16) for ln in lines[1:]), code


def test_load_balancing_loss_is_one_when_uniform_and_grows_when_collapsed():
    uniform = [torch.zeros(64, 8)] * 4
    assert abs(float(train.load_balancing_loss(uniform, 2)) - 1.0) < 1e-6
    collapsed = torch.full((64, 8), -20.0)
    collapsed[:, 0] = 20.0
    assert float(train.load_balancing_loss([collapsed] * 4, 2)) > 3.9


def test_export_round_trip_and_routing_not_collapsed(tmp_path, windows, moe, draft):
    from lessonkit.models.convert import export_hf
    for name, eng in (("tiny-moe", moe), ("tiny-draft", draft)):
        hf = train.load_hf(export_hf(MODELS / name, tmp_path / name))
        x = windows["records"][0][:-1]
        with torch.no_grad():
            ref = hf(input_ids=x[None]).logits[0]
        assert (ref - engine_logits(eng, x)).abs().max() < 1e-3, name
        if name == "tiny-moe":
            load = torch.tensor(train.expert_load(hf, windows))        # [layers, experts]
            assert load.shape == (4, 8)
            assert float(load.min()) >= 0.02, load
            counts_moe = train.parameter_counts(hf)
        else:
            counts_draft = train.parameter_counts(hf)
    for key in ("active", "active_excl_embeddings"):
        assert counts_draft[key] * 8 <= counts_moe[key], (key, counts_draft, counts_moe)


def test_remeasure_rewrites_the_card_and_keeps_the_weights(tmp_path):
    """`lessonkit train NAME --measure-only`: new drafter figures in train_log.json and the card, the
    weights untouched, the manifest valid again."""
    import shutil

    from lessonkit.models.integrity import model_integrity
    src = MODELS / "tiny-draft"
    d = shutil.copytree(src, tmp_path / "tiny-draft")
    old = json.loads((d / "train_log.json").read_text())["speculative"]
    new = {**old, "acceptance": {"prose": 0.111, "code": 0.222, "records": 0.333, "mean": 0.222}, "c": 0.0123}
    train.remeasure("tiny-draft", lambda model_dir: new, d)
    assert json.loads((d / "train_log.json").read_text())["speculative"] == new
    card = (d / "card.md").read_text()
    assert "0.111" in card and "0.012" in card and "0.372" not in card
    assert (d / "dense.safetensors").read_bytes() == (src / "dense.safetensors").read_bytes()
    assert set(model_integrity(d).values()) == {"ok"}, model_integrity(d)
    with pytest.raises(LessonkitError, match="no train_log.json"):
        train.remeasure("x", lambda model_dir: new, tmp_path)


@pytest.mark.slow
def test_training_is_seeded_and_reproducible(tmp_path):
    """`lessonkit train` is deterministic for a seed and thread count: two short runs write the same weights."""
    from dataclasses import replace

    from safetensors.torch import load_file
    cfg = replace(train.PRESETS["tiny-draft-corpus"], steps=3, eval_every=3, eval_windows=1)
    logs = [train.train(cfg, hf_out=tmp_path / run, progress=False) for run in ("a", "b")]
    assert [s["ce"] for s in logs[0]["steps"]] == [s["ce"] for s in logs[1]["steps"]]
    assert logs[0]["steps"][0]["ce"] != logs[0]["steps"][-1]["ce"]                      # it trained
    wa, wb = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (corpus.CORPUS_DIR / "tokenizer.json").read_bytes()
