"""Row-invariant products for short forwards: the C kernel (csrc/rowkernel.c) or MKL row groups.

A short forward (decode, speculative verify, drafting; at most ROWWISE_MAX rows) multiplies its rows by
the transposed weights W [in, out]. Exactness needs every row's result to equal a one-row product bit for
bit, whatever the other rows are. Four backends, chosen once at import:

  avx512    as avx2, with native-block products of up to 6 rows in 512-bit registers (same chains, same bits);
  avx2      the C kernel, AVX2 + FMA: each output is one fixed-order FMA chain over the input dimension,
            weights packed at load into 16-column strips and read once per call for all rows;
  portable  the same C kernel without AVX2 vectors (one correctly rounded fma per weight, the FMA
            instruction where the CPU has one, a proven software fma elsewhere: same bits);
  mkl       no kernel binary for this platform: rows in groups of at most ROW_GROUP on MKL's GEMV path,
            which is row-invariant too but makes one pass over the weights per group.

`LESSONKIT_KERNEL=auto|avx512|avx2|neon|portable|mkl` forces a path: the one setting (tests use it to compare).

The kernel is a plain C shared library, no Python ABI, loaded with ctypes (which releases the GIL during
each call): one binary per OS and CPU serves every Python version. The wheel ships six, cross-built with
`zig cc` by csrc/build_kernels.py into lessonkit/engine/kernels/: rowkernel-{linux-x86_64, linux-aarch64}.so
(glibc 2.17, manylinux2014), rowkernel-{windows-x86_64, windows-aarch64}.dll and
rowkernel-{macos-x86_64, macos-arm64}.dylib. At import the one for `sys.platform` and `platform.machine()`
loads, else one built on this machine (`python csrc/build_kernels.py --host`: rowkernel-host.*), else none
and the MKL backend runs; BINARY and BINARY_WHY say which file loaded and why (`lessonkit doctor` prints
them). `_rowkernel` is that library's entry points as Python methods (matmul, qmatmul, dequantise,
dense_step, set_threads, has_avx2), whose C error codes become the exceptions raised here.

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

from lessonkit.engine.kernel_library import (ABI, FETCH, KERNELS, RK_BAD_KIND, RK_BAD_SIZES,  # noqa: F401
                                             RK_BAD_THREADS, RK_FETCH_FAILED, RK_NO_AVX2, RK_NO_MEMORY, RK_OK,
                                             KernelLibrary, binary_name, host_binary_name, load_library)
from lessonkit.errors import LessonkitError

_rowkernel, BINARY, BINARY_WHY = load_library()
_IMPORT_ERROR = "" if _rowkernel is not None else BINARY_WHY

STRIP = 16           # columns per packed strip (csrc/rowkernel.c)
ROWWISE_MAX = 16     # forwards of at most this many rows take the row-invariant path
ROW_PAD = 8          # longer products: one GEMM padded to a multiple of ROW_PAD rows


KERNEL_CHOICES = ("auto", "avx512", "avx2", "neon", "portable", "mkl")


def _kernel_request() -> str:
    """LESSONKIT_KERNEL=auto|avx512|avx2|neon|portable|mkl: the one setting of the path short forwards take
    ("" or auto: the fastest this CPU has; neon is arm64's portable path; mkl: no C kernel). A path the CPU
    lacks is refused by name, never silently replaced."""
    old = os.environ.get("LESSONKIT_ISA", "").strip()
    if old:
        raise LessonkitError(f"LESSONKIT_ISA={old!r}: the kernel path has one setting now, LESSONKIT_KERNEL "
                             f"({', '.join(KERNEL_CHOICES)})")
    req = os.environ.get("LESSONKIT_KERNEL", "").strip().lower() or "auto"
    if req not in KERNEL_CHOICES:
        raise LessonkitError(f"LESSONKIT_KERNEL={req!r}: expected one of {', '.join(KERNEL_CHOICES)}")
    arm = platform.machine().lower() in ("aarch64", "arm64")
    if req in ("neon", "avx512", "avx2") and (req == "neon") != arm:
        owner = "arm64" if req == "neon" else "x86"
        raise LessonkitError(f"LESSONKIT_KERNEL={req}: {req.upper()} is {owner}'s; this CPU is {platform.machine()}")
    if req == "portable" and arm:
        raise LessonkitError("LESSONKIT_KERNEL=portable: on arm64 the portable path is NEON (LESSONKIT_KERNEL=neon)")
    return "portable" if req == "neon" else req


def _choose() -> tuple[str, str]:
    forced = _kernel_request()
    why = f"forced by LESSONKIT_KERNEL={os.environ.get('LESSONKIT_KERNEL', '').strip().lower()}"
    if forced == "mkl":
        return "mkl", why
    if _rowkernel is None:
        if forced != "auto":
            raise LessonkitError(f"LESSONKIT_KERNEL={forced}: no C kernel binary loaded ({_IMPORT_ERROR})")
        return "mkl", f"no C kernel binary loaded ({_IMPORT_ERROR})"
    if forced == "portable":
        return "portable", why
    if forced == "avx512" and not _rowkernel.has_avx512():
        raise LessonkitError("LESSONKIT_KERNEL=avx512: this CPU has no AVX-512 F + BW (avx2 gives the same bits)")
    if forced == "avx2" and not _rowkernel.has_avx2():
        raise LessonkitError("LESSONKIT_KERNEL=avx2: this CPU has no AVX2/FMA")
    if _rowkernel.has_avx512() and forced != "avx2":
        return "avx512", why if forced == "avx512" else "C kernel loaded and this CPU has AVX-512 F + BW"
    if _rowkernel.has_avx2():
        return "avx2", why if forced == "avx2" else "C kernel loaded and this CPU has AVX2 + FMA"
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return "mkl", "this x86 CPU has no AVX2/FMA: the portable C path would be slower than MKL"
    return "portable", f"C kernel loaded; {platform.machine()} has no AVX2, portable C path (hardware FMA)"


def isa(backend_name: str | None = None) -> str:
    """The instruction set the kernel's path runs: avx512, avx2, neon (arm64's portable path), portable, or mkl."""
    b = backend_name or BACKEND
    if b == "portable" and platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    return b


BACKEND, WHY = _choose()
PATH_CODES = ("portable", "avx2", "avx512")
NUMERICS_CHOICES = ("exact", "int8")
PATH_INT8, PATH_NO_VNNI = 4, 8      # csrc/intdot.c: bits of the path word above the ISA's two


def _choose_numerics() -> tuple[str, str]:
    """How native-block products compute (LESSONKIT_NUMERICS=exact|int8|auto): `exact` dequantises every weight
    to float32 and gives the float32 model's bits; `int8` quantises each row's activations to 8 bits per block
    of 32 and takes integer block dots (csrc/intdot.c; docs/numerics.md): row-invariant by construction, not
    the float32 model's bits. Float weights always compute in float32."""
    req = os.environ.get("LESSONKIT_NUMERICS", "").strip().lower() or "auto"
    if req not in NUMERICS_CHOICES + ("auto",):
        raise LessonkitError(f"LESSONKIT_NUMERICS={req!r}: expected exact, int8 or auto")
    if req == "int8" and (_rowkernel is None or BACKEND == "mkl"):
        raise LessonkitError(f"LESSONKIT_NUMERICS=int8 needs the C kernel ({WHY})")
    if req != "auto":
        return req, f"asked for (LESSONKIT_NUMERICS={req})"
    if _rowkernel is None or BACKEND == "mkl":
        return "exact", f"default without the C kernel ({WHY})"
    return DEFAULT_NUMERICS, f"default on the C kernel ({DEFAULT_NUMERICS}: docs/kernel.md has the measurements)"


