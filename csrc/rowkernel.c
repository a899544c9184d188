/* Row-invariant matrix product for short forwards: Y[m, :] = X[m, :] @ W for 1 <= M rows.

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

Paths, same arithmetic: AVX2 + FMA (selected at import when the CPU has both), AVX-512 F + BW for the
native-block register blocks (the rest of that path is AVX2's: see "AVX-512" below), and a portable C path,
one correctly rounded fma per weight (never the C library's fmaf, which is not correctly rounded everywhere:
see "fma" below). They are tested for equal bits.

Native blocks (qmatmul). SmolLM2 ships as llama.cpp Q4_1 blocks (32 weights: w = d * q + m, d and m
half floats, q a 4-bit code) and a Q8_0 embedding (w = d * q, q an int8). Dequantised in float32 with a
separate multiply and add, each weight is exactly the float32 the loader would produce, so a kernel that
keeps the blocks, dequantises a strip inside the register block and runs the SAME fma chain gives the
float32 path's bits at a fifth of the bytes. Why one FMA may replace the multiply and the add here: d has
at most 11 significant bits (a half float) and q at most 4 (8 for Q8_0), so d * q has at most 15 (19) and
is exact in float32; rounding it changes nothing, and fma(q, d, m) = round(d * q + m) = round(round(d * q)
+ m), the loader's two roundings. The AVX2 path uses that FMA (one instruction fewer per 8 weights); the
portable path multiplies and adds, and the tests check both against gguf's own dequantiser. The file is
compiled with -ffp-contract=off (csrc/build_kernels.py; portable.h's pragmas for clang and MSVC) so that no
other multiply and add is fused behind our back.
Packed layout, per strip of 16 output columns, per block of 32 inputs (strips in order, blocks in order):
  Q4_1 (320 bytes): d[16] f16, m[16] f16, then 16 input pairs x 16 bytes: byte c of pair j holds column
                    c's code for input 2j (low nibble) and input 2j + 1 (high nibble);
  Q8_0 (544 bytes): d[16] f16, then 32 inputs x 16 int8 codes (column c at byte c).
Up to 6 rows dequantise in registers; more rows (verify blocks, prefill) dequantise a group of strips into
an L2-sized float32 scratch in the float layout above, then run the float blocks on it: same values, same
chains, same bits, and the dequantisation is shared by all the rows.

Platforms. A plain C shared library with no Python ABI: lessonkit/engine/kernel.py loads it with ctypes
(which releases the GIL during every call) and turns the rk_* entry points' error codes into exceptions,
so one binary per OS and CPU serves every CPython. csrc/build_kernels.py cross-builds six with zig cc, one
set of flags (-O3 -std=c11 -ffp-contract=off, hidden symbols but rk_*, stripped): Linux x86_64 and aarch64
(glibc 2.17, manylinux2014), Windows x86_64 and aarch64 (MinGW ABI, Win32 threads), macOS x86_64 and arm64
(11.0); `--host` builds this machine's with its own compiler (gcc, clang, or MSVC: /fp:precise). portable.h
holds all that differs between platforms: exports, threads (pthreads or CreateThread), locks and condition
variables (pthread or SRW locks / CONDITION_VARIABLE), atomics (C11 or Interlocked), the monotonic clock and
x86 feature detection (cpuid + xgetbv, for gcc/clang and MSVC). The x86 AVX2 path is chosen at run time; on
arm64 the portable path is NEON fmla (4 lanes, one rounding each), everywhere else plain C.
tests/test_platforms_kernel.py runs csrc/kernel_check.c against the shipped binaries natively (both x86
paths), under qemu-aarch64 and under wine64, and compares hashes of the output bits.

Threads. set_threads(n) starts n - 1 detached workers (a pool shared by every product, one product at a
time); a product's strips are cut into 3n contiguous chunks that the threads claim one at a time (see "the
thread pool" below), so each output element is still one chain computed by one thread and the bits cannot
depend on n or on who ran which chunk (tested at 1, 2, 3 and 8 threads). */
#include "portable.h"
#define RK_API RK_EXPORT
#include "rowkernel.h" /* RK_ABI, error codes, the path word, rk_forward's slots, every entry point's prototype */
#include "format.h"   /* QK, STRIP, Q41_BLOCK, Q80_BLOCK, KIND_*: the packed format, shared with lessonkit/engine/blocks.py */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH 24   /* strip rows (cache lines) to prefetch ahead */
#define GROUP_BYTES (128 * 1024)   /* strips per L2-resident group, when several row blocks share it */

#define HAVE_X86 RK_X86
#if RK_ARM64
#include <arm_neon.h>
#endif

/* ---- fma: one rounding of a * b + c, never the platform's fmaf on trust ----------------------------
Every output is a chain of fmas, so every path must round a * b + c exactly once, as IEEE 754 says. A C
library's fmaf need not (MinGW-w64's is not correctly rounded: a checksum over 2 million random triples
differed from glibc's under wine64). So: the FMA instruction where the CPU has one (x86 FMA3 intrinsics,
chosen at run time; arm64 always has it, NEON vfmaq_f32), and elsewhere soft_fmaf below.

soft_fmaf, and why it is correctly rounded. The product p = (double)a * (double)b is exact (24 + 24 = 48
significant bits <= 53, and |p| <= 2^256, far from double's overflow and underflow). Rounding p + c to double
and then to float would round twice: it is wrong when the double sum lands exactly halfway between two
floats while the exact sum is not (e.g. a = 1 + 2^-23, b = (1 - 2^-23) 2^-24, c = 1 + 2^-23). So the sum is
rounded to double *to odd*: s = RN(p + c); its exact error e = p + c - s comes from Knuth's TwoSum (six
operations, exact in round-to-nearest); if e != 0 and s's last significand bit is even, s moves one ulp
towards e, onto the odd neighbour (a change of the bit pattern by one: right across powers of two too).
Boldo and Melquiond (IEEE Trans. Computers 57(4), 2008, "Emulation of FMA and correctly rounded sums:
proved algorithms using rounding to odd") prove that a value rounded to odd with p + 2 or more bits,
then rounded to nearest with p bits, is the correctly rounded exact value: 53 >= 24 + 2, and it holds for
subnormal float results (fewer bits kept) and at the overflow threshold. Inf and NaN pass through the
double sum unchanged. Needs IEEE double arithmetic without contraction or extended precision
(portable.h refuses FLT_EVAL_METHOD 2; the build passes -ffp-contract=off). Tests: rk_fma_many below,
against the FMA instruction on 2 million random and the known double-rounding triples. */
static float soft_fmaf(float a, float b, float c)
{
    const double p = (double)a * (double)b, cd = (double)c;
    double s = p + cd;
    if (!(s - s == 0.0)) return (float)s;              /* inf or nan */
    const double bb = s - p, err = (p - (s - bb)) + (cd - bb);
    if (err != 0.0) {
        uint64_t u;
        memcpy(&u, &s, sizeof u);
        if (!(u & 1)) {
            u = ((err > 0.0) == (s > 0.0)) ? u + 1 : u - 1;   /* away from zero if err has s's sign */
            memcpy(&s, &u, sizeof u);
        }
    }
    return (float)s;
}

