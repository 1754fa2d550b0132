// Typed KV storage on the device (cuda_kernels.h tcu_kv, typed 1): where a
// position's head lives, its elements decoded in registers (the attention
// kernels' fused reads - no full-precision copy of the cache), and a head
// encoded by a block of threads (the KV write), bit for bit as the CPU's
// kv_head_encode (src/model/kv_codec.c): the same f16 / bf16 roundings,
// the same saturation at +-65504, the same affine grid per group.
#ifndef TERN_TENSOR_CUDA_KV_TYPED_CUH
#define TERN_TENSOR_CUDA_KV_TYPED_CUH

#include "tensor/cuda/common.cuh"

// Bytes of one group of G elements of a quantized type.
__device__ __forceinline__ int kvt_group_bytes(int t, int G)
{
    return t == TCU_KV_Q8   ? 4 + G
           : t == TCU_KV_Q4 ? 4 + G / 2
           : t == TCU_KV_R3 ? 2 + G / 4 + G / 8
           : t == TCU_KV_F8 ? 2 + G
                            : 2 + G / 2;
}

// An E4M3 code's value, exact (tern_f8e4m3_to_f32): its 7 low bits shifted
// up by 7 and the sign by 8 are an f16 of 1/256 the value. f8's codes are
// never NaN (the encoder saturates).
__device__ __forceinline__ float kvt_e4m3(uint32_t b)
{
    return f16f((uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7))) * 256.0f;
}

// Byte offset (in lk / lv) of kv head kvh of position pos of a sequence
// (block table blk) in a typed layer; *t its storage type.
__device__ __forceinline__ size_t kvt_off(const tcu_kv &kv, const int32_t *blk, int pos, int kvh, int *t)
{
    const size_t b = (size_t)blk[pos / kv.block_size], off = (size_t)(pos % kv.block_size);
    if (b < (size_t)kv.n_sink) {
        *t = kv.sink_type;
        return (b * kv.block_size + off) * kv.sink_row + (size_t)kvh * kv.sink_hb;
    }
    *t = kv.type;
    return (size_t)kv.n_sink * kv.block_size * kv.sink_row + ((b - kv.n_sink) * kv.block_size + off) * kv.row +
           (size_t)kvh * kv.hb;
}

// An f16 stored at p (2-byte aligned).
__device__ __forceinline__ float kvt_h(const uint8_t *p) { return f16f(*reinterpret_cast<const uint16_t *>(p)); }

// Code j of an r3 group whose codes start at c (kv_codec.c's layout: the
// 2-bit low parts, byte j % (G/4) bits 2 (j / (G/4)); the high bits, byte
// G/4 + j % (G/8) bit j / (G/8)).
__device__ __forceinline__ int kvt_r3_code(const uint8_t *c, int G, int j)
{
    const int q4 = G / 4, q8 = G / 8;
    return ((c[j % q4] >> (2 * (j / q4))) & 3) | (((c[q4 + j % q8] >> (j / q8)) & 1) << 2);
}

// Element e of a head stored at h (type t, group G): x = scale * c + min
// for the quantized types, as kv_head_decode.
__device__ __forceinline__ float kvt_elem(const uint8_t *h, int t, int G, int e)
{
    switch (t) {
    case TCU_KV_F32: return reinterpret_cast<const float *>(h)[e];
    case TCU_KV_BF16: return bf16f(reinterpret_cast<const uint16_t *>(h)[e]);
    case TCU_KV_F16: return f16f(reinterpret_cast<const uint16_t *>(h)[e]);
    case TCU_KV_Q8: {
        const uint8_t *g = h + (size_t)(e / G) * (4 + G);
        return kvt_h(g) * (float)g[4 + e % G] + kvt_h(g + 2);
    }
    case TCU_KV_R3: {
        const uint8_t *g = h + (size_t)(e / G) * kvt_group_bytes(t, G);
        const float a = kvt_h(g);
        return a * (float)kvt_r3_code(g + 2, G, e % G) + -3.5f * a;
    }
    case TCU_KV_F8: {
        const uint8_t *g = h + (size_t)(e / G) * (2 + G);
        return kvt_h(g) * kvt_e4m3(g[2 + e % G]);
    }
    default: { /* q4, r4: nibbles */
        const int r4 = t == TCU_KV_R4, cb = r4 ? 2 : 4;
        const uint8_t *g = h + (size_t)(e / G) * (cb + G / 2);
        const int j = e % G, hg = G / 2, c = j < hg ? g[cb + j] & 15 : g[cb + j - hg] >> 4;
        const float a = kvt_h(g);
        return a * (float)c + (r4 ? -7.5f * a : kvt_h(g + 2));
    }
    }
}

