"""The whole forward of a dense Llama in one C call (csrc/forward.c), and when the engine takes it.

`Transformer.forward` runs a dense model's M new rows (decode M = 1, verify k + 1, a prefill chunk) through
`CForward.run` when `plan_for` finds everything the C forward needs: the C kernel loaded (avx512, avx2 or
portable backend), float32 compute and every product's weight packed for the kernel (float32 strips or native Q4_1 /
Q8_0 strip-blocks). Dense Llama models run in one C call per forward; a mixture of experts too, with one
Python call per expert a layer uses (`fetch`: the expert store reads it, from disk if it must), so the store's
counters and eviction order are the PyTorch forward's. Otherwise, and when LESSONKIT_FORWARD=torch asks for
it, the PyTorch forward in model.py runs: the reference the C forward is tested against, and the path
without a kernel binary (and the one with the one-layer-ahead expert prefetch). `CForward.draft_greedy` is a
dense draft model's whole greedy turn on the same forward (csrc/forward.c rk_draft_greedy): its catch-up rows and
k chained one-row forwards, each argmax in C, in one call.

The C forward's numerics are specified in docs/numerics.md: every value depends on its row and position
only, so its logits are equal bit for bit across M, prefill chunking, thread counts, the AVX-512, AVX2 and
portable paths, and native vs float32 weights. Against the PyTorch forward the products are equal; the sums (RMSNorm,
attention) run in another fixed order and exp is the forward's own, so logits differ by a measured bound
(tests/test_forward.py).
"""
from __future__ import annotations

import ctypes
import threading

import torch

from lessonkit.engine import blocks as qb
from lessonkit.engine import c_plan, kernel, row_weight
from lessonkit.engine import kernel_library as rk
from lessonkit.engine.c_plan import requested_path
from lessonkit.errors import LessonkitError

KIND = {"f32": -1, "q4_1": 0, "q8_0": 1}


def describe() -> str:
    """Which forward dense models take in this process, without loading one (`lessonkit doctor`)."""
    req = requested_path()
    if req == "torch":
        return "PyTorch forward (LESSONKIT_FORWARD=torch)"
    if kernel._rowkernel is None or kernel.BACKEND == "mkl":
        return f"PyTorch forward: no C kernel ({kernel.WHY})"
    return (f"one C call per forward ({kernel.BACKEND} path; a mixture of experts calls back once per expert a "
            f"layer uses); LESSONKIT_FORWARD=torch chooses the reference")


def draft_ready() -> str | None:
    """None when dense draft models take their greedy turns on the C forward in this process, else why not."""
    if requested_path() == "torch":
        return "LESSONKIT_FORWARD=torch"
    if kernel._rowkernel is None or kernel.BACKEND == "mkl":
        return f"no C kernel ({kernel.WHY})"
    return None


def _weight(w) -> tuple[int, int, torch.Tensor] | None:
    """(address, kind, the tensor kept alive) of a packed product weight, or None when it is not packed."""
    if isinstance(w, qb.NativeWeight):
        return w.data.data_ptr(), w.code, w.data
    if isinstance(w, row_weight.RowWeight) and w.packed and w.dtype == torch.float32:
        return w.data.data_ptr(), KIND["f32"], w.data
    return None


def why_not(model) -> str | None:
    """Why `model` cannot take the C forward (None: it can)."""
    c = model.config
    if kernel._rowkernel is None or kernel.BACKEND == "mkl":
        return f"no C kernel ({kernel.WHY})"
    if model.dtype != torch.float32:
        return f"compute dtype {model.dtype} (the C forward computes in float32)"
    st = model.store
    if not c.is_moe and st.budget_bytes is not None and st.budget_bytes < st.n_layers * st.expert_bytes:
        return "its dense MLP streams from disk under an expert budget"
    return None


def plan_for(model) -> tuple["CForward | None", str]:
    """(the C forward for `model`, or None; why)."""
    req = requested_path()
    if req == "torch":
        return None, "LESSONKIT_FORWARD=torch"
    reason = why_not(model)
    if reason is None:
        fwd = CForward(model)
        reason = fwd.unpacked
        if reason is None:
            return fwd, f"one C call per forward ({kernel.isa_of(fwd.path)}, {kernel.numerics_of(fwd.path)} numerics)"
    if req == "c":
        raise LessonkitError(f"LESSONKIT_FORWARD=c, but this model cannot take the C forward: {reason}")
    return None, f"PyTorch forward: {reason}"


