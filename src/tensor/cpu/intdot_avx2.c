/* Integer products for MLX affine weights with AVX2 (kernels.h,
 * tern_iqmatmul_fn): vpmaddubsw multiplies unsigned weight bytes by signed
 * activation bytes into int16 pairs, vpmaddwd widens to int32. 4-bit values
 * (0..15) go in directly; 8-bit ones (0..255) would overflow the int16 pair
 * sums, so they are shifted to q - 128 and multiplied as |q - 128| by
 * sign-adjusted activations, and the exact sum is restored as S + 128 * A.
 * Tokens go in pairs sharing each unpacked weight vector. */
#include <immintrin.h>
#include <stdlib.h>

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


static void avx2_q4_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
static void avx2_q8_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
IQ_KERNEL(avx2_q4_rows, 4, q4_grp, iq_nofix)
IQ_KERNEL(avx2_q8_rows, 8, q8_grp, iq_fix128)

/* Panels (see intdot_avx512.c) from 8 tokens. 4-bit:
 * vpmaddubsw pair sums (<= 2 * 15 * 127) add up in int16 over 8 vectors,
 * then one vpmaddwd; 8-bit: the sign trick per vector, the exact sums
 * restored as S + 128 * A per chunk. Same bits as the row kernels. */

#define PANEL_Q4(p, i) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wv, LD(a[i] + v * 32)))
#define PANEL_Q8(acc, i)                                                                                      \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(LD(a[i] + v * 32), ws)), ones))

static void panel_product(const uint8_t *Wq, const float *sb, int group, int bits, const int8_t *Q, const float *qs,
                          float *Y, long T, long n_in, long ldy, long r0, long r1, int8_t *A, uint8_t *Wp)
{
    const __m256i ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8((char)0x80);
    long ng = n_in / group, ngp = tern_iq_ngp(ng), nv = group / 4, span = ngp * group;
    for (long t = 0; t < T; t++)
        panel_acts(Q + t * n_in, group, bits, ng, ngp, A + t * span);
    for (long r = r0; r < r1; r++) {
        panel_row(Wq + r * n_in * bits / 8, group, bits, ng, ngp, Wp, 32);
        const float *s = sb + r * ng * 2;
        for (long t0 = 0; t0 < T; t0 += 4) {
            long t[4];
            for (int i = 0; i < 4; i++)
                t[i] = t0 + i < T ? t0 + i : T - 1; /* a short last quad repeats its last token */
            const int8_t *a[4] = {A + t[0] * span, A + t[1] * span, A + t[2] * span, A + t[3] * span};
            __m256 f[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (long c = 0; c < ngp / 8; c++) {
                __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
                for (long v8 = c * nv; v8 < (c + 1) * nv; v8 += 8) {
                    if (bits == 4) {
                        __m256i p0 = _mm256_setzero_si256(), p1 = p0, p2 = p0, p3 = p0;
                        for (long v = v8; v < v8 + 8; v++) {
                            __m256i wv = LD(Wp + v * 32);
                            PANEL_Q4(p0, 0);
                            PANEL_Q4(p1, 1);
                            PANEL_Q4(p2, 2);
                            PANEL_Q4(p3, 3);
                        }
                        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
                        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(p2, ones));
                        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(p3, ones));
                    } else {
                        for (long v = v8; v < v8 + 8; v++) {
                            __m256i ws = _mm256_xor_si256(LD(Wp + v * 32), x80), aw = _mm256_abs_epi8(ws);
                            PANEL_Q8(s0, 0);
                            PANEL_Q8(s1, 1);
                            PANEL_Q8(s2, 2);
                            PANEL_Q8(s3, 3);
                        }
                    }
                }
                __m256 sw, bw;
                iq_sb_chunk(s, 8 * c, ng, &sw, &bw);
                __m256i S[4] = {s0, s1, s2, s3};
                for (int i = 0; i < 4; i++) {
                    const float *q = qs + t[i] * 2 * ngp;
                    __m256i I = bits == 8 ? iq_fix128(S[i], q + ngp + 8 * c) : S[i];
                    f[i] = iq_combine(f[i], I, sw, bw, q + 8 * c, q + ngp + 8 * c);
                }
            }
            for (int i = 0; i < 4 && t0 + i < T; i++)
                Y[(t0 + i) * ldy + r] = iq_hsum(f[i]);
        }
    }
}

