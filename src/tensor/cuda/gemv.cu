// GEMV kernels on CUDA cores for every weight kind (TCU_GEMV_PLAIN, and
// the shared-memory kernel behind TCU_GEMV_STAGED and BY_SHAPE) and the
// dispatch (tcu_gemv) by tcu_opts. The tensor-core kernel lives in
// gemv_tc.cu, the shared-memory weight ring in gemv_ring.cu.
#include "tensor/cuda/gemv.cuh"

#define GEMV_WARPS 8 /* rows per block */
#define GEMV_TT 8    /* tokens per register tile */
#define GEMV_U 4     /* 16-byte loads in flight per lane */

/* With PDL, the shared-memory GEMV's blocks of 4/8-bit weights request
 * their first weight chunks before waiting for the previous kernel; those
 * of 16-bit weights wait first (their activations' copies queued behind
 * the early requests and lost more than those gained - docs/cuda.md),
 * unless the launch asks for it (tcu_gemv_args.early). */

template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4 &raw, const float *__restrict__ x, float scale, float bias)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (KIND == TCU_F32) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(x));
        /* explicit fmas: the same rounding in every instantiation */
        float s = __uint_as_float(w[0]) * a.x;
        s = fmaf(__uint_as_float(w[1]), a.y, s);
        s = fmaf(__uint_as_float(w[2]), a.z, s);
        return fmaf(__uint_as_float(w[3]), a.w, s);
    } else if constexpr (KIND == TCU_BF16 || KIND == TCU_F16) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(x)), b = __ldg(reinterpret_cast<const float4 *>(x) + 1);
        float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t h = (w[j >> 1] >> ((j & 1) * 16)) & 0xffffu;
            s = fmaf(KIND == TCU_BF16 ? bf16f(h) : f16f(h), xs[j], s);
        }
        return s;
    } else {
        constexpr int BITS = KIND == TCU_Q4 ? 4 : 8, PER = 32 / BITS, NV = chunk_traits<KIND>::NV;
        float sq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int v4 = 0; v4 < NV / 4; v4++) {
            float4 a = __ldg(reinterpret_cast<const float4 *>(x) + v4);
            float xs[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int e = v4 * 4 + j;
                float q = (float)((w[e / PER] >> ((e % PER) * BITS)) & ((1u << BITS) - 1));
                sq = fmaf(q, xs[j], sq);
                sx += xs[j];
            }
        }
        return fmaf(scale, sq, bias * sx);
    }
}

// acc[tt] = dot(row, x[t0 + tt]) for tt < nt (reduced over the warp).
template <int KIND, int TT>
__device__ __forceinline__ void row_dot(const uint4 *__restrict__ row, const float *__restrict__ sbrow, int group,
                                        int nch, const float *__restrict__ x, int n_in, int t0, int nt, float acc[TT],
                                        int lane)
{
    constexpr int NV = chunk_traits<KIND>::NV;
    constexpr bool Q = KIND == TCU_Q4 || KIND == TCU_Q8;
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        acc[tt] = 0.0f;
    constexpr int U = TT == 1 ? 2 * GEMV_U : GEMV_U; /* loads in flight per lane */
    for (int c0 = lane; c0 < nch; c0 += WARP * U) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * WARP;
            raw[u] = c < nch ? (TT == 1 ? __ldcs(row + c) : __ldg(row + c)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * WARP;
            if (c >= nch)
                break;
            float scale = 0.0f, bias = 0.0f;
            if constexpr (Q) {
                int g = c * NV / group;
                float2 p = __ldg(reinterpret_cast<const float2 *>(sbrow) + g);
                scale = p.x;
                bias = p.y;
            }
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt < nt)
                    acc[tt] += chunk_dot<KIND>(raw[u], x + (size_t)(t0 + tt) * n_in + (size_t)c * NV, scale, bias);
        }
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        acc[tt] = warp_sum(acc[tt]);
}

template <int KIND> __device__ __forceinline__ size_t row_bytes(int n_in)
{
    if constexpr (KIND == TCU_Q4 || KIND == TCU_Q4F)
        return (size_t)n_in / 2;
    else if constexpr (KIND == TCU_Q8 || KIND == TCU_F8)
        return (size_t)n_in;
    else if constexpr (KIND == TCU_F32)
        return (size_t)n_in * 4;
    else
        return (size_t)n_in * 2;
}

