/* intdot.c: the int8 numerics, integer block dots on native weights (a unit of its own: kernel_impl.h).

Why. The exact path builds every weight in float (widen, convert, dequantising FMA: about 3 operations a
weight) and then spends one FMA per weight per row, so a step of M rows costs about (3 + M) operations a
weight: extra verify rows are never cheap, and the step is compute-bound. Here each row's activations are
quantised to 8 bits once per product, as llama.cpp's Q8_1 does, and every block of 32 weights meets them in
an integer dot product: one vpdpbusd does 64 multiply-adds. Integer sums are exact in any order, so a row's
result cannot depend on the ISA, the thread split or the rows beside it: row invariance holds by construction.

Numerics (docs/numerics.md is the specification). Per row, per block b of 32 inputs:
    amax = max |x_i|;  d = amax / 127;  id = d ? 1 / d : 0;  q_i = roundf(x_i * id), halves away from zero
    (clamped to +-127; NaN: 0)
    s = d * (sum of q_i)                                            (one rounding)
Per output column c, blocks in order b = 0, 1, ..., with the weights' d_w (and m_w for Q4_1):
    isum = sum of q_w,i * q_i                                       (int32, exact: |isum| < 2^20)
    acc  = fma(d_w * d, (float)isum, acc)                           (the product rounded once, then one fma)
    accm = fma(m_w, s, accm)                                        (Q4_1 only: the block minimum's share)
    y    = acc + accm  (Q4_1)  or  acc  (Q8_0)
Every path computes exactly these float operations per column; only the integer dot is summed in another
order, and integer sums are exact.

Layout (KIND_Q41I, KIND_Q80I in format.h): the strip-blocks of format.h with their code bytes permuted at load
(rk_repack_int) so that one 32-bit lane holds one column's codes for 4 consecutive inputs, the order an
integer dot instruction takes them; the same bytes, the same size, the same d (and m) halves first:
  Q4_1 int (320 bytes): d[16], m[16] f16, then 4 groups h of 64 bytes: byte 4c + j of group h holds column
                        c's code for input 8h + j (low nibble) and 8h + 4 + j (high nibble);
  Q8_0 int (544 bytes): d[16] f16, then 8 groups g of 64 bytes: byte 4c + j of group g holds column c's code
                        for input 4g + j, plus 128 (stored unsigned, as vpdpbusd's first operand wants it).
One strip-block is loaded once and, unpacked in registers (a mask and a shift for Q4_1, nothing for Q8_0 on
VNNI), used by every row of the step: up to 6 rows at a time on AVX-512, 2 on AVX2.

Paths:
  AVX-512 VNNI: vpdpbusd, 4 products a lane into int32, no saturation. Q4_1: codes (0..15) unsigned x
               activations signed. Q8_0: codes + 128 unsigned x activations signed, minus 128 x (the sum of
               the row's codes in the block).
  AVX-512 BW and AVX2: vpmaddubsw (pairs into int16, saturating, so bounded: Q4_1 |pair| <= 2 * 15 * 127 and
               the 8 pairs of a block's column <= 30,480 fit int16; Q8_0 takes |w| unsigned and x * sign(w), a
               pair <= 2 * 128 * 127 = 32,512 fits, widened to int32 at once), then vpmaddwd by ones.
  portable:    plain C, the reference the others are tested against bit for bit.
The activations' rounding (quantise_rows) takes 8 lanes at a time on AVX2 and AVX-512 (quantise_block_avx2):
the same float operations, the ties and the clamp by compare and blend.
PATH_NO_VNNI makes an AVX-512 product take the BW instructions (tests compare the two on VNNI CPUs). */

#include "kernel_impl.h"   /* qx_t, kind_t, path_t, half_to_float, fma_portable; block_q41i, block_q80i: format.h */

#if HAVE_X86
/* one block of 32 inputs on AVX2: the same operations as the loop below, 8 lanes at a time. amax: a running
   maximum per lane, then across lanes (|x| >= 0 and NaN never wins a compare, so any order gives the same
   value); the rounding by compare and blend; the codes packed to bytes in input order; the sum in int32
   (exact in any order). Returns the code sum, writes *db. */
