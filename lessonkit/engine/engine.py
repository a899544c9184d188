"""Engine = transformer + expert store + tokenizer, loaded from a streaming-layout directory."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from lessonkit.engine.blocks import choose_weights
from lessonkit.engine.checkpoint import load_dense
from lessonkit.files.safe_files import sha256_file
from lessonkit.files.disk import WARM, Disk
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError
from lessonkit.engine.expert_store import ExpertStore
from lessonkit.engine.kv_cache import KVCache
from lessonkit.engine.model import Transformer
from lessonkit.engine.text import TextCodec, byte_decoder, load_tokenizer  # noqa: F401 (byte_decoder: re-exported)


class Engine(TextCodec):
    def __init__(self, model_dir: str | Path, *, name: str | None = None, expert_budget_mb: float | None = None,
                 dtype=torch.float32, prefetch: bool = False, quantisation: str = "none", weights: str | None = None,
                 disk: Disk | str = WARM):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise LessonkitError(f"{self.model_dir}: model directory not found")
        self.name = name or self.model_dir.name
        self.config = ModelConfig.load(self.model_dir / "config.json")
        self.dtype, self.quantisation = dtype, quantisation
        c = self.config
        if expert_budget_mb is not None and not expert_budget_mb > 0:
            raise LessonkitError(f"--expert-budget-mb must be positive, got {expert_budget_mb}")
        # past 2**40 MB every expert fits anyway (1e308 would overflow int); below one expert the store says so
        budget = None if expert_budget_mb is None else int(min(expert_budget_mb, 2**40) * 2**20)
        # native Q4_1 / Q8_0 blocks (a converted GGUF) are multiplied as blocks or dequantised: same bits
        mode, why = choose_weights(weights)
        native = mode in ("native", "q8_0") and dtype == torch.float32
        q8 = mode == "q8_0" and native
        self.store = ExpertStore(self.model_dir / "experts.safetensors", c.n_layers, c.n_experts,
                                 (3, c.intermediate_size, c.dim), dtype=dtype, budget_bytes=budget, prefetch=prefetch,
                                 native=native, disk=disk, q8_0=q8)
        self.model = Transformer(c, load_dense(self.model_dir, c, blocks=native), self.store, dtype=dtype, q8_0=q8)
        has_blocks = self.model.native or self.store.blocks
        self.weights = "q8_0" if q8 else "native" if native and has_blocks else "f32"
        self.weights_why = why if has_blocks or q8 else "the model has no quantised blocks: float32 weights"
        self.tokenizer = load_tokenizer(self.model_dir)
        self._fingerprint: str | None = None

    # ---- the model -----------------------------------------------------------------------------
    def new_cache(self, max_len: int | None = None) -> KVCache:
        return self.model.new_cache(max_len)

    def forward(self, tokens, cache: KVCache, *, return_hidden: bool = False, last_only: bool = False,
                taps: tuple[int, ...] | None = None):
        if taps:
            return self.model.forward(tokens, cache, last_only=last_only, taps=taps)
        return self.model.forward(tokens, cache, return_hidden=return_hidden, last_only=last_only)

    @property
    def expert_bytes(self) -> int:
        return self.store.expert_bytes

    def stats(self) -> dict:
        return {**self.store.counters(), "last_forward": dict(self.model.last_forward)}

    # ---- provenance ----------------------------------------------------------------------------
    def weight_files(self) -> list[Path]:
        return [self.model_dir / "dense.safetensors", self.model_dir / "experts.safetensors"]

    def fingerprint(self) -> str:
        """SHA-256 over weights, tokenizer, config, dtype and quantisation: what a saved state belongs to."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            for f in self.weight_files():
                h.update(f.name.encode() + b"=" + sha256_file(f).encode())
            tok = self.model_dir / "tokenizer.json"
            h.update(b"tokenizer=" + (sha256_file(tok).encode() if tok.exists() else b"none"))
            h.update(json.dumps(self.config.to_dict(), sort_keys=True).encode())
            h.update(f"dtype={self.dtype};quant={self.quantisation}".encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def __repr__(self):
        c = self.config
        return (f"Engine({self.name}: {c.n_layers} layers, D={c.dim}, E={c.n_experts}, top-{c.top_k}, "
                f"V={c.vocab_size}, {self.dtype})")
