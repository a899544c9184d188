"""Windows I/O (issue 42, item 3): each fallback of lessonkit.files.portable_io and safe_files gives what
the POSIX path gives, and every text file lessonkit opens names its encoding (a static check here; the
command line under EncodingWarning-as-error is in tests/test_windows_pieces.py)."""
import ast
import errno
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from lessonkit.files import portable_io, safe_files
from lessonkit.files.atomic import pid_alive
from lessonkit.files.portable_io import read_at, touch_nofollow

ROOT = Path(__file__).resolve().parents[1]


# ---- read_at: preadv, pread and seek+read give the same bytes -------------------------------------------
def _without(monkeypatch, *names):
    for n in names:
        monkeypatch.delattr(os, n, raising=False)


PATHS = {"preadv": (), "pread": ("preadv",), "seek": ("preadv", "pread")}


@pytest.mark.parametrize("path", PATHS)
def test_read_at_gives_the_same_bytes_on_every_path(path, tmp_path, monkeypatch):
    data = np.random.default_rng(0).integers(0, 256, 3 * 65536 + 17, dtype=np.uint8).tobytes()
    f = tmp_path / "blob.bin"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY | portable_io.BINARY)
    try:
        _without(monkeypatch, *PATHS[path])
        assert hasattr(os, "preadv") == (path == "preadv")
        for off, n in [(0, 10), (5, 65536 * 2), (len(data) - 100, 100), (123457, 70001)]:
            buf = np.empty(n, dtype=np.uint8)
            assert read_at(fd, buf, off) == n
            assert buf.tobytes() == data[off:off + n]
        tail = np.zeros(50, dtype=np.uint8)                  # runs past the end: a short read, counted
        assert read_at(fd, tail, len(data) - 20) == 20
        assert tail[:20].tobytes() == data[-20:]
        assert read_at(fd, np.empty(8, dtype=np.uint8), len(data) + 5) == 0
    finally:
        os.close(fd)


def test_expert_store_reads_identical_experts_without_preadv(monkeypatch):
    from lessonkit.models.registry import load_model
    store = load_model("tiny-moe").store
    keys = sorted(store._entries)[:: max(1, len(store._entries) // 12)]
    want = [store._read(k) for k in keys]
    _without(monkeypatch, "preadv", "pread")
    got = [store._read(k) for k in keys]
    for a, b in zip(want, got):
        for wa, wb in ((a.gate_up_t, b.gate_up_t), (a.down_t, b.down_t)):
            assert wa.data.dtype == wb.data.dtype and torch.equal(wa.data, wb.data)


# ---- locks ---------------------------------------------------------------------------------------------
def test_flock_shared_locks_coexist_and_exclusive_excludes(tmp_path):
    lock = tmp_path / ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | portable_io.BINARY)
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); print('shared ok')\n"
             "except BlockingIOError:\n    print('blocked')")
    try:
        portable_io.lock(fd, shared=True)
        assert subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True,
                              encoding="utf-8").stdout.strip() == "shared ok"
        portable_io.unlock(fd)
        portable_io.lock(fd, shared=False)
        assert subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True,
                              encoding="utf-8").stdout.strip() == "blocked"
        portable_io.unlock(fd)
    finally:
        os.close(fd)


def test_msvcrt_lock_is_exclusive_at_offset_zero_and_waits_past_lk_lock_giving_up(tmp_path, monkeypatch):
    """Without fcntl: msvcrt.locking from byte 0 (the position is reset first), a shared request taken as
    exclusive, and LK_LOCK's OSError after its 10 tries means wait on, not fail."""
    calls, fails = [], [2]

    def locking(fd, mode, n):
        calls.append((os.lseek(fd, 0, os.SEEK_CUR), mode, n))
        if mode == 1 and fails[0]:
            fails[0] -= 1
            raise OSError(errno.EDEADLK, "Resource deadlock avoided")
    fake = types.SimpleNamespace(LK_UNLCK=0, LK_LOCK=1, LK_NBLCK=2, locking=locking)
    monkeypatch.setattr(portable_io, "fcntl", None)
    monkeypatch.setattr(portable_io, "msvcrt", fake, raising=False)
    monkeypatch.setattr(portable_io.time, "sleep", lambda s: None)
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT | portable_io.BINARY)
    try:
        os.write(fd, b"xyz")                                  # the position is not 0 before locking
        portable_io.lock(fd, shared=True)
        os.lseek(fd, 2, os.SEEK_SET)
        portable_io.unlock(fd)
    finally:
        os.close(fd)
    assert calls == [(0, 1, 1)] * 3 + [(0, 0, 1)]


