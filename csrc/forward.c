/* forward.c: a whole Llama forward over M rows in one C call (a unit of its own: kernel_impl.h).

Why. A decode step on the PyTorch forward crosses from Python into C about 121 times and runs about 2,400
PyTorch ops (norms, RoPE, attention, SwiGLU, residuals); on SmolLM2's native blocks that glue took about 40%
of a step. rk_forward runs every layer of a dense Llama forward (RMSNorm, fused q|k|v product, rotate-half
RoPE, the new keys and values written into the caller's KV cache, grouped-query attention over positions
0..p, output product, residual, RMSNorm, fused gate|up product, SiLU, down product, residual) for M new rows
at positions start .. start + M - 1, then the final RMSNorm and the output layer, in one call.

Numerics (docs/numerics.md is the specification; this file follows it). Every value a row produces depends
on that row's inputs and position only, never on M, on where the row sits, on the thread count or on the
instruction set, so decode, verify, any prefill chunking, 1 or 8 threads and the AVX2 or portable paths give
the same bits:
  - products: the row kernel (products.c: one fixed-order FMA chain per output);
  - sums over a vector (RMSNorm's squares, attention's q.k, softmax's denominator): EIGHT SUM_LANES, lane l
    takes the terms l, l + 8, l + 16, ... in order (a multiply, then an add: two roundings), then the fixed
    tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), which is how an 8-wide vector register reduces;
  - attention's weighted sum of values: per output element one chain over the keys in order
    (o = o + e_j * v_j, two roundings), then one division by the denominator;
  - exp: exp_lk below, written with + - * and bit operations only (Cody-Waite reduction, Cephes' degree-5
    polynomial), so every compiler and CPU computes the same float; sqrt and division are IEEE's
    correctly rounded operations;
  - RoPE, residuals, SiLU (g / (1 + exp(-g)), times up) and the norm's scaling are elementwise and in the
    PyTorch forward's order.
The build has no fused multiply-add outside the products (-ffp-contract=off, portable.h's pragmas), so the
compiler may vectorise the lane loops (lanes are independent) without changing a bit.

Mixtures of experts (OLMoE-style): per layer a softmax router, the top A of E experts per row (ties: the
lower id), weights renormalised or not, then batch-union: each expert the M rows chose runs once on the rows
that chose it, experts in ascending id; a row's output is s_0 w_0 + s_1 w_1 + ... in slot order. Experts are
streamed by the Python side's expert store: for every expert a layer uses, the forward calls `fetch`, which
fills the layer's table entry (and may read the expert from disk): one Python call per expert used, none for
dense models. OLMoE's q/k RMSNorm (over the whole q and k projections) and Mixtral-style clipping of q, k, v
are applied before RoPE, as in the PyTorch forward.

Layout. A call takes two structs (rowkernel.h): struct rk_model (plan, dims, eps, clip, the path word, fetch)
and struct rk_batch (tokens or x, m rows at start.., first, logits, routing, unique, the KV cache).
plan (int64): 8 globals then 15 per layer (rowkernel.h names each slot: PLAN_*, LAYER_*, EXPERT_*):
  final_norm [D], lm_head (packed [D, V]), lm_head kind, cos [R, hd], sin [R, hd],
  the embedding: address, kind (-1: float32 rows [NV, D]; 0 / 1: a tied output layer's packed Q4_1 / Q8_0
  strip-blocks, row t = column t, dequantised as the loader does: d * q (+ m), two roundings), NV rows;
  per layer: attn_norm [D], wqkv (packed [D, nq + 2 nkv]), its kind, wo (packed [nq, D]), its kind,
             mlp_norm [D], gate_up (packed [D, 2I]), its kind, down (packed [I, D]), its kind (dense only),
             q_norm [nq], k_norm [nkv] (qk_norm only), router (packed [D, E]), its kind (MoE only),
             the layer's expert table (MoE only): int64 [E, 4] of gate_up address, kind, down address, kind.
  A kind is -1 (float32 strips), 0 (Q4_1 strip-blocks), 1 (Q8_0 strip-blocks), or 2 / 3 (the same in the int8
  numerics' layout, csrc/intdot.c: products take integer block dots).
dims (int64, DIM_*): L, D, H, G, hd, I, V, R (rows of the rope tables), E, A, norm_topk, qk_norm, prefetch (1: before
  a MoE layer fetches its experts, it calls fetch(layer + 1, e, NULL) for the experts the next layer's router
  would pick for this layer's input, the PyTorch forward's one-layer-ahead guess).
The KV cache: k and v [L, alloc, G, hd] float32, rows start .. start + M - 1 of every layer written here.
x [M, D]: the embeddings in (or looked up here from tokens [M] when tokens is not 0), the residual stream out
  (what the PyTorch forward returns as its hidden state).
logits [M - first, V]: the output layer for rows first .. M - 1 (first = M - 1: the last row only).
taps [n_taps, M, D]: the residual stream after tap_at[i] layers, for a drafter that reads the target's states (a
  feature head); copied as the rows leave the layer, so the call computes every bit as it does without them.

Paths. Attention has a portable copy (attention_body) and, for heads of 32 or 64 values, AVX2 and AVX-512
copies that compute the same floats with more of them in flight: scores for 8 keys at once (the lane tree by
shuffles), exp on 8 lanes, the output held in registers across the keys. Tests compare every path's logits
with the portable path's, bit for bit.

Threads. Products split their strips over the pool (pool.c); attention splits its (row, head) pairs; each
value is still computed by one thread in one order. The elementwise stages run on the calling thread. */
#include "kernel_impl.h"

#define SUM_LANES 8

/* the helpers below are inlined into each path's copy of a hot loop (attention, SwiGLU): the AVX2 copy is the
   same C compiled for 256-bit vectors (target "avx2", no "fma": nothing can be fused), the portable copy for
   the build's baseline; lanes are independent, so vectorising them changes no bit (tests compare the two) */
#if defined(__GNUC__)
#define FWD_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define FWD_INLINE static __forceinline
#else
#define FWD_INLINE static inline
#endif