AVX2H static int32_t quantise_block_avx2(const float *xb, int8_t *qb, float *db_out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax8 = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        amax8 = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax8);     /* a > amax ? a : amax */
    }
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, amax8);
    for (int l = 0; l < 8; l++) amax = lanes[l] > amax ? lanes[l] : amax;
    const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    const __m256 idv = _mm256_set1_ps(id), top = _mm256_set1_ps(127.0f), bottom = _mm256_set1_ps(-127.0f);
    const __m256 half = _mm256_set1_ps(0.5f), mhalf = _mm256_set1_ps(-0.5f);
    __m256i qi[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        __m256 x = _mm256_mul_ps(v[i], idv);
        x = _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        x = _mm256_blendv_ps(x, top, _mm256_cmp_ps(x, top, _CMP_GT_OQ));
        x = _mm256_blendv_ps(x, bottom, _mm256_cmp_ps(x, bottom, _CMP_LT_OQ));
        const __m256i t = _mm256_cvttps_epi32(x);
        const __m256 frac = _mm256_sub_ps(x, _mm256_cvtepi32_ps(t));
        const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, half, _CMP_GE_OQ));     /* -1 where true */
        const __m256i down = _mm256_castps_si256(_mm256_cmp_ps(frac, mhalf, _CMP_LE_OQ));
        qi[i] = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
        qi[i] = _mm256_max_epi32(_mm256_min_epi32(qi[i], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        sum = _mm256_add_epi32(sum, qi[i]);
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    int32_t part[8], total = 0;
    _mm256_storeu_si256((__m256i *)part, sum);
    for (int l = 0; l < 8; l++) total += part[l];
    *db_out = db;
    return total;
}
#endif

/* rows x [m, k] -> q [m, k] int8, d, s and the code sums [m, k / 32]: the rounding above (AVX2 or AVX-512:
   quantise_block_avx2, the same bits) */
void quantise_rows(const float *x, int64_t ldx, int64_t m, int64_t k, int8_t *q, float *d, float *s,
                   int32_t *sums, enum rk_isa isa)
{
    const int64_t nb = k / QK;
#if HAVE_X86
    if (isa != PATH_PORTABLE) {
        for (int64_t r = 0; r < m; r++)
            for (int64_t b = 0; b < nb; b++) {
                float db;
                const int32_t sum = quantise_block_avx2(x + r * ldx + b * QK, q + r * k + b * QK, &db);
                d[r * nb + b] = db;
                s[r * nb + b] = db * (float)sum;
                sums[r * nb + b] = sum;
            }
        return;
    }
#endif
    (void)isa;
    for (int64_t r = 0; r < m; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * ldx + b * QK;
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) {
                const float a = fabsf(xb[i]);
                amax = a > amax ? a : amax;
            }
            const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
            int8_t *qb = q + r * k + b * QK;
            int32_t sum = 0;
            for (int i = 0; i < QK; i++) {
                /* roundf (halves away from zero) from exact steps: v's integer part t (|v| <= 127.00002, so the
                   conversion is exact and vectorises), its fraction v - t (exact), then one step away from zero
                   when that is at least a half; NaN becomes 0, then the clamp to +-127 */
                float v = xb[i] * id;
                v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                const int32_t t = (int32_t)v;
                const float frac = v - (float)t;
                int32_t qi = t + (frac >= 0.5f) - (frac <= -0.5f);
                qi = qi > 127 ? 127 : qi < -127 ? -127 : qi;
                qb[i] = (int8_t)qi;
                sum += qi;
            }
            d[r * nb + b] = db;
            s[r * nb + b] = db * (float)sum;
            sums[r * nb + b] = sum;
        }
}

/* column c's code for input i of an int-layout strip-block (Q4_1: 0..15; Q8_0: -128..127) */
static inline int code_q41i(const block_q41i *blk, int c, int i)
{
    const uint8_t byte = blk->qs[i / 8][c][i % 4];
    return (i % 8) < 4 ? byte & 15 : byte >> 4;
}
static inline int code_q80i(const block_q80i *blk, int c, int i) { return (int)blk->qs[i / 4][c][i % 4] - 128; }