template <int KIND, int TT> __global__ void __launch_bounds__(GEMV_WARPS *WARP) gemv_kernel(const tcu_gemv_args a)
{
    pdl_wait();
    pdl_trigger();
    constexpr int NV = chunk_traits<KIND>::NV;
    int lane = threadIdx.x & 31;
    long gr = (long)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int nch = a.n_in / NV;
    if (a.glu) {
        if (gr >= a.m[0].n_out)
            return;
        int r = (int)gr, ng = a.n_in / (a.m[0].group ? a.m[0].group : 1);
        const uint4 *rg = reinterpret_cast<const uint4 *>((const char *)a.m[0].w + (size_t)r * row_bytes<KIND>(a.n_in));
        const uint4 *ru = reinterpret_cast<const uint4 *>((const char *)a.m[1].w + (size_t)r * row_bytes<KIND>(a.n_in));
        const float *sg = a.m[0].sb ? a.m[0].sb + (size_t)r * ng * 2 : nullptr;
        const float *su = a.m[1].sb ? a.m[1].sb + (size_t)r * ng * 2 : nullptr;
        for (int t0 = 0; t0 < a.T; t0 += TT) {
            int nt = a.T - t0 < TT ? a.T - t0 : TT;
            float ag[TT], au[TT];
            row_dot<KIND, TT>(rg, sg, a.m[0].group, nch, a.x, a.n_in, t0, nt, ag, lane);
            row_dot<KIND, TT>(ru, su, a.m[1].group, nch, a.x, a.n_in, t0, nt, au, lane);
            if (lane < nt) {
                float g = 0.0f, u = 0.0f;
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
                    if (tt == lane) {
                        g = ag[tt];
                        u = au[tt];
                    }
                a.m[0].y[(size_t)(t0 + lane) * a.m[0].n_out + r] = (a.glu == 2 ? gelu_f(g) : silu_f(g)) * u;
            }
        }
        return;
    }
    int k = 0;
    long off = 0;
    while (k < a.n && gr >= off + a.m[k].n_out) {
        off += a.m[k].n_out;
        k++;
    }
    if (k >= a.n)
        return;
    const tcu_mat &m = a.m[k];
    int r = (int)(gr - off), ng = a.n_in / (m.group ? m.group : 1);
    const uint4 *row = reinterpret_cast<const uint4 *>((const char *)m.w + (size_t)r * row_bytes<KIND>(a.n_in));
    const float *sb = m.sb ? m.sb + (size_t)r * ng * 2 : nullptr;
    for (int t0 = 0; t0 < a.T; t0 += TT) {
        int nt = a.T - t0 < TT ? a.T - t0 : TT;
        float acc[TT];
        row_dot<KIND, TT>(row, sb, m.group, nch, a.x, a.n_in, t0, nt, acc, lane);
        if (lane < nt) {
            float v = 0.0f;
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt == lane)
                    v = acc[tt];
            float *y = m.y + (size_t)(t0 + lane) * m.n_out + r;
            *y = a.accumulate ? *y + v : v;
        }
    }
}

static int gemv_plain(const tcu_gemv_args *a, bool pdl, tcu_stream stream)
{
    const long rows = gv_out_rows(*a, a->glu != 0);
    if (rows == 0 || a->T == 0)
        return 0;
    dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * WARP);
    cudaStream_t s = (cudaStream_t)stream;
    int rc = 0;
    /* T = 1 (decode) gets a one-token tile: fewer registers, more rows in
     * flight. Either tile computes each (row, token) in the same order. */
