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
