/* AVX2 token-bitmask kernels (built with -mavx2; chosen at run time). */
#include <immintrin.h>
#include <string.h>

#include "grammar/bitset.h"

void gbits_or_avx2(uint32_t *dst, const uint32_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(dst + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_or_si256(a, b));
    }
    for (; i < n; i++)
        dst[i] |= src[i];
}

/* every AVX2 CPU has POPCNT */
__attribute__((target("popcnt"))) size_t gbits_count_avx2(const uint32_t *a, size_t n)
{
    size_t c = 0, i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t x;
        memcpy(&x, a + i, sizeof x);
        c += (size_t)__builtin_popcountll(x);
    }
    for (; i < n; i++)
        c += (size_t)__builtin_popcount(a[i]);
    return c;
}
