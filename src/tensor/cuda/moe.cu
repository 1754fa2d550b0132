// A mixture-of-experts layer's MLP on the device (cuda_moe.h): the router,
// the routing and grouping of the step's tokens by expert, and the experts'
// products over their own tokens, with the weighted sum added to the
// residual - four launches after the RMSNorm, none of which needs the host.
//
// The expert products are a warp an output row: the lane reads units of 8
// consecutive weights (32, 16, 8 or 4 bytes by kind), up to 8 units of a
// row in registers at once (a whole 2048-wide bf16 row), and dots them
// with each token routed to the expert in turn, so the weights are read
// once for all of them; a lane sums its units in order and the warp's
// butterfly sums the lanes - an order fixed by n_in, never by the batch.
#include "tensor/cuda/cuda_moe.h"
#include "tensor/cuda/gemv.cuh"
#include "tensor/cuda/moe.cuh"

namespace {

constexpr int NT = 8; // tokens a pass (accumulators in registers)
constexpr int CH = 8; // 32-unit chunks of a row in registers at once
template <int KIND> struct unit_t {
    static constexpr int WORDS = KIND == TCU_F32 ? 8 : KIND == TCU_Q8 ? 2 : KIND == TCU_Q4 || KIND == TCU_MX4 ? 1 : 4;
    static constexpr int NV = 8; // weights a unit
    static constexpr bool Q = KIND == TCU_Q4 || KIND == TCU_Q8 || KIND == TCU_MX4; // a scale per group
    static constexpr int CHN = KIND == TCU_F32 ? 4 : CH; // f32: 64 registers as for the others
};

__device__ __forceinline__ size_t row_bytes(int kind, int n_in)
{
    return kind == TCU_F32 ? (size_t)n_in * 4
           : kind == TCU_Q8 ? (size_t)n_in
           : kind == TCU_Q4 || kind == TCU_MX4 ? (size_t)n_in / 2
                                             : (size_t)n_in * 2;
}

// Row `row`'s group scales: {scale, bias} f32 pairs (MLX kinds), or MXFP4's
// E8M0 bytes (a group of 32).
template <int KIND> __device__ __forceinline__ const void *scale_row(const void *base, int row, int n_in, int group)
{
    if constexpr (KIND == TCU_MX4)
        return (const uint8_t *)base + (size_t)row * (n_in / 32);
    else
        return (const float *)base + (size_t)row * (n_in / group) * 2;
}

// Unit u's group scale (and bias: MLX kinds; MXFP4 has none): MXFP4's
// 2^(e - 127), e = 0 the subnormal 2^-127 (the CPU's tern_mx_scale times 2,
// unit_dot's values being E2M1 / 2^14 rather than twice E2M1).
template <int KIND>
__device__ __forceinline__ void scale_load(const void *sr, int u, int group, float &sc, float &bi)
{
    if constexpr (KIND == TCU_MX4) {
        const uint32_t e = __ldg((const uint8_t *)sr + u / 4);
        sc = __uint_as_float(e ? e << 23 : 0x00400000u);
        bi = 0.0f;
    } else {
        const float2 p = __ldg((const float2 *)sr + (u * 8) / group);
        sc = p.x, bi = p.y;
    }
}

template <int KIND> __device__ __forceinline__ void unit_load(const uint8_t *row, int u, uint32_t *r)
{
    constexpr int W = unit_t<KIND>::WORDS;
    const uint8_t *p = row + (size_t)u * 4 * W;
    if constexpr (W == 8) {
        uint4 a = __ldg((const uint4 *)p), b = __ldg((const uint4 *)p + 1);
        r[0] = a.x, r[1] = a.y, r[2] = a.z, r[3] = a.w, r[4] = b.x, r[5] = b.y, r[6] = b.z, r[7] = b.w;
    } else if constexpr (W == 4) {
        uint4 a = __ldg((const uint4 *)p);
        r[0] = a.x, r[1] = a.y, r[2] = a.z, r[3] = a.w;
    } else if constexpr (W == 2) {
        uint2 a = __ldg((const uint2 *)p);
        r[0] = a.x, r[1] = a.y;
    } else {
        r[0] = __ldg((const uint32_t *)p);
    }
}

__device__ __forceinline__ float byte_f(uint32_t w, int b) { return (float)((w >> (8 * b)) & 0xffu); }

// acc + the dot of one unit (NV weights) with x[NV]; quantized: scale *
// sum q x + bias * sum x over the unit.
template <int KIND>
__device__ __forceinline__ float unit_dot(const uint32_t *r, const float *x, float sc, float bi, float acc)
{
    if constexpr (KIND == TCU_F32) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc = fmaf(__uint_as_float(r[j]), x[j], acc);
        return acc;
    } else if constexpr (KIND == TCU_BF16 || KIND == TCU_F16) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t h = (r[j >> 1] >> (16 * (j & 1))) & 0xffffu;
            acc = fmaf(KIND == TCU_BF16 ? bf16f(h) : f16f(h), x[j], acc);
        }
        return acc;
    } else if constexpr (KIND == TCU_MX4) {
        // Codes j and j + 4 of the word are 16 bits apart: one shift puts
        // both where an f16 pair's bits go - the sign to bit 15, exponent and
        // mantissa to bits 11-9, so the f16 is E2M1 / 2^14 (E2M1's subnormal
        // 0.5 an f16 subnormal), exact; the unit's sum times 2^14 undoes it.
        float sq = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t t = r[0] >> (4 * j);
            const uint32_t h = ((t << 12) & 0x80008000u) | ((t << 9) & 0x0e000e00u);
            sq = fmaf(__half2float(__ushort_as_half((unsigned short)(h & 0xffffu))), x[j], sq);
            sq = fmaf(__half2float(__ushort_as_half((unsigned short)(h >> 16))), x[j + 4], sq);
        }
        return fmaf(sc, sq * 16384.0f, acc);
    } else {
        float sq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float q = KIND == TCU_Q8 ? byte_f(r[j >> 2], j & 3) : (float)((r[0] >> (4 * j)) & 0xfu);
            sq = fmaf(q, x[j], sq);
            sx += x[j];
        }
        return fmaf(sc, sq, fmaf(bi, sx, acc));
    }
}

