"""A multi-token-prediction (MTP) head in the DeepSeek-V3 style: config, weights, forward, file.

The head, for a position t of the frozen target (D hidden, V vocabulary):
    x_t  = eh_proj @ [RMSNorm_h(h_t) ; RMSNorm_e(Emb(token_{t+1}))]       eh_proj [D, 2D]
    y_t  = one transformer block(x_t)  (causal attention over the head's own stream + SwiGLU MLP)
    p_t  = softmax(lm_head @ RMSNorm_final(y_t))                            predicts token_{t+2}
h_t is the target's last hidden state (input of its final norm); Emb, RMSNorm_final and lm_head are
the target's own (shared, never copied into the head's file). Drafting k > 1 tokens chains the same
head: y_t plays the hidden state, the drafted token plays token_{t+1}, at RoPE position + 1.

Column blocks of eh_proj: [:, :D] reads the hidden state ("hidden half"), [:, D:] reads the input
token ("embedding half"): the DeepSeek-V3 paper's order. The checkpoint diagnosed in Colibri PR 397
stores the embedding half first. Their scale ratio is what per-row int4 quantisation trips over (quant.py).

Simplifications: one head, trained for depth 1 and reused for deeper drafts (DeepSeek-V3 trains one
module per depth); the chained rows attend to the depth-1 stream plus themselves; training regresses
the target's next hidden state (EAGLE-style) plus cross-entropy on the target's greedy token, over
hidden states precomputed once, so each head trains in minutes on two CPU cores.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from lessonkit.files.resources import workbook_path
from lessonkit.files.atomic import atomic_write
from lessonkit.engine.attention import attend
from lessonkit.errors import LessonkitError
from lessonkit.engine.model import apply_rope, rms_norm
from lessonkit.engine.quant import fake_quantise, get_scheme
from lessonkit.files.safe_files import load_json_file


MTP_DIR = workbook_path("data", "models", "mtp")

NORMS = ("hnorm", "enorm", "attn_norm", "mlp_norm")

MATRICES = ("eh_proj", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")

REAL_SCALE_RATIO = 25.0     # hidden half / embedding half of eh_proj: 20-30x measured in Colibri PR 397 (not issue 8)


# ----------------------------------------------------------------------------- config and weights
@dataclass
class MtpConfig:
    vocab_size: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @classmethod
    def from_target(cls, c, intermediate_size: int) -> "MtpConfig":
        return cls(c.vocab_size, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, intermediate_size, c.norm_eps,
                   c.rope_theta)

    def shapes(self) -> dict[str, tuple]:
        D, I, hd = self.dim, self.intermediate_size, self.head_dim
        return {"hnorm": (D,), "enorm": (D,), "eh_proj": (D, 2 * D), "attn_norm": (D,),
                "wq": (self.n_heads * hd, D), "wk": (self.n_kv_heads * hd, D), "wv": (self.n_kv_heads * hd, D),
                "wo": (D, self.n_heads * hd), "mlp_norm": (D,), "w_gate": (I, D), "w_up": (I, D), "w_down": (D, I)}

    def eh_blocks(self) -> dict[str, slice]:
        return {"hidden": slice(0, self.dim), "embedding": slice(self.dim, 2 * self.dim)}


def init_head(cfg: MtpConfig, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Random initialisation (HF style: normal(0, 0.02), norms at 1): the 'never trained' control."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in cfg.shapes().items():
        w[name] = torch.ones(shape) if name in NORMS else torch.randn(shape, generator=g) * std
    return w


@dataclass
class Shared:
    """The target's own tensors the head uses: embedding, final norm, output head, RoPE tables."""
    embed: torch.Tensor
    norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    eps: float
    lm_head_rows: object = None     # the engine's RowWeight of lm_head (row kernel) for drafting, when float32

    @classmethod
    def from_engine(cls, engine) -> "Shared":
        m = engine.model
        f = lambda name: m.float_weight(name).float()       # native blocks: dequantised, the same values
        rows = m.wt["lm_head"] if m.wt["lm_head"].dtype in (torch.float32, torch.uint8) else None
        embed = f("embed")
        lm_head = embed if m.config.tie_embeddings else f("lm_head")
        return cls(embed, f("norm"), lm_head, m.cos, m.sin, engine.config.norm_eps, rows)


