/* The packed weight format, C side: the constants the kernel multiplies by and lessonkit writes to disk.

The Python side is ONE table, FORMAT in lessonkit/engine/packed_layout.py (same names, same values);
tests/test_packed_format.py compiles this header and compares every constant with it, and the
_Static_asserts below check at compile time that the sizes follow from QK and STRIP. Change a value here
and there together, and bump LK_LAYOUT_VERSION when the bytes on disk change meaning (converted models
record it; a reader refuses another layout rather than misread it).

Layout, per strip of STRIP output columns (rows of the GGUF matrix), per block of QK inputs, strips in
order, blocks in order:
  Q4_1 (Q41_BLOCK bytes): d[16] f16, m[16] f16, then 16 input pairs x 16 bytes: byte c of pair j holds
                          column c's code for input 2j (low nibble) and input 2j + 1 (high nibble);
  Q8_0 (Q80_BLOCK bytes): d[16] f16, then 32 inputs x 16 int8 codes (column c at byte c).
  float32:                per strip, K inputs x 16 floats (one 64-byte line per input).
A strip-block holds exactly STRIP rows' llama.cpp blocks (Q41_ROW_BLOCK / Q80_ROW_BLOCK bytes each), so
packing is a permutation of the GGUF's bytes. The int8 numerics permute the code bytes once more at load
(rk_repack_int, csrc/intdot.c), same size, same scales first.

The bytes inside a strip-block are named once, as ggml-common.h names block_q4_1: the structs below
(block_q41, block_q80 and their int-layout twins block_q41i, block_q80i), each with _Static_asserts on its size
and every field's offset. C code reads a block through them (blk->d[c], blk->qs[j][c]), never at a literal offset;
the Python side's mirror is BLOCK_LAYOUT in lessonkit/engine/packed_layout.py (tests/test_kernel_format.py compiles
offsetof() for every field and compares). A block sits at an even address (every size here is even and a
tensor's storage is aligned), so its f16 fields are lk_half (uint16_t, IEEE half bits). */
#ifndef LK_FORMAT_H
#define LK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define LK_LAYOUT_VERSION 2   /* of converted models' expert records: 2 = packed at conversion */
#define QK 32                 /* weights per block (llama.cpp's QK4_1 = QK8_0 = 32) */
#define STRIP 16              /* columns per packed strip */
#define Q41_ROW_BLOCK 20      /* llama.cpp block_q4_1: d, m (f16), QK / 2 bytes of nibbles */
#define Q80_ROW_BLOCK 34      /* llama.cpp block_q8_0: d (f16), QK int8 */
#define Q41_BLOCK 320         /* bytes of one strip-block: d[16], m[16] (f16), 16 pairs x 16 bytes of nibbles */
#define Q80_BLOCK 544         /* d[16] (f16), 32 x 16 int8 */

enum { KIND_F32 = -1, KIND_Q41 = 0, KIND_Q80 = 1,      /* a weight's kind, as kernel.py passes it */
       KIND_Q41I = 2, KIND_Q80I = 3 };                  /* the same blocks, codes permuted for integer dots
                                                           (csrc/intdot.c: the int8 numerics' layout) */

_Static_assert(Q41_ROW_BLOCK == 2 + 2 + QK / 2, "Q4_1 row block: d, m (f16) and QK 4-bit codes");
_Static_assert(Q80_ROW_BLOCK == 2 + QK, "Q8_0 row block: d (f16) and QK int8 codes");
_Static_assert(Q41_BLOCK == 2 * STRIP * 2 + STRIP * QK / 2, "Q4_1 strip-block: d[STRIP], m[STRIP] f16, codes");
_Static_assert(Q80_BLOCK == STRIP * 2 + STRIP * QK, "Q8_0 strip-block: d[STRIP] f16, codes");
_Static_assert(Q41_BLOCK == STRIP * Q41_ROW_BLOCK, "a Q4_1 strip-block is STRIP row blocks, permuted");
_Static_assert(Q80_BLOCK == STRIP * Q80_ROW_BLOCK, "a Q8_0 strip-block is STRIP row blocks, permuted");
_Static_assert(STRIP * sizeof(float) == 64, "one strip row of float32 weights is one 64-byte cache line");

typedef uint16_t lk_half;     /* an IEEE half float's bits (llama.cpp's ggml_half) */

typedef struct {              /* KIND_Q41: w = d * q + m */
    lk_half d[STRIP];         /* column c's scale */
    lk_half m[STRIP];         /* column c's minimum */
    uint8_t qs[QK / 2][STRIP];    /* qs[j][c]: column c's codes for input 2j (low nibble) and 2j + 1 (high) */
} block_q41;

typedef struct {              /* KIND_Q80: w = d * q */
    lk_half d[STRIP];
    int8_t qs[QK][STRIP];     /* qs[i][c]: column c's code for input i */
} block_q80;

typedef struct {              /* KIND_Q41I: block_q41's bytes, codes grouped for 4-input integer dots */
    lk_half d[STRIP];
    lk_half m[STRIP];
    uint8_t qs[QK / 8][STRIP][4]; /* qs[h][c][j]: column c's codes for input 8h + j (low) and 8h + 4 + j (high) */
} block_q41i;

typedef struct {              /* KIND_Q80I: block_q80's bytes, codes grouped for 4-input integer dots */
    lk_half d[STRIP];
    uint8_t qs[QK / 4][STRIP][4]; /* qs[g][c][j]: column c's code for input 4g + j, plus 128 (unsigned) */
} block_q80i;

#define LK_BLOCK_ASSERTS(T, BYTES, QS)                                                                 \
    _Static_assert(sizeof(T) == (BYTES), #T ": the strip-block's bytes");                               \
    _Static_assert(offsetof(T, d) == 0, #T ": the scales first");                                       \
    _Static_assert(offsetof(T, qs) == (QS), #T ": the codes after the scales (and minima)");
LK_BLOCK_ASSERTS(block_q41, Q41_BLOCK, 2 * 2 * STRIP)
LK_BLOCK_ASSERTS(block_q80, Q80_BLOCK, 2 * STRIP)
LK_BLOCK_ASSERTS(block_q41i, Q41_BLOCK, 2 * 2 * STRIP)
LK_BLOCK_ASSERTS(block_q80i, Q80_BLOCK, 2 * STRIP)
_Static_assert(offsetof(block_q41, m) == 2 * STRIP && offsetof(block_q41i, m) == 2 * STRIP, "Q4_1: minima after d");
_Static_assert(sizeof(((block_q41i *)0)->qs[0]) == STRIP * 4, "an int-layout group: STRIP columns x 4 bytes");
#undef LK_BLOCK_ASSERTS

#endif
