/* Integer products for MLX affine weights with AVX-512 VNNI (kernels.h,
 * tern_iqmatmul_fn): vpdpbusd multiplies unsigned weight bytes (4-bit
 * 0..15 or 8-bit 0..255, both as stored) by signed activation bytes and adds
 * each 4 products into int32 without saturation, so 8-bit weights need no
 * sign trick. 64 weights per instruction; a group of 32 uses the 256-bit
 * form. The reduction and f32 combination are intdot_simd.h's, shared with
 * AVX2, so the bits are the scalar reference's. */
#include <immintrin.h>

#include "tensor/cpu/intdot_simd.h"
#include "tensor/cpu/intdot.h"
#include "tensor/kernels.h"

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))
#define LDZ(p) _mm512_loadu_si512((const void *)(p))

static inline __m256i fold(__m512i z)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
}

static inline __attribute__((always_inline)) void q8_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    if (group == 32) {
        __m256i v = LD(w), z = _mm256_setzero_si256();
        *s0 = _mm256_dpbusd_epi32(z, v, LD(a0));
        *s1 = two ? _mm256_dpbusd_epi32(z, v, LD(a1)) : z;
        return;
    }
    __m512i r0 = _mm512_setzero_si512(), r1 = r0;
    for (int i = 0; i < group; i += 64) {
        __m512i v = LDZ(w + i);
        r0 = _mm512_dpbusd_epi32(r0, v, LDZ(a0 + i));
        if (two)
            r1 = _mm512_dpbusd_epi32(r1, v, LDZ(a1 + i));
    }
    *s0 = fold(r0);
    *s1 = fold(r1);
}

/* 4-bit: byte j holds values 2j (low nibble) and 2j+1; each 16 bytes go to
 * two 128-bit lanes, the second shifted by 4, which gives the low then the
 * high nibbles of 32 values - the activations' nibble order (kernels.h). */
static inline __attribute__((always_inline)) void q4_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    if (group == 32) {
        __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w)), z = _mm256_setzero_si256();
        __m256i v = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
        *s0 = _mm256_dpbusd_epi32(z, v, LD(a0));
        *s1 = two ? _mm256_dpbusd_epi32(z, v, LD(a1)) : z;
        return;
    }
    const __m512i m = _mm512_set1_epi8(15), sh = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    __m512i r0 = _mm512_setzero_si512(), r1 = r0;
    for (int i = 0; i < group; i += 64) {
        __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w + i / 2)));
        z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128((const __m128i *)(w + i / 2 + 16)));
        __m512i v = _mm512_and_si512(_mm512_srlv_epi64(z, sh), m);
        r0 = _mm512_dpbusd_epi32(r0, v, LDZ(a0 + i));
        if (two)
            r1 = _mm512_dpbusd_epi32(r1, v, LDZ(a1 + i));
    }
    *s0 = fold(r0);
    *s1 = fold(r1);
}

IQ_KERNEL(tern_iq_vnni_q4, 4, q4_grp, iq_nofix)
IQ_KERNEL(tern_iq_vnni_q8, 8, q8_grp, iq_nofix)
