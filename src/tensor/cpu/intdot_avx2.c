/* Integer products for MLX affine weights with AVX2 (kernels.h,
 * tern_iqmatmul_fn): vpmaddubsw multiplies unsigned weight bytes by signed
 * activation bytes into int16 pairs, vpmaddwd widens to int32. 4-bit values
 * (0..15) go in directly; 8-bit ones (0..255) would overflow the int16 pair
 * sums, so they are shifted to q - 128 and multiplied as |q - 128| by
 * sign-adjusted activations, and the exact sum is restored as S + 128 * A.
 * Tokens go in pairs sharing each unpacked weight vector. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

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

/* Panels (see intdot_simd.h) from IQ_PANEL_MIN_T tokens: register tiles of
 * 2 weight rows x 4 tokens (each weight vector loaded serves 4 tokens, each
 * input vector 2 rows). Loops: a block of PANEL_RB rows is rearranged once;
 * then chunk by chunk (8 groups), token quad by quad, row pair by row pair,
 * so that a chunk's weights of the whole block (PANEL_RB x 8 groups, 16 KB
 * for groups of 64) and a quad's inputs (2 KB) stay in L1 while the f32
 * accumulators of every (row, token) wait in F (L2). Each (row, token) still
 * takes its chunks in order, so the bits are the row kernels'. 4-bit:
 * vpmaddubsw pair sums (<= 2 * 15 * 127) add up in int16 over 8 vectors,
 * then one vpmaddwd; 8-bit: the sign trick per vector on weights stored as
 * q - 128, the exact sums restored as S + 128 * A per chunk. */
#define PANEL_RB 32

static inline __attribute__((always_inline)) void panel_tile(const uint8_t *w0, const uint8_t *w1,
                                                             const int8_t *const *a, long nv, int bits,
                                                             __m256i S[2][4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int k = 0; k < 4; k++)
        S[0][k] = S[1][k] = _mm256_setzero_si256();
    for (long v8 = 0; v8 < nv; v8 += 8) {
        if (bits == 4) {
            __m256i p[2][4];
            for (int k = 0; k < 4; k++)
                p[0][k] = p[1][k] = _mm256_setzero_si256();
            for (long v = v8; v < v8 + 8; v++) {
                __m256i x0 = LD(w0 + v * 32), x1 = LD(w1 + v * 32);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    __m256i av = LD(a[k] + v * 32);
                    p[0][k] = _mm256_add_epi16(p[0][k], _mm256_maddubs_epi16(x0, av));
                    p[1][k] = _mm256_add_epi16(p[1][k], _mm256_maddubs_epi16(x1, av));
                }
            }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                S[0][k] = _mm256_add_epi32(S[0][k], _mm256_madd_epi16(p[0][k], ones));
                S[1][k] = _mm256_add_epi32(S[1][k], _mm256_madd_epi16(p[1][k], ones));
            }
        } else {
            for (long v = v8; v < v8 + 8; v++) {
                __m256i s0 = LD(w0 + v * 32), s1 = LD(w1 + v * 32); /* q - 128 */
                __m256i u0 = _mm256_abs_epi8(s0), u1 = _mm256_abs_epi8(s1);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    __m256i av = LD(a[k] + v * 32);
                    S[0][k] = _mm256_add_epi32(
                        S[0][k], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(av, s0)), ones));
                    S[1][k] = _mm256_add_epi32(
                        S[1][k], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(av, s1)), ones));
                }
            }
        }
    }
}