/* ---- portable path: plain C loops, one fma per weight, 16 columns at a time ----------------------- */
#define PORTABLE_BODY(FMA)                                                                              \
    float acc[STRIP];                                                                                   \
    for (int64_t s = 0; s * STRIP < n; s++) {                                                           \
        const float *ws = w + s * STRIP * k;                                                            \
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;                               \
        for (int64_t r = 0; r < m; r++) {                                                               \
            const float *xr = x + r * ldx;                                                              \
            for (int c = 0; c < STRIP; c++) acc[c] = 0.0f;                                              \
            for (int64_t i = 0; i < k; i++)                                                             \
                for (int c = 0; c < STRIP; c++) acc[c] = FMA(xr[i], ws[STRIP * i + c], acc[c]);         \
            memcpy(y + r * ldy + s * STRIP, acc, (size_t)nc * sizeof(float));                           \
        }                                                                                               \
    }

static void matmul_soft(const float *x, int64_t ldx, int64_t m, int64_t k, const float *w, float *y, int64_t ldy,
                        int64_t n)
{
    PORTABLE_BODY(soft_fmaf)
}

#if RK_X86
/* the FMA3 instruction on one float (vfmadd..ss): the portable path on CPUs with FMA, no AVX2 vectors */
RK_TARGET("fma") static inline float hw_fmaf(float a, float b, float c)
{
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}
RK_TARGET("fma") static void matmul_hw(const float *x, int64_t ldx, int64_t m, int64_t k, const float *w, float *y,
                                       int64_t ldy, int64_t n)
{
    PORTABLE_BODY(hw_fmaf)
}
#elif RK_ARM64
/* arm64 always has FMA: NEON fmla on 4 columns at a time, the same one rounding per element */
static inline float hw_fmaf(float a, float b, float c)
{
    return vgetq_lane_f32(vfmaq_f32(vdupq_n_f32(c), vdupq_n_f32(a), vdupq_n_f32(b)), 0);
}
static void matmul_hw(const float *x, int64_t ldx, int64_t m, int64_t k, const float *w, float *y, int64_t ldy,
                      int64_t n)
{
    for (int64_t s = 0; s * STRIP < n; s++) {
        const float *ws = w + s * STRIP * k;
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        for (int64_t r = 0; r < m; r++) {
            const float *xr = x + r * ldx;
            float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            for (int64_t i = 0; i < k; i++) {
                const float32x4_t xb = vdupq_n_f32(xr[i]);
                for (int v = 0; v < 4; v++) acc[v] = vfmaq_f32(acc[v], xb, vld1q_f32(ws + STRIP * i + 4 * v));
            }
            float out[STRIP];
            for (int v = 0; v < 4; v++) vst1q_f32(out + 4 * v, acc[v]);
            memcpy(y + r * ldy + s * STRIP, out, (size_t)nc * sizeof(float));
        }
    }
}
#endif

typedef void (*matmul_fn)(const float *, int64_t, int64_t, int64_t, const float *, float *, int64_t, int64_t);

/* the portable path's fma: the instruction when this CPU has it (arm64: always), else soft_fmaf */
static int hw_fma(void)
{
#if RK_ARM64
    return 1;
#elif RK_X86
    static rk_atomic hw = -1;              /* every thread computes the same value; atomic: no data race */
    if (rk_load(&hw) < 0) rk_store(&hw, rk_cpu_fma());
    return (int)rk_load(&hw);
#else
    return 0;
#endif
}

static void matmul_portable(const float *x, int64_t ldx, int64_t m, int64_t k, const float *w, float *y,
                            int64_t ldy, int64_t n)
{
#if RK_X86 || RK_ARM64
    if (hw_fma()) { matmul_hw(x, ldx, m, k, w, y, ldy, n); return; }
#endif
    matmul_soft(x, ldx, m, k, w, y, ldy, n);
}

/* ---- AVX2 + FMA path -------------------------------------------------------------------------- */
#if HAVE_X86
#define AVX2 RK_TARGET("avx2,fma")
#define LANES _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define UNROLL RK_UNROLL

/* the accumulators of an MB x P register block: zeroed, then stored with the tail columns masked */
#define ZERO_ACC(MB, P)                                                                                 \
    UNROLL for (int r = 0; r < MB; r++)                                                                  \
        UNROLL for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_setzero_ps();
#define STORE_ACC(MB, P)                                                                                \
    UNROLL for (int v = 0; v < 2 * P; v++) {                                                             \
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(ncols - 8 * v)), LANES);         \
        UNROLL for (int r = 0; r < MB; r++) _mm256_maskstore_ps(y + r * ldy + 8 * v, keep, acc[r][v]);   \
    }

/* MB rows x P strips (2 vectors of 8 columns each); strip s of the group starts at wp + s * 16 * k */
#define DEFINE_BLOCK(MB, P)                                                                         \
AVX2 static void block_##MB##x##P(const float *x, int64_t ldx, int64_t k, const float *wp,   \
                                  const float *pf, float *y, int64_t ldy, int64_t ncols)      \
{                                                                                                    \
    __m256 acc[MB][2 * P];                                                                           \
    UNROLL for (int r = 0; r < MB; r++)                                                              \
        UNROLL for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_setzero_ps();                      \
    for (int64_t i = 0; i < k; i++) {                                                             \
        __m256 wv[2 * P];                                                                            \
        UNROLL for (int s = 0; s < P; s++) {                                                         \
            if (pf) _mm_prefetch((const char *)(pf + s * STRIP * k + STRIP * i), _MM_HINT_T0);         \
            wv[2 * s] = _mm256_loadu_ps(wp + s * STRIP * k + STRIP * i);                             \
            wv[2 * s + 1] = _mm256_loadu_ps(wp + s * STRIP * k + STRIP * i + 8);                     \
        }                                                                                            \
        UNROLL for (int r = 0; r < MB; r++) {                                                        \
            const __m256 xb = _mm256_broadcast_ss(x + r * ldx + i);                                  \
            UNROLL for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_fmadd_ps(xb, wv[v], acc[r][v]); \
        }                                                                                            \
    }                                                                                                \
    UNROLL for (int v = 0; v < 2 * P; v++) {                                                         \
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(ncols - 8 * v)), LANES);     \
        UNROLL for (int r = 0; r < MB; r++) _mm256_maskstore_ps(y + r * ldy + 8 * v, keep, acc[r][v]); \
    }                                                                                                \
}

