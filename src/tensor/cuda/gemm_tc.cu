// The throughput mode's tensor-core GEMM tile (tcu_opts.tc_gemm): bf16
// weights times activations rounded once to bf16, every step of 1-128
// tokens of a launch in one tile of 128 weight rows by 128 token columns,
// the weights streamed once through a multi-stage cp.async pipeline in
// shared memory, split-K over a thread-block cluster fixed by the weight's
// shape. See docs/cuda.md, "Products".
#include <cooperative_groups.h>

#include "tensor/cuda/gemv.cuh"

// Layout. A 32-input step of the weights is 128 rows of 64 bytes in shared
// memory ([row][4] 16-byte pieces: lane (g, t) of a warp reads piece t of
// row g - 8 lanes of a quarter-warp read 128 consecutive bytes, no bank
// conflict); the step's activations are the stage's [token][4] pieces
// (gm_stage_kernel: one bf16 an input, nearest even, the fused RMSNorm
// applied), the same shape. A pipeline stage holds SPS such steps, ST
// stages in flight (gm_shape).
//
// Warps: a tile configuration's warp tile of WMT m-tiles by WNT n-tiles
// (GM_CFGS). n-tiles wholly past the launch's tokens are skipped (their
// columns are never summed into another).
//
// Order of sums per (row, token): the tensor-core GEMV's throughput mode
// (gemv_tc.cu), so the two give the same bits and may share launches of
// one step size: the split-K of gemv_tc_ks (the weight's shape alone), in
// each slice the mma m16n8k16 accumulating over its steps in order (within
// a step lane t's 16 bytes are inputs 8t .. 8t + 7, the first mma taking
// 8t .. 8t + 3 of each t, the second 8t + 4 .. 8t + 7; 4-bit: each step's
// pair into a fresh accumulator, scaled in), then the slices in order in
// f32; a row at the same place of its m16 tile, a token in the same column
// of its n8 tile. A column of an mma never depends on another, and a
// token's staged values never depend on the others: a token's result is
// the same in any batch, alone too.
#define GM_WARPS 8
#define GM_BN 128 /* token columns a tile (a launch) */

__device__ __forceinline__ void gm_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes of a weight row into shared memory, the L2 fetching the 256
// bytes around them (the row's next steps).
__device__ __forceinline__ void gm_cp_w(void *smem, const void *gmem)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(gmem) : "memory");
}

