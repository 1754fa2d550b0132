/* Integer products for MLX affine weights with AVX2 (kernels.h,
 * tern_iqmatmul_fn): vpmaddubsw multiplies unsigned weight bytes by signed
 * activation bytes into int16 pairs, vpmaddwd widens to int32. 4-bit values
 * (0..15) go in directly; 8-bit ones (0..255) would overflow the int16 pair
 * sums, so they are shifted to q - 128 and multiplied as |q - 128| by
 * sign-adjusted activations, and the exact sum is restored as S + 128 * A.
 * Tokens go in pairs sharing each unpacked weight vector. */
#include <immintrin.h>

#include "tensor/cpu/intdot_simd.h"
#include "tensor/cpu/intdot.h"
#include "tensor/kernels.h"

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))

/* One group of 8-bit weights: s = sum (q - 128) * a (8 lanes) per token. */
static inline __attribute__((always_inline)) void q8_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8((char)0x80);
    __m256i r0 = _mm256_setzero_si256(), r1 = r0;
    for (int i = 0; i < group; i += 32) {
        __m256i ws = _mm256_xor_si256(LD(w + i), x80), aw = _mm256_abs_epi8(ws);
        r0 = _mm256_add_epi32(r0, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(LD(a0 + i), ws)), ones));
        if (two)
            r1 = _mm256_add_epi32(r1,
                                  _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(LD(a1 + i), ws)), ones));
    }
    *s0 = r0;
    *s1 = r1;
}

/* One group of 4-bit weights (packed: byte j = values 2j | 2j+1 << 4): 16
 * bytes broadcast to both lanes, the upper lane shifted by 4, give the low
 * then the high nibbles - the activations' nibble order (kernels.h), so no
 * shuffle. The int16 pair sums (<= 2 * 15 * 127 each, at most 4 added for
 * group 128) stay in int16 until one vpmaddwd per group. */
static inline __attribute__((always_inline)) void q4_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1), m = _mm256_set1_epi8(15), sh = _mm256_setr_epi64x(0, 0, 4, 4);
    __m256i p0 = _mm256_setzero_si256(), p1 = p0;
    for (int i = 0; i < group; i += 32) {
        __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + i / 2)));
        __m256i v = _mm256_and_si256(_mm256_srlv_epi64(b, sh), m);
        p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(v, LD(a0 + i)));
        if (two)
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(v, LD(a1 + i)));
    }
    *s0 = _mm256_madd_epi16(p0, ones);
    *s1 = two ? _mm256_madd_epi16(p1, ones) : p1;
}

/* The natural-order 4-bit unpack this replaced (kept out of the build). */
#if 0
static inline void q4_grp_natural(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                  int group, int two, __m256i *s0, __m256i *s1)
{
    const __m256i ones = _mm256_set1_epi16(1), m = _mm256_set1_epi8(15);
    __m256i p0, p1 = _mm256_setzero_si256();
    if (group == 32) {
        __m128i b = _mm_loadu_si128((const __m128i *)w), m4 = _mm_set1_epi8(15);
        __m128i lo = _mm_and_si128(b, m4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
        __m256i v = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
        p0 = _mm256_maddubs_epi16(v, LD(a0));
        if (two)
            p1 = _mm256_maddubs_epi16(v, LD(a1));
    } else {
        p0 = p1;
        for (int i = 0; i < group; i += 64) {
            __m256i b = LD(w + i / 2), lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
            __m256i u0 = _mm256_unpacklo_epi8(lo, hi), u1 = _mm256_unpackhi_epi8(lo, hi); /* 0-15|32-47, 16-31|48-63 */
            __m256i v0 = _mm256_permute2x128_si256(u0, u1, 0x20), v1 = _mm256_permute2x128_si256(u0, u1, 0x31);
            p0 = _mm256_add_epi16(p0, _mm256_add_epi16(_mm256_maddubs_epi16(v0, LD(a0 + i)),
                                                       _mm256_maddubs_epi16(v1, LD(a0 + i + 32))));
            if (two)
                p1 = _mm256_add_epi16(p1, _mm256_add_epi16(_mm256_maddubs_epi16(v0, LD(a1 + i)),
                                                           _mm256_maddubs_epi16(v1, LD(a1 + i + 32))));
        }
    }
    *s0 = _mm256_madd_epi16(p0, ones);
    *s1 = two ? _mm256_madd_epi16(p1, ones) : p1;
}
#endif

IQ_KERNEL(tern_iq_avx2_q4, 4, q4_grp, iq_nofix)
IQ_KERNEL(tern_iq_avx2_q8, 8, q8_grp, iq_fix128)

void tern_iq_avx2_quant(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs)
{
    iq_quant_act(X, T, n_in, group, bits, Q, qs);
}
