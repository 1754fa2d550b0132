/* AVX2 + FMA + F16C versions of the fused KV reads (kv_head_dot,
 * kv_head_axpy in kv_codec.c, the reference they are tested against):
 * bf16, f16, q8, q4, r4, r3 (groups of 32) and f8 eight elements at a time;
 * the dequantization is one FMA per eight codes (x = a * c + b; f8: one
 * product by 256 a, its codes widened to f16 of 1/256 their value). Anything
 * else (f32, a head or group not a multiple of 8, r3's short groups) goes
 * to the scalar code. scores / wsum (the attention's g heads against n
 * rows) convert each f16 / bf16 block once for four heads; quantized rows
 * are decoded once per row. Compiled with
 * -mavx2 -mfma -mf16c (CMake, by the file name); called only when the CPU
 * has them (kv_reader_best). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "model/kv.h"
#include "model/kv_int.h"
#include "model/vexp_avx2.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load_bf16(const uint8_t *p)
{
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 load_f16(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* Eight E4M3 codes as floats of 1/256 their value (exact): the 7 low bits
 * shifted up by 7 and the sign by 8 are those f16s. */
static inline __m256 load_f8(const uint8_t *p)
{
    __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)p));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
    return _mm256_cvtph_ps(h);
}

static inline __m256 load_u8(const uint8_t *p)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}

/* 8 bytes of nibble pairs: the low nibbles (elements j..j+7) and the high
 * ones (j + g/2 ..). */
static inline void load_nib(const uint8_t *p, __m256 *lo, __m256 *hi)
{
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

/* Codes 8k .. 8k+7 of an r3 group of 32 (kv_codec.c's planes: low bits of
 * code e in byte e % 8 at bits 2 (e / 8); the high bit in byte 8 + e % 4 at
 * bit e / 4), as floats. */
static inline __m256 load_r3(const uint8_t *c, int k)
{
    __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)c));
    lo = _mm256_and_si256(_mm256_srli_epi32(lo, 2 * k), _mm256_set1_epi32(3));
    uint32_t hb;
    memcpy(&hb, c + 8, 4);
    const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25), _mm256_set1_epi32(2 * k));
    __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)hb), sh), _mm256_set1_epi32(1));
    return _mm256_cvtepi32_ps(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 2)));
}

static inline float f16at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static int fast_ok(kv_type t, int hd)
{
    int g = kv_type_group(t, hd);
    switch (t) {
    case KV_BF16:
    case KV_F16:
    case KV_Q8:
    case KV_F8: return hd % 8 == 0 && g % 8 == 0;
    case KV_Q4:
    case KV_R4: return g % 16 == 0;
    case KV_R3: return g == 32;
    default: return 0;
    }
}

static float dot_avx2(kv_type t, int hd, const float *q, const uint8_t *src)
{
    if (!fast_ok(t, hd))
        return kv_head_dot(t, hd, q, src);
    __m256 acc = _mm256_setzero_ps();
    if (t == KV_BF16 || t == KV_F16) {
        for (int e = 0; e < hd; e += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), t == KV_BF16 ? load_bf16(src + 2 * e) : load_f16(src + 2 * e),
                                  acc);
        return hsum(acc);
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, src += gb) {
        if (t == KV_F8) {
            const __m256 va = _mm256_set1_ps(f16at(src) * 256.0f);
            for (int e = 0; e < g; e += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + o + e), _mm256_mul_ps(load_f8(src + 2 + e), va), acc);
            continue;
        }
        float a = f16at(src), b = t == KV_R4 ? -7.5f * a : t == KV_R3 ? -3.5f * a : f16at(src + 2);
        const uint8_t *c = src + (t == KV_R4 || t == KV_R3 ? 2 : 4);
        __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
        const float *qq = q + o;
        if (t == KV_R3) {
            for (int k = 0; k < 4; k++)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qq + 8 * k), _mm256_fmadd_ps(load_r3(c, k), va, vb), acc);
        } else if (t == KV_Q8) {
            for (int e = 0; e < g; e += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qq + e), _mm256_fmadd_ps(load_u8(c + e), va, vb), acc);
        } else {
            int h = g / 2;
            for (int j = 0; j < h; j += 8) {
                __m256 lo, hi;
                load_nib(c + j, &lo, &hi);
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qq + j), _mm256_fmadd_ps(lo, va, vb), acc);
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(qq + j + h), _mm256_fmadd_ps(hi, va, vb), acc);
            }
        }
    }
    return hsum(acc);
}