DEFINE_BLOCK(1, 4)
DEFINE_BLOCK(1, 2)
DEFINE_BLOCK(1, 1)
DEFINE_BLOCK(2, 2)
DEFINE_BLOCK(2, 1)
DEFINE_BLOCK(3, 2)
DEFINE_BLOCK(3, 1)
DEFINE_BLOCK(4, 1)
DEFINE_BLOCK(5, 1)
DEFINE_BLOCK(6, 1)

typedef void (*block_fn)(const float *, int64_t, int64_t, const float *, const float *, float *, int64_t,
                         int64_t);

/* for a row-block height MB: the widest block (in strips) first, then narrower ones for the tail */
static const block_fn BLOCKS[7][3] = {
    {0, 0, 0},
    {block_1x4, block_1x2, block_1x1},
    {block_2x2, block_2x1, 0},
    {block_3x2, block_3x1, 0},
    {block_4x1, 0, 0},
    {block_5x1, 0, 0},
    {block_6x1, 0, 0},
};
static const int STRIPS[7][3] = {{0, 0, 0}, {4, 2, 1}, {2, 1, 0}, {2, 1, 0}, {1, 0, 0}, {1, 0, 0}, {1, 0, 0}};

/* one row block of height mb against strips [s0, s1) of the packed weights. Prefetch: `ahead` streams
the block's own strips PREFETCH lines ahead (first pass over memory-resident weights), `next` is the
offset of the group to fetch into cache while this block computes on cached strips (or 0: none). */
static void rows_avx2(const float *x, int64_t ldx, int mb, int64_t k, const float *w, int64_t s0,
                      int64_t s1, float *y, int64_t ldy, int64_t n, int ahead, int64_t next)
{
    int64_t s = s0;
    for (int t = 0; t < 3 && STRIPS[mb][t]; t++) {
        const int p = STRIPS[mb][t];
        for (; s + p <= s1; s += p) {
            const float *ws = w + s * STRIP * k;
            const float *pf = next ? ws + next : (ahead && p == 1) ? ws + STRIP * PREFETCH : NULL;
            BLOCKS[mb][t](x, ldx, k, ws, pf, y + s * STRIP, ldy, n - s * STRIP);
        }
    }
}

static void matmul_avx2(const float *x, int64_t ldx, int64_t m, int64_t k,
                        const float *w, float *y, int64_t ldy, int64_t n)
{
    const int64_t nstrips = (n + STRIP - 1) / STRIP;
    /* One row block (m <= 6): one pass over all strips. More rows: groups of strips small enough that
       two fit in L2; every row block passes over a group while it is cached, and the last row block
       prefetches the next group, so the weights leave memory once and memory never idles. */
    int64_t gs = m <= 6 ? nstrips : GROUP_BYTES / (STRIP * (int64_t)sizeof(float) * k);
    if (gs < 1) gs = 1;
    for (int64_t g = 0; g < nstrips; g += gs) {
        const int64_t g1 = g + gs < nstrips ? g + gs : nstrips;
        for (int64_t r0 = 0; r0 < m;) {
            const int64_t rest = m - r0;
            const int mb = rest >= 9 ? 6 : rest >= 7 ? 4 : (int)rest;   /* 7, 8 rows: 4 + 3, 4 + 4 */
            const int last = r0 + mb >= m && g1 < nstrips;
            rows_avx2(x + r0 * ldx, ldx, mb, k, w, g, g1, y + r0 * ldy, ldy, n, r0 == 0,
                      last ? gs * STRIP * k : 0);
            r0 += mb;
        }
    }
}
#endif

/* ---- native blocks: Q4_1 and Q8_0 --------------------------------------------------------------- */
/* QK, Q41_BLOCK, Q80_BLOCK and the kinds: format.h */

