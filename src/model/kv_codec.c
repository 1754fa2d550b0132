/* The KV storage codecs (kv.h): one head of head_dim elements encoded,
 * decoded, and read by the attention with the dequantization fused into a
 * dot product (q . k) or an axpy (out += p * v). This scalar code is the
 * reference and the CPU path; the loops are plain so that the compiler
 * vectorizes them.
 *
 * Group layouts (g elements, kv_type_group):
 *   q8: f16 scale, f16 min, g codes; x = min + scale * c, c in 0..255
 *   q4: f16 scale, f16 min, g/2 bytes; byte j: c[j] low nibble, c[j + g/2] high
 *   r4: f16 scale, g/2 bytes as q4;   x = scale * (c - 7.5), c in 0..15
 *   r3: f16 scale, g/4 bytes of 2-bit low parts (byte j: c[j + i*g/4] in bits
 *       2i..2i+1), g/8 bytes of high bits (byte j: c[j + i*g/8] in bit i);
 *       x = scale * (c - 3.5), c in 0..7
 *   f8: f16 scale (max |x| / 448, rounded), g FP8 E4M3 codes of x / scale
 *       (round to nearest even, saturating); x = scale * e4m3(c), exact in
 *       f32 (4 significant bits times 11)
 * r4 and r3 store the rotated head (kv_rotate): a randomized Hadamard
 * transform spreads outliers over the head, so a symmetric grid fits. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/cpu.h"
#include "model/kv.h"
#include "model/kv_int.h"
#include "tensor/dtype.h"

static inline float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return tern_f16_to_f32(h);
}

/* Saturating: a K or V beyond the f16 range (rare, massive activations)
 * is stored as +-65504, never as an infinity that would turn the scores
 * into NaN. */
static inline void f2h(uint8_t *p, float f)
{
    f = f > 65504.0f ? 65504.0f : f < -65504.0f ? -65504.0f : f;
    uint16_t h = tern_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static inline float bf2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return tern_bf16_to_f32(h);
}

size_t kv_group_bytes(kv_type t, int g)
{
    switch (t) {
    case KV_Q8: return 4 + (size_t)g;
    case KV_Q4: return 4 + (size_t)g / 2;
    case KV_R4: return 2 + (size_t)g / 2;
    case KV_R3: return 2 + (size_t)g / 4 + (size_t)g / 8;
    case KV_F8: return 2 + (size_t)g;
    default: return 0;
    }
}

int kv_type_group(kv_type t, int hd)
{
    if (hd <= 0)
        return 0;
    switch (t) {
    case KV_F32:
    case KV_BF16:
    case KV_F16: return hd;
    case KV_Q4:
        if (hd % 64 == 0)
            return 64;
        /* fall through */
    case KV_Q8:
    case KV_R4:
    case KV_F8:
        return hd % 32 == 0 ? 32 : hd < 32 && hd % 2 == 0 ? hd : 0;
    case KV_R3: return hd % 32 == 0 ? 32 : hd < 32 && hd % 8 == 0 ? hd : 0;
    default: return 0;
    }
}

size_t kv_head_bytes(kv_type t, int hd)
{
    switch (t) {
    case KV_F32: return (size_t)hd * 4;
    case KV_BF16:
    case KV_F16: return (size_t)hd * 2;
    default: {
        int g = kv_type_group(t, hd);
        return g ? (size_t)(hd / g) * kv_group_bytes(t, g) : 0;
    }
    }
}

/* ---- the rotation ---- */

/* A fixed pseudo-random sign per element (a hash of its index). */
static inline int flip(int e)
{
    uint32_t h = (uint32_t)e * 0x9E3779B1u + 0x7F4A7C15u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return (int)(h & 1u);
}

/* Normalized Walsh-Hadamard transform of n (a power of two) elements. */
static void fwht(float *x, int n)
{
    for (int len = 1; len < n; len *= 2)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++)
        x[i] *= s;
}

/* Block-diagonal Hadamard over the power-of-two pieces of hd (hd = 96:
 * 64 + 32), so any head_dim gets an orthogonal transform. */