/* ---- One token (decode), groups of 64 or 128: two rows at a time, each
 * input load shared by both. 4-bit: a row's 64 values are 32 packed bytes,
 * whose low nibbles are the even values of its two 32-value blocks (e0, e1)
 * and whose high nibbles the odd ones (o0, o1); the inputs, in nibble order
 * (kernels.h), hold e0 o0 e1 o1. So the token's inputs are rearranged once
 * per call to e0 e1 o0 o1 (the middle 16-byte quarters of each 64
 * swapped), and then one 32-byte load, two ands and a shift give two
 * vpmaddubsw operands - no broadcast or variable shift per 16 bytes, no
 * lane-crossing shuffle per group. 8-bit: q8_grp's sign trick per 32
 * values. Exact int32 group sums, then iq_sum8 and iq_combine: the row
 * kernels' bits. */
#define ONE_MAX TERN_IQ16_MAX_IN /* 4-bit inputs rearranged on the stack; wider rows take the row kernels */

static inline __attribute__((always_inline)) __m256i q4_run64(const uint8_t *w, __m256i ae, __m256i ao)
{
    const __m256i m = _mm256_set1_epi8(15);
    __m256i v = LD(w);
    return _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, m), ae),
                            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m), ao));
}

/* sum (q - 128) * a over 32 8-bit weights, as int32 lanes */
static inline __attribute__((always_inline)) __m256i q8_run32(const uint8_t *w, __m256i a)
{
    const __m256i ones = _mm256_set1_epi16(1), x80 = _mm256_set1_epi8((char)0x80);
    __m256i ws = _mm256_xor_si256(LD(w), x80);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(a, ws)), ones);
}

/* sa, sbb: the rows' f32 pairs, or with h their bf16 ones (tern_iqmatmul16_fn) */
static inline __attribute__((always_inline)) void one_rows2(const uint8_t *wa, const uint8_t *wb, const void *sa,
                                                            const void *sbb, int h, const int8_t *x, const float *q,
                                                            int group, int bits, long ng, long ngp, float *ya,
                                                            float *yb)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 fa = _mm256_setzero_ps(), fb = fa;
    for (long c = 0; c < ngp; c += 8) {
        __m256i ha[4], hb[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i xa[2], xb[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                long g = c + 2 * k + h;
                xa[h] = xb[h] = _mm256_setzero_si256();
                if (g >= ng)
                    continue;
                if (bits == 4) {
                    __m256i pa = _mm256_setzero_si256(), pb = pa;
#pragma GCC unroll 2
                    for (int i = 0; i < group; i += 64) {
                        __m256i ae = LD(x + g * group + i), ao = LD(x + g * group + i + 32);
                        pa = _mm256_add_epi16(pa, q4_run64(wa + (g * group + i) / 2, ae, ao));
                        pb = _mm256_add_epi16(pb, q4_run64(wb + (g * group + i) / 2, ae, ao));
                    }
                    xa[h] = _mm256_madd_epi16(pa, ones);
                    xb[h] = _mm256_madd_epi16(pb, ones);
                } else {
#pragma GCC unroll 4
                    for (int i = 0; i < group; i += 32) {
                        __m256i a = LD(x + g * group + i);
                        xa[h] = _mm256_add_epi32(xa[h], q8_run32(wa + g * group + i, a));
                        xb[h] = _mm256_add_epi32(xb[h], q8_run32(wb + g * group + i, a));
                    }
                }
            }
            ha[k] = _mm256_hadd_epi32(xa[0], xa[1]);
            hb[k] = _mm256_hadd_epi32(xb[0], xb[1]);
        }
        __m256i Ia = iq_sum8(ha[0], ha[1], ha[2], ha[3]), Ib = iq_sum8(hb[0], hb[1], hb[2], hb[3]);
        if (bits == 8) {
            Ia = iq_fix128(Ia, q + ngp + c);
            Ib = iq_fix128(Ib, q + ngp + c);
        }
        __m256 sw, bw;
        if (h)
            iq_sb16_chunk(sa, c, ng, &sw, &bw);
        else
            iq_sb_chunk(sa, c, ng, &sw, &bw);
        fa = iq_combine(fa, Ia, sw, bw, q + c, q + ngp + c);
        if (h)
            iq_sb16_chunk(sbb, c, ng, &sw, &bw);
        else
            iq_sb_chunk(sbb, c, ng, &sw, &bw);
        fb = iq_combine(fb, Ib, sw, bw, q + c, q + ngp + c);
    }
    *ya = iq_hsum(fa);
    *yb = iq_hsum(fb);
}

