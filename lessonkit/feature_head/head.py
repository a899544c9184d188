"""A feature head (EAGLE-3 style): one transformer layer that drafts from the target's own hidden states.

EAGLE (Li et al. 2024, arXiv:2401.15077) drafts in the target's feature space instead of running a second
model: the target has already computed, for every position it verified, the residual stream its output layer
reads. EAGLE-3 (Li et al. 2025, arXiv:2503.01840) fuses a low, a middle and the top layer's stream, and trains
with "training-time test": the head also learns from its own drafted states, so acceptance holds at depth 2-3.

Row p of the head emulates the target at position p. Its inputs are the fused target state of position p - 1
and the embedding of token p; its output a_p stands in for the target's top state at p, and the target's own
final norm and output layer, cut to a frequent draft vocabulary (FR-Spec, arXiv:2502.14856), turn it into the
draft for token p + 1:

    g_{p-1} = fuse @ [RMSNorm(low_{p-1}); RMSNorm(mid_{p-1}); RMSNorm(top_{p-1})]       (target positions)
    x_p     = w_in @ [RMSNorm(emb(t_p)); RMSNorm(u_{p-1})],   u = g (target) or a (the head's own, drafted)
    a_p     = layer(x_p over the head's rows 1 .. p)                                   (one pre-norm block)
    draft   = vocab[argmax(RMSNorm_target(a_p) @ lm_head_target[vocab].T)]

Shapes: T rows, D hidden size, S fused states (taps + top), V draft vocabulary, H / G query / key heads.
The head's row p sits at RoPE position p - 1 (row 0 of its KV cache is position 1).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from lessonkit.engine.model import apply_rope, rms_norm
from lessonkit.errors import LessonkitError


@dataclass(frozen=True)
class HeadConfig:
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    taps: tuple[int, ...]          # layer counts whose residual stream is fused with the top one
    draft_vocab: int
    norm_eps: float
    vocab_size: int                # the target's

    @property
    def n_states(self) -> int:
        return len(self.taps) + 1

    def to_dict(self) -> dict:
        return {**asdict(self), "taps": list(self.taps)}

    @classmethod
    def from_dict(cls, d: dict) -> "HeadConfig":
        return cls(**{**d, "taps": tuple(d["taps"])})


def config_for(target, *, draft_vocab: int, intermediate_size: int | None = None) -> HeadConfig:
    """The head's shape for a target: its attention geometry, taps at an eighth and a half of its depth."""
    c = target.config
    L = c.n_layers
    taps = tuple(sorted({max(1, round(L / 8)), max(2, L // 2)}))
    return HeadConfig(c.dim, c.n_heads, c.n_kv_heads, c.head_dim, intermediate_size or c.intermediate_size,
                      taps, draft_vocab, c.norm_eps, c.vocab_size)


def init_params(cfg: HeadConfig, vocab: torch.Tensor, seed: int = 0) -> dict:
    """Fresh trainable weights (a seeded normal init, small output projections) and the draft vocabulary."""
    g = torch.Generator().manual_seed(seed)
    lin = lambda o, i, s=1.0: torch.randn(o, i, generator=g) * (s / i ** 0.5)
    w = {k: torch.ones(shape) if len(shape) == 1 else lin(*shape, 0.5 if k in ("wo", "w_down") else 1.0)
         for k, shape in weight_shapes(cfg).items() if k != "vocab"}        # drawn in weight_shapes' order
    if vocab.numel() != cfg.draft_vocab:
        raise LessonkitError(f"draft vocabulary of {vocab.numel()} ids, config says {cfg.draft_vocab}")
    return {**w, "vocab": vocab.to(torch.long)}


def check_fits(cfg: HeadConfig, target) -> None:
    """One clear error when a head was made for a target of another shape."""
    c = target.config
    want = (c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size)
    got = (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size)
    if want != got or max(cfg.taps) >= c.n_layers:
        raise LessonkitError(f"feature head (D, H, G, hd, V = {got}, taps {cfg.taps}) was not made for "
                             f"{target.name} (D, H, G, hd, V = {want}, {c.n_layers} layers)")


def weight_shapes(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a head file of this config (init_params' tensors)."""
    D, I, nq, nkv = cfg.dim, cfg.intermediate_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {**{f"fuse_norm.{i}": (D,) for i in range(cfg.n_states)}, "fuse": (D, cfg.n_states * D), "enorm": (D,),
            "gnorm": (D,), "w_in": (D, 2 * D), "attn_norm": (D,), "wq": (nq, D), "wk": (nkv, D), "wv": (nkv, D),
            "wo": (D, nq), "mlp_norm": (D,), "w_gate": (I, D), "w_up": (I, D), "w_down": (D, I),
            "vocab": (cfg.draft_vocab,)}


def check_weights(cfg: HeadConfig, w: dict, vocab_size: int) -> None:
    """One clear error when a head's tensors are not its config's shapes, or its draft vocabulary (distinct
    token ids) does not index the target's vocabulary of vocab_size tokens."""
    want = weight_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in w.items()}
    if got != want:
        bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        raise LessonkitError("tensors not of its config's shapes: " + ", ".join(
            f"{k} {got.get(k, 'missing')} (config: {want.get(k, 'none')})" for k in bad[:3]))
    v = w["vocab"]
    if v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
        raise LessonkitError(f"its draft vocabulary is {v.dtype}, not token ids")
    lo, hi = int(v.min()), int(v.max())
    if lo < 0 or hi >= vocab_size or len(set(v.tolist())) != v.numel():
        raise LessonkitError(f"its draft vocabulary (ids {lo} .. {hi}, {len(set(v.tolist()))} distinct of "
                             f"{v.numel()}) does not index the target's {vocab_size} tokens")

# ----------------------------------------------------------------------------- the forward (float, torch)
def fuse(w: dict, cfg: HeadConfig, states: torch.Tensor) -> torch.Tensor:
    """g [..., D] from the target's states [..., S, D] (taps then top)."""
    parts = [rms_norm(states[..., i, :].float(), w[f"fuse_norm.{i}"], cfg.norm_eps) for i in range(cfg.n_states)]
    return F.linear(torch.cat(parts, -1), w["fuse"])


def head_input(w: dict, cfg: HeadConfig, e: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """x [..., D] = w_in @ [RMSNorm(e); RMSNorm(u)]."""
    return F.linear(torch.cat([rms_norm(e, w["enorm"], cfg.norm_eps), rms_norm(u, w["gnorm"], cfg.norm_eps)], -1),
                    w["w_in"])


def _qkv(w, cfg, x, cos, sin):
    B, T, _ = x.shape
    cos, sin = cos.repeat(B, 1), sin.repeat(B, 1)
    h = rms_norm(x, w["attn_norm"], cfg.norm_eps)
    q = apply_rope(F.linear(h, w["wq"]).view(B * T, cfg.n_heads, cfg.head_dim), cos, sin)
    k = apply_rope(F.linear(h, w["wk"]).view(B * T, cfg.n_kv_heads, cfg.head_dim), cos, sin)
    v = F.linear(h, w["wv"])
    return (q.view(B, T, cfg.n_heads, cfg.head_dim), k.view(B, T, cfg.n_kv_heads, cfg.head_dim),
            v.view(B, T, cfg.n_kv_heads, cfg.head_dim))


def ttt_mask(T: int, step: int, key_step: int) -> torch.Tensor:
    """[T, T] bool: which rows of step `key_step` a row of step `step` attends to (training-time test).
    A row of step s at r drafts s - 1 tokens past the target: it sees step-1 rows up to r - (s - 1) (the
    target's real states) and, of each step i in 2 .. s, the one row r - (s - i) of its own chain."""
    r = torch.arange(T)
    if key_step == 1:
        return r[None, :] <= r[:, None] - (step - 1)
    return r[None, :] == r[:, None] - (step - key_step)


def layer_step(w: dict, cfg: HeadConfig, qkv: list, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The head's block on the rows of the next chained step: x [B, T, D], row r at RoPE position r; qkv holds
    the (q, k, v) of the steps before (appended to here). Returns the step's output a [B, T, D]."""
    B, T, D = x.shape
    rep = cfg.n_heads // cfg.n_kv_heads
    qkv.append(_qkv(w, cfg, x, cos, sin))
    s = len(qkv)
    q = qkv[-1][0].transpose(1, 2)                                                         # [B, H, T, hd]
    scores, vals = [], []
    for i in range(1, s + 1):
        k = qkv[i - 1][1].repeat_interleave(rep, dim=2).transpose(1, 2)                    # [B, H, T, hd]
        sc = (q @ k.transpose(-1, -2)) * cfg.head_dim ** -0.5
        scores.append(sc.masked_fill(~ttt_mask(T, s, i), float("-inf")))
        vals.append(qkv[i - 1][2].repeat_interleave(rep, dim=2).transpose(1, 2))
    p = torch.softmax(torch.cat(scores, -1), -1).nan_to_num(0.0)
    o = (p @ torch.cat(vals, 2)).transpose(1, 2).reshape(B, T, -1)
    x = x + F.linear(o, w["wo"])
    h = rms_norm(x, w["mlp_norm"], cfg.norm_eps)
    return x + F.linear(F.silu(F.linear(h, w["w_gate"])) * F.linear(h, w["w_up"]), w["w_down"])


def draft_logits(a: torch.Tensor, norm: torch.Tensor, rows: torch.Tensor, eps: float) -> torch.Tensor:
    """Logits over the draft vocabulary: the target's final norm, then its output rows [V, D] of the vocabulary."""
    return rms_norm(a, norm, eps) @ rows.T
