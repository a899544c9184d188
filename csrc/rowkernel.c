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

Two paths, same arithmetic: AVX2 + FMA (selected at import when the CPU has both) and a portable C
path that calls fmaf, which rounds exactly like the vector FMA. The pair is tested for equal bits.

Native blocks (qmatmul). SmolLM2 ships as llama.cpp Q4_1 blocks (32 weights: w = d * q + m, d and m
half floats, q a 4-bit code) and a Q8_0 embedding (w = d * q, q an int8). Dequantised in float32 with a
separate multiply and add, each weight is exactly the float32 the loader would produce, so a kernel that
keeps the blocks, dequantises a strip inside the register block and runs the SAME fma chain gives the
float32 path's bits at a fifth of the bytes. Why one FMA may replace the multiply and the add here: d has
at most 11 significant bits (a half float) and q at most 4 (8 for Q8_0), so d * q has at most 15 (19) and
is exact in float32; rounding it changes nothing, and fma(q, d, m) = round(d * q + m) = round(round(d * q)
+ m), the loader's two roundings. The AVX2 path uses that FMA (one instruction fewer per 8 weights); the
portable path multiplies and adds, and the tests check both against gguf's own dequantiser. The file is
compiled with -ffp-contract=off (setup.py) so that no other multiply and add is fused behind our back.
Packed layout, per strip of 16 output columns, per block of 32 inputs (strips in order, blocks in order):
  Q4_1 (320 bytes): d[16] f16, m[16] f16, then 16 input pairs x 16 bytes: byte c of pair j holds column
                    c's code for input 2j (low nibble) and input 2j + 1 (high nibble);
  Q8_0 (544 bytes): d[16] f16, then 32 inputs x 16 int8 codes (column c at byte c).
Up to 6 rows dequantise in registers; more rows (verify blocks, prefill) dequantise a group of strips into
an L2-sized float32 scratch in the float layout above, then run the float blocks on it: same values, same
chains, same bits, and the dequantisation is shared by all the rows. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STRIP 16   /* columns per packed strip */
#define PREFETCH 24   /* strip rows (cache lines) to prefetch ahead */
#define GROUP_BYTES (128 * 1024)   /* strips per L2-resident group, when several row blocks share it */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* ---- portable path ---------------------------------------------------------------------------- */

static void matmul_portable(const float *x, Py_ssize_t ldx, Py_ssize_t m, Py_ssize_t k,
                            const float *w, float *y, Py_ssize_t ldy, Py_ssize_t n)
{
    float acc[STRIP];
    for (Py_ssize_t s = 0; s * STRIP < n; s++) {
        const float *ws = w + s * STRIP * k;
        const Py_ssize_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        for (Py_ssize_t r = 0; r < m; r++) {
            const float *xr = x + r * ldx;
            for (int c = 0; c < STRIP; c++) acc[c] = 0.0f;
            for (Py_ssize_t i = 0; i < k; i++)
                for (int c = 0; c < STRIP; c++) acc[c] = fmaf(xr[i], ws[STRIP * i + c], acc[c]);
            memcpy(y + r * ldy + s * STRIP, acc, (size_t)nc * sizeof(float));
        }
    }
}