#define GEMV_CASE(K)                                                                                                   \
    case K:                                                                                                            \
        if (a->T == 1)                                                                                                 \
            rc = launch_pdl(pdl && kind_quantized(K), gemv_kernel<K, 1>, grid, block, 0, s, *a);                       \
        else                                                                                                           \
            rc = launch_pdl(pdl && kind_quantized(K), gemv_kernel<K, GEMV_TT>, grid, block, 0, s, *a);                 \
        break;
    switch (a->m[0].kind) {
        GEMV_CASE(TCU_F32)
        GEMV_CASE(TCU_BF16)
        GEMV_CASE(TCU_F16)
        GEMV_CASE(TCU_Q4)
        GEMV_CASE(TCU_Q8)
    default: return (int)cudaErrorInvalidValue;
    }
#undef GEMV_CASE
    return rc;
}

// ---- the shared-memory kernel (TCU_GEMV_STAGED, TCU_GEMV_BY_SHAPE) ----
//
// One templated kernel (the alternatives measured and dropped - more
// warps a row, activations from global memory, more loads in flight - are
// in docs/cuda-log.md; S = 1, XS and UM = 1 are all the dispatch
// instantiates):
//   R  output rows per warp (the activation chunk is loaded once and used
//      for all R rows; GLU launches stream gate and up rows, 2R streams);
//   S  warps per row (split-K: lane L = warp_in_group * 32 + lane of the S
//      warps owns chunks c = L, L + 32S, ...; warp sums meet in shared
//      memory and are added in warp order);
//   XS the block stages the activations in shared memory (panels of at
//      most GV_SMEM bytes), XOR-swizzled per 16-byte piece so that the
//      lanes of a quarter-warp hit distinct banks.
// When one panel holds the tile's activations (T = 1 always, up to a few
// tokens), they arrive by cp.async - issued first, ahead of everything -
// and each warp's first weight chunks are loaded into registers before the
// block waits for them: the norm and the staging no longer hold the weight
// stream back (a prologue that waited for x twice, for the norm's sums and
// again for the staging, cost 4-13 us of a 12-70 us launch on the 8B
// shapes). The norm is then taken from shared memory with the same sums
// and products as the panel path, so both give the same bits.
// Each (row, token) is summed in one order fixed by (R's kernel, n_in): per
// lane the chunks it owns in increasing order, each chunk's values in
// order, then the butterfly over the warp and the S warps in order. Tiles,
// panels and the unroll depth only change when loads are issued, so a row
// never depends on T. Quantized chunks convert codes with the 2^23
// magic-number trick (exact for 0..255, no int-to-float instruction) and
// share the chunk's activation sum between the R rows.

#define GV_WARPS 8
#define GV_SMEM (96 * 1024)
#define GV_SMEM_G (64 * 1024) /* the norm weights of the one-panel path */


/* blocks per SM the registers must allow at T = 1: three for 16-bit
 * weights (a q/k/v launch of the 8B shape is then one wave), two for
 * quantized ones */
template <int KIND, int TT> constexpr int gv_min_blocks()
{
    return TT > 1 ? 1 : KIND == TCU_BF16 || KIND == TCU_F16 ? 3 : 2;
}

