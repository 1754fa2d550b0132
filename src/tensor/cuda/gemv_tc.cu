// The tensor-core GEMV (TCU_GEMV_TENSOR, and TCU_GEMV_AUTO's choice for
// steps of several sequences): bf16 and 4-bit weights, the activations
// split exactly into three bf16 parts as mma columns (tcu_opts.exact) or
// rounded once to bf16 (one column a token: the throughput mode), split-K
// over a thread-block cluster, with its staging kernel.
#include <cooperative_groups.h>

#include "tensor/cuda/gemv.cuh"

// mma.sync m16n8k16 (bf16 inputs, f32 accumulation). Each f32 activation
// is split exactly into three bf16 (hi + mid + lo = x: 8 + 8 + 8
// significant bits), and the three products accumulate in f32, so the
// result is that of f32 activations up to the tensor core's accumulation
// rounding. The k order inside a 16-wide tile is permuted (lane t holds
// inputs 8t .. 8t + 7 of each 32-input step: one 16-byte load per row) -
// the same permutation for weights and activations, so the sum is the same
// one.

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// x = hi + mid + lo exactly, each a bf16 (the upper half of a float).
__device__ __forceinline__ void split3(float x, uint32_t &hi, uint32_t &mid, uint32_t &lo)
{
    hi = __float_as_uint(x) & 0xffff0000u;
    float r = __fsub_rn(x, __uint_as_float(hi));
    mid = __float_as_uint(r) & 0xffff0000u;
    lo = __float_as_uint(__fsub_rn(r, __uint_as_float(mid))) & 0xffff0000u;
}

// Packs the bf16 parts of (x0, x1) as a bf16x2 register (x0 in the low half).
__device__ __forceinline__ void pack3(float x0, float x1, uint32_t p[3])
{
    uint32_t h0, m0, l0, h1, m1, l1;
    split3(x0, h0, m0, l0);
    split3(x1, h1, m1, l1);
    p[0] = (h0 >> 16) | h1;
    p[1] = (m0 >> 16) | m1;
    p[2] = (l0 >> 16) | l1;
}

