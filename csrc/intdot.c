/* intdot.c: the int8 numerics, integer block dots on native weights (included by rowkernel.c).

Why. The exact path builds every weight in float (widen, convert, dequantising FMA: about 3 operations a
weight) and then spends one FMA per weight per row, so a step of M rows costs about (3 + M) operations a
weight: extra verify rows are never cheap, and the step is compute-bound. Here each row's activations are
quantised to 8 bits once per product, as llama.cpp's Q8_1 does, and every block of 32 weights meets them in
an integer dot product. Integer sums are exact in any order, so a row's result cannot depend on the ISA, the
thread split or the rows beside it: row invariance holds by construction, not by carefully fixed chains.

Numerics (docs/numerics.md is the specification). Per row, per block b of 32 inputs:
    amax = max |x_i|;  d = amax / 127;  id = d ? 1 / d : 0;  q_i = roundf(x_i * id) (clamped to +-127; NaN: 0)
    s = d * (sum of q_i)                                            (one rounding)
Per output column c, blocks in order b = 0, 1, ..., with the weights' d_w (and m_w for Q4_1):
    isum = sum of q_w,i * q_i                                       (int32, exact: |isum| < 2^20)
    acc  = fma(d_w * d, (float)isum, acc)                           (the product rounded once, then one fma)
    accm = fma(m_w, s, accm)                                        (Q4_1 only: the block minimum's share)
    y    = acc + accm  (Q4_1)  or  acc  (Q8_0)
Every path computes exactly these float operations per column; only the integer dot differs in how it is
summed, and integer sums are exact. Float weights (KIND_F32) never take this path.

Layout. The portable path reads the strip-blocks as they are (csrc/format.h). The SIMD paths unpack one
strip at a time into the caller's scratch (L1/L2-resident, used by every row of the step, then the next
strip), as groups of 4 inputs x 16 columns, 64 bytes: dword j holds column P[j]'s codes for inputs 4g..4g+3,
P = 0-3, 8-11, 4-7, 12-15 (what two rounds of byte and word unpacking give). Q8_0's bytes come in the order
4g, 4g+2, 4g+1, 4g+3, so its quantised activations are stored in that order too (slot() below). Per block
the scratch also holds d_w (and m_w, or the code sums Q8_0's unsigned trick needs) as 16 floats in P order.

Paths (path & 3 as elsewhere; path & PATH_INT8 selects this file):
  AVX-512 VNNI: vpdpbusd, 4 products a lane, no saturation. Q4_1: codes 0..15 unsigned x activations signed.
               Q8_0: codes + 128 unsigned (unpacked so) x activations signed, minus 128 x (sum of the
               activations' codes) per block.
  AVX-512 BW and AVX2: vpmaddubsw (pairs into int16, saturating, so bounded: Q4_1 |pair| <= 2 * 15 * 127 and
               eight pairs of pairs <= 30,480 fit int16; Q8_0 takes |w| unsigned and x * sign(w), a pair
               <= 2 * 128 * 127 = 32,512 fits, widened to int32 at once), then vpmaddwd by ones.
  portable:    plain C over the packed layout, the reference the others are tested against bit for bit.
PATH_NO_VNNI makes an AVX-512 product take the BW instructions (tests compare the two on VNNI CPUs). */

#define PATH_ISA 3           /* path & 3: 0 portable, 1 AVX2, 2 AVX-512 */
#define PATH_INT8 4          /* int8 activations, integer block dots (this file) */
#define PATH_NO_VNNI 8       /* AVX-512 int8 without vpdpbusd */
#define INT_GROUP 64         /* bytes of one unpacked group: 4 inputs x 16 columns */

/* where input i of a block sits among the quantised activations of kind `kind` (an involution) */
static inline int slot(int kind, int i)
{
    return kind == KIND_Q80 ? (i & ~3) | ((i & 1) << 1) | ((i >> 1) & 1) : i;
}

/* rows x [m, k] -> q [m, k] int8 (in slot order), d and s [m, k / 32]: the rounding above */
static void quantise_rows(const float *x, int64_t ldx, int64_t m, int64_t k, int kind, int8_t *q, float *d,
                          float *s, int32_t *sums)
{
    const int64_t nb = k / QK;
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
                float v = roundf(xb[i] * id);
                v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                qb[slot(kind, i)] = (int8_t)v;
                sum += (int32_t)v;
            }
            d[r * nb + b] = db;
            s[r * nb + b] = db * (float)sum;
            sums[r * nb + b] = sum;
        }
}

