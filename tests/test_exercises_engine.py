"""Lesson 0 exercise checks: each rejects plausible wrong answers, passes the solutions, reports
a stub as not implemented, and never raises. The LRU reference is checked against a real
ExpertStore replaying the same traces."""
from collections import OrderedDict

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from lessonkit.exercises import engine_checks as check
from lessonkit.engine.expert_store import ExpertStore
from tests.exercise_util import run, solution_functions

NB = "00_engine"


# ---------------------------------------------------------------- plausible wrong answers

def rms_no_eps(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True)) * w


def rms_mean_not_squares(x, w, eps):
    return x / torch.sqrt(x.mean(-1, keepdim=True) + eps) * w


def rms_eps_outside(x, w, eps):
    return x / (torch.sqrt((x * x).mean(-1, keepdim=True)) + eps) * w


def rms_layernorm(x, w, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight=w, eps=eps)


def rms_fixed_eps(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w


def rms_no_weight(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def rms_dim0(x, w, eps):
    return x / torch.sqrt((x * x).mean(0, keepdim=True) + eps) * w


def route_no_renorm(logits, k, renormalize):
    return torch.topk(torch.softmax(logits, -1), k, dim=-1)


def route_always_renorm(logits, k, renormalize):     # softmax over the k picked logits only
    v, i = torch.topk(logits, k, dim=-1)
    return torch.softmax(v, -1), i


def route_naive_exp(logits, k, renormalize):
    p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    w, i = torch.topk(p, k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if renormalize else w), i


def route_lowest(logits, k, renormalize):
    p = torch.softmax(logits, -1)
    w, i = torch.topk(p, k, dim=-1, largest=False)
    return (w / w.sum(-1, keepdim=True) if renormalize else w), i


def route_ascending(logits, k, renormalize):
    w, i = route_no_renorm(logits, k, renormalize)
    w = w / w.sum(-1, keepdim=True) if renormalize else w
    return w.flip(-1), i.flip(-1)


def route_logit_weights(logits, k, renormalize):
    return torch.topk(logits, k, dim=-1)


def union_no_layers(ids):                             # one union over all layers
    u = sorted(set(np.asarray(ids).ravel().tolist()))
    return [u] * len(ids), np.asarray(ids).size - len(u)


def union_none(ids):                                  # every routed slot, duplicates and all
    return [np.asarray(layer).ravel().tolist() for layer in ids], 0


def union_saved_per_row(ids):                          # saving counted in rows, not routed slots
    per = [sorted(set(np.asarray(layer).ravel().tolist())) for layer in ids]
    L, N, k = np.asarray(ids).shape
    return per, L * N - sum(len(u) for u in per)


def union_first_row_only(ids):
    return [sorted(set(np.asarray(layer)[0].tolist())) for layer in ids], 0


def _lru(trace, eb, budget, pinned=(), *, evict="lru", refresh=True, cap_round=lambda b, e: b // e,
         pinned_in_budget=True, protect_pins=True, key=lambda k: tuple(k), bytes_per="miss", count_pins=False):
    pins = {key(p) for p in pinned}
    cache = OrderedDict((p, True) for p in pins)
    hits = misses = 0
    if count_pins:
        misses += len(pins)
    cap = None if budget is None else cap_round(budget, eb) + (0 if pinned_in_budget else len(pins))
    for k in map(key, trace):
        if k in cache:
            hits += 1
            if refresh:
                cache.move_to_end(k)
            continue
        misses += 1
        if cap is not None and len(cache) >= cap:
            cands = [c for c in cache if not (protect_pins and c in pins)]
            if cands:
                del cache[cands[0] if evict == "lru" else cands[-1]]
        cache[k] = True
    return hits, misses, (misses if bytes_per == "miss" else hits + misses) * eb


WRONG_LRU = {
    "lru_evicts_most_recent": dict(evict="mru"),
    "lru_fifo_no_refresh": dict(refresh=False),
    "lru_capacity_rounded_up": dict(cap_round=lambda b, e: -(-b // e)),
    "lru_pins_outside_budget": dict(pinned_in_budget=False),
    "lru_evicts_pinned": dict(protect_pins=False),
    "lru_keyed_by_expert_only": dict(key=lambda k: k[1]),
    "lru_bytes_for_every_access": dict(bytes_per="access"),
    "lru_counts_pin_loading": dict(count_pins=True),
}


def _wrong_lru(name):
    def f(trace, eb, budget, pinned=()):
        return _lru(trace, eb, budget, pinned, **WRONG_LRU[name])
    f.__name__ = name
    return f


WRONG = [
    (check.rms_norm, rms_no_eps, "without eps"),
    (check.rms_norm, rms_mean_not_squares, "mean of the squares"),
    (check.rms_norm, rms_eps_outside, "after the square root"),
    (check.rms_norm, rms_layernorm, "LayerNorm"),
    (check.rms_norm, rms_fixed_eps, "ignore the eps"),
    (check.rms_norm, rms_no_weight, "weight is missing"),
    (check.rms_norm, rms_dim0, "wrong dimension"),
    (check.top_k_routing, route_no_renorm, "renormalize=True"),
    (check.top_k_routing, route_always_renorm, "renormalize=False"),
    (check.top_k_routing, route_naive_exp, "overflow"),
    (check.top_k_routing, route_lowest, "has a higher probability"),
    (check.top_k_routing, route_ascending, "wrong order"),
    (check.top_k_routing, route_logit_weights, "raw router logits"),
    (check.batch_union, union_no_layers, "lists expert"),
    (check.batch_union, union_none, "times; the union loads each expert once"),
    (check.batch_union, union_saved_per_row, "loads saved is"),
    (check.batch_union, union_first_row_only, "not in your list"),
    (check.lru_counts, _wrong_lru("lru_evicts_most_recent"), "evicts the least recently used"),
    (check.lru_counts, _wrong_lru("lru_fifo_no_refresh"), "most recently used again"),
    (check.lru_counts, _wrong_lru("lru_capacity_rounded_up"), "rounded down"),
    (check.lru_counts, _wrong_lru("lru_pins_outside_budget"), "pinned"),
    (check.lru_counts, _wrong_lru("lru_evicts_pinned"), "never evicted"),
    (check.lru_counts, _wrong_lru("lru_keyed_by_expert_only"), "(layer, expert)"),
    (check.lru_counts, _wrong_lru("lru_bytes_for_every_access"), "a hit reads nothing"),
    (check.lru_counts, _wrong_lru("lru_counts_pin_loading"), "initial loading is not counted"),
]


@pytest.mark.parametrize("check_fn,wrong,phrase", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_each_check_rejects_a_plausible_wrong_answer(check_fn, wrong, phrase):
    ok, out = run(check_fn, wrong)
    assert ok is False
    assert phrase in out, out
    assert len(out.strip().splitlines()) == 1          # one plain line, the first failing case


NAMES = ["rms_norm", "top_k_routing", "batch_union", "lru_counts"]


@pytest.mark.parametrize("name", NAMES)
def test_the_solutions_pass(name):
    fn = solution_functions(NB)[name]
    ok, out = run(getattr(check, name), fn)
    assert ok is True, out
    assert "passed all" in out


@pytest.mark.parametrize("name", NAMES)
def test_a_stub_is_not_implemented_yet_and_nothing_raises(name):
    def stub(*args):
        raise NotImplementedError

    ok, out = run(getattr(check, name), stub)
    assert ok is False and out.strip() == f"{name}: not implemented yet"
    ok, out = run(getattr(check, name), lambda *a: "nonsense")
    assert ok is False and "returned" in out


def test_messages_do_not_give_the_answer():
    # a wrong loads-saved count is told its own number, never the right one
    def union_saved_global(ids):           # the saving counted against one union over all layers
        per = [sorted(set(np.asarray(layer).ravel().tolist())) for layer in ids]
        return per, np.asarray(ids).size - len(set(np.asarray(ids).ravel().tolist()))

    ok, out = run(check.batch_union, union_saved_global)
    assert not ok and "loads saved is 5:" in out and "2" not in out.split("is 5:")[1]
    ok, out = run(check.batch_union, lambda ids: union_saved_per_row(ids)[:1] + (0,))
    assert not ok and "is 0:" in out and " 1 " not in out.split("is 0:")[1]


def test_the_lru_reference_is_the_expert_store(tmp_path):
    """Replay every LRU case through a real ExpertStore: the same hits, misses and bytes read."""
    shape = (3, 2, 4)
    eb = 3 * 2 * 4 * 4
    for label, (trace, _, budget_scaled, pinned) in check._lru_cases():
        keys = {tuple(k) for k in trace} | {tuple(p) for p in pinned}
        L, E = max(k[0] for k in keys) + 1, max(k[1] for k in keys) + 1
        path = tmp_path / f"experts-{L}-{E}.safetensors"
        if not path.exists():
            save_file({f"layers.{l}.experts.{e}": torch.full(shape, float(10 * l + e))
                       for l in range(L) for e in range(E)}, str(path))
        _, eb_case, _, _ = dict(check._lru_cases())[label]
        budget = None if budget_scaled is None else budget_scaled // eb_case * eb + (budget_scaled % eb_case) * eb // eb_case
        store = ExpertStore(path, L, E, shape, budget_bytes=budget)
        store.pin(pinned)
        store.reset_counters()
        for l, e in trace:
            store.get(l, e)
        ref, _ = check._ref_lru(trace, eb, budget, pinned)
        assert (store.hits, store.misses, store.bytes_read) == ref, label


def test_the_router_reference_is_the_engine():
    """The routing reference is the engine's own lines (softmax, torch.topk, optional renorm)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 8, generator=g)
    w, i, _ = check._ref_route(logits, 2, False)
    p = torch.softmax(logits, -1)
    tw, ti = torch.topk(p, 2, dim=-1)
    assert torch.equal(i, ti) and torch.allclose(w.float(), tw)
