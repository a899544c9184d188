"""The disk's read rate, measured on the model's own expert file: every record read once a repeat, in a
shuffled order (misses come in routing order, not file order), each through the disk mode's read
(lessonkit.files.disk: cold drops the record from the page cache after reading it, so the next repeat reads
it from the disk again). The rate feeds the cost model of lesson 1's break-even and `bench streaming`."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from lessonkit.engine.expert_store import read_safetensors_header
from lessonkit.errors import LessonkitError
from lessonkit.files.disk import MB, WARM, Disk, after_read, open_cold, parse_disk
from lessonkit.files.portable_io import BINARY, read_at


def expert_records(path: Path) -> list[tuple[int, int]]:
    """(file offset, bytes) of every tensor record of a safetensors file, in file order."""
    header, start = read_safetensors_header(path)
    return sorted((start + int(h["data_offsets"][0]), int(h["data_offsets"][1]) - int(h["data_offsets"][0]))
                  for h in header.values())


def disk_read_rate(path: str | Path, disk: Disk | str, *, repeats: int = 1, seed: int = 0) -> dict:
    """MB/s (2^20 bytes) of reads of `path`'s records under `disk` (a warm disk is read once first), with the
    median read and the bytes read."""
    path, disk = Path(path), parse_disk(disk)
    spans = expert_records(path)
    order = np.random.default_rng(seed)
    fd = os.open(path, os.O_RDONLY | BINARY)
    try:
        if disk.mode == "cold":
            open_cold(fd)
        elif disk.mode == "warm":
            _read_all(fd, spans, WARM, path)
        times = [_read_all(fd, [spans[i] for i in order.permutation(len(spans))], disk, path) for _ in range(repeats)]
    finally:
        os.close(fd)
    per_read = [t for ts in times for t in ts]
    nbytes = repeats * sum(n for _, n in spans)
    return {"disk": str(disk), "file": str(path), "read_mb_s": nbytes / sum(per_read) / MB,
            "read_ms_median": statistics.median(per_read) * 1e3, "reads": len(per_read), "bytes_read": nbytes}


def warm_up(path: str | Path) -> None:
    """Read every record of `path` once: the page cache then holds the file (a cold run before emptied it)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | BINARY)
    try:
        _read_all(fd, expert_records(path), WARM, path)
    finally:
        os.close(fd)


def _read_all(fd: int, spans, disk: Disk, path: Path) -> list[float]:
    """Seconds of each span's read through the disk mode."""
    out = []
    for off, n in spans:
        buf = np.empty(n, dtype=np.uint8)
        t0 = time.perf_counter()
        if read_at(fd, buf, off) != n:
            raise LessonkitError(f"{path}: short read of {n} bytes at {off}: file truncated?")
        after_read(disk, fd, off, n, t0)
        out.append(time.perf_counter() - t0)
    return out