static void hadamard_blocks(float *x, int hd)
{
    for (int off = 0; off < hd;) {
        int n = 1;
        while (2 * n <= hd - off)
            n *= 2;
        fwht(x + off, n);
        off += n;
    }
}

void kv_rotate(float *x, int hd)
{
    for (int e = 0; e < hd; e++)
        if (flip(e))
            x[e] = -x[e];
    hadamard_blocks(x, hd);
}

void kv_unrotate(float *x, int hd)
{
    hadamard_blocks(x, hd);
    for (int e = 0; e < hd; e++)
        if (flip(e))
            x[e] = -x[e];
}

/* ---- encode ---- */

static void enc_affine(const float *x, int g, int levels, uint8_t *dst, int nibbles)
{
    float mn = x[0], mx = x[0];
    for (int e = 1; e < g; e++) {
        mn = x[e] < mn ? x[e] : mn;
        mx = x[e] > mx ? x[e] : mx;
    }
    f2h(dst + 2, mn);
    float m = h2f(dst + 2); /* code against the stored (rounded) min and scale */
    float s = (mx - m) / (float)levels;
    f2h(dst, s);
    s = h2f(dst);
    float inv = s > 0 ? 1.0f / s : 0.0f;
    uint8_t *c = dst + 4;
    if (nibbles)
        memset(c, 0, (size_t)g / 2);
    for (int e = 0; e < g; e++) {
        float f = rintf((x[e] - m) * inv);
        int q = f < 0 ? 0 : f > (float)levels ? levels : (int)f;
        if (!nibbles)
            c[e] = (uint8_t)q;
        else if (e < g / 2)
            c[e] |= (uint8_t)q;
        else
            c[e - g / 2] |= (uint8_t)(q << 4);
    }
}

/* The 4-bit codes of a group against scale s and minimum m (as stored),
 * and their squared error sum((x - (s c + m))^2), summed in element order. */
static float aff4_codes(const float *x, int g, float s, float m, uint8_t *q)
{
    float inv = s > 0 ? 1.0f / s : 0.0f, err = 0.0f;
    for (int e = 0; e < g; e++) {
        float f = rintf((x[e] - m) * inv);
        int c = f < 0 ? 0 : f > 15.0f ? 15 : (int)f;
        q[e] = (uint8_t)c;
        float d = x[e] - (s * (float)c + m);
        err += d * d;
    }
    return err;
}

/* q4: the min/max grid, then least-squares refits while they lower the
 * group's squared error: given the codes, the scale and minimum that fit
 * x best (s = (g Σcx - Σc Σx) / (g Σc² - (Σc)²), rounded to f16, then
 * m = (Σx - s Σc) / g, rounded), and the codes again. The integer sums are
 * exact; every float operation is one rounding in a fixed order, so the
 * CUDA writer (kv_typed.cuh) computes the same bytes. */
#define AFF4_REFITS 4

static void enc_affine4(const float *x, int g, uint8_t *dst)
{
    float mn = x[0], mx = x[0];
    for (int e = 1; e < g; e++) {
        mn = x[e] < mn ? x[e] : mn;
        mx = x[e] > mx ? x[e] : mx;
    }
    uint8_t q[64], qt[64], hs[2], hm[2], ts[2], tm[2]; /* g <= 64 (kv_type_group) */
    f2h(hm, mn);
    float m = h2f(hm);
    f2h(hs, (mx - m) / 15.0f);
    float s = h2f(hs);
    float best = aff4_codes(x, g, s, m, q);
    for (int it = 0; it < AFF4_REFITS && best > 0.0f; it++) {
        int sc = 0, scc = 0;
        float sx = 0.0f, scx = 0.0f;
        for (int e = 0; e < g; e++) {
            sc += q[e];
            scc += q[e] * q[e];
            sx += x[e];
            scx += (float)q[e] * x[e];
        }
        int det = g * scc - sc * sc;
        if (det <= 0)
            break;
        f2h(ts, ((float)g * scx - (float)sc * sx) / (float)det);
        float s2 = h2f(ts);
        if (!(s2 > 0.0f))
            break;
        f2h(tm, (sx - s2 * (float)sc) / (float)g);
        float m2 = h2f(tm), err = aff4_codes(x, g, s2, m2, qt);
        if (!(err < best))
            break;
        best = err;
        memcpy(q, qt, (size_t)g);
        memcpy(hs, ts, 2);
        memcpy(hm, tm, 2);
    }
    memcpy(dst, hs, 2);
    memcpy(dst + 2, hm, 2);
    uint8_t *c = dst + 4;
    for (int j = 0; j < g / 2; j++)
        c[j] = (uint8_t)(q[j] | q[j + g / 2] << 4);
}

