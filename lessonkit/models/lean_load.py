"""A registered model for `lessonkit generate`: the torch-free engine (lessonkit.engine.lean) where it serves the
request, else the torch engine (lessonkit.models.registry), which gives the same tokens.

The torch-free engine loads a model whose folder is built already, its files checked against their manifest as
load_model checks them. A model that must first be converted (SmolLM2 from its GGUF), assembled (a drafter
borrowing its target's tensors) or merged (a base with an adapter) is built by the registry, which needs torch;
so is a model or request the torch-free engine does not serve (engine.lean.why_not). The choice is made before
torch is imported or any weight read: `torch_free_dir`, then `open_engine`.
"""
from __future__ import annotations

from pathlib import Path

from lessonkit.engine import lean
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.limits import check_memory_room
from lessonkit.models.integrity import check_model_files
from lessonkit.models.listing import CONVERTED, MODELS_DIR, SHIPPED, load_bytes, smollm2_cache_dir


def built_dir(name: str) -> Path | None:
    """The folder a registered model loads from when nothing has to be built first, else None."""
    if name in SHIPPED:
        d = MODELS_DIR / name
        return d if (d / "config.json").exists() and not (d / "borrow.json").exists() else None
    if name in CONVERTED:
        d = smollm2_cache_dir()
        return d if (d / "config.json").exists() else None
    return None


def torch_free_dir(name: str, weights: str | None = None, needs_torch: str | None = None) -> tuple[Path | None, str]:
    """(the folder the torch-free engine loads `name` from, "") or (None, why the torch engine loads it), from the
    request (needs_torch: what in it runs on torch only), the model's config and its files' headers, read once the
    files are checked against their manifest (as load_model checks them: a bad file raises, never falls back)."""
    if needs_torch:
        return None, f"{needs_torch} runs on torch"
    d = built_dir(name)
    if d is None:
        return None, f"{name!r} is not a registered model built already"
    check_model_files(d, required=True)
    c = ModelConfig.load(d / "config.json")
    reason = lean.why_not(c, weights) or lean.files_why_not(d, c)
    return (None, reason) if reason else (d, "")


def open_engine(name: str, torch_free: Path | None, why: str, *, expert_budget_mb: float | None = None,
                dtype: str = "float32", prefetch: bool = False, weights: str | None = None) -> tuple[object, str]:
    """(the engine, which forward runs): LeanEngine over `torch_free` (a folder torch_free_dir gave, its files checked),
    else (or when its files hold what it does not serve) the torch engine."""
    if torch_free is not None:
        check_memory_room(load_bytes(torch_free, None), f"loading {name}")     # before any weight is read
        try:
            eng = lean.LeanEngine(torch_free, name=name, weights=weights)
            eng.weights_verified = True
            return eng, "C forward without torch"
        except lean.NotServed as e:
            why = str(e)
    import torch
    from lessonkit.models.registry import load_model
    eng = load_model(name, expert_budget_mb=expert_budget_mb, prefetch=prefetch, weights=weights,
                     dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    return eng, f"torch engine: {why}"
