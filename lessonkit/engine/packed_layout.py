"""The kernel's packed format and packing native blocks into it, in numpy: no torch.

`lessonkit.engine.blocks` explains the blocks and the strip-block layout and holds the weight types that multiply
them (torch tensors); this module holds what both the torch engine and the torch-free generate
(`lessonkit.engine.lean`) need of the format: its one table (with csrc/format.h), which kind a matrix's blocks are,
and `pack_blocks`, the one implementation of packing (the torch engine hands it its tensors' memory as numpy views).
Packing is a permutation of bytes, so it gives the same bytes whoever calls it (tests/test_lean.py compares them).

Shape legend: N output rows, K inputs (a multiple of 32), B = K / 32 blocks per row, S = ceil(N / 16) strips.
"""
from __future__ import annotations

import numpy as np

from lessonkit.engine import kernel, settings
from lessonkit.errors import LessonkitError

# ---- the packed format: this table and csrc/format.h's constants are the one definition (C names as keys;
# tests/test_packed_format.py compiles format.h and compares). LK_LAYOUT_VERSION: of experts.safetensors'
# records, 1 = GGUF rows / float [3, I, D] (packed at every load), 2 = strip-packed (packed at conversion).
FORMAT = {
    "LK_LAYOUT_VERSION": 2,
    "QK": 32,                  # weights per block (llama.cpp's QK4_1 = QK8_0 = 32)
    "STRIP": 16,               # output rows (GEMV columns) per packed strip
    "Q41_ROW_BLOCK": 20,       # llama.cpp block_q4_1: d, m (f16), 16 bytes of nibbles
    "Q80_ROW_BLOCK": 34,       # llama.cpp block_q8_0: d (f16), 32 int8
    "Q41_BLOCK": 320,          # strip-block: d[16], m[16] (f16), 16 pairs x 16 bytes of nibbles
    "Q80_BLOCK": 544,          # strip-block: d[16] (f16), 32 x 16 int8
    "KIND_F32": -1, "KIND_Q41": 0, "KIND_Q80": 1,     # the kernel's weight kinds
    "KIND_Q41I": 2, "KIND_Q80I": 3,                   # the same blocks in the int8 numerics' layout (csrc/intdot.c)
}
QK, STRIP, LAYOUT_VERSION = FORMAT["QK"], FORMAT["STRIP"], FORMAT["LK_LAYOUT_VERSION"]
BLOCK_BYTES = {"q4_1": FORMAT["Q41_ROW_BLOCK"], "q8_0": FORMAT["Q80_ROW_BLOCK"]}      # bytes per row block
STRIP_BLOCK_BYTES = {"q4_1": FORMAT["Q41_BLOCK"], "q8_0": FORMAT["Q80_BLOCK"]}       # bytes per strip-block
KIND_CODE = {"q4_1": FORMAT["KIND_Q41"], "q8_0": FORMAT["KIND_Q80"]}
INT_KIND_CODE = {"q4_1": FORMAT["KIND_Q41I"], "q8_0": FORMAT["KIND_Q80I"]}   # the int8 numerics' layout
EXPERTS_FORMAT = f"lessonkit-stream-v{LAYOUT_VERSION}"     # experts.safetensors' metadata "format"
# the bytes inside a strip-block: csrc/format.h's structs (its names), field -> byte offset, "size" the struct's
# bytes; the int layouts' twins keep the same offsets (tests/test_kernel_format.py compiles offsetof and compares)
BLOCK_LAYOUT = {
    "block_q41": {"d": 0, "m": 32, "qs": 64, "size": 320},
    "block_q80": {"d": 0, "qs": 32, "size": 544},
    "block_q41i": {"d": 0, "m": 32, "qs": 64, "size": 320},
    "block_q80i": {"d": 0, "qs": 32, "size": 544},
}
FIELDS = {"q4_1": BLOCK_LAYOUT["block_q41"], "q8_0": BLOCK_LAYOUT["block_q80"]}     # by kind name
ALIGN = 64                 # bytes: packed weights start on a cache line (torch's allocator does the same)


