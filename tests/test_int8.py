"""The int8 numerics (csrc/intdot.c, docs/numerics.md): activations quantised to 8 bits per block of 32, integer
block dots on native Q4_1 / Q8_0 strips. Bits compared with ==: every ISA path of this CPU against the portable
reference, against an independent Python reading of the specification, across verify widths 1..16, row
positions, prefill chunkings and thread counts 1/2/3/8, and smollm2-135m's whole C forward (decode vs verify
vs prefill). A negative control shows that the harness sees a width-dependent float sum when there is one."""
from fractions import Fraction

import pytest
import torch

import lessonkit.engine.kernel as K
from lessonkit.engine import active
from lessonkit.engine import blocks as qb

needs_c = pytest.mark.skipif(K._rowkernel is None or K.BACKEND == "mkl", reason="C kernel not built or not active")
ISA = K.ISA_NAMES.index
PATHS = [("portable", ISA("portable"))]
if K._rowkernel is not None and K._rowkernel.has_avx2():
    PATHS.append(("avx2", ISA("avx2")))
if K._rowkernel is not None and K._rowkernel.has_avx512():
    PATHS.append(("avx512-bw", ISA("avx512") | K.PATH_NO_VNNI))
    if K._rowkernel.has_vnni():
        PATHS.append(("avx512-vnni", ISA("avx512")))
KINDS = ("q4_1", "q8_0")


def random_blocks(n: int, k: int, kind: str, seed: int) -> torch.Tensor:
    """GGUF rows [n, k / 32 * bytes] of random blocks of `kind` (every code value, scales of both signs for m)."""
    g = torch.Generator().manual_seed(seed)
    nb = k // 32
    d = (torch.rand(n, nb, generator=g) * 0.02 + 1e-4).half().view(torch.uint8).view(n, nb, 2)
    if kind == "q4_1":
        m = ((torch.rand(n, nb, generator=g) - 0.7) * 0.1).half().view(torch.uint8).view(n, nb, 2)
        q = torch.randint(0, 256, (n, nb, 16), generator=g, dtype=torch.uint8)
        return torch.cat([d, m, q], -1).reshape(n, -1)
    q = torch.randint(-128, 128, (n, nb, 32), generator=g, dtype=torch.int8).view(torch.uint8)
    return torch.cat([d, q], -1).reshape(n, -1)


def product(w: qb.NativeWeight, x: torch.Tensor, path: int) -> torch.Tensor:
    """x @ W.T on the int8 numerics and ISA `path` (K.ISA_NAMES index, plus PATH_NO_VNNI)."""
    x = x.contiguous()
    y = torch.empty(x.shape[0], w.n)
    K._rowkernel.qmatmul(x.data_ptr(), x.shape[0], w.k, x.stride(0), w.data.data_ptr(), w.code, w.n,
                         y.data_ptr(), w.n, path | K.PATH_INT8)
    return y


def int8_weight(raw: torch.Tensor, k: int, kind: str) -> qb.NativeWeight:
    """A native weight prepared for the int8 numerics (its codes in csrc/intdot.c's layout)."""
    with active.use(numerics="int8"):
        w = qb.NativeWeight(raw, k, kind)
    assert w.code == qb.INT_KIND_CODE[kind]
    return w


@pytest.fixture(scope="module", params=KINDS)
def weight(request):
    kind = request.param
    return int8_weight(random_blocks(70, 576, kind, seed=1), 576, kind)


@needs_c
@pytest.mark.parametrize("kind", KINDS)
def test_the_int8_layout_holds_the_same_weights(kind):
    """The int8 layout is a permutation of the same bytes: dequantised, and row by row, it gives the blocks'
    float32 weights."""
    raw = random_blocks(37, 128, kind, seed=8)
    exact, int8 = qb.NativeWeight(raw, 128, kind), int8_weight(raw, 128, kind)
    assert int8.data.numel() == exact.data.numel()
    assert torch.equal(int8.unpacked(), exact.unpacked())
    ids = torch.tensor([0, 15, 16, 36])
    assert torch.equal(int8.output_rows(ids), exact.output_rows(ids))


@needs_c
@pytest.mark.parametrize("name,path", PATHS, ids=[p[0] for p in PATHS])
def test_every_isa_path_gives_the_portable_bits(weight, name, path):
    x = torch.randn(16, weight.k, generator=torch.Generator().manual_seed(2)) * 4
    x[3, 40:72] = 0.0                                   # a zero block: d = 0, codes 0
    assert torch.equal(product(weight, x, path), product(weight, x, ISA("portable"))), name


