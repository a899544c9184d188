/* kernel_check: the row kernel's bit test for platforms this machine can only emulate.

    kernel_check LIBRARY PATH THREADS [all | stress ROUNDS]

(PATH: the path word, rowkernel.h: 0 portable, 1 AVX2, 2 AVX-512, 10 AVX-512 without VNNI) loads a shipped
kernel library (dlopen, or LoadLibrary on Windows), runs fixed pseudo-random products through
every entry point and prints one line per test: its name and an FNV-1a hash of the output bits. The same
inputs on every platform, so equal hashes mean equal bits (tests/test_platforms_kernel.py builds this with
zig for linux-aarch64 and windows-x86_64, runs it under qemu-aarch64 and wine64 and natively, and compares):

  matmul      float strips, shapes (k, n) with n not a multiple of 16 among them, M = 1..16 rows and 40
  qmatmul     Q4_1 and Q8_0 strip-blocks, the same row counts
  qmatmul_int8  the same blocks in the int8 numerics' layout (rk_repack_int), integer block dots
  dequantise_int8_layout  that layout dequantised: must hash as dequantise does
  dequantise  Q4_1 and Q8_0 strip-blocks to float strips
  forward_*   rk_forward on a 2-layer dense Llama built here (D 64, 4 heads, 2 kv heads, head 16, I 96, V 200;
              float32 strips, Q4_1 and Q8_0 strip-blocks mixed; rope tables from + - * / only), 9 tokens:
              forward_decode (one row at a time), forward_prefill (one call of 9 rows), forward_chunks (4 + 5
              rows), forward_verify (5 decodes, then a block of 4): each hashes the logits of every row, the
              residual stream out and both KV caches, so all four must be equal; forward_last (the decode's
              last row) and forward_last_only (a prefill asking for its last row only) likewise
  forward_int8_*, forward_moe_int8_*  the same models with every native weight in the int8 layout
  forward_moe_*  the same on an OLMoE-style mixture (4 experts of width 32, top 2 renormalised, q/k RMSNorm,
              q k v clipped at 3; router and experts in every kind, full expert tables, no fetch); its hashes
              also take the experts every row chose in every layer
  exp_many    rk_exp_many over [-100, 100] in 2^20 steps, the edges, specials and random bit patterns
  fma         2 million triples through the portable path's fma (FMA instruction or software) ...
  fma_soft    ... and through the software fma alone (csrc/kernel_impl.h soft_fmaf); NaNs hash as one value

`stress ROUNDS` instead hammers the thread pool: ROUNDS rounds of rk_forward (prefill and decode, and a prefill
of the MoE) and small rk_qmatmul / rk_matmul products (fewer strips than threads, so some workers sit a job
out), switching rk_set_threads between 1, 2, 3 and 8 between calls, then the same from two caller threads at
once while the main thread keeps switching; every result is compared with the one-thread bits. It prints
`stress_mismatches N` (must be 0) and `stress_calls N`, or `stress_hung N` and exits with status 7 when no call
has returned for 15 s (a deadlocked pool: a call that waits for a worker that will never come).
tests/test_kernel_tsan.py links this file with the kernel's units (csrc/build_kernels.py UNITS) under
ThreadSanitizer (-DKERNEL_CHECK_LINKED: no library to load, LIBRARY is ignored).

The ABI is the project's: the entry points are typed from rowkernel.h's prototypes, rk_forward's inputs are its
struct rk_model and struct rk_batch with the plan and dims filled by its named slots, the blocks built with
format.h's structs, so a change there is a change here.

Plain C11 (and __typeof__), no Python; build: zig cc -O2 -ffp-contract=off -o kernel_check kernel_check.c (add
-ldl on old glibc; the headers sit beside it). -ffp-contract=off (and the pragma below) keeps the rope tables' double arithmetic the same on every
CPU: a compiler may otherwise fuse their multiply-adds on arm64 and not on x86-64. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>

#include "rowkernel.h"    /* the entry points' prototypes, the path word, rk_forward's plan and dims slots */
#include "format.h"       /* QK, STRIP, KIND_*, the strip-block structs: the blocks built here are the kernel's */

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* the entry points it calls, typed by rowkernel.h's prototypes (the ABI is written once, there) */
static struct {
    __typeof__(&rk_abi) abi;
    __typeof__(&rk_matmul) matmul;
    __typeof__(&rk_qmatmul) qmatmul;
    __typeof__(&rk_dequantise) dequantise;
    __typeof__(&rk_set_threads) set_threads;
    __typeof__(&rk_fma_many) fma_many;
    __typeof__(&rk_forward) forward;
    __typeof__(&rk_exp_many) exp_many;
    __typeof__(&rk_repack_int) repack_int;
} rk;

#if defined(_WIN32)
#include <windows.h>
#endif

