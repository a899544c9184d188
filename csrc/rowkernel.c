/* Row-invariant matrix product for short forwards: Y[m, :] = X[m, :] @ W for 1 <= M rows.

Why. A BLAS picks different code paths for different row counts (MKL: a 1-row product is a GEMV, a
k-row GEMM computes tiles of rows with another summation order), so a position's logits in a 1-row
decode forward and inside a k-row verify forward can differ in the last bits. This kernel computes
every output element as ONE fixed-order chain of fused multiply-adds over the input dimension:

    acc = 0;  for k in 0 .. K-1:  acc = fma(X[m, k], W[k, n], acc);  Y[m, n] = acc

whatever M is, wherever the row sits among the M rows, whatever the other rows hold. Rows are only
grouped to share the weight loads (a register block of MB rows x V vectors of 8 columns), never to
share arithmetic, so a row's bits never depend on M. There is no threading: the bits cannot depend on
a thread count.

Layout. W ([K, N] in GEMV form) is packed once, at load, into strips of STRIP = 16 columns (N rounded
up to a multiple of 16 with zero columns): strip s holds rows 0..K-1 of its 16 columns contiguously, one
64-byte line per input row, so every product streams the weights sequentially. A register block is MB
rows x P strips; a one-row product runs 4 strips side by side (8 independent FMA chains), so it is as fast
as a GEMV, and an M-row product reads every weight from memory once: extra rows cost arithmetic only.

Two paths, same arithmetic: AVX2 + FMA (selected at import when the CPU has both) and a portable C
path that calls fmaf, which rounds exactly like the vector FMA. The pair is tested for equal bits. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* ---- dispatch --------------------------------------------------------------------------------- */

static int cpu_has_avx2_fma(void)
{
#if HAVE_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
        PyErr_Format(PyExc_RuntimeError, "rowkernel.%s: this CPU has no AVX2/FMA", who);
        return NULL;
    }
    return use_avx2 ? matmul_avx2 : matmul_portable;
#else
    (void)use_avx2;
    (void)who;
    return matmul_portable;
#endif
}

/* matmul(x_addr, m, k, ldx, packed_addr, n, y_addr, ldy, use_avx2): y[m, :n] = x[m, :k] @ W */
static PyObject *rk_matmul(PyObject *self, PyObject *args)
{
    unsigned long long xa, wa, ya;
    Py_ssize_t m, k, ldx, n, ldy;
    int use_avx2;
    if (!PyArg_ParseTuple(args, "KnnnKnKnp", &xa, &m, &k, &ldx, &wa, &n, &ya, &ldy, &use_avx2))
        return NULL;
    if (m < 1 || k < 1 || n < 1 || ldx < k || ldy < n) {
        PyErr_SetString(PyExc_ValueError, "rowkernel.matmul: bad sizes");
        return NULL;
    }
    const matmul_fn mm = choose_matmul(use_avx2, "matmul");
    if (!mm)
        return NULL;
    const float *x = (const float *)(uintptr_t)xa;
    const float *w = (const float *)(uintptr_t)wa;
    float *y = (float *)(uintptr_t)ya;
    Py_BEGIN_ALLOW_THREADS
    mm(x, ldx, m, k, w, y, ldy, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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
    {"has_avx2", rk_has_avx2, METH_NOARGS, "True when this CPU has AVX2 and FMA"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_rowkernel", "Row-invariant X @ W for short forwards; a dense drafter's one-token step", -1, METHODS};

/* ABI: bumped when an entry point's arguments change; lessonkit/engine/kernel.py refuses another value */
PyMODINIT_FUNC PyInit__rowkernel(void)
{
    PyObject *m = PyModule_Create(&MODULE);
    if (m && PyModule_AddIntConstant(m, "ABI", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
