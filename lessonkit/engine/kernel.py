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
forward, draft_greedy, set_threads, has_avx2), whose C error codes become the exceptions raised here.

The weights these paths multiply are `lessonkit.engine.row_weight.RowWeight` (float strips) and
`lessonkit.engine.blocks.NativeWeight` (Q4_1 / Q8_0 blocks dequantised inside the kernel, same bits as float32).
`set_threads(n)` splits every product's strips over n threads; the bits do not depend on n. `use_library(lib)`
swaps the library products go through (tests compare binaries), under the same lock as `set_threads`.
"""
from __future__ import annotations

import contextlib
import platform
import threading

from lessonkit.engine import settings
from lessonkit.engine.kernel_library import (ABI, ISA_NAMES, PATH_INT8, PATH_ISA, PATH_NO_VNNI,  # noqa: F401
                                             KernelLibrary, load_library)
from lessonkit.engine.settings import KERNEL_CHOICES
from lessonkit.errors import LessonkitError

_rowkernel, BINARY, BINARY_WHY = load_library()
_IMPORT_ERROR = "" if _rowkernel is not None else BINARY_WHY



def _kernel_request() -> str:
    """LESSONKIT_KERNEL=auto|avx512|avx2|neon|portable|mkl: the one setting of the path short forwards take
    ("" or auto: the fastest this CPU has; neon is arm64's portable path; mkl: no C kernel). A path the CPU
    lacks is refused by name, never silently replaced (engine.settings reads it, and refuses the old LESSONKIT_ISA)."""
    req = settings.from_env().kernel
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
    why = f"forced by LESSONKIT_KERNEL={settings.from_env().kernel}"
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
NUMERICS_CHOICES = ("exact", "int8")


def _choose_numerics() -> tuple[str, str]:
    """How native-block products compute (LESSONKIT_NUMERICS=exact|int8|auto): `exact` dequantises every weight
    to float32 and gives the float32 model's bits; `int8` quantises each row's activations to 8 bits per block
    of 32 and takes integer block dots (csrc/intdot.c; docs/numerics.md): row-invariant by construction, not
    the float32 model's bits. Float weights always compute in float32."""
    req = settings.from_env().numerics
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


def path_word(backend_name: str | None = None, numerics: str | None = None) -> int:
    """The C entry points' path word (csrc/rowkernel.h): the ISA (enum rk_isa, ISA_NAMES' index of the backend;
    mkl: PATH_PORTABLE, it calls no C product), plus PATH_INT8 when native-block products take the int8 numerics."""
    name = backend_name or BACKEND
    isa_code = ISA_NAMES.index(name) if name in ISA_NAMES else 0
    return isa_code | (PATH_INT8 if (numerics or NUMERICS) == "int8" and name != "mkl" else 0)


def isa_of(path: int) -> str:
    """The ISA a path word runs, by name (ISA_NAMES: portable, avx2, avx512)."""
    return ISA_NAMES[int(path) & PATH_ISA]


def check_numerics(name: str) -> None:
    """Raises unless native weights can take numerics `name` ("exact" or "int8") in this process."""
    if name not in NUMERICS_CHOICES:
        raise LessonkitError(f"numerics {name!r}: expected one of {', '.join(NUMERICS_CHOICES)}")
    if name == "int8" and (_rowkernel is None or BACKEND == "mkl"):
        raise LessonkitError(f"numerics int8 needs the C kernel ({WHY})")


def swap_numerics(name: str, why: str) -> tuple[str, str]:
    """Native weights prepared from now on take numerics `name` (checked: check_numerics), `why` being the
    reason; returns the (numerics, why) replaced. `lessonkit.engine.active.use` swaps it for a block."""
    global NUMERICS, NUMERICS_WHY
    old = NUMERICS, NUMERICS_WHY
    NUMERICS, NUMERICS_WHY = name, why
    return old


def set_numerics(name: str) -> str:
    """How native weights prepared from now on multiply ("exact" or "int8"); returns the choice."""
    check_numerics(name)
    swap_numerics(name, "asked for (--numerics)")
    return name


def numerics_of(code: int) -> str:
    """The numerics a path word selects."""
    return "int8" if int(code) & PATH_INT8 else "exact"


def uses_vnni(backend_name: str | None = None) -> bool:
    """Whether the int8 products take vpdpbusd on this path: the AVX-512 path on a CPU with AVX-512 VNNI (the AVX2
    path, LESSONKIT_KERNEL=avx2 included, takes vpmaddubsw; csrc/rowkernel.c decode_path)."""
    return (backend_name or BACKEND) == "avx512" and _rowkernel is not None and _rowkernel.has_vnni()


def backend() -> dict:
    """Which path short forwards take, and why (for `lessonkit doctor`)."""
    return {"backend": BACKEND, "isa": isa(), "why": WHY, "numerics": NUMERICS, "numerics_why": NUMERICS_WHY,
            "vnni": uses_vnni(), "cpu_vnni": bool(_rowkernel is not None and _rowkernel.has_vnni()),
            "built": _rowkernel is not None,
            "binary": BINARY, "binary_why": BINARY_WHY,
            "threads": THREADS}


def check_backend(name: str) -> None:
    """Raises unless weights can take backend `name` ("avx512", "avx2", "portable" or "mkl") on this CPU."""
    if name not in ("avx512", "avx2", "portable", "mkl"):
        raise ValueError(f"unknown kernel backend {name!r}: expected avx512, avx2, portable or mkl")
    if name != "mkl" and _rowkernel is None:
        raise RuntimeError(f"backend {name}: no C kernel binary loaded ({_IMPORT_ERROR})")
    if name == "avx2" and not _rowkernel.has_avx2():
        raise RuntimeError("backend avx2: this CPU has no AVX2/FMA")
    if name == "avx512" and not _rowkernel.has_avx512():
        raise RuntimeError("backend avx512: this CPU has no AVX-512 F + BW")


def swap_backend(name: str, why: str) -> tuple[str, str]:
    """Weights prepared from now on take backend `name` (checked: check_backend), `why` being the reason;
    returns the (backend, why) replaced. `lessonkit.engine.active.use` swaps it for a block."""
    global BACKEND, WHY
    old = BACKEND, WHY
    BACKEND, WHY = name, why
    return old


_LIBRARY_LOCK = threading.Lock()   # set_threads and use_library: a thread count never lands on a library being swapped out
_asked = settings.STARTING_THREADS  # the count last asked for: what a library swapped in (or back) takes


def set_threads(n: int) -> int:
    """Threads the C kernel splits a product's output strips over (each output is still one chain, computed by
    one thread, so the bits do not depend on n). Returns the number in use; 1 without the C kernel."""
    global THREADS, _asked
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    with _LIBRARY_LOCK:
        _asked = n
        THREADS = _threads_on(_rowkernel)
    return THREADS


def _threads_on(lib: KernelLibrary | None) -> int:
    """The count last asked for, set on `lib` (at most its limit); 1 without a library. Under _LIBRARY_LOCK."""
    return lib.set_threads(min(_asked, lib.max_threads)) if lib is not None else 1


@contextlib.contextmanager
def use_library(lib: KernelLibrary | None):
    """Products inside the block go through `lib` (a KernelLibrary from `load_library`, or None: no C kernel),
    then through the library that was in place again. A library of another ABI is refused by file name before
    anything changes. The thread count is the process's setting, not the library's: the library swapped in (and
    the one swapped back) gets the count last asked for before a product can reach it, and `set_threads` waits
    for a swap to finish (one lock), so no count lands on a library on its way out."""
    global _rowkernel, THREADS
    if lib is not None and (not isinstance(lib, KernelLibrary) or lib.ABI != ABI):
        name = getattr(getattr(lib, "path", None), "name", repr(lib))
        raise LessonkitError(f"kernel library {name}: ABI {getattr(lib, 'ABI', None)}, this code needs {ABI}; "
                             "rebuild it with `python csrc/build_kernels.py`")
    with _LIBRARY_LOCK:
        old, _rowkernel = _rowkernel, lib
        THREADS = _threads_on(lib)
    try:
        yield lib
    finally:
        with _LIBRARY_LOCK:
            _rowkernel = old
            THREADS = _threads_on(old)


THREADS = settings.STARTING_THREADS


def asked_threads() -> int:
    """The thread count last asked for (set_threads), what a library swapped in gets."""
    return _asked


def _threads_from_env() -> None:
    """LESSONKIT_THREADS=N (engine.settings reads it): a user's override of the count a process starts with;
    unset, one thread (tests and notebooks share cores). Commands take --threads; notebooks the threads of
    their SETTINGS parameter (engine.active.adopt)."""
    n = settings.from_env().threads
    if n is not None:
        set_threads(n)


_threads_from_env()
