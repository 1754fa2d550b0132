/* CPU compute kernels behind one table, chosen once at start-up from the CPU's
 * features (ggml's arch-fallback idea): scalar reference, AVX2+FMA, AVX-512.
 * The scalar versions are the specification; tests compare the others to it. */
#ifndef TERN_TENSOR_KERNELS_H
#define TERN_TENSOR_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Matrix product against a row-major weight W [n_out][n_in]:
 *   Y[t*ldy + r] = sum_i W[r*n_in + i] * X[t*n_in + i]
 * for tokens t in [0, T) and output rows r in [r0, r1). Each weight row is
 * read once for all T tokens, so decode (T = 1) streams W at memory speed
 * and prefill reuses each row from cache. Accumulation is in f32. */
typedef void (*tern_matmul_fn)(const void *W, const float *X, float *Y, long T, long n_in, long ldy,
                               long r0, long r1);

/* The same product against an MLX affine-quantized weight: row r's values
 * q (4 or 8 bits, packed little-endian in bytes: for 4 bits, byte j holds
 * value 2j in its low nibble and 2j+1 in its high one) dequantize per group
 * of `group` consecutive inputs as w = scale * q + bias, with
 * sb[(r * n_groups + g) * 2 + {0, 1}] = {scale, bias}. The kernels use
 *   y = sum_g scale_g * (sum_{i in g} q_i x_i) + bias_g * xsum[t][g]
 * where xsum[t * n_groups + g] is the sum of token t's inputs in group g
 * (computed once per matrix by the caller). n_in is a multiple of group,
 * and group one of 32, 64, 128. Same batch invariance as tern_matmul_fn. */
typedef void (*tern_qmatmul_fn)(const uint8_t *Wq, const float *sb, int group, const float *X, const float *xsum,
                                float *Y, long T, long n_in, long ldy, long r0, long r1);

/* ---- Integer products for MLX affine weights (the default for quantized
 * weights; the f32 tern_qmatmul_fn above is the exact reference, selected
 * with tern_kernels_exact_set). The activations are quantized once per
 * product, per token and per block of B = tern_iq_ablock(group, bits)
 * inputs - 32 for 8-bit weights whatever their group (llama.cpp's Q8_0
 * blocks: blocks of 64 added 2.8e-4 nats of KL on tern-demo,
 * docs/benchmarks.md), the weight's group for 4-bit ones:
 *   d = max|x| / 127, q_i = round-half-even(x_i * (127 / max|x|)) in
 *   [-127, 127], A = sum q_i
 * (a block whose max|x| is below 1e-30 gets d = 0, q = 0; NaN inputs give
 * unspecified values).
 * Layout: Q[t * n_in + i] int8 - for bits 4 in nibble order, each 32 inputs
 * stored as their 16 even ones then their 16 odd ones (the order of the
 * packed weights' low then high nibbles, so a 16-byte weight load meets its
 * activations without shuffles); for bits 8 in input order.
 * qs[t * 2 * nbp + b] = d and qs[t * 2 * nbp + nbp + b] = (float)A of block
 * b, where nbp = tern_iq_nbp(n_in, group, bits) (n_in / B rounded up to a
 * multiple of 8) and the padding is zero. Weights of different groups
 * whose B and bits agree share one quantized input. */
typedef void (*tern_quant_act_fn)(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs);

/* The integer product against the same weight layout as tern_qmatmul_fn,
 * with Q quantized for its group and bits. For row r and token t, with
 * I_b = sum_{i in b} w_i * q_i over activation block b (B inputs, exact
 * int32; q_i the activation of input i), sw/bw the {scale, bias} of the
 * weight group holding block b (group b * B / group: a group of 64 is two
 * blocks of 8-bit activations, each with its own d and A) and d/A block b's:
 *   u_b = fma(sw, (float)I_b, bw * A_b); acc[b % 8] = fma(u_b, d_b, acc[b % 8])
 * over b = 0 .. nbp - 1 in order (padding blocks have I, sw, bw, d, A = 0),
 * from acc = 0, then Y = ((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7)).
 * Every table computes exactly these bits (the SIMD kernels only differ in
 * how they obtain the exact integer sums), so results are identical across
 * ISAs and batch invariance holds by construction. */
typedef void (*tern_iqmatmul_fn)(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs,
                                 float *Y, long T, long n_in, long ldy, long r0, long r1);

