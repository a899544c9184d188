"""File I/O that means the same on Linux, macOS and Windows: locks, positioned reads, touches.

* `lock(fd, shared)` / `unlock(fd)`: `fcntl.flock` where it exists (Linux, macOS), else
  `msvcrt.locking` on Windows. flock has shared (readers) and exclusive (one writer) locks; msvcrt has
  only exclusive byte-range locks, so on Windows a shared lock is taken as an exclusive one: readers of
  a prefix cache wait for each other as well as for the writer. Nothing changes but waiting: every
  holder still sees the index whole. Both lock the whole file against other open files (flock) or
  other handles (msvcrt), never recursively: a process that locks twice through two descriptors waits
  for itself on both, so callers never nest.
* `read_at(fd, buf, offset)`: fill buf from the file at offset, like `os.preadv(fd, [buf], offset)`;
  returns the bytes read (fewer only at end of file). `os.preadv` where present, `os.pread` next, else
  (Windows) `lseek` + `readinto` under one lock, since the file position is shared by threads.
* `BINARY`: `os.O_BINARY` on Windows (0 elsewhere). Every `os.open` of the workbook passes it: without
  it Windows opens a descriptor in text mode, which turns CR LF into LF and stops reading at byte 0x1A.
* `touch_nofollow(path)`: set a file's times to now, never through a symlink: `os.utime(...,
  follow_symlinks=False)` where the platform supports it (Windows raises NotImplementedError), else
  refuse a symlink (`lstat`) and utime the file.
"""
from __future__ import annotations

import os
import stat
import threading
import time

try:                                       # POSIX: flock
    import fcntl
except ImportError:                        # Windows: no fcntl; msvcrt byte-range locks instead
    fcntl = None
    import msvcrt

BINARY = getattr(os, "O_BINARY", 0)

_MSVCRT_SPAN = 1                           # bytes locked at offset 0 (past the end of an empty file is allowed)
_seek_lock = threading.Lock()              # the fallback's seek and read are one step for all threads


def lock(fd: int, shared: bool = False) -> None:
    """Block until this descriptor holds the file's lock: shared (several readers) or exclusive.
    On Windows every lock is exclusive (msvcrt has no shared lock)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        return
    while True:                            # LK_LOCK retries for ~10 s, then raises: keep waiting
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK, _MSVCRT_SPAN)
            return
        except OSError:
            time.sleep(0.05)


def unlock(fd: int) -> None:
    """Release the lock taken by lock(fd)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
    os.lseek(fd, 0, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_UNLCK, _MSVCRT_SPAN)


def read_at(fd: int, buf, offset: int) -> int:
    """Read len(buf) bytes at offset into buf (a writable buffer: a numpy array, a bytearray); returns
    how many were read, fewer than len(buf) only when the file ends first. Same bytes on every path."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    view = memoryview(buf).cast("B")
    if hasattr(os, "pread"):
        return _fill(view, lambda n, done: os.pread(fd, n, offset + done))
    with _seek_lock:
        os.lseek(fd, offset, os.SEEK_SET)
        return _fill(view, lambda n, done: os.read(fd, n))


def _fill(view: memoryview, read) -> int:
    """Copy read(n, done) chunks into view until it is full or a read returns nothing (end of file)."""
    done = 0
    while done < len(view):
        chunk = read(len(view) - done, done)
        if not chunk:
            break
        view[done:done + len(chunk)] = chunk
        done += len(chunk)
    return done


def touch_nofollow(path) -> None:
    """Set path's access and modification times to now, never those of a symlink's target: a symlink
    raises OSError (it is not touched). Other errors (a vanished file) raise OSError as os.utime does."""
    if os.utime in os.supports_follow_symlinks:
        os.utime(path, follow_symlinks=False)
        return
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise OSError(f"{path}: is a symlink; not touched")
    os.utime(path)
