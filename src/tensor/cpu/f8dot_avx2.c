/* FP8 E4M3 weight products with AVX2 + FMA + F16C (contract: kernels.h,
 * tern_f8matmul_fn). A weight byte b is the f16 ((b & 0x7f) << 7) |
 * ((b & 0x80) << 8) times 256, exactly (the exponent biases differ by 8),
 * so 32 bytes widen with two unpacks that put each byte in the high half of
 * a 16-bit lane (b << 8), an arithmetic shift right by one and a mask that
 * clears the copied sign bit, and four vcvtph2ps; the 256 joins the block's
 * scale. Compiled with -mavx2 -mfma -mf16c, called only where the CPU has
 * them. */
#include <immintrin.h>
#include <string.h>

#include "tensor/cpu/intdot.h"
#include "tensor/cpu/hsum_avx2.h"

/* 32 weight bytes as 4 x 8 f32 (each 1/256 of its value): w[k] holds
 * bytes 8k .. 8k+7. unpacklo/hi work within 128-bit lanes: lo holds bytes
 * 0-7 and 16-23, hi 8-15 and 24-31. */
static inline void f8_dec32(const uint8_t *p, __m256 w[4])
{
    const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16((short)0xbf80);
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, v), 1), m);
    __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, v), 1), m);
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
    w[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
    w[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
    w[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
}

/* 8 weight bytes as 8 f32 (1/256 of each value). */
static inline __m256 f8_dec8(const uint8_t *p)
{
    __m128i v = _mm_loadl_epi64((const __m128i *)p);
    __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(_mm_setzero_si128(), v), 1),
                              _mm_set1_epi16((short)0xbf80));
    return _mm256_cvtph_ps(h);
}

/* Rows r .. r+NR-1 times tokens t .. t+NT-1 (NR x NT <= 8 accumulators).
 * Each (row, token) result is one chain whatever the tile: per block, an
 * 8-lane accumulator takes fma(w[i..i+7], x[i..i+7]) for i = the block's
 * start, +8, ... in order (the inputs of a last partial 8 zero-padded);
 * an 8-lane sum takes fma(256 * the block's scale, accumulator) in block
 * order; its hsum8 is the result (the lanes' sums reordered against the
 * reference's per-block sums: f32 reordering). So batched results equal
 * single-token ones bit for bit. */
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
    __m256 y[4][4];
    _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) y[a][k] = _mm256_setzero_ps();
    for (long c = 0; c < ncol; c++) {
        long b = c * fs_cols, e = b + fs_cols < n_in ? b + fs_cols : n_in;
        long e32 = b + ((e - b) & ~31L), e8 = b + ((e - b) & ~7L);
        __m256 acc[4][4];
        _Pragma("GCC unroll 4") for (int a = 0; a < 4; a++)
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) acc[a][k] = _mm256_setzero_ps();
        for (long i = b; i < e32; i += 32)
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
            {
                __m256 wv[4];
                f8_dec32(w[a] + i, wv);
                _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++)
                {
                    acc[a][k] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(x[k] + i), acc[a][k]);
                    acc[a][k] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(x[k] + i + 8), acc[a][k]);
                    acc[a][k] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(x[k] + i + 16), acc[a][k]);
                    acc[a][k] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(x[k] + i + 24), acc[a][k]);
                }
            }
        for (long i = e32; i < e8; i += 8)
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
            {
                __m256 wv = f8_dec8(w[a] + i);
                _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) acc[a][k] =
                    _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[k] + i), acc[a][k]);
            }
        if (e8 < e) { /* the last 1-7 inputs, zero-padded to 8 (0 * 0 adds nothing) */
            float xp[4][8] = {{0}};
            _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) memcpy(xp[k], x[k] + e8, (size_t)(e - e8) * 4);
            _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
            {
                uint8_t wp[8] = {0};
                memcpy(wp, w[a] + e8, (size_t)(e - e8));
                __m256 wv = f8_dec8(wp);
                _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) acc[a][k] =
                    _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp[k]), acc[a][k]);
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
        {
            __m256 sc = _mm256_set1_ps(s[a][c] * 256.0f);
            _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) y[a][k] = _mm256_fmadd_ps(sc, acc[a][k], y[a][k]);
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < NR; a++)
        _Pragma("GCC unroll 4") for (int k = 0; k < NT; k++) Y[(t + k) * ldy + r + a] = hsum8(y[a][k]);
}