#if defined(KERNEL_CHECK_LINKED)
/* linked with the kernel's units (the ThreadSanitizer build): the entry points are plain functions */
static int bind_all(const char *path)
{
    (void)path;
    rk.abi = rk_abi, rk.matmul = rk_matmul, rk.qmatmul = rk_qmatmul, rk.dequantise = rk_dequantise;
    rk.set_threads = rk_set_threads, rk.fma_many = rk_fma_many;
    rk.forward = rk_forward, rk.exp_many = rk_exp_many, rk.repack_int = rk_repack_int;
    return 0;
}
#else
#if defined(_WIN32)
static void *open_lib(const char *path) { return (void *)LoadLibraryA(path); }
static void *sym(void *lib, const char *name) { return (void *)GetProcAddress((HMODULE)lib, name); }
#else
#include <dlfcn.h>
static void *open_lib(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static void *sym(void *lib, const char *name) { return dlsym(lib, name); }
#endif
static int bind_all(const char *path)
{
    void *lib = open_lib(path);
    if (!lib) { fprintf(stderr, "kernel_check: cannot load %s\n", path); return 2; }
#define BIND(field, name) if (!(*(void **)&rk.field = sym(lib, name))) { fprintf(stderr, "kernel_check: %s lacks %s\n", path, name); return 2; }
    BIND(abi, "rk_abi") BIND(matmul, "rk_matmul") BIND(qmatmul, "rk_qmatmul") BIND(dequantise, "rk_dequantise")
    BIND(set_threads, "rk_set_threads") BIND(fma_many, "rk_fma_many")
    BIND(forward, "rk_forward") BIND(exp_many, "rk_exp_many") BIND(repack_int, "rk_repack_int")
#undef BIND
    return 0;
}
#endif

/* caller threads for the stress mode: start, join */
#if defined(_WIN32)
typedef HANDLE thread_t;
typedef struct { void *(*fn)(void *); void *arg; } trampoline_t;
static DWORD WINAPI trampoline(LPVOID p) { trampoline_t *t = (trampoline_t *)p; t->fn(t->arg); return 0; }
static int thread_start(thread_t *t, trampoline_t *tr, void *(*fn)(void *), void *arg)
{
    tr->fn = fn, tr->arg = arg;
    *t = CreateThread(NULL, 0, trampoline, tr, 0, NULL);
    return *t ? 0 : -1;
}
static void thread_join(thread_t t) { WaitForSingleObject(t, INFINITE); CloseHandle(t); }
static void sleep_1s(void) { Sleep(1000); }
#else
#include <pthread.h>
typedef pthread_t thread_t;
typedef int trampoline_t;
static int thread_start(thread_t *t, trampoline_t *tr, void *(*fn)(void *), void *arg)
{
    (void)tr;
    return pthread_create(t, NULL, fn, arg);
}
static void thread_join(thread_t t) { pthread_join(t, NULL); }
#include <time.h>
static void sleep_1s(void) { const struct timespec s = {1, 0}; nanosleep(&s, NULL); }
#endif

/* ---- deterministic inputs: splitmix64, floats that are exact multiples of 2^-20 in [-4, 4) ---------- */
static uint64_t state;
static uint64_t next_u64(void)
{
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float next_float(void) { return (float)((int64_t)(next_u64() >> 41) - (1 << 22)) * (1.0f / (1 << 20)); }
static void fill(float *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = next_float(); }

/* ---- FNV-1a over the bits; every NaN hashes as one quiet NaN (payloads differ between CPUs) ------------ */
typedef struct { uint64_t h; } hash_t;
static void hash_bytes(hash_t *h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h->h = (h->h ^ b[i]) * 0x100000001b3ull;
}
static void hash_floats(hash_t *h, const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], 4);
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) u = 0x7fc00000u;
        hash_bytes(h, &u, 4);
    }
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) { fprintf(stderr, "kernel_check: out of memory\n"); exit(3); }
    return p;
}

static void check_rc(const char *who, int32_t rc)
{
    if (rc) { fprintf(stderr, "kernel_check: %s returned error %d\n", who, (int)rc); exit(4); }
}

static const int ROWS[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 40};
#define NROWS (int)(sizeof ROWS / sizeof ROWS[0])

static void test_matmul(int path)
{
    static const int64_t SHAPES[][2] = {{64, 8}, {100, 37}, {33, 50}, {256, 300}, {576, 96}, {7, 1}, {1536, 64}};
    hash_t h = {0xcbf29ce484222325ull};
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        const int64_t k = SHAPES[s][0], n = SHAPES[s][1], ns = (n + 15) / 16;
        float *w = xmalloc((size_t)(ns * 16 * k) * 4), *x = xmalloc((size_t)(40 * k) * 4), *y = xmalloc((size_t)(40 * n) * 4);
        fill(w, (size_t)(ns * 16 * k));
        fill(x, (size_t)(40 * k));
        for (int r = 0; r < NROWS; r++) {
            check_rc("rk_matmul", rk.matmul((uintptr_t)x, ROWS[r], k, k, (uintptr_t)w, n, (uintptr_t)y, n, path));
            hash_floats(&h, y, (size_t)(ROWS[r] * n));
        }
        free(w), free(x), free(y);
    }
    printf("matmul %016llx\n", (unsigned long long)h.h);
}

/* a native kind's strip-block: its bytes, and the bytes of its scales (and minima) before the codes */
static size_t block_bytes(int kind) { return kind == KIND_Q41 ? sizeof(block_q41) : sizeof(block_q80); }
static size_t scale_bytes(int kind) { return kind == KIND_Q41 ? offsetof(block_q41, qs) : offsetof(block_q80, qs); }
/* the same blocks in the int8 numerics' layout (rk_repack_int) */
static int int_kind(int kind) { return kind == KIND_Q41 ? KIND_Q41I : KIND_Q80I; }

