/* MXFP4 weights times f32 inputs with AVX2 + FMA (kernels.h,
 * tern_mxmatmul_fn). A block's 16 bytes become its 32 weights by two table
 * lookups (vpshufb: a nibble is an index into twice the E2M1 values, small
 * integers), an interleave of the low (even inputs) and high (odd) nibbles
 * back into input order, and four widenings to f32; the block's scale
 * 2^(E - 128) folds the doubling back.
 *
 * One chain per (row, token) whatever the tile: per block an 8-lane product
 * of the four weight vectors with the inputs (a multiply, then three fmas in
 * input order), folded into the row's 8-lane sum by one fma with the
 * block's scale; one hsum at the end. Tiles of up to 4 rows (independent
 * chains, for decode) decode each block once for up to 8 tokens. */
#include <immintrin.h>
#include <stdint.h>

#include "tensor/cpu/hsum_avx2.h"
#include "tensor/cpu/intdot.h"
#include "tensor/cpu/intdot_simd.h"
#include "tensor/kernels.h"

#define MX_ROWS 4
#define MX_TOKS 8

/* The 32 weights of one block (16 bytes of codes) as 4 x 8 f32, each twice
 * its E2M1 value. */
static inline void mx_block(const uint8_t *q16, __m256 w[4])
{
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i q = _mm_loadu_si128((const __m128i *)q16);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    __m128i v0 = _mm_unpacklo_epi8(lo, hi), v1 = _mm_unpackhi_epi8(lo, hi); /* inputs 0-15, 16-31 */
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8)));
}

static inline __m256 mx_dot(const __m256 w[4], const float *x)
{
    __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), p);
    p = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), p);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), p);
}

void tern_mx_avx2(const uint8_t *W, const uint8_t *E, const float *X, float *Y, long T, long n_in, long ldy, long r0,
                  long r1)
{
    long nb = n_in / 32, rb = n_in / 2;
    for (long r = r0; r < r1; r += MX_ROWS) {
        int nr = r1 - r < MX_ROWS ? (int)(r1 - r) : MX_ROWS;
        for (long t0 = 0; t0 < T; t0 += MX_TOKS) {
            int nt = T - t0 < MX_TOKS ? (int)(T - t0) : MX_TOKS;
            __m256 acc[MX_ROWS][MX_TOKS];
            for (int i = 0; i < nr; i++)
                for (int k = 0; k < nt; k++)
                    acc[i][k] = _mm256_setzero_ps();
            for (long b = 0; b < nb; b++) {
                for (int i = 0; i < nr; i++) {
                    __m256 w[4];
                    mx_block(W + (r + i) * rb + b * 16, w);
                    __m256 s = _mm256_set1_ps(tern_mx_scale(E[(r + i) * nb + b]));
                    for (int k = 0; k < nt; k++)
                        acc[i][k] = _mm256_fmadd_ps(mx_dot(w, X + (t0 + k) * n_in + b * 32), s, acc[i][k]);
                }
            }
            for (int i = 0; i < nr; i++)
                for (int k = 0; k < nt; k++)
                    Y[(t0 + k) * ldy + r + i] = hsum8(acc[i][k]);
        }
    }
}

/* ---- the integer product (kernels.h, tern_imxmatmul_fn) ----
 * A block's 16 bytes become 32 weights (twice the E2M1 value, plus 12:
 * unsigned 0..24) in nibble order - low nibbles (even inputs), then high
 * (odd) - by one 256-bit vpshufb, matching the activations' 4-bit layout;
 * vpmaddubsw / vpmaddwd give each block's exact int32 sum in 8 lanes, 8
 * blocks reduced by the hadd tree of intdot_simd.h, 12 A_b taken back (the
 * activations' block sums), and combined as the contract says. Rows one at
 * a time, tokens in pairs sharing each block's decode. */

/* 2^(e - 128) for 8 E8M0 bytes (tern_mx_scale in 8 lanes). */
static inline __m256 mx_scale8(const uint8_t *e8)
{
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e8));
    __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e); /* e 0, 1: 2^-128, 2^-127 */
    __m256i is_big = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, is_big));
}

/* A block's 32 weights plus 12 (unsigned, 0..24: vpmaddubsw's unsigned
 * operand; the 12 * A_b it adds is taken back after the sums). */
static inline __m256i mx_wblock(const uint8_t *q16)
{
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16,
                                         18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i q = _mm_loadu_si128((const __m128i *)q16);
    __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    return _mm256_shuffle_epi8(lut, n);
}