/* The symmetric codes (0..top, x = s * (c - half)) of a group against
 * scale s and their squared error, summed in element order. */
static float sym_codes(const float *x, int g, float s, int top, uint8_t *q)
{
    float half = (float)top / 2.0f, inv = s > 0 ? 1.0f / s : 0.0f, err = 0.0f;
    for (int e = 0; e < g; e++) {
        float f = rintf(x[e] * inv + half);
        int c = f < 0 ? 0 : f > (float)top ? top : (int)f;
        q[e] = (uint8_t)c;
        float d = x[e] - s * ((float)c - half);
        err += d * d;
    }
    return err;
}

/* Symmetric: x = s * (c - half), c in 0..2*half: the grid of max|x|, then
 * least-squares refits of the scale (s = Σ x u / Σ u², u = c - half,
 * rounded to f16) while they lower the squared error - enc_affine4's
 * rule, mirrored by the CUDA writer. */
#define SYM_REFITS 4

static void enc_sym(const float *x, int g, int bits, uint8_t *dst)
{
    float amax = 0.0f;
    for (int e = 0; e < g; e++)
        amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
    int top = (1 << bits) - 1;
    float half = (float)top / 2.0f;
    uint8_t q[64], qt[64], hs[2], ts[2]; /* g <= 32 (kv_type_group) */
    f2h(hs, amax / half);
    float best = sym_codes(x, g, h2f(hs), top, q);
    for (int it = 0; it < SYM_REFITS && best > 0.0f; it++) {
        float sxu = 0.0f, suu = 0.0f;
        for (int e = 0; e < g; e++) {
            float u = (float)q[e] - half;
            sxu += x[e] * u;
            suu += u * u;
        }
        f2h(ts, sxu / suu); /* suu >= g / 4 > 0: u is never 0 */
        float s2 = h2f(ts);
        if (!(s2 > 0.0f))
            break;
        float err = sym_codes(x, g, s2, top, qt);
        if (!(err < best))
            break;
        best = err;
        memcpy(q, qt, (size_t)g);
        memcpy(hs, ts, 2);
    }
    memcpy(dst, hs, 2);
    uint8_t *c = dst + 2;
    memset(c, 0, kv_group_bytes(bits == 4 ? KV_R4 : KV_R3, g) - 2);
    for (int e = 0; e < g; e++) {
        if (bits == 4) {
            if (e < g / 2)
                c[e] |= q[e];
            else
                c[e - g / 2] |= (uint8_t)(q[e] << 4);
        } else {
            int q4 = g / 4, q8 = g / 8;
            c[e % q4] |= (uint8_t)((q[e] & 3) << (2 * (e / q4)));
            c[g / 4 + e % q8] |= (uint8_t)(((q[e] >> 2) & 1) << (e / q8));
        }
    }
}

/* f8: the scale is max |x| / 448 rounded to f16 (saturating), the codes
 * x / scale in E4M3; a group whose scale rounds to 0 stores zeros. The
 * device encoder (kv_typed.cuh) does the same operations in the same
 * order, so both store the same bytes. */
static void enc_f8(const float *x, int g, uint8_t *dst)
{
    float am = 0.0f;
    for (int e = 0; e < g; e++)
        am = fmaxf(am, fabsf(x[e]));
    f2h(dst, am / 448.0f);
    float s = h2f(dst);
    for (int e = 0; e < g; e++)
        dst[2 + e] = s > 0.0f ? tern_f32_to_f8e4m3(x[e] / s) : 0;
}