/* random strip-blocks whose scales are finite halves (exponents 8..17: 2^-7 .. 4) and codes any byte */
static uint8_t *random_blocks(int kind, int64_t k, int64_t ns, size_t *bytes)
{
    const size_t block = block_bytes(kind), nb = (size_t)(k / QK) * (size_t)ns;
    uint8_t *w = xmalloc(block * nb);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * block;
        const int halves = (int)scale_bytes(kind) / 2;       /* d[16] (and m[16]) */
        for (int i = 0; i < halves; i++) {
            const uint64_t r = next_u64();
            const uint16_t hv = (uint16_t)(((r & 1) << 15) | ((8 + (r >> 1) % 10) << 10) | ((r >> 8) & 0x3ff));
            memcpy(p + 2 * i, &hv, 2);
        }
        for (size_t i = (size_t)halves * 2; i < block; i++) p[i] = (uint8_t)next_u64();
    }
    *bytes = block * nb;
    return w;
}

static void test_native(int path)
{
    static const int64_t SHAPES[][2] = {{64, 40}, {576, 96}, {96, 17}, {1536, 48}};
    hash_t hq = {0xcbf29ce484222325ull}, hd = {0xcbf29ce484222325ull};
    hash_t hi = {0xcbf29ce484222325ull}, hdi = {0xcbf29ce484222325ull};
    for (int kind = KIND_Q41; kind <= KIND_Q80; kind++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
            const int64_t k = SHAPES[s][0], n = SHAPES[s][1], ns = (n + 15) / 16;
            size_t bytes;
            uint8_t *w = random_blocks(kind, k, ns, &bytes);
            float *x = xmalloc((size_t)(40 * k) * 4), *y = xmalloc((size_t)(40 * n) * 4);
            float *f = xmalloc((size_t)(ns * 16 * k) * 4);
            fill(x, (size_t)(40 * k));
            for (int r = 0; r < NROWS; r++) {
                check_rc("rk_qmatmul", rk.qmatmul((uintptr_t)x, ROWS[r], k, k, (uintptr_t)w, kind, n, (uintptr_t)y, n, path));
                hash_floats(&hq, y, (size_t)(ROWS[r] * n));
            }
            check_rc("rk_dequantise", rk.dequantise((uintptr_t)w, kind, k, n, (uintptr_t)f, path));
            hash_floats(&hd, f, (size_t)(ns * 16 * k));
            /* the int8 numerics: the same blocks in their layout (KIND_Q41I, KIND_Q80I), integer block dots */
            uint8_t *wi = xmalloc(bytes);
            check_rc("rk_repack_int", rk.repack_int((uintptr_t)w, kind, k, n, (uintptr_t)wi));
            for (int r = 0; r < NROWS; r++) {
                check_rc("rk_qmatmul", rk.qmatmul((uintptr_t)x, ROWS[r], k, k, (uintptr_t)wi, int_kind(kind), n, (uintptr_t)y, n, path));
                hash_floats(&hi, y, (size_t)(ROWS[r] * n));
            }
            check_rc("rk_dequantise", rk.dequantise((uintptr_t)wi, int_kind(kind), k, n, (uintptr_t)f, path));
            hash_floats(&hdi, f, (size_t)(ns * 16 * k));
            free(w), free(wi), free(x), free(y), free(f);
        }
    printf("qmatmul %016llx\n", (unsigned long long)hq.h);
    printf("dequantise %016llx\n", (unsigned long long)hd.h);
    printf("qmatmul_int8 %016llx\n", (unsigned long long)hi.h);
    printf("dequantise_int8_layout %016llx\n", (unsigned long long)hdi.h);   /* must equal dequantise's */
}

static float *packed(int64_t k, int64_t n)
{
    const size_t len = (size_t)(((n + 15) / 16) * 16 * k);
    float *w = xmalloc(len * 4);
    fill(w, len);
    for (size_t i = 0; i < len; i++) w[i] *= 0.125f;       /* keep activations in range over the layers */
    return w;
}

/* ---- rk_forward on a small dense Llama and a small mixture of experts ---------------------------------- */
enum { FL = 2, FD = 64, FH = 4, FG = 2, FHD = 16, FI = 96, FV = 200, FR = 16, FT = 9 };
enum { FE = 4, FA = 2, FIE = 32 };    /* the MoE: 4 experts, top 2, expert width 32 */
#define FEPS 1e-5f
static const int64_t FTOKENS[FT] = {3, 17, 42, 0, 199, 8, 111, 64, 150};

/* rk_forward's plan and dims, slots named by rowkernel.h (PLAN_*, LAYER_*, DIM_*, EXPERT_*): a dense model leaves
   q/k norm, router and expert table 0; E = 1 (dense), prefetch 0 here */
#define MAX_OWNED 96
typedef struct {
    int64_t dims[DIMS];
    int64_t plan[PLAN_GLOBALS + PLAN_LAYER * FL];
    int64_t table[FL][FE * EXPERT_ENTRY];   /* MoE: per expert gate_up address, kind, down address, kind */
    float clip;                      /* MoE: q, k, v clipped to [-clip, clip] (0: none) */
    int moe;
    void *owned[MAX_OWNED];
    int nowned;
    float *embed;                    /* [FV, FD]: the token's row is the forward's input */
} model_t;

