"""The feature head as a drafter (the drafter protocol of lessonkit.speculative.drafters).

The drafter declares the head's taps (needs_states), so the target's forwards over its sequence copy the residual
stream out there (lessonkit.speculative.states; engine forward(taps=...): the same bits, the same cache) and every
position the target verifies leaves its states behind (their fused state g costs one (T, S D) x (S D, D) product, at
the next turn). A draft turn runs the head's one layer once per draft token, on the engine's own C forward: the head
is a one-layer Llama whose input rows are given (x_p, not a token) and whose output layer is the draft vocabulary's
rows of the target's, its matrices as Q4_1 blocks (C_BLOCKS; integer dots on the int8 numerics). A turn is one C
call (rk_draft_greedy), the state half of the positions verified since the last turn included. Without the C kernel
the same steps run in PyTorch (lessonkit.feature_head.head).

State: g [positions, D] for the target's positions, valid from `g_lo` below `settled` (of the `n_states` recorded);
the head's own KV cache, one row per position p > `offset` (cache index p - 1 - offset: a request's first turn starts
the cache WINDOW positions before its end), of which those up to `real` were computed from target states and the
tokens in `row_tokens`; rows past them are the last turn's drafts, rolled back at the next turn.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors import safe_open

from lessonkit.engine import c_forward, c_plan, kernel
from lessonkit.engine import kernel_library as rk
from lessonkit.engine import blocks as qb
from lessonkit.engine.kv_cache import KVCache
from lessonkit.engine.model import rms_norm
from lessonkit.errors import LessonkitError
from lessonkit.feature_head import head as fh
from lessonkit.files.resources import workbook_path
from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.suffix_store import target_numerics

FORMAT = "lessonkit-feature-head-v1"
HEADS_DIR = workbook_path("data", "models", "feature-head")
# the blocks the C step multiplies, quantised from the head's float weights at load. Q4_1 reads 0.59 of Q8_0's bytes;
# a draft turn is memory-bound, so it cost 0.71-0.80 of Q8_0's at k = 1-4, and the held-out acceptance of both shipped
# heads moved by less than one request's worth (docs/feature_head.md, "Q4_1 blocks and the state half in C")
C_BLOCKS = qb.q4_1_weight
# the head attends to at most this many prompt positions before the request's first draft: its rows for earlier ones
# are never computed. Head positions are counted from the window's start (RoPE depends on differences alone). The
# first turn of a request ran the head over the whole prompt, 1.46 target steps for 150 tokens
# (docs/feature_head.md, "A window on the prompt")
WINDOW = 64


def head_path(target) -> Path:
    return HEADS_DIR / target.name / "head.safetensors"


def load_head(target, path: str | Path | None = None, *, any_numerics: bool = False) -> tuple[fh.HeadConfig, dict, dict]:
    """(config, float32 weights, metadata) of a head file, refused with one line naming the file when it is not a
    feature head, was made for another target (its name and weights' fingerprint) or vocabulary, or was neither
    trained nor checked on the numerics the target computes with (`numerics_checked`; any_numerics: load it there
    anyway, to measure it: lessonkit.measure.feature_head.check_head)."""
    path = Path(path) if path is not None else head_path(target)
    if not path.exists():
        raise LessonkitError(f"{path}: no feature head for {target.name} (train one with "
                             f"`lessonkit train-head --model {target.name}`)")
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            w = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:
        raise LessonkitError(f"{path}: not a readable safetensors file ({e})") from None
    if meta.get("format") != FORMAT:
        raise LessonkitError(f"{path}: format {meta.get('format')!r} is not a feature head ({FORMAT})")
    if meta.get("target_fingerprint") != target.fingerprint():     # the files decide (a budget engine is renamed)
        raise LessonkitError(f"{path}: a feature head for {meta.get('target')!r} "
                             f"(weights {str(meta.get('target_fingerprint'))[:12]}), not for {target.name} "
                             f"(weights {target.fingerprint()[:12]})")
    cfg = fh.HeadConfig.from_dict(json.loads(meta["config"]))
    try:
        fh.check_fits(cfg, target)
        fh.check_weights(cfg, w, target.config.vocab_size)
    except LessonkitError as e:
        raise LessonkitError(f"{path}: {e}") from None
    if not any_numerics:
        _check_numerics(path, meta, target)
    return cfg, {k: (v if k == "vocab" else v.float()) for k, v in w.items()}, meta


def numerics_checked(path: Path, meta: dict) -> list[str]:
    """The numerics a head was trained on (its metadata) and those its held-out acceptance was measured on since
    (`numerics_checked` of the train_log.json beside it, when that log is this head's: same target and config)."""
    log = Path(path).parent / "train_log.json"
    try:
        info = json.loads(log.read_text(encoding="utf-8")) if log.exists() else {}
        ours = (info.get("target_fingerprint") == meta.get("target_fingerprint")
                and info.get("numerics") == meta.get("numerics")
                and json.dumps(info.get("config"), sort_keys=True) == json.dumps(json.loads(meta["config"]), sort_keys=True))
    except (OSError, ValueError, AttributeError) as e:
        raise LessonkitError(f"{log}: unreadable head log ({e})") from None
    extra = [n for n in info.get("numerics_checked", []) if isinstance(n, str)] if ours else []
    return list(dict.fromkeys([str(meta.get("numerics"))] + extra))


def _check_numerics(path: Path, meta: dict, target) -> None:
    """A head drafts beside the numerics it was trained or checked on only: on others its output would still be
    exact (the target verifies), but its acceptance was never measured there."""
    asked, checked = target_numerics(target), numerics_checked(path, meta)
    if asked not in checked:
        raise LessonkitError(f"{path}: a feature head trained on the {meta.get('numerics')} numerics and checked on "
                             f"{', '.join(checked)}, not on the {asked} numerics {target.name} computes with "
                             "(measure it there with lessonkit.measure.feature_head.check_head, or train one there)")


def _room(buf: torch.Tensor, rows: int) -> torch.Tensor:
    """buf, or a copy with room for `rows` rows (doubling, so a long run grows it a few times)."""
    if rows <= buf.shape[0]:
        return buf
    grown = torch.zeros(max(2 * buf.shape[0], rows), *buf.shape[1:])
    grown[:buf.shape[0]] = buf
    return grown


def _one_layer(cfg: fh.HeadConfig) -> SimpleNamespace:
    """The head's sizes as the dense one-layer model c_plan.plan_words and dims_words read."""
    return SimpleNamespace(n_layers=1, dim=cfg.dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                           head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size, is_moe=False,
                           norm_topk_prob=False, qk_norm=False)


def _batch(cache: KVCache, **rows) -> rk.RkBatch:
    """struct rk_batch of `rows` (x, m, start, first, logits: addresses as ints) over the head's KV cache."""
    return rk.RkBatch(k_cache=cache.k.data_ptr(), v_cache=cache.v.data_ptr(), alloc=cache.k.shape[1], **rows)


class _CHead:
    """The head's layer and draft-vocabulary output as a one-layer plan for the engine's C forward."""

    def __init__(self, cfg: fh.HeadConfig, w: dict, norm: torch.Tensor, rows: torch.Tensor, target):
        q = C_BLOCKS
        self.keep = [q(torch.cat([w["wq"], w["wk"], w["wv"]])), q(w["wo"]),
                     q(torch.cat([w["w_gate"], w["w_up"]])), q(w["w_down"]), q(rows)]
        wqkv, wo, gu, down, lm = self.keep
        self.norms = [norm.float().contiguous(), w["attn_norm"].contiguous(), w["mlp_norm"].contiguous()]
        cos, sin = target.model.cos.contiguous(), target.model.sin.contiguous()
        self.keep += [cos, sin]
        f, a, m = self.norms
        vectors = {"norm": f, "cos": cos, "sin": sin, "layers.0.attn_norm": a, "layers.0.mlp_norm": m}
        weights = {"lm_head": lm, "layers.0.wqkv": wqkv, "layers.0.wo": wo, "layers.0.gate_up": gu,
                   "layers.0.down": down}
        one = _one_layer(cfg)                  # a dense one-layer model; its embedding the target's (a token's half)
        fwd = target.model.c_forward
        embedding = (tuple(int(fwd.plan[i]) for i in (rk.PLAN_EMBED, rk.PLAN_EMBED_KIND, rk.PLAN_EMBED_ROWS))
                     if fwd is not None else (0, c_forward.KIND["f32"], 0))
        self.plan = torch.tensor(c_plan.plan_words(one, lambda n: vectors[n].data_ptr(),
                                                   lambda n: (weights[n].data.data_ptr(), weights[n].code),
                                                   embedding), dtype=torch.int64)
        self.dims = torch.tensor(c_plan.dims_words(one, cfg.draft_vocab, cos.shape[0]), dtype=torch.int64)
        self.path = int(lm.path)
        self.eps = float(cfg.norm_eps)
        self.inputs = rk.RkModel(plan=self.plan.data_ptr(), dims=self.dims.data_ptr(), fetch=0, eps=self.eps,
                                 clip=0.0, path=self.path)        # struct rk_model: the same for every call
        self.logits = torch.empty(1, cfg.draft_vocab, dtype=torch.float32)

    def chain(self, e_table: torch.Tensor, w_g: torch.Tensor, gnorm: torch.Tensor, fuse, state, n_states: int,
              w_e: torch.Tensor) -> None:
        """rk_draft_greedy's chain (rowkernel.h CHAIN_*): a draft's input x = e_table[draft] + w_g (RMSNorm(a) * gnorm);
        the catch-up rows' state half through the fuse and state products (blocks) of n_states streams a position;
        a catch-up token outside the draft vocabulary's token half through w_e (its norm's weight folded in)."""
        wg, we = C_BLOCKS(w_g), C_BLOCKS(w_e)
        self.keep += [e_table, wg, gnorm, fuse, state, we]
        self.words = (ctypes.c_int64 * rk.CHAIN_WORDS)()           # a ctypes array: a turn sets a few words cheaply
        for at, v in ((rk.CHAIN_ETAB, e_table.data_ptr()), (rk.CHAIN_W, wg.data.data_ptr()), (rk.CHAIN_W_KIND, wg.code),
                      (rk.CHAIN_GNORM, gnorm.data_ptr()), (rk.CHAIN_S, n_states), (rk.CHAIN_FUSE, fuse.data.data_ptr()),
                      (rk.CHAIN_FUSE_KIND, fuse.code), (rk.CHAIN_STATE, state.data.data_ptr()),
                      (rk.CHAIN_STATE_KIND, state.code), (rk.CHAIN_WE, we.data.data_ptr()), (rk.CHAIN_WE_KIND, we.code)):
            self.words[at] = v
        self.rows_in = self.tokens_in = self.out = (ctypes.c_int64 * 0)()
        self.batch = rk.RkBatch()

    def turn(self, x: torch.Tensor, tokens: list[int], rows: list[int], cache: KVCache, start: int, k: int,
             states: torch.Tensor, span: tuple[int, int], g: torch.Tensor, at: int) -> list[int]:
        """A whole greedy turn in one C call (csrc/forward.c rk_draft_greedy): the state half of the target's
        positions span[0] .. span[1] - 1 (states -> g), the catch-up rows x[r] = e_table[rows[r]] + g[at + r] of
        `tokens` at start.. (rows[r] < 0: a token outside the draft vocabulary, its token half computed in C), then
        k - 1 chained drafts. Returns the k draft-vocabulary rows and leaves their keys and values in cache.
        x: a scratch of at least len(rows) rows."""
        M = len(rows)
        if len(self.rows_in) < M or len(self.out) < k:
            self.rows_in = (ctypes.c_int64 * max(2 * M, len(self.rows_in)))()
            self.tokens_in = (ctypes.c_int64 * len(self.rows_in))()
            self.out = (ctypes.c_int64 * max(2 * k, len(self.out), 16))()
        self.rows_in[:M], self.tokens_in[:M] = rows, tokens
        w = self.words
        w[rk.CHAIN_STATES], w[rk.CHAIN_FROM], w[rk.CHAIN_TO] = states.data_ptr(), span[0], span[1]
        w[rk.CHAIN_G], w[rk.CHAIN_ROWS], w[rk.CHAIN_AT] = g.data_ptr(), ctypes.addressof(self.rows_in), at
        w[rk.CHAIN_TOKENS] = ctypes.addressof(self.tokens_in)
        b = self.batch
        b.x, b.m, b.start, b.logits = x.data_ptr(), M, start, self.logits.data_ptr()
        b.k_cache, b.v_cache, b.alloc = cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape[1]
        kernel._rowkernel.draft_greedy(self.inputs, b, k, 0, ctypes.addressof(w), ctypes.addressof(self.out))
        return self.out[:k]

    def rows(self, x: torch.Tensor, cache: KVCache, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M, D] at head positions start.. -> (outputs a [M, D], draft logits of the last row [1, V])."""
        x = x.contiguous().clone()
        M = x.shape[0]
        logits = torch.empty(1, int(self.dims[rk.DIM_VOCAB]), dtype=torch.float32)
        rc = kernel._rowkernel.forward(self.inputs, _batch(cache, x=x.data_ptr(), m=M, start=start, first=M - 1,
                                                           logits=logits.data_ptr()))
        if rc:
            raise LessonkitError(f"the feature head's C forward failed with code {rc}")
        return x, logits


class _TorchHead:
    """The same one-layer forward in PyTorch (float weights): where the C kernel is not built."""

    def __init__(self, cfg, w, norm, rows, target):
        self.cfg, self.w, self.norm, self.rows_w = cfg, w, norm.float(), rows
        self.cos, self.sin = target.model.cos, target.model.sin

    def rows(self, x, cache, start):
        cfg, w = self.cfg, self.w
        M = x.shape[0]
        q, k, v = fh._qkv(w, cfg, x[None], self.cos[start:start + M], self.sin[start:start + M])
        cache.k[0, start:start + M], cache.v[0, start:start + M] = k[0], v[0]
        rep = cfg.n_heads // cfg.n_kv_heads
        keys = cache.k[0, :start + M].repeat_interleave(rep, 1).transpose(0, 1)      # [H, S, hd]
        vals = cache.v[0, :start + M].repeat_interleave(rep, 1).transpose(0, 1)
        sc = (q[0].transpose(0, 1) @ keys.transpose(1, 2)) * cfg.head_dim ** -0.5    # [H, M, S]
        pos = torch.arange(start + M)
        sc = sc.masked_fill(pos[None, None, :] > (start + torch.arange(M))[None, :, None], float("-inf"))
        o = (torch.softmax(sc, -1) @ vals).transpose(0, 1).reshape(M, -1)
        x = x + o @ w["wo"].T
        h = rms_norm(x, w["mlp_norm"], cfg.norm_eps)
        x = x + (torch.nn.functional.silu(h @ w["w_gate"].T) * (h @ w["w_up"].T)) @ w["w_down"].T
        return x, fh.draft_logits(x[-1:], self.norm, self.rows_w, cfg.norm_eps)


class FeatureHeadDrafter:
    """Drafts k tokens with a feature head (greedy: the head's argmax over its draft vocabulary)."""

    name = "head"

    def __init__(self, target, path: str | Path | None = None, *, step: str = "auto", any_numerics: bool = False,
                 window: int | None = WINDOW):
        if window is not None and window < 1:
            raise LessonkitError(f"feature head window {window!r}: expected a number of positions >= 1, or None")
        self.target, self.window = target, window
        self.cfg, w, self.meta = load_head(target, path, any_numerics=any_numerics)
        self.w, self.vocab = w, w["vocab"]
        m = target.model
        norm = m.float_weight("norm").float()
        embed = m.w["embed"]
        self.embed = embed
        rows = (embed[self.vocab].float() if target.config.tie_embeddings else m.float_weight("lm_head")[self.vocab])
        if step not in ("auto", "C", "torch"):
            raise ValueError(f"head step {step!r}: expected auto, C or torch")
        why = (c_forward.why_not(m) or (f"the target runs no C forward ({m.forward_why})" if m.c_forward is None else
               None if m.c_forward.embed_in_c else "the target's embedding is looked up in Python (untied blocks)"))
        # (the C turn computes a token's half from the target's table: its C forward's embedding)
        c_ok = why is None and kernel._rowkernel is not None and kernel.BACKEND != "mkl"
        if step == "C" and not c_ok:
            raise LessonkitError(f"no C forward for the head here: {why}")
        self.step_path = "C" if c_ok and step != "torch" else "torch"
        self.head = (_CHead if self.step_path == "C" else _TorchHead)(self.cfg, w, norm, rows.float().contiguous(), target)
        self.step = ((f"C step on {self.head.keep[0].kind.upper()} blocks" if self.step_path == "C"
                      else "PyTorch step on float32 weights")                   # what the card says drafted
                     + (f", at most {window} prompt positions" if window else ""))
        # the input projection split in two: the token half precomputed for the draft vocabulary (drafted tokens are
        # always in it), the state half one product per draft
        D = self.cfg.dim
        self.w_e, self.w_g = w["w_in"][:, :D].contiguous(), w["w_in"][:, D:].contiguous()
        self.e_table = rms_norm(embed[self.vocab].float(), w["enorm"], self.cfg.norm_eps) @ self.w_e.T   # [V, D]
        scale = torch.cat([w[f"fuse_norm.{i}"] for i in range(self.cfg.n_states)])
        self.fuse_w = (w["fuse"] * scale[None, :]).T.contiguous()                  # [S D, D]
        self.state_w = (self.w_g * w["gnorm"][None, :]).T.contiguous()             # [D, D]
        # on the C kernel the two products read C_BLOCKS (a sixth of float32's bytes: a verify step's share of this
        # work is memory-bound: 0.305 -> 0.105 ms for 3 rows on Q8_0 blocks, Intel Xeon family 6 model 207, 2026-12-05)
        c_step = self.step_path == "C"
        self.fuse_q = C_BLOCKS(self.fuse_w.T.contiguous()) if c_step else None
        self.state_q = C_BLOCKS(self.state_w.T.contiguous()) if c_step else None
        row_of = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
        row_of[self.vocab] = torch.arange(len(self.vocab))
        self.row_list, self.vocab_list = row_of.tolist(), self.vocab.tolist()   # a turn's few lookups, as lists
        if self.step_path == "C":
            self.head.chain(self.e_table.contiguous(), self.w_g, w["gnorm"].contiguous(), self.fuse_q, self.state_q,
                            self.cfg.n_states, self.w_e * w["enorm"][None, :])
        self.needs_states = tuple(self.cfg.taps)
        self.stats = {"num_drafts": 0, "recomputed_states": 0}
        self.cache = KVCache(1, self.target.model.cos.shape[0], self.cfg.n_kv_heads, self.cfg.head_dim)
        self.reset([])

    # ---- target states -------------------------------------------------------------------------------
    def record(self, start: int, states: torch.Tensor) -> None:
        """Keep the target's states [T, S, D] of positions start .. start+T-1; their state half is computed when a
        draft needs it (_settle), so a step that drafts nothing (the gate at k = 0) pays a copy, not two products."""
        T = states.shape[0]
        if start > self.n_states:                       # positions the target skipped (a restored prefix)
            self.missing = max(self.missing, start)
        self.raw = _room(self.raw, start + T)
        self.raw[start:start + T] = states
        self.n_states = start + T
        self.settled = min(self.settled, start)
        self.changed_from = min(self.changed_from, start)

    def _settle_span(self, lo: int) -> tuple[int, int]:
        """The positions from lo on whose state half is not computed yet, (a, b), counted as computed from here on
        (g holds it for the positions g_lo .. settled - 1: a window's turns never compute those below it); g has room."""
        a, b = (self.settled if self.g_lo <= lo <= self.settled else lo), self.n_states
        if a == lo:
            self.g_lo = lo
        if a >= b:
            return a, a
        self.g = _room(self.g, b)
        self.settled = b
        return a, b

    def _settle(self, lo: int = 0) -> None:
        """The state half of every recorded position from lo on not yet computed, in one batch (the PyTorch step;
        the C step computes it inside its turn)."""
        a, b = self._settle_span(lo)
        if a < b:
            with torch.no_grad():
                self.g[a:b] = self._state_half(self.raw[a:b])

    def _state_half(self, states: torch.Tensor) -> torch.Tensor:
        """w_g RMSNorm(g) of the target's states [T, S, D]: the state half of the head's input rows, computed once
        per position when the target runs it (self.g holds these, not g itself). The norms' weights are folded into
        the two matrices (fuse_w, state_w), so a verify step pays a dozen ops here, not forty; on the C step, one
        call (the dozen dispatched ops cost more than their arithmetic: docs/feature_head.md, "Q4_1 blocks and the
        state half in C")."""
        eps = self.cfg.norm_eps
        if self.fuse_q is not None:                     # the C step: one call (csrc/forward.c rk_state_half)
            s = states.float().contiguous()
            out = torch.empty(s.shape[0], self.cfg.dim, dtype=torch.float32)
            f, g = self.fuse_q, self.state_q
            kernel._rowkernel.state_half(s.data_ptr(), s.shape[0], s.shape[1], s.shape[2], f.data.data_ptr(), f.code,
                                         g.data.data_ptr(), g.code, eps, out.data_ptr(), f.path)
            return out
        s = states.float()
        s = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
        s = s.reshape(s.shape[0], -1)
        g = s @ self.fuse_w
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
        return g @ self.state_w

    def reset(self, prompt_ids) -> None:
        self.g = torch.zeros(256, self.cfg.dim)
        self.raw = torch.zeros(256, self.cfg.n_states, self.cfg.dim)
        self.xbuf = torch.zeros(64, self.cfg.dim)       # the C turn's catch-up rows (a scratch it writes)
        self.n_states, self.changed_from, self.missing, self.settled, self.g_lo = 0, 0, 0, 0, 0
        self.offset = 0                                 # the head position of its cache's row 0, less one
        self.cache.rollback(0)
        self.real, self.row_tokens = 0, []

    def _recover_missing(self, context: list[int]) -> None:
        """States of positions a restored prefix skipped: one tapped forward of them on a scratch cache."""
        n, self.missing = self.missing, 0
        cache = self.target.new_cache(n + 1)
        _, top, tapped = self.target.forward(context[:n], cache, last_only=True, taps=self.needs_states)
        self.raw[:n] = torch.stack([*tapped, top.float()], 1)
        self.settled = 0
        self.stats["recomputed_states"] += n

    # ---- drafting ---------------------------------------------------------------------------------------
    def _token_half(self, toks: list[int], rows: list[int]) -> torch.Tensor:
        """w_e RMSNorm(emb(t)) of the tokens (their draft-vocabulary rows: e_table's, where in it)."""
        if min(rows) >= 0:                              # the usual case: every new token is in the draft vocabulary
            return self.e_table[rows]
        return rms_norm(self.embed[torch.tensor(toks)].float(), self.w["enorm"], self.cfg.norm_eps) @ self.w_e.T

    def _x(self, token: int, u: torch.Tensor, in_vocab_row: int | None) -> torch.Tensor:
        e = (self.e_table[in_vocab_row] if in_vocab_row is not None else
             rms_norm(self.embed[torch.tensor([token])].float()[0], self.w["enorm"], self.cfg.norm_eps) @ self.w_e.T)
        return e + rms_norm(u, self.w["gnorm"], self.cfg.norm_eps) @ self.w_g.T

    @torch.no_grad()
    def propose(self, context, k: int) -> Draft:
        context = list(context)
        n = len(context)
        if k <= 0 or n < 2:
            return Draft([])
        if self.missing:
            self._recover_missing(context)
        if self.n_states < n - 1:                       # the target has not run position n - 2 yet
            return Draft([])
        # head rows p = 1 .. n - 1 need states 0 .. n - 2 and tokens 1 .. n - 1; keep the rows still valid
        keep = min(self.real, self.changed_from, n - 2)
        if self.row_tokens[:keep] != context[1:keep + 1]:      # (one list comparison: the usual case is equal)
            keep = next(j for j in range(keep) if self.row_tokens[j] != context[j + 1])
        if keep == 0 or keep < self.offset:             # nothing in the head's cache holds: start it at the window
            self.offset = keep = max(0, n - 1 - self.window) if self.window else 0
        self.cache.rollback(keep - self.offset)
        toks = context[keep + 1:n]
        rows = [self.row_list[t] for t in toks]
        self.row_tokens = context[1:n]
        self.stats["num_drafts"] += 1
        if self.step_path == "C":                       # the whole turn in one C call, the state half included
            span = self._settle_span(keep)
            self.xbuf = _room(self.xbuf, len(toks))
            drafted = self.head.turn(self.xbuf, toks, rows, self.cache, keep - self.offset, k, self.raw, span, self.g,
                                     keep)
            self.real, self.changed_from = n - 1, self.n_states
            self.cache.length = n - 1 - self.offset + k - 1
            return Draft([self.vocab_list[r] for r in drafted])
        self._settle(keep)
        x = self._token_half(toks, rows) + self.g[keep:n - 1]
        self.real, self.changed_from = n - 1, self.n_states
        a, logits = self.head.rows(x, self.cache, keep - self.offset)
        self.cache.length = n - 1 - self.offset
        out = []
        u = a[-1]
        for i in range(k):
            idx = int(logits.argmax())
            out.append(int(self.vocab[idx]))
            if i + 1 == k:
                break
            a, logits = self.head.rows(self._x(out[-1], u, idx)[None], self.cache, self.cache.length)
            self.cache.length += 1
            u = a[-1]
        return Draft(out)

    def update(self, context, num_accepted: int) -> None:
        pass
