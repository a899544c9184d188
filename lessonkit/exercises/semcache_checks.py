"""Self-checks for the lesson 5 exercises (notebooks/exercises/05_semantic_cache.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import semcache_checks as check
    check.clopper_pearson_upper(my_upper_bound)

References: lessonkit.semcache.audit (clopper_pearson_upper, allows_serving) and, for the serving
rule, the one-sided policy of lessonkit.semcache.policies with a simplified guard (numbers and negations).
"""
from __future__ import annotations

import math
import random
import re

from lessonkit.exercises import run_cases

SEED = 2026
NEGATION_WORDS = {"not", "no", "never", "none", "without"}


# --------------------------------------------------------------------------- exercise 1

def _ref_upper(k, n, confidence):
    from lessonkit.semcache.audit import clopper_pearson_upper as ref
    return ref(k, n, confidence)


def _upper_cases():
    rng = random.Random(SEED)
    cases = [
        ("0 losses in 1 audit", (0, 1, 0.95)),
        ("0 losses in 30 audits", (0, 30, 0.95)),
        ("0 losses in 300 audits", (0, 300, 0.95)),
        ("1 loss in 20 audits", (1, 20, 0.95)),
        ("3 losses in 100 audits", (3, 100, 0.95)),
        ("2 losses in 5 audits", (2, 5, 0.95)),
        ("every audit a loss (4 of 4)", (4, 4, 0.95)),
        ("0 losses in 50 audits at 99% confidence", (0, 50, 0.99)),
        ("5 losses in 400 audits at 90% confidence", (5, 400, 0.90)),
    ]
    for _ in range(6):
        n = rng.randint(2, 2000)
        k = rng.randint(0, min(n, 12))
        c = rng.choice([0.9, 0.95, 0.99])
        cases.append((f"random: {k} losses in {n} audits at {c:.0%} confidence", (k, n, c)))
    return cases


def _upper_rule(args, got):
    from scipy.stats import binom
    k, n, c = args
    try:
        got = float(got)
    except (TypeError, ValueError):
        return f"returned {type(got).__name__}; expected a number between 0 and 1"
    if not (0.0 <= got <= 1.0) or math.isnan(got):
        return f"your bound {got!r} is not a rate between 0 and 1"
    ref = _ref_upper(k, n, c)
    if abs(got - ref) <= 1e-7 * max(1.0, ref):
        return None
    if k == n:
        return "when every audit was a loss, no rate below 1 can be ruled out"
    if got < k / n:
        return f"your bound {got:.4g} is below the observed rate {k}/{n}; an upper bound cannot be"
    if k == 0 and got == 0.0:
        return "zero losses in a finite sample does not bound the rate by zero"
    tail = binom.cdf(k, n, got)
    return (f"your bound {got:.6g} is not the one-sided Clopper-Pearson upper bound: at that rate the "
            f"chance of seeing at most {k} losses in {n} audits is {tail:.4f}, but it should be exactly "
            f"{1 - c:.2f} (1 - confidence)")


def clopper_pearson_upper(fn) -> bool:
    """fn(losses, audits, confidence) -> one-sided Clopper-Pearson upper bound on the loss rate."""
    return run_cases("clopper_pearson_upper", fn, _upper_cases(), _upper_rule)


# --------------------------------------------------------------------------- exercise 2

def _serve_ref(k, n, limit, c):
    return k == 0 or _ref_upper(k, n, c) <= limit


def _serving_cases():
    rng = random.Random(SEED + 1)
    cases = [
        ("no audits yet", (0, 0, 0.05, 0.95)),
        ("0 losses in 3 audits, limit 5%", (0, 3, 0.05, 0.95)),
        ("1 loss in 1 audit, limit 10%", (1, 1, 0.10, 0.95)),
        ("1 loss in 20 audits (observed 5%), limit 10%", (1, 20, 0.10, 0.95)),
        ("1 loss in 100 audits, limit 10%", (1, 100, 0.10, 0.95)),
        ("1 loss in 60 audits, limit 8%", (1, 60, 0.08, 0.95)),
        ("4 losses in 100 audits (observed 4%), limit 5%", (4, 100, 0.05, 0.95)),
        ("2 losses in 200 audits, limit 3%, 99% confidence", (2, 200, 0.03, 0.99)),
        ("2 losses in 200 audits, limit 3%, 90% confidence", (2, 200, 0.03, 0.90)),
    ]
    for _ in range(8):
        n = rng.randint(1, 500)
        k = rng.randint(0, min(n, 6))
        lim = rng.choice([0.02, 0.05, 0.1, 0.2])
        cases.append((f"random: {k} losses in {n} audits, limit {lim:.0%}", (k, n, lim, 0.95)))
    return cases


def _serving_rule(args, got):
    k, n, limit, c = args
    if not isinstance(got, (bool,)) and type(got).__name__ != "bool_":
        return f"returned {type(got).__name__}; expected True or False"
    want = _serve_ref(k, n, limit, c)
    if bool(got) == want:
        return None
    if k == 0:
        return "you stopped serving although no audit has found a loss yet"
    if got and k / n <= limit:
        return (f"you kept serving because the observed rate {k}/{n} is within the limit, but the "
                f"audit cannot rule out a loss rate above {limit:g} at {c:.0%} confidence")
    return (f"you {'kept serving' if got else 'stopped serving'}; compare the {c:.0%} one-sided "
            f"upper bound of the loss rate with the limit {limit:g}")