static void axpy_avx2(kv_type t, int hd, float w, const uint8_t *src, float *out)
{
    if (!fast_ok(t, hd)) {
        kv_head_axpy(t, hd, w, src, out);
        return;
    }
    if (t == KV_BF16 || t == KV_F16) {
        __m256 vw = _mm256_set1_ps(w);
        for (int e = 0; e < hd; e += 8)
            _mm256_storeu_ps(out + e, _mm256_fmadd_ps(vw, t == KV_BF16 ? load_bf16(src + 2 * e) : load_f16(src + 2 * e),
                                                      _mm256_loadu_ps(out + e)));
        return;
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, src += gb) {
        if (t == KV_F8) {
            const __m256 va = _mm256_set1_ps(w * f16at(src) * 256.0f);
            for (int e = 0; e < g; e += 8)
                _mm256_storeu_ps(out + o + e, _mm256_fmadd_ps(load_f8(src + 2 + e), va, _mm256_loadu_ps(out + o + e)));
            continue;
        }
        float a = f16at(src), b = t == KV_R4 ? -7.5f * a : t == KV_R3 ? -3.5f * a : f16at(src + 2);
        const uint8_t *c = src + (t == KV_R4 || t == KV_R3 ? 2 : 4);
        __m256 va = _mm256_set1_ps(w * a), vb = _mm256_set1_ps(w * b);
        float *y = out + o;
        if (t == KV_R3) {
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(y + 8 * k,
                                 _mm256_add_ps(_mm256_loadu_ps(y + 8 * k), _mm256_fmadd_ps(load_r3(c, k), va, vb)));
        } else if (t == KV_Q8) {
            for (int e = 0; e < g; e += 8)
                _mm256_storeu_ps(y + e, _mm256_add_ps(_mm256_loadu_ps(y + e), _mm256_fmadd_ps(load_u8(c + e), va, vb)));
        } else {
            int h = g / 2;
            for (int j = 0; j < h; j += 8) {
                __m256 lo, hi;
                load_nib(c + j, &lo, &hi);
                _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), _mm256_fmadd_ps(lo, va, vb)));
                _mm256_storeu_ps(y + j + h, _mm256_add_ps(_mm256_loadu_ps(y + j + h), _mm256_fmadd_ps(hi, va, vb)));
            }
        }
    }
}

/* ---- g heads against n rows (kv_reader.scores / wsum) ---- */

/* Elements e .. e+7 of a stored head of type t (f32, f16 or bf16). */
static inline __attribute__((always_inline)) __m256 load_t(kv_type t, const uint8_t *p, int e)
{
    if (t == KV_F32)
        return _mm256_loadu_ps((const float *)(const void *)p + e);
    return t == KV_F16 ? load_f16(p + 2 * e) : load_bf16(p + 2 * e);
}

/* The four sums of a0..a3, each in a fixed order. */
static inline void hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *out)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* scores of nh (1-4, a constant after inlining) heads q0.. (stride hd)
 * for one plain type t (also a constant), hd % 8 == 0: two rows at a time
 * (2 nh independent sums), each row's eight-element blocks converted once
 * for the nh heads; a last odd row alone. */
