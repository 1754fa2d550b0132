/* AVX-512 kernels (16 f32 lanes): the AVX2 structure at twice the width.
 * Compiled with -mavx512f/bw/vl and only called when the CPU has them.
 * Same contracts as kernels_scalar.c. */
#include <immintrin.h>

#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ld_bf16(const uint16_t *p)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline float sc_f32(float v) { return v; }

/* Register tiles: up to 4 rows x 4 tokens per pass over n_in, one 16-lane
 * accumulator per (row, token), so each weight vector loaded (and widened
 * to f32) serves 4 tokens and each input vector 4 rows. A (row, token)
 * result is always the same chain: acc = fma(w[i..i+15], x[i..i+15], acc)
 * for i = 0, 16, .. in order, then hsum16, then the tail i >= n16 one term
 * at a time - whatever the tile it is computed in, so a token's bits do not
 * depend on the batch (batched decoding reproduces single-sequence
 * decoding) and tiles never change with T. A short tile (fewer rows or
 * tokens left) is the same code with NR/NT smaller. */
#define AVX512_TILE(name, wtype, LD, SC)                                                                      \
    static inline __attribute__((always_inline)) void name##_tile(const wtype *W, const float *X, float *Y,   \
                                                                  long n_in, long ldy, long r, long t, int NR,  \
                                                                  int NT)                                     \
    {                                                                                                         \
        long n16 = n_in & ~15L;                                                                               \
        const wtype *w[4];                                                                                    \
        const float *x[4];                                                                                    \
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                                   \
        {                                                                                                     \
            w[k] = W + (r + (k < NR ? k : 0)) * n_in;                                                         \
            x[k] = X + (t + (k < NT ? k : 0)) * n_in;                                                         \
        }                                                                                                     \
        __m512 acc[4][4];                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)                                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) acc[a][b] = _mm512_setzero_ps();              \
        for (long i = 0; i < n16; i += 16) {                                                                  \
            __m512 wv[4], xv[4];                                                                              \
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++) wv[a] = LD(w[a] + i);                        \
            _Pragma("GCC unroll 4") for (int b = 0; b < NT; b++) xv[b] = _mm512_loadu_ps(x[b] + i);           \
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)                                              \
                _Pragma("GCC unroll 4") for (int b = 0; b < NT; b++) acc[a][b] =                              \
                    _mm512_fmadd_ps(wv[a], xv[b], acc[a][b]);                                                 \
        }                                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)                                                  \
            _Pragma("GCC unroll 4") for (int b = 0; b < NT; b++)                                              \
        {                                                                                                     \
            float s = hsum16(acc[a][b]);                                                                      \
            for (long i = n16; i < n_in; i++)                                                                 \
                s += SC(w[a][i]) * x[b][i];                                                                   \
            Y[(t + b) * ldy + r + a] = s;                                                                     \
        }                                                                                                     \
    }                                                                                                         \
    static inline __attribute__((always_inline)) void name##_rows(const wtype *W, const float *X, float *Y,   \
                                                                  long n_in, long ldy, long r, long T, int NR)  \
    {                                                                                                         \
        long t = 0;                                                                                           \
        for (; t + 4 <= T; t += 4)                                                                            \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 4);                                                     \
        if (T - t == 3)                                                                                       \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 3);                                                     \
        else if (T - t == 2)                                                                                  \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 2);                                                     \
        else if (T - t == 1)                                                                                  \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 1);                                                     \
    }                                                                                                         \
    static void name(const void *Wv, const float *X, float *Y, long T, long n_in, long ldy, long r0, long r1) \
    {                                                                                                         \
        const wtype *W = Wv;                                                                                  \
        long r = r0;                                                                                          \
        for (; r + 4 <= r1; r += 4)                                                                           \
            name##_rows(W, X, Y, n_in, ldy, r, T, 4);                                                         \
        for (; r < r1; r++)                                                                                   \
            name##_rows(W, X, Y, n_in, ldy, r, T, 1);                                                         \
    }

AVX512_TILE(matmul_f32, float, ld_f32, sc_f32)
AVX512_TILE(matmul_bf16, uint16_t, ld_bf16, tern_bf16_to_f32)
AVX512_TILE(matmul_f16, uint16_t, ld_f16, tern_f16_to_f32)

/* ---- MLX affine-quantized weights (see kernels.h) ----
 * 32 weights become two 16-lane vectors; 64 at a time feed four
 * accumulators (a group of 32 uses two), folded in one fixed order. */
static inline void q8_load32(const uint8_t *p, __m512 *w)
{
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
}

static inline void q4_load32(const uint8_t *p, __m512 *w)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
}