/* sum (w + 12) * a of one block in 8 int32 lanes (pairs at most 2 * 24 * 127: no saturation). */
static inline __m256i mx_idot(__m256i w12, const int8_t *a)
{
    __m256i p = _mm256_maddubs_epi16(w12, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The exact I_b of 8 blocks from their sums S_b of (w + 12) * a: S_b - 12 * A_b (A_b, an integer
 * stored as f32 by the activations' quantization, kernels.h). */
static inline __m256i mx_unbias(__m256i S, const float *A)
{
    __m256i a = _mm256_cvtps_epi32(_mm256_loadu_ps(A));
    return _mm256_sub_epi32(S, _mm256_add_epi32(_mm256_slli_epi32(a, 3), _mm256_slli_epi32(a, 2)));
}

/* One row against nt (1 or 2, a constant where inlined) tokens: y[0..nt). */
static inline __attribute__((always_inline)) void imx_row(const uint8_t *w, const uint8_t *e, long nb, long nbp,
                                                          const int8_t *q0, const int8_t *q1, const float *d0,
                                                          const float *d1, int nt, float *y)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (long c = 0; c < nbp; c += 8) {
        __m256i s0[8], s1[8];
        uint8_t et[8] = {0};
        const uint8_t *ep = e + c;
        if (c + 8 <= nb) {
            for (int j = 0; j < 8; j++) {
                __m256i wv = mx_wblock(w + (c + j) * 16);
                s0[j] = mx_idot(wv, q0 + (c + j) * 32);
                if (nt == 2)
                    s1[j] = mx_idot(wv, q1 + (c + j) * 32);
            }
        } else { /* the row's last chunk: padding blocks have I = 0, so u = 0 */
            for (int j = 0; j < 8; j++) {
                __m256i wv = c + j < nb ? mx_wblock(w + (c + j) * 16) : _mm256_setzero_si256();
                s0[j] = c + j < nb ? mx_idot(wv, q0 + (c + j) * 32) : _mm256_setzero_si256();
                if (nt == 2)
                    s1[j] = c + j < nb ? mx_idot(wv, q1 + (c + j) * 32) : _mm256_setzero_si256();
                if (c + j < nb)
                    et[j] = e[c + j];
            }
            ep = et;
        }
        __m256 sw = mx_scale8(ep);
        __m256i I0 = mx_unbias(iq_sum8(_mm256_hadd_epi32(s0[0], s0[1]), _mm256_hadd_epi32(s0[2], s0[3]),
                                       _mm256_hadd_epi32(s0[4], s0[5]), _mm256_hadd_epi32(s0[6], s0[7])),
                               d0 + nbp + c);
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(sw, _mm256_cvtepi32_ps(I0)), _mm256_loadu_ps(d0 + c), acc0);
        if (nt == 2) {
            __m256i I1 = mx_unbias(iq_sum8(_mm256_hadd_epi32(s1[0], s1[1]), _mm256_hadd_epi32(s1[2], s1[3]),
                                           _mm256_hadd_epi32(s1[4], s1[5]), _mm256_hadd_epi32(s1[6], s1[7])),
                                   d1 + nbp + c);
            acc1 = _mm256_fmadd_ps(_mm256_mul_ps(sw, _mm256_cvtepi32_ps(I1)), _mm256_loadu_ps(d1 + c), acc1);
        }
    }
    y[0] = iq_hsum(acc0);
    if (nt == 2)
        y[1] = iq_hsum(acc1);
}

/* Two rows against one token (decode): two independent chains, each
 * activation block loaded once for both; each row's bits are imx_row's. */
static void imx_rows2(const uint8_t *w0, const uint8_t *e0, const uint8_t *w1, const uint8_t *e1, long nb, long nbp,
                      const int8_t *q, const float *d, float *y0, float *y1)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (long c = 0; c < nbp; c += 8) {
        __m256i s0[8], s1[8];
        uint8_t et0[8] = {0}, et1[8] = {0};
        const uint8_t *ep0 = e0 + c, *ep1 = e1 + c;
        if (c + 8 <= nb) {
            for (int j = 0; j < 8; j++) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(q + (c + j) * 32));
                __m256i v0 = mx_wblock(w0 + (c + j) * 16), v1 = mx_wblock(w1 + (c + j) * 16);
                s0[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(v0, a), _mm256_set1_epi16(1));
                s1[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(v1, a), _mm256_set1_epi16(1));
            }
        } else {
            for (int j = 0; j < 8; j++) {
                int in = c + j < nb;
                __m256i v0 = in ? mx_wblock(w0 + (c + j) * 16) : _mm256_setzero_si256();
                __m256i v1 = in ? mx_wblock(w1 + (c + j) * 16) : _mm256_setzero_si256();
                s0[j] = in ? mx_idot(v0, q + (c + j) * 32) : _mm256_setzero_si256();
                s1[j] = in ? mx_idot(v1, q + (c + j) * 32) : _mm256_setzero_si256();
                if (in)
                    et0[j] = e0[c + j], et1[j] = e1[c + j];
            }
            ep0 = et0, ep1 = et1;
        }
        __m256 dv = _mm256_loadu_ps(d + c);
        __m256i I0 = mx_unbias(iq_sum8(_mm256_hadd_epi32(s0[0], s0[1]), _mm256_hadd_epi32(s0[2], s0[3]),
                                       _mm256_hadd_epi32(s0[4], s0[5]), _mm256_hadd_epi32(s0[6], s0[7])),
                               d + nbp + c);
        __m256i I1 = mx_unbias(iq_sum8(_mm256_hadd_epi32(s1[0], s1[1]), _mm256_hadd_epi32(s1[2], s1[3]),
                                       _mm256_hadd_epi32(s1[4], s1[5]), _mm256_hadd_epi32(s1[6], s1[7])),
                               d + nbp + c);
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(mx_scale8(ep0), _mm256_cvtepi32_ps(I0)), dv, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(mx_scale8(ep1), _mm256_cvtepi32_ps(I1)), dv, acc1);
    }
    *y0 = iq_hsum(acc0);
    *y1 = iq_hsum(acc1);
}

