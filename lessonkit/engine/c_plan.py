"""What the C forward (csrc/forward.c) is handed, as plain numbers and numpy arrays: no torch.

The plan is the list of addresses of a model's weights, each word at the slot csrc/rowkernel.h names (PLAN_GLOBALS
words, then PLAN_LAYER words for each layer; engine/kernel_library.py mirrors the names); the dims are the model's
sizes, each at its DIM_ slot; the RoPE tables are the rotations of every position. The torch engine (engine/c_forward.py) and the torch-free generate (engine/lean.py) build them here, so
the two hand the kernel the same plan and the same tables. Which forward runs (LESSONKIT_FORWARD,
`active.use(forward=...)`) is read here too: both engines honour it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from lessonkit.engine import settings
from lessonkit.engine import kernel_library as rk
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError

KEY_BUCKET = 64            # positions are allocated (and, on the PyTorch forward, attended) in buckets of 64

FORWARD_CHOICES = ("c", "torch")


def requested_path() -> str:
    """LESSONKIT_FORWARD, or `active.use(forward=...)` around the call (engine.settings.current): "c" (the default
    where possible), "torch" (the PyTorch reference forward) or "auto"."""
    req = settings.current().forward
    if req not in ("auto",) + FORWARD_CHOICES:
        raise LessonkitError(f"LESSONKIT_FORWARD={req!r}: expected c, torch or auto")
    return req


def rope_tables(c: ModelConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, head_dim] float32 in the rotate-half layout of Hugging Face Llama. The angles are float32
    (position x inverse frequency, as transformers computes them); their cos and sin are computed in float64 and
    rounded once, so the tables do not depend on the vector library that computes them (torch's and numpy's
    float32 cos differ in the last bit for about 1 value in 20)."""
    exponent = np.arange(0, c.head_dim, 2).astype(np.float32) / np.float32(c.head_dim)
    inv_freq = np.float32(1.0) / (np.float64(c.rope_theta) ** exponent.astype(np.float64)).astype(np.float32)
    freqs = np.outer(np.arange(n_pos, dtype=np.float32), inv_freq)                # float32 products
    emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float64)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def alloc_len(c: ModelConfig, max_len: int | None = None) -> int:
    """Positions a KV cache and the RoPE tables hold: max_len (default the model's context) in whole key buckets."""
    return -(-(c.max_seq_len if max_len is None else max_len) // KEY_BUCKET) * KEY_BUCKET


def plan_words(c: ModelConfig, vec: Callable[[str], int], weight: Callable[[str], tuple[int, int]],
               embedding: tuple[int, int, int], tables: list[int] | None = None) -> list[int]:
    """The plan: vec(name) is the address of a float32 vector ("norm", "cos", "sin", "layers.L.attn_norm", ...);
    weight(name) is (address, kind) of a product's packed weight ("lm_head", "layers.L.wqkv", ".wo", ".gate_up",
    ".down", ".router"); embedding is (address, kind, rows) of the table tokens are looked up in; tables are a
    mixture of experts' per-layer expert tables (the C forward fills them through its fetch callback)."""
    plan = [0] * rk.PLAN_GLOBALS
    plan[rk.PLAN_FINAL_NORM], plan[rk.PLAN_COS], plan[rk.PLAN_SIN] = vec("norm"), vec("cos"), vec("sin")
    plan[rk.PLAN_HEAD], plan[rk.PLAN_HEAD_KIND] = weight("lm_head")
    plan[rk.PLAN_EMBED], plan[rk.PLAN_EMBED_KIND], plan[rk.PLAN_EMBED_ROWS] = embedding
    for l in range(c.n_layers):
        plan += _layer_words(c, f"layers.{l}.", vec, weight, tables[l] if c.is_moe else 0)
    return plan


def _layer_words(c: ModelConfig, p: str, vec, weight, table: int) -> list[int]:
    """One layer's PLAN_LAYER words: a dense layer's MLP, or a mixture's router and expert table (the other's
    products 0 with kind -1); q/k norms only where the model has them."""
    words = [0] * rk.PLAN_LAYER
    words[rk.LAYER_ATTN_NORM], words[rk.LAYER_MLP_NORM] = vec(p + "attn_norm"), vec(p + "mlp_norm")
    words[rk.LAYER_WQKV], words[rk.LAYER_WQKV_KIND] = weight(p + "wqkv")
    words[rk.LAYER_WO], words[rk.LAYER_WO_KIND] = weight(p + "wo")
    words[rk.LAYER_GATE_UP], words[rk.LAYER_GATE_UP_KIND] = (0, -1) if c.is_moe else weight(p + "gate_up")
    words[rk.LAYER_DOWN], words[rk.LAYER_DOWN_KIND] = (0, -1) if c.is_moe else weight(p + "down")
    if c.qk_norm:
        words[rk.LAYER_Q_NORM], words[rk.LAYER_K_NORM] = vec(p + "q_norm"), vec(p + "k_norm")
    words[rk.LAYER_ROUTER], words[rk.LAYER_ROUTER_KIND] = weight(p + "router") if c.is_moe else (0, -1)
    words[rk.LAYER_EXPERTS] = table
    return words


def dims_words(c: ModelConfig, out_rows: int, n_pos: int, prefetch: bool = False) -> list[int]:
    """The dims: the model's sizes, the output layer's rows, the RoPE tables' positions and whether the expert
    store prefetches (csrc/forward.c says what each is)."""
    dims = [0] * rk.DIMS
    dims[rk.DIM_LAYERS], dims[rk.DIM_D], dims[rk.DIM_INTER] = c.n_layers, c.dim, c.intermediate_size
    dims[rk.DIM_HEADS], dims[rk.DIM_KV_HEADS], dims[rk.DIM_HEAD_DIM] = c.n_heads, c.n_kv_heads, c.head_dim
    dims[rk.DIM_VOCAB], dims[rk.DIM_ROPE_ROWS] = out_rows, n_pos
    dims[rk.DIM_EXPERTS], dims[rk.DIM_TOP_K] = (c.n_experts, c.top_k) if c.is_moe else (1, 1)
    dims[rk.DIM_NORM_TOPK], dims[rk.DIM_QK_NORM] = int(bool(c.norm_topk_prob)), int(bool(c.qk_norm))
    dims[rk.DIM_PREFETCH] = int(prefetch)
    return dims
