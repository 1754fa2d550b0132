/* Integer products for MLX affine weights with AVX-512 VNNI (kernels.h,
 * tern_iqmatmul_fn): vpdpbusd multiplies unsigned weight bytes (4-bit
 * 0..15 or 8-bit 0..255, both as stored) by signed activation bytes and adds
 * each 4 products into int32 without saturation, so 8-bit weights need no
 * sign trick. 64 weights per instruction; a group of 32 uses the 256-bit
 * form. The reduction and f32 combination are intdot_simd.h's, shared with
 * AVX2, so the bits are the scalar reference's. */
#include <immintrin.h>
#include <stdlib.h>

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

static void vnni_q4_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
static void vnni_q8_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
IQ_KERNEL(vnni_q4_rows, 4, q4_grp, iq_nofix)
IQ_KERNEL(vnni_q8_rows, 8, q8_grp, iq_nofix)

/* ---- Panels for several tokens (prefill, batches): the per-group
 * horizontal sums cost more than vpdpbusd itself, so for T >= IQ_PANEL_MIN_T
 * each weight row and the inputs are rearranged once per call so that
 * 32-bit lane j of every 256-bit vector holds 4 bytes of group 8c + j:
 * vpdpbusd then accumulates each group's exact sum in its own lane, and the
 * 8 lanes are the I_g of the contract with no reduction at all. The bits are
 * the same as the row kernels' (exact integer sums, same combination), so
 * batch invariance holds. A chunk c of 8 groups is group/4 vectors; vector v
 * takes word `off(v)` of each group's bytes: 8-bit weights and inputs word v;
 * 4-bit weights packed word v/2, low nibbles for even v and high for odd,
 * and the inputs (nibble order, kernels.h) the matching word. */
static void panel_product(const uint8_t *Wq, const float *sb, int group, int bits, const int8_t *Q, const float *qs,
                          float *Y, long T, long n_in, long ldy, long r0, long r1, int8_t *A, uint8_t *Wp)
{
    long ng = n_in / group, ngp = tern_iq_ngp(ng), nv = group / 4, span = ngp * group;
    for (long t = 0; t < T; t++)
        panel_acts(Q + t * n_in, group, bits, ng, ngp, A + t * span);
    for (long r = r0; r < r1; r++) {
        panel_row(Wq + r * n_in * bits / 8, group, bits, ng, ngp, Wp);
        const float *s = sb + r * ng * 2;
        for (long t0 = 0; t0 < T; t0 += 4) {
            long t[4];
            for (int i = 0; i < 4; i++)
                t[i] = t0 + i < T ? t0 + i : T - 1; /* a short last quad repeats its last token */
            const int8_t *a0 = A + t[0] * span, *a1 = A + t[1] * span, *a2 = A + t[2] * span, *a3 = A + t[3] * span;
            __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
            for (long c = 0; c < ngp / 8; c++) {
                /* two accumulators per token (even and odd vectors): eight
                 * vpdpbusd chains in flight hide its latency */
                __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, u0 = s0, u1 = s0, u2 = s0, u3 = s0;
                for (long v = c * nv; v < (c + 1) * nv; v += 2) {
                    __m256i wv = LD(Wp + v * 32), wu = LD(Wp + v * 32 + 32);
                    s0 = _mm256_dpbusd_epi32(s0, wv, LD(a0 + v * 32));
                    s1 = _mm256_dpbusd_epi32(s1, wv, LD(a1 + v * 32));
                    s2 = _mm256_dpbusd_epi32(s2, wv, LD(a2 + v * 32));
                    s3 = _mm256_dpbusd_epi32(s3, wv, LD(a3 + v * 32));
                    u0 = _mm256_dpbusd_epi32(u0, wu, LD(a0 + v * 32 + 32));
                    u1 = _mm256_dpbusd_epi32(u1, wu, LD(a1 + v * 32 + 32));
                    u2 = _mm256_dpbusd_epi32(u2, wu, LD(a2 + v * 32 + 32));
                    u3 = _mm256_dpbusd_epi32(u3, wu, LD(a3 + v * 32 + 32));
                }
                s0 = _mm256_add_epi32(s0, u0);
                s1 = _mm256_add_epi32(s1, u1);
                s2 = _mm256_add_epi32(s2, u2);
                s3 = _mm256_add_epi32(s3, u3);
                __m256 sw, bw;
                iq_sb_chunk(s, 8 * c, ng, &sw, &bw);
                const float *q0 = qs + t[0] * 2 * ngp, *q1 = qs + t[1] * 2 * ngp;
                const float *q2 = qs + t[2] * 2 * ngp, *q3 = qs + t[3] * 2 * ngp;
                f0 = iq_combine(f0, s0, sw, bw, q0 + 8 * c, q0 + ngp + 8 * c);
                f1 = iq_combine(f1, s1, sw, bw, q1 + 8 * c, q1 + ngp + 8 * c);
                f2 = iq_combine(f2, s2, sw, bw, q2 + 8 * c, q2 + ngp + 8 * c);
                f3 = iq_combine(f3, s3, sw, bw, q3 + 8 * c, q3 + ngp + 8 * c);
            }
            float y[4] = {iq_hsum(f0), iq_hsum(f1), iq_hsum(f2), iq_hsum(f3)};
            for (int i = 0; i < 4 && t0 + i < T; i++)
                Y[(t0 + i) * ldy + r] = y[i];
        }
    }
}

void tern_iq_vnni_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    iq_product(panel_product, vnni_q4_rows, Wq, sb, group, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_vnni_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    iq_product(panel_product, vnni_q8_rows, Wq, sb, group, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
}