def choose_weights(requested: str | None = None) -> tuple[str, str]:
    """("native", "f32" or "q8_0", why): how a model's matrices are multiplied. `requested` (an engine
    argument) wins over LESSONKIT_WEIGHTS; the default is native where the C kernel runs, else f32. "q8_0"
    also quantises a model's float matrices to Q8_0 blocks at load (`blocks.q8_0_rows`): another model, lossy,
    whose accuracy is measured against the float one (the int8 numerics then take integer dots on it)."""
    req = (requested or settings.current().weights).strip().lower()
    if req not in ("auto", "native", "f32", "q8_0"):
        raise LessonkitError(f"weights {req!r} (LESSONKIT_WEIGHTS or --weights): expected native, f32, q8_0 or auto")
    ready = kernel._rowkernel is not None and kernel.BACKEND != "mkl"
    if req == "f32":
        return "f32", "asked for (LESSONKIT_WEIGHTS=f32 or weights='f32')"
    if req in ("native", "q8_0") and not ready:
        raise LessonkitError(f"{req} weights need the C kernel ({kernel.WHY}); use LESSONKIT_WEIGHTS=f32")
    if req == "q8_0":
        return "q8_0", "asked for: float matrices quantised to Q8_0 blocks at load"
    if ready:
        return "native", "asked for" if req == "native" else f"default: the C kernel runs ({kernel.BACKEND})"
    return "f32", f"default without the C kernel ({kernel.WHY})"


def block_kind(shape: tuple, want: tuple, name: str = "tensor") -> str:
    """Which block kind a uint8 tensor of `shape` holds for a matrix of shape `want` = (N, K); raises naming it."""
    if len(want) == 2 and len(shape) == 2 and shape[0] == want[0] and want[1] % QK == 0:
        for kind, nb in BLOCK_BYTES.items():
            if shape[1] == want[1] // QK * nb:
                return kind
    raise LessonkitError(f"{name}: uint8 blocks of shape {tuple(shape)} are neither Q4_1 nor Q8_0 rows of a "
                         f"{tuple(want)} matrix")