// x rounded to the nearest bf16 (ties to even; a NaN stays a NaN), as the
// upper 16 bits.
__device__ __forceinline__ uint32_t bf16_rn(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ uint32_t pack1(float x0, float x1) { return bf16_rn(x0) | (bf16_rn(x1) << 16); }

// The 8 activations' sum as the throughput mode's products see them: of
// the bf16-rounded values (4-bit: the bias term then completes the product
// of the dequantized weights with the rounded activations, so the error is
// that of bf16 weights - 1.7e-3 rather than 7.5e-3 with the f32 sums).
__device__ __forceinline__ float tc_r(float x) { return __uint_as_float(bf16_rn(x) << 16); }
__device__ __forceinline__ float4 tc_r4(float4 v) { return make_float4(tc_r(v.x), tc_r(v.y), tc_r(v.z), tc_r(v.w)); }

// Inputs 8t .. 8t + 7 of a step (v0, v1) rounded once to bf16, in
// tc_split8's order (the throughput mode's one column a token).
template <bool Q> __device__ __forceinline__ uint4 tc_round8(float4 v0, float4 v1)
{
    if (Q)
        return make_uint4(pack1(v0.x, v1.x), pack1(v0.y, v1.y), pack1(v0.z, v1.z), pack1(v0.w, v1.w));
    return make_uint4(pack1(v0.x, v0.y), pack1(v0.z, v0.w), pack1(v1.x, v1.y), pack1(v1.z, v1.w));
}

// Inputs 8t .. 8t + 7 of a step (v0, v1) split into three bf16 parts, in
// the panel's 16-byte pieces: pairs (8t + i, 8t + i + 1), or for 4-bit
// weights (Q) pairs (8t + i, 8t + 4 + i), the codes' order.
template <bool Q>
__device__ __forceinline__ void tc_split8(float4 v0, float4 v1, uint4 &hi, uint4 &mid, uint4 &lo)
{
    uint32_t p[4][3];
    if (Q) {
        pack3(v0.x, v1.x, p[0]);
        pack3(v0.y, v1.y, p[1]);
        pack3(v0.z, v1.z, p[2]);
        pack3(v0.w, v1.w, p[3]);
    } else {
        pack3(v0.x, v0.y, p[0]);
        pack3(v0.z, v0.w, p[1]);
        pack3(v1.x, v1.y, p[2]);
        pack3(v1.z, v1.w, p[3]);
    }
    hi = make_uint4(p[0][0], p[1][0], p[2][0], p[3][0]);
    mid = make_uint4(p[0][1], p[1][1], p[2][1], p[3][1]);
    lo = make_uint4(p[0][2], p[1][2], p[2][2], p[3][2]);
}

// ---- the kernel: activations split once per block (or per launch) ----
//
// Exact products (bf16 weights x f32 activations split into three bf16,
// f32 accumulation with a fresh accumulator per 32-input step), laid out
// for speed at every T:
// - the three parts of a token are three columns of the mma (token j:
//   columns 3j, 3j + 1, 3j + 2), so one mma pair per 32-input step covers
//   two tokens (the parts as three mma passes over 8-token columns, the
//   first layout, took three pairs for one to eight tokens); NT
//   n-tiles hold TP = 8 NT / 3 tokens, up to 32 in one pass;
// - each block splits its activations once into shared memory, already in
//   fragment order (one 16-byte load per lane and n-tile a step), with the
//   RMSNorm applied as they are staged;
// - a warp owns one 16-row tile (gate/up: warps 0-3 gate, 4-7 the same
//   rows of up), a block 128 weight rows; split-K over the KS blocks of a
//   thread-block cluster (KS from the shape alone): each block takes a
//   slice of the inputs, and after the pass the blocks' sums meet in
//   distributed shared memory, each block reducing 1 / KS of the rows in
//   slice order.
// Per (row, token) the order of sums is fixed by the shape: the 32-input
// steps of a slice in order, each step's parts added (hi + mid) + lo, then
// the slices in order; the norm factor likewise (a thread's elements, the
// warp's butterfly, the warps in order). A column of an mma never depends
// on another column, so a token's result does not depend on the batch.
//
// P (parts a token) = 3 is that exact layout; P = 1 the throughput mode:
// each activation rounded once to bf16 (nearest, ties to even), a token
// one column (NT n-tiles: 8 NT tokens, up to 128 in one pass), bf16
// products accumulated by the mma itself across the slice's steps (4-bit:
// each step's product scaled into the accumulator as for P = 3). The same
// argument gives batch invariance: the order per (row, token) is fixed by
// the shape and the mode, never by T.
#define TC_WARPS 8
#define TC_ROWS (TC_WARPS * 16)
#define TC_SMEM_X (96 * 1024) /* activation panel (bytes) at most */
#define TC_TP(NT) ((8 * (NT)) / 3) /* tokens a pass (P = 3) */
#define TC_TPP(NT, P) ((8 * (NT)) / (P)) /* tokens a pass */
#define TC_MAX_T1 128 /* tokens a launch, P = 1 (NT 16) */

// A weight load: 16 bytes, streamed (evict first), the L2 fetching the
// whole 256-byte block around it on a miss (the row's next steps; measured
// 1-5% faster at T = 8-32 than plain streaming loads).
__device__ __forceinline__ uint4 tc_ld(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.cs.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t tc_ld32(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.global.cs.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// A thread's part of a token's sum of squares for the fused RMSNorm: the
// four squares of v in order, in double (explicit roundings: the same
// bits wherever it is inlined).
__device__ __forceinline__ double tc_sq4(float4 v)
{
    double t = __dmul_rn((double)v.x, (double)v.x);
    t = __fma_rn((double)v.y, (double)v.y, t);
    t = __fma_rn((double)v.z, (double)v.z, t);
    return __fma_rn((double)v.w, (double)v.w, t);
}

// 8 activations' sum, in order (4-bit: the bias term's group sums).
__device__ __forceinline__ float tc_sum8(float4 v0, float4 v1)
{
    float s = __fadd_rn(__fadd_rn(__fadd_rn(v0.x, v0.y), v0.z), v0.w);
    return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(s, v1.x), v1.y), v1.z), v1.w);
}

