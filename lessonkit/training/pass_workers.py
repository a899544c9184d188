"""The target pass's missing shards on several processes (lessonkit.training.target_pass).

Why: one decode step of a 135M target hardly gets faster on a second kernel thread (a row's products are short:
the pass took about 0.59 s a request on two threads against 0.63 on one, docs/feature_head.md), but two processes
that each answer their own requests decode nearly twice the tokens (1.62x on 2 cores). The pass is a large part of a
head's training budget.

Same bits: each shard is computed whole by one process, on one kernel thread, with the parent's kernel path,
numerics, weights and forward (engine.active.adopt), on a target loaded by name whose fingerprint must equal the
parent's; a state depends on neither the process nor the thread count, so the shards are the sequential pass's
(tests/test_feature_head.py compares them with ==). Processes are spawned, not forked: the parent's kernel threads
and torch's pool do not survive a fork, and spawn is what macOS and Windows have.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from lessonkit.engine import active, kernel, settings
from lessonkit.errors import LessonkitError

_TARGET = None                 # each worker's own target (or why it could not load it), set once by _start


def _start(name: str, weights: str, fingerprint: str, run_settings: dict) -> None:
    global _TARGET
    from lessonkit.models.registry import load_model
    try:
        active.adopt({**run_settings, "threads": 1})        # the kernel and torch on one thread
        target = load_model(name, weights=weights)
        if target.fingerprint() != fingerprint:
            raise LessonkitError(f"{name}: a pass worker loaded other weights (fingerprint {target.fingerprint()[:12]}, "
                                 f"the pass's target {fingerprint[:12]}); run the pass with --pass-workers 1")
        _TARGET = target
    except Exception as e:        # raised again by the first shard, so the parent gets the error itself
        _TARGET = e


def _run_shard(compute, path: str, items: list[tuple], max_new: int, taps: tuple[int, ...]) -> int:
    if isinstance(_TARGET, Exception):
        raise _TARGET
    return compute(_TARGET, Path(path), items, max_new, taps)


def run_shards(target, compute, jobs: list[tuple[Path, list[tuple]]], max_new: int, taps, workers: int, tick) -> None:
    """compute(target, path, items, max_new, taps) for every (path, items) of `jobs` on `workers` spawned processes
    (target_pass.compute_shard: a module's function, which pickles by name); tick(n) as each shard's n items land.
    A shard that fails raises here, after the shards already written stay on disk (a rerun resumes from them)."""
    run_settings = {"kernel": kernel.BACKEND, "numerics": kernel.NUMERICS, "forward": settings.current().forward}
    args = (target.name, target.weights, target.fingerprint(), run_settings)
    ctx = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=_start, initargs=args) as pool:
            futures = [pool.submit(_run_shard, compute, str(path), items, max_new, tuple(taps)) for path, items in jobs]
            for f in as_completed(futures):
                tick(f.result())
    except BrokenProcessPool:
        raise LessonkitError(
            f"the target pass's {workers} worker processes stopped before their shards were written (killed for "
            "memory, or a script without `if __name__ == '__main__':` around its call: spawned workers import it "
            "again); the shards already written are kept, a rerun resumes; workers=1 (--pass-workers 1) runs the pass "
            "in this process") from None