static void *own(model_t *m, void *p)
{
    if (m->nowned == MAX_OWNED) { fprintf(stderr, "kernel_check: MAX_OWNED\n"); exit(3); }
    return m->owned[m->nowned++] = p;
}

/* strip-blocks with scales that keep a product's outputs near 1 (inputs RMS-normed): Q4_1 d in [2^-6, 2^-4),
   m in (-2^-2, -2^-4]; Q8_0 d in [2^-9, 2^-7); codes any byte */
static uint8_t *small_blocks(int kind, int64_t k, int64_t n)
{
    const size_t block = block_bytes(kind), nb = (size_t)(k / QK) * (size_t)((n + STRIP - 1) / STRIP);
    uint8_t *w = xmalloc(block * nb);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * block;
        for (int i = 0; i < (int)scale_bytes(kind) / 2; i++) {
            const uint64_t r = next_u64();
            const int m = i >= 16, e = kind == 1 ? 6 + (int)(r & 1) : m ? 11 + (int)(r & 1) : 9 + (int)(r & 1);
            const uint16_t hv = (uint16_t)(((unsigned)m << 15) | ((unsigned)e << 10) | ((r >> 8) & 0x3ff));
            memcpy(p + 2 * i, &hv, 2);
        }
        for (size_t i = scale_bytes(kind); i < block; i++) p[i] = (uint8_t)next_u64();
    }
    return w;
}

static int int_layout;   /* 1: models take native weights in the int8 numerics' layout (int_kind) */

/* a product's weight [k, n] in `kind` (KIND_F32, KIND_Q41, KIND_Q80; with int_layout, blocks take the int8
   numerics' layout, int_kind): its address into *at, its kind into *kind_at */
static void product_weight(model_t *m, int64_t *at, int64_t *kind_at, int64_t k, int64_t n, int kind)
{
    void *w = kind == KIND_F32 ? (void *)packed(k, n) : (void *)small_blocks(kind, k, n);
    if (kind != KIND_F32 && int_layout) {
        const size_t bytes = (size_t)(k / QK) * (size_t)((n + STRIP - 1) / STRIP) * block_bytes(kind);
        uint8_t *wi = xmalloc(bytes);
        check_rc("rk_repack_int", rk.repack_int((uintptr_t)w, kind, k, n, (uintptr_t)wi));
        free(w);
        w = wi, kind = int_kind(kind);
    }
    *at = (int64_t)(uintptr_t)own(m, w);
    *kind_at = kind;
}

static int64_t norm_weight(model_t *m, int64_t d)
{
    float *w = own(m, xmalloc((size_t)d * 4));
    for (int64_t i = 0; i < d; i++) w[i] = 1.0f + 0.25f * next_float();
    return (int64_t)(uintptr_t)w;
}

/* sin and cos of a (0 <= a < 64) from + - * / only: a reduced by 2 pi, then 30 terms of Taylor's series */
static void sin_cos(double a, double *sn, double *cs)
{
    const double two_pi = 6.283185307179586;
    const double r = a - (double)(int64_t)(a / two_pi + 0.5) * two_pi, r2 = r * r;
    double ts = r, tc = 1.0, s = r, c = 1.0;
    for (int k = 1; k <= 30; k++) {
        ts = ts * -r2 / (double)((2 * k) * (2 * k + 1));
        tc = tc * -r2 / (double)((2 * k - 1) * (2 * k));
        s = s + ts, c = c + tc;
    }
    *sn = s, *cs = c;
}

/* rotate-half rope tables [FR, FHD]: frequency 2^-i for column i of each half (both halves alike) */
static void rope_tables(float *cosv, float *sinv)
{
    for (int64_t p = 0; p < FR; p++)
        for (int64_t i = 0; i < FHD; i++) {
            double s, c;
            sin_cos((double)p / (double)(1 << (i % (FHD / 2))), &s, &c);
            cosv[p * FHD + i] = (float)c, sinv[p * FHD + i] = (float)s;
        }
}

/* products alternate float strips, Q4_1 and Q8_0 over the layers; the output layer is Q8_0 (as SmolLM2's).
   moe: OLMoE-style, q/k RMSNorm, q k v clipped at 3, a softmax router over 4 experts (float strips, then Q8_0),
   the top 2 renormalised, the experts' products in every kind */