// Steps of more than TC_TP(1) tokens: the activations split once per launch
// (tcu_gemv_args.stage) instead of by every block. grid (JS token slots,
// blocks along the inputs of `nbs` 32-input steps each: whole groups),
// TC_WARPS warps. Block (j, b): token j's norm factor over its whole row
// (the arithmetic of gemv_tc_kernel's own: a thread's elements, the
// warp's butterfly, the warps in order), then its three columns of steps
// b * nbs .. in the panel layout [step][C][4] uint4, and, 4-bit, each
// group's activation sum [group][C] (hi columns; 0 elsewhere) after the
// steps. Slots past the tokens write zeros. Every value is the one
// gemv_tc_kernel stages itself, so both give the same bits.
template <int NT, bool Q, int P>
__global__ void __launch_bounds__(TC_WARPS *WARP) tc_stage_kernel(const tcu_gemv_args a, int nbs)
{
    constexpr int C = 8 * NT, NTH = TC_WARPS * WARP;
    extern __shared__ float st8[]; /* [nbs * 4] 8-value sums */
    __shared__ double nsum[TC_WARPS];
    __shared__ float rn;
    pdl_wait();
    pdl_trigger();
    const int j = blockIdx.x, sa = blockIdx.y * nbs, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int np = a.T < TC_TPP(NT, P) ? a.T : TC_TPP(NT, P), G = Q ? a.m[0].group : 32;
    const bool tok = j < np;
    const size_t xrow = tok && a.norm_g && a.norm_rows ? (size_t)a.norm_rows[j] : (size_t)j;
    const float *xr = a.x + xrow * a.n_in;
    uint4 *xsp = reinterpret_cast<uint4 *>(a.stage);
    float *xsum = reinterpret_cast<float *>(xsp + (size_t)(a.n_in / 32) * C * 4);
    float r = 1.0f;
    if (tok && a.norm_g) {
        double ss = 0.0;
        for (int e = threadIdx.x * 4; e < a.n_in; e += NTH * 4)
            ss = __dadd_rn(ss, tc_sq4(__ldg(reinterpret_cast<const float4 *>(xr + e))));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            nsum[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            double s = 0.0;
            for (int k = 0; k < TC_WARPS; k++)
                s += nsum[k];
            rn = (float)(1.0 / sqrt(s / a.n_in + a.norm_eps));
        }
        __syncthreads();
        r = rn;
    }
    for (int i = threadIdx.x; i < nbs * 4; i += NTH) {
        const int st = sa + i / 4, tq = i % 4;
        uint4 hi = make_uint4(0, 0, 0, 0), mid = hi, lo = hi;
        float s8 = 0.0f;
        if (tok) {
            const int e = st * 32 + 8 * tq;
            const float4 *xp = reinterpret_cast<const float4 *>(xr + e);
            float4 v0 = __ldg(xp), v1 = __ldg(xp + 1);
            if (a.norm_g) {
                v0 = norm4(v0, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e)));
                v1 = norm4(v1, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e) + 1));
            }
            if (Q)
                s8 = P == 3 ? tc_sum8(v0, v1) : tc_sum8(tc_r4(v0), tc_r4(v1));
            if (P == 3)
                tc_split8<Q>(v0, v1, hi, mid, lo);
            else
                hi = tc_round8<Q>(v0, v1);
        }
        if (Q)
            st8[i] = s8;
        uint4 *d = xsp + ((size_t)st * C + P * j) * 4 + tq;
        d[0] = hi;
        if (P == 3 && 3 * j + 1 < C)
            d[4] = mid;
        if (P == 3 && 3 * j + 2 < C)
            d[8] = lo;
    }
    if (Q) { /* each group's sum: its 8-value sums in order */
        __syncthreads();
        for (int gi = threadIdx.x; gi < nbs * 32 / G; gi += NTH) {
            float sum = 0.0f;
            if (tok)
                for (int k = 0; k < G / 8; k++)
                    sum = __fadd_rn(sum, st8[gi * (G / 8) + k]);
            float *o = xsum + (size_t)(sa * 32 / G + gi) * C + P * j;
            o[0] = sum;
            if (P == 3 && 3 * j + 1 < C)
                o[1] = 0.0f;
            if (P == 3 && 3 * j + 2 < C)
                o[2] = 0.0f;
        }
    }
}