DEFAULT_NUMERICS = "exact"
NUMERICS, NUMERICS_WHY = _choose_numerics()


def path_code(backend_name: str | None = None, numerics: str | None = None) -> int:
    """The C entry points' path word: the ISA (an index of PATH_CODES; mkl: 0, it calls no C product), plus
    PATH_INT8 when native-block products take the int8 numerics."""
    name = backend_name or BACKEND
    code = PATH_CODES.index(name) if name in PATH_CODES else 0
    return code | (PATH_INT8 if (numerics or NUMERICS) == "int8" and name != "mkl" else 0)


def set_numerics(name: str) -> str:
    """How native weights prepared from now on multiply ("exact" or "int8"); returns the choice."""
    global NUMERICS, NUMERICS_WHY
    if name not in NUMERICS_CHOICES:
        raise LessonkitError(f"numerics {name!r}: expected one of {', '.join(NUMERICS_CHOICES)}")
    if name == "int8" and (_rowkernel is None or BACKEND == "mkl"):
        raise LessonkitError(f"numerics int8 needs the C kernel ({WHY})")
    NUMERICS, NUMERICS_WHY = name, "asked for (--numerics)"
    return name


def numerics_of(code: int) -> str:
    """The numerics a path word selects."""
    return "int8" if int(code) & PATH_INT8 else "exact"


