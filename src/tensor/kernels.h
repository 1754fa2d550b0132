/* CPU compute kernels behind one table, chosen once at start-up from the CPU's
 * features (ggml's arch-fallback idea): scalar reference, AVX2+FMA, AVX-512.
 * The scalar versions are the specification; tests compare the others to it. */
#ifndef TERN_TENSOR_KERNELS_H
#define TERN_TENSOR_KERNELS_H

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

typedef struct tern_kernels {
    const char *isa; /* "scalar", "avx2", "avx512" */
    tern_matmul_fn matmul_f32;
    tern_matmul_fn matmul_bf16;
    tern_matmul_fn matmul_f16;
    tern_qmatmul_fn matmul_q4;
    tern_qmatmul_fn matmul_q8;
    float (*dot)(const float *a, const float *b, long n);
    void (*axpy)(float a, const float *x, float *y, long n); /* y += a * x */
} tern_kernels;

/* The best table for this CPU (honours TERN_ISA=scalar|avx2|avx512 in the
 * environment to force one, for tests and benchmarks). Never NULL. */
const tern_kernels *tern_kernels_best(void);
const tern_kernels *tern_kernels_scalar(void);
/* NULL when not compiled in or not supported by this CPU. */
const tern_kernels *tern_kernels_avx2(void);
const tern_kernels *tern_kernels_avx512(void);

#endif