// ONE: 0 = activations staged panel by panel (the norm factor read from
// global memory first); 1 = the one-panel path, x's copies issued first,
// then the first weight chunks; 2 = the same with the weights issued before
// waiting for the previous kernel (launched with PDL). A compile-time
// choice: as a runtime flag it cost 10-20% on the 8B shapes (the first
// loop iteration could not be peeled around the preloaded chunks).
template <int KIND, int TT, int R, int S, bool XS, bool GLU, int UM, int ONE>
__global__ void __launch_bounds__(GV_WARPS *WARP, gv_min_blocks<KIND, TT>())
    gemv_v_kernel(const tcu_gemv_args a, int pvals)
{
    constexpr bool one = ONE != 0;
    constexpr int NV = chunk_traits<KIND>::NV;
    constexpr bool Q = KIND == TCU_Q4 || KIND == TCU_Q8 || KIND == TCU_Q4F || KIND == TCU_F8; /* scales a chunk */
    constexpr bool QB = Q && KIND != TCU_F8; /* and biases: the chunk's activation sum */
    constexpr int NS = GLU ? 2 * R : R;                        /* weight rows streamed per warp */
    constexpr int UT = (TT == 1 ? 8 * UM : 4) / NS, U = UT < 1 ? 1 : UT; /* chunks in flight per stream */
    constexpr int LS = WARP * S;
    constexpr bool PIPE = TT == 1 && U % 2 == 0 && (KIND == TCU_BF16 || KIND == TCU_F16);
    extern __shared__ float4 xs4[];
    float *xs = reinterpret_cast<float *>(xs4);
    __shared__ float red[GV_WARPS][NS][TT];
    __shared__ float rnorm[TT];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp / S, ws = warp % S;
    const int L = ws * WARP + lane, nch = a.n_in / NV;
    const long rows = gv_out_rows(a, GLU);
    const long base = ((long)blockIdx.x * (GV_WARPS / S) + grp) * R;

    const uint4 *rp[NS];
    const float2 *sbp[NS];
    int gsz[NS];
    float *yp[R];
    int ystride[R];
    bool valid[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        long gr = base + i;
        valid[i] = gr < rows;
        if (!valid[i])
            gr = rows - 1; /* clamped: computed, never stored */
        long off = 0;
        const int k = GLU ? 0 : gv_mat_of(a, gr, &off);
        const tcu_mat &m = a.m[k];
        int r = (int)(gr - off);
        yp[i] = m.y + r;
        ystride[i] = m.n_out;
#pragma unroll
        for (int h = 0; h < (GLU ? 2 : 1); h++) {
            const tcu_mat &mh = a.m[GLU ? h : k];
            const int g = mh.group ? mh.group : NV;
            rp[h * R + i] = reinterpret_cast<const uint4 *>((const char *)mh.w + (size_t)r * row_bytes<KIND>(a.n_in));
            sbp[h * R + i] = mh.sb ? reinterpret_cast<const float2 *>(mh.sb) + (size_t)r * ((a.n_in + g - 1) / g) : nullptr;
            gsz[h * R + i] = g;
        }
    }

    /* one panel (XS only): tile t0's rows to shared memory, no registers */
    float *gs = xs + (size_t)(a.T < TT ? a.T : TT) * pvals; /* norm weights */
    auto stage_async = [&](int t0, int nt) {
        const int nv4 = a.n_in / 4;
        for (int idx = threadIdx.x; idx < nt * nv4; idx += blockDim.x) {
            int tt = idx / nv4, v = (idx - tt * nv4) * 4, cc = v / NV, p = (v % NV) / 4;
            const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[t0 + tt] : (size_t)(t0 + tt);
            cp_async16(xs + tt * pvals + cc * NV + ((p ^ gv_swz<NV>(cc)) * 4), a.x + xrow * a.n_in + v, 16);
        }
    };
    /* the chunks in flight and their scale/bias pairs (quantized kinds);
     * the one-panel path loads the first ones ahead of the loop */
    uint4 raw[U][NS];
    float2 sbr[U][NS];
    if constexpr (!one) {
        /* weights never depend on an earlier kernel: start pulling this
         * lane's first chunks into L2 before waiting for the inputs */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < NS; s++)
                if (L + u * LS < nch)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[s] + L + u * LS));
    }
    auto hoist = [&]() {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < NS; s++) {
                const int c = L + u * LS;
                raw[u][s] = c < nch ? (TT == 1 ? __ldcs(rp[s] + c) : __ldg(rp[s] + c)) : make_uint4(0, 0, 0, 0);
                if constexpr (Q)
                    sbr[u][s] = c < nch ? __ldg(sbp[s] + c * NV / gsz[s]) : make_float2(0.0f, 0.0f);
            }
    };
    if constexpr (ONE == 2)
        hoist();
    /* the norm weights (no kernel writes them) are copied before the wait,
     * in the same group as the activations */
    if (ONE == 1 && a.norm_g)
        for (int v = threadIdx.x * 4; v < a.n_in; v += blockDim.x * 4)
            cp_async16(gs + v, a.norm_g + v, 16);
    pdl_wait();
    pdl_trigger();
    if constexpr (one) {
        stage_async(0, a.T < TT ? a.T : TT);
        if (ONE == 2 && a.norm_g)
            for (int v = threadIdx.x * 4; v < a.n_in; v += blockDim.x * 4)
                cp_async16(gs + v, a.norm_g + v, 16);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if constexpr (ONE == 1)
            hoist();
    }
    bool pre = one;

    for (int t0 = 0; t0 < a.T; t0 += TT) {
        const int nt = a.T - t0 < TT ? a.T - t0 : TT;
        float acc[NS][TT];
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                acc[s][tt] = 0.0f;
        if constexpr (one) {
            if (t0 > 0) {
                __syncthreads(); /* every warp is done with the previous tile */
                stage_async(t0, nt);
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncthreads();
            if (a.norm_g) {
                /* the norm kernel's sums (the same 256 threads, double) and
                 * the panel path's products, in place */
                for (int tt = 0; tt < nt; tt++) {
                    float *xr = xs + tt * pvals;
                    const float r = gv_staged_rnorm<NV>(xr, a.n_in, a.norm_eps, threadIdx.x, blockDim.x,
                                                        [](double v) { return block_sum_d(v); });
                    for (int e = threadIdx.x; e < a.n_in; e += blockDim.x) {
                        const int q = gv_pos<NV>(e);
                        xr[q] = __fmul_rn(__fmul_rn(xr[q], r), gs[e]);
                    }
                }
                __syncthreads();
            }
        } else if (XS && a.norm_g) {
            gv_norm_factors(a, t0, nt, rnorm);
        }
        const int pch = XS ? pvals / NV : nch;
        for (int p0 = 0; p0 < nch; p0 += pch) {
            const int pend = p0 + pch < nch ? p0 + pch : nch;
            if constexpr (XS && !one) {
                __syncthreads();
                const int nv4 = (pend - p0) * NV / 4;
                for (int idx = threadIdx.x; idx < nt * nv4; idx += blockDim.x) {
                    int tt = idx / nv4, v = (idx - tt * nv4) * 4, cc = v / NV, p = (v % NV) / 4;
                    const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[t0 + tt] : (size_t)(t0 + tt);
                    float4 val = __ldg(reinterpret_cast<const float4 *>(a.x + xrow * a.n_in + (size_t)p0 * NV + v));
                    if (a.norm_g) {
                        const float r = rnorm[tt];
                        const float4 g = __ldg(reinterpret_cast<const float4 *>(a.norm_g + (size_t)p0 * NV + v));
                        val = norm4(val, r, g);
                    }
                    xs4[(tt * pvals + cc * NV + ((p ^ gv_swz<NV>(cc)) * 4)) / 4] = val;
                }
                __syncthreads();
            }
            /* the chunks and their scale/bias pairs load together: a pair
             * fetched after its chunk arrived was a second memory round
             * trip per step */
            auto fetch = [&](int u, int c) {
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    raw[u][s] = c < pend ? (TT == 1 ? __ldcs(rp[s] + c) : __ldg(rp[s] + c)) : make_uint4(0, 0, 0, 0);
                    if constexpr (Q)
                        sbr[u][s] = c < pend ? __ldg(sbp[s] + c * NV / gsz[s]) : make_float2(0.0f, 0.0f);
                }
            };
            auto use = [&](int u, int c) {
                float scale[NS], bias[NS];
#pragma unroll
                for (int s = 0; s < NS; s++) {
                    scale[s] = bias[s] = 0.0f;
                    if constexpr (Q) {
                        scale[s] = sbr[u][s].x;
                        bias[s] = sbr[u][s].y;
                    }
                }
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    if (tt >= nt)
                        break;
                    float xv[NV];
                    if constexpr (XS) {
                        const int cc = c - p0, sw = gv_swz<NV>(cc);
                        const float *xr = xs + tt * pvals + cc * NV;
#pragma unroll
                        for (int p = 0; p < NV / 4; p++) {
                            float4 v = *reinterpret_cast<const float4 *>(xr + ((p ^ sw) * 4));
                            xv[4 * p] = v.x;
                            xv[4 * p + 1] = v.y;
                            xv[4 * p + 2] = v.z;
                            xv[4 * p + 3] = v.w;
                        }
                    } else {
                        const float4 *xr =
                            reinterpret_cast<const float4 *>(a.x + (size_t)(t0 + tt) * a.n_in + (size_t)c * NV);
#pragma unroll
                        for (int p = 0; p < NV / 4; p++) {
                            float4 v = __ldg(xr + p);
                            xv[4 * p] = v.x;
                            xv[4 * p + 1] = v.y;
                            xv[4 * p + 2] = v.z;
                            xv[4 * p + 3] = v.w;
                        }
                    }
                    float sx = 0.0f;
                    if constexpr (QB) {
#pragma unroll
                        for (int j = 0; j < NV; j++)
                            sx = __fadd_rn(sx, xv[j]);
                    }
#pragma unroll
                    for (int s = 0; s < NS; s++)
                        acc[s][tt] = __fadd_rn(acc[s][tt], chunk_dot_v<KIND>(raw[u][s], xv, sx, scale[s], bias[s]));
                }
            };
            /* the first chunk >= p0 that lane L owns: ownership c % LS == L
             * does not depend on the panel bounds */
            const int cs = p0 + ((L - p0 % LS) + LS) % LS;
            if constexpr (PIPE) {
                /* one token: the U chunks of a pass in two halves, each
                 * half's next chunks requested as soon as it is used, so
                 * that the other half's loads are in flight while it is */
                constexpr int H = U / 2;
                if (!pre)
#pragma unroll
                    for (int u = 0; u < U; u++)
                        fetch(u, cs + u * LS);
                pre = false;
                for (int c0 = cs; c0 < pend; c0 += LS * U) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
#pragma unroll
                        for (int u = h * H; u < (h + 1) * H; u++)
                            if (c0 + u * LS < pend)
                                use(u, c0 + u * LS);
#pragma unroll
                        for (int u = h * H; u < (h + 1) * H; u++)
                            fetch(u, c0 + (U + u) * LS);
                    }
                }
            } else {
                for (int c0 = cs; c0 < pend; c0 += LS * U) {
                    if (!pre)
#pragma unroll
                        for (int u = 0; u < U; u++)
                            fetch(u, c0 + u * LS);
                    pre = false;
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (c0 + u * LS < pend)
                            use(u, c0 + u * LS);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                acc[s][tt] = warp_sum(acc[s][tt]);
        if constexpr (S > 1) {
            if (lane == 0)
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++)
                        red[warp][s][tt] = acc[s][tt];
            __syncthreads();
            if (ws == 0)
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        float v = red[grp * S][s][tt];
#pragma unroll
                        for (int w = 1; w < S; w++)
                            v = __fadd_rn(v, red[grp * S + w][s][tt]);
                        acc[s][tt] = v;
                    }
            __syncthreads();
        }
        if (ws == 0 && lane < nt) {
#pragma unroll
            for (int i = 0; i < R; i++) {
                float v = 0.0f, u = 0.0f;
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
                    if (tt == lane) {
                        v = acc[i][tt];
                        if (GLU)
                            u = acc[R + i][tt];
                    }
                if (!valid[i])
                    continue;
                float *y = yp[i] + (size_t)(t0 + lane) * ystride[i];
                if (GLU)
                    *y = (a.glu == 2 ? gelu_f(v) : silu_f(v)) * u;
                else
                    *y = a.accumulate ? *y + v : v;
            }
        }
    }
}