typedef struct {
    const int8_t *q;         /* [m, k] quantised activations, slot order */
    const float *d, *s;      /* [m, k / 32] scales and scaled code sums */
    const int32_t *sums;     /* [m, k / 32] code sums (the VNNI Q8_0 dot's correction) */
} qx_t;

/* the portable fma: the instruction where the CPU has one, else the proven software fma (rowkernel.c) */
static inline float fma_portable(float a, float b, float c)
{
#if RK_X86 || RK_ARM64
    if (hw_fma()) return hw_fmaf(a, b, c);
#endif
    return soft_fmaf(a, b, c);
}

/* ---- portable: the reference --------------------------------------------------------------------- */
static void int_portable(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, float *y, int64_t ldy,
                         int64_t n)
{
    const int64_t nb = k / QK;
    const size_t sb = strip_bytes(kind, k);
    for (int64_t s = 0; s * STRIP < n; s++) {
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        for (int64_t r = 0; r < m; r++) {
            const int8_t *xq = qx->q + r * k;
            for (int c = 0; c < nc; c++) {
                float acc = 0.0f, accm = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    const int8_t *xb = xq + b * QK;
                    int32_t isum = 0;
                    float dw;
                    if (kind == KIND_Q41) {
                        const uint8_t *blk = w + s * sb + b * Q41_BLOCK;
                        for (int j = 0; j < QK / 2; j++) {
                            const int code = blk[64 + STRIP * j + c];
                            isum += (code & 15) * xb[2 * j] + (code >> 4) * xb[2 * j + 1];
                        }
                        dw = half_to_float(blk + 2 * c);
                        accm = fma_portable(half_to_float(blk + 32 + 2 * c), qx->s[r * nb + b], accm);
                    } else {
                        const uint8_t *blk = w + s * sb + b * Q80_BLOCK;
                        for (int i = 0; i < QK; i++) isum += (int8_t)blk[32 + STRIP * i + c] * xb[slot(kind, i)];
                        dw = half_to_float(blk + 2 * c);
                    }
                    acc = fma_portable(dw * qx->d[r * nb + b], (float)isum, acc);
                }
                y[r * ldy + s * STRIP + c] = kind == KIND_Q41 ? acc + accm : acc;
            }
        }
    }
}

#if HAVE_X86
/* ---- unpacking one strip into scratch (AVX2 instructions, shared by the AVX2 and AVX-512 paths) ------
scratch per block b: groups [8][64] bytes, then d_w [16] floats, then m_w [16] floats (Q4_1) or, for Q8_0,
|codes| [8][64] bytes (the AVX2 / BW dots) and the code sums [16] int32 (the VNNI dot), all in P order */
#define UNPACKED_BLOCK (8 * INT_GROUP + 16 * 4 + 16 * 4 + 8 * INT_GROUP)

/* two 256-bit vectors of byte pairs (t0: columns 0-7, t1: 8-15; lane 0 the first pair of inputs, lane 1
   the second) -> one 64-byte group: dwords of 4 inputs per column, columns in P order */
AVX2H static inline void store_group(uint8_t *dst, __m256i t0, __m256i t1)
{
    const __m256i u0 = _mm256_permute2x128_si256(t0, t1, 0x20), u1 = _mm256_permute2x128_si256(t0, t1, 0x31);
    _mm256_storeu_si256((__m256i *)dst, _mm256_unpacklo_epi16(u0, u1));
    _mm256_storeu_si256((__m256i *)(dst + 32), _mm256_unpackhi_epi16(u0, u1));
}

/* 16 halves (columns in natural order) -> 16 floats in P order */
AVX2H static inline void store_scales(float *dst, const uint8_t *halves)
{
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)halves));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(halves + 16)));
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(a, b, 0x20));
    _mm256_storeu_ps(dst + 8, _mm256_permute2f128_ps(a, b, 0x31));
}

