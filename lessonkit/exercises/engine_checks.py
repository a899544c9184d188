"""Self-checks for the lesson 0 exercises (notebooks/exercises/00_engine.ipynb).

Each check prints one plain line and returns True or False; the conventions they share (cases,
messages, stubs, exceptions) are in lessonkit/exercises/__init__.py.

    from lessonkit.exercises import engine_checks as check
    check.rms_norm(my_rms_norm)

The references are lessonkit's own: `lessonkit.engine.model.rms_norm`, the router lines of
`Transformer._moe`, the batch-union of `_moe`, and the LRU policy of `ExpertStore` (its tests replay
the same traces through a real store).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from lessonkit.exercises import fresh_args, run_cases
from lessonkit.engine.model import rms_norm as _lk_rms_norm

SEED = 2026


def _as_tensor(got, what: str):
    """(float64 tensor, None) or (None, problem)."""
    if got is None or isinstance(got, (str, bytes, dict)):
        return None, f"returned {type(got).__name__}; expected a tensor ({what})"
    try:
        t = got if isinstance(got, torch.Tensor) else torch.as_tensor(np.asarray(got, dtype=float))
        return t.detach().double(), None
    except (TypeError, ValueError, RuntimeError):
        return None, f"returned something that is not a tensor ({type(got).__name__}); expected {what}"


# --------------------------------------------------------------------------- exercise 1

def _rms_cases():
    g = torch.Generator().manual_seed(SEED)
    tiny = torch.tensor([[1e-4, -2e-4, 3e-4, 1e-4], [1.0, -2.0, 3.0, 0.5]])
    zero = torch.tensor([[0.5, -1.5, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    cases = [
        ("a 2x4 matrix, unit weight, eps 1e-5",
         (torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, -0.25, 2.0]]), torch.ones(4), 1e-5)),
        ("a row of tiny values next to a normal one", (tiny, torch.ones(4), 1e-5)),
        ("an all-zero row", (zero, torch.tensor([1.0, 2.0, 0.5, -1.0]), 1e-5)),
        ("a row whose values are all positive, weight not all ones",
         (torch.tensor([[3.0, 1.0, 2.0, 6.0, 4.0, 5.0]]), torch.tensor([0.5, 1.0, 1.5, 2.0, -1.0, 0.1]), 1e-6)),
        ("a large eps (0.1)", (torch.tensor([[0.3, -0.1, 0.2, 0.4], [2.0, 1.0, -3.0, 0.0]]), torch.ones(4), 0.1)),
        ("a 3-D input [2, 3, 8] (normalise over the last dimension)",
         (torch.randn(2, 3, 8, generator=g), torch.rand(8, generator=g) + 0.5, 1e-5)),
    ]
    for k in range(8):
        T, D = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(4, 65, (1,), generator=g))
        scale = float(10 ** torch.empty(1).uniform_(-2.5, 1.5, generator=g))
        x = torch.randn(T, D, generator=g) * scale + (torch.randn(1, D, generator=g) * scale if k % 2 else 0)
        w = torch.randn(D, generator=g) * 0.5 + 1.0
        eps = (1e-5, 1e-6, 1e-3)[k % 3]
        cases.append((f"random {k + 1} ({T}x{D}, values around {scale:.2g})", (x, w, eps)))
    return cases


def _rms_variants(x, w, eps):
    """Plausible mistakes, each computed in float64: (words, output)."""
    x, w = x.double(), w.double()
    ms = x.pow(2).mean(-1, keepdim=True)
    out = [
        ("you ignore the eps argument (a fixed eps?)", x / (ms + 1e-5).sqrt() * w),
        ("RMSNorm without eps: add eps to the mean of squares, inside the square root (it keeps a row "
         "of tiny or zero values from blowing up)", x / ms.sqrt() * w),
        ("eps is added after the square root; it belongs inside: sqrt(mean(x^2) + eps)", x / (ms.sqrt() + eps) * w),
        ("you divided by sqrt(mean(x) + eps); RMS is the root of the mean of the squares",
         x / (x.mean(-1, keepdim=True) + eps).sqrt() * w),
        ("you divided by sqrt(mean(|x|) + eps); RMS is the root of the mean of the squares",
         x / (x.abs().mean(-1, keepdim=True) + eps).sqrt() * w),
        ("you divided by the mean of |x|; RMS is the root of the mean of the squares",
         x / (x.abs().mean(-1, keepdim=True) + eps) * w),
        ("that is LayerNorm (it subtracts the mean); RMSNorm does not centre the row",
         (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt() * w),
        ("you used the sum of squares; RMS uses their mean (divide by the row length)",
         x / (x.pow(2).sum(-1, keepdim=True) + eps).sqrt() * w),
        ("the weight is missing: multiply the normalised row by the weight, element by element",
         x / (ms + eps).sqrt()),
    ]
    if x.dim() == 2 and x.shape[0] > 1:
        out.append(("you normalised over the wrong dimension: each row (the last dimension) is "
                    "normalised on its own", x / (x.pow(2).mean(0, keepdim=True) + eps).sqrt() * w))
    return out


def _judge_rms(args, got, fn):
    x, w, eps = args
    t, problem = _as_tensor(got, "the normalised input, same shape")
    if problem:
        return problem
    if tuple(t.shape) != tuple(x.shape):
        return f"returned shape {tuple(t.shape)}; expected the input's shape {tuple(x.shape)}"
    ref = _lk_rms_norm(x.double(), w.double(), eps)
    if torch.allclose(t, ref, rtol=1e-4, atol=1e-6):
        return None
    for words, v in _rms_variants(x, w, eps):
        if torch.allclose(t, v, rtol=1e-4, atol=1e-6, equal_nan=True):
            return words
    if not torch.isfinite(t).all():
        return "returned NaN or inf (a row of zeros must come out as zeros: that is what eps is for)"
    bad = (~torch.isclose(t, ref, rtol=1e-4, atol=1e-6)).reshape(-1, x.shape[-1])
    r, c = (int(i) for i in bad.nonzero()[0])
    return (f"row {r}, column {c} is {float(t.reshape(-1, x.shape[-1])[r, c]):.5g}, which is not RMSNorm: "
            "scale each row by 1 / sqrt(mean of its squares + eps), then multiply by the weight")


def rms_norm(fn) -> bool:
    """Exercise 1: fn(x, weight, eps) -> x / sqrt(mean(x^2 over the last dim) + eps) * weight."""
    return run_cases("rms_norm", fn, _rms_cases(), _judge_rms, judge_gets_fn=True)


# --------------------------------------------------------------------------- exercise 2

def _ref_route(logits: torch.Tensor, k: int, renormalize: bool):
    """The router lines of lessonkit.engine.model.Transformer._moe."""
    probs = torch.softmax(logits.double(), dim=-1)
    topw, topi = torch.topk(probs, k, dim=-1)
    if renormalize:
        topw = topw / topw.sum(-1, keepdim=True)
    return topw, topi, probs


def _route_cases():
    base = torch.tensor([[2.0, 0.5, 3.0, -1.0]])
    cases = [
        ("one token, 4 experts, top-2, no renormalisation", (base, 2, False)),
        ("one token, 4 experts, top-2, renormalised", (base, 2, True)),
        ("three tokens, 6 experts, top-1",
         (torch.tensor([[0.1, 0.4, -0.3, 0.9, 0.0, 0.2], [1.5, -2.0, 0.3, 0.2, 1.2, -0.1],
                        [-0.5, -0.4, -0.6, -0.9, -0.2, -1.0]]), 1, False)),
        ("k equal to the number of experts, renormalised",
         (torch.tensor([[0.3, -1.2, 2.2, 0.8], [1.0, 0.9, -0.7, 0.1]]), 4, True)),
        ("huge logits (exp overflows unless you subtract the row maximum)",
         (torch.tensor([[1000.0, 998.0, 995.0, 1001.5, 990.0], [-50.0, 800.0, 799.0, 10.0, 801.0]]), 2, False)),
        ("8 experts, top-3, renormalised",
         (torch.tensor([[0.2, 1.7, -0.4, 1.1, 0.9, -2.0, 1.4, 0.0]]), 3, True)),
    ]
    g = torch.Generator().manual_seed(SEED + 1)
    for k in range(12):
        E = (4, 8, 16, 64)[k % 4]
        T = int(torch.randint(1, 13, (1,), generator=g))
        top = int(torch.randint(1, min(8, E) + 1, (1,), generator=g))
        scale = float(torch.empty(1).uniform_(0.3, 6.0, generator=g))
        renorm = bool(k % 2)
        cases.append((f"random {k + 1} ({T} tokens, {E} experts, top-{top}, "
                      f"{'renormalised' if renorm else 'not renormalised'})",
                      (torch.randn(T, E, generator=g) * scale, top, renorm)))
    return cases


def _judge_route(args, got, fn):
    logits, k, renorm = args
    T, E = logits.shape
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"returned {type(got).__name__}; expected a pair (weights [T, k], expert ids [T, k])"
    w, problem = _as_tensor(got[0], "weights [T, k]")
    if problem:
        return "the weights: " + problem
    idx, problem = _as_tensor(got[1], "expert ids [T, k]")
    if problem:
        return "the expert ids: " + problem
    for name, t in (("weights", w), ("expert ids", idx)):
        if tuple(t.shape) != (T, k):
            return f"the {name} have shape {tuple(t.shape)}; expected ({T}, {k}): one row per token, k columns"
    if (idx != idx.round()).any() or (idx < 0).any() or (idx >= E).any():
        return f"the expert ids must be whole numbers from 0 to {E - 1}"
    idx = idx.long()
    if not torch.isfinite(w).all():
        return ("some weights are NaN or inf: exp of a large logit overflows; subtract each row's "
                "maximum before exponentiating (or use torch.softmax)")
    ref_w, ref_i, probs = _ref_route(logits, k, renorm)
    for r in range(T):
        ids = idx[r].tolist()
        dup = next((e for e in ids if ids.count(e) > 1), None)
        if dup is not None:
            return f"row {r} picks expert {dup} twice; the top-k experts are k different experts"
        if set(ids) != set(ref_i[r].tolist()):
            slot = next(j for j, e in enumerate(ids) if e not in ref_i[r].tolist())
            e = ids[slot]
            better = max((f for f in range(E) if f not in ids), key=lambda f: float(probs[r, f]))
            return (f"row {r}, slot {slot} picked expert {e} (router probability {float(probs[r, e]):.3g}), "
                    f"but expert {better} has a higher probability ({float(probs[r, better]):.3g}) and was "
                    f"not picked: take the k experts with the highest probabilities")
        if ids != ref_i[r].tolist():
            return (f"row {r} has the right experts in the wrong order: list them by weight, highest "
                    "first (torch.topk does)")
    if torch.allclose(w, ref_w, rtol=1e-4, atol=1e-6):
        return None
    r = int((~torch.isclose(w, ref_w, rtol=1e-4, atol=1e-6)).any(1).nonzero()[0])
    s = float(w[r].sum())
    p_top = torch.topk(probs, k, dim=-1).values
    if renorm and torch.allclose(w[r], p_top[r], rtol=1e-4, atol=1e-6):
        return (f"row {r}: the weights sum to {s:.3f}, but renormalize=True asks for top-k weights that "
                "sum to 1")
    if not renorm and abs(s - 1) < 1e-4 and k < E:
        return (f"row {r}: the weights sum to 1, but renormalize=False keeps each picked expert's "
                f"probability from the softmax over all {E} experts (no renormalisation)")
    lg = torch.topk(logits.double(), k, dim=-1).values
    if torch.allclose(w[r], lg[r], rtol=1e-4, atol=1e-6):
        return f"row {r}: the weights are raw router logits; turn the logits into probabilities with a softmax"
    if (w < 0).any() or (w > 1 + 1e-9).any():
        return f"row {r}: some weights are outside [0, 1], so they are not probabilities (softmax over the experts)"
    return (f"row {r}: the weight of expert {int(idx[r, 0])} is {float(w[r, 0]):.4g}, which is not its "
            f"router probability (softmax over all {E} logits of the row"
            f"{', then divided by the sum of the k picked' if renorm else ''})")


def top_k_routing(fn) -> bool:
    """Exercise 2: fn(router_logits [T, E], k, renormalize) -> (weights [T, k], expert ids [T, k]):
    softmax over the E experts, the k highest probabilities (highest first) and their experts; with
    renormalize the k weights are divided by their sum."""
    return run_cases("top_k_routing", fn, _route_cases(), _judge_route, judge_gets_fn=True)


# --------------------------------------------------------------------------- exercise 3

def _union_cases():
    cases = [
        ("one layer, two rows sharing an expert", (np.array([[[1, 3], [3, 5]]]),)),
        ("one row: nothing to share", (np.array([[[4, 0]], [[2, 7]]]),)),
        ("two layers, the same expert numbers in both", (np.array([[[0, 1], [1, 2]], [[1, 2], [2, 0]]]),)),
        ("every row routes the same experts", (np.array([[[6, 2], [2, 6], [6, 2], [2, 6]]]),)),
        ("top-1 routing, four layers",
         (np.array([[[0], [0], [1]], [[3], [2], [3]], [[5], [5], [5]], [[1], [4], [7]]]),)),
    ]
    rng = np.random.default_rng(SEED + 2)
    for k in range(10):
        L, N, E = int(rng.integers(1, 5)), int(rng.integers(1, 33)), int(rng.choice([8, 16, 64]))
        top = int(rng.integers(1, 5))
        p = rng.dirichlet(np.full(E, 0.5))                     # skewed routing, like a trained router
        ids = np.stack([np.stack([rng.choice(E, top, replace=False, p=p) for _ in range(N)])
                        for _ in range(L)])
        cases.append((f"random {k + 1} ({L} layers, {N} rows, {E} experts, top-{top})", (ids,)))
    return cases


def _judge_union(args, got, fn):
    (ids,) = args
    L, N, k = ids.shape
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"returned {type(got).__name__}; expected a pair (experts per layer, loads saved)"
    per_layer, saved = got
    if isinstance(per_layer, (str, bytes, dict)) or not hasattr(per_layer, "__len__"):
        return f"the experts per layer is a {type(per_layer).__name__}; expected one collection of expert ids per layer"
    if len(per_layer) != L:
        return (f"returned {len(per_layer)} collections of experts for an input with {L} layers: one per "
                "layer (an expert number in another layer is a different expert)")
    for l in range(L):
        try:
            mine = [int(e) for e in (per_layer[l].tolist() if hasattr(per_layer[l], "tolist") else per_layer[l])]
        except (TypeError, ValueError):
            return f"layer {l}: expected a collection of expert ids, got {type(per_layer[l]).__name__}"
        dup = next((e for e in mine if mine.count(e) > 1), None)
        if dup is not None:
            return f"layer {l} lists expert {dup} {mine.count(dup)} times; the union loads each expert once"
        routed = ids[l]
        for r in range(N):
            for e in routed[r].tolist():
                if e not in mine:
                    return f"layer {l}: row {r} routes to expert {e}, but it is not in your list for that layer"
        extra = next((e for e in mine if e not in routed), None)
        if extra is not None:
            return f"layer {l} lists expert {extra}, but no row routes to it in that layer"
    try:
        s = float(saved)
    except (TypeError, ValueError):
        return f"the loads saved is a {type(saved).__name__}; expected a whole number"
    ref = L * N * k - sum(len(set(ids[l].ravel().tolist())) for l in range(L))
    if s == ref:
        return None
    if s < 0:
        return f"the loads saved is {s:g}, negative: the union never loads more than one load per routed slot"
    return (f"the loads saved is {s:g}: without the union every row loads each of its k experts in every "
            "layer; with it each listed expert is loaded once; the saving is the difference, over all layers")


def batch_union(fn) -> bool:
    """Exercise 3: fn(expert_ids [L, N, k] ints) -> (experts per layer: L collections, each expert
    once; loads saved: L*N*k minus the number of unique (layer, expert) loads)."""
    return run_cases("batch_union", fn, _union_cases(), _judge_union, judge_gets_fn=True)


# --------------------------------------------------------------------------- exercise 4

def _ref_lru(trace, expert_bytes, budget_bytes, pinned=()):
    """ExpertStore's policy: a miss reads one expert and becomes most recent; while the cache is over
    budget, the least recently used unpinned expert other than the new one is evicted. Returns the
    counts and the per-access outcome."""
    pinned = {tuple(p) for p in pinned}
    cache: OrderedDict = OrderedDict((p, None) for p in pinned)
    hits = misses = 0
    outcome = []
    for key in trace:
        key = tuple(key)
        if key in cache:
            cache.move_to_end(key)
            hits += 1
            outcome.append(True)
            continue
        misses += 1
        outcome.append(False)
        cache[key] = None
        if budget_bytes is not None:
            while len(cache) * expert_bytes > budget_bytes:
                victim = next((k for k in cache if k not in pinned and k != key), None)
                if victim is None:
                    break
                del cache[victim]
    return (hits, misses, misses * expert_bytes), outcome


def _zipf_trace(rng, L, E, n, per_step):
    p = 1.0 / np.arange(1, E + 1) ** 1.1
    trace = []
    perm = [rng.permutation(E) for _ in range(L)]
    while len(trace) < n:
        for l in range(L):
            picks = rng.choice(E, per_step, replace=False, p=p / p.sum())
            trace += [(l, int(perm[l][e])) for e in sorted(picks)]
    return trace[:n]


def _lru_cases():
    A, B, C, D = (0, 0), (0, 1), (0, 2), (0, 3)
    cases = [
        ("unlimited budget (None)", ([A, B, A, C, B, A, D], 1000, None, ())),
        ("a budget of exactly one expert", ([A, A, B, A, B, B, C], 1000, 1000, ())),
        ("a hit makes an expert most recent again (budget of two)", ([A, B, A, C, A, B], 1000, 2000, ())),
        ("a loop over four experts with room for three", ([A, B, C, D] * 3, 500, 1500, ())),
        ("a budget that is not a whole number of experts", ([A, B, C, A, B, C, D, A], 1000, 2999, ())),
        ("the same expert number in two layers", ([(0, 1), (1, 1), (0, 1), (1, 1), (0, 2), (1, 2)], 100, 400, ())),
        ("a pinned hot set of two, room for two more",
         ([(0, 5), A, B, (1, 5), C, A, (0, 5), D, B, (1, 5), A], 1000, 4000, [(0, 5), (1, 5)])),
        ("a pinned hot set of one, room for one more",
         ([A, B, A, C, A, B, B], 1000, 2000, [A])),
    ]
    rng = np.random.default_rng(SEED + 3)
    for k in range(10):
        L, E = int(rng.integers(1, 5)), int(rng.choice([4, 8, 16]))
        n = int(rng.integers(20, 160))
        trace = _zipf_trace(rng, L, E, n, int(rng.integers(1, min(E, 4) + 1)))
        eb = int(rng.integers(1, 5)) * 4096
        n_pin = int(rng.integers(0, 3)) if k % 2 else 0
        pinned = [tuple(t) for t in dict.fromkeys(trace)][:n_pin]
        if k == 9:
            budget = None
        else:
            budget = int(rng.integers(n_pin + 1, L * E + 1)) * eb + int(rng.integers(0, eb))
        cases.append((f"random {k + 1} ({len(trace)} accesses, {L} layers x {E} experts, "
                      f"budget {'unlimited' if budget is None else f'{budget // eb} experts'}, {n_pin} pinned)",
                      (trace, eb, budget, pinned)))
    return cases


def _lru_triple(got):
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return None, f"returned {type(got).__name__}; expected three numbers (hits, misses, bytes_read)"
    try:
        vals = [float(v) for v in got]
    except (TypeError, ValueError):
        return None, "returned something that is not three numbers (hits, misses, bytes_read)"
    return vals, None


def _judge_lru(args, got, fn):
    trace, eb, budget, pinned = args
    vals, problem = _lru_triple(got)
    if problem:
        return problem
    (ref, outcome) = _ref_lru(trace, eb, budget, pinned)
    if vals == [float(v) for v in ref]:
        return None
    hits, misses, nbytes = vals
    if hits + misses != len(trace):
        return (f"hits + misses = {hits + misses:g}, but the trace has {len(trace)} accesses: each access is "
                "a hit or a miss (the pinned experts' initial loading is not counted)")
    # find the first access where the student's counts go wrong, by re-running on prefixes
    for i in range(1, len(trace) + 1):
        p, problem = _lru_triple(fn(*fresh_args((trace[:i], eb, budget, pinned))))
        if problem:
            return f"on the first {i} accesses: {problem}"
        (rh, rm, _), _ = _ref_lru(trace[:i], eb, budget, pinned)
        if (p[0], p[1]) != (rh, rm):
            break
    else:
        return (f"bytes_read is {nbytes:g}: each miss reads one expert of expert_bytes bytes from disk, and "
                "a hit reads nothing")
    key = tuple(trace[i - 1])
    was_hit = outcome[i - 1]
    where = f"access {i - 1} (layer {key[0]}, expert {key[1]})"
    pins = {tuple(q) for q in pinned}
    cap = "unlimited" if budget is None else str(budget // eb)
    pin_count = f" ({len(pins)} of them pinned)" if pins else ""
    earlier = [j for j in range(i - 1) if tuple(trace[j]) == key]
    between = len({tuple(t) for t in trace[earlier[-1] + 1:i - 1]} - {key}) if earlier else None
    if was_hit:
        if key in pins:
            return (f"{where}: you counted a miss, but it is pinned: pinned experts are resident from the "
                    "start and never evicted")
        return (f"{where}: you counted a miss, but it is still resident: only {between} other expert(s) were "
                f"used since its last use, and the cache holds {cap} experts{pin_count}. "
                "An LRU cache evicts the least recently used expert, and a hit makes an expert the most "
                "recently used again")
    if not earlier:
        other_layer = any(tuple(t)[1] == key[1] and tuple(t)[0] != key[0] for t in trace[:i - 1])
        hint = (" (the same expert number in another layer is a different expert: key the cache by "
                "(layer, expert))") if other_layer else ""
        return f"{where}: you counted a hit, but this is its first use, so it must be read from disk{hint}"
    pin_note = f"; {len(pins)} of them pinned, which take their room and are never evicted" if pins else ""
    return (f"{where}: you counted a hit, but it has been evicted: {between} other expert(s) were used since "
            f"its last use and the cache holds only {cap} experts (the budget in bytes divided by the "
            f"expert size, rounded down{pin_note}), and an LRU cache evicts the "
            "least recently used expert")


def lru_counts(fn) -> bool:
    """Exercise 4: fn(trace, expert_bytes, budget_bytes, pinned) -> (hits, misses, bytes_read) of an
    LRU expert cache with a byte budget (None = unlimited) and a pinned hot set that is resident
    from the start (not counted) and never evicted."""
    return run_cases("lru_counts", fn, _lru_cases(), _judge_lru, judge_gets_fn=True)
