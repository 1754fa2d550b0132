/* Scalar reference kernels: the specification the SIMD kernels are tested
 * against. Plain loops, f32 accumulation in index order. */
#include "tensor/kernels.h"

#include "tensor/dtype.h"

#define SCALAR_MATMUL(name, wtype, load)                                                          \
    static void name(const void *Wv, const float *X, float *Y, long T, long n_in, long ldy,       \
                     long r0, long r1)                                                            \
    {                                                                                             \
        const wtype *W = Wv;                                                                      \
        for (long r = r0; r < r1; r++) {                                                          \
            const wtype *w = W + r * n_in;                                                        \
            for (long t = 0; t < T; t++) {                                                        \
                const float *x = X + t * n_in;                                                    \
                float acc = 0.0f;                                                                 \
                for (long i = 0; i < n_in; i++)                                                   \
                    acc += load(w[i]) * x[i];                                                     \
                Y[t * ldy + r] = acc;                                                             \
            }                                                                                     \
        }                                                                                         \
    }

#define LOAD_F32(v) (v)
SCALAR_MATMUL(matmul_f32, float, LOAD_F32)
SCALAR_MATMUL(matmul_bf16, uint16_t, tern_bf16_to_f32)
SCALAR_MATMUL(matmul_f16, uint16_t, tern_f16_to_f32)

static float dot(const float *a, const float *b, long n)
{
    float acc = 0.0f;
    for (long i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, long n)
{
    for (long i = 0; i < n; i++)
        y[i] += a * x[i];
}

static const tern_kernels k_scalar = {"scalar", matmul_f32, matmul_bf16, matmul_f16, dot, axpy};

const tern_kernels *tern_kernels_scalar(void) { return &k_scalar; }
