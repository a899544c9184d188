"""Model configuration: one dataclass for the Llama family and the OLMoE / Mixtral family.

A dense SwiGLU MLP is the one-expert special case of a MoE layer (n_experts=1, top_k=1, no router),
so the engine has a single code path for both families.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from lessonkit.files.atomic import atomic_write
from lessonkit.errors import LessonkitError


POSITIVE_INTS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate_size",
                 "n_experts", "top_k", "max_seq_len")


@dataclass
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int          # per expert
    n_experts: int = 1              # 1 = dense SwiGLU MLP
    top_k: int = 1
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    qk_norm: bool = False           # OLMoE: RMSNorm over the whole q / k projection
    norm_topk_prob: bool = False    # renormalise the top-k router weights to sum to 1
    clip_qkv: float | None = None
    max_seq_len: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    arch: str = "llama"             # "llama" or "olmoe": which Hugging Face class exports it
    # an output layer over head_rows tokens only (a drafter's reduced vocabulary, FR-Spec): dense tensor
    # "lm_head" is [head_rows, dim] and "lm_head_ids" [head_rows] names the token of each row; every
    # other token gets logit -inf. None: one row per token of the vocabulary.
    head_rows: int | None = None

    def __post_init__(self):
        self._check_values()
        if self.n_heads % self.n_kv_heads:
            raise LessonkitError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if not 1 <= self.top_k <= self.n_experts:
            raise LessonkitError(f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.arch not in ("llama", "olmoe"):
            raise LessonkitError(f"unknown arch {self.arch!r} (expected 'llama' or 'olmoe')")
        if self.head_rows is not None:
            if isinstance(self.head_rows, bool) or not isinstance(self.head_rows, int) or \
                    not 1 <= self.head_rows <= self.vocab_size:
                raise LessonkitError(f"head_rows must be null or an integer in 1 .. vocab_size={self.vocab_size}, "
                                     f"got {self.head_rows!r}")
            if self.tie_embeddings:
                raise LessonkitError("head_rows needs an untied output layer (tie_embeddings false)")

    def _check_values(self) -> None:
        """Each size a positive integer, each float finite and positive, each flag a bool: a bad value
        is one LessonkitError naming the key (from_dict and load add the file), never a traceback later."""
        for k in POSITIVE_INTS:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LessonkitError(f"{k} must be a positive integer, got {v!r}")
        for k in ("norm_eps", "rope_theta", "clip_qkv"):
            v = getattr(self, k)
            if v is None and k == "clip_qkv":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise LessonkitError(f"{k} must be a finite positive number, got {v!r}")
        for k in ("tie_embeddings", "qk_norm", "norm_topk_prob"):
            if not isinstance(getattr(self, k), bool):
                raise LessonkitError(f"{k} must be true or false, got {getattr(self, k)!r}")
        for k in ("bos_token_id", "eos_token_id"):
            v = getattr(self, k)
            ids = v if isinstance(v, list) else [] if v is None else [v]
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                raise LessonkitError(f"{k} must be a token id, a list of them, or null, got {v!r}")
            if any(t >= self.vocab_size for t in ids):
                raise LessonkitError(f"{k} must be a token id below vocab_size={self.vocab_size}, got {v!r}")

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def eos_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    @property
    def output_rows(self) -> int:
        """Rows of the output layer: head_rows, or the whole vocabulary."""
        return self.head_rows or self.vocab_size

    def dense_shapes(self) -> dict[str, tuple]:
        """The shape of every tensor dense.safetensors holds (float; native blocks hold rows of the same matrices)."""
        c = self
        s = {"embed": (c.vocab_size, c.dim), "norm": (c.dim,)}
        if not c.tie_embeddings:
            s["lm_head"] = (c.output_rows, c.dim)
        if c.head_rows is not None:
            s["lm_head_ids"] = (c.head_rows,)
        for l in range(c.n_layers):
            p = f"layers.{l}."
            s.update({p + "attn_norm": (c.dim,), p + "mlp_norm": (c.dim,),
                      p + "wq": (c.n_heads * c.head_dim, c.dim), p + "wk": (c.n_kv_heads * c.head_dim, c.dim),
                      p + "wv": (c.n_kv_heads * c.head_dim, c.dim), p + "wo": (c.dim, c.n_heads * c.head_dim)})
            if c.qk_norm:
                s[p + "q_norm"] = (c.n_heads * c.head_dim,)
                s[p + "k_norm"] = (c.n_kv_heads * c.head_dim,)
            if c.is_moe:
                s[p + "router"] = (c.n_experts, c.dim)
        return s

    def expert_numel(self) -> int:
        return 3 * self.intermediate_size * self.dim

    def matrix_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every product a forward makes: q|k|v, o, router, expert gate|up and down, lm_head."""
        hd, d = self.head_dim, self.dim
        shapes = {(d, (self.n_heads + 2 * self.n_kv_heads) * hd), (self.n_heads * hd, d),
                  (d, 2 * self.intermediate_size), (self.intermediate_size, d), (d, self.output_rows)}
        if self.is_moe:
            shapes.add((d, self.n_experts))
        return sorted(shapes)

    def param_counts(self) -> dict:
        """Total and active (per-token) parameter counts, with and without embeddings."""
        d, hd = self.dim, self.head_dim
        attn = d * hd * (self.n_heads * 2 + self.n_kv_heads * 2)
        norms = 2 * d + (d + self.n_kv_heads * hd if self.qk_norm else 0)
        router = self.n_experts * d if self.is_moe else 0
        expert = self.expert_numel()
        per_layer_total = attn + norms + router + self.n_experts * expert
        per_layer_active = attn + norms + router + self.top_k * expert
        emb = self.vocab_size * d + (0 if self.tie_embeddings else self.output_rows * d)
        return {
            "total": self.n_layers * per_layer_total + emb + d,
            "active": self.n_layers * per_layer_active + emb + d,
            "total_non_embedding": self.n_layers * per_layer_total + d,
            "active_non_embedding": self.n_layers * per_layer_active + d,
        }

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["head_rows"] is None:      # absent unless set: configs and fingerprints from before it stay the same
            del d["head_rows"]
        return d

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "config") -> "ModelConfig":
        if not isinstance(d, dict):
            raise LessonkitError(f"{source}: must be a JSON object of config keys, not {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise LessonkitError(f"{source}: unknown config keys {sorted(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise LessonkitError(f"{source}: {e}") from None
        except LessonkitError as e:
            raise LessonkitError(f"{source}: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))
        except FileNotFoundError:
            raise LessonkitError(f"{path}: config file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise LessonkitError(f"{path}: not valid JSON ({e})") from None
        except RecursionError:
            raise LessonkitError(f"{path}: not valid JSON (nests too deeply)") from None

    def save(self, path: str | Path) -> None:
        atomic_write(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())     # temp sibling + rename

    @classmethod
    def from_hf(cls, hf: dict, *, source: str = "config.json") -> "ModelConfig":
        """Translate a Hugging Face LlamaConfig / OlmoeConfig / MixtralConfig dict."""
        if not isinstance(hf, dict):
            raise LessonkitError(f"{source}: must be a JSON object of config keys, not {type(hf).__name__}")
        mt = hf.get("model_type", "llama")
        try:
            n_heads = hf["num_attention_heads"]
            dim = hf["hidden_size"]
            rope = hf.get("rope_parameters") or {}
            rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
            if mt == "olmoe":
                n_exp, top_k, arch, qk = hf["num_experts"], hf["num_experts_per_tok"], "olmoe", True
            elif mt == "mixtral":
                n_exp, top_k, arch, qk = hf["num_local_experts"], hf["num_experts_per_tok"], "olmoe", False
            elif mt == "llama":
                n_exp, top_k, arch, qk = 1, 1, "llama", False
            else:
                raise LessonkitError(f"{source}: unsupported model_type {mt!r} (llama, olmoe, mixtral)")
            return cls(
                vocab_size=hf["vocab_size"], dim=dim, n_layers=hf["num_hidden_layers"], n_heads=n_heads,
                n_kv_heads=hf.get("num_key_value_heads") or n_heads,
                head_dim=hf.get("head_dim") or dim // n_heads,
                intermediate_size=hf["intermediate_size"], n_experts=n_exp, top_k=top_k,
                norm_eps=hf.get("rms_norm_eps", 1e-5), rope_theta=float(rope_theta),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qk_norm=qk,
                norm_topk_prob=bool(hf.get("norm_topk_prob", mt == "mixtral")),
                clip_qkv=hf.get("clip_qkv"), max_seq_len=min(int(hf.get("max_position_embeddings", 2048)), 8192),
                bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"), arch=arch,
            )
        except KeyError as e:
            raise LessonkitError(f"{source}: missing key {e.args[0]!r}") from None
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise LessonkitError(f"{source}: {e}") from None
        except LessonkitError as e:
            raise LessonkitError(e.args[0] if str(e).startswith(source) else f"{source}: {e}") from None

    def to_hf(self) -> dict:
        if self.head_rows is not None:
            raise LessonkitError(f"a model with head_rows={self.head_rows} (an output layer over part of the "
                                 "vocabulary) has no transformers equivalent")
        common = dict(
            vocab_size=self.vocab_size, hidden_size=self.dim, num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.norm_eps,
            rope_theta=self.rope_theta, tie_word_embeddings=self.tie_embeddings,
            max_position_embeddings=self.max_seq_len, bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id, hidden_act="silu", attention_bias=False,
        )
        if self.arch == "olmoe":
            common.update(model_type="olmoe", architectures=["OlmoeForCausalLM"], num_experts=self.n_experts,
                          num_experts_per_tok=self.top_k, norm_topk_prob=self.norm_topk_prob, clip_qkv=self.clip_qkv)
        else:
            common.update(model_type="llama", architectures=["LlamaForCausalLM"], mlp_bias=False)
        return common


# Named presets: the shapes used across the workbook (the trained models carry their own config.json).
PRESETS: dict[str, dict] = {
    "test-moe": dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                     intermediate_size=32, n_experts=8, top_k=2, qk_norm=True, arch="olmoe", max_seq_len=512),
    "test-dense": dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                       intermediate_size=96, max_seq_len=512),
    "tiny-moe": dict(vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32,
                     intermediate_size=256, n_experts=8, top_k=2, qk_norm=True, arch="olmoe", max_seq_len=1024),
    "tiny-draft": dict(vocab_size=4096, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                       intermediate_size=192, tie_embeddings=True, max_seq_len=1024),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise LessonkitError(f"unknown config preset {name!r}; known: {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