void kv_head_encode(kv_type t, int hd, const float *x, uint8_t *dst)
{
    switch (t) {
    case KV_F32: memcpy(dst, x, (size_t)hd * 4); return;
    case KV_BF16:
        for (int e = 0; e < hd; e++) {
            uint16_t h = tern_f32_to_bf16(x[e]);
            memcpy(dst + 2 * e, &h, 2);
        }
        return;
    case KV_F16:
        for (int e = 0; e < hd; e++)
            f2h(dst + 2 * e, x[e]);
        return;
    default: break;
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, dst += gb) {
        if (t == KV_Q8)
            enc_affine(x + o, g, 255, dst, 0);
        else if (t == KV_Q4)
            enc_affine4(x + o, g, dst);
        else if (t == KV_F8)
            enc_f8(x + o, g, dst);
        else
            enc_sym(x + o, g, t == KV_R4 ? 4 : 3, dst);
    }
}

/* ---- the codes of one group as small integers ---- */

static inline int code_at(kv_type t, int g, const uint8_t *c, int e)
{
    switch (t) {
    case KV_Q8: return c[e];
    case KV_Q4:
    case KV_R4: return e < g / 2 ? c[e] & 15 : c[e - g / 2] >> 4;
    default: {
        int q4 = g / 4, q8 = g / 8;
        return ((c[e % q4] >> (2 * (e / q4))) & 3) | (((c[q4 + e % q8] >> (e / q8)) & 1) << 2);
    }
    }
}

/* Group g's scale a and offset b: x = a * c + b. Returns the codes. */
static inline const uint8_t *group_affine(kv_type t, const uint8_t *p, float *a, float *b)
{
    *a = h2f(p);
    switch (t) {
    case KV_Q8:
    case KV_Q4: *b = h2f(p + 2); return p + 4;
    case KV_R4: *b = -7.5f * *a; return p + 2;
    case KV_F8: *b = 0.0f; return p + 2;
    default: *b = -3.5f * *a; return p + 2;
    }
}

void kv_head_decode(kv_type t, int hd, const uint8_t *src, float *x)
{
    switch (t) {
    case KV_F32: memcpy(x, src, (size_t)hd * 4); return;
    case KV_BF16:
        for (int e = 0; e < hd; e++)
            x[e] = bf2f(src + 2 * e);
        return;
    case KV_F16:
        for (int e = 0; e < hd; e++)
            x[e] = h2f(src + 2 * e);
        return;
    default: break;
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, src += gb) {
        float a, b;
        const uint8_t *c = group_affine(t, src, &a, &b);
        if (t == KV_F8) {
            for (int e = 0; e < g; e++)
                x[o + e] = a * tern_f8e4m3_to_f32(c[e]);
            continue;
        }
        for (int e = 0; e < g; e++)
            x[o + e] = a * (float)code_at(t, g, c, e) + b;
    }
}

/* ---- fused reads ---- */

/* q . codes and sum(q) over one group of 4-bit codes in the nibble layout. */
static inline void dot_nib(const float *q, const uint8_t *c, int g, float *qc, float *qs)
{
    float s0 = 0, s1 = 0;
    int h = g / 2;
    for (int j = 0; j < h; j++) {
        s0 += q[j] * (float)(c[j] & 15) + q[j + h] * (float)(c[j] >> 4);
        s1 += q[j] + q[j + h];
    }
    *qc = s0;
    *qs = s1;
}

float kv_head_dot(kv_type t, int hd, const float *q, const uint8_t *src)
{
    float acc = 0.0f;
    switch (t) {
    case KV_F32: {
        const float *k = (const float *)(const void *)src;
        for (int e = 0; e < hd; e++)
            acc += q[e] * k[e];
        return acc;
    }
    case KV_BF16:
        for (int e = 0; e < hd; e++)
            acc += q[e] * bf2f(src + 2 * e);
        return acc;
    case KV_F16:
        for (int e = 0; e < hd; e++)
            acc += q[e] * h2f(src + 2 * e);
        return acc;
    default: break;
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, src += gb) {
        float a, b, qc = 0.0f, qs = 0.0f;
        const uint8_t *c = group_affine(t, src, &a, &b);
        const float *qq = q + o;
        if (t == KV_Q8) {
            for (int e = 0; e < g; e++) {
                qc += qq[e] * (float)c[e];
                qs += qq[e];
            }
        } else if (t == KV_F8) {
            for (int e = 0; e < g; e++)
                qc += qq[e] * tern_f8e4m3_to_f32(c[e]);
        } else if (t != KV_R3) {
            dot_nib(qq, c, g, &qc, &qs);
        } else {
            for (int e = 0; e < g; e++) {
                qc += qq[e] * (float)code_at(t, g, c, e);
                qs += qq[e];
            }
        }
        acc += a * qc + b * qs;
    }
    return acc;
}

