"""`lessonkit bench native`: smollm2-135m on its own Q4_1 / Q8_0 blocks against the float32 path.

Three engines load in one process and run in turn within every repeat (medians): the blocks on the exact
numerics ("native"), the blocks on the int8 numerics ("int8", csrc/intdot.c) and float32 ("f32"). Decode
tokens/s and a 512-token prefill at each thread count, the verify cost T(k+1)/T(1) of each numerics, the share of a decode step spent outside the C kernel (Python and
PyTorch glue), and the identity checks the speed must not cost: native logits equal float32 logits, and
2 or 3 threads equal 1 thread, bit for bit. The llama.cpp anchor is `lessonkit bench llamacpp`."""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from lessonkit.bench.common import goal, median_times
from lessonkit.engine import active, blocks, kernel, row_weight
from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.engine.machine import machine_record

PROMPT = "The expert cache keeps the most recently used experts in memory, and"


def decode_step_s(eng, n: int, prompt_ids: list[int]) -> float:
    """Seconds per decode token (n tokens after the prompt, the prefill left out)."""
    r = generate(eng, prompt_ids, n + 1, use_eos=False)
    return (r.stats["wall_s"] - r.stats["ttft_s"]) / n


def prefill_s(eng, ids: list[int]) -> float:
    cache = eng.new_cache(len(ids))
    t0 = time.perf_counter()
    eng.forward(ids, cache, last_only=True)
    return time.perf_counter() - t0


def median_steps(engines: dict, n: int, ids: list[int], repeats: int) -> dict:
    """Median seconds per decode token of each engine, run in turn within every repeat (after a warm-up)."""
    for eng in engines.values():
        decode_step_s(eng, 4, ids)
    runs = {name: [] for name in engines}
    for _ in range(repeats):
        for name, eng in engines.items():
            runs[name].append(decode_step_s(eng, n, ids))
    return {name: statistics.median(v) for name, v in runs.items()}


@contextlib.contextmanager
def kernel_timer():
    """Seconds spent inside C calls (row products of both weight kinds, and whole C forwards) while the block
    runs: {"s": total}."""
    spent = {"s": 0.0}
    originals = {(cls, name): getattr(cls, name) for cls, name in
                 ((row_weight.RowWeight, "rows"), (blocks.NativeWeight, "rows"), (kernel.KernelLibrary, "forward"))}

    def timed(orig):
        def call(self, *args, **kw):
            t0 = time.perf_counter()
            try:
                return orig(self, *args, **kw)
            finally:
                spent["s"] += time.perf_counter() - t0
        return call
    for (cls, name), orig in originals.items():
        setattr(cls, name, timed(orig))
    try:
        yield spent
    finally:
        for (cls, name), orig in originals.items():
            setattr(cls, name, orig)


def decode_steps(eng, prompt_ids: list[int], n: int, during=contextlib.nullcontext):
    """Wall seconds of n greedy decode steps after the prompt (the prefill left out), each step as `generate`
    takes it (forward of one token, argmax); `during()` is a context entered for the decode steps only."""
    cache = eng.new_cache(len(prompt_ids) + n + 1)
    tok = int(eng.forward(prompt_ids, cache, last_only=True)[-1].argmax())
    with during() as ctx:
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(eng.forward([tok], cache)[-1].argmax())
        wall = time.perf_counter() - t0
    return wall, ctx


def outside_kernel_share(eng, prompt_ids: list[int], n: int) -> float:
    """Fraction of a decode step's wall time spent outside C (the C forward, or the kernel's products on the
    PyTorch forward): Python and PyTorch glue, the step's argmax included."""
    wall, spent = decode_steps(eng, prompt_ids, n, kernel_timer)
    return max(0.0, 1 - spent["s"] / wall)


def op_groups_ms(eng, prompt_ids: list[int], n: int) -> dict[str, float]:
    """Milliseconds per decode token by op group inside the C forward (csrc/forward.c's profile), and the rest
    of the step outside it; {} when the model does not take the C forward."""
    if eng.model.c_forward is None:
        return {}

    @contextlib.contextmanager
    def profiled():
        with kernel_timer() as spent:
            kernel._rowkernel.profile(True)
            try:
                yield spent
            finally:
                spent["groups"] = kernel._rowkernel.profile(False)
    wall, spent = decode_steps(eng, prompt_ids, n, profiled)
    out = {g: s * 1e3 / n for g, s in spent["groups"].items()}
    out["outside the C forward"] = (wall - spent["s"]) * 1e3 / n
    return out


def identical_bits(native, f32, ids: list[int], threads: list[int]) -> dict:
    """Native vs float32 logits over a prefill and three decode steps, and each thread count vs one thread."""
    def logits(eng):
        cache = eng.new_cache(len(ids) + 3)
        out = [eng.forward(ids, cache)]
        out += [eng.forward([t], cache) for t in (11, 2000, 49000)]
        return out
    base = logits(native)
    same_f32 = all(torch.equal(a, b) for a, b in zip(base, logits(f32)))
    same_threads = True
    for n in threads:
        kernel.set_threads(n)
        same_threads &= all(torch.equal(a, b) for a, b in zip(base, logits(native)))
    kernel.set_threads(1)
    return {"native_equals_f32": same_f32, "threads_equal_one_thread": same_threads}


