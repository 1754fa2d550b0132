/* bf16 weights times bf16 activations with AVX-512 BF16 (kernels.h,
 * tern_bmatmul_fn): vdpbf16ps multiplies 32 bf16 pairs exactly and adds
 * them, two per f32 lane, into 16 f32 accumulators - one instruction per
 * 32 multiply-adds, with no widening of the weights (the f32-activation
 * kernel spends a widening and two FMAs on the same 32). Only called on
 * CPUs with avx512_bf16 (kernels.c). */
#include <immintrin.h>

#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

/* 32 bf16 values as the instruction's vector type (a plain integer load). */
#define LDB(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))

/* A tile of up to 4 rows x 4 tokens, one accumulator per (row, token). A
 * (row, token) result is always the same chain whatever the tile: acc =
 * vdpbf16ps(acc, w[i..i+31], x[i..i+31]) for i = 0, 32, .. in order from
 * zero, then the 16 lanes summed (_mm512_reduce_add_ps), then the tail
 * i >= n32 one exact product at a time - so a token's bits never depend on
 * the batch or on the row range. */
static inline __attribute__((always_inline)) void tile(const uint16_t *W, const uint16_t *X, float *Y, long n_in,
                                                       long ldy, long r, long t, int NR, int NT)
{
    long n32 = n_in & ~31L;
    const uint16_t *w[4], *x[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        w[k] = W + (r + (k < NR ? k : 0)) * n_in;
        x[k] = X + (t + (k < NT ? k : 0)) * n_in;
    }
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            acc[a][b] = _mm512_setzero_ps();
    for (long i = 0; i < n32; i += 32) {
        __m512bh wv[4], xv[4];
#pragma GCC unroll 4
        for (int a = 0; a < NR; a++)
            wv[a] = LDB(w[a] + i);
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++)
            xv[b] = LDB(x[b] + i);
#pragma GCC unroll 4
        for (int a = 0; a < NR; a++)
#pragma GCC unroll 4
            for (int b = 0; b < NT; b++)
                acc[a][b] = _mm512_dpbf16_ps(acc[a][b], wv[a], xv[b]);
    }
#pragma GCC unroll 4
    for (int a = 0; a < NR; a++)
#pragma GCC unroll 4
        for (int b = 0; b < NT; b++) {
            float s = _mm512_reduce_add_ps(acc[a][b]);
            for (long i = n32; i < n_in; i++)
                s += tern_bf16_to_f32(w[a][i]) * tern_bf16_to_f32(x[b][i]);
            Y[(t + b) * ldy + r + a] = s;
        }
}

static inline __attribute__((always_inline)) void rows(const uint16_t *W, const uint16_t *X, float *Y, long n_in,
                                                       long ldy, long r, long T, int NR)
{
    long t = 0;
    for (; t + 4 <= T; t += 4)
        tile(W, X, Y, n_in, ldy, r, t, NR, 4);
    if (T - t == 3)
        tile(W, X, Y, n_in, ldy, r, t, NR, 3);
    else if (T - t == 2)
        tile(W, X, Y, n_in, ldy, r, t, NR, 2);
    else if (T - t == 1)
        tile(W, X, Y, n_in, ldy, r, t, NR, 1);
}

void tern_bf16dot_avx512(const void *Wv, const uint16_t *X, float *Y, long T, long n_in, long ldy, long r0, long r1)
{
    const uint16_t *W = Wv;
    long r = r0;
    /* One token (decode) reads each row once: a row at a time keeps one read
     * stream a thread, which the prefetchers follow better than 4 interleaved
     * ones (2-core Zen 4, 1B bf16 decode, five alternating runs: 12.2 against
     * 10.1 t/s, medians). The same chains, so the same bits. */
    for (; T > 1 && r + 4 <= r1; r += 4)
        rows(W, X, Y, n_in, ldy, r, T, 4);
    for (; r < r1; r++)
        rows(W, X, Y, n_in, ldy, r, T, 1);
}

/* Round to nearest even, 16 at a time (vcvtneps2bf16); the tail and the
 * NaNs as tern_f32_to_bf16. vcvtneps2bf16 reads f32 denormals as zero:
 * those go through the scalar conversion too, so every table converts to
 * the same bits. */
void tern_bf16_act_avx512(const float *X, long n, uint16_t *Xb)
{
    long i = 0;
    const __m512 tiny = _mm512_set1_ps(1.17549435e-38f), absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(X + i), a = _mm512_and_ps(v, absm);
        /* denormals (0 < |x| < 2^-126) and NaNs: the scalar path */
        __mmask16 odd = _mm512_cmp_ps_mask(a, tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_OQ);
        odd |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        _mm256_storeu_si256((__m256i *)(Xb + i), h);
        if (odd)
            for (int k = 0; k < 16; k++)
                if (odd >> k & 1)
                    Xb[i + k] = tern_f32_to_bf16(X[i + k]);
    }
    for (; i < n; i++)
        Xb[i] = tern_f32_to_bf16(X[i]);
}
