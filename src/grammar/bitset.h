/* Token-bitmask kernels of the mask hot path: OR a cached set into the
 * mask, count the allowed ids. A scalar reference plus an AVX2 version
 * chosen at start-up (bitset_avx2.c); tests compare the two. */
#ifndef TERN_GRAMMAR_BITSET_H
#define TERN_GRAMMAR_BITSET_H

#include <stddef.h>
#include <stdint.h>

/* dst[i] |= src[i] for i < n */
void gbits_or(uint32_t *dst, const uint32_t *src, size_t n);
/* number of set bits in a[0..n) */
size_t gbits_count(const uint32_t *a, size_t n);

/* the scalar references (always available) */
void gbits_or_scalar(uint32_t *dst, const uint32_t *src, size_t n);
size_t gbits_count_scalar(const uint32_t *a, size_t n);
/* the AVX2 versions (call only when the CPU has AVX2) */
void gbits_or_avx2(uint32_t *dst, const uint32_t *src, size_t n);
size_t gbits_count_avx2(const uint32_t *a, size_t n);

#endif