FWD_INLINE float lane_tree(const float s[SUM_LANES])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* sum of a[i] * b[i], eight lanes then the tree */
FWD_INLINE float dot_lanes(const float *a, const float *b, int64_t n)
{
    float s[SUM_LANES] = {0};
    int64_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) s[l] = s[l] + a[i + l] * b[i + l];
    for (int l = 0; i + l < n; l++) s[l] = s[l] + a[i + l] * b[i + l];
    return lane_tree(s);
}

FWD_INLINE float sum_lanes(const float *a, int64_t n)
{
    float s[SUM_LANES] = {0};
    int64_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) s[l] = s[l] + a[i + l];
    for (int l = 0; i + l < n; l++) s[l] = s[l] + a[i + l];
    return lane_tree(s);
}

/* exp(x) from + - * and bit operations only: n = round(x log2 e) (the 1.5 * 2^23 trick rounds to nearest
   even), r = x - n ln2 in two steps (Cody-Waite: n * C1 is exact, C1 has 9 significant bits), Cephes'
   expf polynomial on |r| <= ln2 / 2, times 2^n built from its bits. x < -87.3 gives 0, x > 88.3 infinity,
   NaN passes. Within 2 ulp of the true value on the range (tests/test_forward.py measures it). */
FWD_INLINE float exp_lk(float x)
{
    const float xc = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    const float t = xc * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * z + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float e = y * scale;
    return x != x ? x : x < -87.3f ? 0.0f : x > 88.3f ? INFINITY : e;
}



static void rms_rows(const float *x, const float *w, float *out, int64_t m, int64_t d, float eps)
{
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * d;
        float *o = out + r * d;
        const float ss = dot_lanes(xr, xr, d);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t i = 0; i < d; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* rms_rows without a weight (x * inv: the caller folded the weight into the next product); out may be x */
static void rms_unit_rows(const float *x, float *out, int64_t m, int64_t d, float eps)
{
    for (int64_t r = 0; r < m; r++) {
        const float inv = 1.0f / sqrtf(dot_lanes(x + r * d, x + r * d, d) / (float)d + eps);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = x[r * d + i] * inv;
    }
}

/* rotate-half RoPE of `heads` heads of one row at one position, as the PyTorch forward computes it:
   x * cos + rotate_half(x) * sin, two products then an add */
static void rope_row(float *x, int64_t heads, int64_t hd, const float *cos, const float *sin)
{
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (int64_t i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cos[i] + (-b) * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

typedef struct {
    const float *qkv;       /* [M, nq + 2 nkv], q already rotated */
    int64_t ldqkv, start, H, G, hd, nkv;
    const float *k, *v;     /* this layer's cache rows [alloc, G, hd] */
    float *out;             /* [M, nq] */
    float *scores;          /* per thread: start + M floats */
    int64_t slen;
    float scale;
    int64_t pairs;          /* M * H */
    enum rk_isa isa;
} attention_t;

/* the row of pair pr: rows taken from both ends in turn (0, M - 1, 1, M - 2, ...), so that the pool's
   contiguous chunks of pairs hold about the same number of keys (row r attends to start + r + 1 of them) */
FWD_INLINE int64_t pair_row(const attention_t *a, int64_t pr)
{
    const int64_t i = pr / a->H, m = a->pairs / a->H;
    return i % 2 ? m - 1 - i / 2 : i / 2;
}

FWD_INLINE void attention_body(const attention_t *a, int part, int parts, int thread)
{
    const int64_t p0 = a->pairs * part / parts, p1 = a->pairs * (part + 1) / parts, rep = a->H / a->G;
    float *sc = a->scores + (int64_t)thread * a->slen;
    for (int64_t pr = p0; pr < p1; pr++) {
        const int64_t r = pair_row(a, pr), h = pr % a->H, g = h / rep, S = a->start + r + 1;
        const float *q = a->qkv + r * a->ldqkv + h * a->hd;
        float mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
            sc[j] = dot_lanes(q, a->k + j * a->nkv + g * a->hd, a->hd) * a->scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int64_t j = 0; j < S; j++) sc[j] = exp_lk(sc[j] - mx);
        const float sum = sum_lanes(sc, S);
        float *o = a->out + r * a->H * a->hd + h * a->hd;
        for (int64_t i = 0; i < a->hd; i++) o[i] = 0.0f;
        for (int64_t j = 0; j < S; j++) {
            const float e = sc[j], *vr = a->v + j * a->nkv + g * a->hd;
            for (int64_t i = 0; i < a->hd; i++) o[i] = o[i] + e * vr[i];
        }
        for (int64_t i = 0; i < a->hd; i++) o[i] = o[i] / sum;
    }
}

static void attention_portable(void *ctx, int part, int parts, int thread)
{
    attention_body((const attention_t *)ctx, part, parts, thread);
}

#if HAVE_X86
/* AVX2, heads of NV x 8 values: attention_body's floats, computed with more of them in flight. The scores take
   8 keys at a time: 8 accumulators of 8 lanes (each lane's terms in order, a multiply then an add, as
   dot_lanes), then the lane tree for all 8 keys at once (a transpose by shuffles: step 1 adds l and l + 4, step 2
   (l0 + l4) + (l2 + l6) and (l1 + l5) + (l3 + l7), step 3 their sum; IEEE addition is commutative, so operand
   order within an add changes no bit). The weighted sum of values keeps the NV vectors of o in registers across
   the keys (the same chain per element, in key order) instead of loading and storing o for every key. */
RK_TARGET("avx2") static inline __m256 lane_tree_x8(const __m256 a[8])
{
    __m256 m[4], y[2];
    for (int p = 0; p < 4; p++)       /* [key 2p: l_i + l_i+4, i < 4 | key 2p + 1: the same] */
        m[p] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x31));
    for (int p = 0; p < 2; p++)       /* [key 4p: u, w, key 4p + 2: u, w | keys 4p + 1, 4p + 3] */
        y[p] = _mm256_add_ps(_mm256_shuffle_ps(m[2 * p], m[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(m[2 * p], m[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));   /* keys 0, 2, 4, 6 | 1, 3, 5, 7 */
}

/* exp_lk on 8 lanes: the same operations in the same order (no fused multiply-add; the clamp and the edges by
   compare and blend: NaN fails every ordered compare, as in the C) */
RK_TARGET("avx2") static inline __m256 exp_lk_x8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.3f), shift = _mm256_set1_ps(12582912.0f);
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), above = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    const __m256 xc = _mm256_blendv_ps(_mm256_blendv_ps(x, hi, above), lo, below);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), shift),
                                   shift);
    __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, z), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), above);
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), below);
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* softmax's numerators in place: mx = the largest score (a running maximum per lane, then across lanes: the
   same value as attention_body's scan; NaN never wins a compare in either; a zero's sign cannot change
   exp(s - mx)), then exp(s - mx) */