/* group: the weights'; B: the activation block (kernels.h), the panels' unit */
static inline __attribute__((always_inline)) void panel_product_g(const uint8_t *Wq, const float *sb, int wgroup,
                                                                  int group, int bits, const int8_t *Q,
                                                                  const float *qs, float *Y, long T, long n_in,
                                                                  long ldy, long r0, long r1, int8_t *A, uint8_t *Wp,
                                                                  __m256 *F)
{
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    long ng = n_in / group, ngp = tern_iq_ngp(ng), nv = group / 4, span = ngp * group, Tq = (T + 3) & ~3L;
    long nw = n_in / wgroup, rep = wgroup / group;
    for (long t = 0; t < T; t++)
        panel_acts(Q + t * n_in, group, bits, ng, ngp, A + t * span);
    for (long rb = r0; rb < r1; rb += PANEL_RB) {
        long nr = r1 - rb < PANEL_RB ? r1 - rb : PANEL_RB;
        for (long i = 0; i < nr; i++) {
            uint8_t *P = Wp + i * span;
            panel_row(Wq + (rb + i) * n_in * bits / 8, group, bits, ng, ngp, P, 32);
            if (bits == 8)
                for (long v = 0; v < span; v += 32)
                    _mm256_storeu_si256((__m256i *)(P + v), _mm256_xor_si256(LD(P + v), x80));
        }
        /* F: (row, token) accumulators, row nr (a spare) takes an odd block's repeated last row;
         * then SB: each row's {scale, bias} vectors per chunk, split once */
        __m256 *SB = F + (PANEL_RB + 1) * Tq;
        memset(F, 0, (size_t)(nr + 1) * Tq * sizeof(__m256));
        for (long i = 0; i < nr; i++)
            for (long c = 0; c < ngp / 8; c++)
                iq_sb_rep(sb + (rb + i) * nw * 2, 8 * c, ng, rep, &SB[(i * (ngp / 8) + c) * 2],
                          &SB[(i * (ngp / 8) + c) * 2 + 1]);
        for (long c = 0; c < ngp / 8; c++) {
            for (long t0 = 0; t0 < Tq; t0 += 4) {
                long t[4];
                const int8_t *a[4];
                for (int k = 0; k < 4; k++) {
                    t[k] = t0 + k < T ? t0 + k : T - 1; /* a short last quad repeats its last token */
                    a[k] = A + t[k] * span + c * nv * 32;
                }
                /* the quad's d, A and 128 * A (iq_fix128) for this chunk, shared by every row pair */
                __m256 dq[4], Aq[4];
                __m256i A7[4];
                for (int k = 0; k < 4; k++) {
                    const float *q = qs + t[k] * 2 * ngp + 8 * c;
                    dq[k] = _mm256_loadu_ps(q);
                    Aq[k] = _mm256_loadu_ps(q + ngp);
                    A7[k] = _mm256_slli_epi32(_mm256_cvtps_epi32(Aq[k]), 7);
                }
                for (long i = 0; i < nr; i += 2) {
                    long i1 = i + 1 < nr ? i + 1 : i, f1 = i + 1 < nr ? i + 1 : nr;
                    __m256i S[2][4];
                    panel_tile(Wp + i * span + c * nv * 32, Wp + i1 * span + c * nv * 32, a, nv, bits, S);
                    long ri[2] = {i, i1}, fi[2] = {i, f1};
                    for (int j = 0; j < 2; j++) {
                        __m256 sw = SB[(ri[j] * (ngp / 8) + c) * 2], bw = SB[(ri[j] * (ngp / 8) + c) * 2 + 1];
#pragma GCC unroll 4
                        for (int k = 0; k < 4; k++) { /* iq_fix128 and iq_combine, their operations */
                            __m256i I = bits == 8 ? _mm256_add_epi32(S[j][k], A7[k]) : S[j][k];
                            __m256 *f = &F[fi[j] * Tq + t0 + k];
                            __m256 u = _mm256_fmadd_ps(sw, _mm256_cvtepi32_ps(I), _mm256_mul_ps(bw, Aq[k]));
                            *f = _mm256_fmadd_ps(u, dq[k], *f);
                        }
                    }
                }
            }
        }
        for (long tt = 0; tt < T; tt++) /* a token's outputs are contiguous */
            for (long i = 0; i < nr; i++)
                Y[tt * ldy + rb + i] = iq_hsum(F[i * Tq + tt]);
    }
}

/* the block's vector count as a constant, so that the tile's loops unroll */
static void panel_product(const uint8_t *Wq, const float *sb, int group, int bits, const int8_t *Q, const float *qs,
                          float *Y, long T, long n_in, long ldy, long r0, long r1, int8_t *A, uint8_t *Wp, __m256 *F)
{
    int B = tern_iq_ablock(group, bits);
    if (bits == 4 && B == 64)
        panel_product_g(Wq, sb, group, 64, 4, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp, F);
    else if (bits == 8 && B == 32)
        panel_product_g(Wq, sb, group, 32, 8, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp, F);
    else if (bits == 4)
        panel_product_g(Wq, sb, group, B, 4, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp, F);
    else
        panel_product_g(Wq, sb, group, B, 8, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp, F);
}

