/* kernel_impl.h: what the kernel's compilation units share, and nothing a caller sees (that is rowkernel.h).

Why. The kernel is five units compiled separately (csrc/build_kernels.py lists them, UNITS), each of which calls
only units below it in this list, never back up (no unit includes another's .c, no two call each other):
  forward.c     rk_forward, rk_draft_greedy, rk_state_half: a whole Llama forward over M rows, built of products
                and attention
  rowkernel.c   the entry points: sizes and kinds checked, the path word decoded once (decode_path), CPU features
  products.c    one product on a range of strips (float strips, native blocks, the kind table KINDS), run_product
  intdot.c      the int8 numerics: activations quantised, integer block dots, the int layouts
  pool.c        the thread pool: a job's chunks claimed by the caller and the workers, per-thread scratch
forward.c calls rowkernel.c (decode_path, rk_qmatmul), products.c and pool.c; rowkernel.c calls products.c,
intdot.c (rk_repack_int) and pool.c (rk_set_threads); products.c calls intdot.c and pool.c; intdot.c and pool.c
call nothing of the kernel. This header declares what crosses a unit's edge (every name here has hidden
visibility: the library exports the rk_* entry points only) and holds the small helpers every unit inlines:
the exact half-to-float, and the correctly rounded fma of the portable path (its proof below).

Layout. product_t is one product's arguments as the units pass them (a range of its strips is one chunk of a
pool job); path_t is a call's path word decoded once; kind_t is one row of the kind table (format.h names the
bytes of each kind's block, KINDS in products.c what the code asks of it); qx_t holds the int8 numerics' rows
quantised once per product. */
#ifndef LK_KERNEL_IMPL_H
#define LK_KERNEL_IMPL_H

#include "portable.h"
#define RK_API RK_EXPORT
#include "rowkernel.h" /* RK_ABI, error codes, the path word, rk_forward's slots, every entry point's prototype */
#include "format.h"   /* QK, STRIP, KIND_*, the strip-blocks: the packed format (lessonkit/engine/packed_layout.py) */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HAVE_X86 RK_X86
#if RK_ARM64
#include <arm_neon.h>
#endif
#define UNROLL RK_UNROLL
#define AVX2H RK_TARGET("avx2,fma,f16c")
#define MAXT 64                 /* threads at most (rk_max_threads; lessonkit/engine/threads.py MAX_THREADS) */

/* ---- a call's path word, decoded once at its entry point (rowkernel.c decode_path) ------------------ */
typedef struct {
    enum rk_isa isa;        /* the instructions: PATH_PORTABLE (plain C; NEON fma on arm64), PATH_AVX2, PATH_AVX512 */
    int vnni;               /* the int8 numerics' dot on AVX-512: vpdpbusd (else AVX-512 BW's vpmaddubsw) */
    int fma;                /* the portable path's fma is the FMA instruction (else soft_fmaf) */
} path_t;
int32_t decode_path(int32_t path, path_t *out);

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
(portable.h refuses FLT_EVAL_METHOD 2; the build passes -ffp-contract=off). Tests: rk_fma_many (rowkernel.c),
against the FMA instruction on 2 million random and the known double-rounding triples. */
static inline float soft_fmaf(float a, float b, float c)
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

#if RK_X86
/* the FMA3 instruction on one float (vfmadd..ss): the portable path on CPUs with FMA, no AVX2 vectors */
RK_TARGET("fma") static inline float hw_fmaf(float a, float b, float c)
{
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}
#elif RK_ARM64
/* arm64 always has FMA: NEON fmla, one rounding */
static inline float hw_fmaf(float a, float b, float c)
{
    return vgetq_lane_f32(vfmaq_f32(vdupq_n_f32(c), vdupq_n_f32(a), vdupq_n_f32(b)), 0);
}
#endif

/* the portable path's fma: the instruction when the call's path says this CPU has it, else soft_fmaf */
static inline float fma_portable(float a, float b, float c, int hw)
{
#if RK_X86 || RK_ARM64
    if (hw) return hw_fmaf(a, b, c);
#endif
    (void)hw;
    return soft_fmaf(a, b, c);
}