RK_TARGET("avx2") static inline void softmax_numerators_x8(float *sc, int64_t S)
{
    int64_t j = 0;
    float mx = -INFINITY;
    if (S >= 8) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (; j + 8 <= S; j += 8) {
            const __m256 v = _mm256_loadu_ps(sc + j);
            m = _mm256_blendv_ps(m, v, _mm256_cmp_ps(v, m, _CMP_GT_OQ));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    }
    for (; j < S; j++) mx = sc[j] > mx ? sc[j] : mx;
    const __m256 mv = _mm256_set1_ps(mx);
    for (j = 0; j + 8 <= S; j += 8) _mm256_storeu_ps(sc + j, exp_lk_x8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv)));
    for (; j < S; j++) sc[j] = exp_lk(sc[j] - mx);
}

/* the weighted sum of values, o = o + e_j * v_j over the keys in order, then o / sum: NV vectors of 8 (AVX2) or
   NV / 2 of 16 (AVX-512) held in registers; every element's chain is attention_body's */
#define VALUES_AVX2(NV)                                                                                    \
    const __m256 sum = _mm256_set1_ps(total);                                                               \
    __m256 o[NV];                                                                                           \
    UNROLL for (int c = 0; c < NV; c++) o[c] = _mm256_setzero_ps();                                         \
    for (j = 0; j < S; j++) {                                                                               \
        const __m256 e = _mm256_set1_ps(sc[j]);                                                             \
        const float *vr = vg + j * a->nkv;                                                                  \
        UNROLL for (int c = 0; c < NV; c++)                                                                 \
            o[c] = _mm256_add_ps(o[c], _mm256_mul_ps(e, _mm256_loadu_ps(vr + 8 * c)));                      \
    }                                                                                                       \
    UNROLL for (int c = 0; c < NV; c++) _mm256_storeu_ps(out + 8 * c, _mm256_div_ps(o[c], sum));
#define VALUES_AVX512(NV)                                                                                  \
    const __m512 sum = _mm512_set1_ps(total);                                                               \
    __m512 o[NV / 2];                                                                                       \
    UNROLL for (int c = 0; c < NV / 2; c++) o[c] = _mm512_setzero_ps();                                     \
    for (j = 0; j < S; j++) {                                                                               \
        const __m512 e = _mm512_set1_ps(sc[j]);                                                             \
        const float *vr = vg + j * a->nkv;                                                                  \
        UNROLL for (int c = 0; c < NV / 2; c++)                                                             \
            o[c] = _mm512_add_ps(o[c], _mm512_mul_ps(e, _mm512_loadu_ps(vr + 16 * c)));                     \
    }                                                                                                       \
    UNROLL for (int c = 0; c < NV / 2; c++) _mm512_storeu_ps(out + 16 * c, _mm512_div_ps(o[c], sum));

/* heads of NV x 8 values on ISA (AVX2 or AVX512: the values' vector width; the scores take 8-wide vectors) */
#define DEFINE_ATTENTION(ISA, TARGET, NV)                                                                  \
RK_TARGET(TARGET) static void attention_##ISA##_##NV(void *ctx, int part, int parts, int thread)          \
{                                                                                                           \
    const attention_t *a = (const attention_t *)ctx;                                                       \
    const int64_t p0 = a->pairs * part / parts, p1 = a->pairs * (part + 1) / parts, rep = a->H / a->G;     \
    const __m256 scale = _mm256_set1_ps(a->scale);                                                          \
    float *sc = a->scores + (int64_t)thread * a->slen;                                                      \
    for (int64_t pr = p0; pr < p1; pr++) {                                                                  \
        const int64_t r = pair_row(a, pr), h = pr % a->H, g = h / rep, S = a->start + r + 1;               \
        const float *q = a->qkv + r * a->ldqkv + h * a->hd, *kg = a->k + g * a->hd, *vg = a->v + g * a->hd; \
        __m256 qv[NV];                                                                                      \
        UNROLL for (int c = 0; c < NV; c++) qv[c] = _mm256_loadu_ps(q + 8 * c);                             \
        int64_t j = 0;                                                                                      \
        for (; j + 8 <= S; j += 8) {                                                                        \
            __m256 acc[8];                                                                                  \
            UNROLL for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();                                \
            UNROLL for (int c = 0; c < NV; c++)                                                             \
                UNROLL for (int t = 0; t < 8; t++)                                                          \
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(qv[c],                                     \
                                 _mm256_loadu_ps(kg + (j + t) * a->nkv + 8 * c)));                          \
            _mm256_storeu_ps(sc + j, _mm256_mul_ps(lane_tree_x8(acc), scale));                              \
        }                                                                                                   \
        for (; j < S; j++) sc[j] = dot_lanes(q, kg + j * a->nkv, a->hd) * a->scale;                         \
        softmax_numerators_x8(sc, S);                                                                       \
        const float total = sum_lanes(sc, S);                                                               \
        float *out = a->out + r * a->H * a->hd + h * a->hd;                                                \
        VALUES_##ISA(NV)                                                                                    \
    }                                                                                                       \
}
DEFINE_ATTENTION(AVX2, "avx2", 4)
DEFINE_ATTENTION(AVX2, "avx2", 8)
DEFINE_ATTENTION(AVX512, "avx512f,avx2", 4)
DEFINE_ATTENTION(AVX512, "avx512f,avx2", 8)

RK_TARGET("avx2") static int64_t exp_many_avx2(const float *x, float *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp_lk_x8(_mm256_loadu_ps(x + i)));
    return i;
}

RK_TARGET("avx2") static void attention_avx2(void *ctx, int part, int parts, int thread)
{
    attention_body((const attention_t *)ctx, part, parts, thread);
}
#endif

