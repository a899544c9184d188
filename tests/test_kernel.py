"""The row-invariant kernel (csrc/rowkernel.c, lessonkit/engine/kernel.py): every row of an M-row product equals
its one-row product bit for bit, for every matrix shape of every shipped model, M = 1..16, whatever the
other rows hold, with 1 and 2 threads; the AVX2 and portable C paths give the same bits; the kernel is
used whenever it is built."""
import platform
import sys

import pytest
import torch

import lessonkit.engine.kernel as K
from lessonkit.engine import active, settings
from lessonkit.engine import kernel_library, row_weight
from lessonkit.engine.config import ModelConfig, preset

needs_c = pytest.mark.skipif(K._rowkernel is None, reason=f"no C kernel binary loaded ({K.BINARY_WHY})")


def _smollm2_config():
    from lessonkit.models.registry import resolve_model_dir
    return ModelConfig.load(resolve_model_dir("smollm2-135m")[1] / "config.json")


MODELS = {"tiny-moe": lambda: preset("tiny-moe"), "tiny-draft": lambda: preset("tiny-draft"),
          "smollm2-135m": _smollm2_config}


def _rows_vs_one_row(rw: row_weight.RowWeight, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(row_weight.ROWWISE_MAX, k, generator=gen) * 3
    ones = torch.cat([rw.rows(x[i:i + 1]) for i in range(row_weight.ROWWISE_MAX)])
    for m in range(1, row_weight.ROWWISE_MAX + 1):
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
        row_weight.ensure_row_group(cfg.matrix_shapes(), torch.float32)
        for i, (k, n) in enumerate(cfg.matrix_shapes()):
            w_t = torch.randn(k, n, generator=torch.Generator().manual_seed(i))
            _rows_vs_one_row(row_weight.RowWeight(w_t), k, seed=100 + i)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("shape", [(64, 8), (100, 37), (256, 4096), (576, 960), (1536, 576), (7, 1)])
def test_product_is_the_matrix_product(shape):
    k, n = shape
    gen = torch.Generator().manual_seed(1)
    w_t, x = torch.randn(k, n, generator=gen), torch.randn(16, k, generator=gen)
    rw = row_weight.RowWeight(w_t)
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
    with active.use(kernel="avx2"):
        fast = row_weight.RowWeight(w_t)
    with active.use(kernel="portable"):
        portable = row_weight.RowWeight(w_t)
    assert fast.path and not portable.path
    for m in (1, 3, 7, 16, 21):
        x = torch.randn(m, k, generator=gen)
        assert torch.equal(portable.rows(x), fast.rows(x)), m


@needs_c
def test_the_kernel_is_used_when_built(tmp_path):
    """A built extension that the engine does not use would silently bring back the slow path."""
    if settings.from_env().kernel != "auto":
        pytest.skip("backend forced by LESSONKIT_KERNEL")
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and not K._rowkernel.has_avx2():
        assert K.BACKEND == "mkl"
        return
    assert K.BACKEND in ("avx512", "avx2", "portable"), K.WHY
    from tests.hf_tiny import make_hf
    from lessonkit.engine.engine import Engine
    _, stream = make_hf("olmoe", tmp_path)
    eng = Engine(stream)
    assert all(rw.packed for rw in eng.model.wt.values())
    assert eng.model.store.get(0, 0).gate_up_t.packed


def test_bad_input_names_the_shapes():
    rw = row_weight.RowWeight(torch.randn(8, 16))
    with pytest.raises(ValueError, match=r"\(2, 9\).*\[8, 16\]"):
        rw.rows(torch.randn(2, 9))
    with pytest.raises(ValueError, match="2-D"):
        row_weight.RowWeight(torch.randn(2, 3, 4))


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


def test_a_stale_kernel_binary_is_refused_not_called(monkeypatch):
    """A library built from older sources (another ABI number) would be called with arguments it does not
    take: the loader refuses it, says why and which file, and the engine takes the MKL path (doctor prints it)."""
    if K._rowkernel is None:
        pytest.skip("no kernel binary loads here")
    path, built = K._rowkernel.path, K.ABI
    monkeypatch.setattr(kernel_library, "ABI", 1)       # this code now wants ABI 1: the binary is stale
    lib, name, why = K.load_library([(path, "the shipped binary")])
    assert lib is None and name is None
    assert f"{path.name} is stale (ABI {built}, this code needs 1)" in why and "build_kernels.py" in why
    monkeypatch.setattr(K, "_rowkernel", None)
    monkeypatch.setattr(K, "_IMPORT_ERROR", why)
    monkeypatch.delenv("LESSONKIT_KERNEL", raising=False)
    backend, reason = K._choose()
    assert backend == "mkl" and f"stale (ABI {built}" in reason


def test_the_loader_says_which_binary_loaded_and_why():
    info = K.backend()
    assert set(info) >= {"binary", "binary_why"}
    if K._rowkernel is None:
        assert info["binary"] is None and "build_kernels.py --host" in info["binary_why"]
    else:
        assert info["binary"] == K._rowkernel.path.name and info["binary_why"]
        assert (kernel_library.KERNELS / info["binary"]).is_file()


def test_missing_binaries_are_named_with_the_way_to_build_one(tmp_path):
    lib, name, why = K.load_library([(tmp_path / "rowkernel-linux-x86_64.so", "shipped"),
                                     (tmp_path / "rowkernel-host.so", "host")])
    assert lib is None and name is None
    assert "rowkernel-linux-x86_64.so absent" in why and "rowkernel-host.so absent" in why
    assert "`python csrc/build_kernels.py --host` builds one" in why
    (tmp_path / "rowkernel-host.so").write_bytes(b"not a library")
    lib, _, why = K.load_library([(tmp_path / "rowkernel-host.so", "host")])
    assert lib is None and "rowkernel-host.so does not load" in why


@pytest.mark.parametrize("system,machine,name", [
    ("linux", "x86_64", "rowkernel-linux-x86_64.so"), ("linux", "aarch64", "rowkernel-linux-aarch64.so"),
    ("win32", "AMD64", "rowkernel-windows-x86_64.dll"), ("win32", "ARM64", "rowkernel-windows-aarch64.dll"),
    ("darwin", "x86_64", "rowkernel-macos-x86_64.dylib"), ("darwin", "arm64", "rowkernel-macos-arm64.dylib"),
    ("linux", "riscv64", None), ("freebsd14", "amd64", None)])
def test_each_platform_gets_its_binary(system, machine, name):
    assert kernel_library.binary_name(system, machine) == name
    if name:
        assert (kernel_library.KERNELS / name).is_file(), f"{name} is not shipped: run python csrc/build_kernels.py"


@needs_c
def test_kernel_errors_are_the_exceptions_of_the_extension_module():
    rk = K._rowkernel
    x, y = torch.zeros(2, 8), torch.zeros(2, 16)
    w = row_weight.pack_strips(torch.zeros(8, 16))
    with pytest.raises(ValueError, match=r"rowkernel\.matmul: bad sizes"):
        rk.matmul(x.data_ptr(), 2, 8, 4, w.data_ptr(), 16, y.data_ptr(), 16, False)     # ldx < k
    with pytest.raises(ValueError, match=r"rowkernel\.qmatmul: unknown block kind 7"):
        rk.qmatmul(x.data_ptr(), 2, 32, 32, w.data_ptr(), 7, 16, y.data_ptr(), 16, False)
    with pytest.raises(ValueError, match=r"rowkernel\.dequantise: bad arguments"):
        rk.dequantise(w.data_ptr(), 0, 31, 16, y.data_ptr(), False)
    with pytest.raises(ValueError, match=r"rowkernel\.set_threads: 0 threads \(1 to 64\)"):
        rk.set_threads(0)
    dims = torch.zeros(kernel_library.DIMS, dtype=torch.int64)                          # D = V = 0
    with pytest.raises(ValueError, match=r"rowkernel\.draft_greedy: bad sizes"):
        model, batch = kernel_library.RkModel(dims=dims.data_ptr(), eps=1e-5), kernel_library.RkBatch(m=1, alloc=16)
        rk.draft_greedy(model, batch, 2, 0, 0, 0)
    if not rk.has_avx2():
        with pytest.raises(RuntimeError, match="no AVX2"):
            rk.matmul(x.data_ptr(), 2, 8, 8, w.data_ptr(), 16, y.data_ptr(), 16, True)


def _double_rounding_triples() -> torch.Tensor:
    """(a, b, c) whose a * b + c, rounded to double and then to float, is wrong (double rounding), with the
    right answer: 1 + 2^-23 + 2^-24 - 2^-70 is below the halfway point, so the fma gives 1 + 2^-23."""
    one_up = 1 + 2 ** -23
    a = [one_up, -one_up, one_up * 2 ** 10]
    b = [(1 - 2 ** -23) * 2 ** -24, (1 - 2 ** -23) * 2 ** -24, (1 - 2 ** -23) * 2 ** -34]
    c = [one_up, -one_up, one_up]
    want = [one_up, -one_up, one_up]
    return torch.tensor([a, b, c, want], dtype=torch.float32)


@needs_c
def test_software_fma_is_correctly_rounded():
    """soft_fmaf (csrc/rowkernel.c: exact double product, sum rounded to odd) equals the FMA instruction on
    2 million random triples over the whole exponent range and on the double-rounding cases, bit for bit."""
    rk = K._rowkernel
    gen = torch.Generator().manual_seed(5)
    n = 2_000_000
    bits = torch.randint(-2 ** 31, 2 ** 31, (3, n), generator=gen, dtype=torch.int64).to(torch.int32)
    abc = bits.view(torch.float32).clone()
    abc[:, : n // 2] = torch.randn(3, n // 2, generator=gen)        # half ordinary values, half any bit pattern
    hard = _double_rounding_triples()
    a, b, c = (torch.cat([abc[i], hard[i]]).contiguous() for i in range(3))
    soft, hw = torch.empty_like(a), torch.empty_like(a)
    rk.fma_many(a.data_ptr(), b.data_ptr(), c.data_ptr(), soft.data_ptr(), a.numel(), 0)
    rk.fma_many(a.data_ptr(), b.data_ptr(), c.data_ptr(), hw.data_ptr(), a.numel(), 1)
    assert torch.equal(soft[-3:], hard[3]), soft[-3:]
    naive = (a.double() * b.double() + c.double()).float()
    assert not torch.equal(naive[-3:], hard[3])                      # the cases do catch double rounding
    if K.platform.machine().lower() in ("x86_64", "amd64") and not rk.has_avx2():
        pytest.skip("no FMA instruction to compare with")
    same = (soft.view(torch.int32) == hw.view(torch.int32)) | (soft.isnan() & hw.isnan())
    assert bool(same.all()), int((~same).sum())


def test_a_malformed_thread_count_is_one_clear_error():
    """LESSONKIT_THREADS=two: one line naming the variable from the CLI, exit code 2, no traceback."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, LESSONKIT_THREADS="two")
    r = subprocess.run([sys.executable, "-m", "lessonkit", "doctor"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("lessonkit: error: LESSONKIT_THREADS='two': expected a positive integer "
                                "(the kernel's thread count)"), r.stderr


def test_physical_cores_without_linux_interfaces(monkeypatch):
    """Windows and macOS have neither /proc/cpuinfo nor sched_getaffinity: psutil counts the cores."""
    import psutil
    monkeypatch.delattr(settings.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 6 if not logical else 12)
    assert settings.physical_cores() == 6
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: None)     # psutil cannot tell
    assert settings.physical_cores() == (settings.os.cpu_count() or 1)


@pytest.mark.skipif(not sys.platform.startswith("linux") or K._rowkernel is None, reason="RLIMIT_AS and the C kernel")
def test_64_threads_fit_a_3_gb_address_space_limit():
    """Under `ulimit -v` (shared JupyterHubs, HPC login nodes) 64 kernel threads must not reserve the address
    space the rest needs: each worker's stack is 512 KiB (portable.h RK_WORKER_STACK), not the platform's 8 MB.
    With 8 MB stacks this command failed allocating a 4 MB weight (the issue-53 fuzz found it)."""
    import resource
    import subprocess

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    r = subprocess.run([sys.executable, "-m", "lessonkit", "generate", "--model", "tiny-moe", "--prompt", "Once upon",
                        "--max-new-tokens", "4", "--draft", "ngram:3", "--draft-k", "2", "--threads", "64"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert r.returncode == 0, r.stderr[-800:]


def _second_library(tmp_path):
    """The same binary under another file name: a second library with its own thread pool."""
    import shutil
    copy = tmp_path / K._rowkernel.path.name
    shutil.copy(K._rowkernel.path, copy)
    lib, name, why = K.load_library([(copy, "a copy")])
    assert lib is not None, why
    return lib


@needs_c
def test_a_library_of_another_abi_is_refused_by_name_before_anything_changes(tmp_path):
    lib = _second_library(tmp_path)
    lib.ABI = K.ABI - 1                                # as a stale build would report
    before = K._rowkernel, K.THREADS
    with pytest.raises(K.LessonkitError, match=rf"{lib.path.name}: ABI {K.ABI - 1}, this code needs {K.ABI}"):
        with K.use_library(lib):
            pass
    assert (K._rowkernel, K.THREADS) == before


@needs_c
def test_the_thread_count_follows_a_library_swap_and_comes_back(tmp_path):
    """The count is the process's: the library swapped in gets it before a product reaches it, and the one swapped
    back gets the count last asked for, inside the block or before it."""
    lib, original, seen = _second_library(tmp_path), K._rowkernel, []
    set_threads = lib.set_threads
    lib.set_threads = lambda n: seen.append(n) or set_threads(n)
    rw = row_weight.RowWeight(torch.randn(64, 40, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    try:
        K.set_threads(2)
        want = rw.rows(x)
        with K.use_library(lib):
            assert K._rowkernel is lib and seen == [2] and K.THREADS == 2
            assert torch.equal(rw.rows(x), want)
            K.set_threads(3)
            assert seen == [2, 3]
        assert K._rowkernel is original and K.THREADS == 3
        with K.use_library(None):
            assert K._rowkernel is None and K.set_threads(4) == 1
        assert K._rowkernel is original and K.THREADS == 4
    finally:
        K.set_threads(1)


@needs_c
def test_set_threads_and_library_swaps_from_two_threads(tmp_path):
    """set_threads from one Python thread while another swaps the library back and forth, products running on
    both: no crash, and afterwards the original library is in place with the count last asked for."""
    import threading
    lib, original = _second_library(tmp_path), K._rowkernel
    rw = row_weight.RowWeight(torch.randn(96, 48, generator=torch.Generator().manual_seed(3)))
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(4))
    want, errors = rw.rows(x), []

    def setter():
        try:
            for i in range(300):
                K.set_threads(1 + i % 3)
                assert torch.equal(rw.rows(x), want)
        except Exception as e:          # noqa: BLE001 (reported by the main thread)
            errors.append(e)

    t = threading.Thread(target=setter)
    t.start()
    try:
        for _ in range(100):
            with K.use_library(lib):
                assert torch.equal(rw.rows(x), want)
        t.join()
        assert not errors, errors
        assert K._rowkernel is original and K.THREADS == 3        # the setter's last count: 1 + 299 % 3
    finally:
        t.join()
        K.set_threads(1)
