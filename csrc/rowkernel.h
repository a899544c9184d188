/* rowkernel.h: the kernel library's interface in one place: its ABI number, error codes, the path word, the
forward's two inputs (struct rk_model, struct rk_batch), the named slots of the model's plan and dims, and every
entry point's prototype.

Why. lessonkit/engine/kernel_library.py calls these entry points with ctypes (addresses as uintptr_t, sizes as
int64_t, an int32 code back) and lessonkit/engine/c_forward.py fills the plan; a slot or a field moved on one side
only would be read as another weight. Naming them here, and checking the Python side against this file
(tests/test_packed_format.py: every enum's numbers, and the structs' offsetof / sizeof from a compiled program),
keeps the two sides one table. csrc/format.h holds the packed weights' format; this file holds the calls.

The forward's inputs, named once (as llama.h's llama_batch): rk_forward(model, batch) and
rk_draft_greedy(model, batch, ...) take
  struct rk_model  what stays the same from call to call: the plan of weight addresses, the dims, eps, the q/k/v
                   clip, the path word, a mixture's expert fetch;
  struct rk_batch  what one call reads and writes: the rows (tokens or embeddings), their count and first
                   position, which rows want logits and where they go, the experts each row chose, the KV
                   cache the rows' keys and values are written into and attended over, and the layers whose
                   residual stream is copied out (taps: a feature head reads them). The cache sits in the batch,
                   not the model: a model serves several caches (a drafter's, the target's), and a call names the
                   one it writes.
Layout of the model's plan (csrc/forward.c documents what each holds): PLAN_GLOBALS int64, then PLAN_LAYER per
layer; dims is DIMS int64; a MoE layer's expert table is E entries of EXPERT_ENTRY int64.
Paths: the path word's low two bits are the ISA (enum rk_isa: PATH_PORTABLE, PATH_AVX2, PATH_AVX512; each
entry point decodes it once, and 3 runs as AVX2), PATH_INT8 marks
weights prepared for the int8 numerics (csrc/intdot.c; the int layouts' kinds decide the product), and
PATH_NO_VNNI keeps an AVX-512 int8 product off vpdpbusd (tests compare the two). Bump RK_ABI when an entry
point's arguments, a struct's field or a slot change meaning: kernel_library.py refuses a binary with another
number. */
#ifndef LK_ROWKERNEL_H
#define LK_ROWKERNEL_H

#include <stdint.h>

#define RK_ABI 15

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

enum {                          /* struct rk_model's plan: the globals */
    PLAN_FINAL_NORM = 0, PLAN_HEAD = 1, PLAN_HEAD_KIND = 2, PLAN_COS = 3, PLAN_SIN = 4,
    PLAN_EMBED = 5, PLAN_EMBED_KIND = 6, PLAN_EMBED_ROWS = 7, PLAN_GLOBALS = 8
};
enum {                          /* struct rk_model's plan: each layer's slots, after the globals */
    LAYER_ATTN_NORM = 0, LAYER_WQKV = 1, LAYER_WQKV_KIND = 2, LAYER_WO = 3, LAYER_WO_KIND = 4, LAYER_MLP_NORM = 5,
    LAYER_GATE_UP = 6, LAYER_GATE_UP_KIND = 7, LAYER_DOWN = 8, LAYER_DOWN_KIND = 9, LAYER_Q_NORM = 10,
    LAYER_K_NORM = 11, LAYER_ROUTER = 12, LAYER_ROUTER_KIND = 13, LAYER_EXPERTS = 14, PLAN_LAYER = 15
};
enum {                          /* struct rk_model's dims */
    DIM_LAYERS = 0, DIM_D = 1, DIM_HEADS = 2, DIM_KV_HEADS = 3, DIM_HEAD_DIM = 4, DIM_INTER = 5, DIM_VOCAB = 6,
    DIM_ROPE_ROWS = 7, DIM_EXPERTS = 8, DIM_TOP_K = 9, DIM_NORM_TOPK = 10, DIM_QK_NORM = 11, DIM_PREFETCH = 12,
    DIMS = 13
};
enum { EXPERT_GATE_UP = 0, EXPERT_GATE_UP_KIND = 1, EXPERT_DOWN = 2, EXPERT_DOWN_KIND = 3, EXPERT_ENTRY = 4 };
enum {                          /* rk_draft_greedy's chain: a feature head's input rows (csrc/forward.c says how) */
    CHAIN_ETAB = 0, CHAIN_W = 1, CHAIN_W_KIND = 2, CHAIN_GNORM = 3, CHAIN_STATES = 4, CHAIN_S = 5, CHAIN_FROM = 6,
    CHAIN_TO = 7, CHAIN_G = 8, CHAIN_FUSE = 9, CHAIN_FUSE_KIND = 10, CHAIN_STATE = 11, CHAIN_STATE_KIND = 12,
    CHAIN_ROWS = 13, CHAIN_AT = 14, CHAIN_TOKENS = 15, CHAIN_WE = 16, CHAIN_WE_KIND = 17, CHAIN_WORDS = 18
};