/* The one-token integer product (T = 1, Y[r] for r in [r0, r1)) with the
 * {scale, bias} pairs as bf16: sb16[(r * n_groups + g) * 2 + {0, 1}], the
 * very values of tern_iqmatmul_fn's sb where the model's file stores bf16
 * scales. They widen to f32 exactly, so the bits are tern_iqmatmul_fn's;
 * decode, which streams the pairs with the weights, reads half their bytes
 * (4-bit weights with groups of 64: 4.5 bits a weight instead of 5). For
 * groups of 64 and 128 and n_in up to TERN_IQ16_MAX_IN (the kernels keep a
 * rearranged copy of the inputs on the stack). */
#define TERN_IQ16_MAX_IN 16384
typedef void (*tern_iqmatmul16_fn)(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q,
                                   const float *qs, float *Y, long n_in, long r0, long r1);

/* bf16 weights times bf16 activations (the default for bf16 weights where
 * the table has it; --exact-products keeps the f32 activations of
 * tern_matmul_fn): Xb[t * n_in + i] is X rounded to bf16 (tern_bf16_act),
 * every product w_i * x_i is exact in f32 and the sum is an f32 sum in an
 * order fixed per (row, token) - not the reference's index order, so the
 * tests allow f32 reordering - and never depends on T or [r0, r1) (batch
 * invariance as tern_matmul_fn). */
typedef void (*tern_bmatmul_fn)(const void *W, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0,
                                long r1);
/* X[0 .. n) to bf16, round to nearest even (tern_f32_to_bf16's bits). */
typedef void (*tern_bf16_act_fn)(const float *X, long n, uint16_t *Xb);
/* Tile products (AMX-BF16): a bf16 weight rearranged once, at load, into
 * blocks of 16 rows (the last padded with zero rows), a block n_in / 2
 * lines of 16 rows x 2 inputs: Wt[((b * n_in / 2 + p) * 16 + n) * 2 + j] =
 * W[(16 * b + n) * n_in + 2 * p + j] - a line of 32 inputs of 16 rows is
 * one 1 KB tile, read in one stream. matmul_bf16t takes Wt for W (and the
 * plain bf16 inputs Xb) with tern_bmatmul_fn's contract: its fixed
 * per-(row, token) order is the tile instruction's chain over 32 inputs at
 * a time from zero, the same at every token count and row range (TDPBF16PS
 * adds its 32 products with its own internal rounding, which no vector
 * sequence reproduces: a weight with tiles takes them for every T, decode
 * included). n_in a multiple of 32 only (tern_bf16t_ok). */
size_t tern_bf16_tiles_len(long n_out, long n_in); /* uint16_t elements of Wt */
/* Blocks [b0, b1) of Wt from W [n_out][n_in] (parts may run in parallel). */
void tern_bf16_tiles_make(const uint16_t *W, long n_out, long n_in, uint16_t *Wt, long b0, long b1);
/* Tile integer products (AMX-INT8): the quantized inputs (tern_quant_act_fn's
 * Q and qs) rearranged for them, tokens in blocks of 16 (the last padded
 * with zeros): Qp[(b * n_in / 4 + p) * 64 + 4 * n + j] = Q[(16 * b + n) *
 * n_in + 4 * p + j] and qsp[(b * 2 * nbp + g) * 16 + n] = qs[(16 * b + n) *
 * 2 * nbp + g] (nbp: tern_iq_nbp, passed as ngp), so that the block of
 * token t (a multiple of 16) starts at Qp + t * n_in and qsp + t * 2 * nbp.
 * imatmul_q4p / q8p take them for Q and qs with tern_iqmatmul_fn's contract
 * - the same bits as every table - for 8-bit weights of any group and
 * 4-bit ones in groups of 64 and 128 (tern_iqp_ok). One call packs the
 * 4-byte words [p0, p1) of every block (parts of a product run in parallel
 * over disjoint ranges; 0 .. n_in / 4 is all), and the call with p0 == 0
 * the scales too. */
typedef void (*tern_i8_pack_fn)(const int8_t *Q, const float *qs, long T, long n_in, long ngp, int8_t *Qp,
                                float *qsp, long p0, long p1);

