/* kernel_check: the row kernel's bit test for platforms this machine can only emulate.

    kernel_check LIBRARY USE_AVX2 THREADS

loads a shipped kernel library (dlopen, or LoadLibrary on Windows), runs fixed pseudo-random products through
every entry point and prints one line per test: its name and an FNV-1a hash of the output bits. The same
inputs on every platform, so equal hashes mean equal bits (tests/test_platforms_kernel.py builds this with
zig for linux-aarch64 and windows-x86_64, runs it under qemu-aarch64 and wine64 and natively, and compares):

  matmul      float strips, shapes (k, n) with n not a multiple of 16 among them, M = 1..16 rows and 40
  qmatmul     Q4_1 and Q8_0 strip-blocks, the same row counts
  dequantise  Q4_1 and Q8_0 strip-blocks to float strips
  dense_step  six decode steps of a 2-layer dense model (its softmax and SiLU call the C library's expf)
  fma         2 million triples through the portable path's fma (FMA instruction or software) ...
  fma_soft    ... and through the software fma alone (csrc/rowkernel.c soft_fmaf); NaNs hash as one value

Plain C11, no Python; build: zig cc -O2 -o kernel_check kernel_check.c (add -ldl on old glibc). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
static void *open_lib(const char *path) { return (void *)LoadLibraryA(path); }
static void *sym(void *lib, const char *name) { return (void *)GetProcAddress((HMODULE)lib, name); }
#else
#include <dlfcn.h>
static void *open_lib(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
static void *sym(void *lib, const char *name) { return dlsym(lib, name); }
#endif

typedef int32_t (*abi_fn)(void);
typedef int32_t (*matmul_fn)(uintptr_t, int64_t, int64_t, int64_t, uintptr_t, int64_t, uintptr_t, int64_t, int32_t);
typedef int32_t (*qmatmul_fn)(uintptr_t, int64_t, int64_t, int64_t, uintptr_t, int32_t, int64_t, uintptr_t, int64_t,
                              int32_t);
typedef int32_t (*dequant_fn)(uintptr_t, int32_t, int64_t, int64_t, uintptr_t, int32_t);
typedef int32_t (*threads_fn)(int32_t, int32_t *);
typedef int32_t (*dense_fn)(uintptr_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                            int64_t, int64_t, int32_t, uintptr_t);
typedef int32_t (*fma_fn)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, int64_t, int32_t);

static struct {
    abi_fn abi;
    matmul_fn matmul;
    qmatmul_fn qmatmul;
    dequant_fn dequantise;
    threads_fn set_threads;
    dense_fn dense_step;
    fma_fn fma_many;
} rk;

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

static void test_matmul(int avx2)
{
    static const int64_t SHAPES[][2] = {{64, 8}, {100, 37}, {33, 50}, {256, 300}, {576, 96}, {7, 1}, {1536, 64}};
    hash_t h = {0xcbf29ce484222325ull};
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        const int64_t k = SHAPES[s][0], n = SHAPES[s][1], ns = (n + 15) / 16;
        float *w = xmalloc((size_t)(ns * 16 * k) * 4), *x = xmalloc((size_t)(40 * k) * 4), *y = xmalloc((size_t)(40 * n) * 4);
        fill(w, (size_t)(ns * 16 * k));
        fill(x, (size_t)(40 * k));
        for (int r = 0; r < NROWS; r++) {
            check_rc("rk_matmul", rk.matmul((uintptr_t)x, ROWS[r], k, k, (uintptr_t)w, n, (uintptr_t)y, n, avx2));
            hash_floats(&h, y, (size_t)(ROWS[r] * n));
        }
        free(w), free(x), free(y);
    }
    printf("matmul %016llx\n", (unsigned long long)h.h);
}

/* random strip-blocks whose scales are finite halves (exponents 8..17: 2^-7 .. 4) and codes any byte */
static uint8_t *random_blocks(int kind, int64_t k, int64_t ns, size_t *bytes)
{
    const size_t block = kind == 0 ? 320 : 544, nb = (size_t)(k / 32) * (size_t)ns;
    uint8_t *w = xmalloc(block * nb);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * block;
        const int halves = kind == 0 ? 32 : 16;       /* d[16] (and m[16]) */
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

static void test_native(int avx2)
{
    static const int64_t SHAPES[][2] = {{64, 40}, {576, 96}, {96, 17}, {1536, 48}};
    hash_t hq = {0xcbf29ce484222325ull}, hd = {0xcbf29ce484222325ull};
    for (int kind = 0; kind < 2; kind++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
            const int64_t k = SHAPES[s][0], n = SHAPES[s][1], ns = (n + 15) / 16;
            size_t bytes;
            uint8_t *w = random_blocks(kind, k, ns, &bytes);
            float *x = xmalloc((size_t)(40 * k) * 4), *y = xmalloc((size_t)(40 * n) * 4);
            float *f = xmalloc((size_t)(ns * 16 * k) * 4);
            fill(x, (size_t)(40 * k));
            for (int r = 0; r < NROWS; r++) {
                check_rc("rk_qmatmul", rk.qmatmul((uintptr_t)x, ROWS[r], k, k, (uintptr_t)w, kind, n, (uintptr_t)y, n, avx2));
                hash_floats(&hq, y, (size_t)(ROWS[r] * n));
            }
            check_rc("rk_dequantise", rk.dequantise((uintptr_t)w, kind, k, n, (uintptr_t)f, avx2));
            hash_floats(&hd, f, (size_t)(ns * 16 * k));
            free(w), free(x), free(y), free(f);
        }
    printf("qmatmul %016llx\n", (unsigned long long)hq.h);
    printf("dequantise %016llx\n", (unsigned long long)hd.h);
}

static float *packed(int64_t k, int64_t n)
{
    const size_t len = (size_t)(((n + 15) / 16) * 16 * k);
    float *w = xmalloc(len * 4);
    fill(w, len);
    for (size_t i = 0; i < len; i++) w[i] *= 0.125f;       /* keep activations in range over the layers */
    return w;
}

static void test_dense_step(int avx2)
{
    const int64_t L = 2, D = 32, H = 4, G = 2, hd = 8, I = 48, NV = 50, V = 50, P = 16;
    const int64_t nq = H * hd, nkv = G * hd;
    uint64_t plan[6 + 8 * 2];
    void *owned[6 + 8 * 2];
    float *embed = xmalloc((size_t)(NV * D) * 4), *fnorm = xmalloc((size_t)D * 4), *cosv = xmalloc((size_t)(P * hd) * 4);
    float *sinv = xmalloc((size_t)(P * hd) * 4);
    fill(embed, (size_t)(NV * D));
    for (int64_t i = 0; i < D; i++) fnorm[i] = 1.0f + 0.25f * next_float();
    for (int64_t i = 0; i < P * hd; i++) { cosv[i] = 0.25f * next_float(); sinv[i] = 0.25f * next_float(); }
    owned[0] = embed, owned[1] = fnorm, owned[2] = packed(D, V), owned[3] = cosv, owned[4] = sinv;
    owned[5] = xmalloc((size_t)(2 * D + nq + 2 * nkv + nq + D + 2 * I + P) * 4);
    for (int l = 0; l < L; l++) {
        void **o = owned + 6 + 8 * l;
        float *an = xmalloc((size_t)D * 4), *mn = xmalloc((size_t)D * 4);
        for (int64_t i = 0; i < D; i++) { an[i] = 1.0f + 0.25f * next_float(); mn[i] = 1.0f + 0.25f * next_float(); }
        o[0] = an, o[1] = packed(D, nq + 2 * nkv), o[2] = packed(nq, D), o[3] = mn;
        o[4] = packed(D, 2 * I), o[5] = packed(I, D);
        o[6] = xmalloc((size_t)(P * nkv) * 4), o[7] = xmalloc((size_t)(P * nkv) * 4);
    }
    for (int i = 0; i < 6 + 8 * 2; i++) plan[i] = (uint64_t)(uintptr_t)owned[i];
    float *logits = xmalloc((size_t)V * 4);
    hash_t h = {0xcbf29ce484222325ull};
    static const int64_t TOKENS[] = {3, 17, 42, 0, 49, 8};
    for (int64_t pos = 0; pos < 6; pos++) {
        check_rc("rk_dense_step", rk.dense_step((uintptr_t)plan, L, D, H, G, hd, I, NV, V, 1e-5f, TOKENS[pos], pos, avx2,
                                                (uintptr_t)logits));
        hash_floats(&h, logits, (size_t)V);
    }
    printf("dense_step %016llx\n", (unsigned long long)h.h);
    for (int i = 0; i < 6 + 8 * 2; i++) free(owned[i]);
    free(logits);
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

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: kernel_check LIBRARY USE_AVX2 THREADS\n");
        return 2;
    }
    void *lib = open_lib(argv[1]);
    if (!lib) { fprintf(stderr, "kernel_check: cannot load %s\n", argv[1]); return 2; }
#define BIND(field, name) if (!(*(void **)&rk.field = sym(lib, name))) { fprintf(stderr, "kernel_check: %s lacks %s\n", argv[1], name); return 2; }
    BIND(abi, "rk_abi") BIND(matmul, "rk_matmul") BIND(qmatmul, "rk_qmatmul") BIND(dequantise, "rk_dequantise")
    BIND(set_threads, "rk_set_threads") BIND(dense_step, "rk_dense_step") BIND(fma_many, "rk_fma_many")
    const int avx2 = atoi(argv[2]), threads = atoi(argv[3]);
    int32_t in_use = 0;
    check_rc("rk_set_threads", rk.set_threads(threads, &in_use));
    printf("abi %d\nthreads %d\n", (int)rk.abi(), (int)in_use);
    state = 42;
    test_matmul(avx2);
    test_native(avx2);
    test_dense_step(avx2);
    test_fma();
    fflush(stdout);
    return 0;
}
