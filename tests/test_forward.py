"""The whole forward in one C call (csrc/forward.c, engine/c_forward.py; docs/numerics.md is its specification).

Its logits are equal bit for bit (torch.equal) across: decode vs verify vs any prefill chunking, thread counts
1, 2, 3 and 8, the AVX2 and portable paths, native Q4_1/Q8_0 blocks vs float32 weights. Against the PyTorch
reference forward the products are the same but the sums run in another fixed order and exp is the forward's
own, so logits differ: by at most TORCH_BOUND (measured and stated in docs/numerics.md)."""
import math

import pytest
import torch

import lessonkit.engine.kernel as K
from lessonkit.engine import active
from lessonkit.engine import c_forward
from lessonkit.engine import kernel_library as KL
from lessonkit.errors import LessonkitError
from lessonkit.models.registry import load_model

needs_c = pytest.mark.skipif(K._rowkernel is None or K.BACKEND == "mkl", reason="C kernel not built or not active")
PATHS = (["avx512"] if K._rowkernel is not None and K._rowkernel.has_avx512() else []) \
    + (["avx2", "portable"] if K._rowkernel is not None and K._rowkernel.has_avx2() else ["portable"])
MODELS = ["smollm2-135m", "tiny-draft", "smollm2-draft", "tiny-moe"]     # three dense Llamas, one OLMoE-style MoE
TORCH_BOUND = 5e-4        # largest |C - PyTorch| logit difference allowed (docs/numerics.md: measured 7.1e-5)
PROMPT = list(range(100, 171))           # 71 tokens: crosses a 64-key bucket of the PyTorch forward


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return load_model(request.param)


def vocab_ids(eng, ids):
    return [i % eng.config.vocab_size for i in ids]


def run(eng, chunks, max_len=160):
    """Logits of every position, fed in the given chunks (lists of token ids), one cache."""
    cache = eng.new_cache(max_len)
    return torch.cat([eng.forward(vocab_ids(eng, c), cache) for c in chunks])


def chunked(ids, sizes):
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(ids[i:i + n])
        i, k = i + n, k + 1
    return out


@needs_c
def test_exp_is_within_two_ulp_and_handles_the_edges():
    x = torch.linspace(-87.0, 88.0, 200_001, dtype=torch.float32)
    out = torch.empty_like(x)
    K._rowkernel.exp_many(x.data_ptr(), out.data_ptr(), x.numel())
    ref = torch.exp(x.double())
    ulp = (ref.float().nextafter(torch.tensor(math.inf)) - ref.float()).double()
    err = ((out.double() - ref).abs() / ulp).max().item()
    assert err <= 2.0, err
    edge = torch.tensor([-1000.0, -87.5, 0.0, 89.0, math.inf, -math.inf, math.nan])
    got = torch.empty_like(edge)
    K._rowkernel.exp_many(edge.data_ptr(), got.data_ptr(), edge.numel())
    assert got[0] == 0 and got[1] == 0 and got[2] == 1 and got[3] == math.inf and got[4] == math.inf
    assert got[5] == 0 and math.isnan(got[6])


@needs_c
@pytest.mark.parametrize("path", [p for p in PATHS if p != "portable"])
def test_every_simd_exp_gives_the_portable_bits(path):
    """The SIMD copies of exp (8 lanes: softmax and SwiGLU) against the portable one, bit for bit: a sweep over
    its range, the clamps and specials, and random bit patterns; 8 + 3 floats so a tail runs the scalar copy."""
    x = torch.cat([torch.linspace(-100.0, 100.0, 100_003), torch.tensor([-87.3, 88.3, -87.31, 88.31, -0.0, 0.0,
                   math.inf, -math.inf, math.nan, 1e-45, -1e-45]),
                   torch.randint(-2**31, 2**31, (65_536,), dtype=torch.int64, generator=torch.Generator().manual_seed(7))
                   .to(torch.int32).view(torch.float32)])
    want, got = torch.empty_like(x), torch.empty_like(x)
    K._rowkernel.exp_many(x.data_ptr(), want.data_ptr(), x.numel(), K.ISA_NAMES.index("portable"))
    K._rowkernel.exp_many(x.data_ptr(), got.data_ptr(), x.numel(), K.ISA_NAMES.index(path))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), path


@needs_c
def test_every_model_takes_the_c_forward(model):
    assert model.model.c_forward is not None, model.model.forward_why


