/* The ISA-independent half of the integer products (kernels.h,
 * tern_iqmatmul_fn): reducing per-group int32 partial sums and the fixed f32
 * combination, written once in 256-bit AVX2 and included by intdot_avx2.c
 * and intdot_avx512.c so that both compute the same bits as the scalar
 * reference. Only explicit FMA intrinsics combine products and sums, so no
 * compiler contraction can change the rounding. */
#ifndef TERN_TENSOR_CPU_INTDOT_SIMD_H
#define TERN_TENSOR_CPU_INTDOT_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/kernels.h"

/* Sums of 8 groups' int32 vectors (any split of a group's sum over the 8
 * lanes) as one vector in group order, from the pairs h01 = hadd(g0, g1),
 * h23, h45, h67 (hadd pairs early to keep few registers live). Integer adds
 * in any order are exact. */
static inline __m256i iq_sum8(__m256i h01, __m256i h23, __m256i h45, __m256i h67)
{
    __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* Even (scales) and odd (biases) entries of 8 interleaved {scale, bias}
 * pairs, in group order. */
static inline void iq_sb_load(const float *sb, __m256 *sw, __m256 *bw)
{
    __m256 a = _mm256_loadu_ps(sb), b = _mm256_loadu_ps(sb + 8);
    __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)); /* p0 p2 p8 p10 | p4 p6 p12 p14 */
    __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    *sw = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *bw = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* The {scale, bias} pairs of groups c .. c+7 of a row with ng groups; the
 * ones past ng read as 0 (the padding of the contract). */
static inline void iq_sb_chunk(const float *s, long c, long ng, __m256 *sw, __m256 *bw)
{
    if (c + 8 <= ng) {
        iq_sb_load(s + 2 * c, sw, bw);
    } else {
        float tmp[16] = {0};
        memcpy(tmp, s + 2 * c, (size_t)(ng - c) * 2 * sizeof(float));
        iq_sb_load(tmp, sw, bw);
    }
}

/* The same from bf16 pairs (kernels.h, tern_iqmatmul16_fn): pair g is the
 * 32-bit word scale | bias << 16, so the scale's f32 bits are the word
 * shifted up 16 and the bias's the word's upper half - exact, no shuffle. */
static inline void iq_sb16_chunk(const uint16_t *s, long c, long ng, __m256 *sw, __m256 *bw)
{
    __m256i v;
    if (c + 8 <= ng) {
        v = _mm256_loadu_si256((const __m256i *)(s + 2 * c));
    } else {
        uint16_t tmp[16] = {0};
        memcpy(tmp, s + 2 * c, (size_t)(ng - c) * 2 * sizeof(uint16_t));
        v = _mm256_loadu_si256((const __m256i *)tmp);
    }
    *sw = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *bw = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* The {scale, bias} pairs of activation blocks c .. c+7 (c a multiple of
 * 8) of a row with nb blocks, rep = group / B blocks a weight group (1, 2
 * or 4, kernels.h): block c + j takes group (c + j) / rep's pair, blocks
 * past nb read 0. */
static inline void iq_sb_rep(const float *s, long c, long nb, long rep, __m256 *sw, __m256 *bw)
{
    if (rep == 1) {
        iq_sb_chunk(s, c, nb, sw, bw);
        return;
    }
    const float *p = s + 2 * (rep == 2 ? c >> 1 : c >> 2); /* a shift, not a division, per chunk */
    float tmp[8] = {0};
    if (c + 8 > nb) {
        memcpy(tmp, p, (size_t)((nb - c) / rep) * 2 * sizeof(float));
        p = tmp;
    }
    /* rep 2: 4 pairs, each twice; rep 4: 2 pairs, each four times */
    __m256 v = rep == 2 ? _mm256_loadu_ps(p) : _mm256_castps128_ps256(_mm_loadu_ps(p));
    __m256i is = rep == 2 ? _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6) : _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
    *sw = _mm256_permutevar8x32_ps(v, is);
    *bw = _mm256_permutevar8x32_ps(v, _mm256_add_epi32(is, _mm256_set1_epi32(1)));
}

