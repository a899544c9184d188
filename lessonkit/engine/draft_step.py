"""One decode step of a small dense model in one C call (csrc/rowkernel.c `dense_step`), for drafters.

A draft token must cost little next to a target step (the draft cost c of lesson 1). A 2-layer model of
width 96 does almost no arithmetic, so in PyTorch its step is per-operation overhead: about 30 calls per
layer, 1 ms a token, a third of a tiny-moe step. `dense_step` runs the same step (RMSNorm, q|k|v, RoPE,
attention over the KV cache, output product, SwiGLU MLP, output layer) in one call on the row kernel's
packed weights, writing keys and values into the engine's own KV cache, so the exact `model.forward`
and this step can fill the same cache in turn.

Not exact: its attention and norms sum in another order than `model.forward`, so its logits can differ
in the last bits. A drafter only guesses; the target verifies every guess, so the output stays that of
plain greedy decoding whatever the drafter proposes (the speculative identity tests run through it).

`why_not(model)` says why a model cannot take this path (then drafters use the PyTorch lean step):
the C kernel is not built or not the active backend, or the model is not a plain dense Llama.
"""
from __future__ import annotations

import torch

from lessonkit.engine import kernel
from lessonkit.engine.row_weight import RowWeight


def _built() -> bool:
    return kernel._rowkernel is not None and hasattr(kernel._rowkernel, "dense_step")


def kernel_ready() -> str | None:
    """None when the C draft step can run on this install, else why not (for `lessonkit doctor`)."""
    if not _built():
        return "the C kernel is not built"
    if kernel.BACKEND == "mkl":
        return f"the C kernel is not the active backend ({kernel.WHY})"
    return None


def why_not(model) -> str | None:
    """None when `model` (an engine Transformer) can run `CompiledStep`, else the reason it cannot."""
    c = model.config
    if not _built():
        return "the C kernel is not built"
    if c.is_moe or c.qk_norm or c.clip_qkv is not None:
        return "only dense Llama-style models (no experts, no qk-norm, no clipping)"
    if model.dtype != torch.float32:
        return f"weights are {model.dtype}, the C draft step runs on float32 strips"
    for name, wt in _plan_weights(model):
        if not isinstance(wt, RowWeight):          # Q4_1 / Q8_0 blocks, shipped or quantised at load (q8_0)
            return f"{name} is {type(wt).__name__} ({getattr(wt, 'kind', '?')} blocks): the C draft step runs on float32 strips"
        if wt.dtype != torch.float32 or not wt.packed:
            return f"{name} is not packed for the C kernel (backend {kernel.BACKEND}, dtype {wt.dtype})"
    return None


def _plan_weights(model):
    """(name, weight) of every matrix the plan points into: the step reads them as packed float32 strips."""
    yield "lm_head", model.wt["lm_head"]
    for l in range(model.config.n_layers):
        p = f"layers.{l}."
        yield p + "wqkv", model.wt[p + "wqkv"]
        yield p + "wo", model.wt[p + "wo"]
        ex = model.store.get(l, 0)
        yield p + "experts.0.gate_up", ex.gate_up_t
        yield p + "experts.0.down", ex.down_t


