/* Scalar token-bitmask kernels and the run-time choice of the fast ones. */
#include "grammar/bitset.h"
#include "base/cpu.h"

void gbits_or_scalar(uint32_t *dst, const uint32_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] |= src[i];
}

size_t gbits_count_scalar(const uint32_t *a, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x = a[i];
        x = x - ((x >> 1) & 0x55555555u);
        x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
        x = (x + (x >> 4)) & 0x0F0F0F0Fu;
        c += (x * 0x01010101u) >> 24;
    }
    return c;
}

static int use_avx2(void)
{
    static int v = -1;
    if (v < 0)
        v = tern_cpu()->avx2 ? 1 : 0;
    return v;
}

void gbits_or(uint32_t *dst, const uint32_t *src, size_t n)
{
    if (use_avx2())
        gbits_or_avx2(dst, src, n);
    else
        gbits_or_scalar(dst, src, n);
}

size_t gbits_count(const uint32_t *a, size_t n)
{
    return use_avx2() ? gbits_count_avx2(a, n) : gbits_count_scalar(a, n);
}