/* The panels where their scratch can be had, else the row kernels (the same
 * bits either way). */
static void panel_or_rows(iq_rows_fn *rows, const uint8_t *Wq, const float *sb, int group, int bits,
                          const int8_t *Q, const float *qs, float *Y, long T, long n_in, long ldy, long r0, long r1)
{
    int B = tern_iq_ablock(group, bits);
    long span = tern_iq_nbp(n_in, group, bits) * B, Tq = (T + 3) & ~3L;
    int8_t *A = T >= IQ_PANEL_MIN_T ? malloc((size_t)(T * span)) : NULL;
    uint8_t *Wp = A ? malloc((size_t)(PANEL_RB * span)) : NULL;
    __m256 *F = Wp ? aligned_alloc(32, (size_t)((PANEL_RB + 1) * Tq + PANEL_RB * span / B / 4) * sizeof(__m256))
                   : NULL;
    if (F)
        panel_product(Wq, sb, group, bits, Q, qs, Y, T, n_in, ldy, r0, r1, A, Wp, F);
    else /* few tokens, or no memory for the panels */
        rows(Wq, sb, group, Q, qs, Y, T, n_in, ldy, r0, r1);
    free(A);
    free(Wp);
    free(F);
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

/* One chunk (8 blocks from c) of two rows into their accumulators fa, fb.
 * sa, sbb: the rows' f32 pairs, or with h16 their bf16 ones
 * (tern_iqmatmul16_fn); group: the activation block B (kernels.h), rep of
 * them a weight group; full: all 8 blocks present (c + 8 <= ng), so that
 * the common chunk runs without a test per block. */
static inline __attribute__((always_inline)) void one_chunk(const uint8_t *wa, const uint8_t *wb, const void *sa,
                                                            const void *sbb, int h16, const int8_t *x,
                                                            const float *q, int group, long rep, int bits, long ng,
                                                            long ngp, long c, int full, __m256 *fa, __m256 *fb)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i ha[4], hb[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i xa[2], xb[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            long g = c + 2 * k + h;
            xa[h] = xb[h] = _mm256_setzero_si256();
            if (!full && g >= ng)
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
    long nbs = full ? c + 8 : ng; /* the pairs' loaders take the whole-chunk path when full */
    __m256 sw, bw;
    if (h16)
        iq_sb16_rep(sa, c, nbs, rep, &sw, &bw);
    else
        iq_sb_rep(sa, c, nbs, rep, &sw, &bw);
    *fa = iq_combine(*fa, Ia, sw, bw, q + c, q + ngp + c);
    if (h16)
        iq_sb16_rep(sbb, c, nbs, rep, &sw, &bw);
    else
        iq_sb_rep(sbb, c, nbs, rep, &sw, &bw);
    *fb = iq_combine(*fb, Ib, sw, bw, q + c, q + ngp + c);
}

static inline __attribute__((always_inline)) void one_rows2(const uint8_t *wa, const uint8_t *wb, const void *sa,
                                                            const void *sbb, int h16, const int8_t *x, const float *q,
                                                            int group, long rep, int bits, long ng, long ngp,
                                                            float *ya, float *yb, const uint8_t *pf)
{
    __m256 fa = _mm256_setzero_ps(), fb = fa;
    long pfc = 2 * 8 * group * bits / 8; /* the next pair's bytes a chunk, fetched a pair ahead */
    for (long c = 0; c < ngp; c += 8) {
#pragma GCC unroll 16
        for (long o = 0; o < pfc; o += 64)
            _mm_prefetch((const char *)pf + (c / 8) * pfc + o, _MM_HINT_T0);
        if (c + 8 <= ng)
            one_chunk(wa, wb, sa, sbb, h16, x, q, group, rep, bits, ng, ngp, c, 1, &fa, &fb);
        else
            one_chunk(wa, wb, sa, sbb, h16, x, q, group, rep, bits, ng, ngp, c, 0, &fa, &fb);
    }
    *ya = iq_hsum(fa);
    *yb = iq_hsum(fb);
}

/* One token: group, the weights'; B, the activation block (64 or 128 for
 * 4 bits, 32 for 8). */
static inline __attribute__((always_inline)) void one_token(const uint8_t *Wq, const void *sb, int h, int group,
                                                            int B, int bits, const int8_t *Q, const float *qs,
                                                            float *Y, long n_in, long r0, long r1)
{
    _Alignas(32) int8_t xr[ONE_MAX];
    const int8_t *x = Q;
    if (bits == 4) {
        iq_q4_one_acts(Q, n_in, xr);
        x = xr;
    }
    long ng = n_in / group, nb = n_in / B, nbp = tern_iq_ngp(nb), rowb = n_in * bits / 8;
    for (long r = r0; r < r1; r += 2) {
        long rb = r + 1 < r1 ? r + 1 : r;
        float ya, yb;
        const void *sa = h ? (const void *)((const uint16_t *)sb + r * ng * 2) : (const void *)((const float *)sb + r * ng * 2);
        const void *sbb = h ? (const void *)((const uint16_t *)sb + rb * ng * 2)
                            : (const void *)((const float *)sb + rb * ng * 2);
        one_rows2(Wq + r * rowb, Wq + rb * rowb, sa, sbb, h, x, qs, B, group / B, bits, nb, nbp, &ya, &yb,
                  Wq + (r + 2 < r1 ? r + 2 : r) * rowb);
        Y[r] = ya;
        Y[rb] = yb;
    }
}

/* 4-bit: one token with groups of 64 or 128 (their own blocks). */
static int q4_one_ok(int group, long T, long n_in)
{
    int B = tern_iq_ablock(group, 4);
    return T == 1 && (B == 64 || B == 128) && group == B && n_in <= ONE_MAX;
}

void tern_iq_avx2_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (q4_one_ok(group, T, n_in) && group == 64)
        one_token(Wq, sb, 0, 64, 64, 4, Q, qs, Y, n_in, r0, r1);
    else if (q4_one_ok(group, T, n_in))
        one_token(Wq, sb, 0, 128, 128, 4, Q, qs, Y, n_in, r0, r1);
    else
        panel_or_rows(avx2_q4_rows, Wq, sb, group, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
}

/* 8-bit: one token for every group (32-input blocks, kernels.h), the group
 * a constant so that the pairs' expansion (iq_sb_rep) is known */
void tern_iq_avx2_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (T == 1 && group == 64)
        one_token(Wq, sb, 0, 64, 32, 8, Q, qs, Y, n_in, r0, r1);
    else if (T == 1 && group == 128)
        one_token(Wq, sb, 0, 128, 32, 8, Q, qs, Y, n_in, r0, r1);
    else if (T == 1 && group == 32)
        one_token(Wq, sb, 0, 32, 32, 8, Q, qs, Y, n_in, r0, r1);
    else
        panel_or_rows(avx2_q8_rows, Wq, sb, group, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
}


/* tern_iqmatmul16_fn (kernels.h: groups of 64 and 128, n_in up to
 * TERN_IQ16_MAX_IN = ONE_MAX). */
void tern_iq16_avx2_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (q4_one_ok(group, 1, n_in) && group == 64)
        one_token(Wq, sb16, 1, 64, 64, 4, Q, qs, Y, n_in, r0, r1);
    else if (q4_one_ok(group, 1, n_in))
        one_token(Wq, sb16, 1, 128, 128, 4, Q, qs, Y, n_in, r0, r1);
    else
        tern_kernels_scalar()->imatmul_q4h(Wq, sb16, group, Q, qs, Y, n_in, r0, r1);
}

void tern_iq16_avx2_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (group == 64)
        one_token(Wq, sb16, 1, 64, 32, 8, Q, qs, Y, n_in, r0, r1);
    else
        one_token(Wq, sb16, 1, 128, 32, 8, Q, qs, Y, n_in, r0, r1);
}

