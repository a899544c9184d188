"""The kernel's thread pool under ThreadSanitizer: no data race, no hang, the same bits at every thread count.

csrc/kernel_check.c's stress mode, linked with the kernel's units (csrc/build_kernels.py UNITS) into one program
built with `-fsanitize=thread -O1 -g -ffp-contract=off` (gcc; zig's clang where gcc has no TSAN runtime), runs
rk_forward (a 9-row prefill and 9 decode steps of a 2-layer dense Llama, float32, Q4_1 and Q8_0 products) and small
rk_qmatmul / rk_matmul products (fewer strips than threads, so some workers sit a job out), switching
rk_set_threads between 1, 2, 3 and 8 between calls, then from two caller threads at once while the main thread
keeps switching; every result must equal the one-thread bits, and ThreadSanitizer must report nothing. The first
calls run at the starting thread count, so the kernel's lazily set statics are first touched by the workers.
This builds the sources, not the shipped binaries (tests/test_platforms_kernel.py runs the same stress mode on
those, natively, under qemu-aarch64 and under wine64)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_platforms_kernel import missing

pytestmark = pytest.mark.platforms

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
FLAGS = ["-fsanitize=thread", "-O1", "-g", "-std=c11", "-ffp-contract=off", "-DKERNEL_CHECK_LINKED"]
TIMEOUT = 300           # seconds: a backstop; kernel_check ends a run after 15 s without progress (a hang)


def tsan_compiler(tmp_path: Path) -> list[str]:
    """gcc when it links a ThreadSanitizer program, else zig's clang (it builds the TSAN runtime once: minutes)."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    gcc = shutil.which("gcc")
    if gcc and subprocess.run([gcc, "-fsanitize=thread", "-o", str(tmp_path / "probe"), str(probe)],
                              capture_output=True).returncode == 0:
        return [gcc]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        missing("a C compiler with ThreadSanitizer (gcc with libtsan, or ziglang)")
    return [sys.executable, "-m", "ziglang", "cc"]


@pytest.fixture(scope="module")
def tsan_check(tmp_path_factory) -> Path:
    if not (sys.platform.startswith("linux") and os.uname().machine in ("x86_64", "aarch64")):
        missing("Linux on x86_64 or aarch64 (ThreadSanitizer's platforms here)")
    out = tmp_path_factory.mktemp("tsan")
    exe = out / "kernel_check_tsan"
    cc = tsan_compiler(out)
    from tests.test_platforms_kernel import build_kernels
    units = [str(CSRC / u) for u in build_kernels.UNITS]
    r = subprocess.run(cc + FLAGS + ["-o", str(exe), str(CSRC / "kernel_check.c"), *units, "-lm", "-lpthread"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def run_stress(exe: Path, path: str, threads: str, rounds: int) -> None:
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1")
    cmd = [str(exe), "-", path, threads, "stress", str(rounds)]
    if shutil.which("setarch"):       # no address randomisation: newer kernels' wider ASLR breaks older TSAN runtimes
        cmd = [shutil.which("setarch"), os.uname().machine, "-R"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    report = r.stderr[-8000:]
    assert "ThreadSanitizer" not in r.stderr, f"{cmd}:\n{report}"
    assert "stress_hung" not in out, f"{cmd}: the thread pool hung after {out.get('stress_hung')} calls (a caller " \
                                     f"waits for a worker that missed its job)"
    assert r.returncode == 0, (cmd, r.returncode, r.stdout[-2000:], report)
    assert out["stress_mismatches"] == "0" and int(out["stress_calls"]) > 30 * rounds, out


def avx2_here() -> bool:
    import lessonkit.engine.kernel as K
    return K._rowkernel is not None and bool(K._rowkernel.has_avx2())


@pytest.mark.parametrize("path,threads,rounds", [("1", "8", 20), ("0", "3", 10)],
                         ids=["avx2-from-8", "portable-from-3"])
def test_thread_pool_is_race_free_and_thread_count_invariant(tsan_check, path, threads, rounds):
    if path == "1" and not avx2_here():
        pytest.skip("this CPU has no AVX2 + FMA + F16C (the portable run covers the pool)")
    run_stress(tsan_check, path, threads, rounds)
