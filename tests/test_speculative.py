"""Speculative decoding is lossless: greedy output == plain greedy (every drafter, every kind of text,
expert budgets from one expert to unlimited), and the sampler keeps the target's distribution."""
import pytest
import torch

from lessonkit.speculative.depth import parse_draft_depth as parse_draft_k
from lessonkit.engine import active, kernel
from lessonkit.engine.engine import Engine
from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate, probs_from_logits
from lessonkit.speculative.drafters import (Draft, Drafter, ModelDrafter, NGramDrafter, OracleDrafter, c_step_why_not,
                                            lean_decode_step)
from lessonkit.speculative.gate import DepthGate, expected_tokens, leviathan_speedup
from lessonkit.speculative.verify import speculative_generate, verify_greedy, verify_sampling
from lessonkit.drafter_registry import DRAFTERS, make_drafter
from lessonkit.workloads.corpus import prompts_by_kind
from tests.hf_tiny import make_hf

torch.set_num_threads(1)      # 2 shared cores: oversubscribed BLAS threads make tiny forwards ~50x slower
MAX_NEW = 10


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    _, target = make_hf("olmoe", d)
    _, draft = make_hf("llama", d, seed=1)
    return target, draft


def _budgets(model_dir):
    e = Engine(model_dir)
    one = e.expert_bytes / 2**20
    return [one, 4 * one, None]                   # one expert .. unlimited


def _drafters(target, draft_engine, horizon):
    model = [ModelDrafter(draft_engine)] if draft_engine is not None else []
    return model + [NGramDrafter()] + [OracleDrafter(target, p, seed=3, horizon=horizon) for p in (0.0, 0.3, 1.0)]


def _check_identical(model_dir, draft_dir, n_per_kind, max_new, ks=(1, 3, "auto")):
    """Each prompt runs at one budget and one k (cycling), every drafter sees every prompt."""
    engines = [Engine(model_dir, expert_budget_mb=b) for b in _budgets(model_dir)]
    ref_engine = Engine(model_dir)
    draft = Engine(draft_dir) if draft_dir is not None else None
    prompts = prompts_by_kind(ref_engine, n=n_per_kind, max_tokens=24)
    drafters = {id(e): _drafters(e, draft, max_new + 2) for e in engines}
    i = 0
    for kind, ps in prompts.items():
        assert len(ps) == n_per_kind, kind
        for p in ps:
            ref = generate(ref_engine, p, max_new).token_ids
            eng = engines[i % len(engines)]
            k = ks[i % len(ks)]
            for d in drafters[id(eng)]:
                out = speculative_generate(eng, d, p, max_new, k=k, cost=[1.0 + 0.1 * j for j in range(9)], learn_cost=False)
                assert out.token_ids == ref, f"{d.name} k={k} {kind} prompt {i}: {out.token_ids} != {ref}"
            i += 1
    return engines


def test_greedy_identical_every_drafter_tiny_random(tiny):
    target, draft = tiny
    _check_identical(target, draft, n_per_kind=20, max_new=MAX_NEW)


def test_oracle_paths_accept_all_mixed_reject_all(tiny):
    target, _ = tiny
    eng = Engine(target)
    p = prompts_by_kind(eng, n=1, max_tokens=16)["code"][0]
    ref = generate(eng, p, 20).token_ids
    r0 = speculative_generate(eng, OracleDrafter(eng, 0.0, horizon=40), p, 20, k=4)
    r3 = speculative_generate(eng, OracleDrafter(eng, 0.3, seed=1, horizon=40), p, 20, k=4)
    r1 = speculative_generate(eng, OracleDrafter(eng, 1.0, horizon=40), p, 20, k=4)
    assert r0.token_ids == r3.token_ids == r1.token_ids == ref
    assert r0.stats["acceptance_rate"] == 1.0 and r0.stats["forwards"] == 1 + 19 // 5 + (19 % 5 > 0)
    assert r0.stats["mean_acceptance_length"] == 1 + r0.stats["num_accepted_tokens"] / r0.stats["num_drafts"]
    assert 0.0 < r3.stats["acceptance_rate"] < 1.0
    assert r1.stats["num_accepted_tokens"] == 0 and r1.stats["forwards"] == 20
    pp = r3.stats["num_accepted_tokens_per_pos"]
    assert all(a >= b for a, b in zip(pp, pp[1:])) and sum(pp) == r3.stats["num_accepted_tokens"]