void tern_iq_avx2_quant(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs)
{
    iq_quant_act(X, T, n_in, group, bits, Q, qs);
}

/* ---- Panels made at load (kernels.h, tern_iq_panels_make), AVX2: the
 * panel tile above on the stored layout - per quad, chunk after chunk of
 * the one stream, each chunk for every token tile of the block and its two
 * row pairs in turn (2 rows x NT tokens a tile, the f32 sums of the quad
 * in F) - with 8-bit
 * words shifted to q - 128 and 4-bit words split into their nibbles as
 * they are loaded, and the quad's {scale, bias} pairs read from the chunk's
 * bf16 words. NT = 1 for one token, 4 otherwise: the same sums, the same
 * combination, so the bits of every table. */
#define APW_AHEAD 2048 /* the stream fetched this far ahead */

static inline __attribute__((always_inline)) void apw_tile(int bits, int NT, const uint8_t *W, long nw,
                                                           const int8_t *const *a, __m256i S[2][4])
{
    const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
        S[0][t] = S[1][t] = _mm256_setzero_si256();
    if (bits == 8) {
        for (long k = 0; k < nw; k++) {
            __m256i s0 = _mm256_xor_si256(LD(W + k * 128), x80), s1 = _mm256_xor_si256(LD(W + k * 128 + 32), x80);
            __m256i u0 = _mm256_abs_epi8(s0), u1 = _mm256_abs_epi8(s1);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i av = LD(a[t] + k * 32);
                S[0][t] = _mm256_add_epi32(S[0][t],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_sign_epi8(av, s0)), ones));
                S[1][t] = _mm256_add_epi32(S[1][t],
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_sign_epi8(av, s1)), ones));
            }
        }
        return;
    }
    for (long k0 = 0; k0 < nw; k0 += 4) { /* 8 input vectors: int16 pair sums <= 8 * 2 * 15 * 127 */
        __m256i p[2][4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            p[0][t] = p[1][t] = _mm256_setzero_si256();
        for (long k = k0; k < k0 + 4; k++) {
            __m256i w0 = LD(W + k * 128), w1 = LD(W + k * 128 + 32);
            __m256i l0 = _mm256_and_si256(w0, nib), h0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), nib);
            __m256i l1 = _mm256_and_si256(w1, nib), h1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), nib);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i e = LD(a[t] + 2 * k * 32), o = LD(a[t] + (2 * k + 1) * 32);
                p[0][t] = _mm256_add_epi16(p[0][t],
                                           _mm256_add_epi16(_mm256_maddubs_epi16(l0, e), _mm256_maddubs_epi16(h0, o)));
                p[1][t] = _mm256_add_epi16(p[1][t],
                                           _mm256_add_epi16(_mm256_maddubs_epi16(l1, e), _mm256_maddubs_epi16(h1, o)));
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            S[0][t] = _mm256_add_epi32(S[0][t], _mm256_madd_epi16(p[0][t], ones));
            S[1][t] = _mm256_add_epi32(S[1][t], _mm256_madd_epi16(p[1][t], ones));
        }
    }
}