// Rows of NM matrices sharing n_in (gate and up: NM = 2), one warp: res[m][j]
// = W_m[row] . X[xrow(j)] for the n <= NT tokens j, xrow(j) = pk ? pk[j] /
// div : base + j. wrow[m]: the row's bytes, sbrow[m]: its {scale, bias}
// pairs (quantized kinds).
// NORM: X is the residual and the input is its RMSNorm, (x * rn[j]) * ng as
// the norm kernel rounds it (rn: the tokens' factors, ng: the gain).
// CC: chunks in registers at once (0: unit_t's CHN) - any count gives the
// same sums (a lane adds its units in order), fewer registers more warps;
// NTT: tokens a pass (each token's sum the same whatever the pass).
template <int KIND, int NM, bool NORM = false, int CC = 0, int NTT = NT>
__device__ __forceinline__ void warp_rows(const uint8_t *const *wrow, const void *const *sbrow, int n_in, int group,
                                          const float *X, const int32_t *pk, int div, int base, int n,
                                          float (&res)[NM][NTT], const float *ng = nullptr, const float *rn = nullptr)
{
    using U = unit_t<KIND>;
    constexpr int W = U::WORDS, C = CC ? CC : U::CHN, NV = U::NV;
    const int lane = threadIdx.x & 31, units = n_in / NV;
    float acc[NM][NTT];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int j = 0; j < NTT; j++)
            acc[m][j] = 0.0f;
    int xr[NTT]; /* tokens past n repeat the first (their sums unused): no branch between the tokens */
#pragma unroll
    for (int j = 0; j < NTT; j++)
        xr[j] = pk ? pk[j < n ? j : 0] / div : base + (j < n ? j : 0);
    for (int c0 = 0; c0 * 32 < units; c0 += C) {
        uint32_t r[NM][C][W];
        float sc[NM][C], bi[NM][C];
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = (c0 + c) * 32 + lane;
#pragma unroll
            for (int m = 0; m < NM; m++) {
                if (u < units) {
                    unit_load<KIND>(wrow[m], u, r[m][c]);
                    if constexpr (U::Q)
                        scale_load<KIND>(sbrow[m], u, group, sc[m][c], bi[m][c]);
                } else {
#pragma unroll
                    for (int k = 0; k < W; k++)
                        r[m][c][k] = 0;
                    sc[m][c] = bi[m][c] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NTT; j++) {
            const float *xrow = X + (size_t)xr[j] * n_in;
#pragma unroll
            for (int c = 0; c < C; c++) {
                const int u = (c0 + c) * 32 + lane;
                if (u >= units)
                    break;
                float xv[NV];
#pragma unroll
                for (int k = 0; k < NV; k += 4) {
                    const float4 a = *(const float4 *)(xrow + u * NV + k);
                    xv[k] = a.x, xv[k + 1] = a.y, xv[k + 2] = a.z, xv[k + 3] = a.w;
                }
                if constexpr (NORM) {
                    const float r = rn[xr[j]];
#pragma unroll
                    for (int k = 0; k < NV; k += 4) {
                        const float4 g = __ldg((const float4 *)(ng + u * NV + k));
                        xv[k] = (xv[k] * r) * g.x, xv[k + 1] = (xv[k + 1] * r) * g.y;
                        xv[k + 2] = (xv[k + 2] * r) * g.z, xv[k + 3] = (xv[k + 3] * r) * g.w;
                    }
                }
#pragma unroll
                for (int m = 0; m < NM; m++)
                    acc[m][j] = unit_dot<KIND>(r[m][c], xv, sc[m][c], bi[m][c], acc[m][j]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int j = 0; j < NTT; j++)
            res[m][j] = warp_sum(acc[m][j]);
}

// warp_rows for n (1 <= n <= NT) tokens on the smallest of 1, 2, 4 or NT
// tokens a pass that holds them: the tokens' sums are independent chains the
// warp interleaves (no branch between them), each the same bits whatever
// the pass; res[m][j] for j < n.
template <int KIND, int NM, bool NORM, int NTT, int CC>
__device__ __forceinline__ void warp_rows_pass(const uint8_t *const *wrow, const void *const *sbrow, int n_in,
                                               int group, const float *X, const int32_t *pk, int div, int base, int n,
                                               float (&res)[NM][NT], const float *ng, const float *rn)
{
    float r[NM][NTT];
    warp_rows<KIND, NM, NORM, CC, NTT>(wrow, sbrow, n_in, group, X, pk, div, base, n, r, ng, rn);
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int j = 0; j < NTT; j++)
            res[m][j] = r[m][j];
}

// Passes of 2+ tokens hold 4 chunks of a row in registers rather than 8
// (fewer registers, more warps: 80 for MXFP4, three blocks a SM; the same
// sums).
template <int KIND, int NM, bool NORM = false>
__device__ __forceinline__ void warp_rows_n(const uint8_t *const *wrow, const void *const *sbrow, int n_in, int group,
                                            const float *X, const int32_t *pk, int div, int base, int n,
                                            float (&res)[NM][NT], const float *ng = nullptr,
                                            const float *rn = nullptr)
{
    if (n == 1)
        warp_rows_pass<KIND, NM, NORM, 1, 0>(wrow, sbrow, n_in, group, X, pk, div, base, n, res, ng, rn);
    else if (n == 2)
        warp_rows_pass<KIND, NM, NORM, 2, 4>(wrow, sbrow, n_in, group, X, pk, div, base, n, res, ng, rn);
    else if (n <= 4)
        warp_rows_pass<KIND, NM, NORM, 4, 4>(wrow, sbrow, n_in, group, X, pk, div, base, n, res, ng, rn);
    else
        warp_rows<KIND, NM, NORM, 4, NT>(wrow, sbrow, n_in, group, X, pk, div, base, n, res, ng, rn);
}

// The router: rl[t][e] = router[e] . xn[t], a warp a row, all T tokens.
template <int KIND>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32) moe_router_kernel(const uint8_t *w, const float *sb, int n_out,
                                                                       int n_in, int group, const float *xn, int T,
                                                                       float *rl)
{
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5);
    if (row >= n_out)
        return;
    const uint8_t *wr = w + (size_t)row * row_bytes(KIND, n_in);
    const void *sr = sb ? sb + (size_t)row * (n_in / group) * 2 : nullptr;
    for (int t0 = 0; t0 < T; t0 += NT) {
        float res[1][NT];
        warp_rows_n<KIND, 1>(&wr, &sr, n_in, group, xn, nullptr, 1, t0, T - t0 < NT ? T - t0 : NT, res);
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int j = 0; j < NT; j++)
                if (t0 + j < T)
                    rl[(size_t)(t0 + j) * n_out + row] = res[0][j];
    }
}

constexpr int MAXV = TCU_MOE_MAX_EXPERTS / 32;