// The same with an L2 eviction policy (gm_policy: evict first - the
// weights are read once, the activation panel by every block).
__device__ __forceinline__ void gm_cp_w_pol(void *smem, const void *gmem, uint64_t pol)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ uint64_t gm_policy()
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__device__ __forceinline__ uint32_t gm_bf16_rn(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ uint32_t gm_pack(float x0, float x1) { return gm_bf16_rn(x0) | (gm_bf16_rn(x1) << 16); }

__device__ __forceinline__ float gm_r(float x) { return __uint_as_float(gm_bf16_rn(x) << 16); }

// A thread's part of a token's sum of squares (the fused RMSNorm), in
// double with explicit roundings.
__device__ __forceinline__ double gm_sq4(float4 v)
{
    double t = __dmul_rn((double)v.x, (double)v.x);
    t = __fma_rn((double)v.y, (double)v.y, t);
    t = __fma_rn((double)v.z, (double)v.z, t);
    return __fma_rn((double)v.w, (double)v.w, t);
}

// The step's activations rounded once to bf16 into tcu_gemv_args.stage:
// [n_in / 32][C][4] 16-byte pieces (C token columns, a multiple of 8;
// columns past the tokens zeros), pairs (8t + i, 8t + i + 1) of each piece
// t, or for 4-bit weights (Q) pairs (8t + i, 8t + 4 + i), the codes'
// order; 4-bit, then each group's sum of the rounded values per column
// [n_in / G][C] f32 (its 8-value sums in order). grid (C, blocks along the
// inputs of nbs steps each: whole groups). Token j's norm factor over its
// whole row: a thread's elements in order, the warp's butterfly, the warps
// in order - the same arithmetic at any C, in any block.
template <bool Q> __global__ void __launch_bounds__(GM_WARPS *WARP) gm_stage_kernel(const tcu_gemv_args a, int nbs, int C)
{
    constexpr int NTH = GM_WARPS * WARP;
    extern __shared__ float gm_s8[]; /* 4-bit: [nbs * 4] 8-value sums */
    __shared__ double nsum[GM_WARPS];
    __shared__ float rn;
    pdl_wait();
    pdl_trigger();
    const int j = blockIdx.x, sa = blockIdx.y * nbs, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool tok = j < a.T;
    const size_t xrow = tok && a.norm_g && a.norm_rows ? (size_t)a.norm_rows[j] : (size_t)j;
    const float *xr = a.x + xrow * a.n_in;
    uint4 *xsp = reinterpret_cast<uint4 *>(a.stage);
    float r = 1.0f;
    if (tok && a.norm_g) {
        double ss = 0.0;
        for (int e = threadIdx.x * 4; e < a.n_in; e += NTH * 4)
            ss = __dadd_rn(ss, gm_sq4(__ldg(reinterpret_cast<const float4 *>(xr + e))));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss = __dadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        if (lane == 0)
            nsum[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            double s = 0.0;
            for (int k = 0; k < GM_WARPS; k++)
                s = __dadd_rn(s, nsum[k]);
            rn = (float)(1.0 / sqrt(s / a.n_in + a.norm_eps));
        }
        __syncthreads();
        r = rn;
    }
    for (int i = threadIdx.x; i < nbs * 4; i += NTH) {
        const int st = sa + i / 4, tq = i % 4;
        uint4 v = make_uint4(0, 0, 0, 0);
        float s8 = 0.0f;
        if (tok) {
            const int e = st * 32 + 8 * tq;
            const float4 *xp = reinterpret_cast<const float4 *>(xr + e);
            float4 v0 = __ldg(xp), v1 = __ldg(xp + 1);
            if (a.norm_g) {
                v0 = norm4(v0, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e)));
                v1 = norm4(v1, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e) + 1));
            }
            if (Q) {
                v = make_uint4(gm_pack(v0.x, v1.x), gm_pack(v0.y, v1.y), gm_pack(v0.z, v1.z), gm_pack(v0.w, v1.w));
                const float r8[8] = {gm_r(v0.x), gm_r(v0.y), gm_r(v0.z), gm_r(v0.w),
                                     gm_r(v1.x), gm_r(v1.y), gm_r(v1.z), gm_r(v1.w)};
                s8 = r8[0];
#pragma unroll
                for (int k = 1; k < 8; k++)
                    s8 = __fadd_rn(s8, r8[k]);
            } else {
                v = make_uint4(gm_pack(v0.x, v0.y), gm_pack(v0.z, v0.w), gm_pack(v1.x, v1.y), gm_pack(v1.z, v1.w));
            }
        }
        if (Q)
            gm_s8[i] = s8;
        xsp[((size_t)st * C + j) * 4 + tq] = v;
    }
    if (Q) { /* each group's sum: its 8-value sums in order */
        const int G = a.m[0].group;
        float *xsum = reinterpret_cast<float *>(xsp + (size_t)(a.n_in / 32) * C * 4);
        __syncthreads();
        for (int gi = threadIdx.x; gi < nbs * 32 / G; gi += NTH) {
            float sum = 0.0f;
            for (int k = 0; k < G / 8; k++)
                sum = __fadd_rn(sum, gm_s8[gi * (G / 8) + k]);
            xsum[(size_t)(sa * 32 / G + gi) * C + j] = sum;
        }
    }
}


