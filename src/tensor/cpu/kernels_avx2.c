/* AVX2 + FMA kernels (8 f32 lanes). Compiled with -mavx2 -mfma -mf16c and
 * only called when the CPU has them. Same contracts as kernels_scalar.c. */
#include <immintrin.h>
#include <string.h>

#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"
#include "tensor/cpu/hsum_avx2.h"

static inline __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 ld_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline float sc_f32(float v) { return v; }

/* Register tiles of 2 rows x 4 tokens (8 accumulators of the 16
 * registers; 4 rows x 1-2 tokens for the tokens left over, decode
 * included), one 8-lane accumulator per (row, token): each weight vector
 * loaded serves 4 tokens and each input vector 2 rows. A (row, token)
 * result is always the same chain - acc = fma(w[i..i+7], x[i..i+7], acc)
 * for i = 0, 8, .. in order, hsum8, then the tail one term at a time -
 * whatever tile computes it, so batched results equal single-token ones
 * bit for bit and the tile shape never depends on T. */
/* K-blocked tiles (name##_kb below): inputs per slab (a quad's 4 KB of f32
 * inputs and KB_ROWS rows' weights, widened to f32 on the stack: L1)
 * and rows per block (a multiple of the tile's 3). */
#define KB_SLAB 256
#define KB_ROWS 24
/* Tokens from which the slab's weights are widened to f32 once for all
 * quads (fewer quads: widened in the tile's loop; the same values either
 * way): bench_kernels bf16, T = 16 34 vs 30 GMAC/s unwidened, T = 128 31
 * vs 33.6. */
#define KB_WIDE_T 32
/* Tokens a K-blocked pass takes (the parked accumulators live on the
 * stack: (KB_ROWS + 2) x KB_T vectors, 53 KB); the backend's blocks for
 * such tables are 64 tokens too (backend_cpu.c mm_tiled). */
#define KB_T 64

