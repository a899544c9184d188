"""Self-checks for the lesson 1 exercises (notebooks/exercises/01_speculative.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import spec_checks as check
    check.accept_greedy(my_accept_greedy)
"""
from __future__ import annotations

import math
import random

import torch

from lessonkit.exercises import NOT_IMPLEMENTED, call, run_cases

SEED = 2026
_SHARED = (torch.Generator,)                       # one random stream for a whole check: never copied
_ON_RAISE = "{name}: {error} (case '{label}')"   # this lesson names the case after the exception


def _call(name, fn, args):
    """(result, None) or (None, message); NotImplementedError -> 'not implemented yet'."""
    got, error = call(fn, args, shared=_SHARED)
    return got, error and f"{name}: {error}"


def _run(name, fn, cases, judge) -> bool:
    return run_cases(name, fn, cases, judge, shared=_SHARED, on_raise=_ON_RAISE)


# --------------------------------------------------------------------------- exercise 1: greedy rule
def _greedy_cases():
    cases = [("mismatch in the middle, later drafts right again", ([1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5])),
             ("all drafts right", ([5, 7, 9, 2], [5, 7, 9])),
             ("first draft wrong", ([5, 7, 9, 2], [4, 7, 9])),
             ("no drafts at all", ([8], [])),
             ("one draft, right", ([3, 3], [3]))]
    rng = random.Random(SEED)
    for i in range(30):
        k = rng.randint(1, 8)
        tgt = [rng.randrange(6) for _ in range(k + 1)]
        d = [t if rng.random() < 0.7 else rng.randrange(6) for t in tgt[:k]]
        cases.append((f"random #{i + 1} (k={k})", (tgt, d)))
    return cases


def _judge_greedy(args, got):
    tgt, draft = args
    if not (isinstance(got, tuple) and len(got) == 2):
        return "return a pair (accepted_tokens, bonus_token)"
    acc, bonus = got
    try:
        acc = [int(t) for t in acc]
        bonus = int(bonus)
    except (TypeError, ValueError):
        return "accepted_tokens must be a list of ints and bonus_token an int"
    n = 0
    while n < len(draft) and draft[n] == tgt[n]:
        n += 1
    if len(acc) > n:
        return f"accepted a draft token after the first mismatch at position {n}"
    if acc != draft[:len(acc)]:
        return "the accepted tokens are not a prefix of the draft"
    if len(acc) < n:
        return f"stopped accepting at position {len(acc)}, but the draft token there matches the target's pick"
    if bonus != tgt[n]:
        if n < len(draft) and bonus == draft[n]:
            return f"the bonus token is the rejected draft token at position {n}, not the target's own pick there"
        return f"the bonus token is not the target's pick at the position right after the {n} accepted drafts"
    return None


def accept_greedy(fn) -> bool:
    """fn(target_picks: list[int] (k+1), draft: list[int] (k)) -> (accepted: list[int], bonus: int)."""
    return _run("accept_greedy", fn, _greedy_cases(), _judge_greedy)


# --------------------------------------------------------------------------- exercise 2: rejection sampling
def _dists(V, seed, sharp):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(V, generator=g) * sharp, -1)
    return p, q


def _chi2_p(counts, probs):
    from scipy.stats import chisquare
    exp = probs.double() * counts.sum()
    obs = counts.double()
    big = exp >= 5
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = e > 0
    o, e = o[keep], e[keep]
    e = e * (o.sum() / e.sum())
    return float(chisquare(o.numpy(), e.numpy()).pvalue)


N_SAMPLES, ALPHA = 20_000, 1e-3