/* From 8 tokens, blocks up to this wide (the hub's 128) are widened to f32
 * once for many token quads (f8_wide): F8_WIDE_ROWS rows x a slab of whole
 * blocks (F8_SLAB inputs) at a time - those weights as f32 (13 KB) and a
 * quad's inputs for the slab (2 KB) stay in L1 while every row triple of
 * the group runs over them; the per-(row, token) 8-lane sums wait on the
 * stack between slabs, F8_PASS tokens at a time (24 KB). bench_kernels
 * 2048 x 8192, one thread: T = 32 32 GMAC/s (12 rows x 256 inputs: 30,
 * 2-row tiles decoding per quad: 22). Wider blocks (a scale per row or per
 * tensor) and 4-7 tokens take f8_tile's quads (T = 4: 23 against 17
 * widened), which decode each weight once per 4 tokens. */
#define F8_WIDE_COLS 128
#define F8_WIDE_ROWS 24
#define F8_SLAB 128
#define F8_PASS 32

/* f8_wide's tile: widened rows p .. p+NR-1 of the group (NR <= 3) times
 * tokens t0+t .. t0+t+3, the slab's blocks in order, each block's sum
 * folded into the parked 8-lane sums. */
static inline __attribute__((always_inline)) void f8_wide_tile(const float (*sc)[F8_SLAB / 32], int fs_cols,
                                                               const float *X, long n_in, long c0, long c1,
                                                               float (*buf)[F8_WIDE_COLS + 8],
                                                               __m256 (*park)[F8_PASS], int p, long t0, long t,
                                                               int NR)
{
    for (long c = c0; c < c1; c++) {
        long b = c * fs_cols, len = (b + fs_cols < n_in ? b + fs_cols : n_in) - b, n8 = len & ~7L;
        const float *w[3], *x[4];
        _Pragma("GCC unroll 3") for (int a = 0; a < 3; a++) w[a] = buf[p + (a < NR ? a : 0)] + (c - c0) * fs_cols;
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) x[k] = X + (t0 + t + k) * n_in + b;
        __m256 acc[3][4];
        _Pragma("GCC unroll 3") for (int a = 0; a < 3; a++)
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) acc[a][k] = _mm256_setzero_ps();
        for (long i = 0; i < n8; i += 8) {
            __m256 wv[3];
            _Pragma("GCC unroll 3") for (int a = 0; a < NR; a++) wv[a] = _mm256_load_ps(w[a] + i);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
            {
                __m256 xv = _mm256_loadu_ps(x[k] + i);
                _Pragma("GCC unroll 3") for (int a = 0; a < NR; a++) acc[a][k] =
                    _mm256_fmadd_ps(wv[a], xv, acc[a][k]);
            }
        }
        if (n8 < len) { /* the block's last 1-7 inputs, zero-padded */
            __m256 wv[3];
            _Pragma("GCC unroll 3") for (int a = 0; a < NR; a++) wv[a] = _mm256_load_ps(w[a] + n8);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
            {
                float xp[8] = {0};
                memcpy(xp, x[k] + n8, (size_t)(len - n8) * 4);
                __m256 xv = _mm256_loadu_ps(xp);
                _Pragma("GCC unroll 3") for (int a = 0; a < NR; a++) acc[a][k] =
                    _mm256_fmadd_ps(wv[a], xv, acc[a][k]);
            }
        }
        _Pragma("GCC unroll 3") for (int a = 0; a < NR; a++)
        {
            __m256 sv = _mm256_set1_ps(sc[p + a][c - c0]);
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) park[p + a][t + k] =
                _mm256_fmadd_ps(sv, acc[a][k], park[p + a][t + k]);
        }
    }
}

/* Rows r .. r+NRW-1 (NRW a multiple of 4, at most F8_WIDE_ROWS) times tokens
 * 0 .. T4-1 (T4 a multiple of 4): per slab, the rows decoded once into f32
 * on the stack (each block zero-padded to a multiple of 8), then 3-row x
 * 4-token tiles over it (12 accumulators) - f8_tile's chains exactly (the same values, the
 * same fma in the same order, a block's last inputs zero-padded, the
 * 8-lane sum parked between slabs). Prefill: the decode is spread over up
 * to F8_PASS tokens. */