/* exp_lk over n floats on the path's ISA (AVX2 and AVX-512: exp_lk_x8, 8 at a time; tests compare the bits) */
RK_EXPORT int32_t rk_exp_many(uintptr_t x, uintptr_t out, int64_t n, int32_t path)
{
    const float *px = (const float *)x;
    float *po = (float *)out;
    path_t how;
    const int32_t rc = decode_path(path & PATH_ISA, &how);
    if (rc != RK_OK) return rc;
    if (n < 0) return RK_BAD_SIZES;
    int64_t i = 0;
#if HAVE_X86
    if (how.isa != PATH_PORTABLE) i = exp_many_avx2(px, po, n);
#endif
    for (; i < n; i++) po[i] = exp_lk(px[i]);
    return RK_OK;
}

/* the attention pairs on the pool when it is free, else alone (as a product) */
static void run_attention(attention_t *a)
{
    void (*part)(void *, int, int, int) = attention_portable;
#if HAVE_X86
    if (a->isa == PATH_AVX2)        /* heads of 32 or 64 values (the models here): the register-held copies */
        part = a->hd == 32 ? attention_AVX2_4 : a->hd == 64 ? attention_AVX2_8 : attention_avx2;
    if (a->isa == PATH_AVX512)
        part = a->hd == 32 ? attention_AVX512_4 : a->hd == 64 ? attention_AVX512_8 : attention_avx2;
#endif
    pool_run(part, a, a->pairs, 0, NULL);
}

typedef struct {
    int64_t L, D, H, G, hd, I, V, R, E, A, norm_topk, qk_norm, prefetch;
    float eps, clip;
    path_t path;            /* the path word, decoded once per call (rowkernel.c decode_path) */
} shape_t;

static int fwd_product(const float *x, int64_t ldx, int64_t m, int64_t k, uint64_t w, int64_t kind, float *y,
                       int64_t ldy, int64_t n, const shape_t *c)
{
    product_t p = {0};
    p.x = x, p.ldx = ldx, p.m = m, p.k = k, p.w = (const void *)(uintptr_t)w, p.kind = (int)kind;
    p.y = y, p.ldy = ldy, p.n = n, p.path = c->path;
    return run_product(&p) ? RK_NO_MEMORY : RK_OK;
}

#define STEP(call) do { if (rc == RK_OK) rc = (call); } while (0)   /* the first error code stays */

/* ---- where a forward's time goes (lessonkit bench native): off unless rk_profile turned it on --------
groups: 0 elementwise (norms, RoPE, residuals, cache writes), 1 attention products (q|k|v, o), 2 attention
itself, 3 MLP / router / experts, 4 output layer (final norm and logits), 5 expert fetches (Python calls) */
#define PROF_GROUPS 6
static int prof_on;
static double prof_s[PROF_GROUPS], prof_fetch_s;
static inline void prof_mark(double *t, int group)
{
    if (!prof_on) return;
    const double now = rk_now_s();
    prof_s[group] += now - *t;
    *t = now;
}

/* on: 1 starts (and zeroes) the counters, 0 stops; out: PROF_GROUPS seconds accumulated so far (may be 0) */
RK_EXPORT int32_t rk_profile(int32_t on, uintptr_t out)
{
    if (out) memcpy((double *)out, prof_s, sizeof prof_s);
    if (on) { memset(prof_s, 0, sizeof prof_s); prof_fetch_s = 0.0; }
    prof_on = on != 0;
    return RK_OK;
}
/* PLAN_GLOBALS, PLAN_LAYER and the named slots: rowkernel.h */

/* SwiGLU of m rows: h = silu(g) * u written over g (gu [m, 2I]: g then u), in the PyTorch forward's order */
FWD_INLINE void swiglu_body(float *gu, int64_t m, int64_t I)
{
    for (int64_t r = 0; r < m; r++) {
        float *g = gu + r * 2 * I;
        for (int64_t i = 0; i < I; i++) g[i] = g[i] / (1.0f + exp_lk(-g[i])) * g[I + i];
    }
}

static void swiglu_portable(float *gu, int64_t m, int64_t I) { swiglu_body(gu, m, I); }
#if HAVE_X86
/* swiglu_body on 8 lanes (exp_lk_x8: the same floats); the tail of a row as swiglu_body */
RK_TARGET("avx2") static void swiglu_avx2(float *gu, int64_t m, int64_t I)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < m; r++) {
        float *g = gu + r * 2 * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp_lk_x8(_mm256_xor_ps(gv, sign));
            _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(g + I + i)));
        }
        for (; i < I; i++) g[i] = g[i] / (1.0f + exp_lk(-g[i])) * g[I + i];
    }
}
#endif

static void swiglu_rows(float *gu, int64_t m, int64_t I, enum rk_isa isa)
{
#if HAVE_X86
    if (isa != PATH_PORTABLE) { swiglu_avx2(gu, m, I); return; }
#endif
    (void)isa;
    swiglu_portable(gu, m, I);
}

/* the router and the experts of one MoE layer on xn [M, D]: out [M, D] = sum over the row's top-A experts of
   weight * expert(xn); experts taken in ascending id, each once for all the rows that chose it (batch-union) */
