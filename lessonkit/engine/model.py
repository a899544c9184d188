"""The transformer forward: Llama (dense SwiGLU) and OLMoE / Mixtral (top-k of E SwiGLU experts).

Two forwards, one contract. Where the C kernel holds the weights, `forward` runs the whole step in one C
call (engine/c_forward.py, csrc/forward.c; its numerics in docs/numerics.md). The PyTorch forward below is
the reference it is tested against, the path without a kernel binary, and LESSONKIT_FORWARD=torch; the
exactness rules that follow are this PyTorch forward's.

Shape legend: T new positions in this forward, D hidden, H query heads, G kv heads, hd head dim,
E experts per layer, A activated experts per token (top_k), V vocabulary.

Exactness. CPU BLAS picks different kernels for different row counts (MKL: a 1-row product is a GEMV;
a GEMM computes rows in tiles of 4 and the remainder rows take another path), so a position's logits in
a 1-row decode forward and inside a k-row verify forward can differ in the last bits and flip a
near-tie. The rules that make them agree bit for bit:
  1. a forward of at most ROWWISE_MAX rows (decode, speculative verify, drafting) multiplies by weights
     held as `row_weight.RowWeight`s: with the C kernel (csrc/rowkernel.c) every output is one fixed-order
     FMA chain over the input dimension, weights packed at load and read once per call for all rows, so
     a verify row costs arithmetic, not another pass over the weights; without it (no compiler at
     set-up) rows go in groups of at most ROW_GROUP through MKL's GEMV path (`row_weight.probe_row_group`
     checks that at start-up), same bits per row, one pass over the weights per group;
  2. with the C kernel, prefill takes the same path at any row count, so a prefill equals token-by-token
     decoding bit for bit, whatever the chunking (measured cost: 0.98x the GEMM prefill on tiny-moe,
     1.11x on smollm2-135m, 512 tokens, one thread). Without it, longer products (> ROWWISE_MAX rows)
     use one GEMM padded to a multiple of ROW_PAD rows, row-invariant among GEMMs: two chunkings of a
     prefill then agree to ~1e-6, not always bit for bit;
  3. elementwise transcendental ops (silu) run on row-padded tensors: ATen vectorises them and
     computes tail elements with a scalar routine that rounds differently;
  4. attention runs per "key bucket": a row at position p attends over keys [0, ceil((p+1)/B)*B) with
     a causal mask, so its reduction length depends on p only, not on what else is in the forward.
On the MKL path a prefill chunk (GEMM) and token-by-token decoding differ by about 1e-6 in the logits
(measured in tests/test_engine.py); speculative decoding never compares those two paths.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from lessonkit.engine import blocks as qb
from lessonkit.engine import c_forward, c_plan
from lessonkit.engine.attention import attend
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError
from lessonkit.engine.expert_store import ExpertStore
from lessonkit.engine.kv_cache import KVCache
from lessonkit.engine.row_weight import ROW_PAD, ROWWISE_MAX, RowWeight, ensure_row_group, pad_rows

KEY_BUCKET = c_plan.KEY_BUCKET


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    return pad_rows(x, ROW_PAD)


def linear(x: torch.Tensor, w: torch.Tensor | None, w_t: RowWeight) -> torch.Tensor:
    """Row-invariant x @ w.T for x [M, in], w [out, in]; w_t = RowWeight(w.T) (see the module docstring), or
    native blocks (w None: only the packed copy is kept)."""
    m = x.shape[0]
    if m <= ROWWISE_MAX or w_t.packed:      # the C kernel is row-invariant at any row count
        return w_t.rows(x)
    return F.linear(_pad_rows(x), w)[:m]


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope_tables(c: ModelConfig, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n_pos, head_dim] float32 (c_plan.rope_tables: the torch-free generate uses the same tables)."""
    cos, sin = c_plan.rope_tables(c, n_pos)
    return torch.from_numpy(cos), torch.from_numpy(sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, heads, hd]; cos/sin [T, hd]; the rotate-half layout of Hugging Face Llama.
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


