"""Trained judges: the LoRA training model computes the engine's logits, and an adapter merged at load
gives the engine exactly the adapted model the training computed."""
import json

import pytest
import torch
from safetensors.torch import save_file

from lessonkit.models.adapters import merged_model_dir
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.training.lora import LoraModel
from tests.hf_tiny import make_hf


@pytest.fixture(scope="module", params=["llama", "olmoe"])
def stream_dir(request, tmp_path_factory):
    _, d = make_hf(request.param, tmp_path_factory.mktemp(f"lora-{request.param}"))
    return d


def _engine_logits(d, prefix, item):
    eng = Engine(d)
    cache = eng.new_cache(128)
    eng.forward(prefix, cache)
    return eng.forward(item, cache)


def _lora_logits(m, prefix, item):
    with torch.no_grad():
        xp, kvp = m.bottom(torch.tensor([prefix]), 0)
        xi, _ = m.bottom(torch.tensor([item]), len(prefix), kvp)
        _, kvt = m.top(xp, 0)
        h, _ = m.top(xi, len(prefix), kvt)
        return m.logits(h)[0]


PREFIX, ITEM = [5, 17, 99, 3, 250, 41], [7, 8, 9, 200, 12]


def test_lora_model_with_zero_adapter_computes_the_engine_logits(stream_dir):
    m = LoraModel(stream_dir, n_top=1, rank=4)
    ref = _engine_logits(stream_dir, PREFIX, ITEM)
    got = _lora_logits(m, PREFIX, ITEM)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)


def test_merged_adapter_is_what_training_computed(stream_dir, tmp_path):
    m = LoraModel(stream_dir, n_top=2, rank=4, seed=1)
    with torch.no_grad():
        for k, p in m.lora.items():
            if k.endswith("__B"):
                p.copy_(torch.randn_like(p) * 0.5)
    want = _lora_logits(m, PREFIX, ITEM)
    assert not torch.allclose(want, _engine_logits(stream_dir, PREFIX, ITEM), atol=1e-3)   # the adapter matters
    a = tmp_path / "adapter"
    a.mkdir()
    tensors = m.adapter_tensors()
    save_file(tensors, a / "adapter.safetensors")
    targets = sorted({k.rpartition(".lora_")[0] for k in tensors})
    (a / "adapter.json").write_text(json.dumps({"base": "x", "rank": 4, "targets": targets}))
    merged = merged_model_dir(stream_dir, a, tmp_path / "merged", "x-judge")
    assert merged_model_dir(stream_dir, a, tmp_path / "merged", "x-judge") == merged      # built once
    got = _engine_logits(merged, PREFIX, ITEM)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_adapter_naming_a_missing_weight_is_refused(stream_dir, tmp_path):
    a = tmp_path / "bad"
    a.mkdir()
    save_file({"layers.9.wq.lora_A": torch.zeros(2, 64), "layers.9.wq.lora_B": torch.zeros(64, 2)},
              a / "adapter.safetensors")
    (a / "adapter.json").write_text(json.dumps({"base": "x", "rank": 2, "targets": ["layers.9.wq"]}))
    with pytest.raises(LessonkitError, match="layers.9.wq"):
        merged_model_dir(stream_dir, a, tmp_path / "merged", "bad")


@pytest.mark.slow
def test_judge_training_is_reproducible():
    from lessonkit.training.judge import JudgeTrainConfig, train_adapter
    cfg = JudgeTrainConfig("tiny-moe", n_top=1, rank=2, epochs=1, batch=8, n_originals=6, n_shots=2, warmup=2)
    (m1, log1), (m2, log2) = train_adapter(cfg, progress=False), train_adapter(cfg, progress=False)
    assert log1["losses"] == log2["losses"]
    a1, a2 = m1.adapter_tensors(), m2.adapter_tensors()
    assert a1.keys() == a2.keys() and all(torch.equal(a1[k], a2[k]) for k in a1)
    assert any(a1[k].abs().sum() > 0 for k in a1 if k.endswith("lora_B"))      # it trained


def test_shipped_judge_loads_as_base_plus_adapter():
    from lessonkit.models.registry import MODELS_DIR, list_models, resolve_model_dir
    from lessonkit.models.integrity import verify_manifest
    assert "tiny-moe-judge" in list_models()
    name, d = resolve_model_dir("tiny-moe-judge")
    assert name == "tiny-moe-judge" and (d / "dense.safetensors").exists()
    assert set(verify_manifest(MODELS_DIR / "tiny-moe-judge").values()) == {"ok"}
    eng = Engine(d, name=name)
    base = Engine(MODELS_DIR / "tiny-moe")
    assert not torch.equal(eng.model.w["layers.0.wq"], base.model.w["layers.0.wq"])      # the adapter is merged
    assert torch.equal(eng.model.w["embed"], base.model.w["embed"])                      # the rest is the base


def test_unknown_judge_adapter_is_refused(monkeypatch, tmp_path):
    from lessonkit.models import registry
    monkeypatch.setattr(registry, "MODELS_DIR", tmp_path)
    with pytest.raises(LessonkitError, match="train judge"):
        registry.resolve_model_dir("tiny-moe-judge")