template <int KIND, int TT, int R, int S, bool XS, bool GLU, int UM = 1>
static int gemv_v_launch(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    constexpr int NV = chunk_traits<KIND>::NV;
    int pvals = 0, one = 0;
    size_t smem = 0;
    if constexpr (XS) {
        static bool raised = false;
        if (!raised) {
            for (auto k : {gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 1>,
                           gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 2>})
                cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, GV_SMEM + GV_SMEM_G);
            raised = true;
        }
        int tt = a->T < TT ? a->T : TT;
        pvals = GV_SMEM / 4 / tt / NV * NV;
        if (pvals > a->n_in)
            pvals = a->n_in;
        smem = (size_t)tt * pvals * sizeof(float);
        /* one panel: the cp.async path (with room for the norm weights) */
        one = pvals == a->n_in && (!a->norm_g || (size_t)a->n_in * sizeof(float) <= GV_SMEM_G);
        if (one && a->norm_g)
            smem += (size_t)a->n_in * sizeof(float);
    }
    if (one && pdl && (kind_quantized(KIND) || (a->early && TT == 1)))
        one = 2;
    long rpb = (long)(GV_WARPS / S) * R;
    const dim3 grid((unsigned)((rows + rpb - 1) / rpb)), block(GV_WARPS * WARP);
    if (XS && pdl && TT == 1 && !kind_quantized(KIND)) {
        /* a launch of under three blocks a SM that starts while the one
         * before ends would fill the SMs that free first (up to 3 blocks
         * each: the 8B down 31 -> 38 us): shared memory so large that at
         * most ceil(blocks / SMs) fit on one */
        static int sm_smem = 0;
        if (!sm_smem) {
            int dev = 0;
            cudaGetDevice(&dev);
            if (cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) || sm_smem <= 0)
                sm_smem = 228 * 1024;
        }
        const long k = ((long)grid.x + sm_count() - 1) / sm_count();
        if (k < 3) {
            const size_t want = (size_t)sm_smem / (size_t)(k + 1) + 1024;
            if (smem < want && want <= GV_SMEM + GV_SMEM_G)
                smem = want;
        }
    }
    if constexpr (!XS) {
        return launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, grid, block, smem, s, *a, pvals);
    } else {
        if (!one)
            return launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, grid, block, smem, s, *a, pvals);
        return one == 2
                   ? launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 2>, grid, block, smem, s, *a, pvals)
                   : launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 1>, grid, block, smem, s, *a, pvals);
    }
}

