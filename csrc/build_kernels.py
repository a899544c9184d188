"""Build the row kernel (csrc/: the units in UNITS, their headers) as plain C shared libraries, no Python ABI.

    python csrc/build_kernels.py            the six shipped binaries, cross-built with `zig cc` (PyPI ziglang)
                                            into lessonkit/engine/kernels/, plus manifest.json
    python csrc/build_kernels.py --host     this machine's library with its own C compiler ($CC, cc, gcc,
                                            clang; cl on Windows; zig as the last resort) into
                                            lessonkit/engine/kernels/rowkernel-host.{so,dylib,dll}, which the
                                            engine loads when no shipped binary matches (git ignores it)
    python csrc/build_kernels.py --check    exit 1 unless manifest.json matches the sources and the binaries

The library is five compilation units compiled separately and linked into one file (UNITS; csrc/kernel_impl.h
says what each holds and which calls which). One set of flags for every target, nothing taken from the
environment but the compiler: -O3, C11,
-ffp-contract=off (a * b + c is never fused behind the code's back: the bits must not depend on the
compiler), hidden symbols but the rk_* entry points, stripped. Linux targets glibc 2.17 (manylinux2014).
manifest.json records the SHA-256 of the sources, of each binary, and the zig version; a test
(tests/test_platforms_kernel.py) checks that the committed binaries come from the committed sources.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CSRC = Path(__file__).resolve().parent
ROOT = CSRC.parent
KERNELS = ROOT / "lessonkit" / "engine" / "kernels"
UNITS = ["rowkernel.c", "forward.c", "products.c", "intdot.c", "pool.c"]   # compiled separately, linked in this order
SOURCES = UNITS + ["rowkernel.h", "kernel_impl.h", "portable.h", "format.h"]   # what the binaries are built from
MANIFEST = "manifest.json"

TARGETS = {                                   # shipped file name: zig target
    "rowkernel-linux-x86_64.so": "x86_64-linux-gnu.2.17",
    "rowkernel-linux-aarch64.so": "aarch64-linux-gnu.2.17",
    "rowkernel-windows-x86_64.dll": "x86_64-windows-gnu",
    "rowkernel-windows-aarch64.dll": "aarch64-windows-gnu",
    "rowkernel-macos-x86_64.dylib": "x86_64-macos.11.0",
    "rowkernel-macos-arm64.dylib": "aarch64-macos.11.0",
}
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
         "-shared"]
HOST_FLAGS = [f for f in FLAGS if f != "-Werror"] + ["-fPIC", "-pthread"]   # a newer compiler's warning must not stop a student's build


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def zig() -> list[str]:
    """`python -m ziglang` (the PyPI package), or a `zig` on PATH."""
    try:
        import ziglang  # noqa: F401
        return [sys.executable, "-m", "ziglang"]
    except ImportError:
        if shutil.which("zig"):
            return ["zig"]
    sys.exit("build_kernels: zig not found: pip install ziglang (the cross-compiler for the shipped binaries)")


def zig_version(z: list[str]) -> str:
    return subprocess.run(z + ["version"], capture_output=True, text=True, check=True).stdout.strip()


def build_target(z: list[str], name: str, out_dir: Path) -> Path:
    target = TARGETS[name]
    out = out_dir / name
    pic = [] if "windows" in target else ["-fPIC"]
    # macOS: strip local symbols and the debug map (-S: its stabs name the build machine's source folder and
    # object cache); the install name would otherwise be the (temporary) output path
    strip = ["-Wl,-x", "-Wl,-S", f"-Wl,-install_name,@rpath/{name}"] if "macos" in target else ["-s"]
    cmd = z + ["cc", "-target", target, *FLAGS, *pic, *strip, "-o", str(out), *UNITS]
    subprocess.run(cmd, cwd=CSRC, check=True)
    for junk in out_dir.glob(Path(name).stem + ".*"):      # zig leaves import libraries (.lib, .pdb) beside a DLL
        if junk.name != name:
            junk.unlink()
    return out


def source_hashes() -> dict:
    return {f"csrc/{s}": sha256(CSRC / s) for s in SOURCES}


def build_all(names: list[str]) -> None:
    z = zig()
    KERNELS.mkdir(parents=True, exist_ok=True)
    manifest_path = KERNELS / MANIFEST
    old = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    binaries = {k: v for k, v in old.get("binaries", {}).items() if k in TARGETS and k not in names}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            built = build_target(z, name, Path(tmp))
            # a new file renamed over the old one, never the old one rewritten: a process that has the library
            # mapped keeps its copy (rewriting it in place crashed a test run that was using it)
            part = KERNELS / f".{name}.part"
            shutil.copyfile(built, part)
            os.replace(part, KERNELS / name)
            binaries[name] = {"target": TARGETS[name], "bytes": built.stat().st_size, "sha256": sha256(built)}
            print(f"{name:32s} {TARGETS[name]:24s} {built.stat().st_size:8d} bytes")
    manifest = {"sources": source_hashes(), "zig": zig_version(z), "flags": FLAGS,
                "binaries": dict(sorted(binaries.items()))}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def host_compiler() -> list[str] | None:
    for cc in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc", "clang"]:
        if shutil.which(cc.split()[0]):
            return cc.split()
    return None


def build_host() -> Path:
    from_ext = {"win32": ".dll", "darwin": ".dylib"}.get(sys.platform, ".so")
    out = KERNELS / f"rowkernel-host{from_ext}"
    KERNELS.mkdir(parents=True, exist_ok=True)
    cc = host_compiler()
    if cc is None and sys.platform == "win32" and shutil.which("cl"):
        # MSVC: /fp:precise is its default and portable.h (every unit includes it) adds #pragma fp_contract(off)
        cmd = ["cl", "/nologo", "/O2", "/std:c11", "/fp:precise", "/LD", *UNITS, f"/Fe:{out}"]
    elif cc is not None:
        cmd = cc + HOST_FLAGS + ["-o", str(out), *UNITS, "-lm"]
    else:
        cmd = zig() + ["cc", *HOST_FLAGS, "-o", str(out), *UNITS]
    print(" ".join(cmd))
    subprocess.run(cmd, cwd=CSRC, check=True)
    return out


def check() -> list[str]:
    """What is out of date: sources changed since the binaries were built, or a binary not the one recorded."""
    path = KERNELS / MANIFEST
    if not path.exists():
        return [f"{path} is missing: run python csrc/build_kernels.py"]
    m = json.loads(path.read_text(encoding="utf-8"))
    problems = [f"{src} changed since the binaries were built (SHA-256 {now[:12]}, built from {m['sources'].get(src, '?')[:12]})"
                for src, now in source_hashes().items() if m["sources"].get(src) != now]
    for name in TARGETS:
        rec, f = m["binaries"].get(name), KERNELS / name
        if rec is None or not f.exists():
            problems.append(f"{name}: not built")
        elif sha256(f) != rec["sha256"]:
            problems.append(f"{name}: not the file recorded in {MANIFEST}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", action="store_true", help="build only this machine's library with its C compiler")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the binaries match the sources")
    ap.add_argument("names", nargs="*", help=f"only these shipped binaries (default: all of {', '.join(TARGETS)})")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        print("\n".join(problems) or "the shipped binaries match csrc/")
        return 1 if problems else 0
    if args.host:
        print(build_host())
        return 0
    unknown = [n for n in args.names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown binary {unknown[0]!r}: expected one of {', '.join(TARGETS)}")
    build_all(args.names or list(TARGETS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