/* A row's 8 / rep bf16 pairs of a chunk (zero-padded by the layout) as the 8 blocks' scales and biases. */
static inline __attribute__((always_inline)) void apw_sb(const uint8_t *s, int rep, __m256 *sw, __m256 *bw)
{
    __m256i v;
    if (rep == 1) {
        v = LD(s);
    } else if (rep == 2) {
        v = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)s)),
                                        _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    } else {
        v = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)s)),
                                        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    }
    *sw = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *bw = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* Chunk c (its bytes at W) of a quad for NT tokens (a: their panel
 * inputs, q: their qs), added into F[row][t] (row of the quad). */
static inline __attribute__((always_inline)) void apw_chunk(int bits, int NT, const uint8_t *W, long c, long nw,
                                                            int rep, long ngp, const int8_t *const *a,
                                                            const float *const *q, __m256 (*F)[4])
{
    long nv = bits == 8 ? nw : 2 * nw, per = 8 / rep;
    const int8_t *ac[4];
    __m256 dq[4], Aq[4];
    __m256i A7[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        ac[t] = a[t] + c * nv * 32;
        dq[t] = _mm256_loadu_ps(q[t] + 8 * c);
        Aq[t] = _mm256_loadu_ps(q[t] + ngp + 8 * c);
        A7[t] = _mm256_slli_epi32(_mm256_cvtps_epi32(Aq[t]), 7); /* 128 * A: the q - 128 sums' fix */
    }
    for (int p = 0; p < 2; p++) {
        __m256i S[2][4];
        apw_tile(bits, NT, W + p * 64, nw, ac, S);
        for (int j = 0; j < 2; j++) {
            __m256 sw, bw;
            apw_sb(W + 2 * nw * 64 + (2 * p + j) * per * 4, rep, &sw, &bw);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) { /* iq_fix128 and iq_combine, their operations */
                __m256i I = bits == 8 ? _mm256_add_epi32(S[j][t], A7[t]) : S[j][t];
                __m256 u = _mm256_fmadd_ps(sw, _mm256_cvtepi32_ps(I), _mm256_mul_ps(bw, Aq[t]));
                F[2 * p + j][t] = _mm256_fmadd_ps(u, dq[t], F[2 * p + j][t]);
            }
        }
    }
}