/* UM: loads in flight at T = 1 times UM (the order of the sums stays) */
template <int KIND, int R, int S, bool XS, int UM = 1>
static int gemv_v(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    if (a->T == 1) {
        /* 16-bit gate/up: one row pair a warp instead of two (same sums in
         * the same order; the 8B launch is 4.5 waves of short blocks
         * instead of 2.3 of long ones: +0.9% at batch 1) */
        if constexpr (R == 2 && KIND != TCU_Q4 && KIND != TCU_Q4F && KIND != TCU_Q8 && KIND != TCU_F8)
            if (a->glu)
                return gemv_v_launch<KIND, 1, 1, S, XS, true, UM>(a, rows, s, pdl);
        return a->glu ? gemv_v_launch<KIND, 1, R, S, XS, true, UM>(a, rows, s, pdl)
                      : gemv_v_launch<KIND, 1, R, S, XS, false, UM>(a, rows, s, pdl);
    }
    return a->glu ? gemv_v_launch<KIND, GEMV_TT, R, S, XS, true>(a, rows, s, pdl)
                  : gemv_v_launch<KIND, GEMV_TT, R, S, XS, false>(a, rows, s, pdl);
}

template <int R, int S, bool XS, bool Q4F = false, int UM = 1>
static int gemv_v_kind(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    switch (a->m[0].kind) {
    case TCU_BF16: return gemv_v<TCU_BF16, R, S, XS, UM>(a, rows, s, pdl);
    case TCU_Q4: return gemv_v<Q4F ? TCU_Q4F : TCU_Q4, R, S, XS, UM>(a, rows, s, pdl);
    case TCU_Q8: return gemv_v<TCU_Q8, R, S, XS, UM>(a, rows, s, pdl);
    case TCU_F8: return gemv_v<TCU_F8, R, S, XS, UM>(a, rows, s, pdl);
    default: return -1; /* f32 / f16: the plain kernel */
    }
}