@needs_c
def test_streamed_experts_give_the_resident_bits_and_the_same_store_counters(monkeypatch):
    """tiny-moe under a 3-expert budget: the C forward fetches each expert a layer uses through the store (one
    callback each), so misses, hits and bytes read are the PyTorch forward's, and the logits the resident run's."""
    resident = run(load_model("tiny-moe"), chunked(PROMPT, [13, 1]))
    counters = {}
    for path in ("c", "torch"):
        eng = load_model("tiny-moe", expert_budget_mb=4)
        if path == "torch":
            monkeypatch.setattr(eng.model, "c_forward", None)
        eng.store.reset_counters()
        logits = run(eng, chunked(PROMPT, [13, 1]))
        counters[path] = {k: eng.store.counters()[k] for k in ("expert_hits", "expert_misses", "bytes_read")}
        if path == "c":
            assert torch.equal(logits, resident)
    assert counters["c"] == counters["torch"] and counters["c"]["expert_misses"] > 0


@needs_c
def test_prefetch_guesses_the_pytorch_forwards_experts_and_changes_no_bit(monkeypatch):
    """With a prefetch thread the C forward hints the next layer's experts as the PyTorch forward does (same
    prefetched count), and the logits are the resident run's."""
    resident = run(load_model("tiny-moe"), chunked(PROMPT, [13, 1]))
    seen = {}
    for path in ("c", "torch"):
        eng = load_model("tiny-moe", expert_budget_mb=4, prefetch=True)
        assert eng.model.c_forward is not None
        if path == "torch":
            monkeypatch.setattr(eng.model, "c_forward", None)
        calls = []
        orig = eng.store.prefetch
        monkeypatch.setattr(eng.store, "prefetch", lambda layer, experts: (calls.append((layer, sorted(map(int, experts)))), orig(layer, experts)))
        logits = run(eng, chunked(PROMPT, [13, 1]))
        seen[path] = sorted((layer, e) for layer, es in calls for e in es)
        if path == "c":
            assert torch.equal(logits, resident)
        eng.store.close()
    assert seen["c"] and len(seen["c"]) == len(seen["torch"])


@needs_c
def test_a_failing_expert_fetch_raises_its_own_error(monkeypatch):
    eng = load_model("tiny-moe", expert_budget_mb=4)

    def broken(layer, expert):
        raise OSError(f"disk gone while reading expert {expert} of layer {layer}")
    monkeypatch.setattr(eng.store, "get", broken)
    with pytest.raises(OSError, match="disk gone"):
        eng.forward([1, 2, 3], eng.new_cache(8))


@needs_c
def test_decode_verify_and_any_prefill_chunking_give_the_same_bits(model):
    ref = run(model, [PROMPT])
    for sizes in ([1], [5], [3, 1, 7], [64, 7], [70, 1]):
        assert torch.equal(run(model, chunked(PROMPT, sizes)), ref), sizes


@needs_c
def test_thread_counts_give_the_same_bits(model):
    ref = run(model, chunked(PROMPT, [9, 1]))
    try:
        for n in (2, 3, 8):
            K.set_threads(n)
            assert torch.equal(run(model, chunked(PROMPT, [9, 1])), ref), n
    finally:
        K.set_threads(1)


@needs_c
@pytest.mark.skipif(len(PATHS) < 2, reason="one kernel path on this CPU")
@pytest.mark.parametrize("name", ["smollm2-135m", "tiny-moe"])     # heads of 64 and 32 values
def test_every_simd_path_gives_the_portable_bits(name):
    """Attention's AVX2 and AVX-512 copies take the keys 8 at a time (csrc/forward.c): 40 positions cover whole
    blocks of 8, a tail, and rows whose key count is a multiple of 8."""
    with active.use(kernel="portable"):
        portable = load_model(name)
    assert portable.model.c_forward is not None and not portable.model.c_forward.path
    ids = chunked(vocab_ids(portable, PROMPT)[:40], [7, 25, 8, 1])
    want = run(portable, ids)
    for path in [p for p in PATHS if p != "portable"]:
        with active.use(kernel=path):
            simd = load_model(name)
            assert simd.model.c_forward.path
            assert torch.equal(run(simd, ids), want), path


@needs_c
def test_native_blocks_and_float32_weights_give_the_same_bits():
    native, f32 = load_model("smollm2-135m", weights="native"), load_model("smollm2-135m", weights="f32")
    assert native.model.native and not f32.model.native
    assert native.model.c_forward is not None and f32.model.c_forward is not None
    assert torch.equal(run(native, chunked(PROMPT, [11, 1])), run(f32, chunked(PROMPT, [11, 1])))


@needs_c
def test_the_c_forward_stays_within_the_stated_bound_of_the_pytorch_forward(model, monkeypatch):
    c = run(model, chunked(PROMPT, [50, 1]))
    monkeypatch.setattr(model.model, "c_forward", None)
    ref = run(model, chunked(PROMPT, [50, 1]))
    rows = torch.isfinite(ref)                     # a reduced output layer leaves -inf for tokens without a row
    assert torch.equal(torch.isfinite(c), rows)
    diff = (c[rows] - ref[rows]).abs().max().item()
    assert diff <= TORCH_BOUND, diff
    assert diff > 0 or model.config.n_layers == 0      # the two forwards really are different code