// The tile's shape (template parameters, one instance a configuration of
// GM_CFGS below): WR warps along the tile's BM rows of WMT m-tiles each
// (WR * WMT * 16 = BM), BN token columns (a launch's C <= BN) in
// BN / (8 WNT) warps of WNT n-tiles each, SPS 32-input steps a pipeline
// stage (one barrier a stage), ST stages in flight. Shared memory: ST
// stages of SPS step blocks [weights BM x WB][activations BN x 64]
// (4-bit: then {scale, bias} BM x 8 and the group sums BN x 4), reused
// after the pass for the block's sums [BM][C + 4] f32. The row pointers
// of the tile (weights, 4-bit {scale, bias}) are found once into static
// shared memory.
template <bool Q, int BM, int WR, int WMT, int WNT, int BN, int SPS, int ST> struct gm_shape {
    static constexpr int WC = BN / (8 * WNT), NW = WR * WC, NTH = NW * WARP;
    static constexpr int WB = Q ? 16 : 64; /* weight bytes a row and step */
    static constexpr int XO = BM * WB;  /* activations in a step block */
    static constexpr int SO = XO + BN * 64; /* 4-bit {scale, bias} */
    static constexpr int GO = SO + BM * 8; /* 4-bit group sums */
    static constexpr int SUB = Q ? GO + BN * 4 : SO; /* a step block */
    static constexpr size_t SMEM_P = (size_t)ST * SPS * SUB;
    static constexpr size_t SMEM_R = (size_t)BM * (BN + 4) * sizeof(float);
    static constexpr size_t SMEM = SMEM_P > SMEM_R ? SMEM_P : SMEM_R;
    static_assert(WR * WMT * 16 == BM, "rows of a tile");
    static_assert(WC * WNT * 8 == BN && WC >= 1, "columns of a tile");
};

