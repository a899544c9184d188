"""Native quantised blocks: llama.cpp's Q4_1 and Q8_0 matrices kept as blocks, multiplied by the C kernel.

SmolLM2-135M reaches the workbook as a GGUF of Q4_1 matrices and a Q8_0 embedding. A block holds 32
consecutive weights of one output row:

    Q4_1  20 bytes: d (f16), m (f16), 16 bytes of 4-bit codes q (low nibbles: weights 0-15, high: 16-31);
          w = d * q + m
    Q8_0  34 bytes: d (f16), 32 int8 codes q;  w = d * q

Computed in float32 as a multiply, then an add (two roundings, never one fused multiply-add), that is
exactly the float32 value gguf's dequantiser produces, so the engine can keep the blocks (5 bits a weight
instead of 32) and still compute the float32 path's bits. On disk and in memory a native matrix is a uint8
tensor [rows, row bytes] of the file's own blocks; `NativeWeight` packs it at load into the kernel's
strip-blocks (csrc/rowkernel.c documents the layout) and `dequantise_rows` gives the float32 matrix.

Shape legend: N output rows, K inputs (a multiple of 32), B = K / 32 blocks per row.
"""
from __future__ import annotations

import os

import torch

from lessonkit.engine import kernel
from lessonkit.engine.errors import LessonkitError

QK = 32                                            # weights per block
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}             # bytes per block of 32 weights
KIND_CODE = {"q4_1": 0, "q8_0": 1}                 # csrc/rowkernel.c's block kinds
STRIP = kernel.STRIP