static int moe_layer(const shape_t *c, int64_t l, const int64_t *p, const float *xn, int64_t M, float *out,
                     float *work, int64_t *topi, int64_t *unique, rk_fetch_fn fetch)
{
    const int64_t D = c->D, I = c->I, E = c->E, A = c->A;
    float *probs = work, *topw = probs + M * E, *xe = topw + M * A, *ge = xe + M * D, *slots = ge + M * 2 * I;
    float *ahead = slots + M * A * D;
    int64_t *rows = (int64_t *)malloc((size_t)M * sizeof(int64_t));
    if (!rows) return RK_NO_MEMORY;
    int rc = RK_OK;
    STEP(fwd_product(xn, D, M, D, (uint64_t)p[LAYER_ROUTER], p[LAYER_ROUTER_KIND], probs, E, E, c));
    for (int64_t r = 0; r < M && rc == 0; r++) {            /* softmax, then the top A (ties: lower id first) */
        float *pr = probs + r * E, mx = -INFINITY;
        for (int64_t e = 0; e < E; e++) mx = pr[e] > mx ? pr[e] : mx;
        for (int64_t e = 0; e < E; e++) pr[e] = exp_lk(pr[e] - mx);
        const float z = sum_lanes(pr, E);
        for (int64_t e = 0; e < E; e++) pr[e] = pr[e] / z;
        for (int64_t a = 0; a < A; a++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t b = 0; b < a; b++) taken |= topi[r * A + b] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            topi[r * A + a] = best, topw[r * A + a] = pr[best];
        }
        if (c->norm_topk) {
            float sw = topw[r * A];
            for (int64_t a = 1; a < A; a++) sw = sw + topw[r * A + a];
            for (int64_t a = 0; a < A; a++) topw[r * A + a] = topw[r * A + a] / sw;
        }
    }
    if (c->prefetch && fetch && l + 1 < c->L && rc == RK_OK) {
        /* one-layer-ahead prefetch, as the PyTorch forward guesses it: this layer's input routed by the next
           layer's router (top A of its logits), each expert of the union handed to fetch with no entry */
        const int64_t *pn = p + PLAN_LAYER;
        STEP(fwd_product(xn, D, M, D, (uint64_t)pn[LAYER_ROUTER], pn[LAYER_ROUTER_KIND], ahead, E, E, c));
        for (int64_t e = 0; e < E && rc == RK_OK; e++) {
            int wanted = 0;
            for (int64_t r = 0; r < M && !wanted; r++) {
                int64_t above = 0;                       /* e is in row r's top A: fewer than A rank above it */
                for (int64_t f = 0; f < E; f++)
                    above += ahead[r * E + f] > ahead[r * E + e] || (ahead[r * E + f] == ahead[r * E + e] && f < e);
                wanted = above < A;
            }
            if (wanted && fetch(l + 1, e, NULL) != 0) rc = RK_FETCH_FAILED;
        }
    }
    int64_t *table = (int64_t *)(uintptr_t)p[LAYER_EXPERTS];
    *unique = 0;
    for (int64_t e = 0; e < E && rc == 0; e++) {
        int64_t n = 0;
        for (int64_t r = 0; r < M; r++)
            for (int64_t a = 0; a < A; a++)
                if (topi[r * A + a] == e) rows[n++] = r * A + a;
        if (!n) continue;
        (*unique)++;
        int64_t *entry = table + EXPERT_ENTRY * e;
        const double tf = prof_on ? rk_now_s() : 0.0;
        if (fetch && fetch(l, e, entry) != 0) { rc = RK_FETCH_FAILED; break; }
        if (prof_on) prof_fetch_s += rk_now_s() - tf;
        if (!entry[EXPERT_GATE_UP] || !entry[EXPERT_DOWN]) { rc = RK_BAD_SIZES; break; }
        for (int64_t j = 0; j < n; j++) memcpy(xe + j * D, xn + (rows[j] / A) * D, (size_t)D * sizeof(float));
        STEP(fwd_product(xe, D, n, D, (uint64_t)entry[EXPERT_GATE_UP], entry[EXPERT_GATE_UP_KIND], ge, 2 * I, 2 * I, c));
        swiglu_rows(ge, n, I, c->path.isa);
        float *de = xe;                                      /* the gathered rows are no longer needed */
        STEP(fwd_product(ge, 2 * I, n, I, (uint64_t)entry[EXPERT_DOWN], entry[EXPERT_DOWN_KIND], de, D, D, c));
        for (int64_t j = 0; j < n; j++) memcpy(slots + rows[j] * D, de + j * D, (size_t)D * sizeof(float));
    }
    for (int64_t r = 0; r < M && rc == 0; r++) {            /* y = s0 * w0, then + s_a * w_a in slot order */
        float *o = out + r * D;
        const float *s0 = slots + r * A * D;
        for (int64_t i = 0; i < D; i++) o[i] = s0[i] * topw[r * A];
        for (int64_t a = 1; a < A; a++) {
            const float *sa = slots + (r * A + a) * D, w = topw[r * A + a];
            for (int64_t i = 0; i < D; i++) o[i] = o[i] + sa[i] * w;
        }
    }
    free(rows);
    return rc;
}

/* row t of the embedding into out [D]: float32 rows, or column t of a tied output layer's strip-blocks */
static int embed_row(const int64_t *plan, int64_t t, int64_t D, float *out)
{
    const int64_t kind = plan[PLAN_EMBED_KIND], nv = plan[PLAN_EMBED_ROWS];
    if (t < 0 || t >= nv) return RK_BAD_SIZES;
    if (kind == KIND_F32) {
        memcpy(out, (const float *)(uintptr_t)plan[PLAN_EMBED] + t * D, (size_t)D * sizeof(float));
        return RK_OK;
    }
    const uint8_t *w = (const uint8_t *)(uintptr_t)plan[PLAN_EMBED] + (t / STRIP) * strip_bytes(&KINDS[kind], D);
    const int c = (int)(t % STRIP);
    const kind_t *kt = &KINDS[kind];
    for (int64_t b = 0; b < D / QK; b++) kt->column(w + b * kt->bytes, c, out + b * QK);
    return RK_OK;
}

static void clip_rows(float *v, int64_t n, float clip)
{
    for (int64_t i = 0; i < n; i++) v[i] = v[i] < -clip ? -clip : v[i] > clip ? clip : v[i];
}

/* model: the plan, dims, eps, clip, path word and fetch (rowkernel.h struct rk_model; the plan and dims: the top
   of this file); batch: the rows, their positions, the logits wanted, the routing and the KV cache (struct
   rk_batch; routing and unique may be NULL, fetch too when every table is full) */