#define AVX2_TILE(name, wtype, LD, SC)                                                                        \
    static inline __attribute__((always_inline)) void name##_tile(const wtype *W, const float *X, float *Y,   \
                                                                  long n_in, long ldy, long r, long t, int NR,  \
                                                                  int NT, const wtype *pf)                    \
    {                                                                                                         \
        long n8 = n_in & ~7L;                                                                                 \
        const wtype *w[4];                                                                                    \
        const float *x[4];                                                                                    \
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                                   \
        {                                                                                                     \
            w[k] = W + (r + (k < NR ? k : 0)) * n_in;                                                         \
            x[k] = X + (t + (k < NT ? k : 0)) * n_in;                                                         \
        }                                                                                                     \
        __m256 acc[4][4];                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)                                                   \
            _Pragma("GCC unroll 4") for (int b = 0; b < 4; b++) acc[a][b] = _mm256_setzero_ps();              \
        for (long i = 0; i < n8; i += 8) {                                                                    \
            __m256 wv[4];                                                                                     \
            if (pf) { /* decode: the next 4 rows, a pace ahead (contiguous: 4 x 8 weights an iteration) */   \
                _mm_prefetch((const char *)(pf + 4 * i), _MM_HINT_T0);                                        \
                if (sizeof(wtype) == 4)                                                                       \
                    _mm_prefetch((const char *)(pf + 4 * i + 16), _MM_HINT_T0);                               \
            }                                                                                                 \
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++) wv[a] = LD(w[a] + i);                        \
            _Pragma("GCC unroll 4") for (int b = 0; b < NT; b++)                                              \
            {                                                                                                 \
                __m256 xv = _mm256_loadu_ps(x[b] + i);                                                        \
                _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++) acc[a][b] =                              \
                    _mm256_fmadd_ps(wv[a], xv, acc[a][b]);                                                    \
            }                                                                                                 \
        }                                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)                                                  \
            _Pragma("GCC unroll 4") for (int b = 0; b < NT; b++)                                              \
        {                                                                                                     \
            float s = hsum8(acc[a][b]);                                                                       \
            for (long i = n8; i < n_in; i++)                                                                  \
                s += SC(w[a][i]) * x[b][i];                                                                   \
            Y[(t + b) * ldy + r + a] = s;                                                                     \
        }                                                                                                     \
    }                                                                                                         \
    /* rows r .. r+NR-1 (NR 4 or fewer at the end) for all T tokens: token    \
     * quads in 2-row x 4-token tiles, the 1-3 tokens left in NR-row tiles    \
     * (4 rows keep 4 FMA chains busy at decode) */                           \
    static inline __attribute__((always_inline)) void name##_rows(const wtype *W, const float *X, float *Y,   \
                                                                  long n_in, long ldy, long r, long T, int NR,  \
                                                                  const wtype *pf)                            \
    {                                                                                                         \
        long t = 0;                                                                                           \
        for (; t + 4 <= T; t += 4) {                                                                          \
            if (NR == 4) {                                                                                    \
                name##_tile(W, X, Y, n_in, ldy, r, t, 2, 4, NULL);                                                  \
                name##_tile(W, X, Y, n_in, ldy, r + 2, t, 2, 4, NULL);                                              \
            } else {                                                                                          \
                name##_tile(W, X, Y, n_in, ldy, r, t, 1, 4, NULL);                                                  \
            }                                                                                                 \
        }                                                                                                     \
        if (T - t >= 2) {                                                                                     \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 2, NULL);                                                     \
            t += 2;                                                                                           \
        }                                                                                                     \
        if (T - t == 1)                                                                                       \
            name##_tile(W, X, Y, n_in, ldy, r, t, NR, 1, pf);                                                     \
    }                                                                                                         \
    /* From 4 tokens: 3-row x 4-token tiles (12 accumulators) over slabs of    \
     * KB_SLAB inputs - a slab of every row's weights and a quad's inputs     \
     * stay in L1 - with each (row, token) accumulator parked in F between    \
     * slabs, so it is still the one chain above. Token quads only; the      \
     * 1-3 tokens left take name##_rows. F: (r1 - r0 + 2) * (T & ~3) vectors. */ \
    static inline __attribute__((always_inline)) void name##_kb(const wtype *W, const float *X, float *Y,     \
                                                                long T, long n_in, long ldy, long r0, long r1,  \
                                                                __m256 *F, int wide)                          \
    {                                                                                                         \
        long n8 = n_in & ~7L, nr = r1 - r0, Tq = T & ~3L;                                                     \
        _Alignas(32) float Wf[KB_ROWS * KB_SLAB]; /* the slab's weights as f32, widened once for all quads */ \
        memset(F, 0, (size_t)(nr + 2) * Tq * sizeof(__m256));                                                 \
        for (long k0 = 0; k0 < n8; k0 += KB_SLAB) {                                                           \
            long k1 = k0 + KB_SLAB < n8 ? k0 + KB_SLAB : n8;                                                  \
            for (long i = 0; i < nr && wide; i++)                                                             \
                for (long k = k0; k < k1; k += 8)                                                             \
                    _mm256_store_ps(Wf + i * KB_SLAB + k - k0, LD(W + (r0 + i) * n_in + k));                  \
            for (long t0 = 0; t0 < Tq; t0 += 4) {                                                             \
                const float *x0 = X + t0 * n_in, *x1 = x0 + n_in, *x2 = x1 + n_in, *x3 = x2 + n_in;           \
                for (long i = 0; i < nr; i += 3) {                                                            \
                    long i1 = i + 1 < nr ? i + 1 : i, i2 = i + 2 < nr ? i + 2 : i;                            \
                    __m256 *f0 = F + i * Tq + t0, *f1 = F + (i + 1 < nr ? i + 1 : nr) * Tq + t0,              \
                           *f2 = F + (i + 2 < nr ? i + 2 : nr + 1) * Tq + t0;                                 \
                    const float *wf0 = Wf + i * KB_SLAB - k0, *wf1 = Wf + i1 * KB_SLAB - k0,                   \
                                *wf2 = Wf + i2 * KB_SLAB - k0;                                                \
                    const wtype *w0 = W + (r0 + i) * n_in, *w1 = W + (r0 + i1) * n_in,                        \
                                *w2 = W + (r0 + i2) * n_in;                                                   \
                    __m256 a00 = f0[0], a01 = f0[1], a02 = f0[2], a03 = f0[3];                                \
                    __m256 a10 = f1[0], a11 = f1[1], a12 = f1[2], a13 = f1[3];                                \
                    __m256 a20 = f2[0], a21 = f2[1], a22 = f2[2], a23 = f2[3];                                \
                    for (long k = k0; k < k1; k += 8) {                                                       \
                        __m256 v0 = wide ? _mm256_load_ps(wf0 + k) : LD(w0 + k),                              \
                               v1 = wide ? _mm256_load_ps(wf1 + k) : LD(w1 + k),                              \
                               v2 = wide ? _mm256_load_ps(wf2 + k) : LD(w2 + k), xv;                          \
                        xv = _mm256_loadu_ps(x0 + k);                                                         \
                        a00 = _mm256_fmadd_ps(v0, xv, a00);                                                   \
                        a10 = _mm256_fmadd_ps(v1, xv, a10);                                                   \
                        a20 = _mm256_fmadd_ps(v2, xv, a20);                                                   \
                        xv = _mm256_loadu_ps(x1 + k);                                                         \
                        a01 = _mm256_fmadd_ps(v0, xv, a01);                                                   \
                        a11 = _mm256_fmadd_ps(v1, xv, a11);                                                   \
                        a21 = _mm256_fmadd_ps(v2, xv, a21);                                                   \
                        xv = _mm256_loadu_ps(x2 + k);                                                         \
                        a02 = _mm256_fmadd_ps(v0, xv, a02);                                                   \
                        a12 = _mm256_fmadd_ps(v1, xv, a12);                                                   \
                        a22 = _mm256_fmadd_ps(v2, xv, a22);                                                   \
                        xv = _mm256_loadu_ps(x3 + k);                                                         \
                        a03 = _mm256_fmadd_ps(v0, xv, a03);                                                   \
                        a13 = _mm256_fmadd_ps(v1, xv, a13);                                                   \
                        a23 = _mm256_fmadd_ps(v2, xv, a23);                                                   \
                    }                                                                                         \
                    f0[0] = a00, f0[1] = a01, f0[2] = a02, f0[3] = a03;                                       \
                    f1[0] = a10, f1[1] = a11, f1[2] = a12, f1[3] = a13;                                       \
                    f2[0] = a20, f2[1] = a21, f2[2] = a22, f2[3] = a23;                                       \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        for (long t = 0; t < Tq; t++)                                                                         \
            for (long i = 0; i < nr; i++) {                                                                   \
                const wtype *w = W + (r0 + i) * n_in;                                                         \
                const float *x = X + t * n_in;                                                                \
                float s = hsum8(F[i * Tq + t]);                                                               \
                for (long k = n8; k < n_in; k++)                                                              \
                    s += SC(w[k]) * x[k];                                                                     \
                Y[t * ldy + r0 + i] = s;                                                                      \
            }                                                                                                 \
    }                                                                                                         \
    static void name(const void *Wv, const float *X, float *Y, long T, long n_in, long ldy, long r0, long r1) \
    {                                                                                                         \
        const wtype *W = Wv;                                                                                  \
        if (T >= 4) { /* token quads, KB_T tokens at a time (a token's chain does not depend on the others) */ \
            const long Tq = T & ~3L;                                                                          \
            __m256 F[(KB_ROWS + 2) * KB_T];                                                                   \
            for (long t0 = 0; t0 < Tq; t0 += KB_T) {                                                          \
                const long tn = Tq - t0 < KB_T ? Tq - t0 : KB_T;                                              \
                for (long r = r0; r < r1; r += KB_ROWS)                                                       \
                    if (tn >= KB_WIDE_T)                                                                      \
                        name##_kb(W, X + t0 * n_in, Y + t0 * ldy, tn, n_in, ldy, r,                           \
                                  r + KB_ROWS < r1 ? r + KB_ROWS : r1, F, 1);                                 \
                    else                                                                                      \
                        name##_kb(W, X + t0 * n_in, Y + t0 * ldy, tn, n_in, ldy, r,                           \
                                  r + KB_ROWS < r1 ? r + KB_ROWS : r1, F, 0);                                 \
            }                                                                                                 \
            if (Tq == T)                                                                                      \
                return;                                                                                       \
            X += Tq * n_in;                                                                                   \
            Y += Tq * ldy;                                                                                    \
            T -= Tq;                                                                                          \
        }                                                                                                     \
        long r = r0;                                                                                          \
        for (; r + 4 <= r1; r += 4)                                                                           \
            name##_rows(W, X, Y, n_in, ldy, r, T, 4, T == 1 && r + 8 <= r1 ? W + (r + 4) * n_in : NULL);      \
        for (; r < r1; r++)                                                                                   \
            name##_rows(W, X, Y, n_in, ldy, r, T, 1, NULL);                                                   \
    }

AVX2_TILE(matmul_f32, float, ld_f32, sc_f32)
AVX2_TILE(matmul_bf16, uint16_t, ld_bf16, tern_bf16_to_f32)
AVX2_TILE(matmul_f16, uint16_t, ld_f16, tern_f16_to_f32)

/* ---- MLX affine-quantized weights (see kernels.h) ----
 * 32 weights at a time become four 8-lane vectors; each token keeps four
 * accumulators per group, folded into its total in one fixed order. */
static inline void q8_load32(const uint8_t *p, __m256 *w)
{
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * k))));
}

