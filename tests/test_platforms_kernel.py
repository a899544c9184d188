"""The kernel's shipped binaries on the platforms CI cannot run: the same output bits everywhere.

csrc/kernel_check.c (a small C driver) loads a shipped library, runs fixed pseudo-random products through
matmul (M = 1..16 and 40 rows, shapes with n not a multiple of 16), qmatmul (Q4_1, Q8_0), dequantise,
rk_forward (a 2-layer dense Llama built in C with float32, Q4_1 and Q8_0 products, and a 2-layer
OLMoE-style mixture of 4 experts, top 2, with q/k norm and clipping: 9 tokens decoded one by one, as one
prefill, in chunks and as decode + verify block), rk_exp_many and 2 million fma triples, and
prints a hash of the output bits per test. It runs here natively on x86_64 (AVX2 and portable paths, 1 and 3
threads), built with zig for linux-aarch64 under qemu-aarch64 (NEON) and for windows-x86_64 under wine64; the
hashes must be equal, and inside every run the forward's decode, prefill, chunks and verify must be equal.
Its stress mode switches the thread pool between 1, 2, 3 and 8 threads between calls, with two callers at
once, on each platform (tests/test_kernel_tsan.py runs it under ThreadSanitizer). The macOS binaries cannot
run here: they are checked to be Mach-O dynamic libraries for their CPU exporting every entry point; the
Windows arm64 one likewise as PE. The committed binaries must be the ones csrc/build_kernels.py builds from
the committed sources.

Each test skips, saying which tool is missing, only outside CI: with CI set a missing tool is a failure.
Tools: ziglang (pip), qemu-user and libc6-dev-arm64-cross, wine64 (Debian)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.platforms

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
KERNELS = ROOT / "lessonkit" / "engine" / "kernels"
ENTRY_POINTS = ["rk_abi", "rk_matmul", "rk_qmatmul", "rk_dequantise", "rk_set_threads", "rk_has_avx2", "rk_has_avx512",
                "rk_has_vnni", "rk_fma_many", "rk_max_threads", "rk_forward", "rk_draft_greedy", "rk_exp_many",
                "rk_state_half", "rk_repack_int", "rk_profile"]
# every platform's bits for these (no entry point calls the C library's exp: forward.c's exp_lk is its own);
# the int8 numerics' (qmatmul_int8, forward_*int8*) are every ISA path's too: integer sums, one float order
EXACT = ["matmul", "qmatmul", "dequantise", "forward_decode", "forward_last", "forward_moe_decode",
         "forward_moe_last", "exp_many", "fma", "fma_soft", "qmatmul_int8", "forward_int8_decode", "forward_int8_last",
         "forward_moe_int8_decode", "forward_moe_int8_last"]
# inside one run: the forward's bits (dense and MoE, both numerics) do not depend on how the 9 tokens are split
# into calls, and the int8 layout dequantises to the same weights
SAME_AS = {f"{model}_{run}": f"{model}_{'last' if run == 'last_only' else 'decode'}"
           for model in ("forward", "forward_moe", "forward_int8", "forward_moe_int8")
           for run in ("prefill", "chunks", "verify", "last_only")} | {"dequantise_int8_layout": "dequantise"}
STRESS_TIMEOUT = 300        # seconds: a backstop; kernel_check's watchdog ends a run after 15 s without progress
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")

sys.path.insert(0, str(CSRC))
import build_kernels  # noqa: E402


def missing(what: str) -> None:
    """Skip outside CI, fail in CI: the platform tests stand for platforms only if they run."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing, and CI must run the platform tests (see .ci/run)")
    pytest.skip(f"{what} is missing")


def zig() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        missing("ziglang (pip install ziglang)")
    return [sys.executable, "-m", "ziglang"]


