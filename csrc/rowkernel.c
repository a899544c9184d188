/* rowkernel.c: the kernel library's entry points. The library: a row-invariant matrix product for short
forwards, Y[m, :] = X[m, :] @ W for 1 <= M rows, and a whole forward built on it.

Why. A BLAS picks different code paths for different row counts (MKL: a 1-row product is a GEMV, a
k-row GEMM computes tiles of rows with another summation order), so a position's logits in a 1-row
decode forward and inside a k-row verify forward can differ in the last bits. This kernel computes
every output element as ONE fixed-order chain of fused multiply-adds over the input dimension:

    acc = 0;  for k in 0 .. K-1:  acc = fma(X[m, k], W[k, n], acc);  Y[m, n] = acc

whatever M is, wherever the row sits among the M rows, whatever the other rows hold. Rows are only
grouped to share the weight loads (a register block of MB rows x V vectors of 8 columns), never to
share arithmetic, so a row's bits never depend on M. Threads (set_threads) split a product's strips, so an
output element is still one chain computed by one thread: the bits cannot depend on the thread count.

Layout. W ([K, N] in GEMV form) is packed once, at load, into strips of STRIP = 16 columns (N rounded
up to a multiple of 16 with zero columns): strip s holds rows 0..K-1 of its 16 columns contiguously, one
64-byte line per input row, so every product streams the weights sequentially. A register block is MB
rows x P strips; a one-row product runs 4 strips side by side (8 independent FMA chains), so it is as fast
as a GEMV, and an M-row product reads every weight from memory once: extra rows cost arithmetic only.
Native blocks (llama.cpp's Q4_1 and Q8_0, format.h's strip-blocks) give the float32 weights' bits at a fifth of
the bytes (products.c says why); the int8 numerics take integer dots on them (intdot.c).
The library is five compilation units (kernel_impl.h: what each holds, and that each calls only units below it):
this file (the entry points: arguments checked, the path word decoded once), forward.c (a whole forward),
products.c (one product, every kind and ISA; the kind table), intdot.c (the int8 numerics) and pool.c (threads).

Paths, same arithmetic: AVX2 + FMA (selected at import when the CPU has both), AVX-512 F + BW for the
native-block register blocks (the rest of that path is AVX2's: products.c's "AVX-512"), and a portable C path,
one correctly rounded fma per weight (never the C library's fmaf, which is not correctly rounded everywhere:
kernel_impl.h's "fma"). They are tested for equal bits. The path word (rowkernel.h: enum rk_isa in its low two
bits, PATH_NO_VNNI above) is decoded once per call, here (decode_path), into a path_t the units are handed.

Platforms. A plain C shared library with no Python ABI: lessonkit/engine/kernel.py loads it with ctypes
(which releases the GIL during every call) and turns the rk_* entry points' error codes into exceptions,
so one binary per OS and CPU serves every CPython. csrc/build_kernels.py cross-builds six with zig cc (the
units compiled separately, linked into one file), one set of flags (-O3 -std=c11 -ffp-contract=off, hidden
symbols but rk_*, stripped): Linux x86_64 and aarch64 (glibc 2.17, manylinux2014), Windows x86_64 and aarch64
(MinGW ABI, Win32 threads), macOS x86_64 and arm64 (11.0); `--host` builds this machine's with its own compiler (gcc, clang, or MSVC: /fp:precise). portable.h
holds all that differs between platforms: exports, threads (pthreads or CreateThread), locks and condition
variables (pthread or SRW locks / CONDITION_VARIABLE), atomics (C11 or Interlocked), the monotonic clock and
x86 feature detection (cpuid + xgetbv, for gcc/clang and MSVC). The x86 AVX2 path is chosen at run time; on
arm64 the portable path is NEON fmla (4 lanes, one rounding each), everywhere else plain C.
tests/test_platforms_kernel.py runs csrc/kernel_check.c against the shipped binaries natively (both x86
paths), under qemu-aarch64 and under wine64, and compares hashes of the output bits.

Threads. set_threads(n) starts n - 1 detached workers (a pool shared by every product, one product at a
time); a product's strips are cut into 3n contiguous chunks that the threads claim one at a time (pool.c), so
each output element is still one chain computed by one thread and the bits cannot depend on n or on who ran
which chunk (tested at 1, 2, 3 and 8 threads). */
#include "kernel_impl.h"   /* the units' shared declarations; rowkernel.h, format.h, portable.h */