AVX2H static void unpack_strip(const uint8_t *w, int kind, int64_t k, uint8_t *out, int vnni)
{
    const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < k / QK; b++) {
        uint8_t *ob = out + b * UNPACKED_BLOCK;
        float *dw = (float *)(ob + 8 * INT_GROUP), *extra = dw + 16;
        if (kind == KIND_Q41) {
            const uint8_t *blk = w + b * Q41_BLOCK;
            for (int g = 0; g < 8; g++) {      /* pairs 2g, 2g + 1: inputs 4g .. 4g + 3 */
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 + 32 * g));
                const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                store_group(ob + g * INT_GROUP, _mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
            }
            store_scales(dw, blk);
            store_scales(extra, blk + 32);
        } else {
            const uint8_t *blk = w + b * Q80_BLOCK;
            uint8_t *absq = ob + 8 * INT_GROUP + 128;
            for (int g = 0; g < 8; g++) {      /* inputs 4g | 4g + 1 and 4g + 2 | 4g + 3: bytes 4g, 4g+2, 4g+1, 4g+3 */
                __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 32 + 64 * g));
                __m256i c = _mm256_loadu_si256((const __m256i *)(blk + 64 + 64 * g));
                if (vnni) a = _mm256_xor_si256(a, flip), c = _mm256_xor_si256(c, flip);   /* q + 128, unsigned */
                uint8_t *grp = ob + g * INT_GROUP;
                store_group(grp, _mm256_unpacklo_epi8(a, c), _mm256_unpackhi_epi8(a, c));
                if (vnni) continue;
                _mm256_storeu_si256((__m256i *)(absq + g * INT_GROUP), _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)grp)));
                _mm256_storeu_si256((__m256i *)(absq + g * INT_GROUP + 32), _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(grp + 32))));
            }
            store_scales(dw, blk);
        }
    }
}

/* P order back to natural: v0 = columns 0-3 | 8-11, v1 = 4-7 | 12-15 -> 0-7, 8-15, stored with the tail masked */
AVX2H static inline void store_row(float *y, __m256 v0, __m256 v1, int64_t ncols)
{
    const __m256 a = _mm256_permute2f128_ps(v0, v1, 0x20), b = _mm256_permute2f128_ps(v0, v1, 0x31);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ncols), lanes), a);
    _mm256_maskstore_ps(y + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(ncols - 8)), lanes), b);
}

/* one row against one unpacked strip, AVX2 */
AVX2H static void int_row_avx2(const int8_t *xq, const float *xd, const float *xs, int64_t nb, int kind,
                               const uint8_t *u, float *y, int64_t ncols)
{
    const __m256i one16 = _mm256_set1_epi16(1);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ub = u + b * UNPACKED_BLOCK;
        const float *dw = (const float *)(ub + 8 * INT_GROUP), *extra = dw + 16;
        const int32_t *xw = (const int32_t *)(xq + b * QK);
        __m256i i0, i1;
        if (kind == KIND_Q41) {
            __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                int32_t word;
                memcpy(&word, xw + g, 4);
                const __m256i xv = _mm256_set1_epi32(word);
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(ub + g * INT_GROUP)), xv));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(ub + g * INT_GROUP + 32)), xv));
            }
            i0 = _mm256_madd_epi16(s0, one16), i1 = _mm256_madd_epi16(s1, one16);
            const __m256 sv = _mm256_set1_ps(xs[b]);
            m0 = _mm256_fmadd_ps(_mm256_loadu_ps(extra), sv, m0);
            m1 = _mm256_fmadd_ps(_mm256_loadu_ps(extra + 8), sv, m1);
        } else {
            const uint8_t *absq = ub + 8 * INT_GROUP + 128;
            i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                int32_t word;
                memcpy(&word, xw + g, 4);
                const __m256i xv = _mm256_set1_epi32(word);
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(ub + g * INT_GROUP));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(ub + g * INT_GROUP + 32));
                const __m256i p0 = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(absq + g * INT_GROUP)), _mm256_sign_epi8(xv, w0));
                const __m256i p1 = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(absq + g * INT_GROUP + 32)), _mm256_sign_epi8(xv, w1));
                i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(p0, one16));
                i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(p1, one16));
            }
        }
        const __m256 dv = _mm256_set1_ps(xd[b]);
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dw), dv), _mm256_cvtepi32_ps(i0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dw + 8), dv), _mm256_cvtepi32_ps(i1), acc1);
    }
    if (kind == KIND_Q41) acc0 = _mm256_add_ps(acc0, m0), acc1 = _mm256_add_ps(acc1, m1);
    store_row(y, acc0, acc1, ncols);
}