class CForward:
    """The plan of weight addresses for one model (csrc/forward.c documents its layout) and the call."""

    def __init__(self, model):
        c = model.config
        self.config, self.model = c, model
        self.keep: list = []            # tensors the plan points into
        self.unpacked: str | None = None
        self.embed_in_c = True          # the C forward looks the tokens up (see _embedding)
        w, wt = model.w, model.wt
        norms = ["norm"] + [f"layers.{l}.{n}" for l in range(c.n_layers) for n in ("attn_norm", "mlp_norm")]
        if c.qk_norm:
            norms += [f"layers.{l}.{n}" for l in range(c.n_layers) for n in ("q_norm", "k_norm")]
        for name in norms:
            if w[name].dtype != torch.float32 or not w[name].is_contiguous():
                w[name] = w[name].float().contiguous()
        self.cos, self.sin = model.cos.contiguous(), model.sin.contiguous()
        self.tables = ([torch.zeros(c.n_experts, rk.EXPERT_ENTRY, dtype=torch.int64) for _ in range(c.n_layers)]
                       if c.is_moe else [])
        self.plan = torch.tensor(self._plan_words(model), dtype=torch.int64)
        self.dims = torch.tensor(c_plan.dims_words(c, wt["lm_head"].n, self.cos.shape[0], model.store._pool is not None),
                                 dtype=torch.int64)
        self.path = int(wt["lm_head"].path)
        self.eps = float(c.norm_eps)
        self.clip = float(c.clip_qkv) if c.clip_qkv is not None else 0.0
        self._lock = threading.Lock()    # one forward at a time: the expert tables and _held are per call
        self._held: list = []            # experts fetched during the running forward (their tensors stay alive)
        self._error: BaseException | None = None
        self._fetch = rk.FETCH(self._fetch_expert) if c.is_moe else None
        self.inputs = self._model(self.plan, self.dims)      # struct rk_model: the same for every call

    def _model(self, plan: torch.Tensor, dims: torch.Tensor) -> rk.RkModel:
        """struct rk_model over `plan` and `dims` (the caller keeps them alive) with this model's eps, clip, path
        word and expert fetch."""
        fetch = ctypes.cast(self._fetch, ctypes.c_void_p).value if self._fetch is not None else 0
        return rk.RkModel(plan=plan.data_ptr(), dims=dims.data_ptr(), fetch=fetch, eps=self.eps, clip=self.clip,
                          path=self.path)

    @staticmethod
    def _batch(cache, **rows) -> rk.RkBatch:
        """struct rk_batch of `rows` (tokens, x, m, start, first, logits, routing, unique, taps: addresses as ints)
        over `cache`."""
        return rk.RkBatch(k_cache=cache.k.data_ptr(), v_cache=cache.v.data_ptr(), alloc=cache.k.shape[1], **rows)

    def _plan_words(self, model) -> list[int]:
        """The plan (c_plan.plan_words) of the model's weights; a dense model's MLP is expert 0 of each layer."""
        c, w, wt = self.config, model.w, model.wt
        vectors = {**w, "cos": self.cos, "sin": self.sin}
        mlps = {} if c.is_moe else {l: model.store.get(l, 0) for l in range(c.n_layers)}
        self.keep += list(mlps.values())

        def weight(name: str) -> tuple[int, int]:
            part = name.rsplit(".", 1)[-1]                    # layers.L.gate_up / .down: the MLP's weights
            mlp = mlps[int(name.split(".")[1])] if part in ("gate_up", "down") else None
            return self._packed(name, wt[name] if mlp is None else getattr(mlp, part + "_t"))
        return c_plan.plan_words(c, lambda name: vectors[name].data_ptr(), weight, self._embedding(w["embed"]),
                                 [t.data_ptr() for t in self.tables])

    def _embedding(self, table) -> tuple[int, int, int]:
        """(address, kind, rows) of the embedding the C forward looks tokens up in: float32 rows, or a tied
        output layer's packed blocks; kind None: the lookup stays in Python (untied blocks)."""
        if isinstance(table, torch.Tensor) and table.dtype == torch.float32 and table.is_contiguous():
            self.keep.append(table)
            return table.data_ptr(), KIND["f32"], table.shape[0]
        if isinstance(table, qb.BlockRows) and table.head is not None:
            self.keep.append(table.head.data)
            return table.head.data.data_ptr(), table.head.code, table.head.n
        self.embed_in_c = False
        return 0, KIND["f32"], 0

    def _packed(self, name: str, w) -> tuple[int, int]:
        got = _weight(w)
        if got is None:
            self.unpacked = self.unpacked or f"{name} is not packed for the C kernel"
            return 0, KIND["f32"]
        if int(w.path) != int(self.model.wt["lm_head"].path):
            self.unpacked = self.unpacked or f"{name} was prepared for another kernel path"
        self.keep.append(got[2])
        return got[0], got[1]

    def _fetch_expert(self, layer: int, expert: int, entry) -> int:
        """The C forward's callback: the expert store's expert (from disk if it must), its addresses into entry;
        with no entry (a NULL pointer), a prefetch hint for the next layer."""
        try:
            if not entry:
                self.model.store.prefetch(layer, [expert])
                return 0
            ex = self.model.store.get(layer, expert)
            gu, down = _weight(ex.gate_up_t), _weight(ex.down_t)
            if gu is None or down is None:
                raise LessonkitError(f"expert {expert} of layer {layer} is not packed for the C kernel")
            self._held.append(ex)
            entry[rk.EXPERT_GATE_UP], entry[rk.EXPERT_GATE_UP_KIND] = gu[0], gu[1]
            entry[rk.EXPERT_DOWN], entry[rk.EXPERT_DOWN_KIND] = down[0], down[1]
            return 0
        except BaseException as exc:             # noqa: BLE001 - re-raised by run() once C has returned
            self._error = exc
            return 1

    def run(self, tokens: torch.Tensor, x: torch.Tensor | None, cache, start: int, last_only: bool,
            routing: bool = False):
        """tokens [T] (int64); x [T, D] float32 embeddings, or None to look them up in C. Returns (the residual
        stream out [T, D], the output layer's rows [T or 1, V], experts each layer used [L] or None for a dense
        model, the experts each row chose [L, T, A] or None); writes the T rows' keys and values into `cache`
        at start.."""
        T, c = tokens.numel(), self.config
        tokens = tokens.contiguous()
        lookup = x is None
        if lookup:
            if not self.embed_in_c:
                raise LessonkitError("this model's embedding is looked up in Python: pass x")
            x = torch.empty(T, c.dim, dtype=torch.float32)
        self._check_cache(cache)
        first = T - 1 if last_only else 0
        logits = torch.empty(T - first, int(self.dims[rk.DIM_VOCAB]), dtype=torch.float32)
        unique = torch.zeros(c.n_layers, dtype=torch.int64) if c.is_moe else None
        picks = (torch.empty(c.n_layers, T, int(self.dims[rk.DIM_TOP_K]), dtype=torch.int64)
                 if routing and c.is_moe else None)
        with self._lock:
            return self._run(tokens, x, lookup, cache, start, T, first, logits, unique, picks)

    def _check_cache(self, cache) -> None:
        c = self.config
        if cache.k.dtype != torch.float32 or not (cache.k.is_contiguous() and cache.v.is_contiguous()):
            raise LessonkitError("the C forward needs a contiguous float32 KV cache")
        want = (c.n_layers, c.n_kv_heads, c.head_dim)
        if cache.k.shape != cache.v.shape or (cache.k.shape[0], *cache.k.shape[2:]) != want:
            raise LessonkitError(f"KV cache of shape {tuple(cache.k.shape)} is not this model's "
                                 f"[{c.n_layers}, positions, {c.n_kv_heads}, {c.head_dim}]")

    def why_no_draft(self) -> str | None:
        """Why draft_greedy cannot run on this model (None: it can)."""
        if self.config.is_moe:
            return "a mixture of experts (a draft turn in C fetches no experts)"
        if not self.embed_in_c:
            return "its embedding is looked up in Python (untied Q4_1 / Q8_0 blocks), a draft turn looks tokens up in C"
        return None

    def draft_greedy(self, tokens: list[int], cache, start: int, k: int, ids: torch.Tensor | None = None) -> list[int]:
        """A drafter's greedy turn in one C call (csrc/forward.c rk_draft_greedy): `tokens` (the context the cache
        lacks) at positions start.., then k - 1 one-row forwards, each row the embedding of the last argmax (the
        first of equal maxima; ids [V rows] maps a cut output layer's rows to token ids). Returns the k drafted
        token ids; the keys and values of positions start .. start + len(tokens) + k - 2 are in `cache` as
        run() writes them (the caller sets cache.length)."""
        reason = self.why_no_draft()
        if reason:
            raise LessonkitError(f"no draft turn in C: {reason}")
        c, M, V = self.config, len(tokens), int(self.dims[rk.DIM_VOCAB])
        self._check_cache(cache)
        end = start + M + k - 1
        if M < 1 or k < 1 or start < 0 or end > min(cache.k.shape[1], self.cos.shape[0]):
            raise LessonkitError(f"a draft turn of {M} rows and {k} drafts from position {start} does not fit "
                                 f"{min(cache.k.shape[1], self.cos.shape[0])} positions")
        if min(tokens) < 0 or max(tokens) >= c.vocab_size:
            raise LessonkitError(f"token id {max(tokens)} outside the vocabulary of {c.vocab_size}")
        if ids is not None:
            ids = ids.to(torch.int64).contiguous()
            if ids.shape != (V,):
                raise LessonkitError(f"head ids of shape {tuple(ids.shape)}: the output layer has {V} rows")
        fed, out = torch.tensor(tokens, dtype=torch.int64), torch.empty(k, dtype=torch.int64)
        x, logits = torch.empty(M, c.dim, dtype=torch.float32), torch.empty(1, V, dtype=torch.float32)
        self.model.store.count_resident_uses([(l, 0) for l in range(c.n_layers)] * k)
        with self._lock:
            batch = self._batch(cache, tokens=fed.data_ptr(), x=x.data_ptr(), m=M, start=start,
                                logits=logits.data_ptr())
            kernel._rowkernel.draft_greedy(self.inputs, batch, k, 0 if ids is None else ids.data_ptr(), 0,
                                           out.data_ptr())
        return (out if ids is None else ids[out]).tolist()

    def run_taps(self, tokens: torch.Tensor, x: torch.Tensor | None, cache, start: int, last_only: bool,
                 taps: tuple[int, ...]):
        """run(), also returning the residual stream after each layer count in `taps` (0 < tap < L, ascending): one C
        call that copies the rows out as they leave those layers (struct rk_batch's taps), so logits and cache are
        the bits of a call without taps (tests/test_feature_head.py). x: the embeddings where the lookup is in Python.
        Returns (x out [T, D], logits, [stream after each tap [T, D]], experts each layer used [L] or None)."""
        c = self.config
        if list(taps) != sorted(set(taps)) or not all(0 < t < c.n_layers for t in taps):
            raise LessonkitError(f"feature taps {taps}: expected ascending layer counts in 1 .. {c.n_layers - 1}")
        T = tokens.numel()
        tokens = tokens.contiguous()
        lookup = x is None
        if lookup and not self.embed_in_c:
            raise LessonkitError("this model's embedding is looked up in Python: pass x")
        x = torch.empty(T, c.dim, dtype=torch.float32) if lookup else x
        first = T - 1 if last_only else 0
        logits = torch.empty(T - first, int(self.dims[rk.DIM_VOCAB]), dtype=torch.float32)
        unique = torch.zeros(c.n_layers, dtype=torch.int64) if c.is_moe else None
        tap_at, out = torch.tensor(taps, dtype=torch.int64), torch.empty(len(taps), T, c.dim, dtype=torch.float32)
        with self._lock:
            batch = self._batch(cache, tokens=tokens.data_ptr() if lookup else 0, x=x.data_ptr(), m=T, start=start,
                                first=first, logits=logits.data_ptr(),
                                unique=unique.data_ptr() if unique is not None else 0,
                                tap_at=tap_at.data_ptr(), n_taps=len(taps), taps=out.data_ptr())
            self._call(batch)
        return x, logits, list(out.unbind(0)), unique

    def _call(self, batch) -> None:
        """One rk_forward: the expert tables emptied; an error the fetch raised is raised again here, any other code
        is one LessonkitError."""
        for t in self.tables:
            t.zero_()
        self._held, self._error = [], None
        try:
            rc = kernel._rowkernel.forward(self.inputs, batch)
        finally:
            self._held = []
        if rc == rk.RK_FETCH_FAILED:
            err, self._error = self._error, None
            raise err
        if rc:
            raise LessonkitError(f"C forward failed with code {rc}")

    def _run(self, tokens, x, lookup, cache, start, T, first, logits, unique, picks):
        batch = self._batch(cache, tokens=tokens.data_ptr() if lookup else 0, x=x.data_ptr(), m=T, start=start,
                            first=first, logits=logits.data_ptr(),
                            routing=picks.data_ptr() if picks is not None else 0,
                            unique=unique.data_ptr() if unique is not None else 0)
        self._call(batch)
        return x, logits, unique, picks