/* Integer weights as panels (imatmul_q4w / q8w: the AVX2 and AVX-512
 * tables, not AMX's): an MLX affine weight rearranged once, at load, so that a
 * product of any token count reads it in one sequential stream and no
 * product rearranges it again. With B = tern_iq_ablock(group, bits), nb =
 * n_in / B blocks a row, chunks of 8 blocks (nbp = tern_iq_ngp(nb) / 8
 * chunks, the last padded with zero blocks), nv = B / 4 words a block and
 * nw = nv (8-bit) or nv / 2 (4-bit) 32-byte vectors a row and chunk: rows
 * in quads (the last padded with zero rows), each quad its chunks in
 * order, a chunk
 *   pair 0 (quad rows 0, 1): nw lines of 64 bytes, line k = row 0's vector
 *     k, then row 1's;
 *   pair 1 (rows 2, 3): the same;
 *   the 4 rows' {scale, bias} pairs of the chunk's groups (8 / rep a row,
 *     rep = group / B; scale | bias << 16 as sb16 has them, zero past the
 *     row's groups), row after row, padded to 64 bytes;
 * where 4-byte lane j of row vector k holds word k of block 8c + j of the
 * row as stored (zero past nb) - for 4-bit weights a packed word, whose
 * low nibbles meet the inputs of panel vector 2k and high ones 2k + 1. The
 * product takes P for the weight (the pairs as bf16: weights with sb16
 * only) and the inputs rearranged once per product by iq_panel_acts (A:
 * token t's tern_iq_panel_span bytes at A + t * span; lane j of its
 * vector v of chunk c the 4 inputs of block 8c + j that weight vector v's
 * lane meets), with tern_iqmatmul_fn's contract otherwise: the same bits
 * as every table. tern_iq_panels_ok: the groups it takes. */
typedef void (*tern_iqpanel_fn)(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T,
                                long n_in, long ldy, long r0, long r1);
/* Q (tern_quant_act_fn's, T tokens) as the panel products' A. */
typedef void (*tern_iq_pacts_fn)(const int8_t *Q, long T, long n_in, int group, int bits, int8_t *A);
size_t tern_iq_panels_len(long n_out, long n_in, int group, int bits); /* bytes of P */
/* Quads [q0, q1) of P from Wq and sb16 (parts may run in parallel). */
void tern_iq_panels_make(const uint8_t *Wq, const uint16_t *sb16, long n_out, long n_in, int group, int bits,
                         uint8_t *P, long q0, long q1);

/* The product against an FP8 E4M3 weight with f32 block scales (model_weight's
 * fs layout): row r's scale for inputs [c * fs_cols, (c + 1) * fs_cols) is
 * fs[(r / fs_rows) * ncol + c], ncol = ceil(n_in / fs_cols), and
 *   Y = sum over c in order of fs_c * P_c,  P_c = sum_{i in block c} e4m3(W_i) * X_i
 * with P_c an f32 sum in an order fixed per (row, token) (the tests allow f32
 * reordering against the index order) - never depending on T or [r0, r1).
 * fs_cols is n_in or a multiple of 32. Activations stay f32: the exact
 * reference and the CPU's only FP8 path. The NaN codes (0x7f, 0xff) are not
 * weights (quantizers never write them): the SIMD kernels read them as
 * +-480, the reference as NaN. */
typedef void (*tern_f8matmul_fn)(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y,
                                 long T, long n_in, long ldy, long r0, long r1);

/* The product against an MXFP4 weight (OCP microscaling FP4, gpt-oss's
 * experts): row r's inputs 2i and 2i + 1 are the low and high nibble of byte
 * W[r * n_in / 2 + i], each an FP4 E2M1 code, and E[r * n_in / 32 + b] is
 * the E8M0 scale of its block b of 32 inputs: w = e2m1 * 2^(E - 127). With
 * v = 2 * e2m1, an integer in [-12, 12] (tern_mx_v2),
 *   Y = sum over b in order of 2^(E_b - 128) * P_b,  P_b = sum_{i in b} v_i * X_i
 * with P_b an f32 sum in an order fixed per (row, token) (the tests allow f32
 * reordering against the reference's index order) - never depending on T or
 * [r0, r1). n_in is a multiple of 32. Activations stay f32: the exact
 * reference and the CPU's only MXFP4 path. */
typedef void (*tern_mxmatmul_fn)(const uint8_t *W, const uint8_t *E, const float *X, float *Y, long T, long n_in,
                                 long ldy, long r0, long r1);

/* The integer MXFP4 product (the default; tern_mxmatmul_fn is the exact
 * reference, --exact-products): the inputs quantized by tern_quant_act_fn
 * with group 32 and bits 4 (blocks of 32, each block's 16 even inputs then
 * its 16 odd ones - the codes' low then high nibbles; qs with nbp =
 * tern_iq_nbp(n_in, 32, 4)). For row r and token t, with I_b = sum_{i in b}
 * v_i * q_i over block b (v = twice the E2M1 value; exact int32) and d_b
 * the block's activation scale:
 *   u_b = 2^(E_b - 128) * (float)I_b;  acc[b % 8] = fma(u_b, d_b, acc[b % 8])
 * over b = 0 .. nbp - 1 in order (padding blocks: u, d = 0), from acc = 0,
 * then Y = ((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7)) - the
 * same bits on every table (tern_iqmatmul_fn's combination with a zero
 * bias). */