def verify_cost(eng, ids: list[int], width: int, repeats: int) -> float:
    """T(width) / T(1): seconds of one forward of `width` new rows over one of a single row, at the same cache
    position (a speculative verify of width - 1 drafts against a decode step), medians of `repeats`."""
    cache = eng.new_cache(len(ids) + width)
    eng.forward(ids, cache, last_only=True)
    n = len(ids)

    def step(m):
        def run():
            cache.rollback(n)
            eng.forward(ids[:m], cache)
        return run
    t = median_times({1: step(1), width: step(width)}, repeats, warmup=1)
    return t[width] / t[1]


def int8_agreement(int8, exact, ids: list[int]) -> float:
    """Share of positions of a prefill where the int8 numerics' greedy token equals the exact path's."""
    a = exact.forward(ids, exact.new_cache(len(ids))).argmax(-1)
    b = int8.forward(ids, int8.new_cache(len(ids))).argmax(-1)
    return float((a == b).float().mean())


def load_engines() -> dict:
    """smollm2-135m three ways: native blocks (exact numerics), native blocks (int8 numerics), float32."""
    with active.use(numerics="exact"):
        engines = {"native": load_model("smollm2-135m", weights="native")}
    if kernel._rowkernel is not None and kernel.BACKEND != "mkl":
        with active.use(numerics="int8"):
            engines["int8"] = load_model("smollm2-135m", weights="native")
    with active.use(numerics="exact"):
        engines["f32"] = load_model("smollm2-135m", weights="f32")
    return engines


def bench(args) -> dict:
    smoke = getattr(args, "smoke", False)
    threads = list(getattr(args, "threads", None) or [1, 2])
    repeats = 1 if smoke else max(3, getattr(args, "repeats", 5))
    n_dec, n_pre = (8, 64) if smoke else (64, 512)
    engines = load_engines()
    native, f32 = engines["native"], engines["f32"]
    ids = native.encode(PROMPT)
    pre_ids = (ids * (n_pre // len(ids) + 1))[:n_pre]
    checks = identical_bits(native, f32, pre_ids[:96], sorted(set(threads) | {2, 3}))
    rows, rate, verify = [], {}, {}
    for n in threads:
        kernel.set_threads(n)
        t = median_steps(engines, n_dec, ids, repeats)
        p = median_times({w: (lambda e=e: prefill_s(e, pre_ids)) for w, e in engines.items()},
                         max(1, repeats // 2), warmup=0 if smoke else 1)
        for w in engines:
            rate[w, n] = 1 / t[w]
            rows.append({"weights": w, "threads": n, "decode_tok_s": 1 / t[w], "decode_ms": t[w] * 1e3,
                         f"prefill_{n_pre}_tok_s": n_pre / p[w]})
    kernel.set_threads(threads[0])
    for w in ("native", "int8"):
        if w in engines:
            verify[w] = {k: verify_cost(engines[w], ids, k + 1, 3 if smoke else 15) for k in (1, 4, 15)}
    share = {w: outside_kernel_share(e, ids, n_dec) for w, e in engines.items()}
    ops = {w: op_groups_ms(engines[w], ids, n_dec) for w in ("native", "int8") if w in engines}
    agree = int8_agreement(engines["int8"], native, pre_ids[:128]) if "int8" in engines else None
    kernel.set_threads(1)
    return {"bench": "native", "model": "smollm2-135m", "machine": machine_record(), "threads": threads,
            "forward": {w: e.model.forward_why for w, e in engines.items()}, "repeats": repeats, "rows": rows,
            "outside_kernel_share": share, "ms_per_token_by_op": ops, "verify_cost_T(k+1)/T(1)": verify,
            "int8_greedy_agreement_with_exact": agree, **checks,
            "targets": _targets(rows, rate, checks, threads, n_pre, share, verify)}


def _targets(rows, rate, checks, threads, n_pre, share, verify) -> list[dict]:
    pre = {(r["weights"], r["threads"]): r[f"prefill_{n_pre}_tok_s"] for r in rows}
    one = threads[0]
    out = [goal("native logits == float32 logits", checks["native_equals_f32"], "true", checks["native_equals_f32"]),
           goal("bits independent of threads", checks["threads_equal_one_thread"], "true",
                checks["threads_equal_one_thread"])]
    d = rate["native", one] / rate["f32", one]
    out.append(goal(f"decode native / f32, {one} thread(s)", round(d, 3), ">= 2.5", d >= 2.5))
    p = pre["native", one] / pre["f32", one]
    out.append(goal(f"prefill {n_pre} native / f32, {one} thread(s)", round(p, 3), ">= 0.8", p >= 0.8))
    if 2 in threads and one == 1:
        s = rate["native", 2] / rate["native", 1]
        out.append(goal("native decode, 2 threads / 1 thread", round(s, 3), ">= 1.7", s >= 1.7))
    out.append(goal("native decode: share of a step outside C", round(share["native"], 3), "<= 0.05",
                    share["native"] <= 0.05))
    if ("int8", one) in rate:
        i = rate["int8", one] / rate["native", one]
        out.append(goal(f"decode int8 / exact numerics, {one} thread(s)", round(i, 3), "> 1", i > 1))
        v = verify["int8"][4]
        out.append(goal("verify cost T(5)/T(1), int8 numerics", round(v, 3), "<= 1.3", v <= 1.3))
    return out