/* IEEE half to float, exact (normals, subnormals, zeros, inf, nan) */
static float half_to_float(lk_half h)
{
    const int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f = e == 0 ? ldexpf((float)mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexpf((float)(mant | 0x400), e - 25);
    return (h & 0x8000) ? -f : f;
}

/* The dequantisers: one strip-block -> QK x STRIP floats in the float strip layout (input i's 16 columns at
   out[STRIP * i]), or column c alone -> QK floats. w = d * q (+ m) in two roundings, as the loader computes the
   float32 weights (the AVX2 one fuses them: exact, see "Native blocks" above). */
static void dequant_q41(const uint8_t *b, float *o)
{
    const block_q41 *blk = (const block_q41 *)b;
    float d[STRIP], mn[STRIP];
    for (int c = 0; c < STRIP; c++) { d[c] = half_to_float(blk->d[c]); mn[c] = half_to_float(blk->m[c]); }
    for (int j = 0; j < QK / 2; j++)
        for (int c = 0; c < STRIP; c++) {
            const uint8_t q = blk->qs[j][c];
            o[STRIP * (2 * j) + c] = (float)(q & 15) * d[c] + mn[c];      /* two roundings: no FMA */
            o[STRIP * (2 * j + 1) + c] = (float)(q >> 4) * d[c] + mn[c];
        }
}
static void dequant_q80(const uint8_t *b, float *o)
{
    const block_q80 *blk = (const block_q80 *)b;
    float d[STRIP];
    for (int c = 0; c < STRIP; c++) d[c] = half_to_float(blk->d[c]);
    for (int i = 0; i < QK; i++)
        for (int c = 0; c < STRIP; c++) o[STRIP * i + c] = (float)blk->qs[i][c] * d[c];
}
static void column_q41(const uint8_t *b, int c, float *out)
{
    const block_q41 *blk = (const block_q41 *)b;
    const float d = half_to_float(blk->d[c]), mn = half_to_float(blk->m[c]);
    for (int j = 0; j < QK / 2; j++) {
        const uint8_t q = blk->qs[j][c];
        out[2 * j] = (float)(q & 15) * d + mn;
        out[2 * j + 1] = (float)(q >> 4) * d + mn;
    }
}
static void column_q80(const uint8_t *b, int c, float *out)
{
    const block_q80 *blk = (const block_q80 *)b;
    const float d = half_to_float(blk->d[c]);
    for (int i = 0; i < QK; i++) out[i] = (float)blk->qs[i][c] * d;
}

#if HAVE_X86
#define AVX2H RK_TARGET("avx2,fma,f16c")
AVX2H static void dequant_q41_avx2(const uint8_t *b, float *o)
{
    const block_q41 *blk = (const block_q41 *)b;
    const __m256i low = _mm256_set1_epi32(15);
    for (int h = 0; h < 2; h++) {                          /* columns 8h .. 8h + 7 */
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8 * h)));
        const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->m + 8 * h)));
        for (int j = 0; j < QK / 2; j++) {
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs[j] + 8 * h)));
            _mm256_storeu_ps(o + STRIP * (2 * j) + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, low)), d, mn));
            _mm256_storeu_ps(o + STRIP * (2 * j + 1) + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), d, mn));
        }
    }
}
AVX2H static void dequant_q80_avx2(const uint8_t *b, float *o)
{
    const block_q80 *blk = (const block_q80 *)b;
    for (int h = 0; h < 2; h++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8 * h)));
        for (int i = 0; i < QK; i++) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs[i] + 8 * h)));
            _mm256_storeu_ps(o + STRIP * i + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
#else
#define dequant_q41_avx2 NULL
#define dequant_q80_avx2 NULL
#endif

/* the int8 numerics' layouts (csrc/intdot.c) */
static void dequant_q41i(const uint8_t *b, float *o);
static void dequant_q80i(const uint8_t *b, float *o);
static void column_q41i(const uint8_t *b, int c, float *out);
static void column_q80i(const uint8_t *b, int c, float *out);

/* ---- the kinds: one row each, what the code asks of a kind (ggml's type_traits) ------------------------ */
typedef struct {
    size_t bytes;           /* of one strip-block (its format.h struct) */
    int has_min;            /* w = d * q + m (Q4_1), else w = d * q (Q8_0) */
    int int_layout;         /* codes permuted for integer dots: products take the int8 numerics (csrc/intdot.c) */
    void (*dequant)(const uint8_t *blk, float *out);           /* portable dequantiser of a strip-block */
    void (*dequant_avx2)(const uint8_t *blk, float *out);      /* the same with AVX2 + F16C (NULL: none) */
    void (*column)(const uint8_t *blk, int c, float *out);     /* column c's QK weights */
} kind_t;
static const kind_t KINDS[] = {
    [KIND_Q41] = {sizeof(block_q41), 1, 0, dequant_q41, dequant_q41_avx2, column_q41},
    [KIND_Q80] = {sizeof(block_q80), 0, 0, dequant_q80, dequant_q80_avx2, column_q80},
    [KIND_Q41I] = {sizeof(block_q41i), 1, 1, dequant_q41i, NULL, column_q41i},
    [KIND_Q80I] = {sizeof(block_q80i), 0, 1, dequant_q80i, NULL, column_q80i},
};
#define N_KINDS (int64_t)(sizeof KINDS / sizeof KINDS[0])

/* a kind of strip-blocks (format.h's KIND_*, not KIND_F32) */
static int block_kind(int64_t kind) { return kind >= 0 && kind < N_KINDS; }

static size_t strip_bytes(int kind, int64_t k) { return (size_t)(k / QK) * KINDS[kind].bytes; }

/* strips [0, ns) of packed blocks -> the float strip layout (out: ns x k x 16 floats) */
static void dequant_strips(const uint8_t *w, int kind, int64_t k, int64_t ns, float *out, enum rk_isa isa)
{
    const kind_t *kt = &KINDS[kind];
    void (*dequant)(const uint8_t *, float *) = isa != PATH_PORTABLE && kt->dequant_avx2 ? kt->dequant_avx2 : kt->dequant;
    for (int64_t s = 0; s < ns; s++)
        for (int64_t b = 0; b < k / QK; b++) dequant(w + (s * (k / QK) + b) * kt->bytes, out + s * STRIP * k + b * QK * STRIP);
}

#if HAVE_X86
/* MB rows x P strips of Q4_1 blocks, dequantised in registers: per input pair the weights of the P strips
   are built once (d * q + m: a multiply, then an add) and feed every row's chain, input 2j then 2j + 1 */
#define DEFINE_Q41(MB, P)                                                                               \
AVX2H static void q41_##MB##x##P(const float *x, int64_t ldx, int64_t k, const uint8_t *wp,       \
                                 size_t sb, float *y, int64_t ldy, int64_t ncols)                 \
{                                                                                                        \
    __m256 acc[MB][2 * P];                                                                               \
    const __m256i low = _mm256_set1_epi32(15);                                                           \
    ZERO_ACC(MB, P)                                                                                      \
    for (int64_t b = 0; b < k / QK; b++) {                                                            \
        __m256 d[2 * P], mn[2 * P];                                                                      \
        UNROLL for (int v = 0; v < 2 * P; v++) {                                                         \
            const block_q41 *blk = (const block_q41 *)(wp + (v / 2) * sb) + b;   /* columns 8 (v % 2) .. */ \
            d[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8 * (v % 2))));            \
            mn[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->m + 8 * (v % 2))));           \
        }                                                                                                \
        const float *xb = x + b * QK;                                                                    \
        for (int j = 0; j < QK / 2; j++) {                                                               \
            /* one vector of 8 columns at a time: its two weights vectors live only until its FMAs */    \
            UNROLL for (int v = 0; v < 2 * P; v++) {                                                     \
                const uint8_t *q = ((const block_q41 *)(wp + (v / 2) * sb) + b)->qs[j] + 8 * (v % 2);    \
                const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));             \
                const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, low)), d[v], mn[v]); \
                const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4)), d[v], mn[v]);  \
                UNROLL for (int r = 0; r < MB; r++)                                                      \
                    acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(xb + r * ldx + 2 * j + 1), w1,       \
                                    _mm256_fmadd_ps(_mm256_broadcast_ss(xb + r * ldx + 2 * j), w0, acc[r][v])); \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    STORE_ACC(MB, P)                                                                                     \
}

/* the same for Q8_0 blocks: w = d * q, one input at a time */
#define DEFINE_Q80(MB, P)                                                                               \
AVX2H static void q80_##MB##x##P(const float *x, int64_t ldx, int64_t k, const uint8_t *wp,       \
                                 size_t sb, float *y, int64_t ldy, int64_t ncols)                 \
{                                                                                                        \
    __m256 acc[MB][2 * P];                                                                               \
    ZERO_ACC(MB, P)                                                                                      \
    for (int64_t b = 0; b < k / QK; b++) {                                                            \
        __m256 d[2 * P];                                                                                 \
        UNROLL for (int v = 0; v < 2 * P; v++)                                                           \
            d[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(((const block_q80 *)(wp + (v / 2) * sb) + b)->d + 8 * (v % 2)))); \
        const float *xb = x + b * QK;                                                                    \
        for (int i = 0; i < QK; i++) {                                                                   \
            UNROLL for (int v = 0; v < 2 * P; v++) {                                                     \
                const int8_t *q = ((const block_q80 *)(wp + (v / 2) * sb) + b)->qs[i] + 8 * (v % 2);     \
                const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), d[v]); \
                UNROLL for (int r = 0; r < MB; r++)                                                      \
                    acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(xb + r * ldx + i), w, acc[r][v]);    \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    STORE_ACC(MB, P)                                                                                     \
}