@needs_c
@pytest.mark.parametrize("name,path", PATHS, ids=[p[0] for p in PATHS])
def test_the_rounding_edges_give_the_portable_bits(weight, name, path):
    """The activations' rounding at its edges (csrc/intdot.c: quantise_rows; the SIMD paths quantise 8 lanes at
    a time): ties (x / d = k + 1/2 exactly, with d = 1), the clamp, a NaN, an infinity, subnormals, a zero block.
    Compared as bits, so NaN outputs compare too."""
    x = torch.randn(6, weight.k, generator=torch.Generator().manual_seed(5))
    ties = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 126.5, -126.5, 1.5] * 4)    # amax 127: d = 1, id = 1
    x[0, :32], x[1, 32:64] = ties, -ties
    x[2, 64:96] = ties * 2.0 ** -130                     # subnormal: d and id overflow or underflow
    x[3, 5], x[4, 100] = float("nan"), float("inf")
    x[5, :] = 0.0
    got, want = product(weight, x, path), product(weight, x, ISA("portable"))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), name


@needs_c
@pytest.mark.parametrize("name,path", PATHS, ids=[p[0] for p in PATHS])
def test_rows_do_not_depend_on_the_width_or_the_rows_beside_them(weight, name, path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, weight.k, generator=gen) * 3
    ones = torch.cat([product(weight, x[i:i + 1], path) for i in range(16)])
    for m in range(1, 17):
        others = torch.randn(m, weight.k, generator=gen) * 7
        for pos in {0, m - 1, m // 2}:
            xs = others.clone()
            xs[pos] = x[m - 1]
            assert torch.equal(product(weight, xs, path)[pos], ones[m - 1]), (name, m, pos)


@needs_c
def test_bits_do_not_depend_on_the_thread_count(weight):
    x = torch.randn(40, weight.k, generator=torch.Generator().manual_seed(4))
    try:
        outs = []
        for n in (1, 2, 3, 8):
            K.set_threads(n)
            outs.append([product(weight, x[:m], PATHS[-1][1]) for m in (1, 5, 16, 40)])
    finally:
        K.set_threads(1)
    assert all(torch.equal(a, b) for other in outs[1:] for a, b in zip(outs[0], other))


# ---- an independent reading of the specification, in exact rational arithmetic -------------------------
def f32(v) -> float:
    return torch.tensor(float(v), dtype=torch.float32).item()


def fma32(a: float, b: float, c: float) -> float:
    """a * b + c rounded once to float32: the exact rational, then the nearest float32 (ties to even), picked
    among the neighbours of its float64 rounding, so no double rounding can creep in."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    lo = f32(float(exact))                      # float(Fraction) is correctly rounded to float64
    # float64 -> float32 may double-round: fix by comparing the two float32 neighbours exactly
    cands = sorted({lo, float(torch.nextafter(torch.tensor(lo), torch.tensor(float("inf"))).item()),
                    float(torch.nextafter(torch.tensor(lo), torch.tensor(float("-inf"))).item())})
    best = min(cands, key=lambda v: (abs(Fraction(v) - exact), int(torch.tensor(v).view(torch.int32).item()) & 1))
    return best


def spec_product(raw: torch.Tensor, kind: str, x: torch.Tensor) -> torch.Tensor:
    """docs/numerics.md's int8 rounding, step by step, in Python (float32 steps via torch scalars)."""
    d_w, m_w, q_w = qb._parts(raw, kind)
    out = torch.empty(x.shape[0], raw.shape[0])
    for r in range(x.shape[0]):
        blocks = []
        for b in range(x.shape[1] // 32):
            xb = x[r, 32 * b:32 * b + 32]
            amax = xb.abs().max()
            d = (amax / torch.tensor(127.0)).item()
            inv = (torch.tensor(1.0) / torch.tensor(d)).item() if d != 0 else 0.0
            q = torch.round(xb * torch.tensor(inv, dtype=torch.float32)).clamp(-127, 127)
            # torch.round is half-to-even, C's roundf half-away: ties cannot occur unless x * inv is exactly k + 0.5
            q = torch.where((xb * inv).abs() % 1 == 0.5, torch.sign(xb * inv) * torch.ceil((xb * inv).abs()), q)
            s = f32(d * f32(int(q.sum().item())))
            blocks.append((d, s, q.to(torch.int64)))
        for c in range(raw.shape[0]):
            acc = accm = 0.0
            for b, (d, s, q) in enumerate(blocks):
                isum = int((q_w[c, b].to(torch.int64) * q).sum().item())
                acc = fma32(f32(float(d_w[c, b]) * d), float(isum), acc)
                if m_w is not None:
                    accm = fma32(float(m_w[c, b]), s, accm)
            out[r, c] = f32(acc + accm) if m_w is not None else acc
    return out


@needs_c
@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_follows_the_written_specification(kind):
    raw = random_blocks(5, 64, kind, seed=5)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)) * 2
    w = int8_weight(raw, 64, kind)
    assert torch.equal(product(w, x, ISA("portable")), spec_product(raw, kind, x))