// grid (KS, row tiles), clusters of KS along x (block rank = slice), C the
// stage's token columns (<= BN).
//
// 4-bit (Q): a step's 16 bytes of codes a row, the row's {scale, bias} of
// the step's group, and the group's activation sums per column; codes read
// as bf16 1 + q / 16 (exact: pairs (i, i + 4) of a lane's 8), the step's
// two mma into a fresh accumulator d, then c += 16 s d, and at a group's
// last step c += (b - 16 s) sum x (w = 16 s (1 + q / 16) + b - 16 s).
template <bool Q, int BM, int WR, int WMT, int WNT, int BN, int SPS, int ST>
__global__ void __launch_bounds__(gm_shape<Q, BM, WR, WMT, WNT, BN, SPS, ST>::NTH,
                                  gm_shape<Q, BM, WR, WMT, WNT, BN, SPS, ST>::NTH <= 128 || (!Q && BM == 128) ? 2 : 1)
    gm_kernel(const tcu_gemv_args a, int KS, int C, int ef)
{
    namespace cg = cooperative_groups;
    using S = gm_shape<Q, BM, WR, WMT, WNT, BN, SPS, ST>;
    constexpr int NTH = S::NTH, SUB = S::SUB, SB = SPS * S::SUB;
    extern __shared__ __align__(128) unsigned char gm_smem[];
    __shared__ const char *gm_rp[BM]; /* a tile row's weights at the slice's first step */
    __shared__ const char *gm_sp[BM]; /* 4-bit: its {scale, bias} pairs */
    float *red = reinterpret_cast<float *>(gm_smem); /* after the pass: [BM][C + 4] */
    cg::cluster_group cl = cg::this_cluster();
    const int ks = (int)cl.block_rank();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp / S::WC, wn = warp % S::WC, wr = wm * 16 * WMT; /* the warp's first row */
    const bool glu = a.glu != 0;
    const long rows = gv_out_rows(a, glu);
    const int orows = glu ? BM / 2 : BM;
    const long o0 = (long)blockIdx.y * orows;
    const int ns = a.n_in / 32 / KS, s0 = ks * ns, G = Q ? a.m[0].group : 32, nstg = (ns + SPS - 1) / SPS;
    for (int r = tid; r < BM; r += NTH) {
        long gr, off = 0;
        int k = 0;
        if (glu) { /* tile rows 0 .. BM / 2 - 1 gate, then the same rows of up */
            gr = o0 + r % (BM / 2);
            k = r / (BM / 2);
        } else {
            gr = o0 + r;
        }
        if (gr >= rows)
            gr = rows - 1;
        if (!glu)
            k = gv_mat_of(a, gr, &off);
        if (Q) {
            gm_rp[r] = (const char *)a.m[k].w + (size_t)(gr - off) * (a.n_in / 2) + (size_t)s0 * 16;
            gm_sp[r] = (const char *)(a.m[k].sb + (size_t)(gr - off) * (a.n_in / G) * 2);
        } else {
            gm_rp[r] = (const char *)a.m[k].w + ((size_t)(gr - off) * a.n_in + (size_t)s0 * 32) * 2;
        }
    }
    __syncthreads();
    const uint4 *xg = reinterpret_cast<const uint4 *>(a.stage) + (size_t)s0 * C * 4;
    const float *xsg = reinterpret_cast<const float *>(reinterpret_cast<const uint4 *>(a.stage) +
                                                       (size_t)(a.n_in / 32) * C * 4);
    const uint64_t pol = gm_policy();
    /* stage st's weights: steps st * SPS + u of the slice (each row's
     * SPS * WB bytes in a row by consecutive threads); ef: evict first */
    auto cpw = [&](void *d, const void *src) {
        if (ef)
            gm_cp_w_pol(d, src, pol);
        else
            gm_cp_w(d, src);
    };
    auto load_w = [&](int st) {
        unsigned char *d = gm_smem + (size_t)(st % ST) * SB;
        const int sa = st * SPS;
        if (Q) {
            for (int i = tid; i < BM * SPS; i += NTH) {
                const int r = i / SPS, u = i % SPS;
                if (sa + u < ns)
                    cpw(d + u * SUB + r * 16, gm_rp[r] + (size_t)(sa + u) * 16);
            }
            for (int i = tid; i < BM * SPS; i += NTH) { /* {scale, bias} of each step's group */
                const int r = i / SPS, u = i % SPS;
                if (sa + u < ns) {
                    const uint32_t sd = (uint32_t)__cvta_generic_to_shared(d + u * SUB + S::SO + r * 8);
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(sd),
                                 "l"(gm_sp[r] + (size_t)((s0 + sa + u) * 32 / G) * 8)
                                 : "memory");
                }
            }
        } else {
            for (int i = tid; i < BM * SPS * 4; i += NTH) {
                const int r = i / (SPS * 4), u = i / 4 % SPS, p = i % 4;
                if (sa + u < ns)
                    cpw(d + u * SUB + (r * 4 + p) * 16, gm_rp[r] + (size_t)(sa + u) * 64 + p * 16);
            }
        }
    };
    auto load_x = [&](int st) {
        unsigned char *d = gm_smem + (size_t)(st % ST) * SB;
        const int sa = st * SPS;
        for (int i = tid; i < SPS * C * 4; i += NTH) {
            const int u = i / (C * 4), p = i % (C * 4);
            if (sa + u < ns)
                cp_async16(d + u * SUB + S::XO + p * 16, xg + ((size_t)sa * C * 4 + i), 16);
        }
        if (Q) /* the groups' sums */
            for (int i = tid; i < SPS * (C / 4); i += NTH) {
                const int u = i / (C / 4), p = i % (C / 4);
                if (sa + u < ns)
                    cp_async16(d + u * SUB + S::GO + p * 16, xsg + (size_t)((s0 + sa + u) * 32 / G) * C + 4 * p, 16);
            }
    };
#pragma unroll
    for (int st = 0; st < ST - 1; st++)
        if (st < nstg)
            load_w(st);
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (st < nstg)
            load_x(st);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    float c[WMT][WNT][4];
#pragma unroll
    for (int mi = 0; mi < WMT; mi++)
