/* rowkernel.h: the kernel library's interface in one place: its ABI number, error codes, the path word, the
named slots of rk_forward's plan and dims, and every entry point's prototype.

Why. lessonkit/engine/kernel_library.py calls these entry points with ctypes (addresses as uintptr_t, sizes as
int64_t, an int32 code back) and lessonkit/engine/c_forward.py fills the plan by position; a slot moved on one
side only would be read as another weight. Naming the slots here, and checking the Python side's numbers
against this file (tests/test_packed_format.py), keeps the two sides one table. csrc/format.h holds the packed
weights' format; this file holds the calls.

Layout of rk_forward's inputs (csrc/forward.c documents what each holds): plan is PLAN_GLOBALS int64, then
PLAN_LAYER per layer; dims is DIMS int64; a MoE layer's expert table is E entries of EXPERT_ENTRY int64.
Paths: the path word's low two bits are the ISA (enum rk_isa: PATH_PORTABLE, PATH_AVX2, PATH_AVX512; each
entry point decodes it once, and 3 runs as AVX2), PATH_INT8 marks
weights prepared for the int8 numerics (csrc/intdot.c; the int layouts' kinds decide the product), and
PATH_NO_VNNI keeps an AVX-512 int8 product off vpdpbusd (tests compare the two). Bump RK_ABI when an entry
point's arguments or a slot change meaning: kernel_library.py refuses a binary with another number. */
#ifndef LK_ROWKERNEL_H
#define LK_ROWKERNEL_H

#include <stdint.h>

#define RK_ABI 9

enum {
    RK_OK = 0,
    RK_BAD_SIZES = 1,          /* a size < 1, a leading dimension < the row, K not a multiple of 32 */
    RK_NO_AVX2 = 2,            /* the AVX2 (AVX-512) path asked for on a CPU without AVX2 + FMA + F16C (AVX-512 F, BW) */
    RK_NO_MEMORY = 3,          /* scratch could not be allocated */
    RK_BAD_KIND = 4,           /* a block kind other than -1 .. 3 (format.h KIND_*) */
    RK_BAD_THREADS = 5,        /* set_threads outside 1 .. rk_max_threads() */
    RK_FETCH_FAILED = 6,       /* rk_forward: the caller's expert fetch reported an error (it holds the reason) */
};

enum rk_isa { PATH_PORTABLE = 0, PATH_AVX2 = 1, PATH_AVX512 = 2 };    /* the path word's ISA: path & PATH_ISA */
enum { PATH_ISA = 3, PATH_INT8 = 4, PATH_NO_VNNI = 8 };                /* the path word's bits */

enum {                          /* rk_forward's plan: the globals */
    PLAN_FINAL_NORM = 0, PLAN_HEAD = 1, PLAN_HEAD_KIND = 2, PLAN_COS = 3, PLAN_SIN = 4,
    PLAN_EMBED = 5, PLAN_EMBED_KIND = 6, PLAN_EMBED_ROWS = 7, PLAN_GLOBALS = 8
};
enum {                          /* rk_forward's plan: each layer's slots, after the globals */
    LAYER_ATTN_NORM = 0, LAYER_WQKV = 1, LAYER_WQKV_KIND = 2, LAYER_WO = 3, LAYER_WO_KIND = 4, LAYER_MLP_NORM = 5,
    LAYER_GATE_UP = 6, LAYER_GATE_UP_KIND = 7, LAYER_DOWN = 8, LAYER_DOWN_KIND = 9, LAYER_Q_NORM = 10,
    LAYER_K_NORM = 11, LAYER_ROUTER = 12, LAYER_ROUTER_KIND = 13, LAYER_EXPERTS = 14, PLAN_LAYER = 15
};
enum {                          /* rk_forward's dims */
    DIM_LAYERS = 0, DIM_D = 1, DIM_HEADS = 2, DIM_KV_HEADS = 3, DIM_HEAD_DIM = 4, DIM_INTER = 5, DIM_VOCAB = 6,
    DIM_ROPE_ROWS = 7, DIM_EXPERTS = 8, DIM_TOP_K = 9, DIM_NORM_TOPK = 10, DIM_QK_NORM = 11, DIM_PREFETCH = 12,
    DIMS = 13
};
enum { EXPERT_GATE_UP = 0, EXPERT_GATE_UP_KIND = 1, EXPERT_DOWN = 2, EXPERT_DOWN_KIND = 3, EXPERT_ENTRY = 4 };

#ifndef RK_API
#define RK_API
#endif

RK_API int32_t rk_abi(void);
RK_API int32_t rk_max_threads(void);
RK_API int32_t rk_has_avx2(void);
RK_API int32_t rk_has_avx512(void);
RK_API int32_t rk_has_vnni(void);
RK_API int32_t rk_matmul(uintptr_t x, int64_t m, int64_t k, int64_t ldx, uintptr_t w, int64_t n, uintptr_t y,
                         int64_t ldy, int32_t path);
RK_API int32_t rk_qmatmul(uintptr_t x, int64_t m, int64_t k, int64_t ldx, uintptr_t w, int32_t kind, int64_t n,
                          uintptr_t y, int64_t ldy, int32_t path);
RK_API int32_t rk_dequantise(uintptr_t w, int32_t kind, int64_t k, int64_t n, uintptr_t out, int32_t path);
RK_API int32_t rk_repack_int(uintptr_t src, int32_t kind, int64_t k, int64_t n, uintptr_t dst);
RK_API int32_t rk_set_threads(int32_t n, int32_t *in_use);
RK_API int32_t rk_fma_many(uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t out, int64_t n, int32_t how);
RK_API int32_t rk_exp_many(uintptr_t x, uintptr_t out, int64_t n);
RK_API int32_t rk_profile(int32_t on, uintptr_t out);
RK_API int32_t rk_forward(uintptr_t plan, uintptr_t dims, float eps, float clip, uintptr_t x, uintptr_t tokens,
                          int64_t m, int64_t start, uintptr_t k_cache, uintptr_t v_cache, int64_t alloc,
                          uintptr_t logits, int64_t first, int32_t path, uintptr_t routing, uintptr_t unique,
                          uintptr_t fetch);
RK_API int32_t rk_draft_greedy(uintptr_t plan, uintptr_t dims, float eps, float clip, uintptr_t x, uintptr_t tokens,
                               int64_t m, int64_t start, uintptr_t k_cache, uintptr_t v_cache, int64_t alloc,
                               uintptr_t logits, int32_t path, int64_t k, uintptr_t ids, uintptr_t chain, uintptr_t out);

#endif
