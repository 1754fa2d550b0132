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

typedef struct tern_kernels {
    const char *isa; /* "scalar", "avx2", "avx512" */
    tern_matmul_fn matmul_f32;
    tern_matmul_fn matmul_bf16;
    tern_matmul_fn matmul_f16;
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