template <int NT, int U, bool Q, int P>
__global__ void __launch_bounds__(TC_WARPS *WARP, NT == 1 && U <= 4 ? 3 : 2)
    gemv_tc_kernel(const tcu_gemv_args a, int KS, int psteps, int staged)
{
    namespace cg = cooperative_groups;
    constexpr int C = 8 * NT, TP = TC_TPP(NT, P), JS = (C + P - 1) / P, NTH = TC_WARPS * WARP;
    constexpr bool EARLY = !Q && NT > 1 && NT < 16; /* 16 n-tiles: no registers to spare */
    extern __shared__ __align__(16) unsigned char tc_smem[];
    uint4 *xs = reinterpret_cast<uint4 *>(tc_smem); /* [psteps][C][4]: 8 bf16 of one column */
    float *red = reinterpret_cast<float *>(tc_smem); /* after the pass: [TC_ROWS][C] */
    /* 4-bit: each group's activation sum per column (hi parts; 0 elsewhere),
     * from the sums of 8 staged values [8-blocks of the panel][token slots] */
    float *xsum = reinterpret_cast<float *>(tc_smem + (size_t)psteps * C * 64); /* [groups][C] */
    float *xs8 = xsum + (size_t)psteps * C;
    constexpr int SBY = Q ? 16 : 64; /* weight bytes a row and 32-input step */
    const int G = Q ? a.m[0].group : 32;
    __shared__ float rn[TP];
    __shared__ double nsum[TC_WARPS][4];
    cg::cluster_group cl = cg::this_cluster();
    const int ks = (int)cl.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool glu = a.glu != 0;
    const long rows = gv_out_rows(a, glu);
    const int orows = glu ? TC_ROWS / 2 : TC_ROWS;
    const long o0 = (long)blockIdx.y * orows;
    const int nsteps = a.n_in / 32 / KS, s0 = ks * nsteps;
    /* the lane's two weight rows (g, g + 8 of the warp's tile) */
    const char *rp[2];
    const float *sbp[2] = {nullptr, nullptr};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        long gr = o0 + (glu ? warp & 3 : warp) * 16 + g + 8 * h;
        if (gr >= rows)
            gr = rows - 1;
        long off = 0;
        const int k = glu ? warp >> 2 : gv_mat_of(a, gr, &off);
        if (Q) {
            rp[h] = (const char *)a.m[k].w + (size_t)(gr - off) * (a.n_in / 2) + (size_t)s0 * 16 + 4 * t;
            sbp[h] = a.m[k].sb + (size_t)(gr - off) * (a.n_in / G) * 2;
        } else {
            rp[h] = (const char *)a.m[k].w + ((size_t)(gr - off) * a.n_in + (size_t)s0 * 32) * 2 + 16 * t;
        }
    }
    const int nb = (nsteps + U - 1) / U, np = a.T < TP ? a.T : TP;
    /* weights never depend on an earlier kernel: the first steps into L2
     * (not registers: the norm and the staging need them) */