// ---- the dispatch by tcu_opts ----

static int gv_choice(const tcu_opts &o, int kind)
{
    return kind == TCU_Q4 ? o.gemv_q4 : kind == TCU_Q8 || kind == TCU_F8 ? o.gemv_q8 : o.gemv_bf16;
}

/* the kernels that stage activations in shared memory (and fuse a norm) */
static bool gv_xs(int choice, int kind)
{
    return kind == TCU_F8 || (choice != TCU_GEMV_PLAIN && (kind == TCU_BF16 || kind == TCU_Q4 || kind == TCU_Q8));
}

static int gemv_dispatch(const tcu_gemv_args *a, const tcu_opts &o, tcu_stream stream);

extern "C" int tcu_gemv(const tcu_gemv_args *a, const tcu_opts *opts, tcu_stream stream)
{
    const tcu_opts &o = opts_or_default(opts);
    if (a->norm_g && a->T > 0 && !gv_xs(gv_choice(o, a->m[0].kind), a->m[0].kind)) {
        int rc = tcu_rmsnorm(a->x, a->norm_rows, a->norm_g, a->norm_out, a->T, a->n_in, a->norm_eps, 0, &o, stream);
        if (rc)
            return rc;
        tcu_gemv_args b = *a;
        b.x = a->norm_out;
        b.norm_g = NULL;
        b.norm_rows = NULL;
        return gemv_dispatch(&b, o, stream);
    }
    return gemv_dispatch(a, o, stream);
}