def test_verify_forward_row_invariant_after_rollback(tiny):
    """The k-row verify forward gives bit-identical rows to 1-row forwards, also after a rollback."""
    eng = Engine(tiny[0])
    toks = list(range(5, 45))
    c1 = eng.new_cache()
    eng.forward(toks[:30], c1)
    eng.forward([7, 8, 9], c1)
    c1.rollback(30)                                 # a rejected draft leaves garbage past the length
    many = eng.forward(toks[30:], c1)
    c2 = eng.new_cache()
    eng.forward(toks[:30], c2)
    one = torch.cat([eng.forward([t], c2) for t in toks[30:]])
    assert torch.equal(many, one)


def test_stop_tokens_and_max_new(tiny):
    eng = Engine(tiny[0])
    p = list(range(10, 30))
    ref = generate(eng, p, 16).token_ids
    stop = ref[5]
    a = generate(eng, p, 16, stop_token_ids=[stop]).token_ids
    b = speculative_generate(eng, OracleDrafter(eng, 0.0, horizon=30), p, 16, k=4, stop_token_ids=[stop]).token_ids
    assert a == b and a[-1] == stop
    for n in (0, 1, 2, 5):
        assert speculative_generate(eng, OracleDrafter(eng, 0.0), p, n, k=4).token_ids == ref[:n]


def test_depth_gate_stops_when_it_does_not_pay_and_goes_deep_when_it_does(tiny):
    eng = Engine(tiny[0])
    p = list(range(10, 30))
    cost = [1.0 + 0.2 * j for j in range(9)]
    bad = speculative_generate(eng, OracleDrafter(eng, 1.0, horizon=80), p, 60, k="auto", cost=cost, learn_cost=False)
    assert bad.stats["k_hist"].get(0, 0) > 40, bad.stats["k_hist"]          # stopped drafting ...
    assert sum(v for k, v in bad.stats["k_hist"].items() if k > 0) >= 2      # ... but still probes
    good = speculative_generate(eng, OracleDrafter(eng, 0.0, horizon=80), p, 60, k="auto", cost=cost, learn_cost=False)
    assert max(good.stats["k_hist"]) >= 4 and good.stats["forwards"] < 20
    gate = DepthGate([1.0] * 9)
    assert gate.best() == 8                         # free verification: draft as deep as allowed


def test_formulas():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12
    assert abs(leviathan_speedup(0.8, 4, 0.1) - (1 - 0.8 ** 5) / (0.2 * 1.4)) < 1e-12


def test_make_drafter_and_k_parsing(tiny):
    eng = Engine(tiny[0])
    assert isinstance(make_drafter("ngram", eng), NGramDrafter)
    assert make_drafter("ngram:2", eng).max_ngram == 2
    o = make_drafter("oracle:0.25", eng)
    assert isinstance(o, OracleDrafter) and o.error_rate == 0.25
    d = make_drafter(f"model:{tiny[1]}", eng)
    assert isinstance(d, Drafter) and isinstance(d, ModelDrafter)
    for bad in ("oracle", "oracle:x", "oracle:1.5", "nope", "ngram:x", ""):
        with pytest.raises(LessonkitError):
            make_drafter(bad, eng)
    assert parse_draft_k("auto") == "auto" and parse_draft_k("3") == 3
    for bad in ("-1", "x", None):
        with pytest.raises(LessonkitError):
            parse_draft_k(bad)
    with pytest.raises(LessonkitError):
        speculative_generate(eng, NGramDrafter(), [1, 2], 4, k=-2)
    assert {"tiny-draft", "smollm2-draft", "ngram", "oracle", "mtp"} <= set(DRAFTERS)


def test_ngram_prompt_lookup():
    d = NGramDrafter(max_ngram=2)
    assert d.propose([1, 2, 3, 9, 1, 2], 3).tokens == [3, 9, 1]
    assert d.propose([1, 2, 3, 4], 3).tokens == []
    assert d.propose([5, 6, 5], 2).tokens == [6, 5]


# ---- sampling: the distribution is the target's --------------------------------------------------------
V_SMALL, N_SAMPLES, TEMP = 16, 20_000, 1.0


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    _, t = make_hf("llama", d, seed=5, vocab_size=V_SMALL)
    _, q = make_hf("llama-tied", d, seed=6, vocab_size=V_SMALL)
    return Engine(t), Engine(q)


def _tables(eng, ctx):
    """probs after ctx, and after ctx + [x] for every x: [V] and [V, V]."""
    c = eng.new_cache()
    p0 = probs_from_logits(eng.forward(ctx, c)[-1], TEMP)
    p1 = []
    for x in range(V_SMALL):
        c.rollback(len(ctx))
        p1.append(probs_from_logits(eng.forward([x], c)[-1], TEMP))
    return p0, torch.stack(p1)