#pragma unroll
    for (int u = 0; u < 2 * U; u++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (u < nsteps)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[h] + SBY * u));
    pdl_wait();
    pdl_trigger();
    if (a.norm_g && !staged) /* per token: a thread's elements, the warp's butterfly, the warps in order */
        for (int j0 = 0; j0 < np; j0 += 4) {
            double ss[4];
            const float *xr[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                ss[j] = 0.0;
                xr[j] = a.x + (size_t)(j0 + j < np ? (a.norm_rows ? a.norm_rows[j0 + j] : j0 + j) : 0) * a.n_in;
            }
            for (int e = threadIdx.x * 4; e < a.n_in; e += NTH * 4) {
                float4 v[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + j < np)
                        v[j] = __ldg(reinterpret_cast<const float4 *>(xr[j] + e));
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + j < np)
                        ss[j] = __dadd_rn(ss[j], tc_sq4(v[j]));
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
                if (lane == 0)
                    nsum[warp][j] = ss[j];
            }
            __syncthreads();
            if (threadIdx.x < 4 && j0 + (int)threadIdx.x < np) {
                double s = 0.0;
                for (int k = 0; k < TC_WARPS; k++)
                    s += nsum[k][threadIdx.x];
                rn[j0 + threadIdx.x] = (float)(1.0 / sqrt(s / a.n_in + a.norm_eps));
            }
            __syncthreads();
        }
    /* bf16: 8 weights a row and step; 4-bit: 8 codes, and the step's
     * group's 16 scale and bias - 16 scale (w = 16 s (1 + q / 16) + b - 16 s) */
    uint4 w[Q ? 1 : U][2];
    uint32_t wq[Q ? U : 1][2];
    float2 sv[Q ? U : 1][2];
    auto load = [&](int j0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (Q) {
                    wq[u][h] = j < nsteps ? tc_ld32(reinterpret_cast<const uint32_t *>(rp[h] + SBY * j)) : 0u;
                    const float2 p = j < nsteps ? __ldg(reinterpret_cast<const float2 *>(sbp[h]) + (s0 + j) * 32 / G)
                                                : make_float2(0.0f, 0.0f);
                    sv[u][h] = make_float2(16.0f * p.x, __fsub_rn(p.y, 16.0f * p.x));
                } else {
                    w[u][h] = j < nsteps ? tc_ld(reinterpret_cast<const uint4 *>(rp[h] + SBY * j))
                                         : make_uint4(0, 0, 0, 0);
                }
            }
        }
    };
    load(0);
    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const int st0 = b * U, pst = st0 % psteps; /* step of the slice, of the panel */
        if (pst == 0 && staged) { /* the panel as tc_stage_kernel split it: a copy */
            __syncthreads();
            const int pn = nsteps - st0 < psteps ? nsteps - st0 : psteps;
            const uint4 *src = reinterpret_cast<const uint4 *>(a.stage) + (size_t)(s0 + st0) * C * 4;
            for (int i = threadIdx.x; i < pn * C * 4; i += NTH)
                cp_async16(xs + i, src + i, 16);
            asm volatile("cp.async.commit_group;" ::: "memory");
            if (Q) {
                const float *gs = reinterpret_cast<const float *>(reinterpret_cast<const uint4 *>(a.stage) +
                                                                  (size_t)(a.n_in / 32) * C * 4) +
                                  (size_t)((s0 + st0) * 32 / G) * C;
                for (int i = threadIdx.x; i < pn * 32 / G * C; i += NTH)
                    xsum[i] = __ldg(gs + i);
            }
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncthreads();
        } else if (pst == 0) { /* stage the panel: steps st0 .. st0 + psteps - 1, SB items a thread at once */
            constexpr int SB = NT == 1 ? 1 : 2;
            __syncthreads();
            const int pn = nsteps - st0 < psteps ? nsteps - st0 : psteps, items = pn * JS * 4;
            for (int i0 = threadIdx.x; i0 < items; i0 += SB * NTH) {
                float4 v[SB][2];
#pragma unroll
                for (int q = 0; q < SB; q++) {
                    const int i = i0 + q * NTH, st = i / (JS * 4), j = (i / 4) % JS, tq = i % 4;
                    if (i < items && j < np) {
                        const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[j] : (size_t)j;
                        const float4 *xp =
                            reinterpret_cast<const float4 *>(a.x + xrow * a.n_in + (s0 + st0 + st) * 32 + 8 * tq);
                        v[q][0] = __ldg(xp);
                        v[q][1] = __ldg(xp + 1);
                    }
                }
#pragma unroll
                for (int q = 0; q < SB; q++) {
                    const int i = i0 + q * NTH, st = i / (JS * 4), j = (i / 4) % JS, tq = i % 4;
                    if (i >= items)
                        break;
                    uint4 hi = make_uint4(0, 0, 0, 0), mid = hi, lo = hi;
                    if (j < np) {
                        float4 v0 = v[q][0], v1 = v[q][1];
                        if (a.norm_g) {
                            const int e = (s0 + st0 + st) * 32 + 8 * tq;
                            const float r = rn[j];
                            const float4 g0 = __ldg(reinterpret_cast<const float4 *>(a.norm_g + e)),
                                         g1 = __ldg(reinterpret_cast<const float4 *>(a.norm_g + e) + 1);
                            v0 = norm4(v0, r, g0);
                            v1 = norm4(v1, r, g1);
                        }
                        if (Q) /* the 8 values' sum, in order */
                            xs8[(st * 4 + tq) * JS + j] =
                                P == 3 ? tc_sum8(v0, v1) : tc_sum8(tc_r4(v0), tc_r4(v1));
                        if (P == 3)
                            tc_split8<Q>(v0, v1, hi, mid, lo);
                        else
                            hi = tc_round8<Q>(v0, v1);
                    }
                    uint4 *d = xs + ((size_t)st * C + P * j) * 4 + tq;
                    d[0] = hi; /* columns past the tokens: zeros */
                    if (P == 3 && 3 * j + 1 < C)
                        d[4] = mid;
                    if (P == 3 && 3 * j + 2 < C)
                        d[8] = lo;
                }
            }
            if (Q) { /* each group's activation sum: its 8-value sums in order (hi columns) */
                __syncthreads();
                for (int i = threadIdx.x; i < pn * 32 / G * C; i += NTH) {
                    const int gl = i / C, col = i % C, j = col / P;
                    float sum = 0.0f;
                    if (col % P == 0 && j < np)
                        for (int k = 0; k < G / 8; k++)
                            sum = __fadd_rn(sum, xs8[(gl * (G / 8) + k) * JS + j]);
                    xsum[i] = sum;
                }
            }
            __syncthreads();
        }
        /* bf16 above TC_TP(1) tokens (registers to spare): this pass's
         * weights leave the load registers and the next pass's loads go out
         * before its products (T = 32: 8B gate/up 139 -> 127 us, down 126
         * -> 109; where registers are short - T <= 2 with 8 steps in
         * flight, 4-bit - the copies spill) */
        uint4 wc[Q ? 1 : U][2]; /* unused (optimized out) unless EARLY */
        if constexpr (EARLY) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    wc[u][h] = w[u][h];
            if (b + 1 < nb)
                load((b + 1) * U);
        }
        const uint4(&wr)[Q ? 1 : U][2] = EARLY ? wc : w;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (st0 + u >= nsteps)
                break;
            const uint4 *xp = xs + ((size_t)(pst + u) * C + g) * 4 + t;
            if constexpr (Q) {
                /* codes as bf16 1 + q / 16 (exact): pairs (i, i + 4) of the 8 */
                uint32_t A[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t q = wq[u][h], M = 0x00780078u, O = 0x3F803F80u;
                    A[h][0] = ((q << 3) & M) | O;
                    A[h][1] = ((q >> 1) & M) | O;
                    A[h][2] = ((q >> 5) & M) | O;
                    A[h][3] = ((q >> 9) & M) | O;
                }
                const bool gend = (s0 + st0 + u + 1) * 32 % G == 0;
                const float *xg = xsum + (size_t)((pst + u) * 32 / G) * C + 2 * t;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xv = xp[32 * n];
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16(d, A[0][0], A[1][0], A[0][1], A[1][1], xv.x, xv.y);
                    mma_bf16(d, A[0][2], A[1][2], A[0][3], A[1][3], xv.z, xv.w);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        c[n][e] = fmaf(sv[u][e >> 1].x, d[e], c[n][e]);
                    if (gend) /* the group's bias term, once (hi columns) */
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            c[n][e] = fmaf(sv[u][e >> 1].y, xg[8 * n + (e & 1)], c[n][e]);
                }
            } else if (P == 1) { /* one part: the mma accumulates the slice */
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xv = xp[32 * n];
                    mma_bf16(c[n], wr[u][0].x, wr[u][1].x, wr[u][0].y, wr[u][1].y, xv.x, xv.y);
                    mma_bf16(c[n], wr[u][0].z, wr[u][1].z, wr[u][0].w, wr[u][1].w, xv.z, xv.w);
                }
            } else {
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xv = xp[32 * n];
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16(d, wr[u][0].x, wr[u][1].x, wr[u][0].y, wr[u][1].y, xv.x, xv.y);
                    mma_bf16(d, wr[u][0].z, wr[u][1].z, wr[u][0].w, wr[u][1].w, xv.z, xv.w);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        c[n][e] = __fadd_rn(c[n][e], d[e]);
                }
            }
        }
        if (!EARLY && b + 1 < nb)
            load((b + 1) * U);
    }
    /* the block's sums by row and column, then the cluster's reduction */
    __syncthreads();
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(size_t)(warp * 16 + g + 8 * (e >> 1)) * C + 8 * n + 2 * t + (e & 1)] = c[n][e];
    cl.sync();
    const int per = orows / KS;
    for (int i = threadIdx.x; i < per * np; i += NTH) {
        const int r = ks * per + i / np, j = i % np;
        const long gr = o0 + r;
        if (gr >= rows)
            continue;
        float v[2];
#pragma unroll
        for (int s = 0; s < 2; s++) {
            if (s && !glu)
                break;
            for (int k = 0; k < KS; k++) {
                const float *q = cl.map_shared_rank(red, k) + (size_t)(r + s * orows) * C + P * j;
                const float part = P == 3 ? __fadd_rn(__fadd_rn(q[0], q[1]), q[2]) : q[0];
                v[s] = k ? __fadd_rn(v[s], part) : part;
            }
        }
        if (glu) {
            a.m[0].y[(size_t)j * a.m[0].n_out + gr] = (a.glu == 2 ? gelu_f(v[0]) : silu_f(v[0])) * v[1];
        } else {
            long off;
            const int k = gv_mat_of(a, gr, &off);
            float *y = a.m[k].y + (size_t)j * a.m[k].n_out + (gr - off);
            *y = a.accumulate ? *y + v[0] : v[0];
        }
    }
    cl.sync(); /* the others have read this block's sums */
}