/* strip-blocks of format.h (kind 0 / 1) -> the int layout (kind 2 / 3), ns strips of k inputs */
void repack_int(const uint8_t *src, int kind, int64_t k, int64_t ns, uint8_t *dst)
{
    for (int64_t blkno = 0; blkno < ns * (k / QK); blkno++) {
        if (kind == KIND_Q41) {
            const block_q41 *s = (const block_q41 *)src + blkno;
            block_q41i *o = (block_q41i *)dst + blkno;
            memcpy(o->d, s->d, sizeof s->d);
            memcpy(o->m, s->m, sizeof s->m);
            for (int c = 0; c < STRIP; c++)
                for (int i = 0; i < QK; i++) {
                    const int code = (s->qs[i / 2][c] >> (4 * (i % 2))) & 15;
                    uint8_t *byte = &o->qs[i / 8][c][i % 4];
                    *byte = (i % 8) < 4 ? (uint8_t)((*byte & 0xf0) | code) : (uint8_t)((*byte & 0x0f) | (code << 4));
                }
        } else {
            const block_q80 *s = (const block_q80 *)src + blkno;
            block_q80i *o = (block_q80i *)dst + blkno;
            memcpy(o->d, s->d, sizeof s->d);
            for (int c = 0; c < STRIP; c++)
                for (int i = 0; i < QK; i++) o->qs[i / 4][c][i % 4] = (uint8_t)((uint8_t)s->qs[i][c] ^ 0x80);
        }
    }
}

/* column c of one int-layout strip-block -> its QK weights: d * q (+ m), two roundings, as the loader computes
   the float32 weights */
void column_q41i(const uint8_t *b, int c, float *out)
{
    const block_q41i *blk = (const block_q41i *)b;
    const float d = half_to_float(blk->d[c]), mn = half_to_float(blk->m[c]);
    for (int i = 0; i < QK; i++) out[i] = (float)code_q41i(blk, c, i) * d + mn;
}
void column_q80i(const uint8_t *b, int c, float *out)
{
    const block_q80i *blk = (const block_q80i *)b;
    const float d = half_to_float(blk->d[c]);
    for (int i = 0; i < QK; i++) out[i] = (float)code_q80i(blk, c, i) * d;
}

/* an int-layout strip-block -> QK x STRIP floats in the float strip layout, column by column */
static void dequant_by_columns(void (*column)(const uint8_t *, int, float *), const uint8_t *blk, float *o)
{
    float col[QK];
    for (int c = 0; c < STRIP; c++) {
        column(blk, c, col);
        for (int i = 0; i < QK; i++) o[STRIP * i + c] = col[i];
    }
}
void dequant_q41i(const uint8_t *blk, float *o) { dequant_by_columns(column_q41i, blk, o); }
void dequant_q80i(const uint8_t *blk, float *o) { dequant_by_columns(column_q80i, blk, o); }

/* ---- portable: the reference --------------------------------------------------------------------- */
static void int_portable(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, const kind_t *kt, float *y,
                         int64_t ldy, int64_t n, int fma)
{
    const int64_t nb = k / QK;
    const size_t sb = strip_bytes(kt, k);
    const int has_min = kt->has_min;
    for (int64_t s = 0; s * STRIP < n; s++) {
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        for (int64_t r = 0; r < m; r++) {
            const int8_t *xq = qx->q + r * k;
            for (int c = 0; c < nc; c++) {
                float acc = 0.0f, accm = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    int32_t isum = 0;
                    lk_half dw;
                    if (has_min) {
                        const block_q41i *blk = (const block_q41i *)(w + s * sb) + b;
                        for (int i = 0; i < QK; i++) isum += code_q41i(blk, c, i) * xq[b * QK + i];
                        accm = fma_portable(half_to_float(blk->m[c]), qx->s[r * nb + b], accm, fma);
                        dw = blk->d[c];
                    } else {
                        const block_q80i *blk = (const block_q80i *)(w + s * sb) + b;
                        for (int i = 0; i < QK; i++) isum += code_q80i(blk, c, i) * xq[b * QK + i];
                        dw = blk->d[c];
                    }
                    acc = fma_portable(half_to_float(dw) * qx->d[r * nb + b], (float)isum, acc, fma);
                }
                y[r * ldy + s * STRIP + c] = has_min ? acc + accm : acc;
            }
        }
    }
}