RK_EXPORT int32_t rk_forward(const struct rk_model *model, const struct rk_batch *batch)
{
    const int64_t *plan = model->plan, *dims = model->dims, *tokens = batch->tokens;
    const int64_t M = batch->m, start = batch->start, alloc = batch->alloc, first = batch->first;
    const int32_t path = model->path;
    const float eps = model->eps, clip = model->clip;
    shape_t c = {dims[DIM_LAYERS], dims[DIM_D], dims[DIM_HEADS], dims[DIM_KV_HEADS], dims[DIM_HEAD_DIM], dims[DIM_INTER],
                 dims[DIM_VOCAB], dims[DIM_ROPE_ROWS], dims[DIM_EXPERTS], dims[DIM_TOP_K], dims[DIM_NORM_TOPK],
                 dims[DIM_QK_NORM], dims[DIM_PREFETCH], eps, clip, {PATH_PORTABLE, 0, 0}};
    const int64_t L = c.L, D = c.D, H = c.H, G = c.G, hd = c.hd, I = c.I, V = c.V, E = c.E, A = c.A;
    if (L < 1 || D < 1 || H < 1 || G < 1 || H % G || hd < 2 || hd % 2 || I < 1 || V < 1 || M < 1 || start < 0 ||
        start + M > alloc || start + M > c.R || first < 0 || first >= M || E < 1 || A < 1 || A > E)
        return RK_BAD_SIZES;
    if (batch->n_taps < 0 || (batch->n_taps && (!batch->tap_at || !batch->taps)))
        return RK_BAD_SIZES;
    for (int64_t i = 0; i < batch->n_taps; i++)      /* ascending layer counts inside the stack */
        if (batch->tap_at[i] < 1 || batch->tap_at[i] >= L || (i && batch->tap_at[i] <= batch->tap_at[i - 1]))
            return RK_BAD_SIZES;
    if (tokens && plan[PLAN_EMBED_KIND] != KIND_F32 && (!block_kind(plan[PLAN_EMBED_KIND]) || D % QK))
        return RK_BAD_KIND;
    for (int64_t l = -1; l < L; l++) {               /* every weight's kind, and K a multiple of 32 for blocks */
        const int64_t *p = plan + PLAN_GLOBALS + PLAN_LAYER * l;
        const int64_t kinds[5] = {l < 0 ? plan[PLAN_HEAD_KIND] : p[LAYER_WQKV_KIND], l < 0 ? -1 : p[LAYER_WO_KIND],
                                  l < 0 || E > 1 ? -1 : p[LAYER_GATE_UP_KIND], l < 0 || E > 1 ? -1 : p[LAYER_DOWN_KIND],
                                  l < 0 || E == 1 ? -1 : p[LAYER_ROUTER_KIND]};
        const int64_t ks[5] = {D, H * hd, D, I, D};
        for (int i = 0; i < 5; i++)
            if (kinds[i] != KIND_F32 && (!block_kind(kinds[i]) || ks[i] % QK)) return RK_BAD_KIND;
    }
    const int32_t decoded = decode_path(path, &c.path);
    if (decoded != RK_OK)
        return decoded;
    const int64_t nq = H * hd, nkv = G * hd, nqkv = nq + 2 * nkv, S = start + M;
    float *x = batch->x, *logits = batch->logits, *kc = batch->k_cache, *vc = batch->v_cache;
    int64_t *routing = batch->routing, *unique = batch->unique;
    const float *cos = (const float *)(uintptr_t)plan[PLAN_COS], *sin = (const float *)(uintptr_t)plan[PLAN_SIN];
    /* scratch: xn [M, D], qkv [M, nqkv], att [M, nq], mix [M, D], gu [M, 2I], scores [MAXT, S];
       an MoE layer's work: probs [M, E], topw [M, A], xe [M, D], ge [M, 2I], slots [M A, D], ahead [M, E];
       topi [M, A] */
    const size_t moe = E > 1 ? (size_t)M * (size_t)(2 * E + A + D + 2 * I + A * D) : 0;
    const size_t need = (size_t)M * (size_t)(2 * D + nqkv + nq + 2 * I) + (size_t)MAXT * (size_t)S + moe;
    float *buf = (float *)malloc(need * sizeof(float));
    int64_t *topi = (int64_t *)malloc((size_t)(M * A) * sizeof(int64_t));
    if (!buf || !topi) { free(buf); free(topi); return RK_NO_MEMORY; }
    float *xn = buf, *qkv = xn + M * D, *att = qkv + M * nqkv, *mix = att + M * nq, *gu = mix + M * D;
    float *scores = gu + M * 2 * I, *work = scores + (int64_t)MAXT * S;
    int rc = RK_OK;
    if (tokens)
        for (int64_t r = 0; r < M && rc == RK_OK; r++) rc = embed_row(plan, tokens[r], D, x + r * D);
    attention_t a = {0};
    a.qkv = qkv, a.ldqkv = nqkv, a.start = start, a.H = H, a.G = G, a.hd = hd, a.nkv = nkv, a.out = att;
    a.scores = scores, a.slen = S, a.scale = 1.0f / sqrtf((float)hd), a.pairs = M * H, a.isa = c.path.isa;
    double t = prof_on ? rk_now_s() : 0.0;
    int64_t tap = 0;                                 /* the next of batch->tap_at */
    for (int64_t l = 0; l < L && rc == 0; l++) {
        const int64_t *p = plan + PLAN_GLOBALS + PLAN_LAYER * l;
        float *kl = kc + l * alloc * nkv, *vl = vc + l * alloc * nkv;
        rms_rows(x, (const float *)(uintptr_t)p[LAYER_ATTN_NORM], xn, M, D, eps);
        prof_mark(&t, 0);
        STEP(fwd_product(xn, D, M, D, (uint64_t)p[LAYER_WQKV], p[LAYER_WQKV_KIND], qkv, nqkv, nqkv, &c));
        prof_mark(&t, 1);
        for (int64_t r = 0; r < M; r++) {
            float *row = qkv + r * nqkv;
            const float *cr = cos + (start + r) * hd, *sr = sin + (start + r) * hd;
            if (clip > 0.0f) clip_rows(row, nqkv, clip);
            if (c.qk_norm) {                                 /* OLMoE: RMSNorm over the whole q and k */
                rms_rows(row, (const float *)(uintptr_t)p[LAYER_Q_NORM], row, 1, nq, eps);
                rms_rows(row + nq, (const float *)(uintptr_t)p[LAYER_K_NORM], row + nq, 1, nkv, eps);
            }
            rope_row(row, H + G, hd, cr, sr);                /* q heads then k heads: adjacent in the row */
            memcpy(kl + (start + r) * nkv, row + nq, (size_t)nkv * sizeof(float));
            memcpy(vl + (start + r) * nkv, row + nq + nkv, (size_t)nkv * sizeof(float));
        }
        a.k = kl, a.v = vl;
        prof_mark(&t, 0);
        run_attention(&a);
        prof_mark(&t, 2);
        STEP(fwd_product(att, nq, M, nq, (uint64_t)p[LAYER_WO], p[LAYER_WO_KIND], mix, D, D, &c));
        prof_mark(&t, 1);
        for (int64_t i = 0; i < M * D; i++) x[i] = x[i] + mix[i];
        rms_rows(x, (const float *)(uintptr_t)p[LAYER_MLP_NORM], xn, M, D, eps);
        prof_mark(&t, 0);
        const double fetched = prof_fetch_s;
        if (E == 1) {
            STEP(fwd_product(xn, D, M, D, (uint64_t)p[LAYER_GATE_UP], p[LAYER_GATE_UP_KIND], gu, 2 * I, 2 * I, &c));
            swiglu_rows(gu, M, I, c.path.isa);
            STEP(fwd_product(gu, 2 * I, M, I, (uint64_t)p[LAYER_DOWN], p[LAYER_DOWN_KIND], mix, D, D, &c));
            if (unique) unique[l] = 1;
        } else {
            int64_t used = 0;
            STEP(moe_layer(&c, l, p, xn, M, mix, work, topi, &used, model->fetch));
            if (routing) memcpy(routing + l * M * A, topi, (size_t)(M * A) * sizeof(int64_t));
            if (unique) unique[l] = used;
        }
        if (prof_on) { prof_s[3] -= prof_fetch_s - fetched; prof_s[5] += prof_fetch_s - fetched; }
        prof_mark(&t, 3);
        for (int64_t i = 0; i < M * D; i++) x[i] = x[i] + mix[i];
        if (tap < batch->n_taps && batch->tap_at[tap] == l + 1)
            memcpy(batch->taps + (tap++) * M * D, x, (size_t)(M * D) * sizeof(float));
        prof_mark(&t, 0);
    }
    if (rc == 0) {
        rms_rows(x + first * D, (const float *)(uintptr_t)plan[PLAN_FINAL_NORM], xn, M - first, D, eps);
        STEP(fwd_product(xn, D, M - first, D, (uint64_t)plan[PLAN_HEAD], plan[PLAN_HEAD_KIND], logits, V, V, &c));
        prof_mark(&t, 4);
    }
    free(buf);
    free(topi);
    return rc;
}