typedef void (*tern_imxmatmul_fn)(const uint8_t *W, const uint8_t *E, const int8_t *Q, const float *qs, float *Y,
                                  long T, long n_in, long ldy, long r0, long r1);

/* The same with int16 activations (MXFP4 weights whose inputs are too
 * heavy-tailed for int8: gpt_oss's down products). tern_quant_act16_fn:
 * per token and block of 32 inputs, d = max|x| / 32767, q_i =
 * round-half-even(x_i * (32767 / max|x|)) (a block whose max|x| is below
 * 1e-30 gets d = 0, q = 0; NaN inputs give unspecified values), stored in the 4-bit nibble order
 * (each block's 16 even inputs, then its 16 odd ones), d at qs[t * 2 * nbp +
 * b] (nbp = tern_iq_nbp(n_in, 32, 4); the other nbp floats and the padding
 * are zero). tern_imx16matmul_fn: tern_imxmatmul_fn's combination with I_b
 * = sum v_i * q_i over these int16 q (exact: |I_b| < 2^24, so (float)I_b is
 * exact too). */
typedef void (*tern_quant_act16_fn)(const float *X, long T, long n_in, int16_t *Q, float *qs);
typedef void (*tern_imx16matmul_fn)(const uint8_t *W, const uint8_t *E, const int16_t *Q, const float *qs, float *Y,
                                    long T, long n_in, long ldy, long r0, long r1);

/* Twice the E2M1 value of code c (0..15): 0, 1, 2, 3, 4, 6, 8, 12, then the
 * same negated (code 8, -0, gives 0). */
static inline int tern_mx_v2(unsigned c)
{
    static const signed char v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return v[c & 15];
}

/* 2^(e - 128), exactly, for an E8M0 byte e (the scale of twice the E2M1
 * value): the f32 with exponent field e - 1, or the subnormals 2^-127 and
 * 2^-128 for e = 1, 0. */
static inline float tern_mx_scale(unsigned e)
{
    if (e < 2)
        return e ? 0x1p-127f : 0x1p-128f;
    union {
        uint32_t u;
        float f;
    } b = {(uint32_t)(e - 1) << 23};
    return b.f;
}

typedef struct tern_kernels {
    const char *isa; /* "scalar", "avx2", "avx512", "amx" (avx512 with AMX tile products) */
    tern_matmul_fn matmul_f32;
    tern_matmul_fn matmul_bf16;
    tern_matmul_fn matmul_f16;
    tern_qmatmul_fn matmul_q4;
    tern_qmatmul_fn matmul_q8;
    tern_quant_act_fn quant_act;
    tern_iqmatmul_fn imatmul_q4;
    tern_iqmatmul_fn imatmul_q8;
    tern_bmatmul_fn matmul_bf16b; /* NULL: no bf16 dot-product instruction (f32 activations stay) */
    tern_bf16_act_fn bf16_act;
    float (*dot)(const float *a, const float *b, long n);
    void (*axpy)(float a, const float *x, float *y, long n); /* y += a * x */
    tern_bmatmul_fn matmul_bf16t; /* bf16 weights as tiles (tern_bf16_tiles_make); NULL: none (matmul_bf16b) */
    tern_i8_pack_fn i8_pack;      /* NULL: no integer tile products */
    tern_iqmatmul_fn imatmul_q4p;
    tern_iqmatmul_fn imatmul_q8p;
    tern_iqmatmul16_fn imatmul_q4h; /* bf16 scale pairs, one token; NULL: use imatmul_q4 with sb */
    tern_iqmatmul16_fn imatmul_q8h;
    int dense_blocked; /* the dense f32-input products and matmul_f8 block inputs and rows for L1 themselves (the
                          caller may hand them large blocks); 0: the caller keeps a block's rows and inputs
                          cache-sized */
    tern_f8matmul_fn matmul_f8; /* FP8 weights (every table) */
    tern_mxmatmul_fn matmul_mxfp4; /* MXFP4 weights, f32 activations (every table) */
    tern_imxmatmul_fn imatmul_mxfp4; /* MXFP4 weights, int8 activations (every table) */
    tern_quant_act16_fn quant_act16;     /* int16 activations (every table) */
    tern_imx16matmul_fn imatmul_mxfp4_16; /* MXFP4 weights, int16 activations (every table) */
    tern_iqpanel_fn imatmul_q4w; /* weights as panels (tern_iq_panels_make); NULL: none */
    tern_iqpanel_fn imatmul_q8w;
    tern_iq_pacts_fn iq_panel_acts; /* with imatmul_q4w / q8w */
} tern_kernels;

