"""A preallocated KV cache for batch-1 decoding: one buffer per K and V, a length, and rollback.

The buffers are torch tensors, or numpy arrays in the torch-free generate (`KVCache.on_numpy`, engine/lean.py):
the C forward reads either through their addresses. Snapshots and restores are torch's.
"""
from __future__ import annotations

import numpy as np

from lessonkit.errors import LessonkitError


class KVCache:
    """k, v: [n_layers, max_len, n_kv_heads, head_dim]. Positions >= length are garbage."""

    def __init__(self, n_layers: int, max_len: int, n_kv_heads: int, head_dim: int, dtype=None):
        import torch          # here, not at the top: the torch-free generate's cache is on_numpy's
        self.k = torch.zeros(n_layers, max_len, n_kv_heads, head_dim, dtype=dtype or torch.float32)
        self.v = torch.zeros_like(self.k)
        self.length = 0
        self.max_len = max_len

    @classmethod
    def on_numpy(cls, n_layers: int, max_len: int, n_kv_heads: int, head_dim: int) -> "KVCache":
        """A float32 cache in numpy arrays (the torch-free generate)."""
        cache = cls.__new__(cls)
        cache.k = np.zeros((n_layers, max_len, n_kv_heads, head_dim), dtype=np.float32)
        cache.v = np.zeros_like(cache.k)
        cache.length, cache.max_len = 0, max_len
        return cache

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_len:
            raise LessonkitError(
                f"sequence of {self.length + n_new} tokens does not fit the KV cache of {self.max_len} positions")

    def rollback(self, n: int) -> None:
        """Forget every position from n on (speculative rejection rewinds here)."""
        if not 0 <= n <= self.length:
            raise LessonkitError(f"cannot roll back to {n}: cache holds {self.length} positions")
        self.length = n

    def snapshot(self, n: int | None = None) -> dict[str, torch.Tensor]:
        n = self.length if n is None else n
        if not 0 <= n <= self.length:
            raise LessonkitError(f"cannot snapshot {n} positions: cache holds {self.length}")
        return {"k": self.k[:, :n].clone(), "v": self.v[:, :n].clone()}

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        k, v = tensors["k"], tensors["v"]
        n = k.shape[1]
        if k.shape != v.shape or k.shape[0] != self.k.shape[0] or k.shape[2:] != self.k.shape[2:]:
            raise LessonkitError(f"KV snapshot of shape {tuple(k.shape)} does not fit cache {tuple(self.k.shape)}")
        if n > self.max_len:
            raise LessonkitError(f"KV snapshot of {n} positions exceeds cache length {self.max_len}")
        self.k[:, :n] = k.to(self.k.dtype)
        self.v[:, :n] = v.to(self.v.dtype)
        self.length = n

    def nbytes(self, n: int | None = None) -> int:
        n = self.length if n is None else n
        return 2 * self.k[:, :n].numel() * self.k.element_size()
