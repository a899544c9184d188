"""The row-invariant kernel (csrc/rowkernel.c, lessonkit/engine/kernel.py): every row of an M-row product equals
its one-row product bit for bit, for every matrix shape of every shipped model, M = 1..16, whatever the
other rows hold, with 1 and 2 threads; the AVX2 and portable C paths give the same bits; the kernel is
used whenever it is built."""
import platform

import pytest
import torch

import lessonkit.engine.kernel as K
from lessonkit.engine.config import ModelConfig, preset

needs_c = pytest.mark.skipif(K._rowkernel is None, reason="C kernel not built (no compiler at set-up)")


def _smollm2_config():
    from lessonkit.engine.registry import resolve_model_dir
    return ModelConfig.load(resolve_model_dir("smollm2-135m")[1] / "config.json")


MODELS = {"tiny-moe": lambda: preset("tiny-moe"), "tiny-draft": lambda: preset("tiny-draft"),
          "smollm2-135m": _smollm2_config}


def _rows_vs_one_row(rw: K.RowWeight, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(K.ROWWISE_MAX, k, generator=gen) * 3
    ones = torch.cat([rw.rows(x[i:i + 1]) for i in range(K.ROWWISE_MAX)])
    for m in range(1, K.ROWWISE_MAX + 1):
        for pos in {0, m - 1}:              # the row at the first and the last place, other rows random
            xm = torch.randn(m, k, generator=gen) * 3
            xm[pos] = x[m - 1]
            assert torch.equal(rw.rows(xm)[pos], ones[m - 1]), (m, pos)
        assert torch.equal(rw.rows(x[:m]), ones[:m]), m


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_row_equals_its_one_row_product(model, threads):
    cfg = MODELS[model]()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        K.ensure_row_group(cfg.matrix_shapes(), torch.float32)
        for i, (k, n) in enumerate(cfg.matrix_shapes()):
            w_t = torch.randn(k, n, generator=torch.Generator().manual_seed(i))
            _rows_vs_one_row(K.RowWeight(w_t), k, seed=100 + i)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("shape", [(64, 8), (100, 37), (256, 4096), (576, 960), (1536, 576), (7, 1)])
def test_product_is_the_matrix_product(shape):
    k, n = shape
    gen = torch.Generator().manual_seed(1)
    w_t, x = torch.randn(k, n, generator=gen), torch.randn(16, k, generator=gen)
    rw = K.RowWeight(w_t)
    assert torch.equal(rw.unpacked(), w_t)
    ref = (x.double() @ w_t.double()).float()
    for m in (1, 5, 16, 40):
        xm = torch.randn(m, k, generator=gen)
        assert torch.allclose(rw.rows(xm), (xm.double() @ w_t.double()).float(), rtol=1e-4, atol=1e-4 * k ** 0.5)
    assert torch.allclose(x @ rw, ref, rtol=1e-4, atol=1e-4 * k ** 0.5)


@needs_c
@pytest.mark.skipif(not (K._rowkernel and K._rowkernel.has_avx2()), reason="CPU without AVX2/FMA")
@pytest.mark.parametrize("shape", [(576, 960), (1536, 576), (256, 4096), (64, 24), (33, 50)])
def test_avx2_and_portable_paths_give_the_same_bits(shape):
    k, n = shape
    gen = torch.Generator().manual_seed(2)
    w_t = torch.randn(k, n, generator=gen)
    with K.using("avx2"):
        fast = K.RowWeight(w_t)
    with K.using("portable"):
        portable = K.RowWeight(w_t)
    assert fast.avx2 and not portable.avx2
    for m in (1, 3, 7, 16, 21):
        x = torch.randn(m, k, generator=gen)
        assert torch.equal(portable.rows(x), fast.rows(x)), m


@needs_c
def test_the_kernel_is_used_when_built(tmp_path):
    """A built extension that the engine does not use would silently bring back the slow path."""
    if K.os.environ.get("LESSONKIT_KERNEL", "auto") not in ("", "auto"):
        pytest.skip("backend forced by LESSONKIT_KERNEL")
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and not K._rowkernel.has_avx2():
        assert K.BACKEND == "mkl"
        return
    assert K.BACKEND in ("avx2", "portable"), K.WHY
    from tests.hf_tiny import make_hf
    from lessonkit.engine.engine import Engine
    _, stream = make_hf("olmoe", tmp_path)
    eng = Engine(stream)
    assert all(rw.packed for rw in eng.model.wt.values())
    assert eng.model.store.get(0, 0).gate_up_t.packed


def test_bad_input_names_the_shapes():
    rw = K.RowWeight(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"\(2, 9\).*\[8, 16\]"):
        rw.rows(torch.randn(2, 9))
    with pytest.raises(ValueError, match="2-D"):
        K.RowWeight(torch.randn(2, 3, 4))


def test_forced_backend_must_exist(monkeypatch):
    monkeypatch.setenv("LESSONKIT_KERNEL", "gpu")
    with pytest.raises(ValueError, match="LESSONKIT_KERNEL"):
        K._choose()
    monkeypatch.setenv("LESSONKIT_KERNEL", "mkl")
    assert K._choose()[0] == "mkl"


@needs_c
@pytest.mark.parametrize("kind", ["olmoe", "llama"])
def test_prefill_equals_token_by_token_decoding(kind, tmp_path):
    """On the kernel every product is row-invariant at any row count, so any chunking of a prefill, and
    decoding one token at a time, give the same logits bit for bit (what the prefix cache relies on)."""
    from lessonkit.engine.engine import Engine
    from tests.hf_tiny import make_hf
    _, stream = make_hf(kind, tmp_path)
    eng = Engine(stream)
    toks = torch.randint(0, 300, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    whole = eng.forward(toks, eng.new_cache())
    c = eng.new_cache()
    chunked = torch.cat([eng.forward(toks[:37], c), eng.forward(toks[37:70], c), eng.forward(toks[70:], c)])
    c = eng.new_cache()
    one_by_one = torch.cat([eng.forward([t], c) for t in toks])
    assert torch.equal(whole, chunked) and torch.equal(whole, one_by_one)


def test_a_stale_kernel_build_is_refused_not_called():
    """A _rowkernel built from older sources (another ABI number) would be called with arguments it does not
    take: the engine refuses it at import, takes the MKL path and says why (doctor prints it)."""
    import os
    import subprocess
    import sys
    code = ("import sys, types; m = types.ModuleType('lessonkit.engine._rowkernel'); m.ABI = 1; "
            "sys.modules['lessonkit.engine._rowkernel'] = m; "
            "from lessonkit.engine import kernel; print(kernel.BACKEND); print(kernel.WHY)")
    env = {k: v for k, v in os.environ.items() if k != "LESSONKIT_KERNEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    backend, why = out.strip().split("\n")
    assert backend == "mkl"
    assert "stale (ABI 1" in why and "set-up again" in why