// Token t's routing by one warp: the softmax over its E logits, the K most
// probable (the lower id on a tie), renormalized when norm_topk, sorted by
// id into sel / wt; a step of one token (T == 1) also writes the groups
// (its picks by id: G = K) into meta. rb (or NULL): the router's bias,
// added to the logits; topk_sm: the K largest logits, then their softmax
// (tcu_experts.topk_softmax; the CPU's order: the first pick's logit is
// the max, the sum in pick order).
template <int MV>
__device__ __forceinline__ void route_one(const float *rl, const float *rb, int topk_sm, int t, int T, int E, int K,
                                          int norm_topk, int G, float *wt, int32_t *sel, int32_t *meta)
{
    const int lane = threadIdx.x & 31;
    const float *p = rl + (size_t)t * E;
    float v[MV];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < MV; j++) {
        const int e = lane + 32 * j;
        v[j] = e < E ? __ldcg(p + e) : -INFINITY;
        if (rb && e < E)
            v[j] += rb[e];
        mx = fmaxf(mx, v[j]);
    }
    if (!topk_sm) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < MV; j++)
            if (lane + 32 * j < E) {
                v[j] = expf(v[j] - mx);
                s += v[j];
            }
        s = warp_sum(s);
#pragma unroll
        for (int j = 0; j < MV; j++)
            v[j] = lane + 32 * j < E ? v[j] / s : -1.0f;
    }
    unsigned taken = 0;
    float tsum = 0.0f, my_w = 0.0f, top = 0.0f;
    int my_id = 0x7fffffff;
    for (int k = 0; k < K; k++) {
        float bv = topk_sm ? -INFINITY : -2.0f; /* below every candidate (logits, or probabilities) */
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < MV; j++)
            if (!((taken >> j) & 1u) && v[j] > bv) {
                bv = v[j];
                bi = lane + 32 * j;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        if (lane == k) {
            my_id = bi;
            my_w = bv;
        }
        if (topk_sm) {
            top = k == 0 ? bv : top;
            tsum += expf(bv - top);
        } else {
            tsum += bv;
        }
    }
    if (topk_sm)
        my_w = expf(my_w - top) / tsum;
    else if (norm_topk)
        my_w /= tsum;
    int rank = 0; /* by expert id */
    for (int j = 0; j < K; j++)
        rank += __shfl_sync(0xffffffffu, my_id, j) < my_id;
    if (lane < K) {
        sel[(size_t)t * K + rank] = my_id;
        wt[(size_t)t * K + rank] = my_w;
    }
    if (T == 1 && lane < K) { /* one token: its picks by id are the groups */
        meta[1 + rank] = my_id;
        meta[1 + G + rank] = rank;
        meta[2 + 2 * G + rank] = rank;
        if (lane == 0) {
            meta[1 + G + K] = K;
            meta[0] = K;
        }
    }
}

// Routing and grouping by one block of up to 32 warps (see cuda_moe.h); sh:
// 2 E ints of shared memory. rl is read through L2 (other blocks of the
// caller's grid may have written it). MV: router logits a lane (E <= 32
// MV). A token's k-th pick stays in lane k, which finds its place among
// the picks by id (a rank over the warp) - no serial sort.
template <int MV>
__device__ void route_block(const float *rl, const float *rb, int topk_sm, int T, int E, int K, int norm_topk, int G,
                            float *wt, int32_t *sel, int32_t *meta, int *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int t = w; t < T; t += nw)
        route_one<MV>(rl, rb, topk_sm, t, T, E, K, norm_topk, G, wt, sel, meta);
    if (T == 1) /* route_one wrote the groups */
        return;
    int *cnt = sh, *num = sh + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    const int n = T * K;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    if (w == 0) { /* the groups: counts scanned 32 experts at a time */
        int g = 0, off = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane, c = e < E ? cnt[e] : 0;
            int incl = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += v;
            }
            const unsigned nz = __ballot_sync(0xffffffffu, c != 0);
            const int gi = g + __popc(nz & ((1u << lane) - 1u)), at = off + incl - c;
            if (e < E) {
                num[e] = c;
                cnt[e] = at;
            }
            if (c) {
                meta[1 + gi] = e;
                meta[1 + G + gi] = at;
            }
            g += __popc(nz);
            off += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) {
            meta[1 + G + g] = off;
            meta[0] = g;
        }
    }
    __syncthreads();
    int32_t *picks = meta + 2 + 2 * G;
    for (int e = w; e < E; e += nw) {
        if (!num[e])
            continue;
        int at = cnt[e];
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            const bool hit = i < n && sel[i] == e;
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            if (hit)
                picks[at + __popc(b & ((1u << lane) - 1u))] = i;
            at += __popc(b);
        }
    }
}

__global__ void __launch_bounds__(1024) moe_route_kernel(const float *rl, const float *rb, int topk_sm, int T, int E,
                                                         int K, int norm_topk, int G, float *wt, int32_t *sel,
                                                         int32_t *meta)
{
    pdl_wait();
    pdl_trigger();
    extern __shared__ int sh[];
    if (E <= 128)
        route_block<4>(rl, rb, topk_sm, T, E, K, norm_topk, G, wt, sel, meta, sh);
    else
        route_block<MAXV>(rl, rb, topk_sm, T, E, K, norm_topk, G, wt, sel, meta, sh);
}

constexpr int FUSE_T = 64; // steps up to this many tokens take moe_gate_kernel

// A token's RMSNorm factor 1 / sqrt(mean(x^2) + eps) by one warp: each lane
// sums its strided elements in double, then the butterfly - one order
// whatever the step. The loads go 16 at a time (a 2048-wide row in 4 round
// trips rather than one per unrolled few); squares of floats are exact in
// double, so fused or not the sums are the same.
__device__ __forceinline__ float norm_factor(const float *xr, int n, float eps)
{
    double ss = 0.0;
    for (int e0 = threadIdx.x & 31; e0 < n; e0 += 32 * 16) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; k++)
            v[k] = e0 + 32 * k < n ? xr[e0 + 32 * k] : 0.0f;
#pragma unroll
        for (int k = 0; k < 16; k++)
            if (e0 + 32 * k < n)
                ss += (double)v[k] * v[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    return (float)(1.0 / sqrt(ss / n + eps));
}

// Steps above FUSE_T tokens: xn = (x * r) * g, a warp a token (the gate
// kernel's arithmetic).
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32)
    moe_norm_kernel(const float *x, const float *g, float eps, float *xn, int T, int n)
{
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5);
    if (t >= T)
        return;
    const float *xr = x + (size_t)t * n;
    const float r = norm_factor(xr, n, eps);
    for (int e = threadIdx.x & 31; e < n; e += 32)
        xn[(size_t)t * n + e] = (xr[e] * r) * g[e];
}

