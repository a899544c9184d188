"""The C kernel library (csrc/rowkernel.c) as Python: which binary loads for this OS and CPU, and its entry points
with Python arguments (addresses and sizes as ints), C error codes turned into exceptions. lessonkit/engine/kernel.py
chooses the path and prepares the weights; this module only finds and binds the library.

It is also csrc/rowkernel.h's one Python mirror: the ABI number, the error codes, the path word's bits, the named
slots of the forward's plan and dims (by the header's own names), and the forward's two inputs, struct rk_model and
struct rk_batch, as one ctypes.Structure each (RkModel, RkBatch). tests/test_packed_format.py compares every name's
number with the header, tests/test_kernel_format.py every field's offset and size with a compiled program."""
from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path

from lessonkit.files.resources import PACKAGE_DIR

ABI = 15                                # csrc/rowkernel.c's rk_abi() this module calls
KERNELS = PACKAGE_DIR / "engine" / "kernels"      # the shipped binaries (csrc/build_kernels.py)
_SYSTEMS = {"linux": ("linux", ".so"), "win32": ("windows", ".dll"), "darwin": ("macos", ".dylib")}
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


def binary_name(system: str = sys.platform, machine: str = platform.machine()) -> str | None:
    """The shipped binary's file name for this OS and CPU (None: no binary is built for them). 64-bit ARM is
    aarch64 on Linux and Windows (as zig's targets name it), arm64 on macOS (as Apple and its wheel tags do)."""
    os_name, ext = _SYSTEMS.get("linux" if system.startswith("linux") else system, (None, None))
    arch = _MACHINES.get(machine.lower())
    if os_name is None or arch is None:
        return None
    if os_name != "macos" and arch == "arm64":
        arch = "aarch64"
    return f"rowkernel-{os_name}-{arch}{ext}"


def host_binary_name(system: str = sys.platform) -> str:
    """Where `csrc/build_kernels.py --host` puts a library built with this machine's compiler."""
    ext = _SYSTEMS.get("linux" if system.startswith("linux") else system, (None, ".so"))[1]
    return f"rowkernel-host{ext}"


# csrc/rowkernel.h's names, mirrored (tests/test_packed_format.py compares every one with the header)
RK_OK, RK_BAD_SIZES, RK_NO_AVX2, RK_NO_MEMORY, RK_BAD_KIND, RK_BAD_THREADS, RK_FETCH_FAILED = range(7)  # error codes
PATH_PORTABLE, PATH_AVX2, PATH_AVX512 = 0, 1, 2         # enum rk_isa: the path word's ISA (path & PATH_ISA)
PATH_ISA, PATH_INT8, PATH_NO_VNNI = 3, 4, 8             # the path word's bits
ISA_NAMES = ("portable", "avx2", "avx512")              # enum rk_isa's values by name (kernel.BACKEND's words)
# struct rk_model's plan: the globals, then each layer's slots (PLAN_LAYER words a layer); its dims; a MoE
# layer's expert table entry
(PLAN_FINAL_NORM, PLAN_HEAD, PLAN_HEAD_KIND, PLAN_COS, PLAN_SIN, PLAN_EMBED, PLAN_EMBED_KIND, PLAN_EMBED_ROWS,
 PLAN_GLOBALS) = range(9)
(LAYER_ATTN_NORM, LAYER_WQKV, LAYER_WQKV_KIND, LAYER_WO, LAYER_WO_KIND, LAYER_MLP_NORM, LAYER_GATE_UP,
 LAYER_GATE_UP_KIND, LAYER_DOWN, LAYER_DOWN_KIND, LAYER_Q_NORM, LAYER_K_NORM, LAYER_ROUTER, LAYER_ROUTER_KIND,
 LAYER_EXPERTS, PLAN_LAYER) = range(16)
(DIM_LAYERS, DIM_D, DIM_HEADS, DIM_KV_HEADS, DIM_HEAD_DIM, DIM_INTER, DIM_VOCAB, DIM_ROPE_ROWS, DIM_EXPERTS,
 DIM_TOP_K, DIM_NORM_TOPK, DIM_QK_NORM, DIM_PREFETCH, DIMS) = range(14)
EXPERT_GATE_UP, EXPERT_GATE_UP_KIND, EXPERT_DOWN, EXPERT_DOWN_KIND, EXPERT_ENTRY = range(5)
# rk_draft_greedy's chain: a feature head's input rows (csrc/forward.c)
(CHAIN_ETAB, CHAIN_W, CHAIN_W_KIND, CHAIN_GNORM, CHAIN_STATES, CHAIN_S, CHAIN_FROM, CHAIN_TO, CHAIN_G, CHAIN_FUSE,
 CHAIN_FUSE_KIND, CHAIN_STATE, CHAIN_STATE_KIND, CHAIN_ROWS, CHAIN_AT, CHAIN_TOKENS, CHAIN_WE, CHAIN_WE_KIND,
 CHAIN_WORDS) = range(19)

FETCH = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64))  # rk_fetch_fn
_ADDR, _I64, _I32 = ctypes.c_size_t, ctypes.c_int64, ctypes.c_int32