#define AVX512_QMATMUL(name, BITS, LOAD32)                                                        \
    static inline __attribute__((always_inline)) void name##_row(                                 \
        const uint8_t *w, const float *s, int group, long ng, const float *x0, const float *x1,  \
        const float *xs0, const float *xs1, float *y0, float *y1, int two)                        \
    {                                                                                             \
        __m512 ta = _mm512_setzero_ps(), tb = ta;                                                 \
        float ba = 0.0f, bb = 0.0f;                                                               \
        for (long g = 0; g < ng; g++) {                                                           \
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                           \
            __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                            \
            long i = g * group, e = (g + 1) * group;                                              \
            for (; i + 64 <= e; i += 64) {                                                        \
                __m512 q[2], u[2];                                                                \
                LOAD32(w + i * BITS / 8, q);                                                      \
                LOAD32(w + (i + 32) * BITS / 8, u);                                               \
                a0 = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(x0 + i), a0);                          \
                a1 = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(x0 + i + 16), a1);                     \
                a2 = _mm512_fmadd_ps(u[0], _mm512_loadu_ps(x0 + i + 32), a2);                     \
                a3 = _mm512_fmadd_ps(u[1], _mm512_loadu_ps(x0 + i + 48), a3);                     \
                if (two) {                                                                        \
                    b0 = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(x1 + i), b0);                      \
                    b1 = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(x1 + i + 16), b1);                 \
                    b2 = _mm512_fmadd_ps(u[0], _mm512_loadu_ps(x1 + i + 32), b2);                 \
                    b3 = _mm512_fmadd_ps(u[1], _mm512_loadu_ps(x1 + i + 48), b3);                 \
                }                                                                                 \
            }                                                                                     \
            if (i < e) {                                                                          \
                __m512 q[2];                                                                      \
                LOAD32(w + i * BITS / 8, q);                                                      \
                a0 = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(x0 + i), a0);                          \
                a1 = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(x0 + i + 16), a1);                     \
                if (two) {                                                                        \
                    b0 = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(x1 + i), b0);                      \
                    b1 = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(x1 + i + 16), b1);                 \
                }                                                                                 \
            }                                                                                     \
            __m512 sc = _mm512_set1_ps(s[2 * g]);                                                 \
            ta = _mm512_fmadd_ps(sc, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), ta); \
            ba += s[2 * g + 1] * xs0[g];                                                          \
            if (two) {                                                                            \
                tb = _mm512_fmadd_ps(sc, _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)), tb); \
                bb += s[2 * g + 1] * xs1[g];                                                      \
            }                                                                                     \
        }                                                                                         \
        *y0 = hsum16(ta) + ba;                                                                    \
        if (two)                                                                                  \
            *y1 = hsum16(tb) + bb;                                                                \
    }                                                                                             \
    static void name(const uint8_t *Wq, const float *sb, int group, const float *X, const float *xsum, \
                     float *Y, long T, long n_in, long ldy, long r0, long r1)                     \
    {                                                                                             \
        long ng = n_in / group;                                                                   \
        for (long r = r0; r < r1; r++) {                                                          \
            const uint8_t *w = Wq + r * n_in * BITS / 8;                                          \
            const float *s = sb + r * ng * 2;                                                     \
            long t0 = 0;                                                                          \
            for (; t0 + 1 < T; t0 += 2)                                                           \
                name##_row(w, s, group, ng, X + t0 * n_in, X + (t0 + 1) * n_in, xsum + t0 * ng,  \
                           xsum + (t0 + 1) * ng, &Y[t0 * ldy + r], &Y[(t0 + 1) * ldy + r], 1);    \
            if (t0 < T)                                                                           \
                name##_row(w, s, group, ng, X + t0 * n_in, NULL, xsum + t0 * ng, NULL,            \
                           &Y[t0 * ldy + r], NULL, 0);                                            \
        }                                                                                         \
    }

AVX512_QMATMUL(matmul_q4, 4, q4_load32)
AVX512_QMATMUL(matmul_q8, 8, q8_load32)

static float dot(const float *a, const float *b, long n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), a1);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), a0);
    float acc = hsum16(_mm512_add_ps(a0, a1));
    for (; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, long n)
{
    __m512 av = _mm512_set1_ps(a);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static const tern_kernels k_avx512 = {"avx512", matmul_f32, matmul_bf16, matmul_f16, matmul_q4, matmul_q8,
                                      tern_iq_avx2_quant, tern_iq_vnni_q4, tern_iq_vnni_q8, tern_bf16dot_avx512,
                                      tern_bf16_act_avx512, dot, axpy, NULL, NULL, NULL, NULL,
                                      tern_iq16_vnni_q4, tern_iq16_vnni_q8, 0, tern_f8_avx512, tern_mx_avx2, tern_imx_avx2, tern_q16_avx2, tern_imx16_avx2,
                                      tern_iq_panels_q4, tern_iq_panels_q8, tern_iq_panel_acts};

const tern_kernels *tern_kernels_avx512_table(void);
const tern_kernels *tern_kernels_avx512_table(void) { return &k_avx512; }