/* IEEE half to float, exact (normals, subnormals, zeros, inf, nan) */
static inline float half_to_float(lk_half h)
{
    const int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float f = e == 0 ? ldexpf((float)mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexpf((float)(mant | 0x400), e - 25);
    return (h & 0x8000) ? -f : f;
}

/* ---- the kinds: one row each, what the code asks of a kind (ggml's type_traits) ------------------------ */
typedef struct {
    size_t bytes;           /* of one strip-block (its format.h struct) */
    int has_min;            /* w = d * q + m (Q4_1), else w = d * q (Q8_0) */
    int int_layout;         /* codes permuted for integer dots: products take the int8 numerics (csrc/intdot.c) */
    void (*dequant)(const uint8_t *blk, float *out);           /* portable dequantiser of a strip-block */
    void (*dequant_avx2)(const uint8_t *blk, float *out);      /* the same with AVX2 + F16C (NULL: none) */
    void (*column)(const uint8_t *blk, int c, float *out);     /* column c's QK weights */
} kind_t;
enum { N_KINDS = KIND_Q80I + 1 };
extern const kind_t KINDS[N_KINDS];      /* products.c: format.h's KIND_Q41 .. KIND_Q80I, in that order */

/* a kind of strip-blocks (format.h's KIND_*, not KIND_F32) */
static inline int block_kind(int64_t kind) { return kind >= 0 && kind < N_KINDS; }
/* bytes of one strip of k inputs */
static inline size_t strip_bytes(const kind_t *kt, int64_t k) { return (size_t)(k / QK) * kt->bytes; }

/* ---- products.c ----------------------------------------------------------------------------------- */
typedef struct {
    const float *x;
    int64_t ldx, m, k;
    const void *w;          /* float strips (KIND_F32) or strip-blocks of a kind in KINDS */
    int kind;
    path_t path;            /* the call's path word, decoded once */
    float *y;
    int64_t ldy, n;
    float **scratch;        /* per part: GROUP_BYTES of float strips (native weights, M > 6 or portable) */
    const void *qx;         /* int8 numerics: the rows quantised once per product (a qx_t) */
} product_t;

/* the product on the pool (or alone when another caller holds it); -1 when memory could not be allocated */
int run_product(product_t *p);
/* strips [0, ns) of packed blocks -> the float strip layout (out: ns x k x 16 floats) */
void dequant_strips(const uint8_t *w, int kind, int64_t k, int64_t ns, float *out, const path_t *path);

/* ---- intdot.c ------------------------------------------------------------------------------------- */
typedef struct {
    const int8_t *q;         /* [m, k] quantised activations */
    const float *d, *s;      /* [m, k / 32] scales and scaled code sums */
    const int32_t *sums;     /* [m, k / 32] code sums (the VNNI Q8_0 dot's correction) */
} qx_t;

void quantise_rows(const float *x, int64_t ldx, int64_t m, int64_t k, int8_t *q, float *d, float *s, int32_t *sums,
                   enum rk_isa isa);
void repack_int(const uint8_t *src, int kind, int64_t k, int64_t ns, uint8_t *dst);
void int_product(const qx_t *qx, int64_t m, int64_t k, const uint8_t *w, int kind, const kind_t *kt, float *y,
                 int64_t ldy, int64_t n, const path_t *path);
void dequant_q41i(const uint8_t *blk, float *out);
void dequant_q80i(const uint8_t *blk, float *out);
void column_q41i(const uint8_t *blk, int c, float *out);
void column_q80i(const uint8_t *blk, int c, float *out);

/* ---- pool.c --------------------------------------------------------------------------------------- */
/* fn(ctx, chunk, chunks, thread) over `items` units (strips, attention pairs) on the pool's threads when it is
   free, else alone on the calling thread; (*scratch)[thread] holds `need` floats for the thread (need 0: none,
   scratch may be NULL). -1 when scratch could not be allocated. */
int pool_run(void (*fn)(void *, int, int, int), void *ctx, int64_t items, size_t need, float ***scratch);
/* n threads (1 .. MAXT) from now on; returns the number running (fewer when a thread could not start) */
int pool_set_threads(int n);

#endif