/* ---- AVX2 + FMA path -------------------------------------------------------------------------- */
#if HAVE_X86
#define AVX2 __attribute__((target("avx2,fma")))
#define LANES _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define UNROLL _Pragma("GCC unroll 16")

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
AVX2 static void block_##MB##x##P(const float *x, Py_ssize_t ldx, Py_ssize_t k, const float *wp,   \
                                  const float *pf, float *y, Py_ssize_t ldy, Py_ssize_t ncols)      \
{                                                                                                    \
    __m256 acc[MB][2 * P];                                                                           \
    UNROLL for (int r = 0; r < MB; r++)                                                              \
        UNROLL for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_setzero_ps();                      \
    for (Py_ssize_t i = 0; i < k; i++) {                                                             \
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

typedef void (*block_fn)(const float *, Py_ssize_t, Py_ssize_t, const float *, const float *, float *, Py_ssize_t,
                         Py_ssize_t);

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
static void rows_avx2(const float *x, Py_ssize_t ldx, int mb, Py_ssize_t k, const float *w, Py_ssize_t s0,
                      Py_ssize_t s1, float *y, Py_ssize_t ldy, Py_ssize_t n, int ahead, Py_ssize_t next)
{
    Py_ssize_t s = s0;
    for (int t = 0; t < 3 && STRIPS[mb][t]; t++) {
        const int p = STRIPS[mb][t];
        for (; s + p <= s1; s += p) {
            const float *ws = w + s * STRIP * k;
            const float *pf = next ? ws + next : (ahead && p == 1) ? ws + STRIP * PREFETCH : NULL;
            BLOCKS[mb][t](x, ldx, k, ws, pf, y + s * STRIP, ldy, n - s * STRIP);
        }
    }
}

static void matmul_avx2(const float *x, Py_ssize_t ldx, Py_ssize_t m, Py_ssize_t k,
                        const float *w, float *y, Py_ssize_t ldy, Py_ssize_t n)
{
    const Py_ssize_t nstrips = (n + STRIP - 1) / STRIP;
    /* One row block (m <= 6): one pass over all strips. More rows: groups of strips small enough that
       two fit in L2; every row block passes over a group while it is cached, and the last row block
       prefetches the next group, so the weights leave memory once and memory never idles. */
    Py_ssize_t gs = m <= 6 ? nstrips : GROUP_BYTES / (STRIP * (Py_ssize_t)sizeof(float) * k);
    if (gs < 1) gs = 1;
    for (Py_ssize_t g = 0; g < nstrips; g += gs) {
        const Py_ssize_t g1 = g + gs < nstrips ? g + gs : nstrips;
        for (Py_ssize_t r0 = 0; r0 < m;) {
            const Py_ssize_t rest = m - r0;
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
#define QK 32            /* weights per block (llama.cpp's QK4_1 = QK8_0 = 32) */
#define Q41_BLOCK 320    /* bytes of one strip-block: d[16], m[16] (f16), 16 pairs x 16 bytes of nibbles */
#define Q80_BLOCK 544    /* d[16] (f16), 32 x 16 int8 */
enum { KIND_F32 = -1, KIND_Q41 = 0, KIND_Q80 = 1 };

static size_t strip_bytes(int kind, Py_ssize_t k)
{
    return (size_t)(k / QK) * (kind == KIND_Q41 ? Q41_BLOCK : Q80_BLOCK);
}

/* IEEE half to float, exact (normals, subnormals, zeros, inf, nan) */
static float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    const int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f = e == 0 ? ldexpf((float)mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexpf((float)(mant | 0x400), e - 25);
    return (h & 0x8000) ? -f : f;
}

/* strips [0, ns) of packed native weights -> the float strip layout (out: ns x k x 16 floats) */
static void dequant_portable(const uint8_t *w, int kind, Py_ssize_t k, Py_ssize_t ns, float *out)
{
    const size_t sb = strip_bytes(kind, k);
    for (Py_ssize_t s = 0; s < ns; s++)
        for (Py_ssize_t b = 0; b < k / QK; b++) {
            float d[STRIP], mn[STRIP], *o = out + s * STRIP * k + b * QK * STRIP;
            if (kind == KIND_Q41) {
                const uint8_t *blk = w + s * sb + b * Q41_BLOCK;
                for (int c = 0; c < STRIP; c++) { d[c] = half_to_float(blk + 2 * c); mn[c] = half_to_float(blk + 32 + 2 * c); }
                for (int j = 0; j < QK / 2; j++)
                    for (int c = 0; c < STRIP; c++) {
                        const uint8_t q = blk[64 + STRIP * j + c];
                        o[STRIP * (2 * j) + c] = (float)(q & 15) * d[c] + mn[c];      /* two roundings: no FMA */
                        o[STRIP * (2 * j + 1) + c] = (float)(q >> 4) * d[c] + mn[c];
                    }
            } else {
                const uint8_t *blk = w + s * sb + b * Q80_BLOCK;
                for (int c = 0; c < STRIP; c++) d[c] = half_to_float(blk + 2 * c);
                for (int i = 0; i < QK; i++)
                    for (int c = 0; c < STRIP; c++) o[STRIP * i + c] = (float)(int8_t)blk[32 + STRIP * i + c] * d[c];
            }
        }
}

#if HAVE_X86
#define AVX2H __attribute__((target("avx2,fma,f16c")))

AVX2H static void dequant_avx2(const uint8_t *w, int kind, Py_ssize_t k, Py_ssize_t ns, float *out)
{
    const size_t sb = strip_bytes(kind, k);
    const __m256i low = _mm256_set1_epi32(15);
    for (Py_ssize_t s = 0; s < ns; s++)
        for (Py_ssize_t b = 0; b < k / QK; b++) {
            float *o = out + s * STRIP * k + b * QK * STRIP;
            const uint8_t *blk = w + s * sb + b * (kind == KIND_Q41 ? Q41_BLOCK : Q80_BLOCK);
            for (int h = 0; h < 2; h++) {
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
                if (kind == KIND_Q41) {
                    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
                    for (int j = 0; j < QK / 2; j++) {
                        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 64 + STRIP * j + 8 * h)));
                        _mm256_storeu_ps(o + STRIP * (2 * j) + 8 * h,
                                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, low)), d, mn));
                        _mm256_storeu_ps(o + STRIP * (2 * j + 1) + 8 * h,
                                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), d, mn));
                    }
                } else {
                    for (int i = 0; i < QK; i++) {
                        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 32 + STRIP * i + 8 * h)));
                        _mm256_storeu_ps(o + STRIP * i + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
                    }
                }
            }
        }
}

