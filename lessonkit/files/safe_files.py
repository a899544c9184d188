"""Reading and writing the workbook's own files without surprises (issue 35, rule 2).

* A file the workbook reads must be a regular file: a FIFO would block forever, a directory or a
  device is refused naming the path. JSON is read as strict UTF-8, and nesting deeper than Python's
  recursion allows is one clear error, never a RecursionError.
* A file the workbook writes inside one of its directories never follows a symlink out of it:
  `leads_outside` is checked before touching, and files are opened with `open_nofollow`: O_NOFOLLOW
  where the platform has it; where it is 0 (Windows) the same refusal another way, `lstat` before the
  open (a symlink is refused) and `fstat` after it (the file opened must be the one looked at: same
  st_dev and st_ino), so a symlink swapped in between is refused too.
* A user's output (`--out`) that already exists is kept unless --force (`refuse_overwrite`).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

from lessonkit.errors import LessonkitError
from lessonkit.files.portable_io import BINARY

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)      # os.open flag: fail (ELOOP) rather than follow a final symlink


def open_nofollow(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open(path, flags) that never opens through a final symlink: OSError(ELOOP) instead, as
    O_NOFOLLOW gives. Where NOFOLLOW is 0: refuse a symlink seen by lstat before the open, and a file
    whose fstat after the open differs (st_dev, st_ino) from what lstat saw (swapped meanwhile)."""
    if NOFOLLOW:
        return os.open(path, flags | NOFOLLOW | BINARY, mode)
    before = _lstat_or_none(path)
    if before is not None and stat.S_ISLNK(before.st_mode):
        raise OSError(errno.ELOOP, "is a symlink, not followed", str(path))
    fd = os.open(path, flags | BINARY, mode)
    try:
        opened = os.fstat(fd)
        seen = before if before is not None else _lstat_or_none(path)   # created now: the name must be it
        if seen is None or stat.S_ISLNK(seen.st_mode) or (seen.st_dev, seen.st_ino) != (opened.st_dev, opened.st_ino):
            raise OSError(errno.ELOOP, "changed or became a symlink while being opened, not followed", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lstat_or_none(path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def special_file(path: str | Path) -> str | None:
    """What path is when it exists but is not a regular file (following symlinks): 'a FIFO', 'a
    directory', ...; None for a regular file or a missing path."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def require_regular(path: str | Path) -> Path:
    """path, or one LessonkitError naming it when it exists but is not a regular file (never block on a FIFO)."""
    what = special_file(path)
    if what is not None:
        raise LessonkitError(f"{path}: is {what}, not a regular file; refusing to read it")
    return Path(path)


def load_json_file(path: str | Path, what: str = "JSON file"):
    """The JSON value in path; one LessonkitError naming the file when it is missing, not a regular
    file, not UTF-8, not JSON or nested too deeply (json.loads(path.read_text()), with every failure named)."""
    path = require_regular(path)
    try:
        text = path.read_bytes().decode("utf-8")
        return json.loads(text)
    except FileNotFoundError:
        raise LessonkitError(f"{path}: no such file") from None
    except OSError as e:
        raise LessonkitError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise LessonkitError(f"{path}: not a {what} (invalid UTF-8 at byte {e.start})") from None
    except RecursionError:
        raise LessonkitError(f"{path}: not a {what} (nests too deeply to read)") from None
    except ValueError as e:
        raise LessonkitError(f"{path}: not a {what} ({e})") from None


def leads_outside(path: str | Path, root: str | Path) -> bool:
    """True when path (following every symlink on the way, itself included) resolves outside root,
    or cannot be resolved. A path that does not exist yet is judged by where its parent leads."""
    try:
        return not Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):
        return True


def refuse_overwrite(out: str | Path, force: bool) -> None:
    """A user's --out that already exists (a file, or a directory holding anything) is kept: one
    LessonkitError naming it unless force. The commands' own default outputs are not checked."""
    p = Path(out)
    if force or not (p.exists() or p.is_symlink()):
        return
    if p.is_dir() and not any(p.iterdir()):
        return
    raise LessonkitError(f"{p}: already exists{' and is not empty' if p.is_dir() else ''}; "
                         f"use --force to write over it")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()
