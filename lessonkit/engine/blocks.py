"""Native quantised blocks: llama.cpp's Q4_1 and Q8_0 matrices kept as blocks, multiplied by the C kernel.

SmolLM2-135M reaches the workbook as a GGUF of Q4_1 matrices and a Q8_0 embedding. A block holds 32
consecutive weights of one output row:

    Q4_1  20 bytes: d (f16), m (f16), 16 bytes of 4-bit codes q (low nibbles: weights 0-15, high: 16-31);
          w = d * q + m
    Q8_0  34 bytes: d (f16), 32 int8 codes q;  w = d * q

Computed in float32 as a multiply, then an add (two roundings, never one fused multiply-add), that is
exactly the float32 value gguf's dequantiser produces, so the engine can keep the blocks (5 bits a weight
instead of 32) and still compute the float32 path's bits. A dense native matrix is a uint8 tensor
[rows, row bytes] of the file's own blocks; `NativeWeight` packs it at load into the kernel's strip-blocks
(the layout below) and `dequantise_rows` gives the float32 matrix. A streamed expert's record is stored
already packed (format version 2, `FORMAT`): a miss is one read, handed to `NativeWeight.from_packed`
(or, for float experts, `strip_row_weight`) as it is.

Strip-blocks, per strip of 16 output rows, per block of 32 inputs (strips in order, blocks in order):
    Q4_1 320 bytes: d[16] f16, m[16] f16, 16 input pairs x 16 bytes (byte c of pair j: row c's code for
                    input 2j in the low nibble, 2j + 1 in the high one);
    Q8_0 544 bytes: d[16] f16, 32 inputs x 16 int8 codes (row c at byte c).
A strip-block holds exactly 16 rows' bytes of one block, so packing is a permutation (rows padded to a
multiple of 16 with zero blocks). Float weights use row_weight.pack_strips' strips: per strip, K x 16 floats.

Shape legend: N output rows, K inputs (a multiple of 32), B = K / 32 blocks per row, S = ceil(N / 16) strips.
"""
from __future__ import annotations

import numpy as np
import torch

from lessonkit.engine import kernel, packed_layout, row_weight
from lessonkit.errors import LessonkitError
from lessonkit.engine.row_weight import RowWeight

# ---- the packed format (its one table with csrc/format.h, FORMAT, and the strip-blocks' fields, BLOCK_LAYOUT) lives in
# packed_layout, with the torch-free pieces of this module: the torch-free generate reads them without torch
from lessonkit.engine.packed_layout import (BLOCK_BYTES, BLOCK_LAYOUT, EXPERTS_FORMAT, FIELDS, FORMAT,  # noqa: F401
                                            INT_KIND_CODE, KIND_CODE, LAYOUT_VERSION, QK, STRIP, STRIP_BLOCK_BYTES,
                                            block_kind, choose_weights, float_expert_split, packed_bytes,
                                            packed_expert_layout)


def q8_0_rows(w: torch.Tensor) -> torch.Tensor:
    """Float W [N, K] (K a multiple of 32) -> Q8_0 rows [N, K / 32 * 34], as llama.cpp's quantize_row_q8_0 lays
    them out: per block of 32, d = amax / 127 stored as f16, codes q = round(w / d) (half away from zero, with
    the stored d) clamped to +-127; a block of zeros has d = 0 and codes 0."""
    n, k = w.shape
    if k % QK:
        raise LessonkitError(f"Q8_0 blocks need inputs in multiples of {QK}, got a [{n}, {k}] matrix")
    wb = w.float().reshape(n, k // QK, QK)
    d = (wb.abs().amax(-1) / 127).half()
    inv = torch.where(d.float() == 0, torch.zeros(()), 1 / d.float())
    v = wb * inv[..., None]
    q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127).to(torch.int8)
    return torch.cat([d.contiguous().view(torch.uint8).view(n, -1, 2), q.view(torch.uint8)], -1).reshape(n, -1)


def q8_0_weight(w: torch.Tensor) -> "NativeWeight":
    """A float W [N, K] as a Q8_0 NativeWeight (the weight x @ W.T multiplies by)."""
    return NativeWeight(q8_0_rows(w), w.shape[1], "q8_0")


def q4_1_weight(w: torch.Tensor) -> "NativeWeight":
    """A float W [N, K] (K a multiple of 32) as a Q4_1 NativeWeight: gguf's quantiser (llama.cpp's
    quantize_row_q4_1: per block of 32, m = the smallest weight, d = (largest - m) / 15, codes round((w - m) / d))."""
    from gguf import GGMLQuantizationType, quants        # here, not at import: gguf takes a tenth of a second

    n, k = w.shape
    if k % QK:
        raise LessonkitError(f"Q4_1 blocks need inputs in multiples of {QK}, got a [{n}, {k}] matrix")
    raw = quants.quantize(np.ascontiguousarray(w.detach().float().numpy()), GGMLQuantizationType.Q4_1)
    return NativeWeight(torch.from_numpy(raw), k, "q4_1")


