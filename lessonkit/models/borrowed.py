"""Model directories that take some tensors from another model at load, instead of shipping a copy.

A drafter cut from its target (smollm2-draft: two of smollm2-135m's layers, fine-tuned, with an output
layer over the 8,192 most frequent tokens) keeps the target's input embedding unchanged: 49,152 x 576
numbers, 57 MB in bfloat16, more than everything the drafter changed. Its directory holds

  borrow.json            {"base": model name, "tensors": [dense tensor names taken from the base]}
  dense.safetensors      every other dense tensor; experts.safetensors, config.json, tokenizer.json as usual

and is assembled once, at first load, into a complete model directory (the engine's streaming layout) under
lessonkit_home()/models/NAME-a<revision>-<hash of the shipped files and the base's manifest>/: the engine then loads a
plain model. A base whose tensors do not have the shapes the config asks for is refused by name.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from lessonkit.files.atomic import publish_dir
from lessonkit.engine.checkpoint import FORMAT_VERSION, load_dense
from lessonkit.files.safe_files import sha256_file
from lessonkit.models.integrity import write_manifest
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError

BORROW_FILE = "borrow.json"
REVISION = 2                 # of the assembly: a directory assembled by other code is rebuilt, not reused
SHIPPED_FILES = (BORROW_FILE, "config.json", "dense.safetensors", "experts.safetensors", "tokenizer.json")


def read_borrow(model_dir: Path) -> dict:
    """borrow.json of model_dir: {"base": str, "tensors": [str, ...]}, checked."""
    f = Path(model_dir) / BORROW_FILE
    try:
        meta = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LessonkitError(f"{f}: file not found") from None
    except json.JSONDecodeError as e:
        raise LessonkitError(f"{f}: not valid JSON ({e})") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("base"), str) and isinstance(meta.get("tensors"), list)
            and meta["tensors"] and all(isinstance(t, str) for t in meta["tensors"])):
        raise LessonkitError(f"{f}: expected {{\"base\": model name, \"tensors\": [dense tensor names]}}")
    return meta


def assembled_dir(model_dir: Path, base_dir: Path, out_root: Path, name: str) -> Path:
    """model_dir completed with the base's borrowed tensors, as a model directory under out_root (built once)."""
    model_dir, base_dir = Path(model_dir), Path(base_dir)
    meta = read_borrow(model_dir)
    key = "-".join(sha256_file(model_dir / f)[:8] for f in SHIPPED_FILES if (model_dir / f).exists())
    key += "-" + sha256_file(base_dir / "manifest.json")[:8]
    out = out_root / f"{name}-a{REVISION}-{key}"
    if (out / "config.json").exists():
        return out
    c = ModelConfig.load(model_dir / "config.json")
    dense = load_file(model_dir / "dense.safetensors")
    base = load_dense(base_dir, ModelConfig.load(base_dir / "config.json"))   # float32 (native blocks dequantised)
    want = c.dense_shapes()
    for t in meta["tensors"]:
        if t in dense:
            raise LessonkitError(f"{model_dir}: {t} is both shipped and borrowed from {meta['base']}")
        if t not in base or t not in want or tuple(base[t].shape) != want[t]:
            got = tuple(base[t].shape) if t in base else "missing"
            raise LessonkitError(f"{model_dir}: cannot borrow {t} from {meta['base']} ({base_dir}): "
                                 f"the base has {got}, config.json needs {want.get(t, 'no such tensor')}")
        dense[t] = base[t]        # as the base stores it: the tensor the drafter was trained with
    with publish_dir(out, prefix=".assemble-") as tmp:
        save_file({k: v.contiguous() for k, v in sorted(dense.items())}, tmp / "dense.safetensors",
                  {"format": f"lessonkit-stream-v{FORMAT_VERSION}"})
        for f in ("config.json", "experts.safetensors", "tokenizer.json"):
            if (model_dir / f).exists():
                shutil.copyfile(model_dir / f, tmp / f)
        write_manifest(tmp)
    return out
