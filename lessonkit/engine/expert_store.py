"""The disk-streaming expert store, modelled on Colibri's route -> union -> place -> overlap -> learn.

Each expert's three matrices (gate, up, down^T) are one record in `experts.safetensors`, so one expert is
one contiguous positioned read (`portable_io.read_at`). In memory an expert is kept in the layout the
matmuls want (`Expert`: gate|up transposed to [D, 2I], down^T [I, D], packed for the kernel). Experts
live in an LRU cache with a byte budget; an optional pinned hot set (from recorded routing history) is
never evicted; an optional background thread prefetches the experts the next layer's router is predicted
to pick. Placement changes speed only: the values that reach the matmul are the values on disk, whatever
the budget.

Records in packed layout (lessonkit.engine.blocks, format 2, what every conversion writes: metadata
"format" = blocks.EXPERTS_FORMAT) are already in the kernel's layout, so a miss is one read and the buffer
read into IS the weight: float32 strips become a RowWeight, native Q4_1 / Q8_0 strip-blocks a NativeWeight,
with no transpose and no re-pack (bf16 strips are widened, one elementwise copy). Older float files ([3, I, D]
per expert, format 1, as the shipped drafters are) are transposed and packed on every load. With
native=True, native blocks are multiplied as blocks (a fifth of the bytes), otherwise dequantised to float32
strips on read; either way the same float32 values reach the chains. A format-1 record of native blocks
(GGUF rows, written by older lessonkit versions) is refused, naming the file and the fix (legacy_rows=True
reads it, packing on every load: only the benchmark's before/after comparison asks for that).

Where a miss's bytes come from is the store's disk mode (lessonkit.files.disk: warm from the page cache, cold
past it, or a simulated slower disk); a mode changes the time a miss takes, never its bytes.

Shapes: E experts per layer, I intermediate size, D hidden size.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from lessonkit.engine import blocks as qb
from lessonkit.engine.checkpoint import layers_error, layers_held, parse_safetensors_header
from lessonkit.errors import LessonkitError
from lessonkit.engine.row_weight import RowWeight
from lessonkit.files.disk import WARM, Disk, after_read, open_cold, parse_disk
from lessonkit.files.portable_io import BINARY, read_at

_ST_DTYPES = {"F32": (np.float32, torch.float32), "BF16": (np.uint16, torch.bfloat16),
              "F16": (np.float16, torch.float16)}


def read_safetensors_header(path: str | Path, *, metadata: bool = False) -> tuple[dict, int]:
    """(tensor entries, data start) of a safetensors file; a missing, corrupt or truncated file raises
    LessonkitError naming it. metadata=True keeps the header's "__metadata__" entry."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header, data_start, data_end = parse_safetensors_header(f, size)
    except FileNotFoundError:
        raise LessonkitError(f"{path}: file not found") from None
    except ValueError as e:
        raise LessonkitError(f"{path}: {e}") from None
    meta = header.pop("__metadata__", None)
    if metadata:
        header["__metadata__"] = meta if isinstance(meta, dict) else {}
    if data_end > size:
        raise LessonkitError(f"{path}: truncated: header needs {data_end} bytes, file has {size}")
    return header, data_start


class Expert(NamedTuple):
    """One expert in compute layout: h = silu(x @ gate_up_t[:, :I]) * (x @ gate_up_t[:, I:]); y = h @ down_t."""
    gate_up_t: RowWeight       # [D, 2I]
    down_t: RowWeight          # [I, D]