#if HAVE_X86
static inline int32_t word_at(const int8_t *p)
{
    int32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* Generated per (kind, R): one function for each block kind and row count, so no kind is tested inside the
   per-block loop. DOTS fills isum[r][v] with the block's integer dots, MIN adds the Q4_1 minimum's share. */

/* ---- AVX2: R rows x one strip (two vectors of 8 columns) ----------------------------------------- */
#define I256_DOTS_Q41(R)                                                                                   \
    const __m256i low = _mm256_set1_epi8(15), one16 = _mm256_set1_epi16(1);                                 \
    __m256i s16[R][2];                                                                                      \
    UNROLL for (int r = 0; r < R; r++) s16[r][0] = s16[r][1] = _mm256_setzero_si256();                      \
    for (int h = 0; h < QK / 8; h++) {                                                                      \
        UNROLL for (int v = 0; v < 2; v++) {                                                                \
            const __m256i c = _mm256_loadu_si256((const __m256i *)blk->qs[h][8 * v]);                        \
            const __m256i lo = _mm256_and_si256(c, low), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low); \
            UNROLL for (int r = 0; r < R; r++) {                                                            \
                const int8_t *xq = qx->q + (r0 + r) * k + b * QK + 8 * h;                                   \
                s16[r][v] = _mm256_add_epi16(s16[r][v], _mm256_add_epi16(                                   \
                    _mm256_maddubs_epi16(lo, _mm256_set1_epi32(word_at(xq))),                               \
                    _mm256_maddubs_epi16(hi, _mm256_set1_epi32(word_at(xq + 4)))));                         \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < 2; v++)                                  \
        isum[r][v] = _mm256_madd_epi16(s16[r][v], one16);
#define I256_DOTS_Q80(R)                                                                                   \
    const __m256i flip = _mm256_set1_epi8((char)0x80), one16 = _mm256_set1_epi16(1);                        \
    UNROLL for (int r = 0; r < R; r++) isum[r][0] = isum[r][1] = _mm256_setzero_si256();                    \
    for (int g = 0; g < QK / 4; g++) {                                                                      \
        UNROLL for (int v = 0; v < 2; v++) {                                                                \
            const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)blk->qs[g][8 * v]), flip); \
            const __m256i aw = _mm256_abs_epi8(w);                                                          \
            UNROLL for (int r = 0; r < R; r++) {                                                            \
                const __m256i xv = _mm256_set1_epi32(word_at(qx->q + (r0 + r) * k + b * QK + 4 * g));       \
                isum[r][v] = _mm256_add_epi32(isum[r][v], _mm256_madd_epi16(                                \
                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w)), one16));                             \
            }                                                                                               \
        }                                                                                                   \
    }
#define I256_MIN_Q41(R)                                                                                    \
    const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->m));                           \
    const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->m + 8)));                     \
    UNROLL for (int r = 0; r < R; r++) {                                                                    \
        const __m256 xs = _mm256_set1_ps(qx->s[(r0 + r) * nb + b]);                                         \
        accm[r][0] = _mm256_fmadd_ps(m0, xs, accm[r][0]);                                                   \
        accm[r][1] = _mm256_fmadd_ps(m1, xs, accm[r][1]);                                                   \
    }
#define I256_MIN_Q80(R)
#define DEFINE_I256(Q, T, HAS_MIN, R)                                                                      \
AVX2H static void i256_##Q##_##R(const qx_t *qx, int64_t r0, int64_t k, const uint8_t *ws, float *y,        \
                                 int64_t ldy, int64_t ncols, const uint8_t *pf)                             \
{                                                                                                           \
    const int64_t nb = k / QK;                                                                              \
    __m256 acc[R][2], accm[R][2];                                                                           \
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < 2; v++)                                  \
        acc[r][v] = _mm256_setzero_ps(), accm[r][v] = _mm256_setzero_ps();                                  \
    for (int64_t b = 0; b < nb; b++) {                                                                      \
        const T *blk = (const T *)ws + b;                                                                   \
        if (pf) for (size_t off = 0; off < sizeof(T); off += 64)                                            \
            _mm_prefetch((const char *)((const T *)pf + b) + off, _MM_HINT_T0);                             \
        __m256i isum[R][2];                                                                                 \
        I256_DOTS_##Q(R)                                                                                    \
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));                       \
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));                 \
        UNROLL for (int r = 0; r < R; r++) {                                                                \
            const __m256 xd = _mm256_set1_ps(qx->d[(r0 + r) * nb + b]);                                     \
            acc[r][0] = _mm256_fmadd_ps(_mm256_mul_ps(d0, xd), _mm256_cvtepi32_ps(isum[r][0]), acc[r][0]);  \
            acc[r][1] = _mm256_fmadd_ps(_mm256_mul_ps(d1, xd), _mm256_cvtepi32_ps(isum[r][1]), acc[r][1]);  \
        }                                                                                                   \
        I256_MIN_##Q(R)                                                                                     \
    }                                                                                                       \
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                                        \
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < 2; v++) {                                \
        const __m256 out = HAS_MIN ? _mm256_add_ps(acc[r][v], accm[r][v]) : acc[r][v];                      \
        _mm256_maskstore_ps(y + (r0 + r) * ldy + 8 * v,                                                     \
                            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(ncols - 8 * v)), lanes), out);       \
    }                                                                                                       \
}
DEFINE_I256(Q41, block_q41i, 1, 1)
DEFINE_I256(Q41, block_q41i, 1, 2)
DEFINE_I256(Q80, block_q80i, 0, 1)
DEFINE_I256(Q80, block_q80i, 0, 2)