/* fetch(layer, expert, entry): fills entry[EXPERT_ENTRY] (gate_up address, its kind, down address, its kind;
   the Python side's expert store reads the expert from disk if it must), 0 on success; entry NULL: a prefetch
   hint for the next layer (DIM_PREFETCH). Called once per expert a layer uses, in expert order. */
typedef int64_t (*rk_fetch_fn)(int64_t layer, int64_t expert, int64_t *entry);

struct rk_model {                 /* the same from call to call; pointers first: no padding inside */
    const int64_t *plan;          /* PLAN_GLOBALS + PLAN_LAYER * L int64: weight addresses and kinds */
    const int64_t *dims;          /* DIMS int64: the model's sizes */
    rk_fetch_fn fetch;            /* a MoE's expert fetch; NULL when every expert table is full (and dense) */
    float eps;                    /* RMSNorm's epsilon */
    float clip;                   /* q, k, v clipped to [-clip, clip] before RoPE; 0: none */
    int32_t path;                 /* the path word: enum rk_isa | PATH_INT8 | PATH_NO_VNNI */
};

struct rk_batch {                 /* one call's rows, what they write and what comes back */
    const int64_t *tokens;        /* [m] token ids looked up in the plan's embedding, or NULL: x holds the rows */
    float *x;                     /* [m, D]: the rows in (unless tokens), the residual stream out */
    int64_t m;                    /* rows */
    int64_t start;                /* the first row's position; rows sit at start .. start + m - 1 */
    int64_t first;                /* logits for rows first .. m - 1 (m - 1: the last row only) */
    float *logits;                /* [m - first, V] */
    int64_t *routing;             /* [L, m, A] the experts each row chose (MoE), or NULL */
    int64_t *unique;              /* [L] the experts each layer used, or NULL */
    float *k_cache, *v_cache;     /* [L, alloc, G, hd] each: rows start .. start + m - 1 written, 0 .. read */
    int64_t alloc;                /* positions the cache holds */
    const int64_t *tap_at;        /* [n_taps] layer counts, ascending in 1 .. L - 1, or NULL (n_taps 0) */
    int64_t n_taps;
    float *taps;                  /* [n_taps, m, D]: the residual stream after tap_at[i] layers (a feature head's) */
};

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
RK_API int32_t rk_exp_many(uintptr_t x, uintptr_t out, int64_t n, int32_t path);
RK_API int32_t rk_profile(int32_t on, uintptr_t out);
RK_API int32_t rk_forward(const struct rk_model *model, const struct rk_batch *batch);
RK_API int32_t rk_draft_greedy(const struct rk_model *model, const struct rk_batch *batch, int64_t k, uintptr_t ids,
                               uintptr_t chain, uintptr_t out);
RK_API int32_t rk_state_half(uintptr_t states, int64_t T, int64_t S, int64_t D, uintptr_t fuse, int32_t fuse_kind,
                             uintptr_t state, int32_t state_kind, float eps, uintptr_t out, int32_t path);

#endif