def rejection_sample(fn) -> bool:
    """fn(p, q, x, gen) -> (accepted: bool, token: int); p target probs, q draft probs, x ~ q drafted,
    gen a torch.Generator for all randomness. The emitted token must be distributed exactly as p."""
    name = "rejection_sample"
    gen = torch.Generator().manual_seed(SEED)
    # fixed cases first: they name the mistake precisely
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    fixed = [("p == q: every draft must be accepted", p.clone(), p.clone(), 1, lambda a, t: a and t == 1),
             ("p(x) = 0: the draft must be rejected", torch.tensor([0.0, 0.6, 0.4, 0.0]),
              torch.tensor([0.7, 0.1, 0.1, 0.1]), 0, lambda a, t: (not a) and t != 0),
             ("p(x) >= q(x): the draft must be accepted", torch.tensor([0.1, 0.8, 0.1, 0.0]),
              torch.tensor([0.4, 0.3, 0.2, 0.1]), 1, lambda a, t: a and t == 1)]
    for label, pp, qq, x, ok in fixed:
        for _ in range(20):
            got, err = _call(name, fn, (pp, qq, x, gen))
            if err:
                print(err if "not implemented" in err else f"{err} (case '{label}')")
                return False
            if not (isinstance(got, tuple) and len(got) == 2):
                print(f"{name}: return a pair (accepted, token)")
                return False
            a, t = bool(got[0]), int(got[1])
            if a and t != x:
                print(f"{name}: on case '{label}': you report the draft as accepted but emit another token")
                return False
            if not ok(a, t):
                print(f"{name}: on case '{label}': got accepted={a}")
                return False
    # the residual: after a rejection the token comes from norm(max(p - q, 0))
    pp, qq = torch.tensor([0.3, 0.3, 0.4, 0.0]), torch.tensor([0.0, 0.2, 0.8, 0.0])
    for _ in range(50):
        got, err = _call(name, fn, (pp, qq, 2, gen))
        if err:
            print(err)
            return False
        a, t = bool(got[0]), int(got[1])
        if not a and t not in (0, 1):
            print(f"{name}: after a rejection you emitted token {t}, where p(t) - q(t) <= 0: "
                  "the replacement must come from the residual max(p - q, 0), renormalised")
            return False
    # the distribution test
    for case, (V, sharp) in enumerate([(12, 1.5), (6, 2.5)]):
        p, q = _dists(V, SEED + case, sharp)
        counts = torch.zeros(V, dtype=torch.long)
        acc = 0
        for _ in range(N_SAMPLES // 2):
            x = int(torch.multinomial(q, 1, generator=gen))
            got, err = _call(name, fn, (p, q, x, gen))
            if err:
                print(err)
                return False
            counts[int(got[1])] += 1
            acc += bool(got[0])
        pv = _chi2_p(counts, p)
        if pv < ALPHA:
            freq = counts.double() / counts.sum()
            worst = int(torch.argmax((freq - p.double()).abs()))
            print(f"{name}: on random distribution #{case + 1} (V={V}, {N_SAMPLES // 2} samples) the emitted tokens "
                  f"are not distributed like the target's p (chi-square p-value {pv:.1e} < {ALPHA:g}); token {worst} "
                  f"is the most off: check the acceptance probability and the replacement distribution")
            return False
        want_acc = float(torch.minimum(p, q).sum())
        if abs(acc / (N_SAMPLES // 2) - want_acc) > 0.03:
            print(f"{name}: on random distribution #{case + 1} the output distribution is right but you accept "
                  f"{acc / (N_SAMPLES // 2):.1%} of drafts; the optimal rule accepts more (or less) often")
            return False
    print(f"{name}: passed (fixed cases + distribution test over {N_SAMPLES} samples, chi-square at {ALPHA:g})")
    return True


# --------------------------------------------------------------------------- exercise 3: expected tokens
def _expected_cases():
    cases = [("a = 0.5, k = 2", (0.5, 2)), ("a = 0, k = 4", (0.0, 4)), ("a = 1, k = 3", (1.0, 3)),
             ("k = 0", (0.7, 0)), ("a = 0.8, k = 5", (0.8, 5))]
    rng = random.Random(SEED)
    cases += [(f"random #{i + 1}", (round(rng.random(), 3), rng.randint(1, 10))) for i in range(20)]
    return cases


def _ref_expected(a, k):
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def _judge_expected(args, got):
    a, k = args
    try:
        v = float(got)
    except (TypeError, ValueError):
        return f"returned {type(got).__name__}; expected a number"
    want = _ref_expected(a, k)
    if math.isclose(v, want, rel_tol=1e-9, abs_tol=1e-12):
        return None
    if math.isclose(v, want - 1, rel_tol=1e-9, abs_tol=1e-12):
        return "off by exactly one token: every verify step also emits the target's own (bonus) token"
    return f"is wrong for a={a}, k={k}"


def expected_tokens(fn) -> bool:
    """fn(a, k) -> expected tokens emitted per verify step (i.i.d. acceptance a, k drafts)."""
    return _run("expected_tokens", fn, _expected_cases(), _judge_expected)


# --------------------------------------------------------------------------- exercise 4: best k
def _ref_best_k(acc, cost):
    best, best_v = 0, -1.0
    for k in range(len(cost)):
        e, run = 1.0, 1.0
        for i in range(k):
            run *= acc[i]
            e += run
        v = e / cost[k]
        if v > best_v + 1e-12:
            best, best_v = k, v
    return best


def _best_k_cases():
    cases = [("free verification, perfect drafts", ([1.0] * 6, [1.0] * 7)),
             ("verify cost grows fast", ([0.9] * 6, [1.0, 1.9, 2.8, 3.7, 4.6, 5.5, 6.4])),
             ("acceptance decays with position", ([0.9, 0.6, 0.3, 0.1, 0.05, 0.0], [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3])),
             ("drafter useless", ([0.0] * 4, [1.0, 1.1, 1.2, 1.3, 1.4])),
             ("measured curve with a jump at 5 rows", ([0.8] * 8, [1.0, 1.02, 1.04, 1.06, 1.7, 1.72, 1.74, 1.76, 1.78]))]
    rng = random.Random(SEED)
    for i in range(25):
        n = rng.randint(2, 8)
        a0 = rng.random()
        acc = [max(0.0, min(1.0, a0 - 0.08 * j + rng.uniform(-0.05, 0.05))) for j in range(n)]
        cost = [1.0]
        for _ in range(n):
            cost.append(cost[-1] + rng.uniform(0.0, 0.5))
        cases.append((f"random #{i + 1}", (acc, cost)))
    return cases


def _judge_best_k(args, got):
    acc, cost = args
    if isinstance(got, bool) or not isinstance(got, int):
        try:
            if float(got) != int(got):
                return f"returned {got!r}; expected an integer k"
            got = int(got)
        except (TypeError, ValueError):
            return f"returned {type(got).__name__}; expected an integer k"
    if not 0 <= got < len(cost):
        return f"k={got} is outside 0 .. {len(cost) - 1} (cost[k] is the verify forward with k+1 rows)"
    want = _ref_best_k(acc, cost)
    if got != want:
        return (f"k={got} is not the k that maximises expected tokens per unit of verify cost "
                "(E(k) = 1 + a1 + a1*a2 + ..., cost[k] for k drafts)")
    return None


def best_k(fn) -> bool:
    """fn(acceptance: list[float] (a_i = P(accept i | 1..i-1 accepted)), cost: list[float] (cost[k] =
    verify forward with k+1 rows, relative)) -> the k in 0..len(cost)-1 maximising E(k) / cost[k]."""
    return _run("best_k", fn, _best_k_cases(), _judge_best_k)


# --------------------------------------------------------------------------- exercise 5: distillation loss
def _distill_cases():
    g = torch.Generator().manual_seed(SEED)
    cases = []
    for i, (n, v, k) in enumerate([(1, 6, 2), (5, 12, 4), (3, 50, 8), (8, 30, 1), (4, 20, 20)]):
        logits = torch.randn(n, v, generator=g) * 3
        teacher = torch.softmax(torch.randn(n, v, generator=g) * 2, dim=-1)
        probs, ids = teacher.topk(k, dim=-1)
        cases.append((f"{n} positions, vocabulary {v}, top-{k}" + (" (the whole vocabulary)" if k == v else ""),
                      (logits, ids, probs)))
    sharp = torch.full((2, 8), -4.0)
    sharp[0, 3] = sharp[1, 5] = 6.0
    cases.append(("student already agrees with a confident teacher", (sharp, torch.tensor([[3, 1], [5, 0]]),
                                                                      torch.tensor([[0.9, 0.05], [0.97, 0.01]]))))
    return cases


def _ref_distill(logits, ids, probs):
    p = probs / probs.sum(-1, keepdim=True)
    return float(-(p * torch.log_softmax(logits.double(), -1).gather(-1, ids).double()).sum(-1).mean())


def _judge_distill(args, got):
    try:
        val = float(got)
    except (TypeError, ValueError, RuntimeError):
        return "return the loss as one number (a 0-dim tensor or a float)"
    ref = _ref_distill(*args)
    if not math.isfinite(val):
        return f"returned {val}"
    if abs(val - ref) > 1e-4 * max(1.0, abs(ref)):
        hint = ("is it a cross-entropy (minus the teacher-weighted log-softmax of the student), with the "
                "teacher's k probabilities renormalised to sum to 1 and the mean over positions?")
        return f"returned {val:.5f}, which is not the distillation loss: {hint}"
    return None


def distill_loss(fn) -> bool:
    """Exercise 5: cross-entropy of the student against the target's renormalised top-k distribution."""
    return _run("distill_loss", fn, _distill_cases(), _judge_distill)


# --------------------------------------------------------------------------- exercise 6: predict the speed-up
def _e_per_pos(acc, k):
    e, run = 1.0, 1.0
    for i in range(k):
        run *= acc[i]
        e += run
    return e


def _ref_predict(acc, c, cost, k):
    return _e_per_pos(acc, k) / (cost[k] / cost[0] + k * c)


def _predict_cases():
    cases = [("free drafts, free verification, perfect acceptance", ([1.0] * 4, 0.0, [1.0] * 5, 4)),
             ("free drafts, verify rows cost time", ([0.8, 0.7, 0.6, 0.5], 0.0, [0.01, 0.012, 0.014, 0.016, 0.018], 4)),
             ("drafts cost a tenth of a step", ([0.9, 0.8], 0.1, [0.02, 0.021, 0.022], 2)),
             ("k = 0: no drafting at all", ([0.9], 0.2, [0.01, 0.011], 0)),
             ("acceptance decays, cost curve in seconds", ([0.9, 0.5, 0.2], 0.05, [0.008, 0.009, 0.011, 0.013], 3))]
    rng = random.Random(SEED + 6)
    for i in range(20):
        k = rng.randint(1, 6)
        acc = [rng.random() for _ in range(k)]
        t1 = rng.uniform(0.005, 0.1)
        cost = [t1]
        for _ in range(k):
            cost.append(cost[-1] + t1 * rng.uniform(0.0, 0.4))
        cases.append((f"random #{i + 1} (k={k})", (acc, rng.uniform(0, 0.5), cost, k)))
    return cases


def _judge_predict(args, got):
    acc, c, cost, k = args
    try:
        got = float(got)
    except (TypeError, ValueError):
        return "return one number: the predicted speed-up over plain greedy"
    want = _ref_predict(*args)
    if math.isclose(got, want, rel_tol=1e-6):
        return None
    iid = (1 - acc[0] ** (k + 1)) / (1 - acc[0]) if acc and acc[0] < 1 else k + 1.0
    if k and math.isclose(got, iid / (cost[k] / cost[0] + k * c), rel_tol=1e-6) and not math.isclose(iid, _e_per_pos(acc, k)):
        return f"got {got:.4g}: that uses a_1 at every position; acceptance is per position here"
    if math.isclose(got, _e_per_pos(acc, k) / (1 + k * c), rel_tol=1e-6):
        return f"got {got:.4g}: that assumes a verify forward costs one plain step; use the cost curve"
    if math.isclose(got, _e_per_pos(acc, k) / (cost[k] / cost[0]), rel_tol=1e-6):
        return f"got {got:.4g}: the k drafts cost k c plain steps too"
    if math.isclose(got, (_e_per_pos(acc, k) - 1) / (cost[k] / cost[0] + k * c), rel_tol=1e-6):
        return f"got {got:.4g}: count the bonus token (every verify step emits at least one)"
    return f"got {got:.4g}, which is not E(k) / (T(k+1)/T(1) + k c) for this case"


def predict_speedup(fn) -> bool:
    """fn(acceptance: a_1..a_k, c, cost: seconds of a forward of 1..k+1 rows, k) -> E(k) / (T(k+1)/T(1) + k c)."""
    return _run("predict_speedup", fn, _predict_cases(), _judge_predict)


# --------------------------------------------------------------------------- exercise 7: best k when drafts cost
def _ref_best_k_priced(acc, cost, c):
    best, best_v = 0, -1.0
    for k in range(len(cost)):
        v = _e_per_pos(acc, k) / (cost[k] / cost[0] + k * c)
        if v > best_v + 1e-12:
            best, best_v = k, v
    return best


def _best_k_priced_cases():
    cases = [("free drafts: the c = 0 answer", ([0.9] * 6, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3], 0.0)),
             ("costly drafts shorten k", ([0.9] * 6, [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3], 0.3)),
             ("drafts cost more than they bring: k = 0", ([0.3] * 4, [1.0, 1.1, 1.2, 1.3, 1.4], 0.5)),
             ("a cheap drafter with decaying acceptance", ([0.95, 0.9, 0.6, 0.3, 0.1], [1.0, 1.02, 1.04, 1.06, 1.3, 1.32], 0.05))]
    rng = random.Random(SEED + 7)
    for i in range(20):
        n = rng.randint(2, 8)
        acc = [max(0.0, min(1.0, rng.random() - 0.05 * j)) for j in range(n)]
        cost = [1.0]
        for _ in range(n):
            cost.append(cost[-1] + rng.uniform(0.0, 0.4))
        cases.append((f"random #{i + 1}", (acc, cost, rng.uniform(0.0, 0.6))))
    return cases


def _judge_best_k_priced(args, got):
    acc, cost, c = args
    try:
        if isinstance(got, bool) or float(got) != int(got):
            return f"returned {got!r}; expected an integer k"
        got = int(got)
    except (TypeError, ValueError):
        return f"returned {type(got).__name__}; expected an integer k"
    if not 0 <= got < len(cost):
        return f"k={got} is outside 0 .. {len(cost) - 1}"
    want = _ref_best_k_priced(acc, cost, c)
    if got != want:
        if got == _ref_best_k(acc, cost):
            return f"k={got} is the best k when drafts are free; here each draft costs c = {c:.3g} plain steps"
        return f"k={got} does not maximise E(k) / (cost[k] / cost[0] + k c)"
    return None


def best_k_priced(fn) -> bool:
    """fn(acceptance, cost (relative or seconds), c) -> the k maximising E(k) / (cost[k] / cost[0] + k c)."""
    return _run("best_k_priced", fn, _best_k_priced_cases(), _judge_best_k_priced)


def on_this_machine(predict, best_k_fn=None, smoke: bool = False, seed: int = 0) -> None:
    """Measure tiny-moe with its draft model here: a_i and c on some corpus prompts, the verify cost curve on its
    own forwards, then the speed-up at k = 4 on *other* prompts (plain and speculative interleaved). Your
    prediction reads only the first two (`measure.apart.check_apart` refuses a timed prompt among them) and is
    printed next to the measurement, with your best k at that c. A stub leaves its line out."""
    from lessonkit.engine.generate import generate
    from lessonkit.measure.apart import check_apart
    from lessonkit.measure.speculative import measure_apart
    from lessonkit.models.registry import load_model
    from lessonkit.speculative.drafters import ModelDrafter
    from lessonkit.speculative.gate import acceptance_by_position, measure_cost_curve
    from lessonkit.speculative.verify import speculative_generate, total_stats
    from lessonkit.workloads.corpus import prompts_by_kind
    from lessonkit.engine.threads import pin_torch_threads
    pin_torch_threads(1)
    target, draft = load_model("tiny-moe"), load_model("tiny-draft")
    prompts = [p for ps in prompts_by_kind(target, n=1, max_tokens=48, seed=seed).values() for p in ps]
    others = [p for ps in prompts_by_kind(target, n=1, max_tokens=48, seed=seed + 1).values() for p in ps]
    n_new, k = (8, 2) if smoke else (48, 4)
    cost = measure_cost_curve(target, 6, repeats=2 if smoke else 10)
    apart = measure_apart(target, ModelDrafter(draft), others, k=k, max_new_tokens=n_new, cost=cost,
                          source="other corpus prompts (seed + 1)")
    check_apart(apart, prompts)
    plain = spec = None
    for _ in range(1 if smoke else 2):        # plain and speculative in each round; the fastest counts
        p = total_stats([generate(target, q, n_new).stats for q in prompts])
        s = total_stats([speculative_generate(target, ModelDrafter(draft), q, n_new, k=k).stats for q in prompts])
        plain = p if plain is None or p["wall_s"] < plain["wall_s"] else plain
        spec = s if spec is None or s["wall_s"] < spec["wall_s"] else spec
    acc, c = list(apart.acceptance), apart.c
    measured, timed_acc = plain["wall_s"] / spec["wall_s"], acceptance_by_position(spec)
    print(f"measured apart (other prompts): a_i = {', '.join(f'{a:.2f}' for a in acc)}, c = {c:.3f}; T(k+1)/T(1) = "
          f"{', '.join(f'{t / cost[0]:.2f}' for t in cost)}; timed: speed-up at k = {k}: {measured:.2f}x "
          f"(its own a_i {', '.join(f'{a:.2f}' for a in timed_acc)}, which no prediction reads)")
    got, error = call(predict, (acc, c, cost, k))
    if error and error != NOT_IMPLEMENTED:
        print(f"predict_speedup: {error}")
    elif error is None:
        print(f"your prediction at k = {k}: {float(got):.2f}x (the prefill, which drafting does not shorten, is "
              "left out of the formula)")
    if best_k_fn is not None:
        padded = (acc + [acc[-1] if acc else 0.0] * len(cost))[:len(cost) - 1]
        got, error = call(best_k_fn, (padded, cost, c))
        if error and error != NOT_IMPLEMENTED:
            print(f"best_k_priced: {error}")
        elif error is None:
            print(f"your best k with this c (positions past {k} take a_{k}): {got}")


# --------------------------------------------------------------------------- exercise 8: the verify cost model
def _ref_verify_cost(t1, t2, k):
    b = (2 * t1 - t2) / (t2 - t1) if t2 > t1 else math.inf       # (b + 2)/(b + 1) = T(2)/T(1)
    return 1.0 if math.isinf(b) else (max(b, 0.0) + k + 1) / (max(b, 0.0) + 1)


def _judge_verify_cost(args, got):
    t1, t2, k = args
    try:
        got = float(got)
    except (TypeError, ValueError):
        return "return one number: the predicted T(k+1)/T(1)"
    if math.isclose(got, _ref_verify_cost(t1, t2, k), rel_tol=1e-6):
        return None
    why = {k + 1.0: "a pass per row; the weights are read and built once for all rows",
           (3 + k + 1) / 4: "b = 3 is the exact path's operation count; fit b to this case's T(2)/T(1)",
           _ref_verify_cost(t1, t2, k - 1) if k else -1: "a verify of k drafts has k + 1 rows"}
    hit = next((w for v, w in why.items() if math.isclose(got, v, rel_tol=1e-6)), None)
    return f"got {got:.4g}: " + (hit or "not (b + M)/(b + 1) with M = k + 1 and b from T(2)/T(1)")


def verify_cost(fn) -> bool:
    """Exercise 8: fn(t1, t2, k) -> (b + k + 1)/(b + 1), b fitted so that the model gives T(2)/T(1) = t2/t1."""
    rng = random.Random(SEED + 8)
    cases = [("the exact path's shape: b = 3", (1.0, 1.25, 4)), ("rows nearly free: a large b", (0.01, 0.0101, 4)),
             ("a pass per row: b = 0", (0.02, 0.04, 3)), ("k = 1: the measured step itself", (0.005, 0.007, 1))]
    cases += [(f"random #{i + 1}", (t := rng.uniform(0.002, 0.05), t * rng.uniform(1.01, 1.9), rng.randint(1, 8)))
              for i in range(20)]
    return _run("verify_cost", fn, cases, _judge_verify_cost)


def verify_cost_on_this_machine(fn, smoke: bool = False) -> None:
    """Your predicted T(k+1)/T(1) (from T(1) and T(2) of tiny-moe measured here) next to the measured curve."""
    from lessonkit.models.registry import load_model
    from lessonkit.speculative.gate import measure_cost_curve
    cost = measure_cost_curve(load_model("tiny-moe"), 4 if smoke else 7, repeats=2 if smoke else 10)
    got = [call(fn, (cost[0], cost[1], k)) for k in range(len(cost))]
    if any(e for _, e in got):
        print("verify_cost: " + next(e for _, e in got if e))
        return
    print("k: measured T(k+1)/T(1) | your prediction: " + ", ".join(
        f"{k}: {t / cost[0]:.2f} | {float(g):.2f}" for k, (t, (g, _)) in enumerate(zip(cost, got))))