def packed_bytes(n: int, k: int, kind: str) -> int:
    """Bytes of the strip-blocks of an [n, k] matrix (n padded to whole strips)."""
    return -(-n // STRIP) * (k // QK) * STRIP_BLOCK_BYTES[kind]


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 buffer of nbytes starting on an ALIGN-byte boundary."""
    base = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -base.ctypes.data % ALIGN
    return base[skip:skip + nbytes]


def pack_blocks(raw: np.ndarray, kind: str, out: np.ndarray | None = None, chunk: int = 2048) -> np.ndarray:
    """Blocks raw [N, B * bytes] (uint8) -> the kernel's strip-blocks (1-D uint8, into `out` when given): per strip
    of 16 rows, per block, d[16] (m[16]) as f16 bytes, then the codes input by input (Q4_1: two inputs to a byte,
    see rowkernel.c). Packed `chunk` rows (whole strips) at a time, so loading needs little more than the result."""
    n, per_row = raw.shape                       # a strip-block holds exactly 16 rows' bytes of one block
    size = -(-n // STRIP) * STRIP * per_row
    out = aligned_empty(size) if out is None else out
    if out.shape != (size,) or out.dtype != np.uint8:
        raise LessonkitError(f"packing {kind} blocks {raw.shape}: the buffer {out.shape} {out.dtype} is not {size} bytes")
    for r0 in range(0, n, chunk):
        part = _pack_strips(np.ascontiguousarray(raw[r0:r0 + chunk]), kind)
        out[r0 * per_row:r0 * per_row + part.size] = part
    return out


def _pack_strips(raw: np.ndarray, kind: str) -> np.ndarray:
    """Rows raw [n, B * bytes] -> strip-blocks [S * B * size], each field where FIELDS puts it."""
    n, nb, f = raw.shape[0], BLOCK_BYTES[kind], FIELDS[kind]
    b, n_pad = raw.shape[1] // nb, -(-n // STRIP) * STRIP
    rows = raw.reshape(n, b, nb)
    if n_pad != n:                                   # zero rows: d = m = q = 0, weights 0, never stored
        rows = np.concatenate([rows, np.zeros((n_pad - n, b, nb), np.uint8)])
    s = n_pad // STRIP
    by_strip = rows.reshape(s, STRIP, b, nb).transpose(0, 2, 1, 3)              # [S, B, 16 rows, row-block bytes]
    out = np.empty((s, b, f["size"]), dtype=np.uint8)
    # a llama.cpp row block: d (f16) at 0, then Q8_0's 32 codes at 2, or Q4_1's m (f16) at 2 and 16 nibble bytes
    # at 4 (byte j: input j low, j + 16 high); the strip-block holds the 16 rows' d (and m), then codes by input
    out[..., f["d"]:f["d"] + 2 * STRIP] = by_strip[..., 0:2].reshape(s, b, 2 * STRIP)
    if kind == "q8_0":
        out[..., f["qs"]:] = by_strip[..., 2:].transpose(0, 1, 3, 2).reshape(s, b, -1)      # input by input
        return out.reshape(-1)
    out[..., f["m"]:f["m"] + 2 * STRIP] = by_strip[..., 2:4].reshape(s, b, 2 * STRIP)
    qs = by_strip[..., 4:]
    codes = np.concatenate([qs & 15, qs >> 4], -1).transpose(0, 1, 3, 2)        # [S, B, 32 inputs, 16 rows]
    out[..., f["qs"]:] = (codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)).reshape(s, b, -1)   # pair j: 2j low, 2j+1 high
    return out.reshape(-1)


def for_numerics(packed: np.ndarray, kind: str, k: int, n: int, path: int,
                 out: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """(the kernel's kind code, the strip-blocks it multiplies) for weights prepared on path word `path`: `packed`
    as it is (exact numerics), or its bytes permuted into the int8 numerics' layout (into `out`, a buffer of the
    same size: the packed one may be a read-only file map)."""
    if kernel.numerics_of(path) != "int8":
        return KIND_CODE[kind], packed
    out = aligned_empty(packed.size) if out is None else out
    kernel._rowkernel.repack_int(packed.ctypes.data, KIND_CODE[kind], k, n, out.ctypes.data)
    return INT_KIND_CODE[kind], out


def float_expert_split(inter: int, dim: int) -> tuple[int, int]:
    """Elements of a format-2 float record's two parts: gate|up strips, down strips."""
    return -(-2 * inter // STRIP) * STRIP * dim, -(-dim // STRIP) * STRIP * inter


def packed_expert_layout(numel: int, blocks: bool, inter: int, dim: int, name: str) -> tuple[str, int]:
    """(kind, elements of the gate|up part) of a format-2 record of `numel` elements (uint8 when `blocks`):
    kind "q4_1" / "q8_0" (strip-blocks) or "float" (strips). Any other size raises naming the record."""
    if blocks and dim % QK == 0 and inter % QK == 0:
        for kind in STRIP_BLOCK_BYTES:
            a = packed_bytes(2 * inter, dim, kind)
            if numel == a + packed_bytes(dim, inter, kind):
                return kind, a
    elif not blocks and numel == sum(float_expert_split(inter, dim)):
        return "float", float_expert_split(inter, dim)[0]
    raise LessonkitError(f"{name}: a record of {numel} {'bytes' if blocks else 'floats'} is not an expert "
                         f"[3, {inter}, {dim}] in packed layout {LAYOUT_VERSION} ("
                         f"{'Q4_1 or Q8_0 strip-blocks' if blocks else 'float strips'}): corrupt file?")
