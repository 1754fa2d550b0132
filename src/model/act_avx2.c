/* The gate's SiLU on AVX2 + FMA (forward.c, model_int.h):
 * g[i] = g[i] / (1 + e^-g[i]) * u[i], eight at a time with exp8
 * (vexp_avx2.h, ~1 ulp); the last n % 8 through the same vector code, so
 * an element's bits do not depend on where a part of the pool starts.
 * Compiled with -mavx2 -mfma -mf16c (CMake, by the file name); called only
 * when the CPU has them. */
#include "model/model_int.h"
#include "model/vexp_avx2.h"

static inline __m256 silu8(__m256 x)
{
    __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
    return _mm256_div_ps(x, d);
}

void model_silu_mul_avx2(float *g, const float *u, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
    for (; i < n; i++)
        g[i] = _mm256_cvtss_f32(_mm256_mul_ps(silu8(_mm256_set1_ps(g[i])), _mm256_set1_ps(u[i])));
}
