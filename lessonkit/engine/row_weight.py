"""The weight type of short forwards: `RowWeight`, a float matrix in GEMV form whose products are row-invariant.

Why: a verify forward of k+1 rows must give each row the bits of a one-row decode step (lesson 1). Which product
does that is the kernel's choice (`lessonkit.engine.kernel`: the C kernel's paths, or MKL row groups); this module
holds what a weight looks like on each path and how rows are multiplied by it.

Layout: on a C kernel path a float32 W.T [in, out] is packed at load into strips of STRIP columns, each strip
in x STRIP contiguous (`pack_strips`; csrc/rowkernel.c reads it), the last strip padded with zero columns. On
the MKL path it stays [in, out] and rows go through MKL's GEMV form in groups of at most ROW_GROUP (probed once
per shape set: `probe_row_group`). Native quantised blocks are `lessonkit.engine.blocks.NativeWeight`.
"""
from __future__ import annotations

import torch

from lessonkit.engine import kernel

STRIP = 16           # columns per packed strip (csrc/rowkernel.c)
ROWWISE_MAX = 16     # forwards of at most this many rows take the row-invariant path
ROW_PAD = 8          # longer products: one GEMM padded to a multiple of ROW_PAD rows


def pad_rows(x: torch.Tensor, mult: int = ROW_PAD) -> torch.Tensor:
    m = x.shape[0]
    mp = -(-m // mult) * mult
    if mp == m:
        return x
    return torch.cat([x, x.new_zeros((mp - m,) + x.shape[1:])])


class RowWeight:
    """A weight in GEMV form (w_t = W.T, [in, out]) prepared for row-invariant products.

    `x @ rw` (or `rw.rows(x)`) gives x [M, in] @ w_t for any M. Up to ROWWISE_MAX rows every row equals
    its one-row product bit for bit; longer inputs are a prefill's business: the C backends stay
    row-invariant for any M, the MKL backend uses one GEMM padded to a multiple of ROW_PAD rows."""

    __slots__ = ("k", "n", "dtype", "data", "path")

    def __init__(self, w_t: torch.Tensor):
        if w_t.dim() != 2:
            raise ValueError(f"RowWeight needs a 2-D weight, got shape {tuple(w_t.shape)}")
        self.k, self.n = w_t.shape
        self.dtype = w_t.dtype
        self.path = kernel.path_word()                # the path is fixed when the weight is prepared
        if kernel.BACKEND == "mkl" or w_t.dtype != torch.float32:
            self.data = w_t.contiguous()
        else:
            self.data = pack_strips(w_t)

    @property
    def packed(self) -> bool:
        return self.data.dim() == 1

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"row product: input {tuple(x.shape)} does not match weight [{self.k}, {self.n}]")
        if self.packed:
            return _kernel_rows(x, self)
        if x.shape[0] <= ROWWISE_MAX:
            return gemv_rows(x, self.data)
        return (pad_rows(x) @ self.data)[:x.shape[0]]

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x if x.dim() == 2 else x.reshape(-1, self.k)).reshape(*x.shape[:-1], self.n)

    def unpacked(self) -> torch.Tensor:
        """w_t [in, out] again (for tests and exports)."""
        if not self.packed:
            return self.data
        strips = self.data.view(-1, self.k, STRIP)
        return strips.permute(1, 0, 2).reshape(self.k, -1)[:, :self.n]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


def pack_strips(w_t: torch.Tensor) -> torch.Tensor:
    """[K, N] -> strips of STRIP columns, each K x STRIP contiguous (N padded with zero columns)."""
    k, n = w_t.shape
    n_pad = -(-n // STRIP) * STRIP
    out = w_t.new_zeros(n_pad // STRIP, k, STRIP)
    full = n // STRIP
    out[:full] = w_t[:, :full * STRIP].reshape(k, full, STRIP).permute(1, 0, 2)
    if n_pad != n:
        out[full, :, :n - full * STRIP] = w_t[:, full * STRIP:]
    return out.reshape(-1)


def _kernel_rows(x: torch.Tensor, rw: RowWeight) -> torch.Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"the row kernel computes in float32, got {x.dtype}")
    if x.stride(1) != 1 or x.stride(0) < rw.k:
        x = x.contiguous()
    m = x.shape[0]
    y = torch.empty(m, rw.n, dtype=torch.float32)
    kernel._rowkernel.matmul(x.data_ptr(), m, rw.k, x.stride(0), rw.data.data_ptr(), rw.n, y.data_ptr(), rw.n, rw.path)
    return y


# ---- the MKL backend: GEMV-form row groups ------------------------------------------------------
ROW_GROUP = 3        # set by probe_row_group when the first model is built (MKL backend only)
_PROBED: dict = {}


def row_group() -> int:
    """Rows per MKL GEMV call on the MKL path (probed when the first model was built); `lessonkit doctor` prints it."""
    return ROW_GROUP


def gemv_rows(x: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
    """x [M, in] @ w_t [in, out] for M <= ROWWISE_MAX, in groups of ROW_GROUP rows: MKL computes 1-3
    rows of the GEMV form on its one-row GEMV path, so each row equals a one-row call bit for bit."""
    m, g = x.shape[0], ROW_GROUP
    if m <= g:
        return x @ w_t
    return torch.cat([x[i:i + g] @ w_t for i in range(0, m, g)])


def probe_row_group(shapes, dtype=torch.float32, seed: int = 0) -> int:
    """Largest g <= 3 such that a g-row GEMV-form product equals g one-row products bit for bit, for
    random inputs against random [in, out] matrices of every shape in `shapes` (the model's own)."""
    gen = torch.Generator().manual_seed(seed)
    for g in (3, 2):
        ok = True
        for k_in, n_out in shapes:
            w_t = torch.randn(k_in, n_out, generator=gen).to(dtype)
            x = (torch.randn(g, k_in, generator=gen) * 3).to(dtype)
            if not torch.equal(x @ w_t, torch.cat([x[i:i + 1] @ w_t for i in range(g)])):
                ok = False
                break
        if ok:
            return g
    return 1


def ensure_row_group(shapes, dtype) -> int:
    """Probe the MKL path once per (shapes, dtype, threads); the smallest group found holds for all."""
    global ROW_GROUP
    if kernel.BACKEND != "mkl" and dtype == torch.float32:
        return ROW_GROUP
    key = (tuple(sorted(shapes)), dtype, torch.get_num_threads())
    if key not in _PROBED:
        _PROBED[key] = probe_row_group(shapes, dtype)
    ROW_GROUP = min(_PROBED.values())
    return ROW_GROUP


def check_row_invariance(shapes, max_rows: int = ROWWISE_MAX, seed: int = 0) -> bool:
    """Every row of an M-row product (M = 1..max_rows, random other rows) equals its one-row product,
    bit for bit, on the active backend, for random [in, out] weights of the given shapes."""
    gen = torch.Generator().manual_seed(seed)
    if kernel.BACKEND == "mkl":
        ensure_row_group(shapes, torch.float32)
    for k, n in shapes:
        rw = RowWeight(torch.randn(k, n, generator=gen))
        x = torch.randn(max_rows, k, generator=gen) * 3
        ones = torch.cat([rw.rows(x[i:i + 1]) for i in range(max_rows)])
        for m in range(1, max_rows + 1):
            if not torch.equal(rw.rows(x[:m]), ones[:m]):
                return False
    return True
