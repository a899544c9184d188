"""Threads: one meaning, the C kernel's thread count (lessonkit.engine.kernel.set_threads).

Every command's --threads is that count. `use_threads` is the one place torch's thread count is derived from
it (torch runs the long GEMM forwards and training; the kernel runs the short row-invariant ones), so a
command never runs the two with different counts it was given. Commands call it at their edge; `lessonkit run`
hands the count to each notebook inside its SETTINGS parameter, and the notebook's engine.active.adopt calls it.
Places that pin torch alone for a while (one thread while timing on a shared machine, a trainer's preset
for reproducible weights) say why where they do it.
"""
from __future__ import annotations

import contextlib

# The C kernel's thread limit, MAXT in csrc/rowkernel.c (rk_max_threads) (tests/test_parsing.py holds them equal): kept
# here as a number so that every command's --threads is checked by argparse without loading the kernel.
MAX_THREADS = 64


def use_threads(n: int | None = None, *, torch_too: bool = True) -> int:
    """Run the C kernel with n threads (None: settings.default()'s, this machine's physical cores) and, with
    torch_too, torch with the same n. Without an n torch keeps its own default (the physical cores too, unless
    OMP_NUM_THREADS pins it: a test harness or a user on shared cores). Commands whose help says --threads is the kernel's alone (generate,
    bench) pass torch_too=False: torch stays at OMP_NUM_THREADS. Returns the kernel's count in use (1 without the
    C kernel binary). Results do not depend on it: each kernel output is one chain computed by one thread.

    A count the system cannot start is one line (errors.ResourceError), checked before starting where a limit
    says so (engine.limits), and after: the kernel starts what it can, and fewer than an asked n is refused."""
    from lessonkit.engine import kernel, settings
    from lessonkit.engine.limits import check_thread_room
    want, loaded = settings.default().threads if n is None else n, kernel._rowkernel is not None
    if n is not None and loaded:
        check_thread_room(min(want, MAX_THREADS) - kernel.THREADS, f"the C kernel's {want} threads (--threads {want})")
    in_use = kernel.set_threads(want)     # checks n
    if n is not None and loaded and in_use < min(want, MAX_THREADS):
        from lessonkit.errors import THREAD_ADVICE, ResourceError, limits_text
        raise ResourceError(f"out of threads (the C kernel started {in_use} of the {want} threads of --threads {want}"
                            f"{limits_text('threads')}): {THREAD_ADVICE}")
    if n is not None and torch_too:
        pin_torch_threads(n)
    return in_use


def pin_torch_threads(n: int) -> None:
    """torch on n threads from here on, the kernel untouched: a trainer's preset count (the weights it writes
    depend on how torch's threaded products split their sums) or a benchmark's single OpenMP thread beside the
    kernel's own threads. The one place besides `torch_threads` that sets torch's count."""
    import torch
    torch.set_num_threads(max(1, int(n)))


@contextlib.contextmanager
def torch_threads(n: int):
    """torch on n threads for the block, its count restored after: one thread is far steadier than two on an
    oversubscribed CPU when a lesson times a short forward."""
    import torch
    old = torch.get_num_threads()
    pin_torch_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