static void model_build(model_t *m, int moe)
{
    enum { F = KIND_F32, Q4 = KIND_Q41, Q8 = KIND_Q80 };
    static const int KINDS[FL][4] = {{F, Q4, Q8, Q4}, {Q8, F, Q4, F}};     /* wqkv, wo, gate_up, down */
    static const int EXPERT_KINDS[FE][2] = {{F, Q4}, {Q4, Q8}, {Q8, F}, {Q4, Q4}};
    const int64_t nq = FH * FHD, nkv = FG * FHD;
    memset(m, 0, sizeof *m);
    int64_t *d = m->dims;
    d[DIM_LAYERS] = FL, d[DIM_D] = FD, d[DIM_HEADS] = FH, d[DIM_KV_HEADS] = FG, d[DIM_HEAD_DIM] = FHD;
    d[DIM_INTER] = moe ? FIE : FI, d[DIM_VOCAB] = FV, d[DIM_ROPE_ROWS] = FR, d[DIM_EXPERTS] = moe ? FE : 1;
    d[DIM_TOP_K] = moe ? FA : 1, d[DIM_NORM_TOPK] = moe, d[DIM_QK_NORM] = moe, d[DIM_PREFETCH] = 0;
    m->moe = moe, m->clip = moe ? 3.0f : 0.0f;
    m->embed = own(m, xmalloc((size_t)(FV * FD) * 4));
    fill(m->embed, (size_t)(FV * FD));
    int64_t *g = m->plan;
    g[PLAN_FINAL_NORM] = norm_weight(m, FD);
    product_weight(m, &g[PLAN_HEAD], &g[PLAN_HEAD_KIND], FD, FV, Q8);
    float *cosv = own(m, xmalloc((size_t)(FR * FHD) * 4)), *sinv = own(m, xmalloc((size_t)(FR * FHD) * 4));
    rope_tables(cosv, sinv);
    g[PLAN_COS] = (int64_t)(uintptr_t)cosv, g[PLAN_SIN] = (int64_t)(uintptr_t)sinv;
    g[PLAN_EMBED] = (int64_t)(uintptr_t)m->embed, g[PLAN_EMBED_KIND] = F, g[PLAN_EMBED_ROWS] = FV;   /* float32 rows */
    for (int l = 0; l < FL; l++) {
        int64_t *p = m->plan + PLAN_GLOBALS + PLAN_LAYER * l;
        p[LAYER_ATTN_NORM] = norm_weight(m, FD);
        product_weight(m, &p[LAYER_WQKV], &p[LAYER_WQKV_KIND], FD, nq + 2 * nkv, KINDS[l][0]);
        product_weight(m, &p[LAYER_WO], &p[LAYER_WO_KIND], nq, FD, KINDS[l][1]);
        p[LAYER_MLP_NORM] = norm_weight(m, FD);
        if (!moe) {
            product_weight(m, &p[LAYER_GATE_UP], &p[LAYER_GATE_UP_KIND], FD, 2 * FI, KINDS[l][2]);
            product_weight(m, &p[LAYER_DOWN], &p[LAYER_DOWN_KIND], FI, FD, KINDS[l][3]);
            continue;
        }
        p[LAYER_GATE_UP_KIND] = p[LAYER_DOWN_KIND] = F;
        p[LAYER_Q_NORM] = norm_weight(m, nq), p[LAYER_K_NORM] = norm_weight(m, nkv);
        product_weight(m, &p[LAYER_ROUTER], &p[LAYER_ROUTER_KIND], FD, FE, l == 0 ? F : Q8);
        for (int e = 0; e < FE; e++) {
            int64_t *entry = m->table[l] + EXPERT_ENTRY * e;
            product_weight(m, &entry[EXPERT_GATE_UP], &entry[EXPERT_GATE_UP_KIND], FD, 2 * FIE, EXPERT_KINDS[e][0]);
            product_weight(m, &entry[EXPERT_DOWN], &entry[EXPERT_DOWN_KIND], FIE, FD, EXPERT_KINDS[e][1]);
        }
        p[LAYER_EXPERTS] = (int64_t)(uintptr_t)m->table[l];
    }
}

static void model_free(model_t *m)
{
    for (int i = 0; i < m->nowned; i++) free(m->owned[i]);
}

/* what a run of the 9 tokens leaves: every row's logits, the residual stream out, the KV caches, the experts
   each row chose in each layer (MoE) */
typedef struct {
    float logits[FT * FV], xs[FT * FD], x[FT * FD];
    float k[FL * FR * FG * FHD], v[FL * FR * FG * FHD];
    int64_t routing[FL * FT * FA], chunk_routing[FL * FT * FA];
} run_t;

/* the model as rk_forward takes it (rowkernel.h struct rk_model): full expert tables, no fetch */
static struct rk_model forward_model(const model_t *m, int path)
{
    struct rk_model fm = {0};
    fm.plan = m->plan, fm.dims = m->dims, fm.fetch = NULL, fm.eps = FEPS, fm.clip = m->clip, fm.path = path;
    return fm;
}

/* a batch of M rows at position start over r's KV caches (rowkernel.h struct rk_batch): logits of every row into
   r->logits from row start on, no tokens (x holds the rows), no routing */
static struct rk_batch forward_batch(run_t *r, int64_t M, int64_t start)
{
    struct rk_batch b = {0};
    b.x = r->x, b.m = M, b.start = start, b.first = 0, b.logits = r->logits + start * FV;
    b.k_cache = r->k, b.v_cache = r->v, b.alloc = FR;
    return b;
}

/* the tokens in chunks of chunk[0], chunk[1], ... rows (summing to FT); 0 on success */
static int32_t run_chunks(const model_t *m, run_t *r, const int *chunk, int path)
{
    memset(r, 0, sizeof *r);
    const struct rk_model fm = forward_model(m, path);
    for (int64_t start = 0, c = 0; start < FT; start += chunk[c++]) {
        const int64_t M = chunk[c];
        struct rk_batch b = forward_batch(r, M, start);
        b.tokens = FTOKENS + start;                      /* the forward looks the embedding rows up itself */
        b.routing = m->moe ? r->chunk_routing : NULL;
        const int32_t rc = rk.forward(&fm, &b);
        if (rc) return rc;
        memcpy(r->xs + start * FD, r->x, (size_t)(M * FD) * 4);
        for (int64_t l = 0; m->moe && l < FL; l++)          /* [L, M, A] of this call -> [L, FT, A] */
            memcpy(r->routing + (l * FT + start) * FA, r->chunk_routing + l * M * FA, (size_t)(M * FA) * 8);
    }
    return 0;
}

