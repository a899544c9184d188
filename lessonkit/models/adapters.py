"""Low-rank adapters (LoRA) merged into a model's plain weights, once, at load.

An adapter directory holds
  adapter.json           {"base": model name, "rank": r, "targets": [weight names]}
  adapter.safetensors    "<weight>.lora_A" [r, in] and "<weight>.lora_B" [out, r] (the scale folded into B)
  manifest.json          SHA-256 of its files
A weight name is a dense tensor of the streaming layout ("layers.3.wq", ...) or one projection of an
expert ("layers.3.experts.0.gate" / ".up" / ".down", down as [D, I]). Merging computes W + B A in
float32 and writes a complete model directory (the engine's streaming layout), so the engine runs the
adapted model with no adapter code on its hot path: an adapted model is a plain model, and every
exactness property of the engine (speculative decoding, prefix caching) holds for it unchanged.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lessonkit.files.atomic import publish_dir
from lessonkit.engine.checkpoint import load_dense, load_experts
from lessonkit.files.safe_files import sha256_file
from lessonkit.models.integrity import write_manifest
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError

ADAPTER_FILES = ("adapter.json", "adapter.safetensors")
EXPERT_PARTS = {"gate": 0, "up": 1, "down": 2}


def adapter_key(adapter_dir: Path) -> str:
    """Short content hash of an adapter (names its merged model directory)."""
    return "-".join(sha256_file(adapter_dir / f)[:8] for f in ADAPTER_FILES)


def read_adapter(adapter_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    d = Path(adapter_dir)
    try:
        meta = json.loads((d / "adapter.json").read_text(encoding="utf-8"))
        tensors = load_file(d / "adapter.safetensors")
    except FileNotFoundError as e:
        raise LessonkitError(f"adapter {d}: missing {Path(e.filename).name}") from None
    except (json.JSONDecodeError, OSError, Exception) as e:      # safetensors raises its own error types
        raise LessonkitError(f"adapter {d}: unreadable ({e})") from None
    for t in meta.get("targets", []):
        if f"{t}.lora_A" not in tensors or f"{t}.lora_B" not in tensors:
            raise LessonkitError(f"adapter {d}: target {t} has no lora_A / lora_B tensors")
    return meta, tensors


def lora_delta(tensors: dict, target: str) -> torch.Tensor:
    return tensors[f"{target}.lora_B"].float() @ tensors[f"{target}.lora_A"].float()


def merge_into(dense: dict, experts: dict, meta: dict, tensors: dict, source: str) -> None:
    """Add every target's B A to its weight, in float32 (dense / experts: streaming-layout tensors)."""
    for t in meta["targets"]:
        delta = lora_delta(tensors, t)
        if ".experts." in t:
            key, _, part = t.rpartition(".")
            if key not in experts or part not in EXPERT_PARTS:
                raise LessonkitError(f"adapter {source}: no expert weight {t}")
            w = experts[key] = experts[key].float().clone()
            i = EXPERT_PARTS[part]
            d = delta.T if part == "down" else delta          # down is stored transposed ([I, D])
            if w[i].shape != d.shape:
                raise LessonkitError(f"adapter {source}: {t} is {tuple(d.shape)}, the weight {tuple(w[i].shape)}")
            w[i] += d
        else:
            if t not in dense:
                raise LessonkitError(f"adapter {source}: no weight {t}")
            if dense[t].shape != delta.shape:
                raise LessonkitError(f"adapter {source}: {t} is {tuple(delta.shape)}, the weight {tuple(dense[t].shape)}")
            dense[t] = dense[t].float() + delta


def merged_model_dir(base_dir: Path, adapter_dir: Path, out_root: Path, name: str) -> Path:
    """The base model with the adapter merged in, as a model directory under out_root (built once)."""
    out = out_root / f"{name}-{adapter_key(adapter_dir)}"
    if (out / "config.json").exists():
        return out
    meta, tensors = read_adapter(adapter_dir)
    c = ModelConfig.load(base_dir / "config.json")
    dense, experts = load_dense(base_dir, c), load_experts(base_dir, c)     # float32 (native blocks dequantised)
    merge_into(dense, experts, meta, tensors, str(adapter_dir))
    with publish_dir(out, prefix=".merge-") as tmp:
        save_file({k: v.float().contiguous() for k, v in dense.items()}, tmp / "dense.safetensors")
        save_file({k: v.float().contiguous() for k, v in experts.items()}, tmp / "experts.safetensors")
        for f in ("config.json", "tokenizer.json", "chat_template.jinja"):
            if (base_dir / f).exists():
                shutil.copyfile(base_dir / f, tmp / f)
        write_manifest(tmp)
    return out
