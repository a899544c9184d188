"""The disk modes of expert streaming (lessonkit.files.disk): a cold disk evicts the expert file from the page
cache (checked with mincore and by watching posix_fadvise), changes no bit of the output, and a bad mode or an
impossible platform is one clear error. No timed assertion: speed is for `bench streaming`."""
import ctypes
import json
import mmap
import os
import shutil
import sys

import pytest
import torch

from lessonkit.engine.engine import Engine
from lessonkit.engine.generate import generate
from lessonkit.errors import LessonkitError
from lessonkit.files import disk as disk_mod
from lessonkit.files.disk import Disk, parse_disk
from lessonkit.measure.break_even import read_seconds
from lessonkit.measure.disk import disk_read_rate, expert_records
from lessonkit.models.registry import resolve_model_dir

LINUX = sys.platform.startswith("linux")


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """A private copy of tiny-moe: no other process warms its expert file's pages."""
    src = resolve_model_dir("tiny-moe")[1]
    dst = tmp_path_factory.mktemp("tiny-moe-cold")
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    return dst


def _resident_pages(path, offset=0, length=None) -> int:
    """Pages of path[offset:offset + length] in the page cache (Linux mincore on a fresh read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, 1, 1, fd, 0)          # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value)
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    length = size - offset if length is None else length
    return sum(b & 1 for b in vec.raw[offset // page:(offset + length + page - 1) // page])


def _on_tmpfs(path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        mounts = [line.split() for line in f]
    best = max((m for m in mounts if str(path).startswith(m[1])), key=lambda m: len(m[1]))
    return best[2] in ("tmpfs", "ramfs")


@pytest.mark.parametrize("text, want", [("cold", Disk("cold")), ("warm", Disk("warm")), (" COLD ", Disk("cold")),
                                        ("simulated:400", Disk("simulated", 400.0)), ("simulated:0.5", Disk("simulated", 0.5))])
def test_disk_modes_parse(text, want):
    assert parse_disk(text) == want and parse_disk(want) is want
    assert parse_disk(str(want)) == want


@pytest.mark.parametrize("bad", ["hot", "", "simulated", "simulated:", "simulated:-1", "simulated:0", "simulated:inf",
                                 "simulated:nan", "cold:400"])
def test_a_bad_disk_mode_is_one_clear_error(bad, tiny_moe):
    with pytest.raises(LessonkitError, match=r"--disk .*warm, cold or simulated:MB/s"):
        parse_disk(bad)
    with pytest.raises(LessonkitError, match="--disk"):
        Engine(tiny_moe, disk=bad)


def test_the_cli_names_the_disk_option(capsys):
    from lessonkit.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "streaming", "--disk", "hot"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --disk: 'hot' is not a disk mode" in err and "Traceback" not in err


@pytest.mark.skipif(not LINUX, reason="mincore through ctypes: Linux")
def test_cold_reads_leave_the_page_cache_empty_of_the_expert_file(tiny_moe):
    path = tiny_moe / "experts.safetensors"
    if _on_tmpfs(path):
        pytest.skip("the temporary folder is on tmpfs: its pages are the file, nothing can be evicted")
    with open(path, "rb") as f:
        f.read()                                           # warm: every page cached
    assert _resident_pages(path) > 0
    eng = Engine(tiny_moe, expert_budget_mb=2, disk="cold")
    assert _resident_pages(path) == 0                      # emptied when the store opened
    eng.store.get(1, 3)
    off, n, *_ = eng.store._entries[(1, 3)]
    assert eng.store.misses == 1 and _resident_pages(path) == 0
    warm = Engine(tiny_moe, expert_budget_mb=2, disk="warm")
    warm.store.get(1, 3)                                   # the negative control: a warm read stays cached
    page = os.sysconf("SC_PAGE_SIZE")
    assert _resident_pages(path, off, n) == (off + n + page - 1) // page - off // page


def test_cold_reads_call_posix_fadvise_on_the_store_fd(tiny_moe, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: calls.append(a), raising=False)
    monkeypatch.setattr(os, "POSIX_FADV_DONTNEED", getattr(os, "POSIX_FADV_DONTNEED", 4), raising=False)
    monkeypatch.setattr(os, "POSIX_FADV_RANDOM", getattr(os, "POSIX_FADV_RANDOM", 1), raising=False)
    eng = Engine(tiny_moe, expert_budget_mb=2, disk="cold")
    fd = eng.store._fd
    assert (fd, 0, 0, os.POSIX_FADV_DONTNEED) in calls and (fd, 0, 0, os.POSIX_FADV_RANDOM) in calls
    calls.clear()
    eng.store.get(2, 5)
    off, n, *_ = eng.store._entries[(2, 5)]
    page = mmap.PAGESIZE                                   # whole pages: the first and last are the neighbours' too
    assert calls == [(fd, off - off % page, -(-(off % page + n) // page) * page, os.POSIX_FADV_DONTNEED)]
    calls.clear()
    Engine(tiny_moe, expert_budget_mb=2, disk="warm").store.get(2, 5)
    assert calls == []


def test_cold_disk_is_refused_where_it_cannot_be_honest(tiny_moe, monkeypatch):
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    monkeypatch.setattr(disk_mod.sys, "platform", "win32")
    possible, why = disk_mod.cold_reads()
    assert not possible and "--disk cold" in why and "win32" in why
    with pytest.raises(LessonkitError, match="--disk cold is not available on win32"):
        Engine(tiny_moe, disk="cold")
    Engine(tiny_moe, disk="warm")                          # the other modes still run


@pytest.mark.parametrize("disk", ["cold", "simulated:100000"])
def test_a_disk_mode_changes_no_bit(tiny_moe, disk):
    one = Engine(tiny_moe).store.expert_bytes / 2**20
    warm = Engine(tiny_moe, expert_budget_mb=2 * one, disk="warm")
    other = Engine(tiny_moe, expert_budget_mb=2 * one, disk=disk)
    prompt = warm.encode("The expert cache keeps the most recently used")
    a, b = warm.forward(prompt, warm.new_cache(64)), other.forward(prompt, other.new_cache(64))
    assert torch.equal(a, b)
    ga, gb = generate(warm, prompt, 12, use_eos=False), generate(other, prompt, 12, use_eos=False)
    assert ga.token_ids == gb.token_ids and other.store.misses == warm.store.misses > 0


def test_disk_read_rate_reads_every_record(tiny_moe):
    path = tiny_moe / "experts.safetensors"
    spans = expert_records(path)
    for mode in ("cold", "warm"):
        r = disk_read_rate(path, mode, repeats=2)
        assert r["disk"] == mode and r["reads"] == 2 * len(spans) == 64 and r["read_mb_s"] > 0
        assert r["bytes_read"] == 2 * sum(n for _, n in spans)


def test_the_cost_model_charges_each_disk_its_own_read():
    inputs = {"page_cache_read_s": 0.001, "read_bytes": 2**20}
    assert read_seconds(inputs, Disk("warm")) == 0.001
    assert read_seconds(inputs, Disk("cold"), read_mb_s=500.0) == 0.001 + 1 / 500
    assert read_seconds(inputs, Disk("simulated", 100.0)) == 1 / 100        # the busy-wait pads the whole miss
    assert read_seconds(inputs, Disk("simulated", 1e6)) == 0.001
    with pytest.raises(ValueError, match="read_mb_s"):
        read_seconds(inputs, Disk("cold"))


@pytest.mark.budget(120, "bench streaming --smoke: two layouts, the disk rate and one speculation cell on a cold disk")
def test_bench_streaming_records_the_disk(capsys):
    from lessonkit.cli import main
    assert main(["bench", "streaming", "--smoke", "--json", "--disk", "cold"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["disk"]["mode"] == "cold" and out["disk"]["read_mb_s"] > 0 and out["disk"]["reads"] > 0
    (cell,) = out["speculation"]
    assert cell["predicted_speedup"] > 0 and cell["measured_speedup"] > 0
    assert all(r["identical_tokens"] for r in out["rows"])


@pytest.mark.skipif(not LINUX, reason="posix_fadvise: Linux")
def test_doctor_says_cold_reads_are_possible_on_linux():
    assert disk_mod.cold_reads() == (True, "posix_fadvise(POSIX_FADV_DONTNEED) after every read")