/* The same from bf16 pairs (one 32-bit word a pair, iq_sb16_chunk). */
static inline void iq_sb16_rep(const uint16_t *s, long c, long nb, long rep, __m256 *sw, __m256 *bw)
{
    if (rep == 1) {
        iq_sb16_chunk(s, c, nb, sw, bw);
        return;
    }
    const uint16_t *p = s + 2 * (rep == 2 ? c >> 1 : c >> 2);
    uint16_t tmp[8] = {0};
    if (c + 8 > nb) {
        memcpy(tmp, p, (size_t)((nb - c) / rep) * 2 * sizeof(uint16_t));
        p = tmp;
    }
    __m256i v = rep == 2 ? _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p))
                         : _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)p));
    v = _mm256_permutevar8x32_epi32(v, rep == 2 ? _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)
                                                : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    *sw = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *bw = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* acc += (sw * I + bw * A) * d for 8 blocks, the contract's two FMAs. */
static inline __m256 iq_combine(__m256 acc, __m256i I, __m256 sw, __m256 bw, const float *d, const float *A)
{
    __m256 u = _mm256_fmadd_ps(sw, _mm256_cvtepi32_ps(I), _mm256_mul_ps(bw, _mm256_loadu_ps(A)));
    return _mm256_fmadd_ps(u, _mm256_loadu_ps(d), acc);
}

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), the contract's final order. */
static inline float iq_hsum(__m256 v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Activation quantization (kernels.h, tern_quant_act_fn) with 8 lanes:
 * blocks of B inputs (here "group" and "ng" name the blocks). */
static inline void iq_quant_act(const float *X, long T, long n_in, int wgroup, int bits, int8_t *Q, float *qs)
{
    int group = tern_iq_ablock(wgroup, bits);
    long ng = n_in / group, ngp = tern_iq_nbp(n_in, wgroup, bits);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    /* nibble order (bits 4): evens then odds within each 128-bit lane, then
     * the lanes' halves gathered */
    const __m256i nib = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14,
                                         1, 3, 5, 7, 9, 11, 13, 15);
    for (long t = 0; t < T; t++) {
        const float *x = X + t * n_in;
        int8_t *q = Q + t * n_in;
        float *d = qs + t * 2 * ngp, *A = d + ngp;
        for (long g = ng; g < ngp; g++)
            d[g] = A[g] = 0.0f;
        for (long g = 0; g < ng; g++) {
            const float *xg = x + g * group;
            int8_t *qg = q + g * group;
            __m256 m = _mm256_setzero_ps();
            for (int i = 0; i < group; i += 8)
                m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xg + i), absmask));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            if (!(amax >= 1e-30f)) {
                memset(qg, 0, (size_t)group);
                d[g] = A[g] = 0.0f;
                continue;
            }
            __m256 id = _mm256_set1_ps(127.0f / amax);
            __m256i sum = _mm256_setzero_si256();
            for (int i = 0; i < group; i += 32) {
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i), id));
                __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8), id));
                __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 16), id));
                __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 24), id));
                sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, e)));
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
                p = _mm256_permutevar8x32_epi32(p, perm);
                if (bits == 4)
                    p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p, nib), _MM_SHUFFLE(3, 1, 2, 0));
                _mm256_storeu_si256((__m256i *)(qg + i), p);
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
            d[g] = amax / 127.0f;
            A[g] = (float)_mm_cvtsi128_si32(s4);
        }
    }
}

/* One token's 4-bit-product inputs (nibble order, kernels.h) for the
 * one-token kernels: each 64 as the evens' 32 bytes, then the odds' (the
 * middle 16-byte quarters swapped), so that a 32-byte weight load's low and
 * high nibbles meet them without a shuffle per group. */
static inline void iq_q4_one_acts(const int8_t *Q, long n_in, int8_t *x)
{
    for (long i = 0; i < n_in; i += 64) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(Q + i));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(Q + i + 32));
        _mm256_store_si256((__m256i *)(x + i), _mm256_permute2x128_si256(a0, a1, 0x20));
        _mm256_store_si256((__m256i *)(x + i + 32), _mm256_permute2x128_si256(a0, a1, 0x31));
    }
}

/* GRP sums that come back as sum (q - 128) * a (AVX2's 8-bit path) get
 * 128 * A added (exact in int32); the others are already I. */
static inline __m256i iq_fix128(__m256i S, const float *A)
{
    return _mm256_add_epi32(S, _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_loadu_ps(A)), 7));
}
static inline __m256i iq_nofix(__m256i S, const float *A)
{
    (void)A;
    return S;
}

/* A kernel from GRP(w, a0, a1, B, two, &s0, &s1), the int32 vectors of
 * one activation block of B inputs for a token pair, and FIX(S, A), what
 * turns GRP's sums into the exact I: rows one at a time, tokens in pairs
 * sharing each weight load; rep blocks a weight group (kernels.h). */