def test_prefix_cache_imports_without_fcntl():
    """The module-level `import fcntl` took down every module that imports the prefix cache on Windows."""
    code = ("import builtins, sys\nreal = builtins.__import__\n"
            "def imp(name, g=None, *a, **k):\n    mine = (g or {}).get('__name__', '').startswith('lessonkit')\n"
            "    if mine and name == 'fcntl': raise ModuleNotFoundError(name)\n"
            "    if mine and name == 'msvcrt': return type(sys)('msvcrt')\n    return real(name, g, *a, **k)\n"
            "builtins.__import__ = imp\nsys.modules.pop('fcntl', None)\n"
            "import lessonkit.prefix_cache.cache, lessonkit.files.portable_io as p\n"
            "assert p.fcntl is None\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, encoding="utf-8", cwd=ROOT)
    assert r.stdout.strip() == "ok", r.stderr[-2000:]


# ---- touch without following a symlink -----------------------------------------------------------------
def _no_follow_symlinks_utime(monkeypatch):
    real = os.utime

    def utime(path, times=None, *, follow_symlinks=True, **kw):
        if not follow_symlinks:
            raise NotImplementedError("utime: follow_symlinks unavailable on this platform")
        return real(path, times, **kw)
    monkeypatch.setattr(os, "utime", utime)           # a new function: not in os.supports_follow_symlinks
    assert os.utime not in os.supports_follow_symlinks


@pytest.mark.parametrize("supported", [True, False], ids=["follow_symlinks", "lstat"])
def test_touch_nofollow_touches_files_never_a_symlinks_target(supported, tmp_path, monkeypatch):
    if not supported:
        _no_follow_symlinks_utime(monkeypatch)
    f, target, link = tmp_path / "f", tmp_path / "target", tmp_path / "link"
    for p in (f, target):
        p.write_bytes(b"x")
        os.utime(p, (1_000_000_000, 1_000_000_000))
    link.symlink_to(target)
    touch_nofollow(f)
    assert f.stat().st_mtime > 1_000_000_000
    if supported:
        touch_nofollow(link)                          # the link's own times, never the target's
    else:
        with pytest.raises(OSError, match="symlink"):
            touch_nofollow(link)
    assert target.stat().st_mtime == 1_000_000_000


# ---- O_NOFOLLOW forced to 0 ----------------------------------------------------------------------------
@pytest.mark.parametrize("nofollow", ["O_NOFOLLOW", "0"])
def test_open_nofollow_refuses_a_symlink(nofollow, tmp_path, monkeypatch):
    if nofollow == "0":
        monkeypatch.setattr(safe_files, "NOFOLLOW", 0)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "dangling").symlink_to(outside / "victim.lock")
    (tmp_path / "existing").symlink_to(outside / "present")
    (outside / "present").write_bytes(b"")
    for name in ("dangling", "existing"):
        with pytest.raises(OSError) as e:
            safe_files.open_nofollow(tmp_path / name, os.O_RDWR | os.O_CREAT)
        assert e.value.errno == errno.ELOOP
    assert not (outside / "victim.lock").exists()
    fd = safe_files.open_nofollow(tmp_path / "new.lock", os.O_RDWR | os.O_CREAT)   # created here: fine
    os.close(fd)
    fd = safe_files.open_nofollow(tmp_path / "new.lock", os.O_RDONLY)
    os.close(fd)


def test_open_nofollow_without_o_nofollow_refuses_a_file_swapped_while_opening(tmp_path, monkeypatch):
    """lstat saw one file, the open got another (a symlink swapped in between): refused, fd closed."""
    monkeypatch.setattr(safe_files, "NOFOLLOW", 0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    seen_b = os.lstat(b)
    monkeypatch.setattr(safe_files, "_lstat_or_none", lambda p: seen_b)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(real_open(*a, **k)) or opened[-1])
    with pytest.raises(OSError) as e:
        safe_files.open_nofollow(a, os.O_RDONLY)
    assert e.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        os.fstat(opened[0])                            # closed


def test_prefix_cache_with_a_symlinked_lock_is_read_only_when_o_nofollow_is_0(tmp_path, monkeypatch):
    from lessonkit.prefix_cache.cache import PrefixCache
    from lessonkit.prefix_cache.faults import PrefixCacheWarning
    monkeypatch.setattr(safe_files, "NOFOLLOW", 0)
    d, outside = tmp_path / "cache", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    (d / ".lock").symlink_to(outside / "victim.lock")
    with pytest.warns(PrefixCacheWarning, match=r"\.lock is a symlink, not followed"):
        pc = PrefixCache(d, fingerprint="f" * 64)
    assert pc.read_only and not (outside / "victim.lock").exists()