// RMSNorm, router and routing in one launch for steps of up to FUSE_T
// tokens: every block computes the tokens' norm factors (a warp a token, as
// moe_norm_kernel - the same bits), block 0 writes xn, a warp a router row
// dots the normed rows on the fly; the last block to finish (cnt) routes
// and groups.
template <int KIND>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32)
    moe_gate_kernel(const uint8_t *w, const float *sb, int n_out, int n_in, int group, const float *x, const float *ng,
                    float eps, float *xn, int T, float *rl, const float *rb, int topk_sm, int K, int norm_topk, int G,
                    float *wt, int32_t *sel, int32_t *meta, int32_t *cnt)
{
    { /* the router row into L2 while the kernel before this one ends */
        const int row = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5);
        if (row < n_out) {
            const size_t rb = row_bytes(KIND, n_in);
            const uint8_t *wr = w + (size_t)row * rb;
            for (size_t o = (size_t)(threadIdx.x & 31) * 128; o < rb; o += 32 * 128)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + o));
        }
    }
    pdl_wait();
    pdl_trigger();
    __shared__ float rn[FUSE_T];
    extern __shared__ int sh[];
    for (int t = threadIdx.x >> 5; t < T; t += TCU_MOE_ROWS) {
        const float r = norm_factor(x + (size_t)t * n_in, n_in, eps);
        if ((threadIdx.x & 31) == 0)
            rn[t] = r;
    }
    __syncthreads();
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < T * n_in; i += blockDim.x)
            xn[i] = (x[i] * rn[i / n_in]) * ng[i % n_in];
    const int row = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5);
    if (row < n_out) {
        const uint8_t *wr = w + (size_t)row * row_bytes(KIND, n_in);
        const void *sr = sb ? sb + (size_t)row * (n_in / group) * 2 : nullptr;
        for (int t0 = 0; t0 < T; t0 += NT) {
            float res[1][NT];
            warp_rows_n<KIND, 1, true>(&wr, &sr, n_in, group, x, nullptr, 1, t0, T - t0 < NT ? T - t0 : NT, res, ng, rn);
            if ((threadIdx.x & 31) == 0)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (t0 + j < T)
                        rl[(size_t)(t0 + j) * n_out + row] = res[0][j];
        }
    }
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    if (n_out <= 128)
        route_block<4>(rl, rb, topk_sm, T, n_out, K, norm_topk, G, wt, sel, meta, sh);
    else
        route_block<MAXV>(rl, rb, topk_sm, T, n_out, K, norm_topk, G, wt, sel, meta, sh);
    if (threadIdx.x == 0)
        *cnt = 0;
}

// Gate and up of group blockIdx.y's expert over its picks: h[pick][row] =
// silu(gate) * up (moe_act). A warp takes rows bx * ROWS + w, then a grid's width of
// rows further on, and so on: the grid is about two waves' worth of blocks
// (experts_launch), so each warp finds its expert's weights (group table,
// expert table: dependent loads) once for several rows rather than each
// block of many waves for one.
template <int KIND>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32) moe_gu_kernel(tcu_experts ex, const int32_t *meta, int G,
                                                                   const float *xn, float *h)
{
    pdl_wait();
    pdl_trigger();
    const meta_v mv{meta, G};
    const int g = blockIdx.y;
    if (g >= mv.groups())
        return;
    const int e = mv.expert(g), p0 = mv.start(g), p1 = mv.start(g + 1);
    const void *const *tab = ex.tab + (size_t)e * 6;
    if (ex.used && blockIdx.x == 0 && threadIdx.x == 0) { /* the step's pick of e, and where it is read from */
        ex.used[e] = 1;
        const bool hit = tab[0] >= ex.cache_lo && tab[0] < ex.cache_hi;
        atomicAdd(&ex.count[hit ? 0 : 1], 1ull);
    }
    const size_t rb = row_bytes(KIND, ex.dim);
    const uint8_t *const g0 = (const uint8_t *)tab[0], *const u0 = (const uint8_t *)tab[1];
    const int32_t *pk = mv.picks();
    for (int row = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5); row < ex.ff; row += gridDim.x * TCU_MOE_ROWS) {
        const uint8_t *wr[2] = {g0 + (size_t)row * rb, u0 + (size_t)row * rb};
        const void *sr[2] = {unit_t<KIND>::Q ? scale_row<KIND>(tab[3], row, ex.dim, ex.group) : nullptr,
                             unit_t<KIND>::Q ? scale_row<KIND>(tab[4], row, ex.dim, ex.group) : nullptr};
        for (int q = p0; q < p1; q += NT) {
            const int n = p1 - q < NT ? p1 - q : NT;
            float res[2][NT];
            warp_rows_n<KIND, 2>(wr, sr, ex.dim, ex.group, xn, pk + q, ex.n_used, 0, n, res);
            if ((threadIdx.x & 31) == 0)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < n)
                        h[(size_t)pk[q + j] * ex.ff + row] = moe_act(ex, e, row, res[0][j], res[1][j]);
        }
    }
}

// The down kernels' end: the last of a column's blocks (blockIdx.x, one a
// group) to arrive (cnt) sums, for the rows the column covers (bx RT + i +
// k gridDim.x RT, i < RT), each token's picks in expert order, weighted,
// and adds the sum to x; it leaves the counter at zero.
__device__ __forceinline__ void down_sum(const tcu_experts &ex, int32_t *cnt, int ng_all, const float *y,
                                         const float *wt, const int32_t *sel, float *x, int T, int RT)
{
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&cnt[blockIdx.x], 1) == ng_all - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    const int K = ex.n_used, r0 = blockIdx.x * RT, stride = gridDim.x * RT;
    const int per = (ex.dim - r0 + stride - 1) / stride * RT; /* row slots of the column */
    for (int i = threadIdx.x; i < T * per; i += blockDim.x) {
        const int t = i / per, j = i % per, r = r0 + j % RT + j / RT * stride;
        if (r >= ex.dim)
            continue;
        float o = 0.0f;
        for (int k = 0; k < K; k++)
            o += moe_term(ex, y, wt, sel, (size_t)t * K + k, r);
        x[(size_t)t * ex.dim + r] += o;
    }
    if (threadIdx.x == 0)
        cnt[blockIdx.x] = 0;
}