#define IQ_KERNEL(name, BITS, GRP, FIX)                                                                         \
    static inline __attribute__((always_inline)) void name##_row(                                             \
        const uint8_t *w, const float *s, int B, long rep, long nb, long nbp, const int8_t *a0,               \
        const int8_t *a1, const float *q0, const float *q1, float *y0, float *y1, int two)                    \
    {                                                                                                         \
        __m256 f0 = _mm256_setzero_ps(), f1 = f0;                                                             \
        for (long c = 0; c < nbp; c += 8) {                                                                   \
            __m256i h0[4], h1[4];                                                                             \
            for (int k = 0; k < 4; k++) {                                                                     \
                __m256i x0 = _mm256_setzero_si256(), x1 = x0, z0 = x0, z1 = x0;                               \
                long g = c + 2 * k;                                                                           \
                if (g < nb)                                                                                   \
                    GRP(w + g * B * BITS / 8, a0 + g * B, a1 + g * B, B, two, &x0, &x1);                      \
                if (g + 1 < nb)                                                                               \
                    GRP(w + (g + 1) * B * BITS / 8, a0 + (g + 1) * B, a1 + (g + 1) * B, B, two, &z0, &z1);    \
                h0[k] = _mm256_hadd_epi32(x0, z0);                                                            \
                h1[k] = _mm256_hadd_epi32(x1, z1);                                                            \
            }                                                                                                 \
            __m256 sw, bw;                                                                                    \
            iq_sb_rep(s, c, nb, rep, &sw, &bw);                                                               \
            __m256i I0 = FIX(iq_sum8(h0[0], h0[1], h0[2], h0[3]), q0 + nbp + c);                              \
            f0 = iq_combine(f0, I0, sw, bw, q0 + c, q0 + nbp + c);                                            \
            if (two) {                                                                                        \
                __m256i I1 = FIX(iq_sum8(h1[0], h1[1], h1[2], h1[3]), q1 + nbp + c);                          \
                f1 = iq_combine(f1, I1, sw, bw, q1 + c, q1 + nbp + c);                                        \
            }                                                                                                 \
        }                                                                                                     \
        *y0 = iq_hsum(f0);                                                                                    \
        if (two)                                                                                              \
            *y1 = iq_hsum(f1);                                                                                \
    }                                                                                                         \
    static inline __attribute__((always_inline)) void name##_g(const uint8_t *Wq, const float *sb, int group, \
                                                               int B, const int8_t *Q, const float *qs,       \
                                                               float *Y, long T, long n_in, long ldy, long r0, \
                                                               long r1)                                       \
    {                                                                                                         \
        long ng = n_in / group, nb = n_in / B, nbp = tern_iq_ngp(nb), rep = group / B;                        \
        for (long r = r0; r < r1; r++) {                                                                      \
            const uint8_t *w = Wq + r * n_in * BITS / 8;                                                      \
            const float *s = sb + r * ng * 2;                                                                 \
            long t = 0;                                                                                       \
            for (; t + 1 < T; t += 2)                                                                         \
                name##_row(w, s, B, rep, nb, nbp, Q + t * n_in, Q + (t + 1) * n_in, qs + t * 2 * nbp,         \
                           qs + (t + 1) * 2 * nbp, &Y[t * ldy + r], &Y[(t + 1) * ldy + r], 1);                \
            if (t < T)                                                                                        \
                name##_row(w, s, B, rep, nb, nbp, Q + t * n_in, Q + t * n_in, qs + t * 2 * nbp,               \
                           qs + t * 2 * nbp, &Y[t * ldy + r], NULL, 0);                                       \
        }                                                                                                     \
    }                                                                                                         \
    /* the usual block sizes as constants, so that the block loops unroll */                                  \
    void name(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y, long T, \
              long n_in, long ldy, long r0, long r1)                                                          \
    {                                                                                                         \
        int B = tern_iq_ablock(group, BITS);                                                                  \
        if (B == 32)                                                                                          \
            name##_g(Wq, sb, group, 32, Q, qs, Y, T, n_in, ldy, r0, r1);                                      \
        else if (B == 64)                                                                                     \
            name##_g(Wq, sb, group, 64, Q, qs, Y, T, n_in, ldy, r0, r1);                                      \
        else if (B == 128)                                                                                    \
            name##_g(Wq, sb, group, 128, Q, qs, Y, T, n_in, ldy, r0, r1);                                     \
        else                                                                                                  \
            name##_g(Wq, sb, group, B, Q, qs, Y, T, n_in, ldy, r0, r1);                                       \
    }

