"""What the C forward (csrc/forward.c) is handed, as plain numbers and numpy arrays: no torch.

The plan is the list of addresses of a model's weights in the order csrc/forward.c reads them (PLAN_GLOBALS words,
then the same words for each layer); the dims are the model's sizes; the RoPE tables are the rotations of every
position. The torch engine (engine/c_forward.py) and the torch-free generate (engine/lean.py) build them here, so
the two hand the kernel the same plan and the same tables. Which forward runs (LESSONKIT_FORWARD,
`active.use(forward=...)`) is read here too: both engines honour it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from lessonkit.engine import settings
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError

PLAN_GLOBALS = 8           # csrc/rowkernel.h: words before the first layer's
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
    plan = [vec("norm"), *weight("lm_head"), vec("cos"), vec("sin"), *embedding]
    for l in range(c.n_layers):
        p = f"layers.{l}."
        plan += [vec(p + "attn_norm"), *weight(p + "wqkv"), *weight(p + "wo"), vec(p + "mlp_norm")]
        plan += [0, -1, 0, -1] if c.is_moe else [*weight(p + "gate_up"), *weight(p + "down")]
        plan += [vec(p + "q_norm"), vec(p + "k_norm")] if c.qk_norm else [0, 0]
        plan += [*weight(p + "router"), tables[l]] if c.is_moe else [0, -1, 0]
    return plan


def dims_words(c: ModelConfig, out_rows: int, n_pos: int, prefetch: bool = False) -> list[int]:
    """The dims: the model's sizes, the output layer's rows, the RoPE tables' positions and whether the expert
    store prefetches (csrc/forward.c names each)."""
    return [c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate_size, out_rows, n_pos,
            c.n_experts if c.is_moe else 1, c.top_k if c.is_moe else 1, int(bool(c.norm_topk_prob)),
            int(bool(c.qk_norm)), int(prefetch)]