class RkModel(ctypes.Structure):
    """struct rk_model: what rk_forward reads the same from call to call (addresses as ints, 0 for NULL)."""
    _fields_ = [("plan", _ADDR), ("dims", _ADDR), ("fetch", _ADDR), ("eps", ctypes.c_float),
                ("clip", ctypes.c_float), ("path", _I32)]


class RkBatch(ctypes.Structure):
    """struct rk_batch: one call's rows (tokens or x), their positions, the logits wanted and where they go, the
    experts each row chose, the KV cache the rows write and attend over, and the layers whose residual stream is
    copied out (taps; addresses as ints, 0 for NULL)."""
    _fields_ = [("tokens", _ADDR), ("x", _ADDR), ("m", _I64), ("start", _I64), ("first", _I64), ("logits", _ADDR),
                ("routing", _ADDR), ("unique", _ADDR), ("k_cache", _ADDR), ("v_cache", _ADDR), ("alloc", _I64),
                ("tap_at", _ADDR), ("n_taps", _I64), ("taps", _ADDR)]


class KernelLibrary:
    """The kernel library's entry points with Python arguments (addresses and sizes as ints); a C error code
    becomes the exception the extension module raised before: ValueError naming the entry point for bad
    sizes or kinds, RuntimeError on a CPU without AVX2 when the AVX2 path is asked for, MemoryError."""

    SIGNATURES = {
        "rk_abi": [], "rk_max_threads": [], "rk_has_avx2": [], "rk_has_avx512": [],
        "rk_matmul": [_ADDR, _I64, _I64, _I64, _ADDR, _I64, _ADDR, _I64, _I32],
        "rk_qmatmul": [_ADDR, _I64, _I64, _I64, _ADDR, _I32, _I64, _ADDR, _I64, _I32],
        "rk_dequantise": [_ADDR, _I32, _I64, _I64, _ADDR, _I32],
        "rk_repack_int": [_ADDR, _I32, _I64, _I64, _ADDR], "rk_has_vnni": [],
        "rk_set_threads": [_I32, ctypes.POINTER(_I32)],
        "rk_fma_many": [_ADDR, _ADDR, _ADDR, _ADDR, _I64, _I32],
        "rk_forward": [ctypes.POINTER(RkModel), ctypes.POINTER(RkBatch)],
        "rk_draft_greedy": [ctypes.POINTER(RkModel), ctypes.POINTER(RkBatch), _I64, _ADDR, _ADDR, _ADDR],
        "rk_exp_many": [_ADDR, _ADDR, _I64, _I32],
        "rk_state_half": [_ADDR, _I64, _I64, _I64, _ADDR, _I32, _ADDR, _I32, ctypes.c_float, _ADDR, _I32],
        "rk_profile": [_I32, _ADDR],
    }

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))           # CDLL, not PyDLL: every call releases the GIL
        self.ABI = self._abi()
        if self.ABI != ABI:
            return                                       # the caller refuses it; nothing else is bound
        for name, args in self.SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int32
        self.max_threads = self.lib.rk_max_threads()

    def _abi(self) -> int | None:
        try:
            fn = self.lib.rk_abi
        except AttributeError:
            return None
        fn.argtypes, fn.restype = [], ctypes.c_int32
        return fn()

    @staticmethod
    def _check(who: str, rc: int, bad: str = "bad sizes") -> None:
        if rc == RK_OK:
            return
        if rc == RK_NO_AVX2:
            raise RuntimeError(f"rowkernel.{who}: this CPU has no AVX2/FMA/F16C")
        if rc == RK_NO_MEMORY:
            raise MemoryError(f"rowkernel.{who}: no memory for the dequantisation scratch")
        if rc == RK_BAD_SIZES:
            raise ValueError(f"rowkernel.{who}: {bad}")
        raise RuntimeError(f"rowkernel.{who}: error code {rc}")

    def has_avx2(self) -> bool:
        return bool(self.lib.rk_has_avx2())

    def has_avx512(self) -> bool:   # AVX-512 F + BW, and the OS saves the 512-bit state
        return bool(self.lib.rk_has_avx512())

    def has_vnni(self) -> bool:     # AVX-512 VNNI (vpdpbusd) on top of that: the int8 numerics' fastest dot
        return bool(self.lib.rk_has_vnni())

    def matmul(self, x, m, k, ldx, w, n, y, ldy, path) -> None:
        """y[m, :n] = x[m, :k] @ W (W packed in float strips at address w)"""
        self._check("matmul", self.lib.rk_matmul(x, m, k, ldx, w, n, y, ldy, int(path)))

    def qmatmul(self, x, m, k, ldx, w, kind, n, y, ldy, path) -> None:
        """the same on native strip-blocks, kind 0 = Q4_1, 1 = Q8_0 (2, 3: the int8 numerics' layout of each)"""
        rc = self.lib.rk_qmatmul(x, m, k, ldx, w, kind, n, y, ldy, int(path))
        if rc == RK_BAD_KIND:
            raise ValueError(f"rowkernel.qmatmul: unknown block kind {kind} (0: Q4_1, 1: Q8_0, 2 / 3: int8 layout)")
        self._check("qmatmul", rc)

    def dequantise(self, w, kind, k, n, out, path) -> None:
        """native strips -> float32 strips"""
        rc = self.lib.rk_dequantise(w, kind, k, n, out, int(path))
        self._check("dequantise", RK_BAD_SIZES if rc == RK_BAD_KIND else rc, "bad arguments")

    def repack_int(self, src, kind, k, n, dst) -> None:
        """native strip-blocks (kind 0 / 1) -> the int8 numerics' layout (csrc/intdot.c), dst as large as src"""
        rc = self.lib.rk_repack_int(src, kind, k, n, dst)
        self._check("repack_int", RK_BAD_SIZES if rc == RK_BAD_KIND else rc, "bad arguments")

    def set_threads(self, n: int) -> int:
        """threads per product (the caller is one of them); returns the number in use"""
        in_use = _I32(0)
        if self.lib.rk_set_threads(n, ctypes.byref(in_use)) == RK_BAD_THREADS:
            raise ValueError(f"rowkernel.set_threads: {n} threads (1 to {self.max_threads})")
        return in_use.value

    def forward(self, model: RkModel, batch: RkBatch) -> int:
        """a whole forward of batch.m rows at positions batch.start.. (csrc/forward.c documents the plan); returns
        RK_FETCH_FAILED when the model's fetch reported an error (the caller holds it), else raises or 0"""
        rc = self.lib.rk_forward(ctypes.byref(model), ctypes.byref(batch))
        if rc == RK_FETCH_FAILED:
            return rc
        self._check("forward", RK_BAD_SIZES if rc == RK_BAD_KIND else rc,
                    "bad sizes (or a weight kind other than float32, Q4_1, Q8_0)")
        return rc

    def draft_greedy(self, model: RkModel, batch: RkBatch, k, ids, chain, out) -> None:
        """a greedy draft turn of k tokens in one call (csrc/forward.c rk_draft_greedy): argmax rows into out [k]"""
        self._check("draft_greedy", self.lib.rk_draft_greedy(ctypes.byref(model), ctypes.byref(batch), k, ids, chain,
                                                             out),
                    "bad sizes (or a weight kind other than float32, Q4_1, Q8_0)")

    def state_half(self, states, t, s, d, fuse, fuse_kind, state, state_kind, eps, out, path) -> None:
        """the feature head's state half of t positions (csrc/forward.c rk_state_half): states [t, s, d] -> out [t, d]"""
        self._check("state_half", self.lib.rk_state_half(states, t, s, d, fuse, fuse_kind, state, state_kind, eps, out,
                                                         int(path)),
                    "bad sizes (or a weight kind other than float32, Q4_1, Q8_0)")

    PROFILE_GROUPS = ("elementwise", "attention products", "attention", "mlp / experts", "output layer",
                      "expert fetch")

    def profile(self, on: bool) -> dict[str, float]:
        """Seconds the C forward spent per op group since profiling was last turned on; on=True (re)starts it."""
        out = (ctypes.c_double * len(self.PROFILE_GROUPS))()
        self._check("profile", self.lib.rk_profile(int(on), ctypes.addressof(out)))
        return dict(zip(self.PROFILE_GROUPS, out))

    def exp_many(self, x, out, n, path: int = 0) -> None:
        """out[i] = the forward's exp(x[i]) (csrc/forward.c exp_lk) on the path word's ISA"""
        self._check("exp_many", self.lib.rk_exp_many(x, out, n, path))

    def fma_many(self, a, b, c, out, n, how) -> None:
        """out[i] = fma(a[i], b[i], c[i]); how 1: the portable path's fma on this CPU, 0: the software fma"""
        self._check("fma_many", self.lib.rk_fma_many(a, b, c, out, n, how))


