/* The horizontal sum of 8 f32 lanes in one fixed order (lanes i and i + 4,
 * then those pairs' halves), shared by the AVX2 kernel files - every one
 * compiled with -mavx2. */
#ifndef TERN_TENSOR_CPU_HSUM_AVX2_H
#define TERN_TENSOR_CPU_HSUM_AVX2_H

#include <immintrin.h>

static inline float hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

#endif