void tern_imx_avx2(const uint8_t *W, const uint8_t *E, const int8_t *Q, const float *qs, float *Y, long T, long n_in,
                   long ldy, long r0, long r1)
{
    long nb = n_in / 32, nbp = tern_iq_nbp(n_in, 32, 4), rb = n_in / 2;
    long r = r0;
    if (T == 1) /* decode: rows in pairs */
        for (; r + 2 <= r1; r += 2)
            imx_rows2(W + r * rb, E + r * nb, W + (r + 1) * rb, E + (r + 1) * nb, nb, nbp, Q, qs, &Y[r], &Y[r + 1]);
    for (; r < r1; r++) {
        const uint8_t *w = W + r * rb, *e = E + r * nb;
        long t = 0;
        for (; t + 2 <= T; t += 2) {
            float y[2];
            imx_row(w, e, nb, nbp, Q + t * n_in, Q + (t + 1) * n_in, qs + t * 2 * nbp, qs + (t + 1) * 2 * nbp, 2, y);
            Y[t * ldy + r] = y[0];
            Y[(t + 1) * ldy + r] = y[1];
        }
        if (t < T) {
            float y[2];
            imx_row(w, e, nb, nbp, Q + t * n_in, NULL, qs + t * 2 * nbp, NULL, 1, y);
            Y[t * ldy + r] = y[0];
        }
    }
}

/* ---- int16 activations (kernels.h, tern_quant_act16_fn, tern_imx16matmul_fn) ----
 * A block's weights widen to two int16 vectors (even inputs, odd inputs:
 * the activations' order), vpmaddwd against the int16 activations gives
 * exact int32 pair sums (|w| <= 12). Otherwise as the int8 product. */

void tern_q16_avx2(const float *X, long T, long n_in, int16_t *Q, float *qs)
{
    long nb = n_in / 32, nbp = tern_iq_nbp(n_in, 32, 4);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (long t = 0; t < T; t++) {
        float *d = qs + t * 2 * nbp;
        for (long b = 0; b < 2 * nbp; b++)
            d[b] = 0.0f;
        for (long b = 0; b < nb; b++) {
            const float *x = X + t * n_in + b * 32;
            int16_t *q = Q + t * n_in + b * 32;
            __m256 m = _mm256_setzero_ps();
            for (int i = 0; i < 32; i += 8)
                m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            if (!(amax >= 1e-30f)) {
                for (int i = 0; i < 32; i++)
                    q[i] = 0;
                continue;
            }
            __m256 id = _mm256_set1_ps(32767.0f / amax);
            int32_t v[32];
            for (int i = 0; i < 32; i += 8)
                _mm256_storeu_si256((__m256i *)(v + i), _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), id)));
            for (int i = 0; i < 16; i++) { /* nibble order: evens, then odds */
                q[i] = (int16_t)v[2 * i];
                q[16 + i] = (int16_t)v[2 * i + 1];
            }
            d[b] = amax / 32767.0f;
        }
    }
}

/* One block's weights as int16: even inputs in *we, odd in *wo (the
 * activations' nibble order). */