#define DEFINE_NATIVE(MB, P) DEFINE_Q41(MB, P) DEFINE_Q80(MB, P)
DEFINE_NATIVE(1, 4)
DEFINE_NATIVE(1, 2)
DEFINE_NATIVE(1, 1)
DEFINE_NATIVE(2, 2)
DEFINE_NATIVE(2, 1)
DEFINE_NATIVE(3, 2)
DEFINE_NATIVE(3, 1)
DEFINE_NATIVE(4, 1)
DEFINE_NATIVE(5, 1)
DEFINE_NATIVE(6, 1)

typedef void (*qblock_fn)(const float *, int64_t, int64_t, const uint8_t *, size_t, float *, int64_t,
                          int64_t);
#define NATIVE_TABLE(Q) {                                                                  \
    {0, 0, 0}, {Q##_1x4, Q##_1x2, Q##_1x1}, {Q##_2x2, Q##_2x1, 0}, {Q##_3x2, Q##_3x1, 0}, \
    {Q##_4x1, 0, 0}, {Q##_5x1, 0, 0}, {Q##_6x1, 0, 0}}
static const qblock_fn QBLOCKS[2][7][3] = {NATIVE_TABLE(q41), NATIVE_TABLE(q80)};

/* ---- AVX-512: the native blocks, one strip (16 columns) per 512-bit register --------------------------
The same chains as the AVX2 blocks above (per input: w = fma(q, d, m) exactly as the loader's two roundings,
then acc = fma(x, w, acc)), 16 lanes at a time, so the bits are the AVX2 path's; what changes is how many
instructions build a weight (one widening, one mask or shift, one convert and one fma for 16 weights instead
of 8). Used for products of at most 6 rows on native blocks; every other product of the avx512 path runs
the AVX2 code (same bits). Chosen at run time (rk_has_avx512: F, BW, and the OS saving the 512-bit state). */
#define AVX512H RK_TARGET("avx512f,avx512bw,avx2,fma,f16c")
#define DEFINE_Q41_512(MB, P)                                                                           \
AVX512H static void q41z_##MB##x##P(const float *x, int64_t ldx, int64_t k, const uint8_t *wp,         \
                                    size_t sb, float *y, int64_t ldy, int64_t ncols)                   \
{                                                                                                        \
    __m512 acc[MB][P];                                                                                   \
    const __m512i low = _mm512_set1_epi32(15);                                                           \
    UNROLL for (int r = 0; r < MB; r++) UNROLL for (int v = 0; v < P; v++) acc[r][v] = _mm512_setzero_ps(); \
    for (int64_t b = 0; b < k / QK; b++) {                                                            \
        __m512 d[P], mn[P];                                                                              \
        UNROLL for (int v = 0; v < P; v++) {                                                             \
            const block_q41 *blk = (const block_q41 *)(wp + v * sb) + b;                                 \
            d[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk->d));                         \
            mn[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk->m));                        \
        }                                                                                                \
        const float *xb = x + b * QK;                                                                    \
        for (int j = 0; j < QK / 2; j++) {                                                               \
            UNROLL for (int v = 0; v < P; v++) {                                                         \
                const uint8_t *q = ((const block_q41 *)(wp + v * sb) + b)->qs[j];                        \
                const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));             \
                const __m512 w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, low)), d[v], mn[v]); \
                const __m512 w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4)), d[v], mn[v]);  \
                UNROLL for (int r = 0; r < MB; r++)                                                      \
                    acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ldx + 2 * j + 1]), w1,             \
                                    _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ldx + 2 * j]), w0, acc[r][v])); \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    STORE_ACC_512(MB, P)                                                                                 \
}
#define DEFINE_Q80_512(MB, P)                                                                           \
AVX512H static void q80z_##MB##x##P(const float *x, int64_t ldx, int64_t k, const uint8_t *wp,         \
                                    size_t sb, float *y, int64_t ldy, int64_t ncols)                   \
{                                                                                                        \
    __m512 acc[MB][P];                                                                                   \
    UNROLL for (int r = 0; r < MB; r++) UNROLL for (int v = 0; v < P; v++) acc[r][v] = _mm512_setzero_ps(); \
    for (int64_t b = 0; b < k / QK; b++) {                                                            \
        __m512 d[P];                                                                                     \
        UNROLL for (int v = 0; v < P; v++)                                                               \
            d[v] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const block_q80 *)(wp + v * sb) + b)->d)); \
        const float *xb = x + b * QK;                                                                    \
        for (int i = 0; i < QK; i++) {                                                                   \
            UNROLL for (int v = 0; v < P; v++) {                                                         \
                const int8_t *q = ((const block_q80 *)(wp + v * sb) + b)->qs[i];                         \
                const __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d[v]); \
                UNROLL for (int r = 0; r < MB; r++)                                                      \
                    acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ldx + i]), w, acc[r][v]);          \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    STORE_ACC_512(MB, P)                                                                                 \
}
/* the last strip may hold fewer than 16 real columns: a masked store */
#define STORE_ACC_512(MB, P)                                                                            \
    UNROLL for (int v = 0; v < P; v++) {                                                                 \
        const int64_t left = ncols - STRIP * v;                                                          \
        const __mmask16 keep = left >= STRIP ? (__mmask16)0xffff : (__mmask16)((1u << (left > 0 ? left : 0)) - 1u); \
        UNROLL for (int r = 0; r < MB; r++) _mm512_mask_storeu_ps(y + r * ldy + STRIP * v, keep, acc[r][v]); \
    }
#define DEFINE_NATIVE_512(MB, P) DEFINE_Q41_512(MB, P) DEFINE_Q80_512(MB, P)
DEFINE_NATIVE_512(1, 8)
DEFINE_NATIVE_512(1, 4)
DEFINE_NATIVE_512(1, 1)
DEFINE_NATIVE_512(2, 4)
DEFINE_NATIVE_512(2, 1)
DEFINE_NATIVE_512(3, 4)
DEFINE_NATIVE_512(3, 1)
DEFINE_NATIVE_512(4, 2)
DEFINE_NATIVE_512(4, 1)
DEFINE_NATIVE_512(5, 2)
DEFINE_NATIVE_512(5, 1)
DEFINE_NATIVE_512(6, 2)
DEFINE_NATIVE_512(6, 1)
/* register blocks of the 512-bit path: widths in strips per row count (MB * P accumulators, P d and P m
   registers, a few temporaries: at most 28 of the 32 zmm registers) */
