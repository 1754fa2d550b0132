/* FP8 E4M3 weight products with AVX-512 F/BW/VL (contract: kernels.h,
 * tern_f8matmul_fn): f8dot_avx2.c's decode at 16 lanes - 16 bytes
 * zero-extended to 16-bit lanes, shifted into the high half, shifted back
 * by one (arithmetic) and masked to the f16 ((b & 0x7f) << 7) |
 * ((b & 0x80) << 8), 1/256 of the weight, then one vcvtph2ps; the 256
 * joins the block's scale. Compiled with -mavx512f/bw/vl, called only
 * where the CPU has them. */
#include <immintrin.h>

#include "tensor/cpu/intdot.h"

/* 16 weight bytes (the first n of them, the rest zero) as 16 f32, each
 * 1/256 of its value. */
static inline __m512 f8_dec16(const uint8_t *p, __mmask16 m)
{
    __m256i v = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
    v = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1), _mm256_set1_epi16((short)0xbf80));
    return _mm512_cvtph_ps(v);
}

/* Rows r .. r+NR-1 times tokens t .. t+NT-1 (up to 4 x 4 accumulators).
 * Each (row, token) result is one chain whatever the tile: per block, a
 * 16-lane accumulator takes fma(w[i..i+15], x[i..i+15]) for i = the block's
 * start, +16, ... in order (the last partial 16 masked: zeros add
 * nothing), _mm512_reduce_add_ps, times 256 * the block's scale, added to
 * the row's sum in block order - batched results equal single-token ones
 * bit for bit. */
static inline __attribute__((always_inline)) void f8_tile(const uint8_t *W, const float *fs, int fs_rows,
                                                          int fs_cols, const float *X, float *Y, long n_in,
                                                          long ldy, long r, long t, int NR, int NT)
{
    long ncol = (n_in + fs_cols - 1) / fs_cols;
    const uint8_t *w[4];
    const float *s[4], *x[4];
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
    {
        long rk = r + (k < NR ? k : 0);
        w[k] = W + rk * n_in;
        s[k] = fs + rk / fs_rows * ncol;
        x[k] = X + (t + (k < NT ? k : 0)) * n_in;
    }
    float y[4][4] = {{0}};
    for (long c = 0; c < ncol; c++) {
        long b = c * fs_cols, e = b + fs_cols < n_in ? b + fs_cols : n_in;
        __m512 acc[4][4];
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) acc[a][k] = _mm512_setzero_ps();
        for (long i = b; i < e; i += 16) {
            __mmask16 m = e - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (e - i)) - 1);
            __m512 xv[4];
            _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) xv[k] = _mm512_maskz_loadu_ps(m, x[k] + i);
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
            {
                __m512 wv = f8_dec16(w[a] + i, m);
                _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) acc[a][k] =
                    _mm512_fmadd_ps(wv, xv[k], acc[a][k]);
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
        {
            float sc = s[a][c] * 256.0f;
            _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) y[a][k] += sc * _mm512_reduce_add_ps(acc[a][k]);
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
        _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) Y[(t + k) * ldy + r + a] = y[a][k];
}

/* Rows r .. r+NR-1 (NR 4, or 1 at the end) for all T tokens: 4-token tiles,
 * then the 1-3 tokens left. */
static inline __attribute__((always_inline)) void f8_rows(const uint8_t *W, const float *fs, int fs_rows,
                                                          int fs_cols, const float *X, float *Y, long T, long n_in,
                                                          long ldy, long r, int NR)
{
    long t = 0;
    for (; t + 4 <= T; t += 4)
        f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, NR, 4);
    if (T - t >= 2) {
        f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, NR, 2);
        t += 2;
    }
    if (T - t == 1)
        f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, NR, 1);
}

void tern_f8_avx512(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                    long n_in, long ldy, long r0, long r1)
{
    long r = r0;
    for (; r + 4 <= r1; r += 4)
        f8_rows(W, fs, fs_rows, fs_cols, X, Y, T, n_in, ldy, r, 4);
    for (; r < r1; r++)
        f8_rows(W, fs, fs_rows, fs_cols, X, Y, T, n_in, ldy, r, 1);
}