static inline void mx16_block(const uint8_t *q16, __m256i *we, __m256i *wo)
{
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i q = _mm_loadu_si128((const __m128i *)q16);
    *we = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(q, m4)));
    *wo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
}

/* A block's exact int32 pair sums against int16 activations a. */
static inline __m256i mx16_dot(__m256i we, __m256i wo, const int16_t *a)
{
    return _mm256_add_epi32(_mm256_madd_epi16(we, _mm256_loadu_si256((const __m256i *)a)),
                            _mm256_madd_epi16(wo, _mm256_loadu_si256((const __m256i *)(a + 16))));
}

/* Rows w0 (and w1 when nr = 2) against tokens q0 (and q1 when nt = 2): the
 * pairs (row, token) share block decodes and activation loads; each
 * (row, token) has imx_row's combination, so the same bits in any pairing.
 * nr, nt are constants where inlined. */
static inline __attribute__((always_inline)) void imx16_tile(const uint8_t *w0, const uint8_t *e0, const uint8_t *w1,
                                                             const uint8_t *e1, int nr, long nb, long nbp,
                                                             const int16_t *q0, const int16_t *q1, const float *d0,
                                                             const float *d1, int nt, float y[2][2])
{
    __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (long c = 0; c < nbp; c += 8) {
        __m256i s[2][2][8];
        uint8_t et[2][8] = {{0}, {0}};
        const uint8_t *ep[2] = {e0 + c, nr == 2 ? e1 + c : e0 + c};
        int full = c + 8 <= nb;
        for (int j = 0; j < 8; j++) {
            int in = full || c + j < nb;
            for (int i = 0; i < nr; i++) {
                __m256i we, wo;
                if (in) {
                    mx16_block((i ? w1 : w0) + (c + j) * 16, &we, &wo);
                    s[i][0][j] = mx16_dot(we, wo, q0 + (c + j) * 32);
                    if (nt == 2)
                        s[i][1][j] = mx16_dot(we, wo, q1 + (c + j) * 32);
                    if (!full)
                        et[i][j] = (i ? e1 : e0)[c + j];
                } else {
                    s[i][0][j] = s[i][1][j] = _mm256_setzero_si256();
                }
            }
        }
        for (int i = 0; i < nr; i++) {
            __m256 sw = mx_scale8(full ? ep[i] : et[i]);
            for (int k = 0; k < nt; k++) {
                __m256i I = iq_sum8(_mm256_hadd_epi32(s[i][k][0], s[i][k][1]), _mm256_hadd_epi32(s[i][k][2], s[i][k][3]),
                                    _mm256_hadd_epi32(s[i][k][4], s[i][k][5]), _mm256_hadd_epi32(s[i][k][6], s[i][k][7]));
                acc[i][k] = _mm256_fmadd_ps(_mm256_mul_ps(sw, _mm256_cvtepi32_ps(I)),
                                            _mm256_loadu_ps((k ? d1 : d0) + c), acc[i][k]);
            }
        }
    }
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < nt; k++)
            y[i][k] = iq_hsum(acc[i][k]);
}

void tern_imx16_avx2(const uint8_t *W, const uint8_t *E, const int16_t *Q, const float *qs, float *Y, long T,
                     long n_in, long ldy, long r0, long r1)
{
    long nb = n_in / 32, nbp = tern_iq_nbp(n_in, 32, 4), rb = n_in / 2;
    float y[2][2];
    long r = r0;
    if (T == 1) /* decode: rows in pairs sharing each activation load */
        for (; r + 2 <= r1; r += 2) {
            imx16_tile(W + r * rb, E + r * nb, W + (r + 1) * rb, E + (r + 1) * nb, 2, nb, nbp, Q, NULL, qs, NULL, 1,
                       y);
            Y[r] = y[0][0];
            Y[r + 1] = y[1][0];
        }
    for (; r < r1; r++) { /* tokens in pairs sharing each block's decode */
        const uint8_t *w = W + r * rb, *e = E + r * nb;
        long t = 0;
        for (; t + 2 <= T; t += 2) {
            imx16_tile(w, e, NULL, NULL, 1, nb, nbp, Q + t * n_in, Q + (t + 1) * n_in, qs + t * 2 * nbp,
                       qs + (t + 1) * 2 * nbp, 2, y);
            Y[t * ldy + r] = y[0][0];
            Y[(t + 1) * ldy + r] = y[0][1];
        }
        if (t < T) {
            imx16_tile(w, e, NULL, NULL, 1, nb, nbp, Q + t * n_in, NULL, qs + t * 2 * nbp, NULL, 1, y);
            Y[t * ldy + r] = y[0][0];
        }
    }
}