// Cluster size (split-K) from the shape alone: slices of >= 256 inputs,
// up to 8 blocks, until about 8 warps per SM (16 measured slower on the
// 8B q/k/v: 26 against 20 us at T = 1 - more blocks, each with its staging
// and its share of the reduction), and only while every cluster of the
// launch can be resident at once in the largest configuration (32
// tokens: two blocks a SM) - else a second wave of a few clusters doubles
// the time (8B o at 8 tokens 27 -> 20 us with 4 blocks a cluster instead
// of 8: the 32 clusters of 8 did not fit).
template <bool Q> static int tc_max_clusters(int ks)
{
    static int n_max[9];
    if (!n_max[ks]) {
        const size_t smem = TC_SMEM_X + (Q ? (size_t)(TC_SMEM_X / (96 * 64)) * (96 + 4 * 32) * sizeof(float) : 0);
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = (unsigned)ks;
        at.val.clusterDim.y = at.val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)ks, 1024);
        cfg.blockDim = dim3(TC_WARPS * WARP);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaFuncSetAttribute(gemv_tc_kernel<12, 2, Q, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) ||
            cudaOccupancyMaxActiveClusters(&n, gemv_tc_kernel<12, 2, Q, 3>, &cfg) || n <= 0) {
            (void)cudaGetLastError();
            n = 1 << 30; /* unknown: no limit */
        }
        n_max[ks] = n;
    }
    return n_max[ks];
}