# ----------------------------------------------------------------------------- the forward
def mtp_input(w: dict, cfg: MtpConfig, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """eh_proj @ [RMSNorm(h) ; RMSNorm(e)]; h, e [..., D] -> [..., D]."""
    x = torch.cat([rms_norm(h, w["hnorm"], cfg.norm_eps), rms_norm(e, w["enorm"], cfg.norm_eps)], dim=-1)
    return F.linear(x, w["eh_proj"])


def block(w: dict, cfg: MtpConfig, sh: Shared, x: torch.Tensor, pos: torch.Tensor, ctx=None, base=None,
          chain: bool = False):
    """One pre-norm transformer block on rows x [B, T, D] at RoPE positions pos [T].

    Stream mode (chain=False): the rows are new positions of the head's own stream; ctx = (K, V) of the
    earlier positions [B, L, G, hd] or None; row t attends keys at absolute positions <= pos[t].
    Chain mode (chain=True): the rows are deeper drafts; they attend to ctx (the depth-1 stream) at
    positions <= base[t], plus themselves. Returns (y, k_new, v_new).
    """
    B, T, D = x.shape
    H, G, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    a = rms_norm(x, w["attn_norm"], cfg.norm_eps)
    q = F.linear(a, w["wq"]).view(B, T, H, hd)
    k = F.linear(a, w["wk"]).view(B, T, G, hd)
    v = F.linear(a, w["wv"]).view(B, T, G, hd)
    cos, sin = sh.cos[pos].to(x.dtype), sh.sin[pos].to(x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep, scale = H // G, 1.0 / math.sqrt(hd)

    def grouped(t):                 # [B, T, H, hd] -> [B*G, rep*T, hd]: a kv head's query heads as extra rows
        return t.view(B, T, G, rep, hd).permute(0, 2, 3, 1, 4).reshape(B * G, rep * T, hd)

    if chain:
        K, V, lim = ctx[0], ctx[1], base
        own = tuple(grouped(t.repeat_interleave(rep, dim=2)) for t in (k, v))
    else:
        K = k if ctx is None else torch.cat([ctx[0], k], dim=1)
        V = v if ctx is None else torch.cat([ctx[1], v], dim=1)
        lim, own = pos, None
    mask = torch.arange(K.shape[1])[None, :] > lim[:, None]
    Kg, Vg = (t.transpose(1, 2).reshape(B * G, -1, hd) for t in (K, V))
    o = attend(grouped(q), Kg, Vg, scale, mask.repeat(rep, 1), own)              # [B*G, rep*T, hd]
    o = o.view(B, G, rep, T, hd).permute(0, 3, 1, 2, 4)
    x = x + F.linear(o.reshape(B, T, H * hd), w["wo"])
    m = rms_norm(x, w["mlp_norm"], cfg.norm_eps)
    x = x + F.linear(F.silu(F.linear(m, w["w_gate"])) * F.linear(m, w["w_up"]), w["w_down"])
    return x, k, v


def head_logits(sh: Shared, y: torch.Tensor) -> torch.Tensor:
    """The target's own final norm and output head on the head's output. Drafting (no gradient, float32)
    multiplies through the engine's own row-kernel weight: the output head is most of a draft's bytes."""
    h = rms_norm(y, sh.norm.to(y.dtype), sh.eps)
    if sh.lm_head_rows is not None and y.dtype == torch.float32 and not torch.is_grad_enabled():
        return (h @ sh.lm_head_rows).float()
    return F.linear(h, sh.lm_head.to(y.dtype)).float()


class MtpHead:
    """Weights + config + metadata of one trained head; `quantised(scheme)` gives the head a kernel sees."""

    def __init__(self, cfg: MtpConfig, weights: dict[str, torch.Tensor], meta: dict | None = None,
                 dtype=torch.float32, quant: str = "none"):
        self.cfg, self.meta, self.dtype, self.quant = cfg, dict(meta or {}), dtype, quant
        self.w = {k: v.to(dtype) for k, v in weights.items()}

    def quantised(self, scheme: str) -> "MtpHead":
        s = get_scheme(scheme)
        w = {k: (fake_quantise(v.float(), s).to(self.dtype) if k in MATRICES and s.bits else v)
             for k, v in self.w.items()}
        return MtpHead(self.cfg, w, self.meta, self.dtype, s.name)

    def to(self, dtype) -> "MtpHead":
        return MtpHead(self.cfg, self.w, self.meta, dtype, self.quant)

    def n_params(self) -> int:
        return sum(v.numel() for v in self.w.values())

    def __repr__(self):
        return (f"MtpHead(D={self.cfg.dim}, I={self.cfg.intermediate_size}, {self.n_params():,} params, "
                f"{self.dtype}, quant={self.quant})")


def rescale_embedding_half(head: MtpHead, factor: float) -> MtpHead:
    """Move a factor from eh_proj's embedding half into enorm: the same function in exact arithmetic
    (eh_proj[:, D:] @ (enorm * e) is unchanged), but the embedding half's weights are factor x smaller."""
    D = head.cfg.dim
    w = {k: v.clone() for k, v in head.w.items()}
    w["eh_proj"][:, D:] /= factor
    w["enorm"] *= factor
    return MtpHead(head.cfg, w, head.meta, head.dtype, head.quant)


def eh_scale_ratio(head: MtpHead) -> float:
    """mean |eh_proj| of the hidden half / of the embedding half."""
    w, b = head.w["eh_proj"].float(), head.cfg.eh_blocks()
    return float(w[:, b["hidden"]].abs().mean() / w[:, b["embedding"]].abs().mean().clamp_min(1e-30))


# ----------------------------------------------------------------------------- the file
def head_path(model_name: str) -> Path:
    return MTP_DIR / f"{model_name}.safetensors"


def load_train_log(model_name: str) -> dict:
    """The training log shipped beside a model's MTP head (losses per step, the run's settings)."""
    return load_json_file(head_path(model_name).with_suffix(".train_log.json"))


def save_head(head: MtpHead, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"config": json.dumps(asdict(head.cfg)), **{k: json.dumps(v) for k, v in head.meta.items()}}
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in head.w.items()}
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_head(model_or_path, *, dtype=torch.float32, check: bool = True) -> MtpHead:
    """Load data/models/mtp/<model>.safetensors (model: a name, an Engine, or a file path)."""
    if hasattr(model_or_path, "config") and hasattr(model_or_path, "name"):
        path = head_path(model_or_path.name)
    elif str(model_or_path).endswith(".safetensors"):
        path = Path(model_or_path)
    else:
        path = head_path(str(model_or_path))
    if not path.exists():
        raise LessonkitError(f"{path}: no MTP head (train one with `lessonkit train-mtp --model NAME`)")
    try:
        with safe_open(str(path), "pt") as f:
            raw = f.metadata() or {}
            w = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise LessonkitError(f"{path}: cannot read MTP head ({e})") from None
    if "config" not in raw:
        raise LessonkitError(f"{path}: no 'config' in the safetensors metadata")
    cfg = MtpConfig(**json.loads(raw["config"]))
    meta = {k: json.loads(v) for k, v in raw.items() if k != "config"}
    if check:
        for name, shape in cfg.shapes().items():
            if name not in w:
                raise LessonkitError(f"{path}: tensor {name!r} is missing")
            if tuple(w[name].shape) != shape:
                raise LessonkitError(f"{path}: tensor {name!r} has shape {tuple(w[name].shape)}, expected {shape}")
    return MtpHead(cfg, w, meta, dtype=dtype)