@contextlib.contextmanager
def numerics(name: str):
    """Weights prepared inside the block take numerics `name` ("exact" or "int8"): benchmarks and lessons load
    the same model twice to compare the two side by side in one process."""
    global NUMERICS, NUMERICS_WHY
    old = NUMERICS, NUMERICS_WHY
    set_numerics(name)
    NUMERICS_WHY = f"chosen for a comparison ({name})"
    try:
        yield
    finally:
        NUMERICS, NUMERICS_WHY = old


def backend() -> dict:
    """Which path short forwards take, and why (for `lessonkit doctor`)."""
    return {"backend": BACKEND, "isa": isa(), "why": WHY, "numerics": NUMERICS, "numerics_why": NUMERICS_WHY,
            "vnni": bool(_rowkernel is not None and _rowkernel.has_vnni()), "built": _rowkernel is not None,
            "binary": BINARY, "binary_why": BINARY_WHY,
            "row_group": ROW_GROUP if BACKEND == "mkl" else None, "threads": THREADS}


@contextlib.contextmanager
def using(name: str):
    """Weights prepared inside the block take backend `name` ("avx2", "portable" or "mkl"): benchmarks
    and lessons load the same model twice to compare the paths side by side in one process."""
    global BACKEND, WHY
    if name not in ("avx512", "avx2", "portable", "mkl"):
        raise ValueError(f"unknown kernel backend {name!r}: expected avx512, avx2, portable or mkl")
    if name != "mkl" and _rowkernel is None:
        raise RuntimeError(f"backend {name}: no C kernel binary loaded ({_IMPORT_ERROR})")
    if name == "avx2" and not _rowkernel.has_avx2():
        raise RuntimeError("backend avx2: this CPU has no AVX2/FMA")
    if name == "avx512" and not _rowkernel.has_avx512():
        raise RuntimeError("backend avx512: this CPU has no AVX-512 F + BW")
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
    """LESSONKIT_THREADS=N: a user's override of the library default, the count a process starts with; unset, one
    thread (tests and notebooks share cores). Commands take --threads; notebooks KERNEL_THREADS (engine.threads)."""
    raw = os.environ.get("LESSONKIT_THREADS", "").strip()
    if not raw:
        return
    if not raw.isdigit() or int(raw) < 1:
        raise LessonkitError(f"LESSONKIT_THREADS={raw!r}: expected a positive integer (the kernel's thread count)")
    set_threads(int(raw))


def physical_cores() -> int:
    """Physical cores this process may use (the default thread count for decode): psutil's count of physical
    cores (Linux, macOS, Windows), at most the CPUs this process is allowed on where the OS says."""
    import psutil
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return max(1, cores)


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
        self.avx2 = path_code()                       # the path is fixed when the weight is prepared
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