template <bool Q> static int tc_ks(int n_in, long blocks, int group)
{
    int ks = 1;
    while (ks < 8 && blocks * TC_WARPS * ks < 8L * sm_count() && n_in % (64 * ks) == 0 && n_in / (2 * ks) >= 256 &&
           n_in / (2 * ks) % group == 0 && blocks <= tc_max_clusters<Q>(2 * ks))
        ks *= 2;
    return ks;
}

// Bytes of tcu_gemv_args.stage that tc_stage_kernel writes for C columns.
static size_t tc_stage_bytes(const tcu_gemv_args *a, int C, bool q)
{
    return (size_t)(a->n_in / 32) * C * 64 + (q ? (size_t)(a->n_in / a->m[0].group) * C * sizeof(float) : 0);
}

template <int NT, int U, bool Q, int P>
static int gemv_tc_launch(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    constexpr int C = 8 * NT, JS = (C + P - 1) / P;
    /* more than two tokens and room in the stage: split (round) once - with
     * a fused norm (each block would read every token's whole row for its
     * factor) or above 8 tokens; without a norm at 3-8 tokens each block's
     * own split of its slice costs less than the extra launch (1B 4-bit o
     * and down) */
    const int staged = (P == 3 ? NT > 1 : a->T > 2) && a->stage && a->stage_bytes >= tc_stage_bytes(a, C, Q) &&
                       (a->norm_g || TC_TPP(NT, P) > 8);
    if (staged) {
        const int G = Q ? a->m[0].group : 32, nst = a->n_in / 32;
        int nb = 1; /* blocks along the inputs: about two a SM, whole groups each */
        while (nb < 16 && (long)JS * nb < 2L * sm_count() && nst % (2 * nb) == 0 && nst / (2 * nb) * 32 % G == 0)
            nb *= 2;
        const int rc = launch_pdl(pdl, tc_stage_kernel<NT, Q, P>, dim3((unsigned)JS, (unsigned)nb),
                                  dim3(TC_WARPS * WARP), (size_t)(nst / nb) * 4 * sizeof(float), s, *a, nst / nb);
        if (rc)
            return rc;
    }
    const int G = Q ? a->m[0].group : 32, gm = U > G / 32 ? U : G / 32; /* panels: whole groups, whole batches */
    const long blocks = (rows + (a->glu ? TC_ROWS / 2 : TC_ROWS) - 1) / (a->glu ? TC_ROWS / 2 : TC_ROWS);
    const int ks = tc_ks<Q>(a->n_in, blocks, G), nsteps = a->n_in / 32 / ks;
    /* 4-bit, one part a token (4 JS 8-value sums a step): the sums' room
     * out of the panel's, so that two blocks fit a SM */
    int psteps = TC_SMEM_X / (C * 64 + (Q && P == 1 ? (C + 4 * JS) * (int)sizeof(float) : 0));
    psteps = nsteps <= psteps ? nsteps : psteps / gm * gm;
    size_t smem = (size_t)psteps * C * 64 + (Q ? (size_t)psteps * (C + 4 * JS) * sizeof(float) : 0);
    if (smem < (size_t)TC_ROWS * C * sizeof(float))
        smem = (size_t)TC_ROWS * C * sizeof(float);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        int rc = (int)cudaFuncSetAttribute(gemv_tc_kernel<NT, U, Q, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
        if (rc)
            return rc;
        smem_set = smem;
    }
    return launch_cl(pdl && Q, (unsigned)ks, gemv_tc_kernel<NT, U, Q, P>, dim3((unsigned)ks, (unsigned)blocks),
                     dim3(TC_WARPS * WARP), smem, s, *a, ks, psteps, staged);
}