/* MB rows x P strips of Q4_1 blocks, dequantised in registers: per input pair the weights of the P strips
   are built once (d * q + m: a multiply, then an add) and feed every row's chain, input 2j then 2j + 1 */
#define DEFINE_Q41(MB, P)                                                                               \
AVX2H static void q41_##MB##x##P(const float *x, Py_ssize_t ldx, Py_ssize_t k, const uint8_t *wp,       \
                                 size_t sb, float *y, Py_ssize_t ldy, Py_ssize_t ncols)                 \
{                                                                                                        \
    __m256 acc[MB][2 * P];                                                                               \
    const __m256i low = _mm256_set1_epi32(15);                                                           \
    ZERO_ACC(MB, P)                                                                                      \
    for (Py_ssize_t b = 0; b < k / QK; b++) {                                                            \
        __m256 d[2 * P], mn[2 * P];                                                                      \
        UNROLL for (int v = 0; v < 2 * P; v++) {                                                         \
            const uint8_t *blk = wp + (v / 2) * sb + b * Q41_BLOCK + 16 * (v % 2);                      \
            d[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));                               \
            mn[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32)));                       \
        }                                                                                                \
        const float *xb = x + b * QK;                                                                    \
        for (int j = 0; j < QK / 2; j++) {                                                               \
            /* one vector of 8 columns at a time: its two weights vectors live only until its FMAs */    \
            UNROLL for (int v = 0; v < 2 * P; v++) {                                                     \
                const uint8_t *q = wp + (v / 2) * sb + b * Q41_BLOCK + 64 + STRIP * j + 8 * (v % 2);     \
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
AVX2H static void q80_##MB##x##P(const float *x, Py_ssize_t ldx, Py_ssize_t k, const uint8_t *wp,       \
                                 size_t sb, float *y, Py_ssize_t ldy, Py_ssize_t ncols)                 \
{                                                                                                        \
    __m256 acc[MB][2 * P];                                                                               \
    ZERO_ACC(MB, P)                                                                                      \
    for (Py_ssize_t b = 0; b < k / QK; b++) {                                                            \
        __m256 d[2 * P];                                                                                 \
        UNROLL for (int v = 0; v < 2 * P; v++)                                                           \
            d[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + (v / 2) * sb + b * Q80_BLOCK + 16 * (v % 2)))); \
        const float *xb = x + b * QK;                                                                    \
        for (int i = 0; i < QK; i++) {                                                                   \
            UNROLL for (int v = 0; v < 2 * P; v++) {                                                     \
                const uint8_t *q = wp + (v / 2) * sb + b * Q80_BLOCK + 32 + STRIP * i + 8 * (v % 2);     \
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

typedef void (*qblock_fn)(const float *, Py_ssize_t, Py_ssize_t, const uint8_t *, size_t, float *, Py_ssize_t,
                          Py_ssize_t);
#define NATIVE_TABLE(Q) {                                                                  \
    {0, 0, 0}, {Q##_1x4, Q##_1x2, Q##_1x1}, {Q##_2x2, Q##_2x1, 0}, {Q##_3x2, Q##_3x1, 0}, \
    {Q##_4x1, 0, 0}, {Q##_5x1, 0, 0}, {Q##_6x1, 0, 0}}
static const qblock_fn QBLOCKS[2][7][3] = {NATIVE_TABLE(q41), NATIVE_TABLE(q80)};

/* m <= 6 rows, every strip, one register block height (the blocks' widths as rows_avx2) */
static void qrows_avx2(const float *x, Py_ssize_t ldx, int m, Py_ssize_t k, const uint8_t *w, int kind, float *y,
                       Py_ssize_t ldy, Py_ssize_t n)
{
    const Py_ssize_t nstrips = (n + STRIP - 1) / STRIP;
    const size_t sb = strip_bytes(kind, k);
    Py_ssize_t s = 0;
    for (int t = 0; t < 3 && STRIPS[m][t]; t++) {
        const int p = STRIPS[m][t];
        for (; s + p <= nstrips; s += p)
            QBLOCKS[kind][m][t](x, ldx, k, w + s * sb, sb, y + s * STRIP, ldy, n - s * STRIP);
    }
}
#endif

/* ---- one product on a range of strips; the thread pool splits products into such ranges ----------- */
typedef struct {
    const float *x;
    Py_ssize_t ldx, m, k;
    const void *w;          /* float strips (KIND_F32) or native strip-blocks */
    int kind, avx2;
    float *y;
    Py_ssize_t ldy, n;
    float **scratch;        /* per part: GROUP_BYTES of float strips (native weights, M > 6 or portable) */
} product_t;

static Py_ssize_t group_strips(Py_ssize_t k)
{
    const Py_ssize_t gs = GROUP_BYTES / (STRIP * (Py_ssize_t)sizeof(float) * k);
    return gs < 1 ? 1 : gs;
}

/* native weights through the float blocks: a group of strips dequantised into scratch, then every row */
static void native_via_scratch(const product_t *p, const uint8_t *w, float *y, Py_ssize_t n, float *buf)
{
    const Py_ssize_t nstrips = (n + STRIP - 1) / STRIP, gs = group_strips(p->k);
    const size_t sb = strip_bytes(p->kind, p->k);
    for (Py_ssize_t g = 0; g < nstrips; g += gs) {
        const Py_ssize_t ns = g + gs < nstrips ? gs : nstrips - g, cols = n - g * STRIP;
#if HAVE_X86
        if (p->avx2) {
            dequant_avx2(w + g * sb, p->kind, p->k, ns, buf);
            matmul_avx2(p->x, p->ldx, p->m, p->k, buf, y + g * STRIP, p->ldy, cols < ns * STRIP ? cols : ns * STRIP);
            continue;
        }
#endif
        dequant_portable(w + g * sb, p->kind, p->k, ns, buf);
        matmul_portable(p->x, p->ldx, p->m, p->k, buf, y + g * STRIP, p->ldy, cols < ns * STRIP ? cols : ns * STRIP);
    }
}

static void product_part(void *ctx, int part, int parts)
{
    const product_t *p = (const product_t *)ctx;
    const Py_ssize_t nstrips = (p->n + STRIP - 1) / STRIP;
    const Py_ssize_t s0 = nstrips * part / parts, s1 = nstrips * (part + 1) / parts;
    if (s0 >= s1)
        return;
    float *y = p->y + s0 * STRIP;
    const Py_ssize_t n = (s1 * STRIP < p->n ? s1 * STRIP : p->n) - s0 * STRIP;
    if (p->kind == KIND_F32) {
        const float *w = (const float *)p->w + s0 * STRIP * p->k;
#if HAVE_X86
        if (p->avx2) { matmul_avx2(p->x, p->ldx, p->m, p->k, w, y, p->ldy, n); return; }
#endif
        matmul_portable(p->x, p->ldx, p->m, p->k, w, y, p->ldy, n);
        return;
    }
    const uint8_t *w = (const uint8_t *)p->w + s0 * strip_bytes(p->kind, p->k);
#if HAVE_X86
    if (p->avx2 && p->m <= 6) { qrows_avx2(p->x, p->ldx, (int)p->m, p->k, w, p->kind, y, p->ldy, n); return; }
#endif
    native_via_scratch(p, w, y, n, p->scratch[part]);
}

/* ---- the thread pool ------------------------------------------------------------------------------
Workers spin on a job counter for SPIN_S after their last job, then sleep on a condition variable; the caller runs part 0 and
spins until every worker has finished its part. One product at a time (pool_lock); a caller that finds
the pool busy (another Python thread) runs its product alone. After fork the child has no workers. */
#define MAXT 64
#define SPIN 4000
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER, wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;
static int pool_size = 1, pool_started = 0;
static atomic_int pool_active;          /* workers 1..pool_active take parts; the others are parked */
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;
static atomic_uint job_gen;
static atomic_int job_left;
static void (*job_fn)(void *, int, int);
static void *job_ctx;
static int job_parts;
static float *part_buf[MAXT];
static size_t part_cap[MAXT];

/* Workers spin this long after a job before they sleep: a decode step's products come every few tens of
   microseconds with Python in between, and a worker woken from sleep for each (a futex wake, then the
   scheduler) cost more than its half of the product (measured: 2 threads decoded slower than 1). */
#define SPIN_S 0.002

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if HAVE_X86
    _mm_pause();
#endif
}

/* arg: the worker's id in the low 16 bits, above them the job counter when it was created (read under
   pool_lock, so no job has started since: a worker that starts late still sees the first job) */
static void *pool_worker(void *arg)
{
    const int id = (int)((uintptr_t)arg & 0xffff);
    unsigned seen = (unsigned)((uintptr_t)arg >> 16);
    for (;;) {
        unsigned g;
        const double until = now_s() + SPIN_S;
        for (int spins = 0; (g = atomic_load_explicit(&job_gen, memory_order_acquire)) == seen; spins++) {
            if ((spins & 63) || now_s() < until) {
                if ((spins & 63) == 63) sched_yield();   /* more threads than cores: let the others run */
                else cpu_relax();
                continue;
            }
            pthread_mutex_lock(&wake_mu);
            while ((g = atomic_load(&job_gen)) == seen) pthread_cond_wait(&wake_cv, &wake_mu);
            pthread_mutex_unlock(&wake_mu);
            break;
        }
        seen = g;
        if (id < job_parts) {
            job_fn(job_ctx, id, job_parts);
            atomic_fetch_sub_explicit(&job_left, 1, memory_order_acq_rel);
        }
        if (id > atomic_load(&pool_active)) {      /* fewer threads asked for: sleep until needed again */
            pthread_mutex_lock(&wake_mu);
            while (id > atomic_load(&pool_active)) pthread_cond_wait(&park_cv, &wake_mu);
            seen = atomic_load(&job_gen);           /* set_threads holds pool_lock: no job is running */
            pthread_mutex_unlock(&wake_mu);
        }
    }
    return NULL;
}

static void run_parts(void (*fn)(void *, int, int), void *ctx, int parts)
{
    if (parts <= 1 || pool_started == 0) { fn(ctx, 0, 1); return; }
    job_fn = fn, job_ctx = ctx, job_parts = parts;
    atomic_store(&job_left, parts - 1);      /* parts <= pool_size: workers 1 .. parts - 1 are active */
    pthread_mutex_lock(&wake_mu);
    atomic_fetch_add_explicit(&job_gen, 1, memory_order_release);
    pthread_cond_broadcast(&wake_cv);
    pthread_mutex_unlock(&wake_mu);
    fn(ctx, 0, parts);
    for (int spins = 0; atomic_load_explicit(&job_left, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN) cpu_relax();
        else sched_yield();               /* a worker that lost its core: give it ours */
    }
}

static void pool_after_fork(void)
{
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&wake_mu, NULL);
    pthread_cond_init(&wake_cv, NULL);
    pthread_cond_init(&park_cv, NULL);
    pool_started = 0, pool_size = 1;
    atomic_store(&pool_active, 0);
}

/* grow part p's scratch to at least `need` floats; 0 on success */
static int ensure_scratch(float **buf, size_t *cap, size_t need)
{
    if (*cap >= need) return 0;
    free(*buf);
    *buf = malloc(need * sizeof(float));
    *cap = *buf ? need : 0;
    return *buf ? 0 : -1;
}

/* run a product on the pool (or alone when the pool is busy); -1 when scratch could not be allocated */
static int run_product(product_t *p)
{
    const size_t need = (p->kind == KIND_F32) ? 0 : (size_t)group_strips(p->k) * STRIP * (size_t)p->k;
    float *own = NULL, *bufs[MAXT];
    int rc = 0;
    if (pthread_mutex_trylock(&pool_lock) == 0) {
        const Py_ssize_t nstrips = (p->n + STRIP - 1) / STRIP;
        const int parts = (int)(nstrips < pool_size ? nstrips : pool_size);
        for (int i = 0; i < parts && need; i++) rc |= ensure_scratch(&part_buf[i], &part_cap[i], need);
        p->scratch = part_buf;
        if (rc == 0) run_parts(product_part, p, parts);
        pthread_mutex_unlock(&pool_lock);
        return rc;
    }
    if (need && !(own = malloc(need * sizeof(float)))) return -1;
    bufs[0] = own;
    p->scratch = bufs;
    product_part(p, 0, 1);
    free(own);
    return rc;
}

/* ---- dispatch --------------------------------------------------------------------------------- */

static int cpu_has_avx2_fma(void)
{
#if HAVE_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

typedef void (*matmul_fn)(const float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, const float *, float *, Py_ssize_t,
                          Py_ssize_t);

/* the path a call asked for, or NULL with a Python error when it asked for AVX2 on a CPU without it */
static matmul_fn choose_matmul(int use_avx2, const char *who)
{
#if HAVE_X86
    if (use_avx2 && !cpu_has_avx2_fma()) {
        PyErr_Format(PyExc_RuntimeError, "rowkernel.%s: this CPU has no AVX2/FMA/F16C", who);
        return NULL;
    }
    return use_avx2 ? matmul_avx2 : matmul_portable;
#else
    (void)use_avx2;
    (void)who;
    return matmul_portable;
#endif
}

static PyObject *product_call(product_t *p, const char *who)
{
    if (p->m < 1 || p->k < 1 || p->n < 1 || p->ldx < p->k || p->ldy < p->n ||
        (p->kind != KIND_F32 && p->k % QK)) {
        PyErr_Format(PyExc_ValueError, "rowkernel.%s: bad sizes", who);
        return NULL;
    }
    if (!choose_matmul(p->avx2, who))
        return NULL;
#if !HAVE_X86
    p->avx2 = 0;
#endif
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_product(p);
    Py_END_ALLOW_THREADS
    if (rc)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* matmul(x_addr, m, k, ldx, packed_addr, n, y_addr, ldy, use_avx2): y[m, :n] = x[m, :k] @ W */
static PyObject *rk_matmul(PyObject *self, PyObject *args)
{
    unsigned long long xa, wa, ya;
    product_t p = {0};
    if (!PyArg_ParseTuple(args, "KnnnKnKnp", &xa, &p.m, &p.k, &p.ldx, &wa, &p.n, &ya, &p.ldy, &p.avx2))
        return NULL;
    p.x = (const float *)(uintptr_t)xa, p.w = (const void *)(uintptr_t)wa, p.y = (float *)(uintptr_t)ya;
    p.kind = KIND_F32;
    return product_call(&p, "matmul");
}

/* qmatmul(x_addr, m, k, ldx, packed_addr, kind, n, y_addr, ldy, use_avx2): the same on native strip-blocks,
   kind 0 = Q4_1, 1 = Q8_0 */
static PyObject *rk_qmatmul(PyObject *self, PyObject *args)
{
    unsigned long long xa, wa, ya;
    product_t p = {0};
    if (!PyArg_ParseTuple(args, "KnnnKinKnp", &xa, &p.m, &p.k, &p.ldx, &wa, &p.kind, &p.n, &ya, &p.ldy, &p.avx2))
        return NULL;
    if (p.kind != KIND_Q41 && p.kind != KIND_Q80) {
        PyErr_Format(PyExc_ValueError, "rowkernel.qmatmul: unknown block kind %d (0: Q4_1, 1: Q8_0)", p.kind);
        return NULL;
    }
    p.x = (const float *)(uintptr_t)xa, p.w = (const void *)(uintptr_t)wa, p.y = (float *)(uintptr_t)ya;
    return product_call(&p, "qmatmul");
}

/* dequantise(packed_addr, kind, k, n, out_addr, use_avx2): native strips -> float strips (tests, f32 path) */
static PyObject *rk_dequantise(PyObject *self, PyObject *args)
{
    unsigned long long wa, oa;
    int kind, use_avx2;
    Py_ssize_t k, n;
    if (!PyArg_ParseTuple(args, "KinnKp", &wa, &kind, &k, &n, &oa, &use_avx2))
        return NULL;
    if ((kind != KIND_Q41 && kind != KIND_Q80) || k < QK || k % QK || n < 1 || !choose_matmul(use_avx2, "dequantise")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rowkernel.dequantise: bad arguments");
        return NULL;
    }
    const Py_ssize_t ns = (n + STRIP - 1) / STRIP;
#if HAVE_X86
    if (use_avx2) { dequant_avx2((const uint8_t *)(uintptr_t)wa, kind, k, ns, (float *)(uintptr_t)oa); Py_RETURN_NONE; }
#endif
    dequant_portable((const uint8_t *)(uintptr_t)wa, kind, k, ns, (float *)(uintptr_t)oa);
    Py_RETURN_NONE;
}

/* set_threads(n): threads a product's strips are split over (the caller is one of them) */
static PyObject *rk_set_threads(PyObject *self, PyObject *args)
{
    int n;
    if (!PyArg_ParseTuple(args, "i", &n))
        return NULL;
    if (n < 1 || n > MAXT) {
        PyErr_Format(PyExc_ValueError, "rowkernel.set_threads: %d threads (1 to %d)", n, MAXT);
        return NULL;
    }
    pthread_mutex_lock(&pool_lock);
    while (pool_started < n - 1) {
        pthread_t t;
        const uintptr_t arg = (uintptr_t)(pool_started + 1) | ((uintptr_t)atomic_load(&job_gen) << 16);
        if (pthread_create(&t, NULL, pool_worker, (void *)arg) != 0) break;
        pthread_detach(t);
        pool_started++;
    }
    pool_size = pool_started + 1 < n ? pool_started + 1 : n;
    pthread_mutex_lock(&wake_mu);
    atomic_store(&pool_active, pool_size - 1);
    pthread_cond_broadcast(&park_cv);
    pthread_mutex_unlock(&wake_mu);
    pthread_mutex_unlock(&pool_lock);
    return PyLong_FromLong(pool_size);
}

static PyObject *rk_has_avx2(PyObject *self, PyObject *noargs)
{
    return PyBool_FromLong(cpu_has_avx2_fma());
}

/* ---- one-token decode step of a small dense model (drafters) -------------------------------------

A drafter's guesses need not be exact (the target verifies every one), but they must be cheap: a
2-layer model of width 96 costs about 30 torch operations per layer, and their per-call overhead, not
arithmetic, made a draft token cost a third of a tiny-moe step. This runs the whole step in one call on
the packed weights of the row kernel: embedding row, per layer RMSNorm, q|k|v product, rotate-half RoPE,
the new key/value written into the caller's KV cache, attention over positions 0..pos, output product,
RMSNorm, SwiGLU MLP; final RMSNorm and the output layer. Llama-style dense models only (no qk-norm, no
clipping, one expert): the Python side checks that before it builds a plan.

plan: uint64 addresses, 6 globals then 8 per layer:
  embed [V, D], final_norm [D], lm_head (packed [D, V]), cos [*, hd], sin [*, hd], scratch,
  per layer: attn_norm [D], wqkv (packed [D, nq + 2 nkv]), wo (packed [nq, D]), mlp_norm [D],
             gate_up (packed [D, 2I]), down (packed [I, D]), k cache [max_len, G, hd], v cache [same]. */

static void rms_norm(const float *x, const float *w, float *out, Py_ssize_t d, float eps)
{
    float ss = 0.0f;
    for (Py_ssize_t i = 0; i < d; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (Py_ssize_t i = 0; i < d; i++) out[i] = w[i] * (x[i] * r);
}

static void rope(float *x, const float *cos, const float *sin, Py_ssize_t hd)
{
    const Py_ssize_t half = hd / 2;
    for (Py_ssize_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* dense_step(plan_addr, n_layers, dim, n_heads, n_kv_heads, head_dim, inter, vocab, out_rows, eps, token, pos,
              use_avx2, logits_addr): the logits [out_rows] of the token at position pos (out_rows: rows of
              the output layer, the vocabulary or a drafter's reduced one; vocab: rows of the embedding) */
static PyObject *rk_dense_step(PyObject *self, PyObject *args)
{
    unsigned long long plan_a, logits_a;
    Py_ssize_t L, D, H, G, hd, I, NV, V, token, pos;
    float eps;
    int use_avx2;
    if (!PyArg_ParseTuple(args, "KnnnnnnnnfnnpK", &plan_a, &L, &D, &H, &G, &hd, &I, &NV, &V, &eps, &token, &pos,
                          &use_avx2, &logits_a))
        return NULL;
    if (L < 1 || D < 1 || H < 1 || G < 1 || H % G || hd < 2 || hd % 2 || I < 1 || NV < 1 || V < 1 || token < 0 ||
        token >= NV || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "rowkernel.dense_step: bad sizes");
        return NULL;
    }
    const matmul_fn mm = choose_matmul(use_avx2, "dense_step");
    if (!mm)
        return NULL;
    const uint64_t *plan = (const uint64_t *)(uintptr_t)plan_a;
    const float *embed = (const float *)(uintptr_t)plan[0], *fnorm = (const float *)(uintptr_t)plan[1];
    const float *head = (const float *)(uintptr_t)plan[2];
    const float *cos = (const float *)(uintptr_t)plan[3] + pos * hd, *sin = (const float *)(uintptr_t)plan[4] + pos * hd;
    float *logits = (float *)(uintptr_t)logits_a;
    const Py_ssize_t nq = H * hd, nkv = G * hd, rep = H / G, S = pos + 1;
    /* scratch: x [D], xn [D], qkv [nq + 2 nkv], att [nq], mix [D], gu [2I], scores [S] */
    float *x = (float *)(uintptr_t)plan[5], *xn = x + D, *qkv = xn + D, *att = qkv + nq + 2 * nkv;
    float *mix = att + nq, *gu = mix + D, *sc = gu + 2 * I;
    const float scale = 1.0f / sqrtf((float)hd);
    Py_BEGIN_ALLOW_THREADS
    memcpy(x, embed + token * D, (size_t)D * sizeof(float));
    for (Py_ssize_t l = 0; l < L; l++) {
        const uint64_t *p = plan + 6 + 8 * l;
        float *kc = (float *)(uintptr_t)p[6], *vc = (float *)(uintptr_t)p[7];
        rms_norm(x, (const float *)(uintptr_t)p[0], xn, D, eps);
        mm(xn, D, 1, D, (const float *)(uintptr_t)p[1], qkv, nq + 2 * nkv, nq + 2 * nkv);
        for (Py_ssize_t h = 0; h < H; h++) rope(qkv + h * hd, cos, sin, hd);
        for (Py_ssize_t g = 0; g < G; g++) rope(qkv + nq + g * hd, cos, sin, hd);
        memcpy(kc + pos * nkv, qkv + nq, (size_t)nkv * sizeof(float));
        memcpy(vc + pos * nkv, qkv + nq + nkv, (size_t)nkv * sizeof(float));
        for (Py_ssize_t h = 0; h < H; h++) {
            const float *q = qkv + h * hd;
            const Py_ssize_t g = h / rep;
            float mx = -INFINITY, sum = 0.0f;
            for (Py_ssize_t s = 0; s < S; s++) {
                const float *kr = kc + s * nkv + g * hd;
                float dot = 0.0f;
                for (Py_ssize_t i = 0; i < hd; i++) dot += q[i] * kr[i];
                sc[s] = dot * scale;
                if (sc[s] > mx) mx = sc[s];
            }
            for (Py_ssize_t s = 0; s < S; s++) { sc[s] = expf(sc[s] - mx); sum += sc[s]; }
            float *o = att + h * hd;
            for (Py_ssize_t i = 0; i < hd; i++) o[i] = 0.0f;
            for (Py_ssize_t s = 0; s < S; s++) {
                const float pr = sc[s] / sum, *vr = vc + s * nkv + g * hd;
                for (Py_ssize_t i = 0; i < hd; i++) o[i] += pr * vr[i];
            }
        }
        mm(att, nq, 1, nq, (const float *)(uintptr_t)p[2], mix, D, D);
        for (Py_ssize_t i = 0; i < D; i++) x[i] += mix[i];
        rms_norm(x, (const float *)(uintptr_t)p[3], xn, D, eps);
        mm(xn, D, 1, D, (const float *)(uintptr_t)p[4], gu, 2 * I, 2 * I);
        for (Py_ssize_t i = 0; i < I; i++) gu[i] = gu[i] / (1.0f + expf(-gu[i])) * gu[I + i];
        mm(gu, I, 1, I, (const float *)(uintptr_t)p[5], mix, D, D);
        for (Py_ssize_t i = 0; i < D; i++) x[i] += mix[i];
    }
    rms_norm(x, fnorm, xn, D, eps);
    mm(xn, D, 1, D, head, logits, V, V);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"matmul", rk_matmul, METH_VARARGS, "matmul(x, m, k, ldx, packed_w, n, y, ldy, use_avx2): row-invariant X @ W"},
    {"dense_step", rk_dense_step, METH_VARARGS, "dense_step(plan, L, D, H, G, hd, I, vocab, out_rows, eps, token, pos, use_avx2, logits): one decode step of a small dense model"},
    {"qmatmul", rk_qmatmul, METH_VARARGS, "qmatmul(x, m, k, ldx, packed_blocks, kind, n, y, ldy, use_avx2): row-invariant X @ W on Q4_1 (0) / Q8_0 (1) strips"},
    {"dequantise", rk_dequantise, METH_VARARGS, "dequantise(packed_blocks, kind, k, n, out, use_avx2): native strips -> float32 strips"},
    {"set_threads", rk_set_threads, METH_VARARGS, "set_threads(n): threads per product; returns the number in use"},
    {"has_avx2", rk_has_avx2, METH_NOARGS, "True when this CPU has AVX2, FMA and F16C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_rowkernel", "Row-invariant X @ W for short forwards; a dense drafter's one-token step", -1, METHODS};

/* ABI: bumped when an entry point's arguments change; lessonkit/engine/kernel.py refuses another value */
PyMODINIT_FUNC PyInit__rowkernel(void)
{
    PyObject *m = PyModule_Create(&MODULE);
    pthread_atfork(NULL, NULL, pool_after_fork);
    if (m && PyModule_AddIntConstant(m, "ABI", 3) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