static uint64_t run_hash(const run_t *r)
{
    hash_t h = {0xcbf29ce484222325ull};
    hash_floats(&h, r->logits, FT * FV);
    hash_floats(&h, r->xs, FT * FD);
    hash_floats(&h, r->k, sizeof r->k / 4);
    hash_floats(&h, r->v, sizeof r->v / 4);
    hash_bytes(&h, r->routing, sizeof r->routing);
    return h.h;
}

static const int DECODE[] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, PREFILL[] = {FT}, CHUNKS[] = {4, 5},
                 VERIFY[] = {1, 1, 1, 1, 1, 4};

/* prefix_decode, _prefill, _chunks, _verify, _last, _last_only (see the top of this file) */
static void test_forward(int path, int moe, const char *prefix)
{
    model_t *m = xmalloc(sizeof *m);
    model_build(m, moe);
    run_t *r = xmalloc(sizeof *r);
    static const struct { const char *name; const int *chunk; } RUNS[] = {
        {"decode", DECODE}, {"prefill", PREFILL}, {"chunks", CHUNKS}, {"verify", VERIFY}};
    for (size_t i = 0; i < sizeof RUNS / sizeof RUNS[0]; i++) {
        check_rc("rk_forward", run_chunks(m, r, RUNS[i].chunk, path));
        printf("%s_%s %016llx\n", prefix, RUNS[i].name, (unsigned long long)run_hash(r));
        if (i == 0) {                                           /* the decode's last row, for _last */
            hash_t h = {0xcbf29ce484222325ull};
            hash_floats(&h, r->logits + (FT - 1) * FV, FV);
            printf("%s_last %016llx\n", prefix, (unsigned long long)h.h);
        }
    }
    /* one prefill asking for its last row only (first = M - 1) */
    memset(r, 0, sizeof *r);
    for (int64_t t = 0; t < FT; t++) memcpy(r->x + t * FD, m->embed + FTOKENS[t] * FD, FD * 4);
    const struct rk_model fm = forward_model(m, path);
    struct rk_batch b = forward_batch(r, FT, 0);
    b.first = FT - 1;
    check_rc("rk_forward", rk.forward(&fm, &b));
    hash_t h = {0xcbf29ce484222325ull};
    hash_floats(&h, r->logits, FV);
    printf("%s_last_only %016llx\n", prefix, (unsigned long long)h.h);
    free(r);
    model_free(m);
    free(m);
}

/* [-100, 100] in 2^20 steps, the edges of exp_lk's range, specials, and 2^16 random bit patterns */
static void test_exp_many(int path)
{
    const int64_t steps = 1 << 20, nrand = 1 << 16;
    static const float EDGES[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.3f, -87.3f, 88.72283f, -103.97f, 1e-30f, -1e-30f,
                                  0x1p-149f, 0.34657359f, -0.34657359f, 0.5f, -0.5f, 1e30f, -1e30f};
    const int64_t ne = (int64_t)(sizeof EDGES / sizeof EDGES[0]), n = steps + 1 + ne + 3 + nrand;
    float *x = xmalloc((size_t)n * 4), *o = xmalloc((size_t)n * 4);
    int64_t i = 0;
    for (int64_t s = 0; s <= steps; s++) x[i++] = (float)(-100.0 + 200.0 * (double)s / (double)steps);
    for (int64_t e = 0; e < ne; e++) x[i++] = EDGES[e];
    const uint32_t specials[3] = {0x7f800000u, 0xff800000u, 0x7fc00000u};    /* inf, -inf, nan */
    for (int s = 0; s < 3; s++) memcpy(&x[i++], &specials[s], 4);
    for (int64_t s = 0; s < nrand; s++) { const uint32_t u = (uint32_t)next_u64(); memcpy(&x[i++], &u, 4); }
    check_rc("rk_exp_many", rk.exp_many((uintptr_t)x, (uintptr_t)o, n, path));
    hash_t h = {0xcbf29ce484222325ull};
    hash_floats(&h, o, (size_t)n);
    printf("exp_many %016llx\n", (unsigned long long)h.h);
    free(x), free(o);
}

/* 2 million triples: half small exact values, half any bit pattern (subnormals, huge, inf, nan), then the
   double-rounding cases (a = 1 + 2^-23, b = (1 - 2^-23) 2^-24, c = 1 + 2^-23 and its mirror) */
