"""`lessonkit generate` without torch: the weights and the KV cache in numpy arrays, every step one C forward.

Why: importing torch is about 250 MB of a smollm2 `generate`'s 470 MB peak, and on the C forward torch computes
nothing (docs/engine.md has the measurement). `LeanEngine` loads what the C forward reads (csrc/forward.c) with
`safetensors.numpy` instead: the norms, the attention and output weights packed into strip-blocks
(packed_layout.pack_blocks, the packing the torch engine uses), the MLP's records as stored (already packed),
the RoPE tables (c_plan.rope_tables, the torch engine's), and hands the kernel the plan of their addresses
(c_plan.plan_words). `generate.generate` runs on it unchanged: the engine's interface (forward, new_cache, encode,
decode, config, store counters, model.last_forward) with numpy logits.

What it serves (`NotServed` says why not, and the torch engine runs instead, which gives the same tokens):
greedy decoding of a dense model whose product weights are all Q4_1 / Q8_0 blocks (a converted GGUF: smollm2),
the embedding tied to the output layer or float32, the MLP records packed (layout 2), and the C kernel loaded.
Sampling (torch's generator draws), techniques, float weights and mixtures of experts take the torch engine.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from safetensors import safe_open

from lessonkit.engine import c_plan, kernel
from lessonkit.engine import kernel_library as rk
from lessonkit.engine import packed_layout as pl
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.kv_cache import KVCache
from lessonkit.engine.text import TextCodec, load_tokenizer
from lessonkit.errors import LessonkitError


class NotServed(LessonkitError):
    """The torch-free generate cannot serve this request (the message says why); the torch engine can."""


class PackedWeight:
    """A Q4_1 / Q8_0 matrix W [n, k] in strip-blocks for the kernel, in numpy (blocks.NativeWeight's fields)."""

    __slots__ = ("k", "n", "kind", "code", "data", "path")

    def __init__(self, packed: np.ndarray, k: int, n: int, kind: str):
        if packed.size != pl.packed_bytes(n, k, kind):
            raise LessonkitError(f"native {kind} weight: {packed.size} bytes of strip-blocks do not hold a [{n}, {k}] "
                                 f"matrix ({pl.packed_bytes(n, k, kind)} bytes)")
        self.k, self.n, self.kind, self.path = k, n, kind, kernel.path_word()
        self.code, self.data = pl.for_numerics(packed, kind, k, n, self.path)


def why_not(c: ModelConfig, weights: str | None = None) -> str | None:
    """Why the torch-free generate cannot serve a model of config `c` (None: it can, if its files are blocks)."""
    if c_plan.requested_path() == "torch":
        return "LESSONKIT_FORWARD=torch asks for the PyTorch forward"
    if kernel._rowkernel is None or kernel.BACKEND == "mkl":
        return f"no C kernel ({kernel.WHY})"
    mode = pl.choose_weights(weights)[0]
    if mode != "native":
        return f"{mode} weights"
    if c.is_moe:
        return "a mixture of experts (its experts are fetched by the torch engine's expert store)"
    if c.head_rows is not None:
        return "a cut output layer (head_rows)"
    return None


def files_why_not(model_dir: Path, c: ModelConfig) -> str | None:
    """Why the torch-free generate cannot read a model folder's weights (float matrices, MLP records in the older
    layout), from the files' headers alone; None: it can."""
    matrices = ["layers.0.wq", "layers.0.wo", "embed" if c.tie_embeddings else "lm_head"]
    try:
        with safe_open(Path(model_dir) / "dense.safetensors", "np") as f:
            if any(f.get_slice(n).get_dtype() != "U8" for n in matrices):
                return "float weights (the torch-free generate multiplies native blocks)"
        with safe_open(Path(model_dir) / "experts.safetensors", "np") as f:
            if (f.metadata() or {}).get("format") != pl.EXPERTS_FORMAT:
                return f"MLP records not in packed layout {pl.LAYOUT_VERSION}"
    except Exception as e:          # noqa: BLE001 - the torch engine's load names what is wrong with the file
        return f"its files do not open here ({type(e).__name__})"
    return None


class ResidentMLP:
    """A dense model's MLP, expert 0 of each layer, read whole at load: the expert store's counters as the torch
    engine's store keeps them for it (one miss and one read per layer at load, one hit per layer and forward)."""

    def __init__(self, path: Path, c: ModelConfig):
        self.hits = self.misses = self.bytes_read = 0
        self.io_s = 0.0
        self.weights: dict[str, PackedWeight] = {}
        with safe_open(path, "np") as f:
            if (f.metadata() or {}).get("format") != pl.EXPERTS_FORMAT:
                raise NotServed(f"{path}: MLP records not in packed layout {pl.LAYOUT_VERSION}")
            for l in range(c.n_layers):
                t0 = time.perf_counter()
                self._layer(f, l, c, f"{path}: layers.{l}.experts.0")
                self.io_s += time.perf_counter() - t0

    def _layer(self, f, l: int, c: ModelConfig, name: str) -> None:
        key = f"layers.{l}.experts.0"
        if key not in f.keys() or f.get_slice(key).get_dtype() != "U8":
            raise NotServed(f"{name}: not a record of native blocks")
        record = pl.aligned_empty(int(np.prod(f.get_slice(key).get_shape())))
        record[:] = f.get_tensor(key).reshape(-1)
        inter, dim = c.intermediate_size, c.dim
        kind, a = pl.packed_expert_layout(record.size, True, inter, dim, name)
        self.weights[f"layers.{l}.gate_up"] = PackedWeight(record[:a], dim, 2 * inter, kind)
        self.weights[f"layers.{l}.down"] = PackedWeight(record[a:], inter, dim, kind)
        self.misses += 1
        self.bytes_read += record.size

    def counters(self) -> dict:
        total = self.hits + self.misses
        return {"expert_hits": self.hits, "expert_misses": self.misses, "bytes_read": self.bytes_read,
                "expert_hit_rate": self.hits / total if total else None, "io_s": self.io_s,
                "prefetched": 0, "prefetch_hits": 0, "resident_experts": len(self.weights) // 2}


def load_dense(path: Path, c: ModelConfig) -> tuple[dict[str, np.ndarray], dict[str, PackedWeight]]:
    """(float32 vectors: the norms and a float embedding; packed product weights: lm_head, layers.L.wqkv, .wo) of
    dense.safetensors. A tensor the C forward cannot read as it is raises NotServed naming it."""
    want = c.dense_shapes()
    vectors, weights = {}, {}
    with safe_open(path, "np") as f:
        held = set(f.keys())
        missing = sorted(set(want) - held)
        if missing:
            raise LessonkitError(f"{path}: missing tensors {missing[:5]}")
        for name, shape in want.items():
            dtype = f.get_slice(name).get_dtype()
            if len(shape) == 1 or (name == "embed" and not c.tie_embeddings and dtype != "U8"):
                if dtype != "F32":
                    raise NotServed(f"{path}: {name} is {dtype}, the torch-free generate reads F32 vectors")
                vectors[name] = np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)
        head = "embed" if c.tie_embeddings else "lm_head"
        weights["lm_head"] = _packed(f, [head], want[head][1], f"{path}: {head}")
        for l in range(c.n_layers):
            p = f"layers.{l}."
            weights[p + "wqkv"] = _packed(f, [p + "wq", p + "wk", p + "wv"], c.dim, f"{path}: {p}wq|wk|wv")
            weights[p + "wo"] = _packed(f, [p + "wo"], c.n_heads * c.head_dim, f"{path}: {p}wo")
    if not c.tie_embeddings and "embed" not in vectors:
        raise NotServed(f"{path}: an embedding of blocks not tied to the output layer (looked up in Python)")
    return vectors, weights


def _packed(f, names: list[str], k: int, what: str) -> PackedWeight:
    """The blocks of the matrices `names` (rows stacked: q|k|v as the torch engine fuses them), packed."""
    if any(f.get_slice(n).get_dtype() != "U8" for n in names):
        raise NotServed(f"{what}: float weights (the torch-free generate multiplies native blocks)")
    raw = np.concatenate([f.get_tensor(n) for n in names]) if len(names) > 1 else f.get_tensor(names[0])
    kind = pl.block_kind(raw.shape, (raw.shape[0], k), what)
    return PackedWeight(pl.pack_blocks(raw, kind), k, raw.shape[0], kind)


class LeanEngine(TextCodec):
    """A dense native-block model for greedy generation, no torch (see the module docstring)."""

    weights = "native"

    def __init__(self, model_dir: str | Path, *, name: str | None = None, weights: str | None = None):
        self.model_dir = Path(model_dir)
        self.name = name or self.model_dir.name
        self.config = c = ModelConfig.load(self.model_dir / "config.json")
        reason = why_not(c, weights)
        if reason:
            raise NotServed(reason)
        self.vectors, self.wt = load_dense(self.model_dir / "dense.safetensors", c)
        self.store = ResidentMLP(self.model_dir / "experts.safetensors", c)
        self.wt.update(self.store.weights)
        self.model = self                  # generate reads model.last_forward and model.alloc_len, as the engine's
        self.alloc_len = c_plan.alloc_len(c)
        self.vectors["cos"], self.vectors["sin"] = c_plan.rope_tables(c, self.alloc_len)
        head = self.wt["lm_head"]
        embed = ((head.data.ctypes.data, head.code, head.n) if c.tie_embeddings else
                 (self.vectors["embed"].ctypes.data, pl.FORMAT["KIND_F32"], c.vocab_size))
        self.plan = np.array(c_plan.plan_words(c, lambda n: self.vectors[n].ctypes.data,
                                               lambda n: (self.wt[n].data.ctypes.data, self.wt[n].code), embed),
                             dtype=np.int64)
        self.dims = np.array(c_plan.dims_words(c, head.n, self.alloc_len), dtype=np.int64)
        self.path = head.path
        self.inputs = rk.RkModel(plan=self.plan.ctypes.data, dims=self.dims.ctypes.data, fetch=0,
                                 eps=float(c.norm_eps), clip=float(c.clip_qkv) if c.clip_qkv is not None else 0.0,
                                 path=self.path)                  # struct rk_model: the same for every call
        self.tokenizer = load_tokenizer(self.model_dir)
        tpl = self.model_dir / "chat_template.jinja"
        self.chat_template = tpl.read_text(encoding="utf-8") if tpl.exists() else None
        self.last_forward: dict = {}

    def new_cache(self, max_len: int | None = None) -> KVCache:
        c = self.config
        n = self.alloc_len if max_len is None else c_plan.alloc_len(c, max_len)
        return KVCache.on_numpy(c.n_layers, n, c.n_kv_heads, c.head_dim)

    def forward(self, tokens, cache: KVCache, *, last_only: bool = False) -> np.ndarray:
        """Run T new tokens at positions cache.length .. +T-1 in one C call; float32 logits [T, V] (or [1, V])."""
        c, t0 = self.config, time.perf_counter()
        tokens = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1))
        T, start = tokens.size, cache.length
        if T == 0:
            raise ValueError("forward needs at least one token")
        cache.check_room(T)
        if int(tokens.max()) >= c.vocab_size or int(tokens.min()) < 0:
            raise LessonkitError(f"token id {int(tokens.max())} outside the vocabulary of {c.vocab_size}")
        first = T - 1 if last_only else 0
        x = np.empty((T, c.dim), dtype=np.float32)
        logits = np.empty((T - first, int(self.dims[rk.DIM_VOCAB])), dtype=np.float32)
        self.store.hits += c.n_layers
        kernel._rowkernel.forward(self.inputs, rk.RkBatch(
            tokens=tokens.ctypes.data, x=x.ctypes.data, m=T, start=start, first=first, logits=logits.ctypes.data,
            k_cache=cache.k.ctypes.data, v_cache=cache.v.ctypes.data, alloc=cache.k.shape[1]))
        cache.length = start + T
        self.last_forward = {"rows": T, "unique_experts": c.n_layers, "wall_s": time.perf_counter() - t0, "io_s": 0.0}
        return logits