/* ---- the entry points: plain C, no Python ------------------------------------------------------------
lessonkit/engine/kernel.py loads this library with ctypes (which releases the GIL around every call) and
turns the codes below into the exceptions the engine raises. Addresses are uintptr_t, sizes int64_t; every
entry point returns RK_OK or an error code. */
/* RK_ABI and the codes every entry point returns: rowkernel.h */

RK_EXPORT int32_t rk_abi(void) { return RK_ABI; }
RK_EXPORT int32_t rk_max_threads(void) { return MAXT; }
/* cpuid traps to the hypervisor in a VM (microseconds): asked once, then remembered (a benign race: every
   thread computes the same value) */
static int cpu_fma(void)
{
#if RK_ARM64
    return 1;
#elif RK_X86
    static rk_atomic ok = -1;
    if (rk_load(&ok) < 0) rk_store(&ok, rk_cpu_fma());
    return (int)rk_load(&ok);
#else
    return 0;
#endif
}

static int cpu_avx2(void)
{
    static rk_atomic ok = -1;
    if (rk_load(&ok) < 0) rk_store(&ok, rk_cpu_avx2_fma_f16c());
    return (int)rk_load(&ok);
}

RK_EXPORT int32_t rk_has_avx2(void) { return cpu_avx2(); }

static int cpu_avx512(void)
{
    static rk_atomic ok = -1;
    if (rk_load(&ok) < 0) rk_store(&ok, rk_cpu_avx512());
    return (int)rk_load(&ok);
}

RK_EXPORT int32_t rk_has_avx512(void) { return cpu_avx512(); }

#if HAVE_X86
static int cpu_vnni(void)
{
    static rk_atomic ok = -1;
    if (rk_load(&ok) < 0) rk_store(&ok, rk_cpu_avx512() && rk_cpu_avx512vnni());
    return (int)rk_load(&ok);
}
#endif

RK_EXPORT int32_t rk_has_vnni(void)
{
#if HAVE_X86
    return cpu_vnni();
#else
    return 0;
#endif
}

/* A call's path word, decoded once: its ISA (enum rk_isa; the unused value 3 runs as AVX2, as it always has,
   and every ISA is the portable path off x86), for the int8 numerics on AVX-512 whether the dot takes vpdpbusd
   (the CPU has VNNI and the word does not say PATH_NO_VNNI), and whether the portable path's fma is the
   instruction. RK_NO_AVX2 when this CPU lacks the ISA. */
int32_t decode_path(int32_t path, path_t *out)
{
    const int bits = path & PATH_ISA;
    out->isa = bits == PATH_AVX512 ? PATH_AVX512 : bits != PATH_PORTABLE ? PATH_AVX2 : PATH_PORTABLE;
    out->vnni = 0;
    out->fma = cpu_fma();
#if HAVE_X86
    if ((out->isa == PATH_AVX512 && !cpu_avx512()) || (out->isa != PATH_PORTABLE && !cpu_avx2()))
        return RK_NO_AVX2;
    out->vnni = out->isa == PATH_AVX512 && !(path & PATH_NO_VNNI) && cpu_vnni();
#else
    out->isa = PATH_PORTABLE;
#endif
    return RK_OK;
}

static int32_t product_call(product_t *p, int32_t path)
{
    if (p->m < 1 || p->k < 1 || p->n < 1 || p->ldx < p->k || p->ldy < p->n || (p->kind != KIND_F32 && p->k % QK))
        return RK_BAD_SIZES;
    const int32_t rc = decode_path(path, &p->path);
    if (rc != RK_OK)
        return rc;
    return run_product(p) ? RK_NO_MEMORY : RK_OK;
}

