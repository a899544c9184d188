"""A drafter with a reduced output layer (config head_rows) and borrowed tensors (borrow.json): its logits are
the full model's on its rows and -inf elsewhere, on every step path; it drafts losslessly; its files load
assembled and are refused by name when wrong. The cut's training loss and model (training.cut_draft)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from lessonkit.engine import kernel
from lessonkit.models.convert import export_hf
from lessonkit.models.integrity import write_manifest
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import ModelDrafter, c_step_why_not, lean_decode_step
from lessonkit.speculative.verify import speculative_generate
from lessonkit.training.cut_draft import cut_loss, cut_model, reduced_targets
from lessonkit.training.distill import distill_loss
from tests.hf_tiny import make_hf

torch.set_num_threads(1)
ROWS = torch.tensor([5, 0, 299, 42, 17, 100, 101, 64, 3, 250, 7, 8, 9, 10, 11, 12] + list(range(110, 190)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("cut")
    _, target = make_hf("olmoe", d)
    hf, draft = make_hf("llama", d, seed=1)
    return d, target, draft, hf


def reduced_copy(src, out, rows=ROWS, borrow_from=None):
    """src (an untied streaming-layout model) with its output layer cut to `rows`; with borrow_from, its
    embedding left out and borrowed from that directory."""
    shutil.copytree(src, out)
    c = ModelConfig.load(out / "config.json")
    c.head_rows = len(rows)
    c.save(out / "config.json")
    dense = load_file(out / "dense.safetensors")
    dense["lm_head"] = dense["lm_head"][rows].contiguous()
    dense["lm_head_ids"] = rows.to(torch.int64)
    if borrow_from is not None:
        del dense["embed"]
        (out / "borrow.json").write_text(json.dumps({"base": str(borrow_from), "tensors": ["embed"]}))
    save_file(dense, out / "dense.safetensors")
    write_manifest(out)
    return out


def _tokens(n, seed=3, vocab=300):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_reduced_output_layer_is_the_full_layer_on_its_rows(models):
    d, _, draft, _ = models
    full, red = Engine(draft), Engine(reduced_copy(draft, d / "reduced"))
    toks = _tokens(24)
    a = full.forward(toks, full.new_cache())
    b = red.forward(toks, red.new_cache())
    assert torch.equal(a[:, ROWS], b[:, ROWS])          # the same products, column by column
    others = torch.ones(300, dtype=torch.bool)
    others[ROWS] = False
    assert torch.isneginf(b[:, others]).all()
    exact, fast = red.new_cache(), red.new_cache()      # the lean step: within float noise (see test_speculative)
    red.forward(toks[:8], exact)
    red.forward(toks[:8], fast)
    for t in toks[8:]:
        x, y = red.forward([t], exact)[-1], lean_decode_step(red.model, t, fast)
        assert torch.isneginf(y[others]).all()
        assert torch.allclose(x[ROWS], y[ROWS], atol=1e-4, rtol=0)
        assert int(x.argmax()) == int(y.argmax())


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="the C kernel is not built")
def test_reduced_drafters_turn_in_c_maps_rows_to_token_ids(models):
    """A greedy turn in one C call on a cut output layer: each argmax row becomes its token id (head_ids) before
    it is looked up again, so the drafts are the engine forward's greedy tokens and the cache its bits."""
    d, _, draft, _ = models
    red = Engine(reduced_copy(draft, d / "turn"))
    assert c_step_why_not(red) is None
    drafter = ModelDrafter(red, step="C")
    for seed in range(3):
        ctx = _tokens(10, seed=seed)
        cache = red.new_cache()
        logits, want = red.forward(ctx, cache)[-1], []
        for _ in range(5):
            want.append(int(logits.argmax()))
            logits = red.forward([want[-1]], cache)[-1]
        assert drafter.propose(ctx, 5).tokens == want
        n = drafter.model.cache.length
        assert n == len(ctx) + 4 and torch.equal(drafter.model.cache.k[:, :n], cache.k[:, :n])


@pytest.mark.parametrize("step", ["auto", "torch"])
def test_reduced_drafter_is_lossless(models, step):
    """Its proposals are restricted to its rows; the target verifies them: output == plain greedy."""
    d, target, draft, _ = models
    red = Engine(reduced_copy(draft, d / f"lossless-{step}"))
    tgt = Engine(target)
    for seed in range(3):
        p = _tokens(10, seed=seed)
        ref = generate(tgt, p, 16).token_ids
        for k in (1, 3, "auto"):
            out = speculative_generate(tgt, ModelDrafter(red, step=step), p, 16, k=k, cost=[1.0 + 0.1 * j for j in range(9)])
            assert out.token_ids == ref, (step, seed, k)
        proposal = ModelDrafter(red, step=step).propose(p, 6)
        assert len(proposal) == 6 and set(proposal.tokens) <= set(ROWS.tolist())