// Elements e0 .. e0 + D - 1 of the head at h (e0 a multiple of D). The
// 16-bit types read pairs (D even); the quantized types, when D divides
// 32 (every element of one group), read the group's scale and minimum once.
template <int D>
__device__ __forceinline__ void kvt_load(const uint8_t *h, int t, int G, int e0, float (&x)[D])
{
    if constexpr (D % 4 == 0) { /* 8 or 16 bytes a load: a head of 16-bit elements is 64-byte aligned */
        if (t == TCU_KV_BF16 || t == TCU_KV_F16) {
            const uint2 *p = reinterpret_cast<const uint2 *>(h) + e0 / 4;
#pragma unroll
            for (int d = 0; d < D; d += 4) {
                const uint2 w = p[d / 4];
                const uint32_t u[4] = {w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16};
#pragma unroll
                for (int k = 0; k < 4; k++)
                    x[d + k] = t == TCU_KV_BF16 ? bf16f(u[k]) : f16f(u[k]);
            }
            return;
        }
        if (t == TCU_KV_F32) {
            const float4 *p = reinterpret_cast<const float4 *>(h) + e0 / 4;
#pragma unroll
            for (int d = 0; d < D; d += 4) {
                const float4 w = p[d / 4];
                x[d] = w.x;
                x[d + 1] = w.y;
                x[d + 2] = w.z;
                x[d + 3] = w.w;
            }
            return;
        }
        if (t == TCU_KV_Q8 || t == TCU_KV_Q4) { /* groups of 4 + n bytes: 4-byte aligned */
            if constexpr (32 % D == 0) {
                const int j0 = e0 % G;
                const uint8_t *g = h + (size_t)(e0 / G) * kvt_group_bytes(t, G);
                const uint32_t sm = *reinterpret_cast<const uint32_t *>(g);
                const float a = f16f(sm & 0xffffu), b = f16f(sm >> 16);
                if (t == TCU_KV_Q8) {
                    const uint32_t *c = reinterpret_cast<const uint32_t *>(g + 4 + j0);
#pragma unroll
                    for (int d = 0; d < D; d += 4) {
                        const uint32_t w = c[d / 4];
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            x[d + k] = a * (float)((w >> (8 * k)) & 255u) + b;
                    }
                } else {
                    const int hg = G / 2, hi = j0 >= hg; /* D divides G / 2: one nibble half */
                    const uint32_t *c = reinterpret_cast<const uint32_t *>(g + 4 + (hi ? j0 - hg : j0));
                    const int sh = hi ? 4 : 0;
#pragma unroll
                    for (int d = 0; d < D; d += 4) {
                        const uint32_t w = c[d / 4] >> sh;
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            x[d + k] = a * (float)((w >> (8 * k)) & 15u) + b;
                    }
                }
                return;
            }
        }
    }
    if constexpr (D % 2 == 0) {
        if (t == TCU_KV_BF16 || t == TCU_KV_F16) {
            const uint32_t *p = reinterpret_cast<const uint32_t *>(h) + e0 / 2;
#pragma unroll
            for (int d = 0; d < D; d += 2) {
                const uint32_t w = p[d / 2];
                x[d] = t == TCU_KV_BF16 ? bf16f(w & 0xffffu) : f16f(w & 0xffffu);
                x[d + 1] = t == TCU_KV_BF16 ? bf16f(w >> 16) : f16f(w >> 16);
            }
            return;
        }
    }
    if constexpr (32 % D == 0) {
        if (t == TCU_KV_F8) { /* the group's scale once; groups of 2 + G bytes: 2-byte aligned */
            const int j0 = e0 % G;
            const uint8_t *g = h + (size_t)(e0 / G) * (2 + G);
            const float a = kvt_h(g);
            if constexpr (D % 2 == 0) {
                const uint16_t *c = reinterpret_cast<const uint16_t *>(g + 2 + j0);
#pragma unroll
                for (int d = 0; d < D; d += 2) {
                    const uint32_t w = c[d / 2];
                    x[d] = a * kvt_e4m3(w & 255u);
                    x[d + 1] = a * kvt_e4m3(w >> 8);
                }
            } else {
#pragma unroll
                for (int d = 0; d < D; d++)
                    x[d] = a * kvt_e4m3(g[2 + j0 + d]);
            }
            return;
        }
        if (t == TCU_KV_R3) { /* the group's scale once; codes from their two planes */
            const int j0 = e0 % G;
            const uint8_t *g = h + (size_t)(e0 / G) * kvt_group_bytes(t, G);
            const float a = kvt_h(g), b = -3.5f * a;
#pragma unroll
            for (int d = 0; d < D; d++)
                x[d] = a * (float)kvt_r3_code(g + 2, G, j0 + d) + b;
            return;
        }
        if (t == TCU_KV_Q8 || t == TCU_KV_Q4 || t == TCU_KV_R4) {
            const int j0 = e0 % G;
            const uint8_t *g = h + (size_t)(e0 / G) * kvt_group_bytes(t, G);
            const float a = kvt_h(g), b = t == TCU_KV_R4 ? -7.5f * a : kvt_h(g + 2);
            if (t == TCU_KV_R4)
                g -= 2; /* codes at g + 2: as q4's at g + 4 */
            if (t == TCU_KV_Q8) {
#pragma unroll
                for (int d = 0; d < D; d++)
                    x[d] = a * (float)g[4 + j0 + d] + b;
            } else {
                const int hg = G / 2, hi = j0 >= hg; /* D divides G / 2: one nibble half */
                const uint8_t *c = g + 4 + (hi ? j0 - hg : j0);
#pragma unroll
                for (int d = 0; d < D; d++)
                    x[d] = a * (float)(hi ? c[d] >> 4 : c[d] & 15) + b;
            }
            return;
        }
    }
#pragma unroll
    for (int d = 0; d < D; d++)
        x[d] = kvt_elem(h, t, G, e0 + d);
}