// Down of group blockIdx.y's expert over its picks into y[pick][row], a
// warp a row at a time (rows of any width, in passes of CHN chunks; the
// rows strided as in moe_gu_kernel), then down_sum.
template <int KIND>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32) moe_down_kernel(tcu_experts ex, const int32_t *meta, int G,
                                                                     const float *h, float *y, const float *wt,
                                                                     const int32_t *sel, int32_t *cnt, float *x,
                                                                     int T)
{
    pdl_wait();
    pdl_trigger();
    const meta_v mv{meta, G};
    const int g = blockIdx.y, ng_all = mv.groups();
    if (g >= ng_all)
        return;
    const int e = mv.expert(g), p0 = mv.start(g), p1 = mv.start(g + 1);
    const void *const *tab = ex.tab + (size_t)e * 6;
    const size_t rb = row_bytes(KIND, ex.ff);
    const int32_t *pk = mv.picks();
    for (int row = blockIdx.x * TCU_MOE_ROWS + (threadIdx.x >> 5); row < ex.dim; row += gridDim.x * TCU_MOE_ROWS) {
        const uint8_t *wr = (const uint8_t *)tab[2] + (size_t)row * rb;
        const void *sr = unit_t<KIND>::Q ? scale_row<KIND>(tab[5], row, ex.ff, ex.group) : nullptr;
        for (int q = p0; q < p1; q += NT) {
            const int n = p1 - q < NT ? p1 - q : NT;
            float res[1][NT];
            warp_rows_n<KIND, 1>(&wr, &sr, ex.ff, ex.group, h, pk + q, 1, 0, n, res);
            if ((threadIdx.x & 31) == 0)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < n)
                        y[(size_t)pk[q + j] * ex.dim + row] = res[0][j];
        }
    }
    down_sum(ex, cnt, ng_all, y, wt, sel, x, T, TCU_MOE_ROWS);
}

// Down for rows a lane holds whole in registers (ff <= 32 CC NV): a warp NR
// rows of group blockIdx.y's expert at a time (rows strided as in
// moe_gu_kernel, NR consecutive), each held across all the expert's picks
// (the same sums as moe_down_kernel: a lane's units in order, then the
// butterfly). early: the warp's first rows are requested before the PDL
// wait - the routing kernel ended before the gate/up kernel passed its own
// wait, and this grid starts only once every gate/up block has, so the
// groups and the expert table are final; h (gate/up's output) is read
// after the wait.
template <int KIND, int CC, int NR>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32)
    moe_down_short_kernel(tcu_experts ex, const int32_t *meta, int G, const float *h, float *y, const float *wt,
                          const int32_t *sel, int32_t *cnt, float *x, int T, int early)
{
    using U = unit_t<KIND>;
    constexpr int W = U::WORDS, NV = U::NV, RT = TCU_MOE_ROWS * NR;
    const int g = blockIdx.y, lane = threadIdx.x & 31, units = ex.ff / NV, stride = gridDim.x * RT;
    uint32_t r[NR][CC][W];
    float sc[NR][CC], bi[NR][CC];
    int ng_all = 0, p0 = 0, p1 = 0;
    const int32_t *pk = nullptr;
    const uint8_t *dw = nullptr;
    const void *ds = nullptr;
    auto find = [&]() {
        const meta_v mv{meta, G};
        ng_all = mv.groups();
        if (g >= ng_all)
            return;
        p0 = mv.start(g), p1 = mv.start(g + 1);
        pk = mv.picks();
        const void *const *tab = ex.tab + (size_t)mv.expert(g) * 6;
        dw = (const uint8_t *)tab[2];
        ds = tab[5];
    };
    auto load = [&](int row0) {
        const size_t rb = row_bytes(KIND, ex.ff);
#pragma unroll
        for (int m = 0; m < NR; m++) {
            const int row = row0 + m < ex.dim ? row0 + m : ex.dim - 1; /* past the end: a real row, unused */
            const uint8_t *wr = dw + (size_t)row * rb;
            const void *sr = U::Q ? scale_row<KIND>(ds, row, ex.ff, ex.group) : nullptr;
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const int u = c * 32 + lane;
                if (u < units) {
                    unit_load<KIND>(wr, u, r[m][c]);
                    if constexpr (U::Q)
                        scale_load<KIND>(sr, u, ex.group, sc[m][c], bi[m][c]);
                } else {
#pragma unroll
                    for (int k = 0; k < W; k++)
                        r[m][c][k] = 0;
                    sc[m][c] = bi[m][c] = 0.0f;
                }
            }
        }
    };
    const int first = blockIdx.x * RT + (threadIdx.x >> 5) * NR;
    if (early) {
        find();
        if (g < ng_all && first < ex.dim)
            load(first);
    }
    pdl_wait();
    pdl_trigger();
    if (!early)
        find();
    if (g >= ng_all)
        return;
    for (int row0 = first; row0 < ex.dim; row0 += stride) {
        if (!early || row0 != first)
            load(row0);
        for (int q = p0; q < p1; q += NT) {
            const int n = p1 - q < NT ? p1 - q : NT;
            float acc[NR][NT];
#pragma unroll
            for (int m = 0; m < NR; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    acc[m][j] = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j >= n)
                    break;
                const float *xrow = h + (size_t)pk[q + j] * ex.ff;
#pragma unroll
                for (int c = 0; c < CC; c++) {
                    const int u = c * 32 + lane;
                    if (u >= units)
                        break;
                    float xv[NV];
#pragma unroll
                    for (int k = 0; k < NV; k += 4) {
                        const float4 a = *(const float4 *)(xrow + u * NV + k);
                        xv[k] = a.x, xv[k + 1] = a.y, xv[k + 2] = a.z, xv[k + 3] = a.w;
                    }
#pragma unroll
                    for (int m = 0; m < NR; m++)
                        acc[m][j] = unit_dot<KIND>(r[m][c], xv, sc[m][c], bi[m][c], acc[m][j]);
                }
            }
#pragma unroll
            for (int m = 0; m < NR; m++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const float v = warp_sum(acc[m][j]);
                    if (lane == 0 && j < n && row0 + m < ex.dim)
                        y[(size_t)pk[q + j] * ex.dim + row0 + m] = v;
                }
        }
    }
    down_sum(ex, cnt, ng_all, y, wt, sel, x, T, RT);
}

// Lane 0 waits until *c reaches `want` (polling through L2), then the warp
// goes on; it gives up after about 2^27 cycles (wrong sums rather than a
// hang, were a waited-for warp ever not to run).
__device__ __forceinline__ void warp_wait(const int32_t *c, int want)
{
    if ((threadIdx.x & 31) == 0) {
        const long long t0 = clock64();
        while (*(volatile const int32_t *)c < want && clock64() - t0 < (1ll << 27))
            __nanosleep(64);
        __threadfence();
    }
    __syncwarp();
}