static inline void q4_load32(const uint8_t *p, __m256 *w)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    __m128i a = _mm_unpacklo_epi8(lo, hi), c = _mm_unpackhi_epi8(lo, hi); /* values 0..15, 16..31 */
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(a));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(a, 8)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(c, 8)));
}

#define AVX2_QMATMUL(name, BITS, LOAD32)                                                          \
    static inline __attribute__((always_inline)) void name##_row(                                 \
        const uint8_t *w, const float *s, int group, long ng, const float *x0, const float *x1,  \
        const float *xs0, const float *xs1, float *y0, float *y1, int two)                        \
    {                                                                                             \
        __m256 ta = _mm256_setzero_ps(), tb = ta;                                                 \
        float ba = 0.0f, bb = 0.0f;                                                               \
        for (long g = 0; g < ng; g++) {                                                           \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                           \
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;                                            \
            for (long i = g * group; i < (g + 1) * group; i += 32) {                              \
                __m256 q[4];                                                                      \
                LOAD32(w + i * BITS / 8, q);                                                      \
                a0 = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(x0 + i), a0);                          \
                a1 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x0 + i + 8), a1);                      \
                a2 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x0 + i + 16), a2);                     \
                a3 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x0 + i + 24), a3);                     \
                if (two) {                                                                        \
                    b0 = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(x1 + i), b0);                      \
                    b1 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x1 + i + 8), b1);                  \
                    b2 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x1 + i + 16), b2);                 \
                    b3 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x1 + i + 24), b3);                 \
                }                                                                                 \
            }                                                                                     \
            __m256 sc = _mm256_set1_ps(s[2 * g]);                                                 \
            ta = _mm256_fmadd_ps(sc, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), ta); \
            ba += s[2 * g + 1] * xs0[g];                                                          \
            if (two) {                                                                            \
                tb = _mm256_fmadd_ps(sc, _mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)), tb); \
                bb += s[2 * g + 1] * xs1[g];                                                      \
            }                                                                                     \
        }                                                                                         \
        *y0 = hsum8(ta) + ba;                                                                     \
        if (two)                                                                                  \
            *y1 = hsum8(tb) + bb;                                                                 \
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

AVX2_QMATMUL(matmul_q4, 4, q4_load32)
AVX2_QMATMUL(matmul_q8, 8, q8_load32)

static float dot(const float *a, const float *b, long n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float acc = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, long n)
{
    __m256 av = _mm256_set1_ps(a);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static const tern_kernels k_avx2 = {"avx2", matmul_f32, matmul_bf16, matmul_f16, matmul_q4, matmul_q8,
                                    tern_iq_avx2_quant, tern_iq_avx2_q4, tern_iq_avx2_q8, NULL, NULL, dot, axpy, NULL, NULL, NULL, NULL,
                                    tern_iq16_avx2_q4, tern_iq16_avx2_q8, 1, tern_f8_avx2, tern_mx_avx2, tern_imx_avx2, tern_q16_avx2, tern_imx16_avx2, tern_iq_panels_avx2_q4,
                                    tern_iq_panels_avx2_q8, tern_iq_panel_acts};

const tern_kernels *tern_kernels_avx2_table(void);
const tern_kernels *tern_kernels_avx2_table(void) { return &k_avx2; }