#pragma unroll
        for (int ni = 0; ni < WNT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                c[mi][ni][e] = 0.0f;
    int nn = (C - wn * WNT * 8) / 8; /* the warp's n-tiles with tokens (warp-uniform; <= 0: none) */
    nn = nn > WNT ? WNT : nn;
    for (int st = 0; st < nstg; st++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
        __syncthreads();
        if (st + ST - 1 < nstg) {
            load_w(st + ST - 1);
            load_x(st + ST - 1);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (nn <= 0)
            continue;
#pragma unroll
        for (int u = 0; u < SPS; u++) {
            const int sg = st * SPS + u; /* the step in the slice */
            if (sg >= ns)
                break;
            const unsigned char *sl = gm_smem + (size_t)(st % ST) * SB + u * SUB;
            const uint4 *xsl = reinterpret_cast<const uint4 *>(sl + S::XO) + (size_t)(wn * WNT * 8 + g) * 4 + t;
            uint4 B[WNT];
#pragma unroll
            for (int ni = 0; ni < WNT; ni++)
                if (ni < nn)
                    B[ni] = xsl[ni * 8 * 4];
            if constexpr (Q) {
                const uint32_t *wsl = reinterpret_cast<const uint32_t *>(sl) + (size_t)(wr + g) * 4 + t;
                const float2 *sbl = reinterpret_cast<const float2 *>(sl + S::SO) + wr + g;
                const float *xgs = reinterpret_cast<const float *>(sl + S::GO) + wn * WNT * 8 + 2 * t;
                const bool gend = (s0 + sg + 1) * 32 % G == 0;
                uint32_t A[WMT][2][4];
                float2 sv[WMT][2];
#pragma unroll
                for (int mi = 0; mi < WMT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t q = wsl[(mi * 16 + 8 * h) * 4], M = 0x00780078u, O = 0x3F803F80u;
                        A[mi][h][0] = ((q << 3) & M) | O;
                        A[mi][h][1] = ((q >> 1) & M) | O;
                        A[mi][h][2] = ((q >> 5) & M) | O;
                        A[mi][h][3] = ((q >> 9) & M) | O;
                        const float2 p = sbl[mi * 16 + 8 * h];
                        sv[mi][h] = make_float2(16.0f * p.x, __fsub_rn(p.y, 16.0f * p.x));
                    }
#pragma unroll
                for (int ni = 0; ni < WNT; ni++) {
                    if (ni >= nn)
                        break;
                    float2 xs2 = make_float2(0.0f, 0.0f);
                    if (gend)
                        xs2 = *reinterpret_cast<const float2 *>(xgs + ni * 8);
                    float d[WMT][4]; /* the m-tiles' first halves, then their second: independent mma in a row */
#pragma unroll
                    for (int mi = 0; mi < WMT; mi++) {
                        d[mi][0] = d[mi][1] = d[mi][2] = d[mi][3] = 0.0f;
                        gm_mma(d[mi], A[mi][0][0], A[mi][1][0], A[mi][0][1], A[mi][1][1], B[ni].x, B[ni].y);
                    }
#pragma unroll
                    for (int mi = 0; mi < WMT; mi++)
                        gm_mma(d[mi], A[mi][0][2], A[mi][1][2], A[mi][0][3], A[mi][1][3], B[ni].z, B[ni].w);
#pragma unroll
                    for (int mi = 0; mi < WMT; mi++) {
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            c[mi][ni][e] = fmaf(sv[mi][e >> 1].x, d[mi][e], c[mi][ni][e]);
                        if (gend) /* the group's bias term, once */
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                c[mi][ni][e] = fmaf(sv[mi][e >> 1].y, (e & 1) ? xs2.y : xs2.x, c[mi][ni][e]);
                    }
                }
            } else {
                const uint4 *wsl = reinterpret_cast<const uint4 *>(sl) + (size_t)(wr + g) * 4 + t;
                uint4 A[WMT][2];
#pragma unroll
                for (int mi = 0; mi < WMT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        A[mi][h] = wsl[(mi * 16 + 8 * h) * 4];
                /* every tile's first half, then every second half: independent mma in a row (a
                 * tile's two back to back wait for each other); a tile's order is the GEMV's */
#pragma unroll
                for (int ni = 0; ni < WNT; ni++) {
                    if (ni >= nn)
                        break;
#pragma unroll
                    for (int mi = 0; mi < WMT; mi++)
                        gm_mma(c[mi][ni], A[mi][0].x, A[mi][1].x, A[mi][0].y, A[mi][1].y, B[ni].x, B[ni].y);
                }
#pragma unroll
                for (int ni = 0; ni < WNT; ni++) {
                    if (ni >= nn)
                        break;
#pragma unroll
                    for (int mi = 0; mi < WMT; mi++)
                        gm_mma(c[mi][ni], A[mi][0].z, A[mi][1].z, A[mi][0].w, A[mi][1].w, B[ni].z, B[ni].w);
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    const int RS = C + 4;
#pragma unroll
    for (int ni = 0; ni < WNT; ni++) {
        if (ni >= nn)
            break;
#pragma unroll
        for (int mi = 0; mi < WMT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(red + (size_t)(wr + mi * 16 + g + 8 * h) * RS + wn * WNT * 8 + ni * 8 +
                                            2 * t) = make_float2(c[mi][ni][2 * h], c[mi][ni][2 * h + 1]);
    }
    cl.sync();
    /* block ks sums rows ks * per .. of every block of the cluster, the
     * slices in order; consecutive threads take consecutive rows */
    const int per = orows / KS, T = a.T;
    for (int i = tid; i < per * T; i += NTH) {
        const int r = ks * per + i % per, j = i / per;
        const long gr = o0 + r;
        if (gr >= rows)
            continue;
        float v[2];
#pragma unroll
        for (int s = 0; s < 2; s++) {
            if (s && !glu)
                break;
            float part[8]; /* every block's part requested, then summed in order */
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (k < KS)
                    part[k] = cl.map_shared_rank(red, k)[(size_t)(r + s * (BM / 2)) * RS + j];
            v[s] = part[0];
#pragma unroll
            for (int k = 1; k < 8; k++)
                if (k < KS)
                    v[s] = __fadd_rn(v[s], part[k]);
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

template <bool Q, int BM, int WR, int WMT, int WNT, int BN, int SPS, int ST>
static int gm_go(const tcu_gemv_args *a, long blocks, int ks, int C, int ef, cudaStream_t s, bool pdl)
{
    using S = gm_shape<Q, BM, WR, WMT, WNT, BN, SPS, ST>;
    static int smem_set;
    if (!smem_set) {
        const int rc = (int)cudaFuncSetAttribute(gm_kernel<Q, BM, WR, WMT, WNT, BN, SPS, ST>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::SMEM);
        if (rc)
            return rc;
        smem_set = 1;
    }
    return launch_cl(pdl, (unsigned)ks, gm_kernel<Q, BM, WR, WMT, WNT, BN, SPS, ST>, dim3((unsigned)ks, (unsigned)blocks),
                     dim3(S::NTH), S::SMEM, s, *a, ks, C, ef);
}

// The configurations (a row: BM, WR, WMT, WNT, BN, SPS, ST; warp tile 16
// WMT rows by 8 WNT tokens): which one runs changes no bit - every (row,
// token) is summed in the same order by each, the split-K that of the
// GEMV's 128-row tiles whatever BM.
#define GM_CFGS(X)                                                                                                     \
    X(0, 128, 2, 4, 4, 128, 1, 6) /* 64 x 32 warp tiles, 8 warps, a step a stage (the first tile) */                  \
    X(1, 128, 2, 4, 4, 128, 2, 3) /* the same, two steps a stage */                                                    \
    X(2, 128, 2, 4, 8, 128, 1, 6) /* 64 x 64, 4 warps */                                                               \
    X(3, 128, 2, 4, 8, 128, 2, 3)                                                                                      \
    X(4, 128, 2, 4, 8, 128, 4, 2) /* one block a SM */                                                                 \
    X(5, 128, 2, 4, 8, 128, 2, 4) /* one block a SM */                                                                 \
    X(6, 128, 4, 2, 8, 128, 2, 3) /* 32 x 64, 8 warps */                                                               \
    X(7, 128, 1, 8, 4, 128, 2, 3) /* 128 x 32, 4 warps */                                                              \
    X(8, 128, 2, 4, 8, 64, 2, 4)  /* up to 64 tokens: 64 x 64, 2 warps */                                              \
    X(9, 128, 4, 2, 8, 64, 2, 4)  /* up to 64 tokens: 32 x 64, 4 warps */                                              \
    X(10, 128, 8, 1, 4, 32, 2, 4) /* up to 32 tokens: 16 x 32, 8 warps */                                              \
    X(11, 128, 4, 2, 4, 32, 2, 4) /* up to 32 tokens: 32 x 32, 4 warps */                                              \
    X(12, 256, 4, 4, 8, 128, 2, 3) /* 256 rows: 64 x 64, 8 warps, one block a SM */                                    \
    X(13, 256, 4, 4, 8, 128, 1, 6)                                                                                     \
    X(14, 256, 4, 4, 8, 64, 2, 4) /* 256 rows, up to 64 tokens: 64 x 64, 4 warps */
#define GM_NCFG 15

static const int gm_bn[GM_NCFG] = {
#define X(i, bm, wr, wmt, wnt, bn, sps, st) bn,
    GM_CFGS(X)
#undef X
};
static const int gm_bm[GM_NCFG] = {
#define X(i, bm, wr, wmt, wnt, bn, sps, st) bm,
    GM_CFGS(X)
#undef X
};

template <bool Q>
static int gm_run(int cfg, const tcu_gemv_args *a, long blocks, int ks, int C, int ef, cudaStream_t s, bool pdl)
{
    switch (cfg) {
#define X(i, bm, wr, wmt, wnt, bn, sps, st)                                                                                \
    case i: return gm_go<Q, bm, wr, wmt, wnt, bn, sps, st>(a, blocks, ks, C, ef, s, pdl);
        GM_CFGS(X)
#undef X
    default: return -1;
    }
}

// The configuration by the launch's columns (until measured: the first
// tile's layout), or TERN_CUDA_GEMM_CFG (the benchmark's sweep).
static int gm_pick(int C)
{
    const char *e = getenv("TERN_CUDA_GEMM_CFG");
    if (e && *e) {
        const int v = atoi(e);
        if (v >= 0 && v < GM_NCFG && C <= gm_bn[v])
            return v;
        return -1;
    }
    return C <= 32 ? 10 : 0;
}

extern "C" int tcu_gemm_configs(int T, int *cfg, int max)
{
    const int C = (T + 7) / 8 * 8;
    int n = 0;
    for (int i = 0; i < GM_NCFG && n < max; i++)
        if (C <= gm_bn[i])
            cfg[n++] = i;
    return n;
}

template <bool Q> static int gm_launch(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    const int C = (a->T + 7) / 8 * 8, nst = a->n_in / 32, G = Q ? a->m[0].group : 32;
    if (a->stage_bytes < (size_t)nst * C * 64 + (Q ? (size_t)(a->n_in / G) * C * sizeof(float) : 0))
        return -1;
    const int cfg = gm_pick(C);
    if (cfg < 0)
        return -1;
    int nb = 1; /* stage blocks along the inputs: about two a SM, whole groups */
    while (nb < 16 && (long)C * nb < 2L * sm_count() && nst % (2 * nb) == 0 && nst / (2 * nb) * 32 % G == 0)
        nb *= 2;
    int rc = launch_pdl(pdl, gm_stage_kernel<Q>, dim3((unsigned)C, (unsigned)nb), dim3(GM_WARPS * WARP),
                        Q ? (size_t)(nst / nb) * 4 * sizeof(float) : 0, s, *a, nst / nb, C);
    if (rc)
        return rc;
    const long o128 = a->glu ? 64 : 128, obm = a->glu ? gm_bm[cfg] / 2 : gm_bm[cfg];
    const int ks = gemv_tc_ks(Q, a->n_in, (rows + o128 - 1) / o128, G); /* the GEMV's split: its bits */
    const char *e = getenv("TERN_CUDA_GEMM_EF"); /* the weights' copies evict first (benchmarks) */
    return gm_run<Q>(cfg, a, (rows + obm - 1) / obm, ks, C, e && *e == '1', s, pdl);
}

int gemm_tc(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    const int kind = a->m[0].kind, G = a->m[0].group;
    if ((kind != TCU_BF16 && kind != TCU_Q4) || a->n_in % 32 || a->T > GM_BN || !a->stage)
        return -1;
    if (kind == TCU_Q4 && (G % 32 || a->n_in % G))
        return -1;
    for (int k = 1; k < a->n; k++)
        if (a->m[k].kind != kind || (kind == TCU_Q4 && a->m[k].group != G))
            return -1;
    return kind == TCU_Q4 ? gm_launch<true>(a, rows, s, pdl) : gm_launch<false>(a, rows, s, pdl);
}