def _parts(raw: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(d [N, B] f16, m [N, B] f16 or None, codes [N, B, 32] uint8 or int8) of blocks raw [N, B * bytes]."""
    blocks = raw.contiguous().view(raw.shape[0], -1, BLOCK_BYTES[kind])
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    if kind == "q8_0":
        return d, None, blocks[..., 2:].contiguous().view(torch.int8)
    m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
    qs = blocks[..., 4:]
    return d, m, torch.cat([qs & 15, qs >> 4], dim=-1)


def dequantise_rows(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Float32 [N, K] of blocks raw [N, B * bytes]: d * q (+ m), each operation rounded on its own, as gguf does."""
    d, m, q = _parts(raw, kind)
    w = d.float()[..., None] * q.float()
    if m is not None:
        w = w + m.float()[..., None]
    return w.reshape(raw.shape[0], -1)


def pack_blocks(raw: torch.Tensor, kind: str, chunk: int = 2048) -> torch.Tensor:
    """Blocks raw [N, B * bytes] -> the kernel's strip-blocks (1-D uint8): packed_layout.pack_blocks (the one
    implementation, numpy) writing into a torch buffer."""
    out = torch.empty(-(-raw.shape[0] // STRIP) * STRIP * raw.shape[1], dtype=torch.uint8)
    packed_layout.pack_blocks(raw.numpy(), kind, out.numpy(), chunk)
    return out


def _strip_parts(packed: torch.Tensor, k: int, kind: str):
    """(d [S, B, 16] f16, m or None, codes [S, B, 32, 16] uint8 / int8 by input) of strip-blocks `packed`."""
    b, sb = k // QK, STRIP_BLOCK_BYTES[kind]
    blk = packed.view(-1, b, sb)
    half = lambda off: blk[..., off:off + 2 * STRIP].contiguous().view(torch.float16)
    f = FIELDS[kind]
    if kind == "q8_0":
        return half(f["d"]), None, blk[..., f["qs"]:].contiguous().view(torch.int8).view(-1, b, QK, STRIP)
    pairs = blk[..., f["qs"]:].reshape(-1, b, QK // 2, 1, STRIP)
    return half(f["d"]), half(f["m"]), torch.cat([pairs & 15, pairs >> 4], dim=3).reshape(-1, b, QK, STRIP)


def unpack_blocks(packed: torch.Tensor, n: int, k: int, kind: str) -> torch.Tensor:
    """The inverse of pack_blocks: strip-blocks of an [n, k] matrix -> its GGUF rows [n, B * bytes]."""
    d, m, q = _strip_parts(packed, k, kind)
    s, b = d.shape[:2]
    rows = lambda t: t.permute(0, 2, 1).reshape(s * STRIP, b, 1).contiguous().view(torch.uint8)   # f16 -> 2 bytes
    q = q.view(torch.uint8).permute(0, 3, 1, 2).reshape(s * STRIP, b, QK)
    if kind == "q8_0":
        out = torch.cat([rows(d), q], dim=-1)
    else:
        out = torch.cat([rows(d), rows(m), q[..., :QK // 2] | (q[..., QK // 2:] << 4)], dim=-1)
    return out[:n].reshape(n, -1)


def dequantise_strips(packed: torch.Tensor, k: int, kind: str) -> torch.Tensor:
    """Strip-blocks -> the float32 strips row_weight.pack_strips would make of W.T ([S * K * 16], 1-D): w = d * q (+ m),
    each operation rounded on its own, as dequantise_rows (padding rows dequantise to 0)."""
    d, m, q = _strip_parts(packed, k, kind)
    w = d.float()[:, :, None, :] * q.float()                         # [S, B, 32, 16]
    if m is not None:
        w = w + m.float()[:, :, None, :]
    return w.reshape(-1)


def unpack_strips(strips: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """row_weight.pack_strips' strips -> W.T [K, N] (a copy)."""
    return strips.view(-1, k, STRIP).permute(1, 0, 2).reshape(k, -1)[:, :n].contiguous()


def strip_row_weight(strips: torch.Tensor, k: int, n: int) -> RowWeight:
    """A row_weight.RowWeight over float strips already in pack_strips' layout (W.T [K, N] packed): where the kernel
    multiplies float32 strips, the tensor itself becomes the weight (no copy, no re-pack); the MKL path or
    another compute dtype gets W.T unpacked, as RowWeight keeps it."""
    if strips.dim() != 1 or strips.numel() != -(-n // STRIP) * STRIP * k:
        raise LessonkitError(f"float strips of {tuple(strips.shape)} do not hold a [{k}, {n}] weight")
    if kernel.BACKEND == "mkl" or strips.dtype != torch.float32:
        return RowWeight(unpack_strips(strips, k, n))
    rw = RowWeight.__new__(RowWeight)          # RowWeight.__init__ would pack W.T; these strips are packed
    rw.k, rw.n, rw.dtype, rw.data, rw.path = k, n, torch.float32, strips, kernel.path_word()
    return rw


class NativeWeight:
    """A Q4_1 / Q8_0 matrix W [N, K] prepared for row-invariant products x [M, K] @ W.T on the C kernel,
    with the interface of `row_weight.RowWeight` (k inputs, n outputs, rows(x), x @ w)."""

    __slots__ = ("k", "n", "kind", "data", "path", "code")
    packed = True
    dtype = torch.uint8                    # not float32: code that needs float weights asks for them

    def __init__(self, raw: torch.Tensor, k: int, kind: str):
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] * QK != k * BLOCK_BYTES[kind]:
            raise LessonkitError(f"native {kind} weight: blocks {tuple(raw.shape)} {raw.dtype} do not hold {k} inputs")
        self._prepare(k, raw.shape[0], kind, None)
        self.data = self._for_numerics(pack_blocks(raw, kind))

    @classmethod
    def from_packed(cls, packed: torch.Tensor, k: int, n: int, kind: str) -> "NativeWeight":
        """A weight over strip-blocks already packed (1-D uint8, pack_blocks' layout), taken as they are."""
        w = cls.__new__(cls)
        w._prepare(k, n, kind, packed)
        w.data = w._for_numerics(packed)
        return w

    def _for_numerics(self, packed: torch.Tensor) -> torch.Tensor:
        """The strip-blocks the kernel multiplies (packed_layout.for_numerics): as packed (exact numerics), or their
        bytes permuted into the int8 numerics' layout (a new tensor of the same size: the packed one may be a
        read-only file map)."""
        out = torch.empty_like(packed) if kernel.numerics_of(self.path) == "int8" else None
        self.code, _ = packed_layout.for_numerics(packed.numpy(), self.kind, self.k, self.n, self.path,
                                                  None if out is None else out.numpy())
        return packed if out is None else out

    def _prepare(self, k: int, n: int, kind: str, packed: torch.Tensor | None) -> None:
        if kernel._rowkernel is None or kernel.BACKEND == "mkl":
            raise LessonkitError(f"native {kind} weights need the C kernel ({kernel.WHY}); use LESSONKIT_WEIGHTS=f32")
        if packed is not None and (packed.dtype != torch.uint8 or packed.dim() != 1 or k % QK
                                   or packed.numel() != packed_bytes(n, k, kind)):
            raise LessonkitError(f"native {kind} weight: strip-blocks {tuple(packed.shape)} {packed.dtype} do not "
                                 f"hold a [{n}, {k}] matrix ({packed_bytes(n, k, kind)} bytes)")
        self.k, self.n, self.kind, self.data = k, n, kind, packed
        self.path = kernel.path_word()

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"row product: input {tuple(x.shape)} does not match weight [{self.k}, {self.n}]")
        if x.dtype != torch.float32:
            raise TypeError(f"the row kernel computes in float32, got {x.dtype}")
        if x.stride(1) != 1 or x.stride(0) < self.k:
            x = x.contiguous()
        y = torch.empty(x.shape[0], self.n, dtype=torch.float32)
        kernel._rowkernel.qmatmul(x.data_ptr(), x.shape[0], self.k, x.stride(0), self.data.data_ptr(),
                                  self.code, self.n, y.data_ptr(), self.n, self.path)
        return y

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x if x.dim() == 2 else x.reshape(-1, self.k)).reshape(*x.shape[:-1], self.n)

    def unpacked(self) -> torch.Tensor:
        """W.T [K, N] in float32, dequantised by the kernel (for tests: it must equal dequantise_rows)."""
        s = -(-self.n // STRIP)
        out = torch.empty(s * self.k * STRIP, dtype=torch.float32)
        kernel._rowkernel.dequantise(self.data.data_ptr(), self.code, self.k, self.n, out.data_ptr(),
                                     self.path)
        return out.view(s, self.k, STRIP).permute(1, 0, 2).reshape(self.k, -1)[:, :self.n]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Float32 rows W[ids] [T, K], read from the packed strip-blocks (a tied embedding looks its tokens up
        here, so the model keeps one copy of the table): d * q (+ m), as dequantise_rows computes them."""
        b, nb = self.k // QK, STRIP_BLOCK_BYTES[self.kind]
        blk = self.data.view(-1, b, nb)[ids // STRIP]                       # [T, B, bytes of a strip-block]
        col = (ids % STRIP).view(-1, 1, 1)
        half = lambda off: blk[..., off:off + 2 * STRIP].contiguous().view(torch.float16)   # [T, B, 16]
        d = half(FIELDS[self.kind]["d"]).gather(2, col.expand(-1, b, 1))[..., 0]       # [T, B]
        codes = blk[..., FIELDS[self.kind]["qs"]:]
        if self.code != KIND_CODE[self.kind]:
            q = self._int_layout_codes(codes, col, b)
        else:
            codes = codes.reshape(len(ids), b, -1, STRIP)
            q = codes.gather(3, col[..., None].expand(-1, b, codes.shape[2], 1))[..., 0]   # [T, B, 16 or 32]
        if self.kind == "q8_0":
            return (d.float()[..., None] * q.view(torch.int8).float()).reshape(len(ids), -1)
        m = half(FIELDS[self.kind]["m"]).gather(2, col.expand(-1, b, 1))[..., 0]
        if self.code == KIND_CODE[self.kind]:
            q = torch.stack([q & 15, q >> 4], dim=-1).reshape(len(ids), b, QK)     # pair j: inputs 2j, 2j + 1
        return (d.float()[..., None] * q.float() + m.float()[..., None]).reshape(len(ids), -1)

    def _int_layout_codes(self, codes: torch.Tensor, col: torch.Tensor, b: int) -> torch.Tensor:
        """Codes [T, B, 32] of the selected columns from the int8 numerics' layout (csrc/intdot.c): groups of 64
        bytes, column c's 4 bytes at 4c; Q8_0 stores q + 128, Q4_1 inputs 8h + j (low) and 8h + 4 + j (high)."""
        t = codes.shape[0]
        g = codes.reshape(t, b, -1, STRIP, 4)
        q = g.gather(3, col[..., None, None].expand(-1, b, g.shape[2], 1, 4))[:, :, :, 0]    # [T, B, groups, 4]
        if self.kind == "q8_0":
            return (q ^ 0x80).view(torch.int8).reshape(t, b, QK)
        return torch.stack([q & 15, q >> 4], dim=3).reshape(t, b, QK)


class BlockRows:
    """An embedding table kept as blocks: `table[ids]` dequantises just those rows (a decode step reads one).
    Either its own blocks (raw [V, B * bytes]) or, for an embedding tied to the output layer, that layer's
    packed NativeWeight (then the model holds the table once)."""

    def __init__(self, raw: torch.Tensor | None, kind: str, head: NativeWeight | None = None):
        self.raw, self.kind, self.head = raw, kind, head
        self.shape = (head.n, head.k) if head is not None else (raw.shape[0], raw.shape[1] // BLOCK_BYTES[kind] * QK)
        self.dtype = torch.float32

    def __getitem__(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.long)
        flat = ids.reshape(-1)
        rows = self.head.output_rows(flat) if self.head is not None else dequantise_rows(self.raw[flat], self.kind)
        return rows.reshape(*ids.shape, self.shape[1])

    def float(self) -> torch.Tensor:
        """The whole table in float32 (what the float32 path holds)."""
        if self.head is not None:
            return self.head.unpacked().T.contiguous()
        return dequantise_rows(self.raw, self.kind)


# ---- an expert's (or a dense MLP's) three matrices as one record of experts.safetensors ----------------
# Format 2 (EXPERTS_FORMAT, written by every conversion): gate|up as one [2I, D] weight, then down [D, I], each
# in the kernel's layout, so a miss is one read and no re-pack:
#   native blocks: pack_blocks(gate|up rows) then pack_blocks(down rows)              (1-D uint8)
#   float:         pack_strips(gate|up^T [D, 2I]) then pack_strips(down^T [I, D])     (1-D, the file's dtype)
# Format 1 (older files): the GGUF rows of gate, up, down (uint8), or float [3, I, D] (gate, up, down^T).
def expert_blob(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, inter: int, dim: int,
                name: str) -> torch.Tensor:
    """gate [I, D], up [I, D], down [D, I] as blocks -> one flat uint8 record of their rows (format 1)."""
    kinds = {block_kind(gate.shape, (inter, dim), name + ".gate"), block_kind(up.shape, (inter, dim), name + ".up"),
             block_kind(down.shape, (dim, inter), name + ".down")}
    if len(kinds) != 1:
        raise LessonkitError(f"{name}: gate, up and down use different block kinds {sorted(kinds)}; "
                             "only one kind per MLP is supported natively")
    return torch.cat([gate.reshape(-1), up.reshape(-1), down.reshape(-1)])


def expert_parts(blob: torch.Tensor, inter: int, dim: int, name: str) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(kind, gate|up blocks [2I, D/32 * bytes], down blocks [D, I/32 * bytes]) of a format-1 record."""
    for kind, nb in BLOCK_BYTES.items():
        if blob.numel() == 3 * inter * dim // QK * nb and dim % QK == 0 and inter % QK == 0:
            gu = blob[:2 * inter * dim // QK * nb].view(2 * inter, -1)
            return kind, gu, blob[2 * inter * dim // QK * nb:].view(dim, -1)
    raise LessonkitError(f"{name}: {blob.numel()} bytes are not Q4_1 or Q8_0 blocks of a [3, {inter}, {dim}] MLP")


def pack_expert(record: torch.Tensor, inter: int, dim: int, name: str) -> torch.Tensor:
    """A format-1 record (uint8 rows or float [3, I, D]) -> its format-2 record (see above)."""
    if record.dtype == torch.uint8:
        kind, gu, down = expert_parts(record, inter, dim, name)
        return torch.cat([pack_blocks(gu, kind), pack_blocks(down, kind)])
    if tuple(record.shape) != (3, inter, dim):
        raise LessonkitError(f"{name}: expert of shape {tuple(record.shape)}, expected {(3, inter, dim)}")
    return torch.cat([row_weight.pack_strips(record[:2].reshape(2 * inter, dim).T), row_weight.pack_strips(record[2])])


def old_rows_error(path, name: str) -> str:
    """The refusal of a format-1 record of native blocks (GGUF rows): what it is, and the command that fixes it."""
    return (f"{path}: {name} holds native blocks as GGUF rows (expert layout 1, written by an older lessonkit and "
            f"re-packed at every load); this lessonkit reads native experts only in packed layout {LAYOUT_VERSION} "
            f"(metadata format {EXPERTS_FORMAT!r}). For smollm2-135m, `--model smollm2-135m` converts it again from "
            f"the GGUF into a new folder (this one may be deleted); for another folder, "
            f"`python -m lessonkit.models.convert repack FOLDER` rewrites it packed")


def packed_expert_parts(record: torch.Tensor, inter: int, dim: int, name: str):
    """(kind, gate|up, down) of a format-2 record (see packed_expert_layout): views into it, no copy."""
    if record.dim() != 1:
        raise LessonkitError(f"{name}: a record of shape {tuple(record.shape)} is not a flat packed record")
    kind, a = packed_expert_layout(record.numel(), record.dtype == torch.uint8, inter, dim, name)
    return kind, record[:a], record[a:]


def dequantise_expert(record: torch.Tensor, inter: int, dim: int, name: str, packed: bool = True) -> torch.Tensor:
    """An expert record (format 2 when packed, else format 1's uint8 rows) as float32 [3, I, D] (gate, up, down^T)."""
    if not packed:
        kind, gu, down = expert_parts(record, inter, dim, name)
        g_u = dequantise_rows(gu, kind)
        return torch.stack([g_u[:inter], g_u[inter:], dequantise_rows(down, kind).T])
    kind, gu, down = packed_expert_parts(record, inter, dim, name)
    if kind != "float":
        gu, down = dequantise_strips(gu, dim, kind), dequantise_strips(down, inter, kind)
    g_u = unpack_strips(gu.float(), dim, 2 * inter).T
    return torch.stack([g_u[:inter], g_u[inter:], unpack_strips(down.float(), inter, dim)])


def unpack_expert(record: torch.Tensor, inter: int, dim: int, name: str) -> torch.Tensor:
    """The inverse of pack_expert: a format-2 record -> its format-1 record (uint8 GGUF rows of gate, up, down, or
    float [3, I, D] in the record's dtype). For comparisons with the old layout (tests, `lessonkit bench streaming`)."""
    kind, gu, down = packed_expert_parts(record, inter, dim, name)
    if kind == "float":
        g_u = unpack_strips(gu, dim, 2 * inter).T
        return torch.stack([g_u[:inter], g_u[inter:], unpack_strips(down, inter, dim)])
    return torch.cat([unpack_blocks(gu, 2 * inter, dim, kind).reshape(-1),
                      unpack_blocks(down, dim, inter, kind).reshape(-1)])