static inline __attribute__((always_inline)) void scores_nh(kv_type t, int nh, int hd, int n, const float *q0,
                                                            const uint8_t *const *rows, float *s0, int ps)
{
    int r = 0;
    for (; r + 2 <= n; r += 2) {
        const uint8_t *x = rows[r], *y = rows[r + 1];
        __m256 a[4], b[4];
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++)
            a[i] = b[i] = _mm256_setzero_ps();
        for (int e = 0; e < hd; e += 8) {
            __m256 k = load_t(t, x, e), l = load_t(t, y, e);
            #pragma GCC unroll 4
            for (int i = 0; i < nh; i++) {
                __m256 w = _mm256_loadu_ps(q0 + (size_t)i * hd + e);
                a[i] = _mm256_fmadd_ps(w, k, a[i]);
                b[i] = _mm256_fmadd_ps(w, l, b[i]);
            }
        }
        #pragma GCC unroll 4
        for (int i = nh; i < 4; i++)
            a[i] = b[i] = _mm256_setzero_ps();
        float s4[4], t4[4];
        hsum4(a[0], a[1], a[2], a[3], s4);
        hsum4(b[0], b[1], b[2], b[3], t4);
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++) {
            s0[(size_t)i * ps + r] = s4[i];
            s0[(size_t)i * ps + r + 1] = t4[i];
        }
    }
    for (; r < n; r++) {
        const uint8_t *x = rows[r];
        __m256 a[4];
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            a[i] = _mm256_setzero_ps();
        for (int e = 0; e < hd; e += 8) {
            __m256 k = load_t(t, x, e);
            #pragma GCC unroll 4
            for (int i = 0; i < nh; i++)
                a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + (size_t)i * hd + e), k, a[i]);
        }
        float s4[4];
        hsum4(a[0], a[1], a[2], a[3], s4);
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++)
            s0[(size_t)i * ps + r] = s4[i];
    }
}

static inline __attribute__((always_inline)) void scores_plain(kv_type t, int hd, int g, int n, const float *q,
                                                               const uint8_t *const *rows, float *sc, int ps)
{
    int j = 0;
    for (; j + 4 <= g; j += 4)
        scores_nh(t, 4, hd, n, q + (size_t)j * hd, rows, sc + (size_t)j * ps, ps);
    switch (g - j) {
    case 3: scores_nh(t, 3, hd, n, q + (size_t)j * hd, rows, sc + (size_t)j * ps, ps); break;
    case 2: scores_nh(t, 2, hd, n, q + (size_t)j * hd, rows, sc + (size_t)j * ps, ps); break;
    case 1: scores_nh(t, 1, hd, n, q + (size_t)j * hd, rows, sc + (size_t)j * ps, ps); break;
    default: break;
    }
}

/* wsum of nh (1-4) heads for one plain type: per sixteen-element column
 * block (then a last eight), the rows in order into the heads'
 * accumulators (registers), each block converted once for the nh. */
static inline __attribute__((always_inline)) void wsum_nh(kv_type t, int nh, int hd, int n, const float *p0, int ps,
                                                          const uint8_t *const *rows, float *o0)
{
    int e = 0;
    for (; e + 16 <= hd; e += 16) {
        __m256 a[4], b[4];
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++) {
            a[i] = _mm256_loadu_ps(o0 + (size_t)i * hd + e);
            b[i] = _mm256_loadu_ps(o0 + (size_t)i * hd + e + 8);
        }
        for (int r = 0; r < n; r++) {
            __m256 v = load_t(t, rows[r], e), u = load_t(t, rows[r], e + 8);
            #pragma GCC unroll 4
            for (int i = 0; i < nh; i++) {
                __m256 w = _mm256_broadcast_ss(p0 + (size_t)i * ps + r);
                a[i] = _mm256_fmadd_ps(w, v, a[i]);
                b[i] = _mm256_fmadd_ps(w, u, b[i]);
            }
        }
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++) {
            _mm256_storeu_ps(o0 + (size_t)i * hd + e, a[i]);
            _mm256_storeu_ps(o0 + (size_t)i * hd + e + 8, b[i]);
        }
    }
    for (; e < hd; e += 8) {
        __m256 a[4];
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++)
            a[i] = _mm256_loadu_ps(o0 + (size_t)i * hd + e);
        for (int r = 0; r < n; r++) {
            __m256 v = load_t(t, rows[r], e);
            #pragma GCC unroll 4
            for (int i = 0; i < nh; i++)
                a[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + (size_t)i * ps + r), v, a[i]);
        }
        #pragma GCC unroll 4
        for (int i = 0; i < nh; i++)
            _mm256_storeu_ps(o0 + (size_t)i * hd + e, a[i]);
    }
}

static inline __attribute__((always_inline)) void wsum_plain(kv_type t, int hd, int g, int n, const float *p, int ps,
                                                             const uint8_t *const *rows, float *o)
{
    int j = 0;
    for (; j + 4 <= g; j += 4)
        wsum_nh(t, 4, hd, n, p + (size_t)j * ps, ps, rows, o + (size_t)j * hd);
    switch (g - j) {
    case 3: wsum_nh(t, 3, hd, n, p + (size_t)j * ps, ps, rows, o + (size_t)j * hd); break;
    case 2: wsum_nh(t, 2, hd, n, p + (size_t)j * ps, ps, rows, o + (size_t)j * hd); break;
    case 1: wsum_nh(t, 1, hd, n, p + (size_t)j * ps, ps, rows, o + (size_t)j * hd); break;
    default: break;
    }
}

