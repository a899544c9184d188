"""A trainable copy of an engine model's top layers with low-rank adapters (LoRA), in plain torch.

Training a judge (lessonkit.training.judge) adapts only the last `n_top` layers: the frozen
bottom is run once per example (`bottom`), its output cached, and the top layers are trained on that
cache for many epochs. The math is the engine's (lessonkit/engine/model.py): RMSNorm, rotate-half
RoPE, grouped-query attention, SwiGLU experts (one for Llama, top-k of E for OLMoE with a softmax
router), written batched and differentiable. It is checked against the engine's logits
(tests/test_judge_train.py); after training the adapter is merged into plain weights
(lessonkit.models.adapters) and the engine runs the result.

Shapes: B batch, S new positions, P prefix positions, D hidden, H / G query / kv heads, hd head dim.
A prefix (the judge's shared prompt) is given as its keys and values per layer, computed without
gradient: its positions are shared by every example of a batch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lessonkit.engine.checkpoint import load_dense, load_experts
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.model import rms_norm, rope_tables

ATTN = ("wq", "wk", "wv", "wo")
MLP = ("gate", "up", "down")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, hd]; cos / sin [S, hd] (rotate-half, as the engine)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class LoraModel(torch.nn.Module):
    """Frozen weights of an engine model directory; LoRA factors on `targets` of the top `n_top` layers."""

    def __init__(self, model_dir, n_top: int, rank: int = 16, alpha: float = 32.0, targets=ATTN + MLP, seed: int = 0):
        super().__init__()
        c = self.config = ModelConfig.load(model_dir / "config.json")
        self.w = {k: v.float() for k, v in load_dense(model_dir, c).items()}
        if c.tie_embeddings:
            self.w["lm_head"] = self.w["embed"]
        ex = load_experts(model_dir, c)                          # float32 (native blocks dequantised)
        self.experts = {k: v.float() for k, v in ex.items()}       # [3, I, D]: gate, up, down^T
        self.n_top, self.first_top = n_top, c.n_layers - n_top
        self.scale = alpha / rank
        self.cos, self.sin = rope_tables(c, c.max_seq_len)
        g = torch.Generator().manual_seed(seed)
        self.lora = torch.nn.ParameterDict()
        for l in range(self.first_top, c.n_layers):
            for name in self.target_names(l, targets):
                out_f, in_f = self.weight(name).shape
                a = torch.randn(rank, in_f, generator=g) / math.sqrt(in_f)
                self.lora[name.replace(".", "__") + "__A"] = torch.nn.Parameter(a)
                self.lora[name.replace(".", "__") + "__B"] = torch.nn.Parameter(torch.zeros(out_f, rank))

    def target_names(self, l: int, targets) -> list[str]:
        out = [f"layers.{l}.{t}" for t in targets if t in ATTN]
        for e in range(self.config.n_experts):
            out += [f"layers.{l}.experts.{e}.{t}" for t in targets if t in MLP]
        return out

    def weight(self, name: str) -> torch.Tensor:
        if ".experts." in name:
            key, _, part = name.rpartition(".")
            w = self.experts[key][MLP.index(part)]
            return w.T if part == "down" else w
        return self.w[name]

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ self.weight(name).T
        key = name.replace(".", "__")
        if key + "__A" in self.lora:
            y = y + (x @ self.lora[key + "__A"].T) @ (self.lora[key + "__B"].T * self.scale)
        return y

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter in the layout of lessonkit.models.adapters (scale folded into B)."""
        out = {}
        for key, p in self.lora.items():
            name, part = key[:-3].replace("__", "."), key[-1]
            out[f"{name}.lora_{part}"] = (p.detach() * (self.scale if part == "B" else 1.0)).contiguous()
        return out

    # ---- blocks ---------------------------------------------------------------------------
    def attention(self, l: int, x: torch.Tensor, pos0: int, past=None):
        """x [B, S, D] at positions pos0..; past: (k, v) [1, G, P, hd] of positions 0..P-1 or None."""
        c, p = self.config, f"layers.{l}."
        B, S, _ = x.shape
        q, k, v = self.linear(x, p + "wq"), self.linear(x, p + "wk"), self.linear(x, p + "wv")
        if c.qk_norm:
            q, k = rms_norm(q, self.w[p + "q_norm"], c.norm_eps), rms_norm(k, self.w[p + "k_norm"], c.norm_eps)
        q = q.view(B, S, c.n_heads, c.head_dim).transpose(1, 2)
        k = k.view(B, S, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(B, S, c.n_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self.cos[pos0:pos0 + S], self.sin[pos0:pos0 + S]
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        kv = (k, v)
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        if past is not None:
            k = torch.cat([past[0].expand(B, -1, -1, -1), k], 2)
            v = torch.cat([past[1].expand(B, -1, -1, -1), v], 2)
            mask = torch.cat([torch.ones(S, past[0].shape[2], dtype=torch.bool), mask], 1)
        rep = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
        return self.linear(o.transpose(1, 2).reshape(B, S, -1), p + "wo"), kv

    def expert(self, l: int, e: int, x: torch.Tensor) -> torch.Tensor:
        p = f"layers.{l}.experts.{e}."
        return self.linear(F.silu(self.linear(x, p + "gate")) * self.linear(x, p + "up"), p + "down")

    def moe(self, l: int, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        if not c.is_moe:
            return self.expert(l, 0, x)
        probs = torch.softmax((x @ self.w[f"layers.{l}.router"].T).float(), dim=-1)
        topw, topi = torch.topk(probs, c.top_k, dim=-1)
        if c.norm_topk_prob:
            topw = topw / topw.sum(-1, keepdim=True)
        gate = torch.zeros_like(probs).scatter(-1, topi, topw).flatten(0, -2)   # [B*S, E]
        xf = x.flatten(0, -2)
        y = torch.zeros_like(xf)
        for e in range(c.n_experts):                    # each expert over the rows routed to it
            rows = (topi.flatten(0, -2) == e).any(-1).nonzero().squeeze(1)
            if rows.numel():
                y = y.index_add(0, rows, self.expert(l, e, xf[rows]) * gate[rows, e:e + 1])
        return y.view_as(x)

    def layer(self, l: int, x: torch.Tensor, pos0: int, past=None):
        c, p = self.config, f"layers.{l}."
        a, kv = self.attention(l, rms_norm(x, self.w[p + "attn_norm"], c.norm_eps), pos0, past)
        x = x + a
        return x + self.moe(l, rms_norm(x, self.w[p + "mlp_norm"], c.norm_eps)), kv

    # ---- stacks ---------------------------------------------------------------------------
    def run(self, layers, x: torch.Tensor, pos0: int, pasts=None):
        """x through `layers`; returns (x, [(k, v) per layer])."""
        kvs = []
        for i, l in enumerate(layers):
            x, kv = self.layer(l, x, pos0, None if pasts is None else pasts[i])
            kvs.append(kv)
        return x, kvs

    def bottom(self, ids: torch.Tensor, pos0: int, pasts=None):
        """Token ids [B, S] through the frozen layers below the adapted ones."""
        with torch.no_grad():
            return self.run(range(self.first_top), self.w["embed"][ids], pos0, pasts)

    def top(self, x: torch.Tensor, pos0: int, pasts=None):
        return self.run(range(self.first_top, self.config.n_layers), x, pos0, pasts)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.w["norm"], self.config.norm_eps) @ self.w["lm_head"].T