def width_dependent_float_sum(x: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
    """A float product whose summation order depends on the number of rows (as a BLAS's tiling does): the input
    dimension is cut into as many partial sums as there are rows, then the partials are added."""
    parts = max(1, x.shape[0])
    chunks = torch.tensor_split(torch.arange(x.shape[1]), parts)
    return sum(x[:, c] @ w_t[c] for c in chunks)


def test_negative_control_a_width_dependent_float_sum_does_differ():
    """The comparison above must be able to fail: the same row inside 1 and 8 rows, summed in an order that
    depends on the width, gives other bits."""
    gen = torch.Generator().manual_seed(7)
    w_t, x = torch.randn(576, 64, generator=gen), torch.randn(8, 576, generator=gen)
    alone = width_dependent_float_sum(x[:1], w_t)
    inside = width_dependent_float_sum(x, w_t)[:1]
    assert not torch.equal(alone, inside)


# ---- the whole C forward on smollm2-135m's blocks -----------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_int8():
    from lessonkit.models.registry import load_model
    with active.use(numerics="int8"):
        eng = load_model("smollm2-135m", weights="native")
    assert "int8" in eng.model.forward_why
    return eng


@needs_c
def test_smollm2_decode_verify_and_prefill_give_the_same_logits(smollm2_int8):
    eng = smollm2_int8
    ids = eng.encode("Integer sums are exact in any order, so the rows cannot tell")
    n = len(ids)
    whole = eng.forward(ids, eng.new_cache(n))
    for chunk in (1, 5, 16):
        cache, out = eng.new_cache(n), []
        for i in range(0, n, chunk):
            out.append(eng.forward(ids[i:i + chunk], cache))
        assert torch.equal(torch.cat(out), whole), chunk
    try:
        K.set_threads(3)
        assert torch.equal(eng.forward(ids, eng.new_cache(n)), whole)
    finally:
        K.set_threads(1)


# ---- tiny-moe on Q8_0 blocks (weights="q8_0"): the MoE target on the int8 numerics -------------------------
def test_q8_0_rows_round_to_the_nearest_code():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(9))
    w[3, :32] = 0.0
    back = qb.dequantise_rows(qb.q8_0_rows(w), "q8_0")
    d = qb._parts(qb.q8_0_rows(w), "q8_0")[0].float()                  # [40, 3] the stored scales
    step = d.repeat_interleave(32, dim=1)
    assert torch.all((back - w).abs() <= step / 2 + 1e-6 * w.abs())   # within half a code of the weight
    assert torch.equal(back[3, :32], torch.zeros(32))


@needs_c
def test_tiny_moe_on_q8_0_blocks_is_row_invariant():
    from lessonkit.models.registry import load_model
    with active.use(numerics="int8"):
        eng = load_model("tiny-moe", weights="q8_0")
    assert eng.weights == "q8_0" and "int8" in eng.model.forward_why
    ids = list(range(5, 29))
    whole = eng.forward(ids, eng.new_cache(len(ids)))
    for chunk in (1, 5):
        cache, out = eng.new_cache(len(ids)), []
        for i in range(0, len(ids), chunk):
            out.append(eng.forward(ids[i:i + chunk], cache))
        assert torch.equal(torch.cat(out), whole), chunk


@needs_c
@pytest.mark.parametrize("numerics, weights, want", [("int8", None, "q8_0"), ("exact", None, "f32"),
                                                     ("int8", "f32", "f32")])
def test_a_draft_model_takes_the_numerics_blocks_and_drafts_losslessly(numerics, weights, want):
    """`--draft tiny-draft` (and `auto`'s draft model, lesson 1's pair): on the int8 numerics the draft model is
    quantised to Q8_0 blocks at load, so its products take integer dots; on the exact numerics, or where weights were
    asked for, its own weights. Either way the output is plain greedy's, token for token."""
    from lessonkit.drafter_registry import make_drafter
    from lessonkit.engine.generate import generate
    from lessonkit.measure.speculative import lesson_models
    from lessonkit.models.registry import load_model
    from lessonkit.speculative.verify import speculative_generate
    with active.use(numerics=numerics, weights=weights):
        target = load_model("tiny-moe")
        d = make_drafter("tiny-draft", target)
        assert d.engine.weights == want
        assert lesson_models("tiny-moe", "tiny-draft")[1].weights == want      # lesson 1's pair loads it alike
        ids = list(range(5, 29))
        assert speculative_generate(target, d, ids, 24, k=4).token_ids == generate(target, ids, 24).token_ids


@needs_c
def test_the_record_says_which_dot_the_path_takes():
    """backend()["vnni"] is the path's dot, not the CPU's: the AVX2 path (LESSONKIT_KERNEL=avx2) takes vpmaddubsw
    on a VNNI CPU too, and machine records must not say vnni there."""
    assert K.uses_vnni("avx2") is False and K.uses_vnni("portable") is False
    assert K.uses_vnni("avx512") == K._rowkernel.has_vnni()
    rec = K.backend()
    assert rec["vnni"] == K.uses_vnni(rec["backend"]) and rec["cpu_vnni"] == K._rowkernel.has_vnni()