/* one row against one unpacked strip, AVX-512 (vnni: vpdpbusd; else BW's vpmaddubsw) */
#define AVX512I RK_TARGET("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")
AVX512I static void int_row_avx512(const int8_t *xq, const float *xd, const float *xs, const int32_t *xsum,
                                   int64_t nb, int kind, const uint8_t *u, float *y, int64_t ncols, int vnni)
{
    const __m512i one16 = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ub = u + b * UNPACKED_BLOCK;
        const float *dw = (const float *)(ub + 8 * INT_GROUP), *extra = dw + 16;
        const int32_t *xw = (const int32_t *)(xq + b * QK);
        __m512i isum = _mm512_setzero_si512();
        if (vnni) {
            for (int g = 0; g < 8; g++) {
                int32_t word;
                memcpy(&word, xw + g, 4);
                isum = _mm512_dpbusd_epi32(isum, _mm512_loadu_si512(ub + g * INT_GROUP), _mm512_set1_epi32(word));
            }
            if (kind == KIND_Q80)   /* (q + 128) . x - 128 * sum(x) */
                isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(xsum[b] * 128));
        } else if (kind == KIND_Q41) {
            __m512i s16 = _mm512_setzero_si512();
            for (int g = 0; g < 8; g++) {
                int32_t word;
                memcpy(&word, xw + g, 4);
                s16 = _mm512_add_epi16(s16, _mm512_maddubs_epi16(_mm512_loadu_si512(ub + g * INT_GROUP), _mm512_set1_epi32(word)));
            }
            isum = _mm512_madd_epi16(s16, one16);
        } else {
            const uint8_t *absq = ub + 8 * INT_GROUP + 128;
            for (int g = 0; g < 8; g++) {
                int32_t word;
                memcpy(&word, xw + g, 4);
                const __m512i xv = _mm512_set1_epi32(word), wv = _mm512_loadu_si512(ub + g * INT_GROUP);
                const __m512i xs8 = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(wv), zero, xv);   /* x * sign(w) */
                isum = _mm512_add_epi32(isum, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_loadu_si512(absq + g * INT_GROUP), xs8), one16));
            }
        }
        if (kind == KIND_Q41) accm = _mm512_fmadd_ps(_mm512_loadu_ps(extra), _mm512_set1_ps(xs[b]), accm);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dw), _mm512_set1_ps(xd[b])), _mm512_cvtepi32_ps(isum), acc);
    }
    if (kind == KIND_Q41) acc = _mm512_add_ps(acc, accm);
    const __m512 nat = _mm512_shuffle_f32x4(acc, acc, 0xd8);      /* 128-bit lanes 0, 2, 1, 3: P order -> natural */
    const __mmask16 keep = ncols >= STRIP ? (__mmask16)0xffff : (__mmask16)((1u << ncols) - 1u);
    _mm512_mask_storeu_ps(y, keep, nat);
}

static int cpu_vnni(void)
{
    static rk_atomic ok = -1;
    if (rk_load(&ok) < 0) rk_store(&ok, rk_cpu_avx512() && rk_cpu_avx512vnni());
    return (int)rk_load(&ok);
}

/* strips of w against every row: unpack a strip once into scratch, then each row's dot */
static void int_simd(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, float *y, int64_t ldy,
                     int64_t n, int path, uint8_t *scratch)
{
    const int64_t nb = k / QK;
    const size_t sb = strip_bytes(kind, k);
    const int wide = (path & PATH_ISA) == 2, vnni = wide && !(path & PATH_NO_VNNI) && cpu_vnni();
    for (int64_t s = 0; s * STRIP < n; s++) {
        const int64_t nc = n - s * STRIP < STRIP ? n - s * STRIP : STRIP;
        unpack_strip(w + s * sb, kind, k, scratch, vnni);
        for (int64_t r = 0; r < m; r++) {
            const int8_t *xq = qx->q + r * k;
            float *yr = y + r * ldy + s * STRIP;
            if (wide) int_row_avx512(xq, qx->d + r * nb, qx->s + r * nb, qx->sums + r * nb, nb, kind, scratch, yr, nc, vnni);
            else int_row_avx2(xq, qx->d + r * nb, qx->s + r * nb, nb, kind, scratch, yr, nc);
        }
    }
}
#endif

/* bytes of scratch one thread needs for a product of k inputs on the int8 path */
static size_t int_scratch_bytes(int64_t k)
{
#if HAVE_X86
    return (size_t)(k / QK) * UNPACKED_BLOCK;
#else
    (void)k;
    return 0;
#endif
}

/* the int8 product of rows x (already quantised in qx) against native strips [s0, ...) of w */
static void int_product(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, float *y, int64_t ldy,
                        int64_t n, int path, void *scratch)
{
#if HAVE_X86
    if (path & PATH_ISA) { int_simd(qx, m, k, w, kind, y, ldy, n, path, (uint8_t *)scratch); return; }
#endif
    (void)path, (void)scratch;
    int_portable(qx, m, k, w, kind, y, ldy, n);
}