// The throughput mode's kernels (P = 1) by T: n-tiles for up to 8, 16, 32,
// 64 or 128 tokens (U: loads in flight, never the order of sums).
static int gemv_tc1(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl, bool q)
{
    if (q) {
        if (a->T <= 8)
            return gemv_tc_launch<1, 8, true, 1>(a, rows, s, pdl);
        if (a->T <= 16)
            return gemv_tc_launch<2, 8, true, 1>(a, rows, s, pdl);
        if (a->T <= 32)
            return gemv_tc_launch<4, 4, true, 1>(a, rows, s, pdl);
        if (a->T <= 64)
            return gemv_tc_launch<8, 4, true, 1>(a, rows, s, pdl);
        return gemv_tc_launch<16, 2, true, 1>(a, rows, s, pdl);
    }
    if (a->T <= 8)
        return rows >= 200L * sm_count() ? gemv_tc_launch<1, 8, false, 1>(a, rows, s, pdl)
                                         : gemv_tc_launch<1, 4, false, 1>(a, rows, s, pdl);
    if (a->T <= 16)
        return gemv_tc_launch<2, 4, false, 1>(a, rows, s, pdl);
    if (a->T <= 32)
        return gemv_tc_launch<4, 4, false, 1>(a, rows, s, pdl);
    if (a->T <= 64)
        return gemv_tc_launch<8, 2, false, 1>(a, rows, s, pdl);
    return gemv_tc_launch<16, 2, false, 1>(a, rows, s, pdl);
}

// bf16, or 4-bit with groups of a multiple of 32 inputs (the same for
// every matrix); -1 for other kinds. Above 32 tokens (exact) or 128
// (throughput): launches of that many.
int gemv_tc(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl, bool exact)
{
    const bool q = a->m[0].kind == TCU_Q4;
    if ((a->m[0].kind != TCU_BF16 && !q) || a->n_in % 32 || (q && (a->m[0].group % 32 || a->n_in % a->m[0].group)))
        return -1;
    for (int k = 1; q && k < a->n; k++)
        if (a->m[k].group != a->m[0].group)
            return -1;
    const int tmax = exact ? TC_TP(12) : TC_MAX_T1;
    if (a->T > tmax) { /* launches of tmax tokens (a token's bits do not change) */
        for (int t0 = 0; t0 < a->T; t0 += tmax) {
            tcu_gemv_args b = *a;
            b.T = a->T - t0 < tmax ? a->T - t0 : tmax;
            if (a->norm_g && a->norm_rows)
                b.norm_rows = a->norm_rows + t0;
            else
                b.x = a->x + (size_t)t0 * a->n_in;
            for (int k = 0; k < a->n; k++)
                b.m[k].y = a->m[k].y + (size_t)t0 * a->m[k].n_out;
            const int rc = gemv_tc(&b, rows, s, pdl, exact);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!exact)
        return gemv_tc1(a, rows, s, pdl, q);
    /* U (loads in flight) never changes the order of sums: by shape and T.
     * 8 steps on the launches of many blocks (lm_head: 3 blocks a SM do
     * not hide the latency), else 4 (3 blocks a SM) */
    if (q) { /* a step is 256 bytes a warp: more of them in flight */
        if (a->T <= TC_TP(1))
            return gemv_tc_launch<1, 8, true, 3>(a, rows, s, pdl);
        if (a->T <= TC_TP(3))
            return gemv_tc_launch<3, 8, true, 3>(a, rows, s, pdl);
        if (a->T <= TC_TP(6))
            return gemv_tc_launch<6, 4, true, 3>(a, rows, s, pdl);
        return gemv_tc_launch<12, 2, true, 3>(a, rows, s, pdl);
    }
    if (a->T <= TC_TP(1))
        return rows >= 200L * sm_count() ? gemv_tc_launch<1, 8, false, 3>(a, rows, s, pdl)
                                         : gemv_tc_launch<1, 4, false, 3>(a, rows, s, pdl);
    if (a->T <= TC_TP(3))
        return gemv_tc_launch<3, 4, false, 3>(a, rows, s, pdl);
    if (a->T <= TC_TP(6))
        return gemv_tc_launch<6, 2, false, 3>(a, rows, s, pdl);
    return gemv_tc_launch<12, 2, false, 3>(a, rows, s, pdl);
}