static const int STRIPS_512[7][3] = {{0, 0, 0}, {8, 4, 1}, {4, 1, 0}, {4, 1, 0}, {2, 1, 0}, {2, 1, 0}, {2, 1, 0}};
#define NATIVE_TABLE_512(Q) {                                                                    \
    {0, 0, 0}, {Q##_1x8, Q##_1x4, Q##_1x1}, {Q##_2x4, Q##_2x1, 0}, {Q##_3x4, Q##_3x1, 0},               \
    {Q##_4x2, Q##_4x1, 0}, {Q##_5x2, Q##_5x1, 0}, {Q##_6x2, Q##_6x1, 0}}
static const qblock_fn QBLOCKS_512[2][7][3] = {NATIVE_TABLE_512(q41z), NATIVE_TABLE_512(q80z)};

/* m <= 6 rows, every strip, one register block height: widths[t] strips at a time with blocks[t], widest
   first (the AVX2 blocks' widths as rows_avx2; the AVX-512 blocks' in STRIPS_512) */
static void qrows_with(const int widths[3], const qblock_fn blocks[3], const float *x, int64_t ldx, int64_t k,
                       const uint8_t *w, int kind, float *y, int64_t ldy, int64_t n)
{
    const int64_t nstrips = (n + STRIP - 1) / STRIP;
    const size_t sb = strip_bytes(kind, k);
    int64_t s = 0;
    for (int t = 0; t < 3 && widths[t]; t++)
        for (; s + widths[t] <= nstrips; s += widths[t])
            blocks[t](x, ldx, k, w + s * sb, sb, y + s * STRIP, ldy, n - s * STRIP);
}

static void qrows_avx2(const float *x, int64_t ldx, int m, int64_t k, const uint8_t *w, int kind, float *y,
                       int64_t ldy, int64_t n)
{
    qrows_with(STRIPS[m], QBLOCKS[kind][m], x, ldx, k, w, kind, y, ldy, n);
}

static void qrows_avx512(const float *x, int64_t ldx, int m, int64_t k, const uint8_t *w, int kind, float *y,
                         int64_t ldy, int64_t n)
{
    qrows_with(STRIPS_512[m], QBLOCKS_512[kind][m], x, ldx, k, w, kind, y, ldy, n);
}
#endif

/* ---- one product on a range of strips; the thread pool splits products into such ranges ----------- */
typedef struct {
    const float *x;
    int64_t ldx, m, k;
    const void *w;          /* float strips (KIND_F32) or strip-blocks of a kind in KINDS */
    int kind;
    enum rk_isa isa;        /* the call's path word, decoded once (decode_path) */
    int vnni;               /* the int8 numerics' dot on AVX-512: vpdpbusd (decode_path) */
    float *y;
    int64_t ldy, n;
    float **scratch;        /* per part: GROUP_BYTES of float strips (native weights, M > 6 or portable) */
    const void *qx;         /* int8 numerics: the rows quantised once per product (a qx_t) */
} product_t;

#include "intdot.c"         /* the int8 numerics: integer block dots on native weights */

static int64_t group_strips(int64_t k)
{
    const int64_t gs = GROUP_BYTES / (STRIP * (int64_t)sizeof(float) * k);
    return gs < 1 ? 1 : gs;
}

/* float strips on the ISA's path: AVX2's blocks, or the portable loops */
static void matmul_on(enum rk_isa isa, const float *x, int64_t ldx, int64_t m, int64_t k, const float *w, float *y,
                      int64_t ldy, int64_t n)
{
#if HAVE_X86
    if (isa != PATH_PORTABLE) { matmul_avx2(x, ldx, m, k, w, y, ldy, n); return; }
#endif
    (void)isa;
    matmul_portable(x, ldx, m, k, w, y, ldy, n);
}

/* native weights through the float blocks: a group of strips dequantised into scratch, then every row */
static void native_via_scratch(const product_t *p, const uint8_t *w, float *y, int64_t n, float *buf)
{
    const int64_t nstrips = (n + STRIP - 1) / STRIP, gs = group_strips(p->k);
    const size_t sb = strip_bytes(p->kind, p->k);
    for (int64_t g = 0; g < nstrips; g += gs) {
        const int64_t ns = g + gs < nstrips ? gs : nstrips - g, cols = n - g * STRIP;
        dequant_strips(w + g * sb, p->kind, p->k, ns, buf, p->isa);
        matmul_on(p->isa, p->x, p->ldx, p->m, p->k, buf, y + g * STRIP, p->ldy, cols < ns * STRIP ? cols : ns * STRIP);
    }
}

/* chunk `part` of `parts` of a product: a range of whole strips, its ends on multiples of 4 strips (the
   one-row register block's width) but the last; `thread` picks the scratch buffer */
static void product_part(void *ctx, int part, int parts, int thread)
{
    const product_t *p = (const product_t *)ctx;
    const int64_t nstrips = (p->n + STRIP - 1) / STRIP;
    const int64_t s0 = part == 0 ? 0 : (nstrips * part / parts) & ~(int64_t)3;
    const int64_t s1 = part == parts - 1 ? nstrips : (nstrips * (part + 1) / parts) & ~(int64_t)3;
    if (s0 >= s1)
        return;
    float *y = p->y + s0 * STRIP;
    const int64_t n = (s1 * STRIP < p->n ? s1 * STRIP : p->n) - s0 * STRIP;
    if (p->kind == KIND_F32) {
        matmul_on(p->isa, p->x, p->ldx, p->m, p->k, (const float *)p->w + s0 * STRIP * p->k, y, p->ldy, n);
        return;
    }
    const uint8_t *w = (const uint8_t *)p->w + s0 * strip_bytes(p->kind, p->k);
    if (KINDS[p->kind].int_layout) {
        int_product((const qx_t *)p->qx, p->m, p->k, w, p->kind, y, p->ldy, n, p->isa, p->vnni);
        return;
    }
#if HAVE_X86
    if (p->isa == PATH_AVX512 && p->m <= 6) { qrows_avx512(p->x, p->ldx, (int)p->m, p->k, w, p->kind, y, p->ldy, n); return; }
    if (p->isa == PATH_AVX2 && p->m <= 6) { qrows_avx2(p->x, p->ldx, (int)p->m, p->k, w, p->kind, y, p->ldy, n); return; }
#endif
    native_via_scratch(p, w, y, n, p->scratch[thread]);
}

/* ---- the thread pool ------------------------------------------------------------------------------
A job (one product, or one layer's attention) is cut into CHUNKS per thread, more chunks than threads, and
every participant (the caller and the active workers) claims chunks one at a time from one 64-bit word until
none is left; the caller then waits for the chunks others claimed. A chunk is a contiguous range of output
strips (attention: of row-head pairs), so every output element is still one chain computed by one thread and
the bits do not depend on the thread count or on who ran which chunk. Why claim instead of a fixed share per
thread: with more threads than free cores (other programs, the test suite's workers) a worker can lose its
core for a scheduler tick, and with fixed shares every product then waited for it (measured 2026-12-03 on an
Intel Xeon, 2 cores, three busy processes beside it: 2 threads decoded 2.2-2.4 tokens/s against 26-28 with 1
thread; docs/kernel.md); with claiming, the caller and the running workers take the chunks a descheduled
worker never claimed.

The job word: job number (24 bits) | threads (8) | chunks (16) | next chunk (16). A claim is a compare-and-
swap of the whole word, so a worker can only claim a chunk of the job the word names, and it reads job_fn and
job_ctx after its claim: that job cannot end (nor the next begin) before the claimed chunk is done. Only a
worker whose id is below the job's thread count takes part (its scratch buffer exists). A claim could be
confused with another job's only if a worker stalled between reading the word and its compare-and-swap while
a multiple of 2^24 jobs ran (minutes of decoding, about 200 jobs a token, during which that thread never
ran) and the word came back to exactly the same value: ruled out in practice, stated here because the 24
bits are a choice.

Workers spin on the wake counter (job_gen) for SPIN_S after their last job, then sleep on a condition
variable. One job at a time (pool_lock); a caller that finds the pool busy (another Python thread) runs its
product alone. After fork the child has no workers. pthreads on POSIX, Win32 threads, SRW locks and
condition variables on Windows (portable.h). tests/test_kernel_tsan.py runs it under ThreadSanitizer. */
#define MAXT 64
#define SPIN 4000
#define CHUNKS 3                        /* chunks per thread */
static rk_mutex pool_lock = RK_MUTEX_INIT, wake_mu = RK_MUTEX_INIT;
static rk_cond wake_cv = RK_COND_INIT, park_cv = RK_COND_INIT;
static int pool_size = 1, pool_started = 0, fork_hook = 0;
static rk_atomic pool_active;           /* workers 1..pool_active take parts; the others are parked */
static rk_atomic job_gen;               /* wakes the workers: changes with every job */
static long park_gen;                   /* job_gen when set_threads last changed pool_active (under wake_mu) */
static rk_atomic64 job_word;            /* the job word (above) */
static rk_atomic job_done;              /* chunks of the current job finished */
static long long job_num;               /* jobs started (under pool_lock) */
static void (*job_fn)(void *, int, int, int);
static void *job_ctx;
static long worker_seen[MAXT];          /* job_gen when worker i was started (under pool_lock) */
static float *part_buf[MAXT];
static size_t part_cap[MAXT];

/* Workers spin this long after a job before they sleep: a decode step's products come every few tens of
   microseconds with Python in between, and a worker woken from sleep for each (a futex wake, then the
   scheduler) cost more than its half of the product (measured: 2 threads decoded slower than 1). */
#define SPIN_S 0.002

#define WORD_NUM(v) ((unsigned long long)(v) >> 40)
#define WORD_THREADS(v) ((int)(((unsigned long long)(v) >> 32) & 0xff))
#define WORD_CHUNKS(v) ((int)(((unsigned long long)(v) >> 16) & 0xffff))
#define WORD_NEXT(v) ((int)((unsigned long long)(v) & 0xffff))

/* claim and run chunks of the job in the word until none is left (or the word names another job) */
static void take_chunks(int id)
{
    long long v = rk_load64(&job_word);
    const unsigned long long num = WORD_NUM(v);
    if (id >= WORD_THREADS(v))
        return;
    for (;;) {
        if (WORD_NUM(v) != num || WORD_NEXT(v) >= WORD_CHUNKS(v))
            return;
        if (!rk_cas64(&job_word, v, v + 1)) {
            v = rk_load64(&job_word);
            continue;
        }
        job_fn(job_ctx, WORD_NEXT(v), WORD_CHUNKS(v), id);   /* read after the claim: this job's */
        rk_fetch_add(&job_done, 1);
        v = rk_load64(&job_word);
    }
}

/* arg: the worker's id; it starts from the wake counter read under pool_lock when it was created (no job
   has started since: a worker that starts late still sees the first job) */
static void *pool_worker(void *arg)
{
    const int id = (int)(uintptr_t)arg;
    long seen = worker_seen[id];
    for (;;) {
        long g;
        const double until = rk_now_s() + SPIN_S;
        for (int spins = 0; (g = rk_load(&job_gen)) == seen; spins++) {
            if ((spins & 63) || rk_now_s() < until) {
                if ((spins & 63) == 63) rk_thread_yield();   /* more threads than cores: let the others run */
                else rk_relax();
                continue;
            }
            rk_mutex_lock(&wake_mu);
            while ((g = rk_load(&job_gen)) == seen) rk_cond_wait(&wake_cv, &wake_mu);
            rk_mutex_unlock(&wake_mu);
            break;
        }
        seen = g;
        take_chunks(id);
        if (id > rk_load(&pool_active)) {          /* fewer threads asked for: sleep until needed again */
            rk_mutex_lock(&wake_mu);
            while (id > rk_load(&pool_active)) rk_cond_wait(&park_cv, &wake_mu);
            seen = park_gen;                        /* a job started after set_threads woke us is ours too */
            rk_mutex_unlock(&wake_mu);
        }
    }
    return NULL;
}

/* fn(ctx, chunk, chunks, thread) over `items` units (strips, attention pairs) on `threads` threads (the caller
   holds pool_lock): a chunk is fn's own range of the units, thread indexes a per-thread scratch buffer */
static void run_parts(void (*fn)(void *, int, int, int), void *ctx, int threads, int64_t items)
{
    int64_t chunks = (int64_t)threads * CHUNKS;
    if (chunks > items) chunks = items;
    if (threads <= 1 || chunks <= 1 || pool_started == 0) { fn(ctx, 0, 1, 0); return; }
    job_fn = fn, job_ctx = ctx;
    rk_store(&job_done, 0);
    job_num++;
    rk_store64(&job_word, (long long)((((unsigned long long)job_num & 0xffffff) << 40) |
                                      ((unsigned long long)threads << 32) | ((unsigned long long)chunks << 16)));
    rk_mutex_lock(&wake_mu);
    rk_store(&job_gen, (long)((unsigned long)rk_load(&job_gen) + 1u));  /* only a caller holding pool_lock writes */
    rk_cond_broadcast(&wake_cv);
    rk_mutex_unlock(&wake_mu);
    take_chunks(0);
    for (int spins = 0; rk_load(&job_done) < chunks; spins++) {
        if (spins < SPIN) rk_relax();
        else rk_thread_yield();             /* a worker that lost its core holds a chunk: give it ours */
    }
}

static void pool_after_fork(void)
{
    const rk_mutex fresh = RK_MUTEX_INIT;
    const rk_cond fresh_cv = RK_COND_INIT;
    pool_lock = fresh, wake_mu = fresh;
    wake_cv = fresh_cv, park_cv = fresh_cv;
    pool_started = 0, pool_size = 1;
    rk_store(&pool_active, 0);
}

/* grow part p's scratch to at least `need` floats; 0 on success */
static int ensure_scratch(float **buf, size_t *cap, size_t need)
{
    if (*cap >= need) return 0;
    free(*buf);
    *buf = (float *)malloc(need * sizeof(float));
    *cap = *buf ? need : 0;
    return *buf ? 0 : -1;
}

/* run a product on the pool (or alone when the pool is busy); -1 when scratch could not be allocated */
static int run_product_on(product_t *p);

/* int8 numerics on native weights: the rows quantised once (csrc/intdot.c), then the product */
static int run_product(product_t *p)
{
    if (p->kind == KIND_F32 || !KINDS[p->kind].int_layout)
        return run_product_on(p);
    const int64_t nb = p->k / QK;
    const size_t qbytes = ((size_t)(p->m * p->k) + 63) & ~(size_t)63;
    uint8_t *buf = (uint8_t *)malloc(qbytes + 3 * (size_t)(p->m * nb) * sizeof(float));
    if (!buf) return -1;
    float *d = (float *)(buf + qbytes), *s = d + p->m * nb;
    int32_t *sums = (int32_t *)(s + p->m * nb);
    qx_t qx = {(const int8_t *)buf, d, s, sums};
    quantise_rows(p->x, p->ldx, p->m, p->k, (int8_t *)buf, d, s, sums);
    p->qx = &qx;
    const int rc = run_product_on(p);
    free(buf);
    return rc;
}

static int run_product_on(product_t *p)
{
    const size_t need = p->kind == KIND_F32 || KINDS[p->kind].int_layout ? 0
                        : (size_t)group_strips(p->k) * STRIP * (size_t)p->k;
    float *own = NULL, *bufs[MAXT];
    int rc = 0;
    if (rk_mutex_trylock(&pool_lock) == 0) {
        const int64_t nstrips = (p->n + STRIP - 1) / STRIP;
        const int threads = (int)(nstrips < pool_size ? nstrips : pool_size);
        for (int i = 0; i < threads && need; i++) rc |= ensure_scratch(&part_buf[i], &part_cap[i], need);
        p->scratch = part_buf;
        if (rc == 0) run_parts(product_part, p, threads, nstrips);
        rk_mutex_unlock(&pool_lock);
        return rc;
    }
    if (need && !(own = (float *)malloc(need * sizeof(float)))) return -1;
    bufs[0] = own;
    p->scratch = bufs;
    product_part(p, 0, 1, 0);
    free(own);
    return rc;
}

/* ---- the entry points: plain C, no Python ------------------------------------------------------------
lessonkit/engine/kernel.py loads this library with ctypes (which releases the GIL around every call) and
turns the codes below into the exceptions the engine raises. Addresses are uintptr_t, sizes int64_t; every
entry point returns RK_OK or an error code. */
/* RK_ABI and the codes every entry point returns: rowkernel.h */

RK_EXPORT int32_t rk_abi(void) { return RK_ABI; }
RK_EXPORT int32_t rk_max_threads(void) { return MAXT; }
/* cpuid traps to the hypervisor in a VM (microseconds): asked once, then remembered (a benign race: every
   thread computes the same value) */
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
   and every ISA is the portable path off x86) and, for the int8 numerics on AVX-512, whether the dot takes
   vpdpbusd (the CPU has VNNI and the word does not say PATH_NO_VNNI). RK_NO_AVX2 when this CPU lacks the ISA. */
static int32_t decode_path(int32_t path, enum rk_isa *isa, int *vnni)
{
    const int bits = path & PATH_ISA;
    *isa = bits == PATH_AVX512 ? PATH_AVX512 : bits != PATH_PORTABLE ? PATH_AVX2 : PATH_PORTABLE;
    *vnni = 0;
#if HAVE_X86
    if ((*isa == PATH_AVX512 && !cpu_avx512()) || (*isa != PATH_PORTABLE && !cpu_avx2()))
        return RK_NO_AVX2;
    *vnni = *isa == PATH_AVX512 && !(path & PATH_NO_VNNI) && cpu_vnni();
#else
    *isa = PATH_PORTABLE;
#endif
    return RK_OK;
}

static int32_t product_call(product_t *p, int32_t path)
{
    if (p->m < 1 || p->k < 1 || p->n < 1 || p->ldx < p->k || p->ldy < p->n || (p->kind != KIND_F32 && p->k % QK))
        return RK_BAD_SIZES;
    const int32_t rc = decode_path(path, &p->isa, &p->vnni);
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
    enum rk_isa isa;
    int vnni;
    const int32_t rc = decode_path(path & PATH_ISA, &isa, &vnni);
    if (rc == RK_OK)
        dequant_strips((const uint8_t *)w, kind, k, (n + STRIP - 1) / STRIP, (float *)out, isa);
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
    rk_mutex_lock(&pool_lock);
    if (!fork_hook && n > 1) {
        rk_at_fork_child(pool_after_fork);
        fork_hook = 1;
    }
    while (pool_started < n - 1) {
        const int id = pool_started + 1;
        worker_seen[id] = rk_load(&job_gen);
        if (rk_thread_start(pool_worker, (void *)(uintptr_t)id) != 0) break;
        pool_started++;
    }
    pool_size = pool_started + 1 < n ? pool_started + 1 : n;
    rk_mutex_lock(&wake_mu);
    rk_store(&pool_active, pool_size - 1);
    park_gen = rk_load(&job_gen);           /* pool_lock is held: no job is running */
    rk_cond_broadcast(&park_cv);
    rk_mutex_unlock(&wake_mu);
    if (in_use) *in_use = pool_size;
    rk_mutex_unlock(&pool_lock);
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
    if (how && hw_fma()) {
        for (int64_t i = 0; i < n; i++) po[i] = hw_fmaf(pa[i], pb[i], pc[i]);
        return RK_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) po[i] = soft_fmaf(pa[i], pb[i], pc[i]);
    return RK_OK;
}

#include "forward.c"