/* A quantized head decoded to floats (the fused axpy's arithmetic). */
static void decode_avx2(kv_type t, int hd, const uint8_t *src, float *x)
{
    memset(x, 0, (size_t)hd * sizeof(float));
    axpy_avx2(t, hd, 1.0f, src, x);
}

static void scores_avx2(kv_type t, int hd, int g, int n, const float *q, const uint8_t *const *rows, float *sc, int ps)
{
    if (hd % 8 || hd > KV_HEAD_DIM_MAX) {
        kv_heads_scores(t, hd, g, n, q, rows, sc, ps);
    } else if (t == KV_F16) {
        scores_plain(KV_F16, hd, g, n, q, rows, sc, ps);
    } else if (t == KV_BF16) {
        scores_plain(KV_BF16, hd, g, n, q, rows, sc, ps);
    } else if (t == KV_F32) {
        scores_plain(KV_F32, hd, g, n, q, rows, sc, ps);
    } else if (!fast_ok(t, hd)) {
        kv_heads_scores(t, hd, g, n, q, rows, sc, ps);
    } else { /* quantized: each row decoded once, then as f32 */
        float x[KV_HEAD_DIM_MAX];
        const uint8_t *xr[1] = {(const uint8_t *)x};
        for (int r = 0; r < n; r++) {
            decode_avx2(t, hd, rows[r], x);
            scores_plain(KV_F32, hd, g, 1, q, xr, sc + r, ps);
        }
    }
}

static void wsum_avx2(kv_type t, int hd, int g, int n, const float *p, int ps, const uint8_t *const *rows, float *o)
{
    if (hd % 8 || hd > KV_HEAD_DIM_MAX) {
        kv_heads_wsum(t, hd, g, n, p, ps, rows, o);
    } else if (t == KV_F16) {
        wsum_plain(KV_F16, hd, g, n, p, ps, rows, o);
    } else if (t == KV_BF16) {
        wsum_plain(KV_BF16, hd, g, n, p, ps, rows, o);
    } else if (t == KV_F32) {
        wsum_plain(KV_F32, hd, g, n, p, ps, rows, o);
    } else if (!fast_ok(t, hd)) {
        kv_heads_wsum(t, hd, g, n, p, ps, rows, o);
    } else {
        float x[KV_HEAD_DIM_MAX];
        const uint8_t *xr[1] = {(const uint8_t *)x};
        for (int r = 0; r < n; r++) {
            decode_avx2(t, hd, rows[r], x);
            wsum_plain(KV_F32, hd, g, 1, p + r, ps, xr, o);
        }
    }
}

/* kv_softmax_part with exp8 (every element through it, the tail too) and
 * the sum in eight lanes, then hsum, then the tail in order. */
static float softmax_avx2(float *s, int n, float scale, float softcap, float *max)
{
    float mx = -INFINITY;
    int r = 0;
    if (softcap > 0) {
        for (r = 0; r < n; r++) {
            s[r] = softcap * tanhf(s[r] * scale / softcap);
            mx = s[r] > mx ? s[r] : mx;
        }
    } else {
        __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-INFINITY);
        for (; r + 8 <= n; r += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + r), vs);
            _mm256_storeu_ps(s + r, v);
            vm = _mm256_max_ps(vm, v);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        mx = _mm_cvtss_f32(m4);
        for (; r < n; r++) {
            s[r] *= scale;
            mx = s[r] > mx ? s[r] : mx;
        }
    }
    __m256 vm = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    for (r = 0; r + 8 <= n; r += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + r), vm));
        _mm256_storeu_ps(s + r, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    for (; r < n; r++) {
        s[r] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(s[r] - mx)));
        sum += s[r];
    }
    *max = mx;
    return sum;
}

const kv_reader kv_reader_avx2 = {"avx2", dot_avx2, axpy_avx2, scores_avx2, wsum_avx2, softmax_avx2};