class ExpertStore:
    """Experts of every layer, read on demand from one safetensors file.

    budget_bytes: resident bytes allowed (None = unlimited). Counted in the compute dtype.
    disk: where a miss's bytes come from (lessonkit.files.disk: warm, cold, simulated:MB/s).
    """

    def __init__(self, path: str | Path, n_layers: int, n_experts: int, shape: tuple[int, int, int],
                 *, dtype=torch.float32, budget_bytes: int | None = None, prefetch: bool = False,
                 native: bool = False, legacy_rows: bool = False, disk: Disk | str = WARM, q8_0: bool = False):
        self.path, self.native, self.q8_0 = Path(path), native, q8_0   # q8_0: float experts quantised on read
        self.n_layers, self.n_experts, self.shape, self.dtype = n_layers, n_experts, tuple(shape), dtype
        header, self._data_start = read_safetensors_header(self.path, metadata=True)
        self.layout = 2 if header.pop("__metadata__").get("format") == qb.EXPERTS_FORMAT else 1
        self._entries = {}
        for l in range(n_layers):
            for e in range(n_experts):
                name = f"layers.{l}.experts.{e}"
                if name not in header:
                    raise LessonkitError(layers_error(self.path, n_layers, layers_held(header), name))
                self._entries[(l, e)] = self._entry(name, header[name], legacy_rows)
        self.blocks = any(v[2] == "U8" for v in self._entries.values())
        if self.blocks and native:                  # resident bytes: the records themselves
            self.expert_bytes = max(v[1] for v in self._entries.values())
        else:
            self.expert_bytes = int(np.prod(self.shape)) * torch.tensor([], dtype=dtype).element_size()
        if budget_bytes is not None and budget_bytes < self.expert_bytes:
            raise LessonkitError(
                f"expert budget of {budget_bytes} bytes ({budget_bytes / 2**20:.3f} MB) is smaller than one expert "
                f"({self.expert_bytes} bytes = {self.expert_bytes / 2**20:.3f} MB)")
        self.budget_bytes = budget_bytes
        self._pool = start_prefetch_thread() if prefetch else None      # before the file: a refusal leaves nothing open
        self._fd = os.open(self.path, os.O_RDONLY | BINARY)
        self._cache: OrderedDict[tuple[int, int], Expert] = OrderedDict()
        self._pinned: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._inflight: dict[tuple[int, int], Future] = {}
        self.reset_counters()
        self.disk = WARM
        try:
            self.set_disk(disk)
        except LessonkitError:
            self.close()
            raise

    def _entry(self, name: str, h: dict, legacy_rows: bool) -> tuple[int, int, str, bool]:
        """(file offset, bytes, safetensors dtype, packed) of one record, its layout checked against the file's."""
        try:
            (a, b), dt, shape = h["data_offsets"], str(h["dtype"]), tuple(int(n) for n in h["shape"])
        except (KeyError, TypeError, ValueError):
            raise LessonkitError(f"{self.path}: malformed header entry for {name}: corrupt file?") from None
        if dt != "U8" and dt not in _ST_DTYPES:
            raise LessonkitError(f"{self.path}: tensor {name} has unsupported dtype {dt}")
        _, inter, dim = self.shape
        if self.layout == 2:                        # packed: size checked here, so a read needs no check
            size = 1 if dt == "U8" else np.dtype(_ST_DTYPES[dt][0]).itemsize
            if len(shape) != 1 or shape[0] * size != b - a:
                raise LessonkitError(f"{self.path}: tensor {name} has shape {list(shape)} in {b - a} bytes; packed "
                                     f"layout {qb.LAYOUT_VERSION} keeps every expert as one flat record: corrupt file?")
            qb.packed_expert_layout(shape[0], dt == "U8", inter, dim, f"{self.path}: {name}")
            return self._data_start + a, b - a, dt, True
        if dt == "U8" and len(shape) == 1:          # format 1 native blocks: GGUF rows
            if not legacy_rows:
                raise LessonkitError(qb.old_rows_error(self.path, name))
            return self._data_start + a, b - a, dt, False
        if shape != self.shape:
            raise LessonkitError(f"{self.path}: tensor {name} has shape {list(shape)}, config needs {list(self.shape)}")
        return self._data_start + a, b - a, dt, False

    def set_disk(self, disk: Disk | str) -> None:
        """Read every later miss from `disk` (cold empties the file's page cache now)."""
        disk = parse_disk(disk)
        if disk.mode == "cold":
            open_cold(self._fd)
        self.disk = disk

    # ---- counters ------------------------------------------------------------------------------
    def reset_counters(self) -> None:
        self.hits = self.misses = self.bytes_read = self.prefetched = self.prefetch_hits = 0
        self.io_s = 0.0

    def counters(self) -> dict:
        total = self.hits + self.misses
        return {"expert_hits": self.hits, "expert_misses": self.misses, "bytes_read": self.bytes_read,
                "expert_hit_rate": self.hits / total if total else None, "io_s": self.io_s,
                "prefetched": self.prefetched, "prefetch_hits": self.prefetch_hits,
                "resident_experts": len(self._cache)}

    # ---- reading -------------------------------------------------------------------------------
    def _read(self, key) -> Expert:
        off, n, st_dtype, packed = self._entries[key]
        t0 = time.perf_counter()
        if self._fd is None:
            raise LessonkitError(f"{self.path}: expert store is closed")
        buf = torch.empty(n, dtype=torch.uint8)      # torch's allocator: 64-byte aligned, strips start on a line
        got = read_at(self._fd, buf.numpy(), off)
        if got != n:
            raise LessonkitError(f"{self.path}: short read for expert {key} ({got} of {n} bytes): file truncated?")
        t = buf if st_dtype == "U8" else buf.view(_ST_DTYPES[st_dtype][1])
        name = f"{self.path}: layers.{key[0]}.experts.{key[1]}"
        ex = self._packed_expert(t, name) if packed else self._format1_expert(t, name)
        after_read(self.disk, self._fd, off, n, t0)
        self.io_s += time.perf_counter() - t0
        self.bytes_read += n
        return ex

    def _packed_expert(self, record: torch.Tensor, name: str) -> Expert:
        """A packed record (format 2) as weights, no re-pack: native strip-blocks as they are (or dequantised to
        float strips when the engine runs float32), float strips as they are (bf16 / f16 widened)."""
        _, inter, dim = self.shape
        kind, gu, down = qb.packed_expert_parts(record, inter, dim, name)
        if kind != "float" and self.native:
            return Expert(qb.NativeWeight.from_packed(gu, dim, 2 * inter, kind),
                          qb.NativeWeight.from_packed(down, inter, dim, kind))
        if kind != "float":
            gu, down = qb.dequantise_strips(gu, dim, kind), qb.dequantise_strips(down, inter, kind)
        if self.q8_0 and dim % qb.QK == 0 and inter % qb.QK == 0:   # weights="q8_0": blocks from the float strips
            return Expert(qb.q8_0_weight(qb.unpack_strips(gu.float(), dim, 2 * inter).T),
                          qb.q8_0_weight(qb.unpack_strips(down.float(), inter, dim).T))
        gu, down = gu.to(self.dtype), down.to(self.dtype)            # no copy when the file holds the compute dtype
        return Expert(qb.strip_row_weight(gu, dim, 2 * inter), qb.strip_row_weight(down, inter, dim))

    def _format1_expert(self, t: torch.Tensor, name: str) -> Expert:
        """A format-1 record, transposed and packed on this load: float [3, I, D], or (legacy_rows) GGUF rows."""
        _, inter, dim = self.shape
        if t.dtype == torch.uint8:
            if not self.native:
                t = qb.dequantise_expert(t, inter, dim, name, packed=False)
            else:
                kind, gu, down = qb.expert_parts(t, inter, dim, name)
                return Expert(qb.NativeWeight(gu, dim, kind), qb.NativeWeight(down, inter, kind))
        t = t.view(self.shape)
        gate_up_t = t[:2].reshape(2 * inter, dim).T.contiguous().to(self.dtype)   # the transpose is the copy
        down_t = t[2].to(self.dtype) if t.dtype != self.dtype else t[2].clone()
        return Expert(RowWeight(gate_up_t), RowWeight(down_t))   # packed for the row kernel

    def _insert(self, key, t) -> None:
        # caller holds the lock
        self._cache[key] = t
        self._cache.move_to_end(key)
        if self.budget_bytes is None:
            return
        while len(self._cache) * self.expert_bytes > self.budget_bytes:
            victim = next((k for k in self._cache if k not in self._pinned and k != key), None)
            if victim is None:
                break
            del self._cache[victim]

    @property
    def streams(self) -> bool:
        """Whether experts are read from disk as the model decodes: a budget below all of them."""
        return self.budget_bytes is not None and self.budget_bytes < self.n_layers * self.n_experts * self.expert_bytes

    def count_resident_uses(self, keys) -> None:
        """Count uses of experts the caller already holds (the C forward's dense MLP) as get() would: a hit and
        the LRU order for each resident one; one that is not resident is read by get()."""
        missing = []
        with self._lock:
            for key in keys:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    self.hits += 1
                else:
                    missing.append(key)
        for layer, expert in missing:
            self.get(layer, expert)

    def get(self, layer: int, expert: int) -> Expert:
        """One expert's weights in compute layout (see `Expert`)."""
        key = (layer, expert)
        with self._lock:
            t = self._cache.get(key)
            if t is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return t
            fut = self._inflight.get(key)
        if fut is not None:
            t = fut.result()
            with self._lock:
                self.hits += 1
                self.prefetch_hits += 1
                if key not in self._cache:
                    self._insert(key, t)
            return t
        t = self._read(key)
        with self._lock:
            self.misses += 1
            self._insert(key, t)
        return t

    def prefetch(self, layer: int, experts) -> None:
        """Start loading experts of `layer` in the background (no-op without a prefetch thread)."""
        if self._pool is None:
            return
        for e in experts:
            key = (layer, int(e))
            with self._lock:
                if key in self._cache or key in self._inflight:
                    continue
                fut = self._pool.submit(self._prefetch_one, key)
                self._inflight[key] = fut

    def _prefetch_one(self, key):
        t = self._read(key)
        with self._lock:
            self.prefetched += 1
            self._insert(key, t)
            self._inflight.pop(key, None)
        return t

    # ---- placement policy ----------------------------------------------------------------------
    def pin(self, keys) -> None:
        """Pin a hot set: loaded now, never evicted. Must fit the budget with room for one more expert."""
        keys = [tuple(k) for k in keys]
        if self.budget_bytes is not None and (len(keys) + 1) * self.expert_bytes > self.budget_bytes:
            raise LessonkitError(f"hot set of {len(keys)} experts does not fit the budget of {self.budget_bytes} bytes "
                                 "with room for one streamed expert")
        self._pinned = set(keys)
        for l, e in keys:
            self.get(l, e)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._pinned.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def start_prefetch_thread() -> ThreadPoolExecutor:
    """The one prefetch thread, started now (an executor starts it at the first submit, mid-generation): a thread
    the system refuses is one line naming --prefetch here, before any work (errors.ResourceError)."""
    from lessonkit.engine.limits import check_thread_room
    from lessonkit.errors import ResourceError, ran_out_line
    check_thread_room(1, "the --prefetch thread")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
    try:
        pool.submit(int).result()
    except RuntimeError as e:
        pool.shutdown(wait=False)
        line = ran_out_line(e, "the --prefetch thread could not start")
        if line is None:
            raise
        raise ResourceError(line) from None
    return pool
