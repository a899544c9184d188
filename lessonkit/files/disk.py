"""Where a streamed expert's bytes come from: the disk mode of a run (`--disk`).

* warm: plain reads; a file read before comes from the page cache at memory speed.
* cold: the page cache is kept empty of the file, so every read reaches the disk. Linux:
  `posix_fadvise(POSIX_FADV_DONTNEED)` on the whole file when it opens (after writing back any dirty
  page: a dirty page cannot be dropped), `POSIX_FADV_RANDOM` (no readahead of the neighbours), and
  DONTNEED on the pages of each record after its read (whole pages: a record's first and last page are
  shared with its neighbours). macOS: `fcntl(F_NOCACHE)` on the descriptor (reads
  bypass the unified buffer cache; pages cached by another process before may still be served).
  Windows: refused. FILE_FLAG_NO_BUFFERING needs sector-aligned offsets, sizes and buffers, and the
  records are not aligned; reading a wider aligned span would measure other bytes.
  No root is needed anywhere.
* simulated:MB/s: a slower disk than yours. A warm read, then a busy-wait until the miss has taken
  bytes / rate seconds.

A mode changes where bytes come from and how long they take, never which bytes arrive.
"""
from __future__ import annotations

import mmap
import os
import sys
import time
from typing import NamedTuple

from lessonkit.errors import LessonkitError

MB = 2**20                                 # MB/s here means 2^20 bytes a second, as the expert budget's MB
F_NOCACHE = 48                             # macOS <sys/fcntl.h>; Python's fcntl names it only on some builds
PAGE = mmap.PAGESIZE
USAGE = "warm, cold or simulated:MB/s (e.g. simulated:400)"


class Disk(NamedTuple):
    """A disk mode: "warm", "cold" or "simulated" (then mb_s, the simulated rate in MB/s)."""
    mode: str
    mb_s: float | None = None

    def __str__(self) -> str:
        return f"simulated:{self.mb_s:g}" if self.mode == "simulated" else self.mode


WARM, COLD = Disk("warm"), Disk("cold")


def parse_disk(value) -> Disk:
    """A Disk from its text ("warm", "cold", "simulated:400") or a Disk; anything else raises LessonkitError
    naming --disk and the value."""
    if isinstance(value, Disk):
        return value
    text = str(value).strip().lower()
    if text in ("warm", "cold"):
        return Disk(text)
    head, _, rate = text.partition(":")
    if head == "simulated":
        try:
            mb_s = float(rate)
        except ValueError:
            mb_s = float("nan")
        if mb_s > 0 and mb_s != float("inf"):
            return Disk("simulated", mb_s)
    raise LessonkitError(f"--disk {value!r}: use {USAGE}")


def cold_reads() -> tuple[bool, str]:
    """(possible here, how): whether --disk cold can evict this platform's page cache, and with what."""
    if hasattr(os, "posix_fadvise"):
        return True, "posix_fadvise(POSIX_FADV_DONTNEED) after every read"
    if sys.platform == "darwin":
        return True, "fcntl(F_NOCACHE) on the expert file"
    return False, (f"--disk cold is not available on {sys.platform}: FILE_FLAG_NO_BUFFERING needs sector-aligned "
                   "reads and expert records are not aligned; use --disk warm or --disk simulated:MB/s")


def open_cold(fd: int) -> None:
    """Empty the page cache of this file and keep it empty for reads through fd (see the module's notes)."""
    possible, why = cold_reads()
    if not possible:
        raise LessonkitError(why)
    if hasattr(os, "posix_fadvise"):
        try:
            os.fsync(fd)                   # dirty pages (a file just written) are not dropped
        except OSError:
            pass                           # nothing to write back on a read-only file system
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return
    import fcntl
    fcntl.fcntl(fd, getattr(fcntl, "F_NOCACHE", F_NOCACHE), 1)


def after_read(disk: Disk, fd: int, offset: int, length: int, started: float) -> None:
    """What the disk mode does once length bytes at offset were read (started: perf_counter at the read):
    cold drops them from the page cache, simulated waits out length / rate since started."""
    if disk.mode == "cold" and hasattr(os, "posix_fadvise"):
        start = offset - offset % PAGE             # the kernel drops whole pages only: widen to the pages touched
        os.posix_fadvise(fd, start, -(-(offset + length - start) // PAGE) * PAGE, os.POSIX_FADV_DONTNEED)
    elif disk.mode == "simulated":
        end = started + length / (disk.mb_s * MB)
        while time.perf_counter() < end:   # busy-wait: sleep() granularity is too coarse here
            pass