/* ---- AVX-512: R rows x one strip (one vector of 16 columns); vnni: vpdpbusd, else BW's vpmaddubsw ---- */
#define AVX512I RK_TARGET("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")
#define I512_DOTS_Q41(R)                                                                                   \
    const __m512i low = _mm512_set1_epi8(15), one16 = _mm512_set1_epi16(1);                                 \
    for (int h = 0; h < QK / 8; h++) {                                                                      \
        const __m512i c = _mm512_loadu_si512(blk->qs[h]);                                                   \
        const __m512i lo = _mm512_and_si512(c, low), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);   \
        UNROLL for (int r = 0; r < R; r++) {                                                                \
            const int8_t *xq = qx->q + (r0 + r) * k + b * QK + 8 * h;                                       \
            const __m512i x0 = _mm512_set1_epi32(word_at(xq)), x1 = _mm512_set1_epi32(word_at(xq + 4));     \
            if (vnni) isum[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(isum[r], lo, x0), hi, x1);          \
            else isum[r] = _mm512_add_epi16(isum[r], _mm512_add_epi16(_mm512_maddubs_epi16(lo, x0),         \
                                                                      _mm512_maddubs_epi16(hi, x1)));       \
        }                                                                                                   \
    }                                                                                                       \
    if (!vnni) UNROLL for (int r = 0; r < R; r++) isum[r] = _mm512_madd_epi16(isum[r], one16);
#define I512_DOTS_Q80(R)                                                                                   \
    const __m512i flip = _mm512_set1_epi8((char)0x80), one16 = _mm512_set1_epi16(1);                        \
    for (int g = 0; g < QK / 4; g++) {                                                                      \
        const __m512i u = _mm512_loadu_si512(blk->qs[g]);                                                   \
        if (vnni) {                                                                                         \
            UNROLL for (int r = 0; r < R; r++)                                                              \
                isum[r] = _mm512_dpbusd_epi32(isum[r], u,                                                   \
                              _mm512_set1_epi32(word_at(qx->q + (r0 + r) * k + b * QK + 4 * g)));           \
            continue;                                                                                       \
        }                                                                                                   \
        const __m512i w = _mm512_xor_si512(u, flip), aw = _mm512_abs_epi8(w);                               \
        const __mmask64 neg = _mm512_movepi8_mask(w);                                                       \
        UNROLL for (int r = 0; r < R; r++) {                                                                \
            const __m512i xv = _mm512_set1_epi32(word_at(qx->q + (r0 + r) * k + b * QK + 4 * g));           \
            const __m512i xs = _mm512_mask_sub_epi8(xv, neg, zero, xv);          /* x * sign(w) */           \
            isum[r] = _mm512_add_epi32(isum[r], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, xs), one16));    \
        }                                                                                                   \
    }                                                                                                       \
    if (vnni) UNROLL for (int r = 0; r < R; r++)     /* (q + 128) . x - 128 * sum(x) */                     \
        isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(qx->sums[(r0 + r) * nb + b] * 128));
#define I512_MIN_Q41(R)                                                                                    \
    const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk->m));                        \
    UNROLL for (int r = 0; r < R; r++)                                                                      \
        accm[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(qx->s[(r0 + r) * nb + b]), accm[r]);
