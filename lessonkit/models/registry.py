"""Named models: the workbook's own trained tiny models, and SmolLM2-135M-Instruct from PyPI."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lessonkit.models.adapters import merged_model_dir
from lessonkit.files.atomic import publish_dir
from lessonkit.models.borrowed import BORROW_FILE, assembled_dir, read_borrow
from lessonkit.engine.checkpoint import LAYOUT_FILES
from lessonkit.models.convert import convert_hf_checkpoint, convert_hf_state_dict
from lessonkit.files.safe_files import sha256_file
from lessonkit.models.integrity import write_manifest
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.engine.limits import check_memory_room
from lessonkit.models.integrity import check_model_files
from lessonkit.files.resources import lessonkit_home
from lessonkit.models.gguf_loader import load_gguf, smollm2_gguf_path

# the names, their folders and the listing live in lessonkit.models.listing (no torch: `lessonkit models` stays cheap)
from lessonkit.models.listing import (ADAPTED, CONVERTED, CONVERTER_REVISION, MODELS_DIR, SHIPPED,  # noqa: F401
                                      list_models, load_bytes, model_info, smollm2_cache_dir)


def _smollm2_dir() -> Path:
    out = smollm2_cache_dir()
    if (out / "config.json").exists():
        return out
    gguf = smollm2_gguf_path()
    m = load_gguf(gguf, blocks=True)
    with publish_dir(out, prefix=".convert-") as tmp:
        convert_hf_state_dict(m.hf_config, m.state_dict, tmp, m.tokenizer.to_str(), torch.float32, source=str(gguf))
        if m.chat_template:
            (tmp / "chat_template.jinja").write_text(m.chat_template, encoding="utf-8")
        write_manifest(tmp, [*LAYOUT_FILES, "chat_template.jinja"])   # checked at every load
    return out


def _adapted_dir(name: str) -> Path:
    """Base weights + the shipped adapter, merged once into lessonkit_home()/models/NAME-<adapter hash>/."""
    a = MODELS_DIR / name
    if not (a / "adapter.json").exists():
        raise LessonkitError(f"model {name!r}: {a} has no adapter.json (train it with "
                             f"`lessonkit train judge --model {name.removesuffix('-judge')}`)")
    base = json.loads((a / "adapter.json").read_text(encoding="utf-8"))["base"]
    return merged_model_dir(resolve_model_dir(base)[1], a, lessonkit_home() / "models", name)


def _completed(name: str, d: Path) -> Path:
    """d itself, or, when d borrows tensors from a base model (borrow.json), d assembled with them."""
    if not (d / BORROW_FILE).exists():
        return d
    check_model_files(d)                   # what it ships, then what it borrows, before anything is built
    base = resolve_model_dir(read_borrow(d)["base"])[1]
    check_model_files(base)
    return assembled_dir(d, base, lessonkit_home() / "models", name)


def resolve_model_dir(name_or_path: str) -> tuple[str, Path]:
    if name_or_path in SHIPPED:
        d = MODELS_DIR / name_or_path
        if not (d / "config.json").exists():
            raise LessonkitError(f"model {name_or_path!r}: {d} has no config.json (train it with "
                                 f"`lessonkit train {name_or_path}`)")
        return name_or_path, _completed(name_or_path, d)
    if name_or_path in CONVERTED:
        return name_or_path, _smollm2_dir()
    if name_or_path in ADAPTED:
        return name_or_path, _adapted_dir(name_or_path)
    p = Path(name_or_path)
    if p.is_dir():
        if (p / "config.json").exists() and (p / "dense.safetensors").exists():
            return p.name, _completed(p.name, p)
        if (p / "config.json").exists():     # a Hugging Face checkpoint: convert once, then stream
            key = sha256_file(p / "config.json")[:8] + "-" + "-".join(
                sha256_file(f)[:8] for f in sorted(p.glob("*.safetensors")))
            out = lessonkit_home() / "converted" / f"{p.name}-{key[:40]}"
            if not (out / "config.json").exists():
                convert_hf_checkpoint(p, out)
            return p.name, out
        raise LessonkitError(f"{p}: not a model directory (no config.json)")
    raise LessonkitError(f"unknown model {name_or_path!r}: known models are {', '.join(list_models())}, "
                         "or give a checkpoint directory")


def load_model(name_or_path: str, *, expert_budget_mb: float | None = None, dtype=torch.float32,
               prefetch: bool = False, weights: str | None = None):
    """An Engine for a registered name or a model directory. weights: "native" (quantised blocks multiplied as
    blocks), "f32" (dequantised) or None (LESSONKIT_WEIGHTS, else native where the C kernel runs)."""
    name, d = resolve_model_dir(name_or_path)
    # shipped and converted models must match their manifest; a user directory without one loads unverified
    eng_verified = check_model_files(d, required=not (Path(name_or_path).is_dir() and d == Path(name_or_path)))
    check_memory_room(load_bytes(d, expert_budget_mb), f"loading {name}")     # before any weight is read
    eng = Engine(d, name=name, expert_budget_mb=expert_budget_mb, dtype=dtype, prefetch=prefetch, weights=weights)
    tpl = d / "chat_template.jinja"
    eng.chat_template = tpl.read_text(encoding="utf-8") if tpl.exists() else None
    eng.weights_verified = eng_verified
    return eng
