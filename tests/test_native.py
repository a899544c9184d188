"""Native Q4_1 / Q8_0 blocks (lessonkit.engine.blocks, csrc/rowkernel.c qmatmul): the blocks dequantise to
gguf's own float32 values, products on blocks equal the float32 path's bit for bit (every M = 1..16, every row
position, other rows random, AVX2 and portable paths, 1-3 threads), and smollm2-135m on its blocks gives the
float32 path's tokens and logits bit for bit, with no float32 copy of the blocks in the converted directory."""
import json
import struct

import gguf
import numpy as np
import pytest
import torch

import lessonkit.engine.kernel as K
from lessonkit.engine import active
from lessonkit.engine import row_weight
from lessonkit.engine import blocks as qb
from lessonkit.errors import LessonkitError
from lessonkit.models.gguf_loader import NATIVE_KINDS, block_rows, smollm2_gguf_path

needs_c = pytest.mark.skipif(K._rowkernel is None or K.BACKEND == "mkl", reason="C kernel not built or not active")
PATHS = (["avx512"] if K._rowkernel is not None and K._rowkernel.has_avx512() else []) \
    + (["avx2", "portable"] if K._rowkernel is not None and K._rowkernel.has_avx2() else ["portable"])


@pytest.fixture(scope="module")
def gguf_tensors():
    """One tensor of each shape and kind SmolLM2 ships: q (576x576), k (192x576), gate (1536x576),
    down (576x1536) Q4_1, and the first 2,000 rows of the Q8_0 embedding."""
    r = gguf.GGUFReader(str(smollm2_gguf_path()))
    named = {t.name: t for t in r.tensors}
    out = {}
    for name in ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.ffn_gate.weight", "blk.3.ffn_down.weight",
                 "token_embd.weight"):
        t = named[name]
        raw = torch.from_numpy(block_rows(t))
        ref = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        ref = torch.from_numpy(ref.reshape(raw.shape[0], -1))
        rows = 2000 if name.startswith("token") else raw.shape[0]
        out[name] = (NATIVE_KINDS[t.tensor_type], raw[:rows].clone(), ref[:rows].clone())
    return out


def test_dequantised_blocks_equal_gguf_values(gguf_tensors):
    for name, (kind, raw, ref) in gguf_tensors.items():
        assert torch.equal(qb.dequantise_rows(raw, kind), ref), name


@needs_c
@pytest.mark.parametrize("path", PATHS)
def test_native_products_equal_the_float32_path_bit_for_bit(gguf_tensors, path):
    gen = torch.Generator().manual_seed(1)
    for name, (kind, raw, ref) in gguf_tensors.items():
        with active.use(kernel=path):
            nw, rw = qb.NativeWeight(raw, ref.shape[1], kind), row_weight.RowWeight(ref.T.contiguous())
        assert torch.equal(nw.unpacked(), ref.T), name
        x = torch.randn(16, ref.shape[1], generator=gen) * 3
        ones = torch.cat([rw.rows(x[i:i + 1]) for i in range(16)])
        for m in range(1, 17):
            other = torch.randn(m, ref.shape[1], generator=gen)
            for pos in range(m):                      # row `pos` among m - 1 random rows
                xs = other.clone()
                xs[pos] = x[m - 1]
                assert torch.equal(nw.rows(xs)[pos], ones[m - 1]), (name, path, m, pos)
        big = torch.randn(70, ref.shape[1], generator=gen)
        assert torch.equal(nw.rows(big), rw.rows(big)), (name, path, "prefill rows")


@needs_c
def test_avx2_and_portable_native_paths_agree(gguf_tensors):
    """Every path of this CPU (avx512, avx2, portable) gives the same bits, in registers (up to 6 rows) and
    through the float scratch (more rows)."""
    if len(PATHS) < 2:
        pytest.skip("CPU without AVX2/FMA/F16C")
    kind, raw, ref = gguf_tensors["blk.3.ffn_down.weight"]
    for m in (1, 2, 3, 4, 5, 6, 9):
        x = torch.randn(m, ref.shape[1]) * 5
        outs = []
        for path in PATHS:
            with active.use(kernel=path):
                outs.append(qb.NativeWeight(raw, ref.shape[1], kind).rows(x))
        assert all(torch.equal(outs[0], o) for o in outs[1:]), (m, PATHS)