// tcu_opts.moe TCU_MOE_FUSED (the default; a step of one token, 4-bit
// experts with short down rows): gate/up, down and the weighted sum in one
// launch of about one wave, a warp an item - first every group's gate/up
// rows, then every group's down rows, NR consecutive rows an item; warp w
// takes items w, w + warps, ... in order (so it has done all its earlier
// items before it waits on others'). A down item requests its weights,
// then waits until its group's gate/up rows are all counted (cnt[tiles + 2
// + g]); the warp completing a row tile's last group (cnt[tile]) sums the
// tile's rows as down_sum does; the last warp out zeroes the counters. The
// products are moe_gu_kernel's and moe_down_short_kernel's (a token a
// pass), the sum down_sum's: the same bits. The grid never exceeds one
// wave, so every warp waited for runs. H200, 30B-A3B shape, the layer
// alone (bench_moe --kernels): 4-bit 46.8 us a layer against 50.6 in three
// launches; bf16 49.7 against 44.6, and one row an item 81 - so 4-bit only.
template <int KIND, int CC>
__global__ void __launch_bounds__(TCU_MOE_ROWS * 32, 2)
    moe_fused_kernel(tcu_experts ex, const int32_t *meta, int G, const float *xn, float *h, float *y, const float *wt,
                     const int32_t *sel, int32_t *cnt, float *x, int T)
{
    using U = unit_t<KIND>;
    constexpr int W = U::WORDS, NV = U::NV, NR = 4, NTD = 1;
    const int lane = threadIdx.x & 31, K = ex.n_used;
    const int nw = gridDim.x * (blockDim.x >> 5), gw = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    pdl_wait();
    pdl_trigger();
    const int ng = meta[0];
    const int tiles = (ex.dim + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS, dn = ex.dim / NR;
    int32_t *const done = cnt + tiles + 2;
    const long n_gu = (long)ng * ex.ff, n_all = n_gu + (long)ng * dn;
    for (long i = gw; i < n_all; i += nw) {
        if (i < n_gu) {
            const int g = (int)(i / ex.ff), row = (int)(i % ex.ff);
            const int e = meta[1 + g], p0 = meta[1 + G + g], p1 = meta[2 + G + g];
            const void *const *tab = ex.tab + (size_t)e * 6;
            if (ex.used && row == 0 && lane == 0) {
                ex.used[e] = 1;
                const bool hit = tab[0] >= ex.cache_lo && tab[0] < ex.cache_hi;
                atomicAdd(&ex.count[hit ? 0 : 1], 1ull);
            }
            const size_t rb = row_bytes(KIND, ex.dim);
            const uint8_t *wr[2] = {(const uint8_t *)tab[0] + (size_t)row * rb,
                                    (const uint8_t *)tab[1] + (size_t)row * rb};
            const void *sr[2] = {U::Q ? scale_row<KIND>(tab[3], row, ex.dim, ex.group) : nullptr,
                                 U::Q ? scale_row<KIND>(tab[4], row, ex.dim, ex.group) : nullptr};
            for (int q = p0; q < p1; q += NTD) {
                const int n = p1 - q < NTD ? p1 - q : NTD;
                int32_t pq[NTD];
#pragma unroll
                for (int j = 0; j < NTD; j++)
                    pq[j] = j < n ? meta[2 + 2 * G + q + j] : 0;
                float res[2][NTD];
                warp_rows<KIND, 2, false, 0, NTD>(wr, sr, ex.dim, ex.group, xn, pq, ex.n_used, 0, n, res);
                if (lane == 0)
#pragma unroll
                    for (int j = 0; j < NTD; j++)
                        if (j < n)
                            h[(size_t)pq[j] * ex.ff + row] = moe_act(ex, e, row, res[0][j], res[1][j]);
            }
            if (lane == 0) {
                __threadfence();
                atomicAdd(&done[g], 1);
            }
            continue;
        }
        const int g = (int)((i - n_gu) / dn), row0 = (int)((i - n_gu) % dn) * NR;
        const int e = meta[1 + g], p0 = meta[1 + G + g], p1 = meta[2 + G + g];
        const void *const *tab = ex.tab + (size_t)e * 6;
        const int units = ex.ff / NV;
        uint32_t r[NR][CC][W];
        float sc[NR][CC], bi[NR][CC];
#pragma unroll
        for (int m = 0; m < NR; m++) {
            const uint8_t *wr = (const uint8_t *)tab[2] + (size_t)(row0 + m) * row_bytes(KIND, ex.ff);
            const void *sr = U::Q ? scale_row<KIND>(tab[5], row0 + m, ex.ff, ex.group) : nullptr;
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const int u = c * 32 + lane;
                if (u < units) {
                    unit_load<KIND>(wr, u, r[m][c]);
                    if constexpr (U::Q)
                        scale_load<KIND>(sr, u, ex.group, sc[m][c], bi[m][c]);
                } else {
#pragma unroll
                    for (int k = 0; k < W; k++)
                        r[m][c][k] = 0;
                    sc[m][c] = bi[m][c] = 0.0f;
                }
            }
        }
        warp_wait(&done[g], ex.ff);
        for (int q = p0; q < p1; q += NTD) {
            const int n = p1 - q < NTD ? p1 - q : NTD;
            float acc[NR][NTD];
#pragma unroll
            for (int m = 0; m < NR; m++)
#pragma unroll
                for (int j = 0; j < NTD; j++)
                    acc[m][j] = 0.0f;
            int32_t pq[NTD];
#pragma unroll
            for (int j = 0; j < NTD; j++)
                pq[j] = j < n ? meta[2 + 2 * G + q + j] : 0;
#pragma unroll
            for (int j = 0; j < NTD; j++) {
                if (j >= n)
                    break;
                const float *xrow = h + (size_t)pq[j] * ex.ff;
#pragma unroll
                for (int c = 0; c < CC; c++) {
                    const int u = c * 32 + lane;
                    if (u >= units)
                        break;
                    float xv[NV];
#pragma unroll
                    for (int k = 0; k < NV; k += 4) {
                        const float4 a = __ldcg((const float4 *)(xrow + u * NV + k));
                        xv[k] = a.x, xv[k + 1] = a.y, xv[k + 2] = a.z, xv[k + 3] = a.w;
                    }
#pragma unroll
                    for (int m = 0; m < NR; m++)
                        acc[m][j] = unit_dot<KIND>(r[m][c], xv, sc[m][c], bi[m][c], acc[m][j]);
                }
            }
#pragma unroll
            for (int m = 0; m < NR; m++)
#pragma unroll
                for (int j = 0; j < NTD; j++) {
                    const float v = warp_sum(acc[m][j]);
                    if (lane == 0 && j < n)
                        y[(size_t)pq[j] * ex.dim + row0 + m] = v;
                }
        }
        int last = 0;
        if (lane == 0) {
            __threadfence();
            last = atomicAdd(&cnt[row0 / TCU_MOE_ROWS], NR) == ng * TCU_MOE_ROWS - NR;
        }
        if (__shfl_sync(0xffffffffu, last, 0)) { /* the tile's rows, every token: down_sum's sum */
            __threadfence();
            const int r0 = row0 / TCU_MOE_ROWS * TCU_MOE_ROWS;
            for (int k2 = lane; k2 < T * TCU_MOE_ROWS; k2 += 32) {
                const int t = k2 / TCU_MOE_ROWS, rr = r0 + k2 % TCU_MOE_ROWS;
                float o = 0.0f;
                for (int k = 0; k < K; k++)
                    o += moe_term(ex, y, wt, sel, (size_t)t * K + k, rr);
                x[(size_t)t * ex.dim + rr] += o;
            }
            if (lane == 0)
                cnt[row0 / TCU_MOE_ROWS] = 0;
        }
    }
    if (lane == 0) { /* the last warp out: the counters back to zero */
        __threadfence();
        if (atomicAdd(&cnt[tiles + 1], 1) == nw - 1) {
            for (int g = 0; g < ng; g++)
                done[g] = 0;
            cnt[tiles + 1] = 0;
        }
    }
}