@needs_c
def test_the_embedding_looked_up_in_c_is_the_tables_row(model):
    """Float32 rows or a tied output layer's packed Q4_1 / Q8_0 blocks: the C lookup gives the PyTorch lookup's
    floats, so the residual stream out of a forward with x given equals the one with tokens looked up in C."""
    fwd = model.model.c_forward
    ids = torch.tensor(vocab_ids(model, [0, 1, 15, 16, 17, 4095, 100]), dtype=torch.int64)
    x_py = model.model.w["embed"][ids].float().contiguous()
    outs = []
    for given in (x_py.clone(), None):
        cache = model.new_cache(16)
        outs.append(fwd.run(ids, given, cache, 0, False)[:2])
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@needs_c
def test_hidden_state_and_last_only_match_the_full_forward(model):
    ids = vocab_ids(model, PROMPT[:12])
    full = run(model, [ids])
    cache = model.new_cache(64)
    last, hidden = model.forward(ids, cache, last_only=True, return_hidden=True)
    assert torch.equal(last[0], full[-1]) and hidden.shape == (12, model.config.dim)
    assert cache.length == 12


def test_lessonkit_forward_torch_and_c_are_honoured(monkeypatch):
    monkeypatch.setenv("LESSONKIT_FORWARD", "torch")
    assert load_model("tiny-draft").model.c_forward is None
    monkeypatch.setenv("LESSONKIT_FORWARD", "sometimes")
    with pytest.raises(LessonkitError, match="LESSONKIT_FORWARD='sometimes'"):
        c_forward.requested_path()
    monkeypatch.setenv("LESSONKIT_FORWARD", "c")
    with pytest.raises(LessonkitError, match="cannot take the C forward"):
        load_model("tiny-moe", dtype=torch.float64)


@needs_c
def test_a_bad_weight_kind_is_refused_by_name():
    eng = load_model("tiny-draft")
    fwd = eng.model.c_forward
    plan = fwd.plan.clone()
    plan[KL.PLAN_HEAD_KIND] = 7                    # the output layer's kind
    x = torch.zeros(1, eng.config.dim)
    cache = eng.new_cache(8)
    out = torch.empty(1, int(fwd.dims[KL.DIM_VOCAB]))
    model = KL.RkModel(plan=plan.data_ptr(), dims=fwd.dims.data_ptr(), eps=fwd.eps, clip=fwd.clip, path=fwd.path)
    batch = KL.RkBatch(x=x.data_ptr(), m=1, logits=out.data_ptr(), k_cache=cache.k.data_ptr(),
                       v_cache=cache.v.data_ptr(), alloc=cache.k.shape[1])
    with pytest.raises(ValueError, match="rowkernel.forward"):
        K._rowkernel.forward(model, batch)


def test_lessonkit_kernel_chooses_a_path_or_refuses_by_name(monkeypatch):
    """LESSONKIT_KERNEL is the one setting of the path; the old LESSONKIT_ISA is refused, naming it."""
    import platform
    monkeypatch.delenv("LESSONKIT_ISA", raising=False)
    arm = platform.machine().lower() in ("aarch64", "arm64")
    avx512 = K._rowkernel is not None and K._rowkernel.has_avx512()
    refused = [("sse9", "expected one of"), ("avx2" if arm else "neon", "this CPU is")]
    if not avx512 and K._rowkernel is not None:
        refused.append(("avx512", "this CPU is" if arm else "no AVX-512"))
    for bad, said in refused:
        monkeypatch.setenv("LESSONKIT_KERNEL", bad)
        with pytest.raises(LessonkitError, match=said):
            K._choose()
    if K._rowkernel is None:
        return
    monkeypatch.setenv("LESSONKIT_KERNEL", "neon" if arm else "portable")
    assert K._choose()[0] == "portable" and K.isa("portable") == ("neon" if arm else "portable")
    if avx512:
        monkeypatch.setenv("LESSONKIT_KERNEL", "avx512")
        assert K._choose()[0] == "avx512"
        monkeypatch.setenv("LESSONKIT_KERNEL", "avx2")
        assert K._choose() == ("avx2", "forced by LESSONKIT_KERNEL=avx2")
    monkeypatch.setenv("LESSONKIT_ISA", "avx2")
    with pytest.raises(LessonkitError, match="one setting now, LESSONKIT_KERNEL"):
        K._choose()


@needs_c
def test_another_models_kv_cache_is_refused_by_shape():
    target, draft = load_model("tiny-moe"), load_model("tiny-draft")
    with pytest.raises(LessonkitError, match="is not this model's"):
        target.forward([1, 2], draft.new_cache(16))