// TCU_GEMV_BY_SHAPE, rows a warp by shape. A row's order of sums does not depend
// on R, so every choice gives the same bits and R may even follow T.
// Larger blocks stage the activations - and a fused norm - once for more
// rows and share each chunk's activation sum, but need rows enough to
// fill the SMs. Measured per launch on the H200 (8B / 1B shapes, 4-bit
// g64, T = 1): o and down (no norm) 2; gate/up 4; q/k/v 3 (8B 11.2 us
// against 12.7 with 4 and 14.5 with 2); lm_head 6 (187 us against 206 with
// 4). Above T = 1 (8-token tiles) and for 8-bit: 4 on the launches with
// >= 40 rows per SM, else 2. bf16: 2.
static int gemv_by_shape(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    const int kind = a->m[0].kind;
    const long n_sm = sm_count();
    if (kind == TCU_Q4 && a->norm_g && !a->glu && a->T == 1) {
        if (rows >= 200 * n_sm)
            return gemv_v_launch<TCU_Q4F, 1, 6, 1, true, false>(a, rows, s, pdl);
        if (rows >= 16 * n_sm)
            return gemv_v_launch<TCU_Q4F, 1, 3, 1, true, false>(a, rows, s, pdl);
    }
    if (kind == TCU_BF16 || rows < 40 * n_sm)
        return gemv_v_kind<2, 1, true, true>(a, rows, s, pdl);
    return gemv_v_kind<4, 1, true, true>(a, rows, s, pdl);
}

static int gemv_dispatch(const tcu_gemv_args *a, const tcu_opts &o, tcu_stream stream)
{
    PROF(TCU_PROF_GEMV, stream);
    const long rows = gv_out_rows(*a, a->glu != 0);
    if (rows == 0 || a->T == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    const bool pdl = o.pdl != 0;
    const int kind = a->m[0].kind;
    int rc = -1;
    const int choice = gv_choice(o, kind);
    const bool exact = o.exact != 0;
    /* exact AUTO: the tensor-core kernel at every step, never the ring's
     * (staged) bits */
    if (a->ring && !(exact && choice == TCU_GEMV_AUTO) && (rc = gemv_ring(a, rows, s, pdl)) >= 0)
        return rc;
    if (kind == TCU_F8) /* the shared-memory kernel only (the plain one has no FP8) */
        return gemv_by_shape(a, rows, s, pdl);
    switch (choice) {
    case TCU_GEMV_STAGED: rc = gemv_v_kind<2, 1, true>(a, rows, s, pdl); break;
    case TCU_GEMV_BY_SHAPE: rc = gemv_by_shape(a, rows, s, pdl); break;
    case TCU_GEMV_TENSOR:
        if ((rc = gemv_tc(a, rows, s, pdl, exact)) < 0)
            rc = gemv_by_shape(a, rows, s, pdl);
        break;
    case TCU_GEMV_AUTO:
        if ((!a->wide && !exact) || (rc = gemv_tc(a, rows, s, pdl, exact)) < 0)
            rc = kind == TCU_BF16 ? gemv_v_kind<2, 1, true>(a, rows, s, pdl) : gemv_by_shape(a, rows, s, pdl);
        break;
    default: break;
    }
    /* PLAIN, and f32/f16 weights whatever the choice */
    return rc >= 0 ? rc : gemv_plain(a, pdl, stream);
}