template <int KIND>
int router_launch(const tcu_mat &r, int n_in, const float *xn, int T, float *rl, bool pdl, cudaStream_t st)
{
    return launch_pdl(pdl, moe_router_kernel<KIND>, dim3((r.n_out + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS),
                      dim3(TCU_MOE_ROWS * 32), 0, st, (const uint8_t *)r.w, r.sb, r.n_out, n_in, r.group, xn, T, rl);
}

// Blocks per SM of a kernel of TCU_MOE_ROWS warps (cached per kernel)
// times the SMs: one wave.
template <typename F> int wave_blocks(F kernel)
{
    static struct {
        const void *k;
        int n;
    } cache[64];
    static int sms;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) || sms < 1)
            sms = 132;
    }
    int i = 0;
    for (; i < 64 && cache[i].k; i++)
        if (cache[i].k == (const void *)kernel)
            return cache[i].n;
    int per = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, TCU_MOE_ROWS * 32, 0) || per < 1)
        per = 1;
    cudaGetLastError();
    if (i < 64) {
        cache[i].n = per * sms;
        cache[i].k = (const void *)kernel;
    }
    return per * sms;
}

// A grid's columns (row tiles a group) for `full` tiles: all of them, or
// (TCU_MOE_WAVES) enough for about one wave of G groups' blocks - each
// warp then strides over several rows - when that still gives every group
// 8 columns or more (a step of few tokens: H200, 30B-A3B shape, one token
// 47.6 us a layer against 55.3 with every tile a block; at 32 tokens, 112
// experts, the wave of long blocks measured 880 us against 771: the full
// grid there).
template <typename F> int grid_cols(F kernel, int full, int G, int flags)
{
    if (!(flags & TCU_MOE_WAVES))
        return full;
    const int c = (wave_blocks(kernel) + G - 1) / G;
    return c < 8 ? full : c < full ? c : full;
}