def test_borrowed_embedding_assembles_the_same_model(models, tmp_path, monkeypatch):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path / "home"))        # where assembled models go
    d, _, draft, _ = models
    whole = Engine(reduced_copy(draft, tmp_path / "whole"))
    part = reduced_copy(draft, tmp_path / "part", borrow_from=draft)
    assert "embed" not in load_file(part / "dense.safetensors")
    eng = load_model(str(part))
    assert eng.model_dir != part and (eng.model_dir / "manifest.json").exists()
    toks = _tokens(12)
    assert torch.equal(whole.forward(toks, whole.new_cache()), eng.forward(toks, eng.new_cache()))
    assert load_model(str(part)).model_dir == eng.model_dir          # assembled once


def test_borrowing_is_refused_by_name(models, tmp_path, monkeypatch):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path / "home"))
    draft = models[2]
    wrong = reduced_copy(draft, tmp_path / "wrong", borrow_from=draft)
    other = make_hf("llama", tmp_path, seed=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)[1]
    (wrong / "borrow.json").write_text(json.dumps({"base": str(other), "tensors": ["embed"]}))
    write_manifest(wrong)
    with pytest.raises(LessonkitError, match=r"cannot borrow embed .*\(300, 32\).*\(300, 64\)"):
        load_model(str(wrong))
    (wrong / "borrow.json").write_text(json.dumps({"base": str(draft), "tensors": ["norm"]}))
    write_manifest(wrong)
    with pytest.raises(LessonkitError, match="norm is both shipped and borrowed"):
        load_model(str(wrong))
    (wrong / "borrow.json").write_text("{not json")
    write_manifest(wrong)
    with pytest.raises(LessonkitError, match=r"borrow.json: not valid JSON"):
        load_model(str(wrong))
    (wrong / "borrow.json").write_text(json.dumps({"base": str(draft), "tensors": ["embed"]}))
    with pytest.raises(LessonkitError, match="borrow.json"):                 # changed after its manifest
        load_model(str(wrong))


def test_head_rows_config_and_files_are_checked(models, tmp_path):
    d, _, draft, _ = models
    base = ModelConfig.load(draft / "config.json").to_dict()
    for bad, msg in (({"head_rows": 0}, "head_rows must be"), ({"head_rows": 301}, "head_rows must be"),
                     ({"head_rows": True}, "head_rows must be"),
                     ({"head_rows": 8, "tie_embeddings": True}, "untied output layer")):
        with pytest.raises(LessonkitError, match=msg):
            ModelConfig.from_dict({**base, **bad})
    red = reduced_copy(draft, tmp_path / "dup", rows=torch.tensor([1, 2, 2, 3]))
    with pytest.raises(LessonkitError, match="lm_head_ids must be 4 distinct"):
        Engine(red)
    ok = reduced_copy(draft, tmp_path / "ok")
    with pytest.raises(LessonkitError, match="no transformers equivalent"):
        export_hf(ok, tmp_path / "hf-out")
    assert not (tmp_path / "hf-out").exists()


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="the C kernel is not built")
def test_a_c_draft_turn_refuses_tokens_outside_the_vocabulary(models, tmp_path):
    red = Engine(reduced_copy(models[2], tmp_path / "r"))
    fwd = red.model.c_forward
    assert len(fwd.draft_greedy([299], red.new_cache(), 0, 2, ids=red.model.head_ids)) == 2   # above head_rows: fine
    with pytest.raises(LessonkitError, match="outside the vocabulary"):
        fwd.draft_greedy([300], red.new_cache(), 0, 2, ids=red.model.head_ids)
    with pytest.raises(LessonkitError, match="output layer has"):
        fwd.draft_greedy([3], red.new_cache(), 0, 2, ids=red.model.head_ids[:4])