// ---- encode (kv_head_encode's arithmetic) ----

// f32 -> f16 bits, saturating at +-65504 (the CPU's f2h).
__device__ __forceinline__ uint16_t kvt_f2h(float f)
{
    f = f > 65504.0f ? 65504.0f : f < -65504.0f ? -65504.0f : f;
    return __half_as_ushort(__float2half_rn(f));
}

// f32 -> bf16 bits, round to nearest even (tern_f32_to_bf16).
__device__ __forceinline__ uint16_t kvt_f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ void kvt_put16(uint8_t *p, uint16_t h) { *reinterpret_cast<uint16_t *>(p) = h; }

// One affine group (q8: 255 levels, one byte a code; q4: 15, nibbles), by
// one thread: the codes against the stored (rounded) minimum and scale.
__device__ __forceinline__ void kvt_enc_group(int t, const float *x, int G, uint8_t *dst)
{
    const int levels = t == TCU_KV_Q8 ? 255 : 15;
    float mn = x[0], mx = x[0];
    for (int e = 1; e < G; e++) {
        mn = x[e] < mn ? x[e] : mn;
        mx = x[e] > mx ? x[e] : mx;
    }
    const uint16_t hm = kvt_f2h(mn);
    const float m = f16f(hm);
    const uint16_t hs = kvt_f2h(__fdiv_rn(__fsub_rn(mx, m), (float)levels));
    const float s = f16f(hs);
    const float inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
    kvt_put16(dst, hs);
    kvt_put16(dst + 2, hm);
    uint8_t *c = dst + 4;
    if (t == TCU_KV_Q8) {
        for (int e = 0; e < G; e++) {
            const float f = rintf(__fmul_rn(__fsub_rn(x[e], m), inv));
            c[e] = (uint8_t)(f < 0 ? 0 : f > (float)levels ? levels : (int)f);
        }
        return;
    }
    for (int j = 0; j < G / 2; j++) {
        const float f0 = rintf(__fmul_rn(__fsub_rn(x[j], m), inv));
        const float f1 = rintf(__fmul_rn(__fsub_rn(x[j + G / 2], m), inv));
        const int q0 = f0 < 0 ? 0 : f0 > (float)levels ? levels : (int)f0;
        const int q1 = f1 < 0 ? 0 : f1 > (float)levels ? levels : (int)f1;
        c[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

// q4's codes of a group against (s, m) and their squared error, as
// kv_codec.c's aff4_codes (the same roundings, no fused multiply-adds).
__device__ __forceinline__ float kvt_aff4_codes(const float *x, int G, float s, float m, uint8_t *q)
{
    const float inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
    float err = 0.0f;
    for (int e = 0; e < G; e++) {
        const float f = rintf(__fmul_rn(__fsub_rn(x[e], m), inv));
        const int c = f < 0 ? 0 : f > 15.0f ? 15 : (int)f;
        q[e] = (uint8_t)c;
        const float d = __fsub_rn(x[e], __fadd_rn(__fmul_rn(s, (float)c), m));
        err = __fadd_rn(err, __fmul_rn(d, d));
    }
    return err;
}

// One q4 group (G <= 64), by one thread: kv_codec.c's enc_affine4 - the
// min/max grid, then least-squares refits of scale and minimum while they
// lower the squared error.
#define KVT_AFF4_REFITS 4
__device__ __forceinline__ void kvt_enc_aff4(const float *x, int G, uint8_t *dst)
{
    float mn = x[0], mx = x[0];
    for (int e = 1; e < G; e++) {
        mn = x[e] < mn ? x[e] : mn;
        mx = x[e] > mx ? x[e] : mx;
    }
    uint8_t q[64], qt[64];
    uint16_t hm = kvt_f2h(mn);
    const float m0 = f16f(hm);
    uint16_t hs = kvt_f2h(__fdiv_rn(__fsub_rn(mx, m0), 15.0f));
    float best = kvt_aff4_codes(x, G, f16f(hs), m0, q);
    for (int it = 0; it < KVT_AFF4_REFITS && best > 0.0f; it++) {
        int sc = 0, scc = 0;
        float sx = 0.0f, scx = 0.0f;
        for (int e = 0; e < G; e++) {
            sc += q[e];
            scc += q[e] * q[e];
            sx = __fadd_rn(sx, x[e]);
            scx = __fadd_rn(scx, __fmul_rn((float)q[e], x[e]));
        }
        const int det = G * scc - sc * sc;
        if (det <= 0)
            break;
        const uint16_t ts =
            kvt_f2h(__fdiv_rn(__fsub_rn(__fmul_rn((float)G, scx), __fmul_rn((float)sc, sx)), (float)det));
        const float s2 = f16f(ts);
        if (!(s2 > 0.0f))
            break;
        const uint16_t tm = kvt_f2h(__fdiv_rn(__fsub_rn(sx, __fmul_rn(s2, (float)sc)), (float)G));
        const float err = kvt_aff4_codes(x, G, s2, f16f(tm), qt);
        if (!(err < best))
            break;
        best = err;
        for (int e = 0; e < G; e++)
            q[e] = qt[e];
        hs = ts;
        hm = tm;
    }
    kvt_put16(dst, hs);
    kvt_put16(dst + 2, hm);
    for (int j = 0; j < G / 2; j++)
        dst[4 + j] = (uint8_t)(q[j] | q[j + G / 2] << 4);
}

// The symmetric codes (0..top, x = s * (c - half)) of a group against s
// and their squared error, as kv_codec.c's sym_codes.
__device__ __forceinline__ float kvt_sym_codes(const float *x, int G, float s, int top, uint8_t *q)
{
    const float half = __fdiv_rn((float)top, 2.0f), inv = s > 0 ? __fdiv_rn(1.0f, s) : 0.0f;
    float err = 0.0f;
    for (int e = 0; e < G; e++) {
        const float f = rintf(__fadd_rn(__fmul_rn(x[e], inv), half));
        const int c = f < 0 ? 0 : f > (float)top ? top : (int)f;
        q[e] = (uint8_t)c;
        const float d = __fsub_rn(x[e], __fmul_rn(s, __fsub_rn((float)c, half)));
        err = __fadd_rn(err, __fmul_rn(d, d));
    }
    return err;
}

// One symmetric group (r4: 4 bits, r3: 3 bits; G <= 32), by one thread:
// kv_codec.c's enc_sym - the grid of max |x|, then least-squares refits of
// the scale while they lower the squared error - and its code layout.
#define KVT_SYM_REFITS 4
__device__ __forceinline__ void kvt_enc_sym(const float *x, int G, int bits, uint8_t *dst)
{
    const int top = (1 << bits) - 1;
    const float half = __fdiv_rn((float)top, 2.0f);
    float amax = 0.0f;
    for (int e = 0; e < G; e++)
        amax = fabsf(x[e]) > amax ? fabsf(x[e]) : amax;
    uint8_t q[32], qt[32];
    uint16_t hs = kvt_f2h(__fdiv_rn(amax, half));
    float best = kvt_sym_codes(x, G, f16f(hs), top, q);
    for (int it = 0; it < KVT_SYM_REFITS && best > 0.0f; it++) {
        float sxu = 0.0f, suu = 0.0f;
        for (int e = 0; e < G; e++) {
            const float u = __fsub_rn((float)q[e], half);
            sxu = __fadd_rn(sxu, __fmul_rn(x[e], u));
            suu = __fadd_rn(suu, __fmul_rn(u, u));
        }
        const uint16_t ts = kvt_f2h(__fdiv_rn(sxu, suu));
        const float s2 = f16f(ts);
        if (!(s2 > 0.0f))
            break;
        const float err = kvt_sym_codes(x, G, s2, top, qt);
        if (!(err < best))
            break;
        best = err;
        for (int e = 0; e < G; e++)
            q[e] = qt[e];
        hs = ts;
    }
    kvt_put16(dst, hs);
    uint8_t *c = dst + 2;
    if (bits == 4) {
        for (int j = 0; j < G / 2; j++)
            c[j] = (uint8_t)(q[j] | q[j + G / 2] << 4);
        return;
    }
    const int q4 = G / 4, q8 = G / 8;
    for (int j = 0; j < q4; j++) /* low parts: codes j, j + q4, j + 2 q4, j + 3 q4 */
        c[j] = (uint8_t)((q[j] & 3) | (q[j + q4] & 3) << 2 | (q[j + 2 * q4] & 3) << 4 | (q[j + 3 * q4] & 3) << 6);
    for (int j = 0; j < q8; j++) { /* high bits: codes j + i q8, i = 0..7 */
        uint32_t b = 0;
        for (int i = 0; i < 8; i++)
            b |= (uint32_t)(q[j + i * q8] >> 2 & 1) << i;
        c[q4 + j] = (uint8_t)b;
    }
}

// One f8 group, by one thread: kv_codec.c's enc_f8 - the scale max |x| /
// 448 rounded to f16, the codes x / scale to E4M3 (round to nearest even,
// saturating: the CPU's tern_f32_to_f8e4m3), zeros when the scale is 0.
__device__ __forceinline__ void kvt_enc_f8(const float *x, int G, uint8_t *dst)
{
    float amax = 0.0f;
    for (int e = 0; e < G; e++)
        amax = fmaxf(amax, fabsf(x[e]));
    const uint16_t hs = kvt_f2h(__fdiv_rn(amax, 448.0f));
    const float s = f16f(hs);
    kvt_put16(dst, hs);
    for (int e = 0; e < G; e++) {
        uint16_t r = 0;
        if (s > 0.0f)
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(__fdiv_rn(x[e], s)));
        dst[2 + e] = (uint8_t)(r & 255u);
    }
}

// kv_rotate's fixed sign of element e (a hash of its index).
__device__ __forceinline__ bool kvt_flip(int e)
{
    uint32_t h = (uint32_t)e * 0x9E3779B1u + 0x7F4A7C15u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return h & 1u;
}

// x[hd] (shared memory) rotated in place as kv_rotate (inverse: kv_unrotate)
// does, the same operations on every element: signs, then the normalized
// Walsh-Hadamard transform of each power-of-two piece (stage by stage),
// or the reverse. Every thread of the block calls it (it synchronizes).
__device__ __forceinline__ void kvt_rotate(float *x, int hd, bool inverse)
{
    const int tid = threadIdx.x, nthr = blockDim.x;
    if (!inverse) {
        for (int e = tid; e < hd; e += nthr)
            if (kvt_flip(e))
                x[e] = -x[e];
        __syncthreads();
    }
    for (int off = 0; off < hd;) {
        int n = 1;
        while (2 * n <= hd - off)
            n *= 2;
        for (int len = 1; len < n; len *= 2) {
            for (int k = tid; k < n / 2; k += nthr) {
                const int i = off + (k / len) * 2 * len + k % len;
                const float a = x[i], b = x[i + len];
                x[i] = __fadd_rn(a, b);
                x[i + len] = __fsub_rn(a, b);
            }
            __syncthreads();
        }
        const float s = __fdiv_rn(1.0f, __fsqrt_rn((float)n));
        for (int e = tid; e < n; e += nthr)
            x[off + e] = __fmul_rn(x[off + e], s);
        __syncthreads();
        off += n;
    }
    if (inverse) {
        for (int e = tid; e < hd; e += nthr)
            if (kvt_flip(e))
                x[e] = -x[e];
        __syncthreads();
    }
}

// Head x[hd] (any memory the group reads) encoded into dst in type t by
// threads tid of nthr: the float types an element a thread, the quantized
// ones a group a thread.
__device__ __forceinline__ void kvt_encode(int t, int G, int hd, const float *x, uint8_t *dst, int tid, int nthr)
{
    switch (t) {
    case TCU_KV_F32:
        for (int e = tid; e < hd; e += nthr)
            reinterpret_cast<float *>(dst)[e] = x[e];
        return;
    case TCU_KV_BF16:
        for (int e = tid; e < hd; e += nthr)
            kvt_put16(dst + 2 * e, kvt_f2bf(x[e]));
        return;
    case TCU_KV_F16:
        for (int e = tid; e < hd; e += nthr)
            kvt_put16(dst + 2 * e, kvt_f2h(x[e]));
        return;
    case TCU_KV_R4:
        for (int gi = tid; gi < hd / G; gi += nthr)
            kvt_enc_sym(x + gi * G, G, 4, dst + (size_t)gi * kvt_group_bytes(t, G));
        return;
    case TCU_KV_R3:
        for (int gi = tid; gi < hd / G; gi += nthr)
            kvt_enc_sym(x + gi * G, G, 3, dst + (size_t)gi * kvt_group_bytes(t, G));
        return;
    case TCU_KV_Q4:
        for (int gi = tid; gi < hd / G; gi += nthr)
            kvt_enc_aff4(x + gi * G, G, dst + (size_t)gi * kvt_group_bytes(t, G));
        return;
    case TCU_KV_F8:
        for (int gi = tid; gi < hd / G; gi += nthr)
            kvt_enc_f8(x + gi * G, G, dst + (size_t)gi * kvt_group_bytes(t, G));
        return;
    default:
        for (int gi = tid; gi < hd / G; gi += nthr)
            kvt_enc_group(t, x + gi * G, G, dst + (size_t)gi * kvt_group_bytes(t, G));
        return;
    }
}

#endif