template <typename F>
int fused_launch(F k, const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, int G,
                 bool pdl, cudaStream_t st)
{
    const long need = ((long)G * (e.ff + e.dim) + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS;
    const int wave = wave_blocks(k), nb = need < wave ? (int)need : wave;
    return launch_pdl(pdl, k, dim3(nb), dim3(TCU_MOE_ROWS * 32), 0, st, e, (const int32_t *)s.meta, G, xn, s.h, s.y,
                      (const float *)s.wt, (const int32_t *)s.sel, s.cnt, x, T);
}

template <int KIND>
int experts_launch(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, bool pdl,
                   int flags, cudaStream_t st)
{
    const int G = e.n_expert < T * e.n_used ? e.n_expert : T * e.n_used;
    const dim3 blk(TCU_MOE_ROWS * 32);
    constexpr int SH = KIND == TCU_F32 ? 2 : 4;
    if constexpr (KIND == TCU_Q4)
        if ((flags & TCU_MOE_FUSED) && T == 1 && e.ff <= 32 * SH * unit_t<KIND>::NV) {
            PROF(TCU_PROF_MOE_GU, st);
            return fused_launch(moe_fused_kernel<KIND, SH>, e, s, xn, x, T, G, pdl, st);
        }
    int rc;
    /* steps of several tokens: a block per row tile (the wave grid's long
     * blocks served one token a row; with 4 chunks a pass of 2+ tokens,
     * 20B shapes, 4 layers, b32 / b128: 2818 / 2990 tok/s before, 5739 /
     * 7352 after) */
    if (T > 1)
        flags &= ~TCU_MOE_WAVES;
    {
        PROF(TCU_PROF_MOE_GU, st);
        const auto k = moe_gu_kernel<KIND>;
        const int cols = grid_cols(k, (e.ff + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS, G, flags);
        rc = launch_pdl(pdl, k, dim3(cols, G), blk, 0, st, e, (const int32_t *)s.meta, G, xn, s.h);
    }
    if (rc)
        return rc;
    PROF(TCU_PROF_MOE_DOWN, st);
    /* short down rows (Qwen3-30B-A3B's 768: 3 bf16 units a lane) stay whole
     * in registers (moe_down_short_kernel: TCU_MOE_DOWN_* of flags) */
    const int early = (flags & TCU_MOE_DOWN_EARLY) != 0;
    const int tiles = (e.dim + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS;
    if (e.ff <= 32 * SH * unit_t<KIND>::NV && (flags & TCU_MOE_DOWN_ROWS4)) {
        const auto k = moe_down_short_kernel<KIND, SH, 4>;
        return launch_pdl(pdl, k, dim3(grid_cols(k, (tiles + 3) / 4, G, flags), G), blk, 0, st, e,
                          (const int32_t *)s.meta, G, (const float *)s.h, s.y, (const float *)s.wt,
                          (const int32_t *)s.sel, s.cnt, x, T, early);
    }
    if (e.ff <= 32 * SH * unit_t<KIND>::NV) {
        const auto k = moe_down_short_kernel<KIND, SH, 1>;
        return launch_pdl(pdl, k, dim3(grid_cols(k, tiles, G, flags), G), blk, 0, st, e, (const int32_t *)s.meta, G,
                          (const float *)s.h, s.y, (const float *)s.wt, (const int32_t *)s.sel, s.cnt, x, T, early);
    }
    const auto k = moe_down_kernel<KIND>;
    return launch_pdl(pdl, k, dim3(grid_cols(k, tiles, G, flags), G), blk, 0, st, e, (const int32_t *)s.meta, G,
                      (const float *)s.h, s.y, (const float *)s.wt, (const int32_t *)s.sel, s.cnt, x, T);
}

int router_any(const tcu_mat &r, int n_in, const float *xn, int T, float *rl, bool pdl, cudaStream_t st)
{
    switch (r.kind) {
    case TCU_F32: return router_launch<TCU_F32>(r, n_in, xn, T, rl, pdl, st);
    case TCU_BF16: return router_launch<TCU_BF16>(r, n_in, xn, T, rl, pdl, st);
    case TCU_F16: return router_launch<TCU_F16>(r, n_in, xn, T, rl, pdl, st);
    case TCU_Q4: return router_launch<TCU_Q4>(r, n_in, xn, T, rl, pdl, st);
    case TCU_Q8: return router_launch<TCU_Q8>(r, n_in, xn, T, rl, pdl, st);
    default: return (int)cudaErrorInvalidValue;
    }
}

template <int KIND>
int gate_launch(const tcu_experts &e, const float *x, const float *ng, float eps, float *xn, int T, int G,
                const tcu_moe_scratch &s, bool pdl, cudaStream_t st)
{
    const tcu_mat &r = e.router;
    const int tiles = (e.dim + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS;
    return launch_pdl(pdl, moe_gate_kernel<KIND>, dim3((r.n_out + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS),
                      dim3(TCU_MOE_ROWS * 32), (size_t)2 * e.n_expert * sizeof(int), st, (const uint8_t *)r.w, r.sb,
                      r.n_out, e.dim, r.group, x, ng, eps, xn, T, s.rl, e.router_b, e.topk_softmax, e.n_used,
                      e.norm_topk, G, s.wt, s.sel, s.meta, s.cnt + tiles);
}

int gate_any(const tcu_experts &e, const float *x, const float *ng, float eps, float *xn, int T, int G,
             const tcu_moe_scratch &s, bool pdl, cudaStream_t st)
{
    switch (e.router.kind) {
    case TCU_F32: return gate_launch<TCU_F32>(e, x, ng, eps, xn, T, G, s, pdl, st);
    case TCU_BF16: return gate_launch<TCU_BF16>(e, x, ng, eps, xn, T, G, s, pdl, st);
    case TCU_F16: return gate_launch<TCU_F16>(e, x, ng, eps, xn, T, G, s, pdl, st);
    case TCU_Q4: return gate_launch<TCU_Q4>(e, x, ng, eps, xn, T, G, s, pdl, st);
    case TCU_Q8: return gate_launch<TCU_Q8>(e, x, ng, eps, xn, T, G, s, pdl, st);
    default: return (int)cudaErrorInvalidValue;
    }
}

int experts_any(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, bool pdl,
                int flags, cudaStream_t st)
{
    switch (e.kind) {
    case TCU_F32: return experts_launch<TCU_F32>(e, s, xn, x, T, pdl, flags, st);
    case TCU_BF16: return experts_launch<TCU_BF16>(e, s, xn, x, T, pdl, flags, st);
    case TCU_F16: return experts_launch<TCU_F16>(e, s, xn, x, T, pdl, flags, st);
    case TCU_Q4: return experts_launch<TCU_Q4>(e, s, xn, x, T, pdl, flags, st);
    case TCU_Q8: return experts_launch<TCU_Q8>(e, s, xn, x, T, pdl, flags, st);
    case TCU_MX4: return experts_launch<TCU_MX4>(e, s, xn, x, T, pdl, flags, st);
    default: return (int)cudaErrorInvalidValue;
    }
}

} // namespace

extern "C" size_t tcu_moe_cnt_len(int dim, int n_expert)
{
    return (size_t)((dim + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS + 2 + n_expert);
}

extern "C" size_t tcu_moe_meta_len(int n_expert, int n_used, int T)
{
    const long G = n_expert < (long)T * n_used ? n_expert : (long)T * n_used;
    return (size_t)(2 + 2 * G + (long)T * n_used);
}

extern "C" int tcu_moe(const tcu_experts *e, const tcu_moe_scratch *s, float *x, const float *norm_g, float norm_eps,
                       float *xn, int T, const tcu_opts *o, tcu_stream stream)
{
    const tcu_opts &op = opts_or_default(o);
    cudaStream_t st = (cudaStream_t)stream;
    if (T < 1)
        return 0;
    if (e->n_expert > TCU_MOE_MAX_EXPERTS || e->n_used > TCU_MOE_MAX_USED || e->n_used > e->n_expert ||
        e->dim % 8 || e->ff % 8 || ((e->kind == TCU_Q4 || e->kind == TCU_Q8) && e->group % 8) ||
        (e->kind == TCU_MX4 && (e->group != 32 || e->dim % 32 || e->ff % 32)) ||
        (e->swiglu_clamp && (!e->b_gate || !e->b_up)))
        return (int)cudaErrorInvalidValue;
    const int G = e->n_expert < T * e->n_used ? e->n_expert : T * e->n_used;
    int rc;
    {
        PROF(TCU_PROF_MOE_GATE, st);
        if (T <= FUSE_T) {
            rc = gate_any(*e, x, norm_g, norm_eps, xn, T, G, *s, op.pdl, st);
        } else {
            rc = launch_pdl(op.pdl, moe_norm_kernel, dim3((T + TCU_MOE_ROWS - 1) / TCU_MOE_ROWS),
                            dim3(TCU_MOE_ROWS * 32), 0, st, (const float *)x, norm_g, norm_eps, xn, T, e->dim);
            if (rc || (rc = router_any(e->router, e->dim, xn, T, s->rl, op.pdl, st)))
                return rc;
            rc = launch_pdl(op.pdl, moe_route_kernel, dim3(1), dim3(1024), (size_t)2 * e->n_expert * sizeof(int), st,
                            (const float *)s->rl, e->router_b, e->topk_softmax, T, e->n_expert, e->n_used,
                            e->norm_topk, G, s->wt, s->sel, s->meta);
        }
    }
    if (rc)
        return rc;
    /* throughput mode, steps of several tokens: the tensor-core grouped
     * GEMM (moe_tc.cu; activations rounded once to bf16); every step with
     * TC_ALL, or when steps of one sequence take the batched products
     * (tcu_opts.invariant), so a sequence's bits do not depend on the batch */
    if (!op.exact && (op.moe & TCU_MOE_TC) && moe_tc_ok(*e) &&
        (T >= moe_tc_min_t(e->kind) || (op.moe & TCU_MOE_TC_ALL) || (op.invariant & TCU_INV_PRODUCTS)))
        return moe_tc_launch(*e, *s, xn, x, T, op.pdl, op.moe, st);
    return experts_any(*e, *s, xn, x, T, op.pdl, op.moe, st);
}