static __attribute__((noinline)) void f8_wide(const uint8_t *W, const float *fs, int fs_rows, int fs_cols,
                                              const float *X, float *Y, long T4, long n_in, long ldy, long r, int NRW)
{
    long ncol = (n_in + fs_cols - 1) / fs_cols, per_slab = fs_cols <= F8_SLAB ? F8_SLAB / fs_cols : 1;
    float buf[F8_WIDE_ROWS][F8_WIDE_COLS + 8] __attribute__((aligned(32)));
    /* the slab's block scales times 256 (a slab holds one block, or up to F8_SLAB / 32 of 32 or more) */
    float sc[F8_WIDE_ROWS][F8_SLAB / 32];
    __m256 park[F8_WIDE_ROWS][F8_PASS];
    const float *srow[F8_WIDE_ROWS]; /* each row's block scales (one division a row, not a block) */
    for (int a = 0; a < NRW; a++)
        srow[a] = fs + (r + a) / fs_rows * ncol;
    for (long t0 = 0; t0 < T4; t0 += F8_PASS) {
        long nt = T4 - t0 < F8_PASS ? T4 - t0 : F8_PASS;
        for (int a = 0; a < NRW; a++)
            for (long k = 0; k < nt; k++)
                park[a][k] = _mm256_setzero_ps();
        for (long c0 = 0; c0 < ncol; c0 += per_slab) {
            long c1 = c0 + per_slab < ncol ? c0 + per_slab : ncol;
            /* decode: block c of row a at buf[a] + (c - c0) * fs_cols, its width rounded up to 8 */
            for (int a = 0; a < NRW; a++)
                for (long c = c0; c < c1; c++) {
                    long b = c * fs_cols, len = (b + fs_cols < n_in ? b + fs_cols : n_in) - b, i = 0;
                    const uint8_t *wa = W + (r + a) * n_in + b;
                    float *o = buf[a] + (c - c0) * fs_cols;
                    for (; i + 32 <= len; i += 32) {
                        __m256 v[4];
                        f8_dec32(wa + i, v);
                        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) _mm256_store_ps(o + i + 8 * k, v[k]);
                    }
                    for (; i + 8 <= len; i += 8)
                        _mm256_store_ps(o + i, f8_dec8(wa + i));
                    if (i < len) {
                        uint8_t wp[8] = {0};
                        memcpy(wp, wa + i, (size_t)(len - i));
                        _mm256_store_ps(o + i, f8_dec8(wp));
                    }
                    sc[a][c - c0] = srow[a][c] * 256.0f;
                }
            for (long t = 0; t < nt; t += 4) {
                int p = 0;
                for (; p + 3 <= NRW; p += 3)
                    f8_wide_tile(sc, fs_cols, X, n_in, c0, c1, buf, park, p, t0, t, 3);
                if (NRW - p == 2)
                    f8_wide_tile(sc, fs_cols, X, n_in, c0, c1, buf, park, p, t0, t, 2);
                else if (NRW - p == 1)
                    f8_wide_tile(sc, fs_cols, X, n_in, c0, c1, buf, park, p, t0, t, 1);
            }
        }
        for (long k = 0; k < nt; k++)
            for (int a = 0; a < NRW; a++)
                Y[(t0 + k) * ldy + r + a] = hsum8(park[a][k]);
    }
}

/* Rows r .. r+NR-1 (NR 4, or 1 at the end) for tokens t .. T-1: token
 * quads in 2-row x 4-token tiles (each decoded weight vector serves 4
 * tokens), the 1-3 tokens left in NR-row tiles (4 rows keep 4 FMA chains
 * busy at decode). */
static inline __attribute__((always_inline)) void f8_rows(const uint8_t *W, const float *fs, int fs_rows,
                                                          int fs_cols, const float *X, float *Y, long t, long T,
                                                          long n_in, long ldy, long r, int NR)
{
    for (; t + 4 <= T; t += 4) {
        if (NR == 4) {
            f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, 2, 4);
            f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r + 2, t, 2, 4);
        } else {
            f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, 1, 4);
        }
    }
    if (T - t >= 2) {
        f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, NR, 2);
        t += 2;
    }
    if (T - t == 1)
        f8_tile(W, fs, fs_rows, fs_cols, X, Y, n_in, ldy, r, t, NR, 1);
}

void tern_f8_avx2(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                  long n_in, long ldy, long r0, long r1)
{
    long r = r0;
    if (T >= 8 && fs_cols <= F8_WIDE_COLS) { /* from 8 tokens, the quads widened, rows in groups of 4 to F8_WIDE_ROWS */
        long t4 = T & ~3L;
        while (r1 - r >= 4) {
            int nr = (int)(((r1 - r) & ~3L) < F8_WIDE_ROWS ? (r1 - r) & ~3L : F8_WIDE_ROWS);
            f8_wide(W, fs, fs_rows, fs_cols, X, Y, t4, n_in, ldy, r, nr);
            r += nr;
        }
        for (long q = r0; q < r; q += 4) /* the 1-3 tokens left, of those rows */
            f8_rows(W, fs, fs_rows, fs_cols, X, Y, t4, T, n_in, ldy, q, 4);
    }
    for (; r + 4 <= r1; r += 4)
        f8_rows(W, fs, fs_rows, fs_cols, X, Y, 0, T, n_in, ldy, r, 4);
    for (; r < r1; r++)
        f8_rows(W, fs, fs_rows, fs_cols, X, Y, 0, T, n_in, ldy, r, 1);
}