/* the state half of T positions: states [T, S, D] -> out [T, D] (rk_state_half says what) */
static int32_t state_half(const float *states, int64_t T, int64_t S, int64_t D, uintptr_t fuse, int32_t fuse_kind,
                          uintptr_t state, int32_t state_kind, float eps, float *out, int32_t path)
{
    if (T < 1 || S < 1 || D < 1)
        return RK_BAD_SIZES;
    float *buf = (float *)malloc((size_t)(T * S * D + T * D) * sizeof(float));
    if (!buf)
        return RK_NO_MEMORY;
    float *g = buf + T * S * D;
    rms_unit_rows(states, buf, T * S, D, eps);
    int32_t rc = rk_qmatmul((uintptr_t)buf, T, S * D, S * D, fuse, fuse_kind, D, (uintptr_t)g, D, path);
    if (rc == RK_OK)
        rms_unit_rows(g, g, T, D, eps);
    if (rc == RK_OK)
        rc = rk_qmatmul((uintptr_t)g, T, D, D, state, state_kind, D, (uintptr_t)out, D, path);
    free(buf);
    return rc;
}

/* a token's half of a head's input row, where the token is outside the draft vocabulary: we RMSNorm(emb(t)) (the
   norm's weight folded into we), into out [D]; tmp: D floats */
static int32_t token_half(const struct rk_model *model, const int64_t *chain, int64_t token, int64_t D, float *tmp,
                          float *out)
{
    const int32_t rc = embed_row(model->plan, token, D, tmp);
    if (rc != RK_OK)
        return rc;
    rms_unit_rows(tmp, tmp, 1, D, model->eps);
    return rk_qmatmul((uintptr_t)tmp, 1, D, D, (uintptr_t)chain[CHAIN_WE], (int32_t)chain[CHAIN_WE_KIND], D,
                      (uintptr_t)out, D, model->path);
}

/* a chain's catch-up rows (rk_draft_greedy says what): the state half of positions from .. to - 1 into g, then
   x[r] = etab[rows[r]] + g[at + r] (rows[r] < 0: token_half(tokens[r]) + g[at + r]) */
static int32_t head_rows(const struct rk_model *model, const int64_t *chain, float *x, int64_t M, int64_t D)
{
    const int64_t S = chain[CHAIN_S], from = chain[CHAIN_FROM], to = chain[CHAIN_TO], at = chain[CHAIN_AT];
    float *g = (float *)(uintptr_t)chain[CHAIN_G];
    const float *states = (const float *)(uintptr_t)chain[CHAIN_STATES];
    const float *etab = (const float *)(uintptr_t)chain[CHAIN_ETAB];
    const int64_t *rows = (const int64_t *)(uintptr_t)chain[CHAIN_ROWS];
    if (!g || !rows || at < 0)
        return RK_BAD_SIZES;
    if (to > from) {
        const int32_t rc = state_half(states + from * S * D, to - from, S, D, (uintptr_t)chain[CHAIN_FUSE],
                                      (int32_t)chain[CHAIN_FUSE_KIND], (uintptr_t)chain[CHAIN_STATE],
                                      (int32_t)chain[CHAIN_STATE_KIND], model->eps, g + from * D, model->path);
        if (rc != RK_OK)
            return rc;
    }
    const int64_t *tokens = (const int64_t *)(uintptr_t)chain[CHAIN_TOKENS];
    float *tmp = NULL;
    int32_t rc = RK_OK;
    for (int64_t r = 0; r < M && rc == RK_OK; r++) {
        const float *e = rows[r] >= 0 ? etab + rows[r] * D : x + r * D, *gr = g + (at + r) * D;
        if (rows[r] < 0) {                           /* outside the draft vocabulary: the token half here */
            if (!tokens || !chain[CHAIN_WE])
                rc = RK_BAD_SIZES;
            else if (!tmp && !(tmp = (float *)malloc((size_t)D * sizeof(float))))
                rc = RK_NO_MEMORY;
            else
                rc = token_half(model, chain, tokens[r], D, tmp, x + r * D);
        }
        for (int64_t j = 0; j < D && rc == RK_OK; j++) x[r * D + j] = e[j] + gr[j];
    }
    free(tmp);
    return rc;
}