static void test_fma(void)
{
    const int64_t n = 2000000 + 2;
    float *a = xmalloc((size_t)n * 4), *b = xmalloc((size_t)n * 4), *c = xmalloc((size_t)n * 4), *o = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n - 2; i++) {
        if (i % 2) {
            uint32_t u[3] = {(uint32_t)next_u64(), (uint32_t)next_u64(), (uint32_t)next_u64()};
            memcpy(&a[i], &u[0], 4), memcpy(&b[i], &u[1], 4), memcpy(&c[i], &u[2], 4);
        } else {
            a[i] = next_float(), b[i] = next_float(), c[i] = next_float();
        }
    }
    const float up = 1.0f + 0x1p-23f, lo = (1.0f - 0x1p-23f) * 0x1p-24f;
    a[n - 2] = up, b[n - 2] = lo, c[n - 2] = up;
    a[n - 1] = -up, b[n - 1] = lo, c[n - 1] = -up;
    const char *names[2] = {"fma_soft", "fma"};
    for (int how = 1; how >= 0; how--) {
        hash_t h = {0xcbf29ce484222325ull};
        check_rc("rk_fma_many", rk.fma_many((uintptr_t)a, (uintptr_t)b, (uintptr_t)c, (uintptr_t)o, n, how));
        hash_floats(&h, o, (size_t)n);
        printf("%s %016llx\n", names[how], (unsigned long long)h.h);
        if (o[n - 2] != up || o[n - 1] != -up)
            printf("%s_double_rounding WRONG\n", names[how]);
    }
    free(a), free(b), free(c), free(o);
}

/* ---- stress: the pool under thread-count switches and concurrent callers ------------------------------ */
static const int SWITCH[] = {1, 2, 3, 8, 3, 1, 8, 2, 3, 2, 8, 1};
#define NSWITCH (int)(sizeof SWITCH / sizeof SWITCH[0])

/* small products: fewer strips than threads (some workers sit the job out) and more */
typedef struct { int kind; int64_t m, k, n; void *w; float *x; uint64_t ref; } small_t;
static small_t SMALL[] = {{KIND_Q41, 1, 64, 40, 0, 0, 0}, {KIND_Q41, 7, 64, 40, 0, 0, 0},
                          {KIND_Q80, 2, 96, 17, 0, 0, 0}, {KIND_F32, 3, 33, 50, 0, 0, 0},
                          {KIND_F32, 9, 64, 300, 0, 0, 0}, {KIND_Q80, 1, 64, 8, 0, 0, 0}};
#define NSMALL (int)(sizeof SMALL / sizeof SMALL[0])

/* calls finished so far; the watchdog ends the run when it stops growing for HANG_S seconds (a hung pool) */
static atomic_long progress;
#define HANG_S 15

static void *watchdog(void *arg)
{
    long last = -1;
    (void)arg;
    for (int still = 0;; ) {
        sleep_1s();
        const long now = atomic_load(&progress);
        still = now == last ? still + 1 : 0, last = now;
        if (still >= HANG_S) {
            printf("stress_hung %ld\n", now);
            fflush(stdout);
            _Exit(7);
        }
    }
    return NULL;
}

static uint64_t small_run(const small_t *p, float *y, int path)
{
    const int32_t rc = p->kind == KIND_F32
        ? rk.matmul((uintptr_t)p->x, p->m, p->k, p->k, (uintptr_t)p->w, p->n, (uintptr_t)y, p->n, path)
        : rk.qmatmul((uintptr_t)p->x, p->m, p->k, p->k, (uintptr_t)p->w, p->kind, p->n, (uintptr_t)y, p->n, path);
    check_rc(p->kind == KIND_F32 ? "rk_matmul" : "rk_qmatmul", rc);
    atomic_fetch_add(&progress, 1);
    hash_t h = {0xcbf29ce484222325ull};
    hash_floats(&h, y, (size_t)(p->m * p->n));
    return h.h;
}

typedef struct {
    const model_t *model, *moe;
    int path, rounds, id;
    uint64_t ref_decode, ref_prefill, ref_moe;
    long calls, mismatches;
} stress_t;

/* one round: a prefill, a decode of the 9 tokens, a prefill of the MoE and every small product, each checked
   against its reference */
static void stress_round(stress_t *st, run_t *r, float *y)
{
    check_rc("rk_forward", run_chunks(st->model, r, PREFILL, st->path));
    st->mismatches += run_hash(r) != st->ref_prefill;
    atomic_fetch_add(&progress, 1);
    check_rc("rk_forward", run_chunks(st->model, r, DECODE, st->path));
    st->mismatches += run_hash(r) != st->ref_decode;
    atomic_fetch_add(&progress, 1);
    check_rc("rk_forward", run_chunks(st->moe, r, PREFILL, st->path));
    st->mismatches += run_hash(r) != st->ref_moe;
    atomic_fetch_add(&progress, 1);
    st->calls += 2 + FT;
    for (int i = 0; i < NSMALL; i++) {
        st->mismatches += small_run(&SMALL[(i + st->id) % NSMALL], y, st->path) != SMALL[(i + st->id) % NSMALL].ref;
        st->calls++;
    }
}

static void *stress_caller(void *arg)
{
    stress_t *st = (stress_t *)arg;
    run_t *r = xmalloc(sizeof *r);
    float *y = xmalloc((size_t)(9 * 300) * 4);
    for (int i = 0; i < st->rounds; i++) stress_round(st, r, y);
    free(r), free(y);
    return NULL;
}