/* ---- Panels (intdot_avx512.c says why): 32-bit lane j of every 256-bit
 * vector holds 4 bytes of group 8c + j of chunk c (the panels' "group" is
 * the activation block, kernels.h's B; the weight groups only choose the
 * {scale, bias} pairs). Vector v of a chunk takes
 * word panel_off(v) of each group's bytes. */
static inline long panel_off(long v, int bits)
{
    if (bits == 8)
        return v;
    long k = v >> 1;
    return 8 * (k >> 2) + (k & 3) + (v & 1) * 4;
}

/* Lanes of chunk c present (groups < ng), as a gather mask. */
static inline __m256i panel_mask(long c, long ng)
{
    __m256i j = _mm256_add_epi32(_mm256_set1_epi32((int)(8 * c)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)ng), j);
}

/* The inputs of one token: P[(c * nv + v) * 32 ..] for every chunk. */
static inline void panel_acts(const int8_t *q, int group, int bits, long ng, long ngp, int8_t *P)
{
    long nv = group / 4;
    const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(group / 4));
    for (long c = 0; c < ngp / 8; c++) {
        __m256i m = panel_mask(c, ng), base = _mm256_add_epi32(lane, _mm256_set1_epi32((int)(c * 8 * nv)));
        for (long v = 0; v < nv; v++) {
            __m256i idx = _mm256_add_epi32(base, _mm256_set1_epi32((int)panel_off(v, bits)));
            __m256i x = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)q, idx, m, 4);
            _mm256_storeu_si256((__m256i *)(P + (c * nv + v) * 32), x);
        }
    }
}

#define LDP(p) _mm256_loadu_si256((const __m256i *)(p))