def test_cut_loss_is_the_distillation_loss_on_kept_rows():
    g = torch.Generator().manual_seed(0)
    V, K = 50, 4
    logits = torch.randn(3, 5, V, generator=g)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(15)]).view(3, 5, K)
    probs = torch.softmax(torch.randn(3, 5, K, generator=g), -1)
    identity = torch.arange(V)
    full = distill_loss(logits, ids, probs, 0.5)
    assert torch.allclose(cut_loss(logits, *reduced_targets(ids, probs, identity), 0.5), full, atol=1e-6)
    # drop every token >= 25 from the output layer: rows [0, 25), the loss over what is left
    row_of = torch.where(identity < 25, identity, torch.full_like(identity, -1))
    rows, p, has_pick = reduced_targets(ids, probs, row_of)
    assert torch.equal(has_pick, ids[..., 0] < 25)
    assert torch.equal(p == 0, ids >= 25)
    kept = logits[..., :25]
    want_soft = torch.stack([-(pp / pp.sum() * torch.log_softmax(lg, -1)[r]).sum() if pp.sum() > 0 else torch.tensor(0.)
                             for lg, r, pp in zip(kept.view(15, 25), rows.view(15, K), p.view(15, K))]).mean()
    lp = torch.log_softmax(kept, -1).gather(-1, rows[..., :1]).squeeze(-1)
    want_hard = -(lp * has_pick).sum() / has_pick.sum()
    assert torch.allclose(cut_loss(kept, rows, p, has_pick, 0.5), want_soft + 0.5 * want_hard, atol=1e-6)
    # a loss that forgot the mask (the greedy pick's row taken as row 0) differs
    assert not torch.allclose(cut_loss(kept, rows, p, torch.ones_like(has_pick), 0.5), want_soft + 0.5 * want_hard)


def test_cut_model_keeps_the_targets_layers_and_freezes_its_embedding(models):
    hf = models[3]                                   # the transformers model the drafter was converted from
    ids = torch.tensor([3, 1, 4, 15, 9])
    m = cut_model(hf, (1,), ids)
    assert len(m.model.layers) == 1 and m.config.num_hidden_layers == 1
    assert torch.equal(m.model.layers[0].mlp.up_proj.weight, hf.model.layers[1].mlp.up_proj.weight)
    assert m.model.layers[0].mlp.up_proj.weight.data_ptr() != hf.model.layers[1].mlp.up_proj.weight.data_ptr()
    assert torch.equal(m.lm_head.weight, hf.lm_head.weight[ids])
    assert not m.model.embed_tokens.weight.requires_grad
    assert m(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 5)
    with pytest.raises(LessonkitError, match="layers 0 .. 1"):
        cut_model(hf, (0, 2), ids)


# ---------------------------------------------------------------- the teacher pass' rows (workloads.distill)
@pytest.fixture(scope="module")
def corpus_engine():
    return load_model("tiny-moe")          # the corpus tokenizer; corpus_rows only encodes and decodes


def test_teacher_rows_come_from_the_split_head_or_spread_over_it(corpus_engine):
    from dataclasses import replace
    from lessonkit.training.distill import PRESETS, _stream, corpus_rows
    head = replace(PRESETS["test"], text_rows=6, greedy_rows=3, seq_len=32)
    spread = replace(head, spread=True)
    ids = _stream(corpus_engine, "code", "train", None)
    text, _ = corpus_rows(corpus_engine, "code", head)
    assert text.flatten().tolist() == ids[:6 * 32]                  # consecutive windows from the start
    a, pa = corpus_rows(corpus_engine, "code", spread)
    b, pb = corpus_rows(corpus_engine, "code", spread)
    assert torch.equal(a, b) and torch.equal(pa, pb)                # seeded
    slots = []
    for w in a.tolist():                                            # every window is a slot of the whole stream
        s = next(i for i in range(0, len(ids) - 32, 32) if ids[i:i + 32] == w)
        slots.append(s // 32)
    assert len(set(slots)) == 6 and slots == sorted(slots)
    assert max(slots) * 32 > (head.text_rows + head.greedy_rows + 2) * head.seq_len   # beyond the head's tokens
    assert max(slots) * 32 > len(ids) // 4


def test_teacher_pass_cache_keys_before_the_spread_option_are_kept(corpus_engine):
    """Passes cached before DistillConfig.spread existed keep their file; a spread pass gets its own."""
    from dataclasses import replace
    from lessonkit.training.distill import PRESETS, cache_path
    assert cache_path(corpus_engine, PRESETS["tiny-moe"]).name.endswith("-9a2293bbf39c.pt")
    assert cache_path(corpus_engine, replace(PRESETS["tiny-moe"], spread=True)).name != \
        cache_path(corpus_engine, PRESETS["tiny-moe"]).name