/* y[m, :n] = x[m, :k] @ W, W packed in float strips */
RK_EXPORT int32_t rk_matmul(uintptr_t x, int64_t m, int64_t k, int64_t ldx, uintptr_t w, int64_t n, uintptr_t y,
                            int64_t ldy, int32_t path)
{
    product_t p = {0};
    p.x = (const float *)x, p.m = m, p.k = k, p.ldx = ldx, p.w = (const void *)w, p.n = n;
    p.y = (float *)y, p.ldy = ldy, p.kind = KIND_F32;
    return product_call(&p, path & PATH_ISA);       /* float weights: the numerics bits do not apply */
}

/* the same on strip-blocks of any kind in KINDS (format.h KIND_*) */
RK_EXPORT int32_t rk_qmatmul(uintptr_t x, int64_t m, int64_t k, int64_t ldx, uintptr_t w, int32_t kind, int64_t n,
                             uintptr_t y, int64_t ldy, int32_t path)
{
    if (!block_kind(kind))
        return RK_BAD_KIND;
    product_t p = {0};
    p.x = (const float *)x, p.m = m, p.k = k, p.ldx = ldx, p.w = (const void *)w, p.kind = kind, p.n = n;
    p.y = (float *)y, p.ldy = ldy;
    return product_call(&p, path);
}

/* strip-blocks -> float strips (out: ceil(n / 16) x k x 16 floats; tests and the float32 path) */
RK_EXPORT int32_t rk_dequantise(uintptr_t w, int32_t kind, int64_t k, int64_t n, uintptr_t out, int32_t path)
{
    if (!block_kind(kind))
        return RK_BAD_KIND;
    if (k < QK || k % QK || n < 1)
        return RK_BAD_SIZES;
    path_t how;
    const int32_t rc = decode_path(path & PATH_ISA, &how);
    if (rc == RK_OK)
        dequant_strips((const uint8_t *)w, kind, k, (n + STRIP - 1) / STRIP, (float *)out, &how);
    return rc;
}

/* native strips of kind 0 / 1 -> the int8 numerics' layout, kind 2 / 3 (csrc/intdot.c; the same bytes permuted,
   dst as large as src) */
RK_EXPORT int32_t rk_repack_int(uintptr_t src, int32_t kind, int64_t k, int64_t n, uintptr_t dst)
{
    if (!block_kind(kind) || KINDS[kind].int_layout)
        return RK_BAD_KIND;
    if (k < QK || k % QK || n < 1)
        return RK_BAD_SIZES;
    repack_int((const uint8_t *)src, kind, k, (n + STRIP - 1) / STRIP, (uint8_t *)dst);
    return RK_OK;
}

/* threads a product's strips are split over (the caller is one of them); *in_use: the number running */
RK_EXPORT int32_t rk_set_threads(int32_t n, int32_t *in_use)
{
    if (n < 1 || n > MAXT)
        return RK_BAD_THREADS;
    const int running = pool_set_threads(n);
    if (in_use) *in_use = running;
    return RK_OK;
}

/* out[i] = fma(a[i], b[i], c[i]) rounded once: how 1 = the path the portable kernel takes on this CPU
   (the instruction, or soft_fmaf without one), 0 = soft_fmaf always. For the bit tests only. */
RK_EXPORT int32_t rk_fma_many(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t out, int64_t n, int32_t how)
{
    const float *pa = (const float *)a, *pb = (const float *)b, *pc = (const float *)c;
    float *po = (float *)out;
    if (n < 0)
        return RK_BAD_SIZES;
#if RK_X86 || RK_ARM64
    if (how && cpu_fma()) {
        for (int64_t i = 0; i < n; i++) po[i] = hw_fmaf(pa[i], pb[i], pc[i]);
        return RK_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) po[i] = soft_fmaf(pa[i], pb[i], pc[i]);
    return RK_OK;
}