class CompiledStep:
    """`step(token)` feeds one token at position `cache.length` and returns its float32 logits [V].
    Holds the plan of weight and cache addresses for one cache (csrc/rowkernel.c documents its layout)."""

    def __init__(self, model, cache):
        reason = why_not(model)
        if reason:
            raise ValueError(f"no compiled step for this model: {reason}")
        c = model.config
        self.model, self.cache = model, cache
        experts = [model.store.get(l, 0) for l in range(c.n_layers)]   # kept: the plan points into them
        nq, nkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.logits = torch.empty(c.output_rows, dtype=torch.float32)
        self.scratch = torch.empty(3 * c.dim + 2 * nq + 2 * nkv + 2 * c.intermediate_size + cache.max_len,
                                   dtype=torch.float32)
        w, wt = model.w, model.wt
        self._keep = [w["embed"].contiguous(), w["norm"].contiguous(), model.cos.contiguous(), model.sin.contiguous()]
        addr = [self._keep[0].data_ptr(), self._keep[1].data_ptr(), wt["lm_head"].data.data_ptr(),
                self._keep[2].data_ptr(), self._keep[3].data_ptr(), self.scratch.data_ptr()]
        for l, ex in enumerate(experts):
            p = f"layers.{l}."
            for name in ("attn_norm", "mlp_norm"):
                if not w[p + name].is_contiguous():
                    raise ValueError(f"{p}{name} is not contiguous")
            addr += [w[p + "attn_norm"].data_ptr(), wt[p + "wqkv"].data.data_ptr(), wt[p + "wo"].data.data_ptr(),
                     w[p + "mlp_norm"].data_ptr(), ex.gate_up_t.data.data_ptr(), ex.down_t.data.data_ptr(),
                     cache.k[l].data_ptr(), cache.v[l].data_ptr()]
        if not (cache.k.is_contiguous() and cache.k.dtype == torch.float32):
            raise ValueError("the KV cache must be contiguous float32")
        self._experts = experts
        self.plan = torch.tensor(addr, dtype=torch.int64)
        self.args = (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size,
                     c.output_rows, float(c.norm_eps))
        self.avx2 = wt["lm_head"].avx2
        self.max_pos = min(cache.max_len, model.cos.shape[0])
        self._kv = (cache.k.data_ptr(), cache.v.data_ptr())     # the plan points into these tensors

    def __call__(self, token: int) -> torch.Tensor:
        pos = self.cache.length
        if not 0 <= token < self.model.config.vocab_size:
            raise ValueError(f"token id {token} outside the vocabulary of {self.model.config.vocab_size}")
        if (self.cache.k.data_ptr(), self.cache.v.data_ptr()) != self._kv:
            raise ValueError("the KV cache's tensors were replaced after the compiled step was planned")
        if pos >= self.max_pos:
            self.cache.check_room(1)          # the cache's own error names the limit
            raise ValueError(f"position {pos} is past the RoPE table of {self.max_pos} positions")
        kernel._rowkernel.dense_step(self.plan.data_ptr(), *self.args, int(token), pos, self.avx2,
                                     self.logits.data_ptr())
        self.cache.length = pos + 1
        return self.model.full_logits(self.logits.clone())

    def greedy(self, tokens: list[int], k: int) -> list[int]:
        """A drafter's turn in one C call: `tokens` (the context the cache lacks) fed from position
        `cache.length`, then k greedy drafts, each argmax in C (ties to the lowest token id, as torch.argmax);
        the cache grows by len(tokens) + k - 1 positions."""
        pos, n, V = self.cache.length, len(tokens), self.model.config.vocab_size
        if not tokens or any(not 0 <= t < V for t in tokens):
            raise ValueError(f"tokens {tokens[:8]}...: need at least one, each inside the vocabulary of {V}")
        if (self.cache.k.data_ptr(), self.cache.v.data_ptr()) != self._kv:
            raise ValueError("the KV cache's tensors were replaced after the compiled step was planned")
        if pos + n + k - 1 > self.max_pos:
            self.cache.check_room(n + k - 1)
            raise ValueError(f"positions up to {pos + n + k - 2} are past the RoPE table of {self.max_pos} positions")
        out, fed = torch.empty(k, dtype=torch.int64), torch.tensor(tokens, dtype=torch.int64)
        ids = self.model.head_ids
        if ids is not None and (ids.dtype != torch.int64 or not ids.is_contiguous()):
            ids = self.model.head_ids = ids.to(torch.int64).contiguous()
        kernel._rowkernel.dense_greedy(self.plan.data_ptr(), *self.args, fed.data_ptr(), n, pos, k, self.avx2,
                                       self.logits.data_ptr(), 0 if ids is None else ids.data_ptr(), out.data_ptr())
        self.cache.length = pos + n + k - 1
        return out.tolist()