static void stress(int path, int rounds)
{
    static model_t m, moe;
    model_build(&m, 0);
    model_build(&moe, 1);
    run_t *r = xmalloc(sizeof *r);
    float *y = xmalloc((size_t)(9 * 300) * 4);
    static thread_t wd;
    static trampoline_t wd_tr;
    if (thread_start(&wd, &wd_tr, watchdog, NULL)) { fprintf(stderr, "kernel_check: no thread\n"); exit(5); }
    for (int i = 0; i < NSMALL; i++) {
        small_t *p = &SMALL[i];
        p->w = p->kind == KIND_F32 ? (void *)packed(p->k, p->n) : (void *)small_blocks(p->kind, p->k, p->n);
        p->x = xmalloc((size_t)(p->m * p->k) * 4);
        fill(p->x, (size_t)(p->m * p->k));
    }
    /* the first calls at THREADS (the kernel's lazily set statics are first read by the workers), then the
       references at one thread */
    uint64_t first[NSMALL + 3];
    for (int i = 0; i < NSMALL; i++) first[i] = small_run(&SMALL[i], y, path);
    check_rc("rk_forward", run_chunks(&m, r, DECODE, path));
    first[NSMALL] = run_hash(r);
    check_rc("rk_forward", run_chunks(&m, r, PREFILL, path));
    first[NSMALL + 1] = run_hash(r);
    check_rc("rk_forward", run_chunks(&moe, r, PREFILL, path));
    first[NSMALL + 2] = run_hash(r);
    check_rc("rk_set_threads", rk.set_threads(1, NULL));
    stress_t st = {&m, &moe, path, rounds, 0, 0, 0, 0, 0, 0};
    check_rc("rk_forward", run_chunks(&m, r, DECODE, path));
    st.ref_decode = run_hash(r);
    check_rc("rk_forward", run_chunks(&m, r, PREFILL, path));
    st.ref_prefill = run_hash(r);
    check_rc("rk_forward", run_chunks(&moe, r, PREFILL, path));
    st.ref_moe = run_hash(r);
    for (int i = 0; i < NSMALL; i++) {
        SMALL[i].ref = small_run(&SMALL[i], y, path);
        st.mismatches += first[i] != SMALL[i].ref;
    }
    st.mismatches += (first[NSMALL] != st.ref_decode) + (first[NSMALL + 1] != st.ref_prefill) +
                     (first[NSMALL + 2] != st.ref_moe);
    st.calls += NSMALL + 2 * (2 + FT);
    /* one caller, the thread count switched between rounds (and between calls inside a round) */
    for (int i = 0; i < rounds; i++) {
        check_rc("rk_set_threads", rk.set_threads(SWITCH[i % NSWITCH], NULL));
        stress_round(&st, r, y);
        check_rc("rk_set_threads", rk.set_threads(SWITCH[(i + 5) % NSWITCH], NULL));
        st.mismatches += small_run(&SMALL[i % NSMALL], y, path) != SMALL[i % NSMALL].ref;
        st.calls++;
    }
    /* two callers at once (one finds the pool busy and runs alone) while this thread switches the count */
    stress_t callers[2] = {st, st};
    thread_t t[2];
    trampoline_t tr[2];
    for (int c = 0; c < 2; c++) {
        callers[c].rounds = rounds / 2 > 0 ? rounds / 2 : 1, callers[c].id = c + 1;
        callers[c].calls = callers[c].mismatches = 0;
        if (thread_start(&t[c], &tr[c], stress_caller, &callers[c])) {
            fprintf(stderr, "kernel_check: no thread\n");
            exit(5);
        }
    }
    for (int i = 0; i < 2 * rounds; i++) {
        check_rc("rk_set_threads", rk.set_threads(SWITCH[i % NSWITCH], NULL));
        st.mismatches += small_run(&SMALL[i % NSMALL], y, path) != SMALL[i % NSMALL].ref;
        st.calls++;
    }
    for (int c = 0; c < 2; c++) {
        thread_join(t[c]);
        st.calls += callers[c].calls, st.mismatches += callers[c].mismatches;
    }
    printf("stress_mismatches %ld\nstress_calls %ld\n", st.mismatches, st.calls);
    for (int i = 0; i < NSMALL; i++) free(SMALL[i].w), free(SMALL[i].x);
    free(r), free(y);
    model_free(&m);
    model_free(&moe);
}

int main(int argc, char **argv)
{
    const int stress_mode = argc == 6 && strcmp(argv[4], "stress") == 0;
    if (!(argc == 4 || (argc == 5 && strcmp(argv[4], "all") == 0) || stress_mode)) {
        fprintf(stderr, "usage: kernel_check LIBRARY PATH THREADS [all | stress ROUNDS]\n");
        return 2;
    }
    if (bind_all(argv[1])) return 2;
    const int path = atoi(argv[2]), threads = atoi(argv[3]);
    int32_t in_use = 0;
    check_rc("rk_set_threads", rk.set_threads(threads, &in_use));
    printf("abi %d\nthreads %d\n", (int)rk.abi(), (int)in_use);
    state = 42;
    if (stress_mode) {
        stress(path, atoi(argv[5]));
        fflush(stdout);
        return 0;
    }
    test_matmul(path);
    test_native(path);
    test_forward(path, 0, "forward");
    test_forward(path, 1, "forward_moe");
    int_layout = 1;                      /* the same models on the int8 numerics */
    test_forward(path, 0, "forward_int8");
    test_forward(path, 1, "forward_moe_int8");
    int_layout = 0;
    test_exp_many(path);
    test_fma();
    fflush(stdout);
    return 0;
}