def wine() -> str:
    for w in (shutil.which("wine64"), "/usr/lib/wine/wine64", shutil.which("wine")):
        if w and os.access(w, os.X_OK):
            return w
    missing("wine64 (apt-get install wine64)")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """kernel_check built with zig for a target, once per target."""
    out_dir, built = tmp_path_factory.mktemp("kernel_check"), {}

    def build(target: str) -> Path:
        if target not in built:
            exe = out_dir / (f"kernel_check-{target}" + (".exe" if "windows" in target else ""))
            # -ffp-contract=off: the rope tables' double arithmetic must not be fused on arm64 only
            subprocess.run(zig() + ["cc", "-target", target, "-O2", "-std=c11", "-ffp-contract=off", "-o", str(exe),
                                    str(CSRC / "kernel_check.c")], check=True, capture_output=True, timeout=600)
            built[target] = exe
        return built[target]
    return build


def hashes(cmd: list[str], env: dict | None = None, timeout: int = 600) -> dict[str, str]:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, (cmd, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert not [k for k in out if k.endswith("double_rounding")], out     # the driver's own fma check
    assert set(EXACT) | set(SAME_AS) | {"abi", "threads"} <= set(out), out
    assert {k: out[k] for k in SAME_AS} == {k: out[v] for k, v in SAME_AS.items()}, (cmd, out)
    return out


def stress(cmd: list[str], rounds: int, env: dict | None = None) -> None:
    """kernel_check's stress mode: no hang, no error, every call's bits equal to one thread's"""
    cmd = cmd + ["stress", str(rounds)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=STRESS_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd}: no answer in {STRESS_TIMEOUT} s. Output: {e.stdout!r} {e.stderr!r}")
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert "stress_hung" not in out, (f"{cmd}: the thread pool hung after {out['stress_hung']} calls (a caller "
                                      f"waits for a worker that missed its job)", r.stderr[-6000:])
    assert r.returncode == 0, (cmd, r.returncode, r.stdout[-2000:], r.stderr[-6000:])
    assert out.get("stress_mismatches") == "0" and int(out["stress_calls"]) > 30 * rounds, out


def copied(name: str, tmp_path: Path) -> Path:
    """A shipped binary copied aside: a rebuild while it runs replaces the file (see build_kernels.build_all)."""
    dst = tmp_path / name
    if not dst.exists():
        shutil.copyfile(KERNELS / name, dst)
    return dst


def x86_64_linux() -> bool:
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


@pytest.fixture(scope="module")
def reference(driver, tmp_path_factory):
    """The bits of this machine's binary on its portable path, one thread (x86_64 Linux: CI's machine)."""
    if not x86_64_linux():
        missing("an x86_64 Linux host (the reference bits)")
    lib = copied("rowkernel-linux-x86_64.so", tmp_path_factory.mktemp("reference"))
    return hashes([str(driver("x86_64-linux-gnu.2.17")), str(lib), "0", "1"])


def path_words() -> list[str]:
    import lessonkit.engine.kernel as K
    paths = ["0", "1"] if K._rowkernel is not None and K._rowkernel.has_avx2() else ["0"]
    return paths + (["2", "10"] if K._rowkernel is not None and K._rowkernel.has_avx512() else [])   # 10: no VNNI


def test_x86_64_paths_and_thread_counts_give_the_same_bits(driver, reference, tmp_path):
    exe, lib = str(driver("x86_64-linux-gnu.2.17")), str(copied("rowkernel-linux-x86_64.so", tmp_path))
    for path in path_words():
        for threads in ("1", "3"):
            got = hashes([exe, lib, path, threads])
            assert got["threads"] == threads
            assert {k: got[k] for k in EXACT} == {k: reference[k] for k in EXACT}, (path, threads)
    assert reference["fma"] == reference["fma_soft"]           # the FMA instruction and the software fma agree


def qemu_aarch64() -> str:
    qemu = shutil.which("qemu-aarch64")
    if not qemu:
        missing("qemu-aarch64 (apt-get install qemu-user)")
    if not (AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing(f"the aarch64 C library in {AARCH64_SYSROOT} (apt-get install libc6-dev-arm64-cross)")
    return qemu


def test_linux_aarch64_under_qemu_gives_the_x86_64_bits(driver, reference, tmp_path):
    qemu = qemu_aarch64()
    exe, lib = str(driver("aarch64-linux-gnu.2.17")), str(copied("rowkernel-linux-aarch64.so", tmp_path))
    for threads in ("1", "3"):
        got = hashes([qemu, "-L", str(AARCH64_SYSROOT), exe, lib, "0", threads])
        assert got["threads"] == threads
        assert {k: got[k] for k in EXACT} == {k: reference[k] for k in EXACT}


def windows_x86_64(driver, tmp_path) -> tuple[list[str], dict]:
    """(the command that runs kernel_check.exe on the Windows DLL under wine64, its environment)"""
    w = wine()
    exe = driver("x86_64-windows-gnu")
    dll = copied("rowkernel-windows-x86_64.dll", tmp_path)
    shutil.copyfile(exe, tmp_path / exe.name)
    env = dict(os.environ, WINEPREFIX=str(tmp_path / "wineprefix"), WINEDEBUG="-all")
    return [w, str(tmp_path / exe.name), dll.name], env


@pytest.mark.budget(180, "wine64 creates a fresh prefix for the test first: 12-87 s on 2 cores (2026-12-04)")
def test_windows_x86_64_under_wine_gives_the_linux_bits(driver, reference, tmp_path):
    """Every product, the forward, exp, dequantisation and fma: Linux's bits (the forward uses IEEE basic
    operations only: its exp is csrc/forward.c's exp_lk, its sqrt and division are correctly rounded; the C
    library's expf, which Windows' MinGW / UCRT computes otherwise than glibc in last bits, is called nowhere)."""
    cmd, env = windows_x86_64(driver, tmp_path)
    for path, threads in (("1", "3"), ("0", "1")):
        got = hashes(cmd + [path, threads], env=env)
        assert got["threads"] == threads
        assert {k: got[k] for k in EXACT} == {k: reference[k] for k in EXACT}, (path, threads)


# ---- the thread pool: switched between 1, 2, 3 and 8 threads between calls, two callers at once ---------
def test_thread_pool_under_switching_thread_counts_x86_64(driver, tmp_path):
    exe, lib = str(driver("x86_64-linux-gnu.2.17")), str(copied("rowkernel-linux-x86_64.so", tmp_path))
    for path in path_words():
        stress([exe, lib, path, "3"], rounds=100)


def test_thread_pool_under_switching_thread_counts_aarch64_qemu(driver, tmp_path):
    """arm64's weaker memory order (as far as qemu keeps it) and NEON"""
    qemu = qemu_aarch64()
    exe, lib = str(driver("aarch64-linux-gnu.2.17")), str(copied("rowkernel-linux-aarch64.so", tmp_path))
    stress([qemu, "-L", str(AARCH64_SYSROOT), exe, lib, "0", "3"], rounds=30)


@pytest.mark.budget(180, "a fresh wine64 prefix, then 60 rounds of 8 threads under wine64, whose thread start-up is "
                         "slow: 73-85 s on 2 cores (2026-12-04)")
def test_thread_pool_under_switching_thread_counts_windows_wine(driver, tmp_path):
    """Win32 threads, SRW locks and condition variables (portable.h)"""
    cmd, env = windows_x86_64(driver, tmp_path)
    stress(cmd + [path_words()[-1], "8"], rounds=60, env=env)


# ---- binaries that cannot run here: format, CPU, exported entry points -------------------------------
def macho_exports(data: bytes) -> tuple[int, int, set[str]]:
    """(cputype, filetype, external defined symbols) of a 64-bit little-endian Mach-O file."""
    magic, cputype, _, filetype, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    assert magic == 0xfeedfacf, hex(magic)
    off, names = 32, set()
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd == 0x2:                                            # LC_SYMTAB
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, off + 8)
            for i in range(nsyms):
                strx, ntype, _, _, _ = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if ntype & 0x01 and (ntype & 0x0e) == 0x0e:         # N_EXT, defined in a section
                    end = data.index(b"\0", stroff + strx)
                    names.add(data[stroff + strx:end].decode())
        off += size
    return cputype, filetype, names


@pytest.mark.parametrize("name,cputype", [("rowkernel-macos-x86_64.dylib", 0x01000007),
                                          ("rowkernel-macos-arm64.dylib", 0x0100000c)])
def test_macos_binaries_are_dylibs_for_their_cpu_with_every_entry_point(name, cputype):
    got_cpu, filetype, names = macho_exports((KERNELS / name).read_bytes())
    assert (got_cpu, filetype) == (cputype, 6)                    # MH_DYLIB
    assert {"_" + e for e in ENTRY_POINTS} <= names, names


def pe_exports(data: bytes) -> tuple[int, set[str]]:
    """(machine, exported names) of a PE32+ DLL."""
    pe = struct.unpack_from("<I", data, 0x3c)[0]
    assert data[pe:pe + 4] == b"PE\0\0"
    machine, nsect, _, _, _, opt_size, chars = struct.unpack_from("<HHIIIHH", data, pe + 4)
    assert chars & 0x2000, "not a DLL"
    opt = pe + 24
    assert struct.unpack_from("<H", data, opt)[0] == 0x20b       # PE32+
    exp_rva = struct.unpack_from("<I", data, opt + 112)[0]
    sections = [struct.unpack_from("<8sIIII", data, opt + opt_size + 40 * i) for i in range(nsect)]

    def at(rva: int) -> int:
        for _, vsize, vaddr, rawsize, rawptr in sections:
            if vaddr <= rva < vaddr + max(vsize, rawsize):
                return rva - vaddr + rawptr
        raise AssertionError(f"RVA {rva:#x} in no section")
    n_names = struct.unpack_from("<I", data, at(exp_rva) + 24)[0]          # IMAGE_EXPORT_DIRECTORY.NumberOfNames
    names_rva = struct.unpack_from("<I", data, at(exp_rva) + 32)[0]        # .AddressOfNames
    names = set()
    for i in range(n_names):
        s = at(struct.unpack_from("<I", data, at(names_rva) + 4 * i)[0])
        names.add(data[s:data.index(b"\0", s)].decode())
    return machine, names


@pytest.mark.parametrize("name,machine", [("rowkernel-windows-x86_64.dll", 0x8664),
                                          ("rowkernel-windows-aarch64.dll", 0xaa64)])
def test_windows_binaries_are_dlls_for_their_cpu_with_every_entry_point(name, machine):
    got, names = pe_exports((KERNELS / name).read_bytes())
    assert got == machine
    assert set(ENTRY_POINTS) <= names, names


@pytest.mark.parametrize("name,machine", [("rowkernel-linux-x86_64.so", 62), ("rowkernel-linux-aarch64.so", 183)])
def test_linux_binaries_need_at_most_glibc_2_17(name, machine):
    """manylinux2014: the library may ask for no glibc symbol version newer than 2.17."""
    data = (KERNELS / name).read_bytes()
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == machine
    versions = {int(v) for v in re.findall(rb"GLIBC_2\.(\d+)", data)}
    assert versions and max(versions) <= 17, sorted(versions)
    for e in ENTRY_POINTS:
        assert e.encode() + b"\0" in data, e


# ---- the committed binaries are the sources' -------------------------------------------------------
def test_committed_binaries_come_from_the_committed_sources():
    """manifest.json records the sources' SHA-256 when the binaries were built: a changed rowkernel.c or
    portable.h without `python csrc/build_kernels.py` fails here."""
    assert build_kernels.check() == []


@pytest.mark.budget(300, "zig compiles the kernel for all six targets from the sources: 107-134 s on 2 cores "
                         "(2026-12-04)")
def test_the_binaries_rebuild_bit_for_bit(tmp_path):
    """zig builds are deterministic: rebuilding every target from the sources gives the committed files."""
    z = zig()
    manifest = json.loads((KERNELS / build_kernels.MANIFEST).read_text(encoding="utf-8"))
    have = build_kernels.zig_version(z)
    if have != manifest["zig"]:
        missing(f"zig {manifest['zig']} (the version the binaries were built with; found {have})")
    for name in build_kernels.TARGETS:
        built = build_kernels.build_target(z, name, tmp_path)
        assert hashlib.sha256(built.read_bytes()).hexdigest() == manifest["binaries"][name]["sha256"], name