def choose_weights(requested: str | None = None) -> tuple[str, str]:
    """("native" or "f32", why): how a model with quantised blocks is multiplied. `requested` (an engine
    argument) wins over LESSONKIT_WEIGHTS; the default is native where the C kernel runs, else f32."""
    req = (requested or os.environ.get("LESSONKIT_WEIGHTS", "") or "auto").strip().lower()
    if req not in ("auto", "native", "f32"):
        raise LessonkitError(f"weights {req!r} (LESSONKIT_WEIGHTS or --weights): expected native, f32 or auto")
    ready = kernel._rowkernel is not None and kernel.BACKEND != "mkl"
    if req == "f32":
        return "f32", "asked for (LESSONKIT_WEIGHTS=f32 or weights='f32')"
    if req == "native" and not ready:
        raise LessonkitError(f"native weights need the C kernel ({kernel.WHY}); use LESSONKIT_WEIGHTS=f32")
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
    """Blocks raw [N, B * bytes] -> the kernel's strip-blocks (1-D uint8): per strip of 16 rows, per block,
    d[16] (m[16]) as f16 bytes, then the codes input by input (Q4_1: two inputs to a byte, see rowkernel.c).
    Packed `chunk` rows (whole strips) at a time into one buffer, so loading needs little more than the result."""
    n = raw.shape[0]
    per_row = raw.shape[1]                       # a strip-block holds exactly 16 rows' bytes of one block
    out = torch.empty(-(-n // STRIP) * STRIP * per_row, dtype=torch.uint8)
    for r0 in range(0, n, chunk):
        part = _pack_strips(raw[r0:r0 + chunk], kind)
        out[r0 * per_row:r0 * per_row + part.numel()] = part
    return out


def _pack_strips(raw: torch.Tensor, kind: str) -> torch.Tensor:
    d, m, q = _parts(raw, kind)
    n, b = d.shape
    n_pad = -(-n // STRIP) * STRIP
    if n_pad != n:                                   # zero rows: d = m = q = 0, weights 0, never stored
        d = torch.cat([d, d.new_zeros(n_pad - n, b)])
        m = None if m is None else torch.cat([m, m.new_zeros(n_pad - n, b)])
        q = torch.cat([q, q.new_zeros(n_pad - n, b, QK)])
    s = n_pad // STRIP
    scale = lambda t: t.view(s, STRIP, b).permute(0, 2, 1).contiguous().view(torch.uint8)    # [S, B, 32]
    codes = q.view(torch.uint8).view(s, STRIP, b, QK).permute(0, 2, 3, 1)                    # [S, B, 32, 16]
    if kind == "q4_1":
        codes = codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)                                 # [S, B, 16, 16]
        parts = [scale(d), scale(m), codes.reshape(s, b, -1)]
    else:
        parts = [scale(d), codes.reshape(s, b, -1)]
    return torch.cat(parts, dim=-1).reshape(-1).contiguous()


class NativeWeight:
    """A Q4_1 / Q8_0 matrix W [N, K] prepared for row-invariant products x [M, K] @ W.T on the C kernel,
    with the interface of `kernel.RowWeight` (k inputs, n outputs, rows(x), x @ w)."""

    __slots__ = ("k", "n", "kind", "data", "avx2")
    packed = True
    dtype = torch.uint8                    # not float32: code that needs float weights asks for them

    def __init__(self, raw: torch.Tensor, k: int, kind: str):
        if kernel._rowkernel is None or kernel.BACKEND == "mkl":
            raise LessonkitError(f"native {kind} weights need the C kernel ({kernel.WHY}); use LESSONKIT_WEIGHTS=f32")
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] * QK != k * BLOCK_BYTES[kind]:
            raise LessonkitError(f"native {kind} weight: blocks {tuple(raw.shape)} {raw.dtype} do not hold {k} inputs")
        self.k, self.n, self.kind = k, raw.shape[0], kind
        self.avx2 = kernel.BACKEND == "avx2"
        self.data = pack_blocks(raw, kind)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"row product: input {tuple(x.shape)} does not match weight [{self.k}, {self.n}]")
        if x.dtype != torch.float32:
            raise TypeError(f"the row kernel computes in float32, got {x.dtype}")
        if x.stride(1) != 1 or x.stride(0) < self.k:
            x = x.contiguous()
        y = torch.empty(x.shape[0], self.n, dtype=torch.float32)
        kernel._rowkernel.qmatmul(x.data_ptr(), x.shape[0], self.k, x.stride(0), self.data.data_ptr(),
                                  KIND_CODE[self.kind], self.n, y.data_ptr(), self.n, self.avx2)
        return y

    def __rmatmul__(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x if x.dim() == 2 else x.reshape(-1, self.k)).reshape(*x.shape[:-1], self.n)

    def unpacked(self) -> torch.Tensor:
        """W.T [K, N] in float32, dequantised by the kernel (for tests: it must equal dequantise_rows)."""
        s = -(-self.n // STRIP)
        out = torch.empty(s * self.k * STRIP, dtype=torch.float32)
        kernel._rowkernel.dequantise(self.data.data_ptr(), KIND_CODE[self.kind], self.k, self.n, out.data_ptr(),
                                     self.avx2)
        return out.view(s, self.k, STRIP).permute(1, 0, 2).reshape(self.k, -1)[:, :self.n]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Float32 rows W[ids] [T, K], read from the packed strip-blocks (a tied embedding looks its tokens up
        here, so the model keeps one copy of the table): d * q (+ m), as dequantise_rows computes them."""
        b, nb = self.k // QK, {"q4_1": 320, "q8_0": 544}[self.kind]
        blk = self.data.view(-1, b, nb)[ids // STRIP]                       # [T, B, bytes of a strip-block]
        col = (ids % STRIP).view(-1, 1, 1)
        half = lambda off: blk[..., off:off + 2 * STRIP].contiguous().view(torch.float16)   # [T, B, 16]
        d = half(0).gather(2, col.expand(-1, b, 1))[..., 0]                 # [T, B]
        codes = blk[..., 2 * STRIP * (2 if self.kind == "q4_1" else 1):].reshape(len(ids), b, -1, STRIP)
        q = codes.gather(3, col[..., None].expand(-1, b, codes.shape[2], 1))[..., 0]   # [T, B, 16 or 32]
        if self.kind == "q8_0":
            return (d.float()[..., None] * q.view(torch.int8).float()).reshape(len(ids), -1)
        m = half(2 * STRIP).gather(2, col.expand(-1, b, 1))[..., 0]
        q = torch.stack([q & 15, q >> 4], dim=-1).reshape(len(ids), b, QK)     # pair j: inputs 2j, 2j + 1
        return (d.float()[..., None] * q.float() + m.float()[..., None]).reshape(len(ids), -1)


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


# ---- a dense MLP's three matrices as one expert record (the streaming layout's experts.safetensors) ----
def expert_blob(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, inter: int, dim: int,
                name: str) -> torch.Tensor:
    """gate [I, D], up [I, D], down [D, I] as blocks -> one flat uint8 record (gate, up, down rows), one pread."""
    kinds = {block_kind(gate.shape, (inter, dim), name + ".gate"), block_kind(up.shape, (inter, dim), name + ".up"),
             block_kind(down.shape, (dim, inter), name + ".down")}
    if len(kinds) != 1:
        raise LessonkitError(f"{name}: gate, up and down use different block kinds {sorted(kinds)}; "
                             "only one kind per MLP is supported natively")
    return torch.cat([gate.reshape(-1), up.reshape(-1), down.reshape(-1)])


def expert_parts(blob: torch.Tensor, inter: int, dim: int, name: str) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(kind, gate|up blocks [2I, D/32 * bytes], down blocks [D, I/32 * bytes]) of one expert record."""
    for kind, nb in BLOCK_BYTES.items():
        if blob.numel() == 3 * inter * dim // QK * nb and dim % QK == 0 and inter % QK == 0:
            gu = blob[:2 * inter * dim // QK * nb].view(2 * inter, -1)
            return kind, gu, blob[2 * inter * dim // QK * nb:].view(dim, -1)
    raise LessonkitError(f"{name}: {blob.numel()} bytes are not Q4_1 or Q8_0 blocks of a [3, {inter}, {dim}] MLP")


def dequantise_expert(blob: torch.Tensor, inter: int, dim: int, name: str) -> torch.Tensor:
    """An expert record as the float32 layout's [3, I, D] tensor (gate, up, down^T)."""
    kind, gu, down = expert_parts(blob, inter, dim, name)
    g_u = dequantise_rows(gu, kind)
    return torch.stack([g_u[:inter], g_u[inter:], dequantise_rows(down, kind).T])
