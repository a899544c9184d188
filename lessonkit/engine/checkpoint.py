"""The engine's streaming layout: what a model folder holds, and loading it (conversion is lessonkit.models.convert).

A model directory holds:
  config.json          lessonkit ModelConfig
  dense.safetensors    embeddings, attention, norms, routers, output head (always resident)
  experts.safetensors  `layers.{l}.experts.{e}`: one record per expert, gate, up, down^T adjacent on disk,
                       in the kernel's packed layout (lessonkit.engine.blocks, format 2: metadata "format" =
                       blocks.EXPERTS_FORMAT), so streaming an expert is one read and no re-pack; older
                       files hold float [3, I, D] (format 1, still read, packed at each load)
  tokenizer.json       a `tokenizers` tokenizer
  manifest.json        SHA-256 of every file (checked by `lessonkit doctor`)
A dense model's MLP is stored as expert 0 of each layer (the one-expert case).

Native blocks: a model converted from Q4_1 / Q8_0 GGUF tensors (SmolLM2) keeps them as uint8 tensors of
their own blocks (dense matrices [rows, bytes per row], packed once at load; an expert as one flat record of
its gate|up and down strip-blocks), never as a float32 copy. `load_dense` / `load_experts` give float32 (dequantised exactly) to
code that wants float weights; the engine asks for the blocks (lessonkit.engine.blocks).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from lessonkit.engine import blocks as qb
from lessonkit.files.atomic import atomic_write
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError

FORMAT_VERSION = 1
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)     # weights a config expects (besides uint8 blocks)
_ST_NAMES = {torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64", torch.float64: "F64",
             torch.bool: "BOOL", torch.uint8: "U8"}
LAYOUT_FILES = ("config.json", "dense.safetensors", "experts.safetensors", "tokenizer.json", "borrow.json")


def _atomic_save(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    atomic_write(path, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=metadata))


def parse_safetensors_header(f, size: int) -> tuple[dict, int, int]:
    """(header, data start, data end) of an open safetensors file of `size` bytes, read by hand (the
    byte offsets are needed for pread). The header keeps "__metadata__". Raises ValueError saying what
    is wrong; the caller names the file."""
    raw = f.read(8)
    if len(raw) < 8:
        raise ValueError(f"truncated ({size} bytes, no safetensors header)")
    (n,) = struct.unpack("<Q", raw)
    if n > 100_000_000 or 8 + n > size:
        raise ValueError(f"truncated or not a safetensors file (header length {n}, file {size} bytes)")
    try:
        header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError("corrupt safetensors header (not a JSON object)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise ValueError(f"malformed tensor entry {name!r}") from None
    return header, 8 + n, 8 + n + end


# ---- Hugging Face -> streaming layout ---------------------------------------------------------
class _Tensors:
    """A Hugging Face state dict taken apart tensor by tensor: a missing one is an error naming it."""

    def __init__(self, state_dict: dict, source: str):
        self.sd, self.source = dict(state_dict), source

    def take(self, name: str) -> torch.Tensor:
        if name not in self.sd:
            raise LessonkitError(f"{self.source}: missing tensor {name}")
        return self.sd.pop(name)

    def has(self, name: str) -> bool:
        return name in self.sd


def _layer_tensors(c: ModelConfig, t: _Tensors, l: int, dense: dict, experts: dict) -> None:
    """Layer l's attention and norms into `dense`, its experts as [3, I, D] (gate, up, down^T) into `experts`."""
    p, q = f"model.layers.{l}.", f"layers.{l}."
    dense[q + "attn_norm"] = t.take(p + "input_layernorm.weight")
    dense[q + "mlp_norm"] = t.take(p + "post_attention_layernorm.weight")
    for a, b in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
        dense[q + a] = t.take(p + f"self_attn.{b}.weight")
    if c.qk_norm:
        dense[q + "q_norm"] = t.take(p + "self_attn.q_norm.weight")
        dense[q + "k_norm"] = t.take(p + "self_attn.k_norm.weight")
    if not c.is_moe:
        g, u, d = (t.take(p + f"mlp.{n}.weight") for n in ("gate_proj", "up_proj", "down_proj"))
        if g.dtype == torch.uint8:                       # native blocks: one record, no transpose
            experts[q + "experts.0"] = qb.expert_blob(g, u, d, c.intermediate_size, c.dim, t.source + ": " + q + "mlp")
            return
        experts[q + "experts.0"] = torch.stack([g, u, d.T])
        return
    moe = "block_sparse_moe." if t.has(p + "block_sparse_moe.gate.weight") else "mlp."
    dense[q + "router"] = t.take(p + moe + "gate.weight")
    if t.has(p + moe + "experts.gate_up_proj"):     # fused layout (transformers 5 in memory)
        gu, dn = t.take(p + moe + "experts.gate_up_proj"), t.take(p + moe + "experts.down_proj")
        for e in range(c.n_experts):
            g, u = gu[e].chunk(2, dim=0)
            experts[q + f"experts.{e}"] = torch.stack([g, u, dn[e].T])
        return
    names = ("w1", "w3", "w2") if moe == "block_sparse_moe." else ("gate_proj", "up_proj", "down_proj")
    for e in range(c.n_experts):
        g, u, d = (t.take(p + moe + f"experts.{e}.{n}.weight") for n in names)
        experts[q + f"experts.{e}"] = torch.stack([g, u, d.T])


