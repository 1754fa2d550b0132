/* AVX-512 kernels (16 f32 lanes): the AVX2 structure at twice the width.
 * Compiled with -mavx512f/bw/vl and only called when the CPU has them.
 * Same contracts as kernels_scalar.c. */
#include <immintrin.h>

#include "tensor/dtype.h"
#include "tensor/kernels.h"

static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ld_bf16(const uint16_t *p)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline float sc_f32(float v) { return v; }

/* Tokens go in pairs that share each loaded weight vector; every token keeps
 * four accumulators (hiding FMA latency) and reduces them in one fixed order,
 * so a row's result is bit-identical whatever else is in the batch - batched
 * decoding then reproduces single-sequence decoding exactly. */
#define AVX512_MATMUL(name, wtype, LD, SC)                                                          \
    static void name(const void *Wv, const float *X, float *Y, long T, long n_in, long ldy,       \
                     long r0, long r1)                                                            \
    {                                                                                             \
        const wtype *W = Wv;                                                                      \
        long n16 = n_in & ~15L, n64 = n_in & ~63L;                                                  \
        for (long r = r0; r < r1; r++) {                                                          \
            const wtype *w = W + r * n_in;                                                        \
            for (long t0 = 0; t0 < T; t0 += 2) {                                                  \
                int two = t0 + 1 < T;                                                             \
                const float *x0 = X + t0 * n_in, *x1 = two ? x0 + n_in : x0;                      \
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                       \
                __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                        \
                long i = 0;                                                                       \
                if (two) {                                                                        \
                    for (; i < n64; i += 64) {                                                    \
                        __m512 w0 = LD(w + i), w1 = LD(w + i + 16);                                \
                        __m512 w2 = LD(w + i + 32), w3 = LD(w + i + 48);                          \
                        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x0 + i), a0);                    \
                        b0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x1 + i), b0);                    \
                        a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x0 + i + 16), a1);                \
                        b1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x1 + i + 16), b1);                \
                        a2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x0 + i + 32), a2);               \
                        b2 = _mm512_fmadd_ps(w2, _mm512_loadu_ps(x1 + i + 32), b2);               \
                        a3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x0 + i + 48), a3);               \
                        b3 = _mm512_fmadd_ps(w3, _mm512_loadu_ps(x1 + i + 48), b3);               \
                    }                                                                             \
                    for (; i < n16; i += 16) {                                                      \
                        __m512 w0 = LD(w + i);                                                    \
                        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x0 + i), a0);                    \
                        b0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x1 + i), b0);                    \
                    }                                                                             \
                } else {                                                                          \
                    for (; i < n64; i += 64) {                                                    \
                        a0 = _mm512_fmadd_ps(LD(w + i), _mm512_loadu_ps(x0 + i), a0);             \
                        a1 = _mm512_fmadd_ps(LD(w + i + 16), _mm512_loadu_ps(x0 + i + 16), a1);     \
                        a2 = _mm512_fmadd_ps(LD(w + i + 32), _mm512_loadu_ps(x0 + i + 32), a2);   \
                        a3 = _mm512_fmadd_ps(LD(w + i + 48), _mm512_loadu_ps(x0 + i + 48), a3);   \
                    }                                                                             \
                    for (; i < n16; i += 16)                                                        \
                        a0 = _mm512_fmadd_ps(LD(w + i), _mm512_loadu_ps(x0 + i), a0);             \
                }                                                                                 \
                float s0 = hsum16(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));    \
                float s1 = hsum16(_mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));    \
                for (; i < n_in; i++) {                                                           \
                    float wf = SC(w[i]);                                                          \
                    s0 += wf * x0[i];                                                             \
                    s1 += wf * x1[i];                                                             \
                }                                                                                 \
                Y[t0 * ldy + r] = s0;                                                             \
                if (two)                                                                          \
                    Y[(t0 + 1) * ldy + r] = s1;                                                   \
            }                                                                                     \
        }                                                                                         \
    }

AVX512_MATMUL(matmul_f32, float, ld_f32, sc_f32)
AVX512_MATMUL(matmul_bf16, uint16_t, ld_bf16, tern_bf16_to_f32)
AVX512_MATMUL(matmul_f16, uint16_t, ld_f16, tern_f16_to_f32)

static float dot(const float *a, const float *b, long n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), a0);
    float acc = hsum16(_mm512_add_ps(a0, a1));
    for (; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, long n)
{
    __m512 av = _mm512_set1_ps(a);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static const tern_kernels k_avx512 = {"avx512", matmul_f32, matmul_bf16, matmul_f16, dot, axpy};

const tern_kernels *tern_kernels_avx512_table(void);
const tern_kernels *tern_kernels_avx512_table(void) { return &k_avx512; }