def _candidates() -> list[tuple[Path, str]]:
    name = binary_name()
    out = []
    if name:
        out.append((KERNELS / name, f"the shipped binary for {sys.platform} {platform.machine()}"))
    out.append((KERNELS / host_binary_name(), "built on this machine (csrc/build_kernels.py --host)"))
    return out


def load_library(candidates=None) -> tuple[KernelLibrary | None, str | None, str]:
    """The first candidate that loads and has this code's ABI: (library, file name, why), or (None, None,
    why none did: each file tried and what went wrong)."""
    tried = []
    for path, why in (candidates if candidates is not None else _candidates()):
        if not path.is_file():
            tried.append(f"{path.name} absent")
            continue
        try:
            lib = KernelLibrary(path)
        except OSError as exc:
            tried.append(f"{path.name} does not load ({exc})")
            continue
        if lib.ABI != ABI:
            tried.append(f"{path.name} is stale (ABI {lib.ABI}, this code needs {ABI}): rebuild it with "
                         f"csrc/build_kernels.py")
            continue
        return lib, path.name, why
    if binary_name() is None:
        tried.insert(0, f"no shipped binary for {sys.platform} {platform.machine()}")
    return None, None, "; ".join(tried) + "; `python csrc/build_kernels.py --host` builds one with a C compiler"