def _check_shapes(c: ModelConfig, dense: dict, experts: dict, source: str) -> None:
    want = c.dense_shapes()
    for k, v in dense.items():
        if v.dtype == torch.uint8:
            qb.block_kind(v.shape, want[k], f"{source}: {k}")
        elif tuple(v.shape) != want[k]:
            raise LessonkitError(f"{source}: tensor for {k} has shape {tuple(v.shape)}, config needs {want[k]}")
    eshape = (3, c.intermediate_size, c.dim)
    for k, v in experts.items():
        if v.dtype == torch.uint8:
            qb.expert_parts(v, c.intermediate_size, c.dim, f"{source}: {k}")
        elif tuple(v.shape) != eshape:
            raise LessonkitError(f"{source}: expert {k} has shape {tuple(v.shape)}, config needs {eshape}")


def save_packed_experts(experts: dict, path: Path, c: ModelConfig) -> None:
    """Format-1 expert records (float [3, I, D] or uint8 GGUF rows) written packed (format 2), atomically."""
    packed = {k: qb.pack_expert(v, c.intermediate_size, c.dim, f"{path}: {k}") for k, v in experts.items()}
    _atomic_save(packed, path, {"format": qb.EXPERTS_FORMAT})


def experts_layout(path: Path) -> int:
    """The expert layout of an experts.safetensors: 2 (packed, blocks.EXPERTS_FORMAT) or 1 (older)."""
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, Exception) as e:  # safetensors raises several types for corrupt files
        raise LessonkitError(f"{path}: corrupt or truncated safetensors ({e})") from None
    return 2 if meta.get("format") == qb.EXPERTS_FORMAT else 1


# ---- streaming layout -> Hugging Face ---------------------------------------------------------
# ---- loading & integrity ----------------------------------------------------------------------
def load_dense(model_dir: Path, c: ModelConfig, *, blocks: bool = False) -> dict[str, torch.Tensor]:
    """The dense tensors, checked against the config; native blocks dequantised to float32 unless blocks=True
    (then they stay uint8 blocks, each checked to be Q4_1 or Q8_0 rows of its matrix)."""
    path = Path(model_dir) / "dense.safetensors"
    if not path.exists():
        raise LessonkitError(f"{path}: file not found")
    try:
        dense = load_file(path)
    except (SafetensorError, OSError, Exception) as e:  # safetensors raises several types for corrupt files
        raise LessonkitError(f"{path}: corrupt or truncated safetensors ({e})") from None
    want = c.dense_shapes()
    missing = sorted(set(want) - set(dense))
    if missing and not any(k.startswith("layers.") for k in missing):
        raise LessonkitError(f"{path}: missing tensors {missing[:5]}")
    missing = [k for k in want if k.startswith("layers.") and k not in dense]
    if missing:
        raise LessonkitError(layers_error(path, c.n_layers, layers_held(dense), missing[0]))
    for k, shape in want.items():
        if k != "lm_head_ids" and dense[k].dtype not in FLOAT_DTYPES and dense[k].dtype != torch.uint8:
            raise LessonkitError(f"{path}: tensor {k} has dtype {_ST_NAMES.get(dense[k].dtype, dense[k].dtype)}; "
                                 f"config.json expects float weights (F32, BF16 or F16) or uint8 Q4_1 / Q8_0 blocks")
        if dense[k].dtype == torch.uint8 and k != "lm_head_ids":
            kind = qb.block_kind(dense[k].shape, shape, f"{path}: {k}")
            if not blocks:
                dense[k] = qb.dequantise_rows(dense[k], kind)
        elif tuple(dense[k].shape) != shape:
            raise LessonkitError(f"{path}: tensor {k} has shape {tuple(dense[k].shape)}, config.json needs {shape}")
    # load_file's tensors are views of the file's mapping: a float tensor the engine keeps as is (a norm) would
    # keep every page of the file resident; a copy of each lets the mapping go once the blocks are packed
    dense = {k: v.clone() if v.dtype != torch.uint8 else v for k, v in dense.items()}
    if c.head_rows is not None:
        ids = dense["lm_head_ids"]
        if ids.dtype != torch.int64 or int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size or \
                len(torch.unique(ids)) != len(ids):
            raise LessonkitError(f"{path}: lm_head_ids must be {c.head_rows} distinct int64 token ids below "
                                 f"vocab_size={c.vocab_size}")
    return dense


def layers_held(tensors) -> int:
    """How many layers (0..n-1, every one present) the tensor names `layers.{l}.*` cover."""
    held = {int(k.split(".")[1]) for k in tensors if k.startswith("layers.") and k.split(".")[1].isdigit()}
    n = 0
    while n in held:
        n += 1
    return n


def layers_error(path, n_layers: int, held: int, missing: str) -> str:
    """The error for weights that stop before config.json's last layer: what to fix is n_layers (or the files)."""
    if held < n_layers:
        return (f"{path}: holds {held} layers, but config.json says n_layers={n_layers} (missing tensor {missing}); "
                f"set n_layers to {held} in config.json or use the weight files of this config")
    return f"{path}: missing tensor {missing}"


def load_experts(model_dir: Path, c: ModelConfig) -> dict[str, torch.Tensor]:
    """Every expert as float32 [3, I, D] (gate, up, down^T), native records dequantised: for code that trains,
    merges or exports (the engine streams experts itself, lessonkit.engine.expert_store)."""
    path = Path(model_dir) / "experts.safetensors"
    layout = experts_layout(path)
    try:
        experts = load_file(path)
    except (SafetensorError, OSError, Exception) as e:  # safetensors raises several types for corrupt files
        raise LessonkitError(f"{path}: corrupt or truncated safetensors ({e})") from None
    if layout == 2:
        return {k: qb.dequantise_expert(v, c.intermediate_size, c.dim, f"{path}: {k}") for k, v in experts.items()}
    for k, v in experts.items():
        if v.dtype == torch.uint8:
            raise LessonkitError(qb.old_rows_error(path, k))
    return experts
