"""Windows' missing pieces, reproduced on Linux (tests/test_windows_pieces.py puts this folder on
PYTHONPATH, so every Python it starts loads it, the notebooks' kernels included).

What Windows lacks or does differently, as lessonkit's code meets it:
* `import fcntl` raises ImportError; `import msvcrt` gives a stand-in whose `locking` has msvcrt's
  semantics (exclusive only, LK_LOCK gives up with OSError after 10 tries a second apart), built on
  flock so that it still excludes other processes here;
* no `os.preadv`, no `os.pread`;
* `os.kill(pid, 0)` is no liveness probe (on Windows signal 0 is CTRL_C_EVENT): here it raises;
* `os.utime(..., follow_symlinks=False)` raises NotImplementedError, and `os.utime` is not in
  `os.supports_follow_symlinks`;
* `os.O_NOFOLLOW` is 0;
* the default text encoding is not UTF-8: the test starts Python with `-X utf8=0`, LC_ALL=C and
  PYTHONCOERCECLOCALE=0, so a text file opened without `encoding=` is ASCII (cp1252 on Windows: both
  fail on SmolLM2's U+0100). With PYTHONWARNDEFAULTENCODING=1 a text open without `encoding=` in
  lessonkit's modules is also an error (EncodingWarning), whatever it reads.

The import, kill and utime changes apply to lessonkit's own modules (the caller's module name starts
with "lessonkit"): third-party libraries take their POSIX branches on Linux (psutil itself probes with
os.kill(pid, 0)) and their Windows branches on Windows, so only lessonkit's code is under test.
When WINDOWS_PIECES_LOG names a folder, each process writes <pid>.json there at exit: which pieces
lessonkit's code met (msvcrt locks taken, positioned reads done by seek, ...), so the test can tell
that the stand-ins were reached.
"""
import atexit
import builtins
import errno
import fcntl as _fcntl
import json
import os
import sys
import time
import types
import warnings

_met = {"msvcrt_locks": 0, "msvcrt_unlocks": 0, "seek_reads": 0, "utime_plain": 0, "fcntl_refused": 0}


def _from_lessonkit(depth: int = 2) -> bool:
    try:
        return sys._getframe(depth).f_globals.get("__name__", "").startswith("lessonkit")
    except ValueError:
        return False


warnings.filterwarnings("error", category=EncodingWarning, module="lessonkit")


# ---- msvcrt ------------------------------------------------------------------------------------------
def _locking(fd: int, mode: int, nbytes: int) -> None:
    if mode == _msvcrt.LK_UNLCK:
        _fcntl.flock(fd, _fcntl.LOCK_UN)
        _met["msvcrt_unlocks"] += 1
        return
    tries = 10 if mode in (_msvcrt.LK_LOCK, _msvcrt.LK_RLCK) else 1
    for i in range(tries):
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)     # msvcrt: every lock is exclusive
            _met["msvcrt_locks"] += 1
            return
        except BlockingIOError:
            if i + 1 < tries:
                time.sleep(1.0)
    raise OSError(errno.EDEADLK, "Resource deadlock avoided")


_msvcrt = types.ModuleType("msvcrt", "stand-in for Windows' msvcrt (locking only)")
_msvcrt.LK_UNLCK, _msvcrt.LK_LOCK, _msvcrt.LK_NBLCK, _msvcrt.LK_RLCK, _msvcrt.LK_NBRLCK = 0, 1, 2, 3, 4
_msvcrt.locking = _locking

# ---- imports -----------------------------------------------------------------------------------------
_real_import = builtins.__import__


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and globals and str(globals.get("__name__", "")).startswith("lessonkit"):
        if name == "fcntl":
            _met["fcntl_refused"] += 1
            raise ModuleNotFoundError("No module named 'fcntl' (Windows, reproduced)", name="fcntl")
        if name == "msvcrt":
            return _msvcrt
    return _real_import(name, globals, locals, fromlist, level)


builtins.__import__ = _import

# ---- os ----------------------------------------------------------------------------------------------
for _name in ("preadv", "pread"):
    if hasattr(os, _name):
        delattr(os, _name)
os.O_NOFOLLOW = 0

_real_kill, _real_utime, _real_lseek = os.kill, os.utime, os.lseek


def _kill(pid, sig):
    if sig == 0 and _from_lessonkit():
        raise RuntimeError("os.kill(pid, 0) on Windows sends CTRL_C_EVENT; it is no liveness probe")
    return _real_kill(pid, sig)


def _utime(path, times=None, *, ns=None, dir_fd=None, follow_symlinks=True):
    if not follow_symlinks:
        raise NotImplementedError("utime: follow_symlinks unavailable on this platform")
    if _from_lessonkit():
        _met["utime_plain"] += 1
    kw = {"ns": ns} if ns is not None else {}
    return _real_utime(path, times, dir_fd=dir_fd, **kw)


def _lseek(fd, pos, how):
    caller = sys._getframe(1)
    if caller.f_globals.get("__name__") == "lessonkit.files.portable_io" and caller.f_code.co_name == "read_at":
        _met["seek_reads"] += 1
    return _real_lseek(fd, pos, how)


os.kill, os.utime, os.lseek = _kill, _utime, _lseek        # os.utime is no longer in os.supports_follow_symlinks

# ---- what was met ------------------------------------------------------------------------------------
_log = os.environ.get("WINDOWS_PIECES_LOG")
if _log:
    def _write_log():
        try:
            with open(os.path.join(_log, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
                json.dump({"argv": sys.argv[:3], **_met}, f)
        except OSError:
            pass
    atexit.register(_write_log)
