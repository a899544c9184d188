"""Self-checks for the lesson 6 exercises (notebooks/exercises/06_stack.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import stack_checks as check
    check.compose_combined(my_compose_combined)
"""
from __future__ import annotations

import math
import random

from lessonkit.exercises import run_cases

SEED = 2026


# --------------------------------------------------------------------------- exercise 1: combined speed-up
def _ref_combined(plain_s, saved_s, calls_kept, cache_overhead_s):
    t = calls_kept * (plain_s - sum(saved_s)) + cache_overhead_s
    return plain_s / t


def _combined_cases():
    cases = [("no technique saves anything", (10.0, [0.0, 0.0, 0.0], 1.0, 0.0)),
             ("prefix cache only", (10.0, [4.0, 0.0, 0.0], 1.0, 0.0)),
             ("semantic cache only, no overhead", (10.0, [0.0, 0.0, 0.0], 0.5, 0.0)),
             ("semantic cache with an overhead", (10.0, [0.0, 0.0, 0.0], 0.75, 1.0)),
             ("savings on three parts, half the calls kept", (12.0, [5.0, 1.0, 2.0], 0.5, 0.6))]
    rng = random.Random(SEED)
    for i in range(20):
        plain = rng.uniform(5, 50)
        saved = [rng.uniform(0, plain / 4) for _ in range(3)]
        cases.append((f"random #{i + 1}", (plain, saved, rng.uniform(0.3, 1.0), rng.uniform(0, 2))))
    return cases


def _judge_combined(args, got):
    plain, saved, q, overhead = args
    try:
        got = float(got)
    except (TypeError, ValueError):
        return "return one number: the composed speed-up over the plain engine"
    want = _ref_combined(*args)
    if math.isclose(got, want, rel_tol=1e-6):
        return None
    product = plain / (q * plain + overhead) * math.prod(plain / (plain - x) for x in saved)
    if math.isclose(got, product, rel_tol=1e-6):
        return f"got {got:.4g}: that multiplies speed-ups; the savings add, on the engine calls the cache keeps"
    if math.isclose(got, plain / (plain - sum(saved) + overhead), rel_tol=1e-6):
        return f"got {got:.4g}: the semantic cache keeps only a fraction of the engine calls"
    if math.isclose(got, plain / (q * (plain - sum(saved))), rel_tol=1e-6):
        return f"got {got:.4g}: the semantic cache's own time (embedding, lookups) is missing"
    return f"got {got:.4g}, which is not the speed-up these savings, calls kept and overhead give"


def compose_combined(fn) -> bool:
    """fn(plain_s, saved_s: list of seconds each engine technique saves alone, calls_kept: the fraction of
    engine calls the semantic cache leaves, cache_overhead_s) -> the all-together speed-up these single rows compose
    (a breakdown of the run they come from, not a prediction made apart from it)."""
    return run_cases("compose_combined", fn, _combined_cases(), _judge_combined)


def on_this_machine(fn, smoke: bool = False) -> None:
    """Run a small ablation (the smoke preset; tiny-moe's judge, or the smoke engine) and print what fn composes
    from its single rows next to the measured all-together speed-up (a stub: the measurement only). Both come from
    the same run: the composition is a breakdown of it."""
    from lessonkit.measure import stack as measure
    from lessonkit.stack import PRESETS
    engine = measure.load_engine("smoke" if smoke else measure.available_models()[0])
    df, _, _ = measure.ablation(engine, PRESETS["smoke"], model_drafter="ngram")
    r = df.set_index("row")
    plain = float(r.loc["plain engine", "wall_s"])
    q = float(r.loc["semantic cache", "judge_calls"]) / max(float(r.loc["plain engine", "judge_calls"]), 1.0)
    overhead = float(r.loc["semantic cache", "wall_s"]) - q * plain
    saved = [plain - float(r.loc[n, "wall_s"]) for n in ("prefix cache", "grammar drafting", "model drafter")]
    measured = float(r.loc["all together", "speedup"])
    try:
        got = float(fn(plain, saved, q, overhead))
        print(f"{engine.name}: composed from the single rows {got:.2f}x, measured {measured:.2f}x "
              f"(engine calls kept {q:.0%}, savings {', '.join(f'{s:.2f} s' for s in saved)})")
    except NotImplementedError:
        print(f"{engine.name}: measured {measured:.2f}x; write compose_combined to compare")