/* 8 x 8 transpose of 32-bit words: O[k] lane j = R[j] lane k. */
static inline void panel_t8(const __m256i *R, __m256i *O)
{
    __m256i t0 = _mm256_unpacklo_epi32(R[0], R[1]), t1 = _mm256_unpackhi_epi32(R[0], R[1]);
    __m256i t2 = _mm256_unpacklo_epi32(R[2], R[3]), t3 = _mm256_unpackhi_epi32(R[2], R[3]);
    __m256i t4 = _mm256_unpacklo_epi32(R[4], R[5]), t5 = _mm256_unpackhi_epi32(R[4], R[5]);
    __m256i t6 = _mm256_unpacklo_epi32(R[6], R[7]), t7 = _mm256_unpackhi_epi32(R[6], R[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    O[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    O[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    O[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    O[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    O[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    O[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    O[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    O[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* One weight row as unsigned bytes in the same order: vector v of the
 * row at P + v * ps (ps = 32 for one row alone; 64 puts two rows' vectors
 * side by side, for 512-bit kernels that take two rows a load). By 8 x 8
 * word transposes (row j = 8 words of group 8c + j, zero past ng; column k
 * = word k of every group): 8-bit words are vectors, a 4-bit word gives
 * vector 2k (low nibbles) and 2k + 1 (high ones); 4-bit groups of 32 (16
 * bytes, less than a transpose's 32) by gathers. */
static inline void panel_row(const uint8_t *w, int group, int bits, long ng, long ngp, uint8_t *P, long ps)
{
    long nv = group / 4, gb = group * bits / 8;
    const __m256i nib = _mm256_set1_epi8(15);
    const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32(group * bits / 32));
    for (long c = 0; c < ngp / 8; c++) {
        if (gb >= 32) {
            for (long k0 = 0; k0 < gb / 4; k0 += 8) {
                __m256i R[8], O[8];
                for (int j = 0; j < 8; j++)
                    R[j] = 8 * c + j < ng ? LDP(w + (8 * c + j) * gb + k0 * 4) : _mm256_setzero_si256();
                panel_t8(R, O);
                for (int k = 0; k < 8; k++) {
                    if (bits == 8) {
                        _mm256_storeu_si256((__m256i *)(P + (c * nv + k0 + k) * ps), O[k]);
                    } else {
                        uint8_t *o = P + (c * nv + 2 * (k0 + k)) * ps;
                        _mm256_storeu_si256((__m256i *)o, _mm256_and_si256(O[k], nib));
                        _mm256_storeu_si256((__m256i *)(o + ps), _mm256_and_si256(_mm256_srli_epi16(O[k], 4), nib));
                    }
                }
            }
        } else {
            __m256i m = panel_mask(c, ng);
            __m256i base = _mm256_add_epi32(lane, _mm256_set1_epi32((int)(c * 8 * group * bits / 32)));
            for (long k = 0; k < nv / 2; k++) {
                __m256i x = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)w,
                                                        _mm256_add_epi32(base, _mm256_set1_epi32((int)k)), m, 4);
                _mm256_storeu_si256((__m256i *)(P + (c * nv + 2 * k) * ps), _mm256_and_si256(x, nib));
                _mm256_storeu_si256((__m256i *)(P + (c * nv + 2 * k + 1) * ps),
                                    _mm256_and_si256(_mm256_srli_epi16(x, 4), nib));
            }
        }
    }
}

/* The panel products on weights laid out at load (kernels.h,
 * tern_iqpanel_fn) take their tokens in blocks of ~IQ_PW_BLOCK bytes of
 * panel inputs (kept in L2, as the backend's token tiles), whole 4-token
 * tiles, at most IQ_PW_TOKENS tokens (their sums for one quad stay in L1). */
#define IQ_PW_BLOCK (256L << 10)
#define IQ_PW_TOKENS 128
static inline long iq_pw_block(long span)
{
    long tb = (IQ_PW_BLOCK / span) & ~3L;
    return tb < 4 ? 4 : tb > IQ_PW_TOKENS ? IQ_PW_TOKENS : tb;
}

/* Tokens b0 .. b0 + n of a block as whole tiles (a short last tile repeats
 * its last token): their indices, panel inputs and qs. */
static inline void iq_pw_tokens(long b0, long n, const int8_t *A, long span, const float *qs, long ngp, long *t,
                                const int8_t **a, const float **q)
{
    for (long i = 0; i < (n + 3) / 4 * 4; i++) {
        t[i] = b0 + (i < n ? i : n - 1);
        a[i] = A + t[i] * span;
        q[i] = qs + t[i] * 2 * ngp;
    }
}

/* One product of an ISA file: its panels from IQ_PANEL_MIN_T tokens where
 * their scratch can be had, else its row kernels (the same bits either
 * way). IQ_PANEL_MIN_T: tokens from which the panels pay for their
 * rearranging (8-bit rows by 8 x 8 word transposes, 4-bit rows and the
 * inputs by gathers): measured with bench_kernels on the Zen 4 development
 * machine, T = 8 1.3x (8-bit) and about even (4-bit) over the row kernels,
 * T = 32 1.35-1.5x. */
#define IQ_PANEL_MIN_T 8
/* Weight rows a panel kernel rearranges at once (its Wp holds this many,
 * then IQ_PANEL_SB bytes for their {scale, bias} vectors: 4 x 64 bytes a
 * chunk of 8 blocks). span: the rows' bytes as panels, a multiple of 64. */
#define IQ_PANEL_ROWS 4
#define IQ_PANEL_SB(span, group, bits) ((span) / tern_iq_ablock(group, bits) / 8 * 256)
typedef void iq_rows_fn(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                        long T, long n_in, long ldy, long r0, long r1);
typedef void iq_panel_fn(const uint8_t *Wq, const float *sb, int group, int bits, const int8_t *Q, const float *qs,
                         float *Y, long T, long n_in, long ldy, long r0, long r1, int8_t *A, uint8_t *Wp);

static inline void iq_product(iq_panel_fn *panel, iq_rows_fn *rows, const uint8_t *Wq, const float *sb, int group,
                              int bits, const int8_t *Q, const float *qs, float *Y, long T, long n_in, long ldy,
                              long r0, long r1)
{
    long span = tern_iq_nbp(n_in, group, bits) * tern_iq_ablock(group, bits);
    int8_t *A = T >= IQ_PANEL_MIN_T ? malloc((size_t)(T * span)) : NULL;
    uint8_t *Wp = A ? aligned_alloc(64, (size_t)(IQ_PANEL_ROWS * span + IQ_PANEL_SB(span, group, bits))) : NULL;
    if (A && Wp)
        panel(Wq, sb, group, bits, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp);
    else /* few tokens, or no memory for the panels: the row kernels, same bits */
        rows(Wq, sb, group, Q, qs, Y, T, n_in, ldy, r0, r1);
    free(A);
    free(Wp);
}

#endif