class Transformer:
    """Weights + expert store; `forward` runs T new positions against a KV cache."""

    def __init__(self, config: ModelConfig, dense: dict[str, torch.Tensor], store: ExpertStore, dtype=torch.float32,
                 q8_0: bool = False):
        self.config, self.store, self.dtype = config, store, dtype
        self.q8_0 = q8_0                               # float matrices quantised to Q8_0 blocks (weights="q8_0")
        dense = dict(dense)
        ids = dense.pop("lm_head_ids", None)          # token ids of the output rows (config.head_rows)
        self.head_ids = None if config.head_rows is None else ids.to(torch.long)
        self.w = {k: v if v.dtype == torch.uint8 else v.to(dtype) for k, v in dense.items()}
        for l in range(config.n_layers):   # fused q|k|v projection; wq, wk, wv stay as views into it
            p = f"layers.{l}."
            qkv = torch.cat([self.w[p + "wq"], self.w[p + "wk"], self.w[p + "wv"]])
            nq, nk = self.w[p + "wq"].shape[0], self.w[p + "wk"].shape[0]
            self.w[p + "wqkv"] = qkv
            self.w[p + "wq"], self.w[p + "wk"], self.w[p + "wv"] = qkv[:nq], qkv[nq:nq + nk], qkv[nq + nk:]
        if config.tie_embeddings:
            self.w["lm_head"] = self.w["embed"]
        # GEMV-form copies ([in, out]) of every matrix a decode / verify forward multiplies by (rule 1); native
        # Q4_1 / Q8_0 blocks (uint8) stay blocks, packed for the kernel (lessonkit.engine.blocks)
        self.wt = {k: self._row_weight(k, v) for k, v in self.w.items()
                   if k == "lm_head" or k.endswith((".wqkv", ".wo", ".router"))}
        self.native = any(v.dtype == torch.uint8 for v in self.w.values() if isinstance(v, torch.Tensor))
        for k in [k for k, v in self.w.items() if v.dtype == torch.uint8 and k != "embed"]:
            del self.w[k]            # the packed copy in self.wt is what products read; keep no second copy
        if self.w["embed"].dtype == torch.uint8:         # a decode step dequantises the rows it looks up
            kind = qb.block_kind(self.w["embed"].shape, (config.vocab_size, config.dim), "embed")
            tied = config.tie_embeddings and isinstance(self.wt["lm_head"], qb.NativeWeight)
            self.w["embed"] = qb.BlockRows(None if tied else self.w["embed"], kind,
                                           self.wt["lm_head"] if tied else None)
        self._probe_row_group()
        # rows that take the exact short-forward path: all of them when the C kernel holds the weights
        self.exact_rows = 1 << 30 if self.wt["lm_head"].packed else ROWWISE_MAX
        self.alloc_len = c_plan.alloc_len(config)
        self.cos, self.sin = rope_tables(config, self.alloc_len)
        self.last_forward: dict = {}
        self.routing_log: list | None = None   # set to [] to record (layer, expert ids [T, A]) per forward
        # dense models on packed weights: the whole forward in one C call (engine/c_forward.py)
        self.c_forward, self.forward_why = c_forward.plan_for(self)

    def _row_weight(self, name: str, v: torch.Tensor):
        if v.dtype != torch.uint8 and self.q8_0 and v.shape[1] % qb.QK == 0:
            return qb.q8_0_weight(v)
        if v.dtype != torch.uint8:
            return RowWeight(v.T.contiguous())
        c = self.config
        k_in = c.n_heads * c.head_dim if name.endswith(".wo") else c.dim
        return qb.NativeWeight(v, k_in, qb.block_kind(v.shape, (v.shape[0], k_in), name))

    def float_weight(self, name: str) -> torch.Tensor:
        """A dense weight in float32 [out, in], dequantised when the engine holds it as blocks (MTP heads and
        lessons that need the float matrix; the forward never does)."""
        if name not in self.w and isinstance(self.wt.get(name), qb.NativeWeight):
            return self.wt[name].unpacked().T.contiguous()
        v = self.w[name]
        return v.float() if isinstance(v, qb.BlockRows) else v

    def full_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """Logits [.., V] from the output layer's [.., head_rows]: -inf for tokens without a row."""
        if self.head_ids is None:
            return rows
        out = torch.full((*rows.shape[:-1], self.config.vocab_size), float("-inf"), dtype=rows.dtype)
        out[..., self.head_ids] = rows
        return out

    def _probe_row_group(self) -> None:
        c = self.config
        shapes = {(v.k, v.n) for v in self.wt.values()} | {(c.dim, 2 * c.intermediate_size), (c.intermediate_size, c.dim)}
        ensure_row_group(shapes, self.dtype)

    def new_cache(self, max_len: int | None = None) -> KVCache:
        c = self.config
        n = self.alloc_len if max_len is None else c_plan.alloc_len(c, max_len)
        return KVCache(c.n_layers, n, c.n_kv_heads, c.head_dim, dtype=self.dtype)

    # ---- blocks --------------------------------------------------------------------------------
    def _plan(self, start: int, T: int, dtype) -> dict:
        """What every layer of one forward shares: rope rows and the key-bucket runs with their masks."""
        c, rep = self.config, self.config.n_heads // self.config.n_kv_heads
        runs, r0 = [], 0
        while r0 < T:                  # rows sharing a key bucket are a contiguous run of positions
            b = ((start + r0) // KEY_BUCKET + 1) * KEY_BUCKET
            r1 = min(T, b - start)
            m = r1 - r0
            mp = -(-m // ROW_PAD) * ROW_PAD
            prow = torch.arange(start + r0, start + r0 + mp)
            prow[m:] = start + r0                                          # padded rows: a valid mask
            mask = (torch.arange(b)[None, :] > prow[:, None]).repeat(rep, 1)
            runs.append((r0, r1, b, mask))
            r0 = r1
        return {"cos": self.cos[start:start + T].to(dtype), "sin": self.sin[start:start + T].to(dtype), "runs": runs}

    def _attention(self, l: int, x: torch.Tensor, cache: KVCache, start: int, T: int, plan: dict) -> torch.Tensor:
        c, w, p = self.config, self.w, f"layers.{l}."
        nq, nkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        qkv = linear(x, w.get(p + "wqkv"), self.wt[p + "wqkv"])
        cos, sin = plan["cos"], plan["sin"]
        if c.clip_qkv is None and not c.qk_norm:     # q and k rotated in one pass (elementwise: same bits)
            qk = apply_rope(qkv[:, :nq + nkv].view(T, c.n_heads + c.n_kv_heads, c.head_dim), cos, sin)
            q, k = qk[:, :c.n_heads], qk[:, c.n_heads:]
            v = qkv[:, nq + nkv:].view(T, c.n_kv_heads, c.head_dim)
        else:
            q, k, v = qkv.split([nq, nkv, nkv], dim=-1)
            if c.clip_qkv is not None:
                q, k, v = (t.clamp(-c.clip_qkv, c.clip_qkv) for t in (q, k, v))
            if c.qk_norm:
                q, k = rms_norm(q, w[p + "q_norm"], c.norm_eps), rms_norm(k, w[p + "k_norm"], c.norm_eps)
            q = apply_rope(q.reshape(T, c.n_heads, c.head_dim), cos, sin)
            k = apply_rope(k.reshape(T, c.n_kv_heads, c.head_dim), cos, sin)
            v = v.reshape(T, c.n_kv_heads, c.head_dim)
        cache.k[l, start:start + T] = k
        cache.v[l, start:start + T] = v
        rep = c.n_heads // c.n_kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        out = x.new_empty(T, c.n_heads, c.head_dim)
        for r0, r1, b, mask in plan["runs"]:
            m = r1 - r0
            keys = cache.k[l, :b].transpose(0, 1)                          # [G, b, hd]
            vals = cache.v[l, :b].transpose(0, 1)
            qb = _pad_rows(q[r0:r1])                                       # [m_pad, H, hd]
            mp = qb.shape[0]
            # GQA without copying K/V: the rep query heads of a kv head are stacked as extra rows
            qb = qb.view(mp, c.n_kv_heads, rep, c.head_dim).permute(1, 2, 0, 3).reshape(c.n_kv_heads, rep * mp, c.head_dim)
            o = attend(qb, keys, vals, scale, mask)                        # [G, rep*m_pad, hd]
            out[r0:r1] = o.view(c.n_kv_heads, rep, mp, c.head_dim).permute(2, 0, 1, 3).reshape(mp, c.n_heads, c.head_dim)[:m]
        return linear(out.reshape(T, c.n_heads * c.head_dim), w.get(p + "wo"), self.wt[p + "wo"])

    @staticmethod
    def _expert(x: torch.Tensor, ew) -> torch.Tensor:
        """SwiGLU of one expert (an expert_store.Expert): down(silu(gate x) * up x), rows padded for silu."""
        m, inter = x.shape[0], ew.down_t.k
        gu = _pad_rows(ew.gate_up_t.rows(x))                                # gate|up adjacent: one product
        h = F.silu(gu[:, :inter]) * gu[:, inter:]
        return ew.down_t.rows(h[:m])

    def _experts_short(self, l: int, x: torch.Tensor, picks: list[list[int]]) -> torch.Tensor:
        """A forward of <= ROWWISE_MAX rows: every (row, slot) pair through its expert, grouped by expert
        (batch-union), with one silu over all pairs. Per row the arithmetic is the decode step's (rules 1, 3).
        Returns [T * A, D], pair r * A + a at row r * A + a."""
        A = len(picks[0])
        union: dict[int, list[int]] = {}
        for r, row in enumerate(picks):
            for a, e in enumerate(row):
                union.setdefault(e, []).append(r * A + a)
        order, parts, experts = [], [], []
        for e in sorted(union):
            ew = self.store.get(l, e)
            pids = union[e]
            r = pids[0] // A
            xe = x[r:r + 1] if len(pids) == 1 else x[[pid // A for pid in pids]]
            parts.append(ew.gate_up_t.rows(xe))                       # gate|up adjacent: one product
            experts.append((ew, len(pids)))
            order += pids
        gu = _pad_rows(torch.cat(parts) if len(parts) > 1 else parts[0])
        inter = experts[0][0].down_t.k
        h = F.silu(gu[:, :inter]) * gu[:, inter:]
        outs, i = [], 0
        for ew, n in experts:
            outs.append(ew.down_t.rows(h[i:i + n]))
            i += n
        down = torch.cat(outs) if len(outs) > 1 else outs[0]
        if order == sorted(order):
            return down
        inv = [0] * len(order)
        for j, pid in enumerate(order):
            inv[pid] = j
        return down[inv]

    def _moe(self, l: int, x: torch.Tensor, stats: dict, T: int) -> torch.Tensor:
        c, p = self.config, f"layers.{l}."
        if not c.is_moe:
            stats["unique_experts"] += 1
            if self.routing_log is not None:
                self.routing_log.append((l, torch.zeros(T, 1, dtype=torch.long)))
            if T <= self.exact_rows:
                return self._experts_short(l, x, [[0]] * T)
            return self._expert(x, self.store.get(l, 0))
        logits = linear(x, self.w[p + "router"], self.wt[p + "router"]).float()
        probs = torch.softmax(logits, dim=-1)
        topw, topi = torch.topk(probs, c.top_k, dim=-1)                   # [T, A]
        if c.norm_topk_prob:
            topw = topw / topw.sum(-1, keepdim=True)
        topw = topw.to(x.dtype)
        if self.routing_log is not None:
            self.routing_log.append((l, topi.clone()))
        if l + 1 < c.n_layers and self.store._pool is not None:
            # one-layer-ahead prefetch: route this hidden state with the next layer's router (a guess)
            nxt = torch.topk(linear(x, self.w[f"layers.{l + 1}.router"], self.wt[f"layers.{l + 1}.router"]),
                             c.top_k, dim=-1).indices
            self.store.prefetch(l + 1, torch.unique(nxt).tolist())
        if T <= self.exact_rows:
            picks = topi.tolist()
            stats["unique_experts"] += len({e for row in picks for e in row})
            slots = self._experts_short(l, x, picks).view(T, c.top_k, c.dim)
            y = slots[:, 0] * topw[:, 0:1]
            for a in range(1, c.top_k):
                y = y + slots[:, a] * topw[:, a:a + 1]
            return y
        slots = x.new_zeros(T, c.top_k, c.dim)
        union: dict[int, list[tuple[int, int]]] = {}                        # batch-union: each expert once
        for r, picks in enumerate(topi.tolist()):
            for a, e in enumerate(picks):
                union.setdefault(e, []).append((r, a))
        stats["unique_experts"] += len(union)
        for e in sorted(union):
            ew = self.store.get(l, e)
            rows, slot = torch.tensor(union[e]).T
            slots[rows, slot] = self._expert(x[rows], ew)
        y = slots[:, 0] * topw[:, 0:1]
        for a in range(1, c.top_k):
            y = y + slots[:, a] * topw[:, a:a + 1]
        return y

    # ---- forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens, cache: KVCache, *, return_hidden: bool = False, last_only: bool = False,
                taps: tuple[int, ...] | None = None):
        """Run T new tokens at positions cache.length .. +T-1; returns float32 logits [T, V] (or [1, V]).
        taps (layer counts, ascending): also the residual stream after those layers, as (logits, hidden,
        [stream after each tap]) -- what a feature-head drafter reads (lessonkit.feature_head)."""
        c = self.config
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        T = tokens.numel()
        cache.check_room(T)
        start = cache.length
        if T == 0:
            raise ValueError("forward needs at least one token")
        if int(tokens.max()) >= c.vocab_size or int(tokens.min()) < 0:
            raise LessonkitError(f"token id {int(tokens.max())} outside the vocabulary of {c.vocab_size}")
        t0 = time.perf_counter()
        io0 = self.store.io_s
        if self.c_forward is not None and cache.k.dtype == torch.float32:
            return self._forward_c(tokens, cache, start, T, t0, io0, return_hidden, last_only, taps)
        stats = {"unique_experts": 0}
        tapped = []
        x = self.w["embed"][tokens]                                         # [T, D]
        plan = self._plan(start, T, x.dtype)
        for l in range(c.n_layers):
            p = f"layers.{l}."
            x = x + self._attention(l, rms_norm(x, self.w[p + "attn_norm"], c.norm_eps), cache, start, T, plan)
            x = x + self._moe(l, rms_norm(x, self.w[p + "mlp_norm"], c.norm_eps), stats, T)
            if taps and l + 1 in taps:
                tapped.append(x.float().clone())
        cache.length = start + T
        h = rms_norm(x, self.w["norm"], c.norm_eps)
        logits = self.full_logits(linear(h[T - 1:T] if last_only else h, self.w.get("lm_head"), self.wt["lm_head"]).float())
        wall = time.perf_counter() - t0
        self.last_forward = {"rows": T, "unique_experts": stats["unique_experts"], "wall_s": wall,
                             "io_s": self.store.io_s - io0}
        if taps:
            return logits, x, tapped
        if return_hidden:
            return logits, x
        return logits

    def _forward_c(self, tokens, cache, start, T, t0, io0, return_hidden, last_only, taps=None):
        """forward() on the C forward: the same results' contract, one C call (engine/c_forward.py)."""
        c = self.config
        if not c.is_moe:                        # the store's counters as the PyTorch forward leaves them
            self.store.count_resident_uses([(l, 0) for l in range(c.n_layers)])
        x = None if self.c_forward.embed_in_c else self.w["embed"][tokens].to(torch.float32).contiguous()
        tapped = None
        if taps:
            x, rows, tapped, unique = self.c_forward.run_taps(tokens, x, cache, start, last_only, tuple(taps))
            picks = None
        else:
            x, rows, unique, picks = self.c_forward.run(tokens, x, cache, start, last_only,
                                                        routing=self.routing_log is not None)
        cache.length = start + T
        if self.routing_log is not None:
            for l in range(c.n_layers):
                self.routing_log.append((l, picks[l] if picks is not None else torch.zeros(T, 1, dtype=torch.long)))
        logits = self.full_logits(rows)
        used = c.n_layers if unique is None else int(unique.sum())
        self.last_forward = {"rows": T, "unique_experts": used, "wall_s": time.perf_counter() - t0,
                             "io_s": self.store.io_s - io0}
        if taps:
            return logits, x, tapped
        if return_hidden:
            return logits, x
        return logits