/* Whether a product of T tokens against a quantized weight of this group
 * and bits goes through k's integer tile products (the same bits either
 * way: the choice may depend on T). */
static inline int tern_iqp_ok(const tern_kernels *k, int group, int bits, long T)
{
    return k->i8_pack && (bits == 8 || group % 64 == 0) && T >= 8;
}

/* Whether k's tile product takes a bf16 matrix n_in wide (decided once, at
 * load: a matrix with tiles takes them for every call). */
static inline int tern_bf16t_ok(const tern_kernels *k, long n_in) { return k->matmul_bf16t && n_in % 32 == 0; }

/* Blocks or groups padded to a multiple of 8 (the qs layout above). */
static inline long tern_iq_ngp(long n_groups) { return (n_groups + 7) & ~7L; }
/* The activation block of the integer products (tern_quant_act_fn). */
static inline int tern_iq_ablock(int group, int bits) { return bits == 8 ? 32 : group; }
/* d (or A) entries a token's qs holds: the blocks of n_in padded to 8. */
static inline long tern_iq_nbp(long n_in, int group, int bits)
{
    return tern_iq_ngp(n_in / tern_iq_ablock(group, bits));
}

/* Whether k's panel product takes a quantized weight of this group, bits
 * and width (decided once, at load: a weight with panels takes them for
 * every call). */
static inline int tern_iq_panels_ok(const tern_kernels *k, int group, int bits, long n_in)
{
    int B = tern_iq_ablock(group, bits);
    return (bits == 8 ? k->imatmul_q8w : k->imatmul_q4w) && k->iq_panel_acts && group % 32 == 0 &&
           (B == 32 || B == 64 || B == 128) && n_in % group == 0;
}

/* The panels' shape (tern_iq_panels_make): 32-byte vectors a row and chunk
 * (a block's words: 8-bit, or 4-bit packed), a chunk's bytes (its two row
 * pairs' lines, then the pairs' words padded to 64), a token's inputs
 * (tern_iqpanel_fn's A). */
static inline long tern_iq_panel_nw(int group, int bits) { return tern_iq_ablock(group, bits) * bits / 32; }
static inline long tern_iq_panel_cb(int group, int bits)
{
    long rep = group / tern_iq_ablock(group, bits);
    return 2 * tern_iq_panel_nw(group, bits) * 64 + (128 / rep + 63) / 64 * 64;
}
static inline long tern_iq_panel_span(long n_in, int group, int bits)
{
    return tern_iq_nbp(n_in, group, bits) * tern_iq_ablock(group, bits);
}

/* The f32-activation products (--exact-products) instead of the integer ones
 * for quantized weights, in CPU backends created after the call. Off by
 * default; process-wide, set once at start-up. */
void tern_kernels_exact_set(int on);
int tern_kernels_exact_get(void);

/* The FP8 scalar reference (kernels_scalar.c), for tables without their own. */
void tern_matmul_f8_scalar(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                           long n_in, long ldy, long r0, long r1);

/* The MXFP4 scalar reference (kernels_scalar.c). */
void tern_matmul_mxfp4_scalar(const uint8_t *W, const uint8_t *E, const float *X, float *Y, long T, long n_in, long ldy,
                              long r0, long r1);

/* The best table for this CPU (honours TERN_ISA=scalar|avx2|avx512|amx in the
 * environment to force one, for tests and benchmarks). Never NULL. */
const tern_kernels *tern_kernels_best(void);
const tern_kernels *tern_kernels_scalar(void);
/* The scalar reference of tern_bmatmul_fn (index-order f32 sum of the exact
 * products), for tests: no table uses it, since without a bf16 dot-product
 * instruction rounding the activations would only cost accuracy. */
void tern_matmul_bf16b_ref(const void *W, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0,
                           long r1);
/* NULL when not compiled in or not supported by this CPU. */
const tern_kernels *tern_kernels_avx2(void);
const tern_kernels *tern_kernels_avx512(void);
/* AVX-512 with the integer products on AMX-INT8 tiles and, where the CPU
 * has AMX-BF16, the bf16 weights' products on tiles ("amx"): NULL where
 * the CPU or the OS does not give the tiles. */
const tern_kernels *tern_kernels_amx(void);

#endif
