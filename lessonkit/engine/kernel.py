"""Row-invariant products for short forwards: the C kernel (csrc/rowkernel.c) or MKL row groups.

A short forward (decode, speculative verify, drafting; at most ROWWISE_MAX rows) multiplies its rows by
the transposed weights W [in, out]. Exactness needs every row's result to equal a one-row product bit for
bit, whatever the other rows are. Three backends, chosen once at import:

  avx2      the C kernel, AVX2 + FMA: each output is one fixed-order FMA chain over the input dimension,
            weights packed at load into 16-column strips and read once per call for all rows;
  portable  the same C kernel without vector instructions (fmaf rounds like the vector FMA: same bits);
  mkl       no kernel (not built, e.g. no C compiler at set-up): rows in groups of at most ROW_GROUP on
            MKL's GEMV path, which is row-invariant too but makes one pass over the weights per group.

`LESSONKIT_KERNEL=avx2|portable|mkl` forces a backend (tests use it to compare the paths).

Native blocks (`NativeWeight`): a Q4_1 or Q8_0 matrix kept as llama.cpp's blocks, packed at load into the
kernel's strip-blocks and dequantised inside the kernel (d * q + m, two roundings, as the float32 loader
computes it), so a product on native blocks gives the float32 path's bits at a fifth of the bytes. It needs
the C kernel. `set_threads(n)` splits every product's strips over n threads; the bits do not depend on n.
"""
from __future__ import annotations

import contextlib
import os
import platform

import torch

ABI = 3                                 # csrc/rowkernel.c's ABI constant this module calls

try:                                    # built by the README's set-up; optional by design (see `why`)
    from . import _rowkernel
except ImportError as exc:              # no compiler at install time: the MKL path, same exactness
    _rowkernel, _IMPORT_ERROR = None, str(exc)
else:
    _IMPORT_ERROR = ""
    if getattr(_rowkernel, "ABI", 1) != ABI:     # a build from older sources: its arguments differ
        _rowkernel, _IMPORT_ERROR = None, (f"the built _rowkernel is stale (ABI {getattr(_rowkernel, 'ABI', 1)}, "
                                           f"this code needs {ABI}): run the README's set-up again")

STRIP = 16           # columns per packed strip (csrc/rowkernel.c)
ROWWISE_MAX = 16     # forwards of at most this many rows take the row-invariant path
ROW_PAD = 8          # longer products: one GEMM padded to a multiple of ROW_PAD rows


def _choose() -> tuple[str, str]:
    forced = os.environ.get("LESSONKIT_KERNEL", "").strip().lower()
    if forced not in ("", "auto", "avx2", "portable", "mkl"):
        raise ValueError(f"LESSONKIT_KERNEL={forced!r}: expected avx2, portable, mkl or auto")
    if forced == "mkl":
        return "mkl", "forced by LESSONKIT_KERNEL=mkl"
    if _rowkernel is None:
        if forced:
            raise RuntimeError(f"LESSONKIT_KERNEL={forced}: the C kernel is not built ({_IMPORT_ERROR})")
        return "mkl", f"C kernel not built ({_IMPORT_ERROR}); rerun the set-up with a C compiler"
    if forced == "portable":
        return "portable", "forced by LESSONKIT_KERNEL=portable"
    if _rowkernel.has_avx2():
        return "avx2", "C kernel built and this CPU has AVX2 + FMA"
    if forced == "avx2":
        raise RuntimeError("LESSONKIT_KERNEL=avx2: this CPU has no AVX2/FMA")
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return "mkl", "this x86 CPU has no AVX2/FMA: the portable C path would be slower than MKL"
    return "portable", f"C kernel built; {platform.machine()} has no AVX2, portable C path (hardware FMA)"


BACKEND, WHY = _choose()


def backend() -> dict:
    """Which path short forwards take, and why (for `lessonkit doctor`)."""
    return {"backend": BACKEND, "why": WHY, "built": _rowkernel is not None,
            "row_group": ROW_GROUP if BACKEND == "mkl" else None, "threads": THREADS}


@contextlib.contextmanager
def using(name: str):
    """Weights prepared inside the block take backend `name` ("avx2", "portable" or "mkl"): benchmarks
    and lessons load the same model twice to compare the paths side by side in one process."""
    global BACKEND, WHY
    if name not in ("avx2", "portable", "mkl"):
        raise ValueError(f"unknown kernel backend {name!r}: expected avx2, portable or mkl")
    if name != "mkl" and _rowkernel is None:
        raise RuntimeError(f"backend {name}: the C kernel is not built ({_IMPORT_ERROR})")
    if name == "avx2" and not _rowkernel.has_avx2():
        raise RuntimeError("backend avx2: this CPU has no AVX2/FMA")
    old = BACKEND, WHY
    BACKEND, WHY = name, f"chosen for a comparison ({name})"
    try:
        yield
    finally:
        BACKEND, WHY = old


def set_threads(n: int) -> int:
    """Threads the C kernel splits a product's output strips over (each output is still one chain, computed by
    one thread, so the bits do not depend on n). Returns the number in use; 1 without the C kernel."""
    global THREADS
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    THREADS = _rowkernel.set_threads(n) if _rowkernel is not None else 1
    return THREADS


THREADS = 1


def _threads_from_env() -> None:
    """LESSONKIT_THREADS=N: the thread count a process starts with (the CLI sets it for the notebooks it runs);
    unset, one thread (tests and notebooks share cores)."""
    raw = os.environ.get("LESSONKIT_THREADS", "").strip()
    if not raw:
        return
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"LESSONKIT_THREADS={raw!r}: expected a positive integer")
    set_threads(int(raw))


def physical_cores() -> int:
    """Physical cores of this machine (the default thread count for decode), from /proc/cpuinfo where it says,
    else os.cpu_count()."""
    try:
        seen = set()
        phys = core = None
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "physical id":
                phys = val.strip()
            elif key == "core id":
                core = val.strip()
                seen.add((phys, core))
        if seen:
            return max(1, min(len(seen), len(os.sched_getaffinity(0))))
    except OSError:
        pass
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


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

    __slots__ = ("k", "n", "dtype", "data", "avx2")

    def __init__(self, w_t: torch.Tensor):
        if w_t.dim() != 2:
            raise ValueError(f"RowWeight needs a 2-D weight, got shape {tuple(w_t.shape)}")
        self.k, self.n = w_t.shape
        self.dtype = w_t.dtype
        self.avx2 = BACKEND == "avx2"                 # the path is fixed when the weight is prepared
        if BACKEND == "mkl" or w_t.dtype != torch.float32:
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
    _rowkernel.matmul(x.data_ptr(), m, rw.k, x.stride(0), rw.data.data_ptr(), rw.n, y.data_ptr(), rw.n, rw.avx2)
    return y


# ---- the MKL backend: GEMV-form row groups ------------------------------------------------------
ROW_GROUP = 3        # set by probe_row_group when the first model is built (MKL backend only)
_PROBED: dict = {}


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
    if BACKEND != "mkl" and dtype == torch.float32:
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
    if BACKEND == "mkl":
        ensure_row_group(shapes, torch.float32)
    for k, n in shapes:
        rw = RowWeight(torch.randn(k, n, generator=gen))
        x = torch.randn(max_rows, k, generator=gen) * 3
        ones = torch.cat([rw.rows(x[i:i + 1]) for i in range(max_rows)])
        for m in range(1, max_rows + 1):
            if not torch.equal(rw.rows(x[:m]), ones[:m]):
                return False
    return True


_threads_from_env()
