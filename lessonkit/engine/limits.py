"""The limits this process runs under, checked before starting threads or loading a model: a request that cannot
fit is refused in one line (errors.ResourceError) before any work, not killed half-way (issue 60).

RLIMIT_NPROC counts every process and thread of the user (root is not bound by it); RLIMIT_AS caps the address
space, which every thread's stack and every mapped weight file takes from. What the system refuses anyway (other
processes took the memory) is caught where it happens and said the same way (errors.ran_out_line).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from lessonkit.errors import MEMORY_ADVICE, THREAD_ADVICE, ResourceError, limits_text

STACK_DEFAULT = 8 << 20          # glibc's thread stack when RLIMIT_STACK is unlimited (x86-64, aarch64)


def _rlimit(name: str) -> int | None:
    try:
        import resource
    except ImportError:          # Windows
        return None
    soft = resource.getrlimit(getattr(resource, name))[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _status(field: str, pid: str = "self") -> int | None:
    """A number from /proc/PID/status (kB fields in bytes), None where there is no /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith(field + ":"):
                v = line.split()[1:]
                return int(v[0]) * (1024 if v[1:] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def threads_of_user() -> int | None:
    """Processes and threads running under this real user id now (what RLIMIT_NPROC counts), None without /proc."""
    uid, n = os.getuid(), 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for p in pids:
        try:
            if os.stat(f"/proc/{p}").st_uid == uid:
                n += _status("Threads", p) or 0
        except OSError:
            continue
    return n


def address_space_left() -> int | None:
    """Bytes of address space this process may still map under RLIMIT_AS, None when unlimited or unknown."""
    limit, used = _rlimit("RLIMIT_AS"), _status("VmSize")
    return None if limit is None or used is None else limit - used


def check_thread_room(n: int, what: str) -> None:
    """Refuse to start n more threads (what: 'the C kernel's 63 worker threads (--threads 64)') when a limit
    leaves no room for them: RLIMIT_NPROC (not for root) or the address space their stacks need."""
    if n <= 0:
        return
    nproc = _rlimit("RLIMIT_NPROC") if os.getuid() != 0 else None
    running = threads_of_user() if nproc is not None else None
    torch_extra = _torch_threads() - 1
    if nproc is not None and running is not None and running + n + torch_extra > nproc:
        raise ResourceError(f"out of threads ({what} would pass the limit: {running:,} already running"
                            f"{limits_text('threads')}): {THREAD_ADVICE}")
    stack, left = _rlimit("RLIMIT_STACK") or STACK_DEFAULT, address_space_left()
    if left is not None and n * stack > left:
        raise ResourceError(f"out of memory ({what} need {n * stack / 2**20:,.0f} MB of stacks, {left / 2**20:,.0f} MB "
                            f"of address space is left{limits_text('memory')}): use fewer --threads or allow more memory")


def _torch_threads() -> int:
    """torch's intra-op threads if torch is loaded (OpenMP starts them at its first parallel product), else 1."""
    torch = sys.modules.get("torch")
    return max(1, torch.get_num_threads()) if torch is not None else 1


def check_memory_room(need: int, what: str) -> None:
    """Refuse a request that needs more address space than RLIMIT_AS leaves (need: bytes it maps or allocates)."""
    left = address_space_left()
    if left is not None and need > left:
        raise ResourceError(f"out of memory ({what} needs {need / 2**20:,.0f} MB, {max(left, 0) / 2**20:,.0f} MB of "
                            f"address space is left{limits_text('memory')}): {MEMORY_ADVICE}")


ENGINE_AS_MB = 768     # address space torch, numpy and the engine map before any model (VmPeak ~640 MB, x86-64 Linux)


def check_engine_room() -> None:
    """Refuse a command that loads torch when RLIMIT_AS leaves less than ENGINE_AS_MB: under it the libraries fail
    to map (an ImportError), or OpenBLAS gives up and exits the process, before any command code runs."""
    limit = _rlimit("RLIMIT_AS")
    if limit is not None and limit < ENGINE_AS_MB << 20:
        raise ResourceError(f"out of memory (torch and the engine map about {ENGINE_AS_MB} MB of address space before "
                            f"any model{limits_text('memory')}): allow more memory (ulimit -v); "
                            "`lessonkit models` needs far less")