void kv_head_axpy(kv_type t, int hd, float w, const uint8_t *src, float *out)
{
    switch (t) {
    case KV_F32: {
        const float *v = (const float *)(const void *)src;
        for (int e = 0; e < hd; e++)
            out[e] += w * v[e];
        return;
    }
    case KV_BF16:
        for (int e = 0; e < hd; e++)
            out[e] += w * bf2f(src + 2 * e);
        return;
    case KV_F16:
        for (int e = 0; e < hd; e++)
            out[e] += w * h2f(src + 2 * e);
        return;
    default: break;
    }
    int g = kv_type_group(t, hd);
    size_t gb = kv_group_bytes(t, g);
    for (int o = 0; o < hd; o += g, src += gb) {
        float a, b;
        const uint8_t *c = group_affine(t, src, &a, &b);
        float wa = w * a, wb = w * b;
        float *y = out + o;
        if (t == KV_Q8) {
            for (int e = 0; e < g; e++)
                y[e] += wa * (float)c[e] + wb;
        } else if (t == KV_F8) {
            for (int e = 0; e < g; e++)
                y[e] += wa * tern_f8e4m3_to_f32(c[e]);
        } else if (t != KV_R3) {
            int h = g / 2;
            for (int j = 0; j < h; j++) {
                y[j] += wa * (float)(c[j] & 15) + wb;
                y[j + h] += wa * (float)(c[j] >> 4) + wb;
            }
        } else {
            for (int e = 0; e < g; e++)
                y[e] += wa * (float)code_at(t, g, c, e) + wb;
        }
    }
}

void kv_heads_scores(kv_type t, int hd, int g, int n, const float *q, const uint8_t *const *rows, float *sc, int ps)
{
    for (int r = 0; r < n; r++)
        for (int j = 0; j < g; j++)
            sc[(size_t)j * ps + r] = kv_head_dot(t, hd, q + (size_t)j * hd, rows[r]);
}

void kv_heads_wsum(kv_type t, int hd, int g, int n, const float *p, int ps, const uint8_t *const *rows, float *o)
{
    for (int r = 0; r < n; r++)
        for (int j = 0; j < g; j++)
            kv_head_axpy(t, hd, p[(size_t)j * ps + r], rows[r], o + (size_t)j * hd);
}

float kv_softmax_part(float *s, int n, float scale, float softcap, float *max)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int r = 0; r < n; r++) {
        float v = s[r] * scale;
        if (softcap > 0)
            v = softcap * tanhf(v / softcap);
        s[r] = v;
        mx = v > mx ? v : mx;
    }
    for (int r = 0; r < n; r++) {
        s[r] = expf(s[r] - mx);
        sum += s[r];
    }
    *max = mx;
    return sum;
}

const kv_reader kv_reader_scalar = {"scalar", kv_head_dot, kv_head_axpy, kv_heads_scores, kv_heads_wsum,
                                    kv_softmax_part};

static const kv_reader *g_reader = &kv_reader_scalar;
static pthread_once_t g_reader_once = PTHREAD_ONCE_INIT;

static void reader_choose(void)
{
#ifdef __x86_64__
    const tern_cpu_features *f = tern_cpu();
    if (f->avx2 && f->fma && f->f16c)
        g_reader = &kv_reader_avx2;
#endif
}

const kv_reader *kv_reader_best(void)
{
    pthread_once(&g_reader_once, reader_choose);
    return g_reader;
}