/* rk_draft_greedy: a drafter's whole greedy turn in one call (lessonkit/feature_head, and any dense draft model).

Why. A draft turn is k forwards of a small model, each followed by an argmax and the next row's input: from
Python that is k ctypes crossings and a few PyTorch ops per draft token, a fixed cost (about 0.1 ms here) that is
as large as a feature head's whole layer. Here the turn is one crossing, a feature head's input rows included.

What. The first forward runs the M rows the drafter has not seen yet (tokens looked up in C when tokens is not 0,
else rows x [M, D]) at positions start .. start + M - 1 and keeps the last row's logits; then k - 1 one-row
forwards at the following positions. After each forward the argmax of the V logits (the first of equal maxima)
goes to out[i]; the next row's input is, with chain == 0, the embedding of token ids[out[i]] (ids == 0: out[i]
itself). A chain (int64 [CHAIN_WORDS], rowkernel.h) is a feature head's input projection split in two halves, a
token half etab [V, D] float32 precomputed per draft-vocabulary row and a state half w (RMSNorm(u) * gnorm):
  - the catch-up rows: first the state half of the target's positions from .. to - 1 (rk_state_half's arithmetic
    on states [.., S, D] into g [.., D]; none when to <= from), then x[r] = etab[rows[r]] + g[at + r], or, where
    rows[r] < 0 (token tokens[r] is outside the draft vocabulary), its token half computed here: the model plan's
    embedding row of the token (the target's table), scaled to unit RMS, times we (blocks of kind we_kind, D
    inputs and outputs: the input projection's token half with the norm's weight folded in), plus g[at + r];
  - each draft: x = etab[out[i]] + w (RMSNorm(a) * gnorm), a the last forward's output row (the head's state,
    the residual stream out).
A row in the draft vocabulary is the one PyTorch's e + g made before (one rounding), bit for bit; a token outside
it now takes its token half from w_e's blocks (PyTorch multiplied its float weights): a draft, never an output.
Every forward is rk_forward's on the same model (struct rk_model), so the rows' keys and values land in the
batch's cache as rk_forward writes them. The batch (struct rk_batch) is the first forward's: tokens or x, m,
start, logits and the cache; its first, routing and unique are not read (the turn keeps the last row's logits, a
draft model is dense). x must hold max(m, 1) rows; logits one row of V. */
RK_EXPORT int32_t rk_draft_greedy(const struct rk_model *model, const struct rk_batch *batch, int64_t k,
                                  uintptr_t ids_a, uintptr_t chain_a, uintptr_t out_a)
{
    const int64_t *ids = (const int64_t *)ids_a, *chain = (const int64_t *)chain_a;
    const int64_t D = model->dims[DIM_D], V = model->dims[DIM_VOCAB], M = batch->m;
    if (k < 1 || M < 1 || D < 1 || V < 1)
        return RK_BAD_SIZES;
    float *x = batch->x, *logits = batch->logits;
    int64_t *out = (int64_t *)out_a;
    float *xn = chain ? (float *)malloc((size_t)(2 * D) * sizeof(float)) : NULL;
    if (chain && !xn)
        return RK_NO_MEMORY;
    int64_t token = 0;
    struct rk_batch step = *batch;                   /* the catch-up rows, then one row per draft */
    step.first = M - 1, step.routing = NULL, step.unique = NULL;
    int32_t rc = chain ? head_rows(model, chain, x, M, D) : RK_OK;
    if (rc == RK_OK)
        rc = rk_forward(model, &step);
    step.m = 1, step.first = 0, step.n_taps = 0;     /* taps, if any: the catch-up rows' only */
    for (int64_t i = 0; rc == RK_OK; i++) {
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (logits[j] > logits[best]) best = j;
        out[i] = best;
        if (i + 1 == k)
            break;
        step.start = batch->start + M + i;
        if (chain) {
            const float *a = x + (i == 0 ? M - 1 : 0) * D, *etab = (const float *)(uintptr_t)chain[0] + best * D;
            rms_rows(a, (const float *)(uintptr_t)chain[3], xn, 1, D, model->eps);
            rc = rk_qmatmul((uintptr_t)xn, 1, D, D, (uintptr_t)chain[1], (int32_t)chain[2], D, (uintptr_t)(xn + D), D,
                            model->path);
            for (int64_t j = 0; j < D && rc == RK_OK; j++) x[j] = etab[j] + xn[D + j];
            step.tokens = NULL;
        } else {
            token = ids ? ids[best] : best;
            step.tokens = &token;
        }
        if (rc == RK_OK)
            rc = rk_forward(model, &step);
    }
    free(xn);
    return rc;
}

/* rk_state_half: the feature head's state half of T target positions in one call (lessonkit/feature_head).

Why. Every position the target verifies hands the head its residual streams at the taps and the top, and the next
draft turn needs w_g RMSNorm(fuse [RMSNorm(s_1); ...; RMSNorm(s_S)]) of each: two small products and a few norms
on one or a few rows. From PyTorch that is a dozen dispatched ops, each costing more than its arithmetic, on every
turn. A draft turn computes it inside rk_draft_greedy (its chain's catch-up rows, the helper state_half above); this
entry point is the same arithmetic alone (the tests compare it with PyTorch's).

What. states [T, S, D] float32 (row t: the S streams of one position, each of D values); every stream is scaled by
1 / sqrt(mean of squares + eps) (no weight: the caller folds the norms' weights into the two matrices), the S scaled
streams of a row are its S D inputs of the fuse product (native blocks of kind fuse_kind, D outputs), that
product's row is scaled the same way, and the state product (state_kind, D inputs, D outputs) writes out [T, D].
Norms as rms_unit_rows, products as rk_qmatmul on the call's path word. */
RK_EXPORT int32_t rk_state_half(uintptr_t states_a, int64_t T, int64_t S, int64_t D, uintptr_t fuse, int32_t fuse_kind,
                                uintptr_t state, int32_t state_kind, float eps, uintptr_t out_a, int32_t path)
{
    return state_half((const float *)states_a, T, S, D, fuse, fuse_kind, state, state_kind, eps, (float *)out_a, path);
}