def allows_serving(fn) -> bool:
    """fn(losses, audits, limit, confidence) -> may the cache keep serving from this entry/policy?"""
    return run_cases("allows_serving", fn, _serving_cases(), _serving_rule)


# --------------------------------------------------------------------------- exercise 3

_NUM = re.compile(r"\d+(?:\.\d+)?")


def _negations(text):
    words = re.findall(r"[A-Za-z']+", text.lower())
    return sorted(w if not w.endswith("n't") else "n't" for w in words
                  if w in NEGATION_WORDS or w.endswith("n't"))


def _may_serve_ref(query, cached_query, cached_answer, similarity, threshold):
    return (cached_answer is False and similarity >= threshold
            and sorted(_NUM.findall(query)) == sorted(_NUM.findall(cached_query))
            and _negations(query) == _negations(cached_query))


def _serve_cases():
    q = "disk usage on web-01 is at 91%"
    cases = [
        ("an exact repeat of a cached 'no'", (q, q, False, 1.0, 0.85)),
        ("an exact repeat of a cached 'yes'", (q, q, True, 1.0, 0.85)),
        ("a paraphrase of a cached 'no' above the threshold",
         ("web-01: filesystem is 91% full", q, False, 0.91, 0.85)),
        ("a paraphrase of a cached 'no' below the threshold",
         ("web-01 reports 91% of its disk in use", q, False, 0.80, 0.85)),
        ("similarity exactly at the threshold", (q, q, False, 0.85, 0.85)),
        ("a number swap across the threshold", ("disk usage on web-01 is at 19%", q, False, 0.96, 0.85)),
        ("a negation added", ("backup of orders-db did not complete", "backup of orders-db did complete",
                              False, 0.95, 0.85)),
        ("a contracted negation added", ("backup of orders-db didn't complete", "backup of orders-db did complete",
                                         False, 0.95, 0.85)),
        ("the same numbers in another order (JSON keys)",
         ('{"status":503,"retries":4}', '{"retries":4,"status":503}', False, 0.97, 0.85)),
        ("digits moved across a decimal point", ("memory at 1.5 GB", "memory at 5.1 GB", False, 0.97, 0.85)),
        ("a number that appears twice in one and once in the other",
         ("5 of 5 retries failed", "5 retries failed", False, 0.93, 0.85)),
        ("a cached 'yes' that differs only in wording", ("ALERT disk 97% on web-02", "ALERT web-02 disk at 97%",
                                                         True, 0.95, 0.85)),
    ]
    rng = random.Random(SEED + 2)
    for _ in range(6):
        a = rng.randint(10, 99)
        b = rng.choice([a, a, rng.randint(10, 99)])
        ans = rng.choice([False, False, True])
        sim = round(rng.uniform(0.7, 1.0), 3)
        cases.append((f"random: {a}% vs {b}%, cached {'yes' if ans else 'no'}, similarity {sim}",
                      (f"cpu load on db-02 is {a}%", f"cpu load on db-02 is {b}%", ans, sim, 0.85)))
    return cases


def _serve_rule(args, got):
    query, cached, answer, sim, threshold = args
    if not isinstance(got, bool) and type(got).__name__ != "bool_":
        return f"returned {type(got).__name__}; expected True or False"
    want = _may_serve_ref(*args)
    if bool(got) == want:
        return None
    if got:
        if answer is not False:
            return "you served a cached 'yes'; the one-sided rule reuses only 'no' answers"
        if sim < threshold:
            return f"you served at similarity {sim} below the threshold {threshold}"
        if sorted(_NUM.findall(query)) != sorted(_NUM.findall(cached)):
            return f"you served {query!r} from {cached!r} although their numbers differ"
        return f"you served {query!r} from {cached!r} although one of them is negated and the other not"
    return (f"you refused to serve {query!r} from the cached 'no' for {cached!r} (similarity {sim}, "
            f"threshold {threshold}) although it is safe to reuse")


def may_serve(fn) -> bool:
    """fn(query, cached_query, cached_answer, similarity, threshold) -> serve the cached answer?"""
    return run_cases("may_serve", fn, _serve_cases(), _serve_rule)


def on_this_stream(upper_bound, seed: int = 0) -> None:
    """Lesson 5's guarded, audited cache on the stream's first items (recorded judge answers: seconds), then
    your bound for the losses and audits this run made, next to the lesson's."""
    from lessonkit.exercises import NOT_IMPLEMENTED, call
    from lessonkit.lessons.semantic_cache import LessonData
    from lessonkit.semcache.audit import AuditConfig
    from lessonkit.semcache.policies import make_policy, run_stream
    data = LessonData(smoke=True, live=False)
    g = run_stream(data.texts, make_policy("one-sided+guard"), data.judge, embeddings=data.embeddings,
                   audit=AuditConfig(rate=0.05, first_n=2, limit=0.10, seed=seed)).summary()
    line = (f"this stream ({g['queries']} queries): {g['hits']} hits, {g['audit_losses']} loss(es) in {g['audits']} "
            f"audits; the lesson's bound {g['audit_upper_bound']:.3f}")
    got, error = call(upper_bound, (g["audit_losses"], g["audits"]))
    if error is None:
        line += f", yours {float(got):.3f}"
    elif error != NOT_IMPLEMENTED:
        line += f"; upper_bound: {error}"
    print(line)