static inline __attribute__((always_inline)) void apw_product(int bits, const uint8_t *P, int group, const int8_t *A,
                                                              const float *qs, float *Y, long T, long n_in, long ldy,
                                                              long r0, long r1)
{
    int rep = group / tern_iq_ablock(group, bits);
    long nw = tern_iq_panel_nw(group, bits), ngp = tern_iq_nbp(n_in, group, bits), nc = ngp / 8;
    long cb = tern_iq_panel_cb(group, bits), span = tern_iq_panel_span(n_in, group, bits);
    long tb = iq_pw_block(span);
    __m256 F[IQ_PW_TOKENS / 4][4][4]; /* a token block's sums of one quad: [tile][row][token] */
    for (long b0 = 0; b0 < T; b0 += tb) {
        long n = b0 + tb < T ? tb : T - b0, t[IQ_PW_TOKENS];
        const int8_t *a[IQ_PW_TOKENS];
        const float *q[IQ_PW_TOKENS];
        iq_pw_tokens(b0, n, A, span, qs, ngp, t, a, q);
        for (long q0 = r0 / 4; q0 * 4 < r1; q0++) {
            const uint8_t *Pq = P + q0 * nc * cb;
            memset(F, 0, (size_t)((n + 3) / 4) * sizeof F[0]);
            /* chunk by chunk, every tile of the block: each chunk read from
             * memory once and used by all the block's tokens at once */
            for (long c = 0; c < nc; c++) {
                const uint8_t *W = Pq + c * cb;
                for (long o = 0; o < cb; o += 64)
                    _mm_prefetch((const char *)W + APW_AHEAD + o, _MM_HINT_T0);
                if (n == 1)
                    apw_chunk(bits, 1, W, c, nw, rep, ngp, a, q, F[0]);
                else
                    for (long i = 0; i < n; i += 4)
                        apw_chunk(bits, 4, W, c, nw, rep, ngp, a + i, q + i, F[i / 4]);
            }
            for (long i = 0; i < n; i++)
                for (int k = 0; k < 4; k++)
                    if (4 * q0 + k >= r0 && 4 * q0 + k < r1)
                        Y[t[i] * ldy + 4 * q0 + k] = iq_hsum(F[i / 4][k][i % 4]);
        }
    }
}

void tern_iq_panels_avx2_q4(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T,
                            long n_in, long ldy, long r0, long r1)
{
    apw_product(4, P, group, A, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_panels_avx2_q8(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T,
                            long n_in, long ldy, long r0, long r1)
{
    apw_product(8, P, group, A, qs, Y, T, n_in, ldy, r0, r1);
}

/* The panel products' inputs (AVX2 gathers: every table's). */
void tern_iq_panel_acts(const int8_t *Q, long T, long n_in, int group, int bits, int8_t *A)
{
    int B = tern_iq_ablock(group, bits);
    long nb = n_in / B, span = tern_iq_panel_span(n_in, group, bits);
    for (long t = 0; t < T; t++)
        panel_acts(Q + t * n_in, B, bits, nb, tern_iq_ngp(nb), A + t * span);
}

void tern_iq_panel_words_avx2(const uint8_t *w, long blk, long nw, uint8_t *dst)
{
    for (long k0 = 0; k0 < nw; k0 += 8) {
        __m256i R[8], O[8];
        for (int j = 0; j < 8; j++)
            R[j] = LD(w + j * blk + 4 * k0);
        panel_t8(R, O);
        for (int k = 0; k < 8; k++)
            _mm256_storeu_si256((__m256i *)(dst + (k0 + k) * 128), O[k]);
    }
}