@needs_c
def test_bits_do_not_depend_on_the_thread_count(gguf_tensors):
    kind, raw, ref = gguf_tensors["blk.3.ffn_gate.weight"]
    nw, rw = qb.NativeWeight(raw, ref.shape[1], kind), row_weight.RowWeight(ref.T.contiguous())
    x = torch.randn(20, ref.shape[1]) * 3
    try:
        outs = []
        for n in (1, 2, 3):
            assert K.set_threads(n) == n
            outs.append([nw.rows(x[:m]) for m in (1, 4, 7, 20)] + [rw.rows(x[:m]) for m in (1, 7)])
    finally:
        K.set_threads(1)
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))


def test_block_kind_refuses_what_is_not_blocks():
    assert qb.block_kind((576, 360), (576, 576)) == "q4_1"
    assert qb.block_kind((576, 612), (576, 576)) == "q8_0"
    with pytest.raises(LessonkitError, match="neither Q4_1 nor Q8_0"):
        qb.block_kind((576, 361), (576, 576), "layers.0.wq")
    with pytest.raises(LessonkitError, match="expected native, f32, q8_0 or auto"):
        qb.choose_weights("int4")


# ---- the model -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines():
    from lessonkit.models.registry import load_model
    if K._rowkernel is None or K.BACKEND == "mkl":
        pytest.skip("native weights need the C kernel")
    return load_model("smollm2-135m", weights="native"), load_model("smollm2-135m", weights="f32")


PROMPTS = ["The capital of France is", "def fibonacci(n):", '{"host": "db-1", "cpu": ']


def test_the_engines_say_which_weights_ran(engines):
    native, f32 = engines
    assert (native.weights, f32.weights) == ("native", "f32")
    assert native.model.wt["layers.0.wqkv"].nbytes * 5 < f32.model.wt["layers.0.wqkv"].nbytes


def test_native_logits_equal_float32_logits_bit_for_bit(engines):
    native, f32 = engines
    for prompt in PROMPTS:
        ids = native.encode(prompt)
        cn, cf = native.new_cache(128), f32.new_cache(128)
        assert torch.equal(native.forward(ids, cn), f32.forward(ids, cf)), prompt
        for tok in (11, 2000, 49000):
            assert torch.equal(native.forward([tok], cn), f32.forward([tok], cf)), (prompt, tok)
        assert torch.equal(cn.k, cf.k) and torch.equal(cn.v, cf.v)       # a snapshot of either is the same state
        assert native.forward([5, 6, 7, 8], cn).equal(f32.forward([5, 6, 7, 8], cf))


@pytest.mark.parametrize("sampling", [None, dict(temperature=0.8, top_p=0.9, seed=3)])
def test_generate_on_native_blocks_equals_float32(engines, sampling):
    from lessonkit.engine.generate import generate
    native, f32 = engines
    for prompt in PROMPTS[:2]:
        ids = native.encode(prompt)
        a = generate(native, ids, 12, use_eos=False, **(sampling or {}))
        b = generate(f32, ids, 12, use_eos=False, **(sampling or {}))
        assert a.token_ids == b.token_ids, prompt


def test_prefix_snapshots_are_interchangeable(engines):
    native, f32 = engines
    assert native.fingerprint() == f32.fingerprint()       # same files; the states above are bit-identical


def test_converted_directory_holds_no_float32_copy_of_the_blocks(engines):
    d = engines[0].model_dir
    for f in ("dense.safetensors", "experts.safetensors"):
        raw = (d / f).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        big = {k: v["dtype"] for k, v in header.items() if np.prod(v["shape"]) > 100_000}
        assert big and all(dt == "U8" for dt in big.values()), (f, big)
    assert sum(p.stat().st_size for p in d.iterdir()) < 110e6
