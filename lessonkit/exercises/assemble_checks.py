"""Self-check for lesson 1's last exercise (issue 59, item 7): a greedy speculative decoder assembled from the
pieces of the earlier exercises (exercise 1's acceptance rule inside the loop, exercise 6's prediction beside the
clock), as minbpe ends in "match tiktoken". The check compares the decoder's tokens with plain greedy's, token for
token (==), over drafters that are always right, sometimes right and never right, and several draft lengths; then
it times the decoder against plain greedy and prints the measurement beside the student's own prediction (from
statistics measured apart, on other prompts). The conventions it follows are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import assemble_checks as assemble
    assemble.speculative_decoder(speculative_decode, predict_speedup, smoke=SMOKE)
"""
from __future__ import annotations

from lessonkit.exercises import NOT_IMPLEMENTED, call

NAME = "speculative_decoder"


def _drafters(target, draft_engine, horizon: int) -> dict:
    """name -> a function making a fresh drafter (each case starts from its own)."""
    from lessonkit.speculative.drafters import ModelDrafter, NGramDrafter, OracleDrafter
    return {"an oracle that is always right": lambda: OracleDrafter(target, 0.0, seed=1, horizon=horizon),
            "an oracle wrong 30% of the time": lambda: OracleDrafter(target, 0.3, seed=2, horizon=horizon),
            "an oracle that is never right": lambda: OracleDrafter(target, 1.0, seed=3, horizon=horizon),
            "prompt lookup (n-gram)": NGramDrafter,
            "the tiny-draft model": lambda: ModelDrafter(draft_engine, name="tiny-draft")}


def _problem(got, want, n_new: int) -> str | None:
    """None when got == want, else what is wrong with it (never the expected tokens)."""
    if not isinstance(got, list):
        return f"returned a {type(got).__name__}, not a list of token ids"
    if got == want:
        return None
    if len(got) != n_new:
        return f"returned {len(got)} tokens for max_new_tokens = {n_new} (stop at exactly max_new_tokens)"
    first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    return (f"token {first} differs from plain greedy's: after a rejected draft, roll the cache back to the "
            "accepted prefix and emit the target's own pick there (the bonus token)")


def _exact(fn, target, draft_engine, prompts, n_new: int, ks) -> bool:
    from lessonkit.engine.generate import generate
    cases = 0
    for label, make in _drafters(target, draft_engine, n_new + max(ks) + 2).items():
        for k in ks:
            for p in prompts:
                want = generate(target, p, n_new, use_eos=False).token_ids
                got, error = call(fn, (target, make(), p, n_new, k), shared=(object,))
                if error == NOT_IMPLEMENTED:
                    print(f"{NAME}: {NOT_IMPLEMENTED}")
                    return False
                problem = error or _problem(got, want, n_new)
                if problem:
                    print(f"{NAME}: with {label}, k = {k}, {len(p)}-token prompt: {problem}")
                    return False
                cases += 1
    print(f"{NAME}: token for token plain greedy's in all {cases} cases (5 drafters, k = "
          f"{', '.join(map(str, ks))}, {len(prompts)} prompts)")
    return True


def _timed(fn, target, draft_engine, prompts, n_new: int, k: int, rounds: int) -> float:
    """Plain greedy over the student's decoder (tiny-draft at k), the fastest of `rounds` interleaved rounds each."""
    import time
    from lessonkit.engine.generate import generate
    from lessonkit.speculative.drafters import ModelDrafter
    best = {"plain": float("inf"), "yours": float("inf")}
    for _ in range(rounds):
        t0 = time.perf_counter()
        for p in prompts:
            generate(target, p, n_new, use_eos=False)
        t1 = time.perf_counter()
        for p in prompts:
            fn(target, ModelDrafter(draft_engine, name="tiny-draft"), p, n_new, k)
        t2 = time.perf_counter()
        best = {"plain": min(best["plain"], t1 - t0), "yours": min(best["yours"], t2 - t1)}
    return best["plain"] / best["yours"]


def speculative_decoder(fn, predict=None, *, smoke: bool = False, seed: int = 0) -> bool:
    """Check `fn(target, drafter, prompt, max_new_tokens, k) -> list of token ids` on tiny-moe: equal to plain
    greedy (==) for five drafters, k = 1, 2 and 4, over corpus prompts; when it is, time it with tiny-draft at k = 4
    on other prompts and print the speed-up beside `predict(acceptance, c, cost, k)` (exercise 6) fed a_i and c
    measured apart and the verify cost curve. Returns whether the tokens matched; the timing never fails it."""
    from lessonkit.engine.threads import pin_torch_threads
    from lessonkit.measure.apart import check_apart
    from lessonkit.measure.speculative import measure_apart
    from lessonkit.models.registry import load_model
    from lessonkit.speculative.drafters import ModelDrafter
    from lessonkit.speculative.gate import measure_cost_curve
    from lessonkit.workloads.corpus import prompts_by_kind
    pin_torch_threads(1)
    target, draft_engine = load_model("tiny-moe"), load_model("tiny-draft")
    timed, apart_prompts = ([p for ps in prompts_by_kind(target, n=1, max_tokens=48, seed=s).values() for p in ps]
                            for s in (seed, seed + 1))
    n_new, k = (8, 2) if smoke else (32, 4)
    if not _exact(fn, target, draft_engine, timed[:1] if smoke else timed, n_new, (1, 2) if smoke else (1, 2, 4)):
        return False
    cost = measure_cost_curve(target, k, repeats=2 if smoke else 10)
    apart = measure_apart(target, ModelDrafter(draft_engine, name="tiny-draft"), apart_prompts, k=k,
                          max_new_tokens=n_new, cost=cost, source="other corpus prompts (seed + 1)")
    check_apart(apart, timed)
    measured = _timed(fn, target, draft_engine, timed, n_new, k, 1 if smoke else 3)
    line = f"{NAME}: your decoder ran {measured:.2f}x plain greedy (tiny-moe, tiny-draft, k = {k}, timed prompts)"
    got, error = (None, NOT_IMPLEMENTED) if predict is None else call(predict, (list(apart.acceptance), apart.c, cost, k))
    if error is None and got is not None:
        line += (f"; your prediction from a_i and c measured apart: {float(got):.2f}x "
                 f"({100 * (measured / float(got) - 1):+.0f}% measured against predicted)")
    elif error != NOT_IMPLEMENTED:
        line += f"; predict_speedup: {error}"
    print(line)
    return True
