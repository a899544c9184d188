"""Crash-safe writes: a reader sees the old file or the whole new one, never a part of it.

The bytes go to a temporary file in the same directory, which is fsynced, renamed over its final
name (os.replace, atomic on POSIX) and the directory fsynced, so the rename itself survives a crash.
Temporary files are named `.tmp-<pid>-<random>.part`, so a later process can tell a dead writer's
leftovers (its pid is gone: a SIGKILL gives no chance to clean up) from a live writer's, and remove them
(`remove_dead_temps`, which every writer of a folder calls before it writes there).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

from lessonkit.files.portable_io import BINARY

TMP_PREFIX = ".tmp-"
CHUNK = 1 << 20                    # write in 1 MiB chunks
DEAD_AFTER_S = 86400               # a temporary file this old is a dead writer's, whatever its pid (pids are reused)


def temp_path(directory: str | Path) -> Path:
    return Path(directory) / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}.part"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (psutil: on Windows `os.kill(pid, 0)` is no probe, it
    sends CTRL_C_EVENT)."""
    return psutil.pid_exists(pid)


def is_dead_temp(path: Path) -> bool:
    """Whether `path` (a `.tmp-<pid>-*.part`) was left by a writer that died: its pid is gone or the file is
    older than DEAD_AFTER_S."""
    try:
        pid = int(path.name[len(TMP_PREFIX):].split("-")[0])
        return not pid_alive(pid) or time.time() - path.stat().st_mtime > DEAD_AFTER_S
    except (ValueError, OSError):
        return True


def remove_dead_temps(directory: str | Path) -> list[Path]:
    """Remove the temporary files dead writers left in `directory`; returns them. A live writer's are kept."""
    removed = []
    for p in Path(directory).glob(f"{TMP_PREFIX}*.part"):
        if is_dead_temp(p):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


def write_all(fd: int, data) -> None:
    """Write every byte (in chunks); the single place a test patches to simulate a full disk."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:CHUNK])
        view = view[n:]


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (a directory's fsync makes a rename inside it durable)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | BINARY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_temp(directory: str | Path, data, *, fsync: bool = True) -> Path:
    """Write data to a new temporary file in directory (fsynced); removes it on any error."""
    tmp = temp_path(directory)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | BINARY, 0o644)
    try:
        write_all(fd, data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def replace(tmp: str | Path, path: str | Path, *, fsync: bool = True) -> None:
    """Rename tmp over path (a file or a directory) and make the rename durable."""
    os.replace(tmp, path)
    if fsync:
        fsync_path(Path(path).parent)


def atomic_write(path: str | Path, data: bytes | Callable[[Path], None], *, fsync: bool = True) -> Path:
    """Write `path` crash-safely. data: the bytes, or a function that writes the file at a given
    temporary path (safetensors' save_file, torch.save, ...)."""
    path = Path(path)
    if callable(data):
        tmp = temp_path(path.parent)
        try:
            data(tmp)
            if fsync:
                fsync_path(tmp)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    else:
        tmp = write_temp(path.parent, data, fsync=fsync)
    try:
        replace(tmp, path, fsync=fsync)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)             # only still there if the rename did not happen
    return path


@contextlib.contextmanager
def publish_dir(out: str | Path, prefix: str = ".build-"):
    """Build a directory in a temporary sibling (yielded), then rename it to `out` in one step.
    If another process published `out` first, theirs is kept; the temporary one is always removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=prefix))
    try:
        yield tmp
        with contextlib.suppress(OSError):     # another process finished first
            replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