# ---- liveness probe ------------------------------------------------------------------------------------
def test_pid_alive_without_signalling(monkeypatch):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    real_kill = os.kill

    def kill(pid, sig):                    # psutil itself probes with os.kill on POSIX; lessonkit must not
        assert not sys._getframe(1).f_globals["__name__"].startswith("lessonkit"), "os.kill is no probe on Windows"
        return real_kill(pid, sig)
    monkeypatch.setattr(os, "kill", kill)
    assert pid_alive(os.getpid())
    assert not pid_alive(p.pid)


# ---- every text file names its encoding (static) -------------------------------------------------------
def _const(node):
    return node.value if isinstance(node, ast.Constant) else None


def _kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _text_mode(mode) -> bool:
    m = _const(mode)
    return not (isinstance(m, str) and "b" in m)


def unnamed_encodings(src: str) -> list[tuple[int, str]]:
    """(line, what) of each call that opens a text file without encoding=, and each os.open without BINARY."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        named = _kw(node, "encoding") is not None
        if name == "open" and owner == "os":
            if len(node.args) < 2 or "BINARY" not in ast.unparse(node.args[1]):
                out.append((node.lineno, "os.open without BINARY (Windows opens descriptors in text mode)"))
        elif name in ("open", "fdopen") and owner not in ("tarfile", "zipfile", "gzip", "bz2", "lzma", "Image"):
            mode = node.args[1] if len(node.args) > 1 else _kw(node, "mode")
            if (mode is None or _text_mode(mode)) and not named and len(node.args) < 4:
                out.append((node.lineno, f"{name}() in text mode"))
        elif name == "read_text" and not node.args and not named:
            out.append((node.lineno, "read_text()"))
        elif name == "write_text" and len(node.args) < 2 and not named:
            out.append((node.lineno, "write_text()"))
        elif name in ("NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
            mode = node.args[0] if node.args else _kw(node, "mode")
            if mode is not None and _text_mode(mode) and not named:
                out.append((node.lineno, f"tempfile.{name} in text mode"))
        elif owner == "subprocess" and name in ("run", "Popen", "check_output", "check_call", "call"):
            text = any(k.arg in ("text", "universal_newlines") and _const(k.value) is not False for k in node.keywords)
            if text and not named:
                out.append((node.lineno, f"subprocess.{name}(text=True)"))
    return out


def test_the_static_check_finds_what_it_looks_for():
    bad = ('open(p)\nopen(p, "w")\nPath(p).read_text()\np.write_text(s)\nos.open(p, os.O_RDONLY)\n'
           'subprocess.run(c, text=True)\ntempfile.NamedTemporaryFile("w")\nos.fdopen(fd, "r")\n')
    assert [line for line, _ in unnamed_encodings(bad)] == list(range(1, 9))
    good = ('open(p, "rb")\nopen(p, encoding="utf-8")\np.read_text("utf-8")\np.write_text(s, encoding="utf-8")\n'
            'os.open(p, os.O_RDONLY | BINARY)\nsubprocess.run(c, text=True, encoding="utf-8")\n'
            'tempfile.NamedTemporaryFile()\nsubprocess.run(c)\ntarfile.open(p)\n')
    assert unnamed_encodings(good) == []


def test_every_text_file_lessonkit_opens_names_its_encoding():
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in sorted((ROOT / "lessonkit").rglob("*.py"))
             for line, what in unnamed_encodings(p.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def _notebook_code(nb: Path) -> list[tuple[int, str]]:
    """(cell index, source) of each code cell, IPython's % and ! lines made `pass` (same indentation)."""
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    out = []
    for i, c in enumerate(cells):
        if c["cell_type"] == "code":
            lines = "".join(c["source"]).splitlines()
            out.append((i, "\n".join(l[:len(l) - len(l.lstrip())] + "pass" if l.lstrip().startswith(("%", "!")) else l
                                     for l in lines)))
    return out


def test_every_text_file_the_notebooks_open_names_its_encoding():
    """A notebook cell runs on the student's Windows too (lesson 03 read the corpus tokenizer as cp1252)."""
    found = [f"{nb.relative_to(ROOT)} cell {i} line {line}: {what}"
             for nb in sorted((ROOT / "notebooks").rglob("*.ipynb")) for i, src in _notebook_code(nb)
             for line, what in unnamed_encodings(src)]
    assert not found, "\n".join(found)