def _pair_counts(step, p0, p1, q0, q1, seed=0):
    """Simulate the speculative loop (k=2 drafts per step) until 2 tokens are emitted; count (t1, t2)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V_SMALL, V_SMALL, dtype=torch.long)
    filler = p0                                       # bonus row after 2 drafts: not looked at
    for _ in range(N_SAMPLES):
        d1 = int(torch.multinomial(q0, 1, generator=gen))
        d2 = int(torch.multinomial(q1[d1], 1, generator=gen))
        n, nxt = step(torch.stack([p0, p1[d1], filler]), [d1, d2], torch.stack([q0, q1[d1]]), gen)
        if n >= 1:
            t1, t2 = d1, (d2 if n == 2 else nxt)
        else:
            t1 = nxt
            e1 = int(torch.multinomial(q1[t1], 1, generator=gen))
            m, nxt2 = step(torch.stack([p1[t1], filler]), [e1], q1[t1][None], gen)
            t2 = e1 if m == 1 else nxt2
        counts[t1, t2] += 1
    return counts


def _chi2_pvalue(counts, expected_probs):
    from scipy.stats import chisquare
    exp = expected_probs.double().flatten() * counts.sum()
    obs = counts.double().flatten()
    big = exp >= 5                                    # pool cells with expected count < 5
    o = torch.cat([obs[big], obs[~big].sum()[None]]) if (~big).any() else obs[big]
    e = torch.cat([exp[big], exp[~big].sum()[None]]) if (~big).any() else exp[big]
    e = e * (o.sum() / e.sum())                       # float32 probabilities: renormalise exactly
    return float(chisquare(o.numpy(), e.numpy()).pvalue)


def _broken_accept_always(target_probs, draft_tokens, draft_probs, gen):
    return len(draft_tokens), int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=gen))


def _broken_resample_from_p(target_probs, draft_tokens, draft_probs, gen):
    for i, x in enumerate(draft_tokens):
        if float(torch.rand((), generator=gen)) * float(draft_probs[i][x]) < float(target_probs[i][x]):
            continue
        return i, int(torch.multinomial(target_probs[i], 1, generator=gen))   # should be the residual
    return len(draft_tokens), int(torch.multinomial(target_probs[-1], 1, generator=gen))


ALPHA = 1e-3     # the test fails a sampler when the chi-square p-value of the (t1, t2) joint is below 1e-3


def test_rejection_sampling_keeps_target_distribution_and_catches_broken_samplers(small_vocab):
    target, draft = small_vocab
    ctx = [1, 5, 3, 7]
    p0, p1 = _tables(target, ctx)
    q0, q1 = _tables(draft, ctx)
    tv = 0.5 * float((p0 - q0).abs().sum())
    assert tv > 0.2, f"draft too close to target for the test to have power (TV {tv:.3f})"
    joint = p0[:, None] * p1                          # the target's exact P(t1, t2)
    good = _chi2_pvalue(_pair_counts(verify_sampling, p0, p1, q0, q1), joint)
    assert good > ALPHA, f"correct sampler rejected: p={good:.2e}"
    for broken in (_broken_accept_always, _broken_resample_from_p):
        pv = _chi2_pvalue(_pair_counts(broken, p0, p1, q0, q1), joint)
        assert pv < ALPHA, f"{broken.__name__} not caught: p={pv:.2e}"


def test_sampling_end_to_end_runs_and_is_seeded(small_vocab):
    target, draft = small_vocab
    d = ModelDrafter(draft)
    a = speculative_generate(target, d, [1, 2, 3], 20, k=3, temperature=0.8, seed=4)
    b = speculative_generate(target, d, [1, 2, 3], 20, k=3, temperature=0.8, seed=4)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20
    assert a.stats["num_draft_tokens"] > 0
    n = speculative_generate(target, NGramDrafter(), [1, 2, 3, 1, 2], 20, k=2, temperature=1.0, top_p=0.9, seed=1)
    assert len(n.token_ids) == 20


def test_greedy_verify_rule():
    logits = torch.full((4, 6), -1.0)
    for i, t in enumerate([2, 4, 1, 5]):
        logits[i, t] = 1.0
    assert verify_greedy(logits, [2, 4, 1]) == (3, 5)
    assert verify_greedy(logits, [2, 3, 1]) == (1, 4)
    assert verify_greedy(logits, [0, 4, 1]) == (0, 2)
    assert verify_greedy(logits[:1], []) == (0, 2)


def test_greedy_picks_are_torch_argmax():
    """The picks read through numpy (generate.greedy_picks) are torch.argmax's, ties (the first), infinities and NaN
    (counted the largest) included, on float32 and on the dtypes torch keeps for itself."""
    from lessonkit.engine.generate import greedy_picks
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 49152, generator=g)
    x[1, 7] = x[1, 9] = x[1].max() + 1                  # a tie: the first
    x[2, 3] = float("inf")
    x[3, 11] = float("nan")
    x[4, :] = float("-inf")
    x[5] = torch.round(x[5])                            # many ties
    for t in (x, x[:, ::2], x.to(torch.bfloat16), x.to(torch.float64)):
        assert greedy_picks(t) == torch.argmax(t, dim=-1).tolist()
        assert greedy_picks(t[0]) == [int(torch.argmax(t[0]))]
    assert greedy_picks(x.numpy()) == torch.argmax(x, dim=-1).tolist()


# ---- trained models, when present ----------------------------------------------------------------------
def _registry(name, optional=False):
    from lessonkit.models.registry import resolve_model_dir
    try:
        return resolve_model_dir(name)[1]
    except Exception as e:
        if optional:
            return None
        pytest.skip(f"{name} not available: {e}")


def test_greedy_identical_tiny_moe_small():
    """tiny-moe with tiny-draft (when shipped), n-gram and the oracles."""
    target, draft = _registry("tiny-moe"), _registry("tiny-draft", optional=True)
    _check_identical(target, draft, n_per_kind=3, max_new=MAX_NEW)


@pytest.mark.slow
def test_greedy_identical_tiny_moe_full():
    target, draft = _registry("tiny-moe"), _registry("tiny-draft", optional=True)
    _check_identical(target, draft, n_per_kind=20, max_new=24)


def _ngram_identical(n_per_kind, max_new):
    d = _registry("smollm2-135m")
    eng = Engine(d)
    one = eng.expert_bytes / 2**20
    engines = [Engine(d, expert_budget_mb=one), eng]
    prompts = prompts_by_kind(eng, n=n_per_kind, max_tokens=32)
    i = 0
    for kind, ps in prompts.items():
        for p in ps:
            ref = generate(eng, p, max_new).token_ids
            e = engines[i % 2]
            out = speculative_generate(e, NGramDrafter(), p, max_new, k=(3 if i % 3 else "auto"),
                                       cost=[1.0 + 0.05 * j for j in range(9)])
            assert out.token_ids == ref, f"ngram {kind} prompt {i}"
            i += 1


def test_greedy_identical_smollm2_ngram_small():
    _ngram_identical(1, 8)


@pytest.mark.slow
@pytest.mark.budget(180, "60 prompts x 24 tokens of smollm2-135m, twice (all experts resident and one MLP streamed "
                         "from disk), each against plain greedy: the identity claim over a real workload")
def test_greedy_identical_smollm2_ngram_full():
    _ngram_identical(20, 24)


@pytest.mark.parametrize("which", [0, 1])
def test_lean_draft_step_follows_the_exact_forward(tiny, which):
    """ModelDrafter's lean one-token step (no exactness rules) stays within float noise of the engine's
    forward and picks the same tokens; the oracle keeps the exact path."""
    eng = Engine(tiny[which])
    toks = torch.randint(0, eng.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    exact, lean = eng.new_cache(), eng.new_cache()
    eng.forward(toks[:8], exact)
    eng.forward(toks[:8], lean)
    for t in toks[8:]:
        a = eng.forward([t], exact)[-1]
        b = lean_decode_step(eng.model, t, lean)
        assert lean.length == exact.length
        assert torch.allclose(a, b, atol=1e-4, rtol=0)
        assert int(a.argmax()) == int(b.argmax())
    # a drafter's step is lean only on the PyTorch path (the C paths are the engine's own C forward); the oracle
    # keeps the exact path
    assert ModelDrafter(eng).model.lean == (ModelDrafter(eng).model.step_path == "torch")
    assert ModelDrafter(eng, step="torch").model.lean
    assert not OracleDrafter(eng, 0.0, oracle_engine=eng).model.lean


def _greedy_steps(eng, context, k):
    """k greedy tokens after context through the engine's forward one token a call, and the cache it leaves."""
    cache = eng.new_cache()
    logits = eng.forward(context, cache)[-1]
    out = []
    for _ in range(k):
        out.append(int(logits.argmax()))
        if len(out) < k:
            logits = eng.forward([out[-1]], cache)[-1]
    return out, cache


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="the C kernel is not built: drafters take the PyTorch lean step")
def test_the_c_draft_step_is_the_engines_c_forward(tiny):
    """A dense draft model's "C" step is its own C forward: a greedy turn (catch-up rows and k drafts, argmax in C)
    in one call. A model whose turn cannot run in C (experts) drafts on the engine forward one call a token, and
    step="C" on it is refused by name."""
    draft = Engine(tiny[1])
    assert c_step_why_not(draft) is None
    assert ModelDrafter(draft).model.step_path == "C"
    assert ModelDrafter(draft, step="torch").model.step_path == "torch"
    moe = Engine(tiny[0])
    assert "mixture of experts" in c_step_why_not(moe)
    assert ModelDrafter(moe).model.step_path == ("engine forward" if moe.model.c_forward is not None else "torch")
    assert ModelDrafter(moe, step="torch").model.step_path == "torch"
    with pytest.raises(LessonkitError, match="no C draft step"):
        ModelDrafter(moe, step="C")
    with pytest.raises(LessonkitError, match="no draft turn in C: a mixture"):
        moe.model.c_forward.draft_greedy([1], moe.new_cache(), 0, 2)
    with pytest.raises(ValueError, match="expected auto, C or torch"):
        ModelDrafter(draft, step="fast")


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="Q8_0 blocks need the C kernel")
def test_a_draft_quantised_at_load_drafts_on_its_blocks(tiny):
    """A dense draft whose matrices are Q8_0 blocks (weights="q8_0") drafts on its C forward, which reads the
    blocks (the old float-strip draft step once read them as floats and proposed token 0 every time: the output
    stayed plain greedy's, the drafts were worthless); C and PyTorch steps propose the model's own greedy tokens."""
    draft = Engine(tiny[1], weights="q8_0")
    assert ModelDrafter(draft).model.step_path == "C"
    ctx = torch.randint(0, draft.config.vocab_size, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    want = list(ctx)
    for _ in range(4):
        want.append(int(draft.forward(want, draft.new_cache())[-1].argmax()))
    for step in ("auto", "C", "torch"):
        assert ModelDrafter(draft, step=step).propose(ctx, 4).tokens == want[len(ctx):], step


@pytest.mark.skipif(kernel.BACKEND not in ("avx2", "avx512"), reason="needs a vector path to compare with the portable one")
def test_a_c_draft_turn_same_bits_on_both_c_paths(tiny):
    """The vector and portable paths of a C draft turn draft the same tokens and leave the same cache bits (the C
    forward's numerics, docs/numerics.md); the mkl backend has no C forward, so the drafter says why."""
    ctx = torch.randint(0, 200, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    outs = []
    for name in (kernel.BACKEND, "portable"):
        with active.use(kernel=name):
            eng = Engine(tiny[1])
        d = ModelDrafter(eng)
        toks = d.propose(ctx, 6).tokens
        n = d.model.cache.length
        outs.append((toks, d.model.cache.k[:, :n].clone(), d.model.cache.v[:, :n].clone()))
    assert outs[0][0] == outs[1][0]
    assert torch.equal(outs[0][1], outs[1][1]) and torch.equal(outs[0][2], outs[1][2])
    with active.use(kernel="mkl"):
        eng = Engine(tiny[1])
    assert "no C forward" in c_step_why_not(eng)


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="the C kernel is not the active backend")
@pytest.mark.parametrize("n_context", [1, 3, 7])
def test_a_drafters_turn_in_one_call_equals_its_steps(tiny, n_context):
    """A greedy turn in one C call (the context the cache lacks, then k drafts with the argmax in C) drafts the
    argmax of each step of the engine's forward and leaves the KV cache bit for bit as those steps do."""
    draft = Engine(tiny[1])
    toks = torch.randint(0, draft.config.vocab_size, (8 + n_context,), generator=torch.Generator().manual_seed(11)).tolist()
    d = ModelDrafter(draft)
    d.propose(toks[:8], 2)                              # a cache that holds the first positions already
    got = d.propose(toks, 4).tokens
    want, steps = _greedy_steps(draft, toks, 4)
    assert got == want
    n = steps.length
    assert d.model.cache.length == n and d.model.ids == toks + want[:-1]
    assert torch.equal(d.model.cache.k[:, :n], steps.k[:, :n]) and torch.equal(d.model.cache.v[:, :n], steps.v[:, :n])


@pytest.mark.skipif(kernel.BACKEND == "mkl", reason="the C kernel is not the active backend")
def test_a_c_draft_turn_refuses_what_does_not_fit(tiny):
    """A turn past the cache or the RoPE table, or a token outside the vocabulary, is refused before C runs."""
    draft = Engine(tiny[1])
    fwd, cache = draft.model.c_forward, draft.new_cache(max_len=4)
    end = min(cache.k.shape[1], fwd.cos.shape[0])
    assert len(fwd.draft_greedy([1], cache, end - 2, 2)) == 2             # the last position: fits
    with pytest.raises(LessonkitError, match="does not fit"):
        fwd.draft_greedy([1], cache, end - 2, 3)
    with pytest.raises(LessonkitError, match="outside the vocabulary"):
        fwd.draft_greedy([draft.config.vocab_size], cache, 0, 2)
    d = ModelDrafter(draft)
    d.model.cache = draft.new_cache(max_len=4)
    with pytest.raises(LessonkitError, match="does not fit the KV cache"):
        d.propose(list(range(d.model.cache.max_len)), 2)


def test_drafter_comparison_measures_every_drafter_side_by_side(tiny):
    """Lesson 1's table: the oracle that is never wrong accepts at every position, the one that is always
    wrong at none; every run is checked against plain greedy; c and the prediction come from the run."""
    from lessonkit.lessons.speculative import drafter_comparison
    target_dir, _ = tiny
    target = Engine(target_dir)
    prompts = [p for ps in prompts_by_kind(target, n=1, max_tokens=16).values() for p in ps]
    drafters = {"right": OracleDrafter(target, 0.0, seed=1, horizon=40), "wrong": OracleDrafter(target, 1.0, seed=1,
                horizon=40), "ngram": NGramDrafter()}
    df, fig = drafter_comparison(target, drafters, prompts, k=3, max_new_tokens=8, repeats=1,
                                 cost=[1.0, 1.1, 1.2, 1.3])
    by = df.set_index("drafter")
    assert list(by.index) == ["right", "wrong", "ngram"] and by["identical_to_plain"].all()
    assert by.loc["right", "a1"] == 1.0 and by.loc["right", "acceptance_rate"] == 1.0
    assert by.loc["wrong", "a1"] == 0.0 and by.loc["wrong", "acceptance_rate"] == 0.0
    assert by.loc["right", "c"] > 0 and (df["c"] >= 0).all()
    assert (df["measured_speedup"] > 0).all() and (df["breakdown_speedup"] > 0).all()
    assert len(fig.axes) == 2


def test_without_the_c_kernel_drafters_take_the_pytorch_step(tiny):
    """No compiler at set-up (the MKL path: no C forward): the drafter says why and runs `lean_decode_step`,
    with the same proposals as the C step."""
    prompt = list(range(3, 20))
    with_c = ModelDrafter(Engine(tiny[1])).propose(prompt, 4).tokens
    with active.use(kernel="mkl"):
        draft = Engine(tiny[1])
    d = ModelDrafter(draft)
    assert d.model.step_path == "torch" and "no C kernel" in c_step_why_not(draft)
    assert d.propose(prompt, 4).tokens == with_c
    with pytest.raises(LessonkitError, match="no C draft step for .*no C kernel"):
        ModelDrafter(draft, step="C")


@pytest.mark.parametrize("k", [2, "auto"])
def test_a_request_allocates_room_for_itself_not_the_whole_context(tiny, k, monkeypatch):
    """speculative_generate, like generate, sizes its KV cache to the prompt and the new tokens (a full-context
    cache of smollm2-135m is 360 MB of zeros, 0.15 s a call: it once cost more than short requests' decoding),
    and its output still equals plain greedy's up to the last token of that room."""
    eng = Engine(tiny[0])
    sizes = []
    new_cache = eng.new_cache
    monkeypatch.setattr(eng, "new_cache", lambda max_len=None: sizes.append(max_len) or new_cache(max_len))
    prompt, n_new = list(range(3, 13)), 24
    plain = generate(eng, prompt, n_new, use_eos=False).token_ids
    sizes.clear()
    got = speculative_generate(eng, NGramDrafter(), prompt, n_new, k=k, use_eos=False,
                               cost=[1.0] * 9 if k == "auto" else None).token_ids
    assert got == plain and len(got) == n_new
    assert sizes and None not in sizes and sizes[0] == len(prompt) + n_new, sizes