static inline __attribute__((always_inline)) void one_token(const uint8_t *Wq, const void *sb, int h, int group,
                                                            int bits, const int8_t *Q, const float *qs, float *Y,
                                                            long n_in, long r0, long r1)
{
    _Alignas(32) int8_t xr[ONE_MAX];
    const int8_t *x = Q;
    if (bits == 4) {
        for (long i = 0; i < n_in; i += 64) {
            __m256i a0 = LD(Q + i), a1 = LD(Q + i + 32);
            _mm256_store_si256((__m256i *)(xr + i), _mm256_permute2x128_si256(a0, a1, 0x20));
            _mm256_store_si256((__m256i *)(xr + i + 32), _mm256_permute2x128_si256(a0, a1, 0x31));
        }
        x = xr;
    }
    long ng = n_in / group, ngp = tern_iq_ngp(ng), rowb = n_in * bits / 8;
    for (long r = r0; r < r1; r += 2) {
        long rb = r + 1 < r1 ? r + 1 : r;
        float ya, yb;
        const void *sa = h ? (const void *)((const uint16_t *)sb + r * ng * 2) : (const void *)((const float *)sb + r * ng * 2);
        const void *sbb = h ? (const void *)((const uint16_t *)sb + rb * ng * 2)
                            : (const void *)((const float *)sb + rb * ng * 2);
        one_rows2(Wq + r * rowb, Wq + rb * rowb, sa, sbb, h, x, qs, group, bits, ng, ngp, &ya, &yb);
        Y[r] = ya;
        Y[rb] = yb;
    }
}

void tern_iq_avx2_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (T == 1 && group == 64 && n_in <= ONE_MAX)
        one_token(Wq, sb, 0, 64, 4, Q, qs, Y, n_in, r0, r1);
    else if (T == 1 && group == 128 && n_in <= ONE_MAX)
        one_token(Wq, sb, 0, 128, 4, Q, qs, Y, n_in, r0, r1);
    else
        iq_product(panel_product, avx2_q4_rows, Wq, sb, group, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_avx2_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (T == 1 && group == 64)
        one_token(Wq, sb, 0, 64, 8, Q, qs, Y, n_in, r0, r1);
    else if (T == 1 && group == 128)
        one_token(Wq, sb, 0, 128, 8, Q, qs, Y, n_in, r0, r1);
    else
        iq_product(panel_product, avx2_q8_rows, Wq, sb, group, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
}


/* tern_iqmatmul16_fn (kernels.h: groups of 64 and 128, n_in up to
 * TERN_IQ16_MAX_IN = ONE_MAX). */
void tern_iq16_avx2_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (group == 64) {
        one_token(Wq, sb16, 1, 64, 4, Q, qs, Y, n_in, r0, r1);
    } else {
        one_token(Wq, sb16, 1, 128, 4, Q, qs, Y, n_in, r0, r1);
    }
}

void tern_iq16_avx2_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (group == 64)
        one_token(Wq, sb16, 1, 64, 8, Q, qs, Y, n_in, r0, r1);
    else
        one_token(Wq, sb16, 1, 128, 8, Q, qs, Y, n_in, r0, r1);
}

void tern_iq_avx2_quant(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs)
{
    iq_quant_act(X, T, n_in, group, bits, Q, qs);
}