#define I512_MIN_Q80(R)
#define DEFINE_I512(Q, T, HAS_MIN, R)                                                                      \
AVX512I static void i512_##Q##_##R(const qx_t *qx, int64_t r0, int64_t k, const uint8_t *ws, float *y,      \
                                   int64_t ldy, int64_t ncols, int vnni, const uint8_t *pf)                 \
{                                                                                                           \
    const int64_t nb = k / QK;                                                                              \
    const __m512i zero = _mm512_setzero_si512();                                                            \
    __m512 acc[R], accm[R];                                                                                 \
    UNROLL for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), accm[r] = _mm512_setzero_ps();        \
    for (int64_t b = 0; b < nb; b++) {                                                                      \
        const T *blk = (const T *)ws + b;                                                                   \
        if (pf) for (size_t off = 0; off < sizeof(T); off += 64)                                            \
            _mm_prefetch((const char *)((const T *)pf + b) + off, _MM_HINT_T0);                             \
        __m512i isum[R];                                                                                    \
        UNROLL for (int r = 0; r < R; r++) isum[r] = zero;                                                  \
        I512_DOTS_##Q(R)                                                                                    \
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk->d));                    \
        UNROLL for (int r = 0; r < R; r++)                                                                  \
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(qx->d[(r0 + r) * nb + b])),           \
                                     _mm512_cvtepi32_ps(isum[r]), acc[r]);                                  \
        I512_MIN_##Q(R)                                                                                     \
    }                                                                                                       \
    const __mmask16 keep = ncols >= STRIP ? (__mmask16)0xffff : (__mmask16)((1u << ncols) - 1u);            \
    UNROLL for (int r = 0; r < R; r++)                                                                      \
        _mm512_mask_storeu_ps(y + (r0 + r) * ldy, keep, HAS_MIN ? _mm512_add_ps(acc[r], accm[r]) : acc[r]); \
}
#define DEFINE_I512_ROWS(Q, T, HAS_MIN)                                                                    \
    DEFINE_I512(Q, T, HAS_MIN, 1) DEFINE_I512(Q, T, HAS_MIN, 2) DEFINE_I512(Q, T, HAS_MIN, 3)              \
    DEFINE_I512(Q, T, HAS_MIN, 4) DEFINE_I512(Q, T, HAS_MIN, 5) DEFINE_I512(Q, T, HAS_MIN, 6)
DEFINE_I512_ROWS(Q41, block_q41i, 1)
DEFINE_I512_ROWS(Q80, block_q80i, 0)
typedef void (*i256_fn)(const qx_t *, int64_t, int64_t, const uint8_t *, float *, int64_t, int64_t, const uint8_t *);
typedef void (*i512_fn)(const qx_t *, int64_t, int64_t, const uint8_t *, float *, int64_t, int64_t, int,
                        const uint8_t *);
/* [kind][rows] */
static const i256_fn I256[][3] = {[KIND_Q41I] = {0, i256_Q41_1, i256_Q41_2}, [KIND_Q80I] = {0, i256_Q80_1, i256_Q80_2}};
static const i512_fn I512[][7] = {
    [KIND_Q41I] = {0, i512_Q41_1, i512_Q41_2, i512_Q41_3, i512_Q41_4, i512_Q41_5, i512_Q41_6},
    [KIND_Q80I] = {0, i512_Q80_1, i512_Q80_2, i512_Q80_3, i512_Q80_4, i512_Q80_5, i512_Q80_6}};

/* every strip of w against every row, rows in register groups (AVX-512: up to 6, AVX2: 2) */
static void int_simd(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, const kind_t *kt, float *y,
                     int64_t ldy, int64_t n, const path_t *path)
{
    const size_t sb = strip_bytes(kt, k);
    for (int64_t s = 0; s * STRIP < n; s++) {
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        const uint8_t *ws = w + s * sb;
        float *ys = y + s * STRIP;
        /* the first row group fetches the next strip into cache while it computes on this one, so memory and
           arithmetic overlap: a step costs the slower of the two, not their sum */
        const uint8_t *next = (s + 1) * STRIP < n ? ws + sb : NULL;
        for (int64_t r = 0; r < m;) {
            const int64_t left = m - r;
            const uint8_t *pf = r == 0 ? next : NULL;
            if (path->isa == PATH_AVX512) {    /* 7 rows: 4 + 3, 8: 4 + 4, 9 and more: 6 at a time */
                const int R = left >= 9 ? 6 : left >= 7 ? 4 : (int)left;
                I512[kind][R](qx, r, k, ws, ys, ldy, nc, path->vnni, pf);
                r += R;
            } else {
                const int R = left >= 2 ? 2 : 1;
                I256[kind][R](qx, r, k, ws, ys, ldy, nc, pf);
                r += R;
            }
        }
    }
}
#endif

/* the int8 product of rows (already quantised in qx) against int-layout strips of w, of kind `kind` (kt its row) */
void int_product(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, const kind_t *kt, float *y,
                 int64_t ldy, int64_t n, const path_t *path)
{
#if HAVE_X86
    if (path->isa != PATH_PORTABLE) { int_simd(qx, m, k, w, kind, kt, y, ldy, n, path); return; }
#endif
    (void)kind;
    int_portable(qx, m, k, w, kt, y, ldy, n, path->fma);
}
