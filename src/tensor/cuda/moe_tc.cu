// The throughput mode's expert products for steps of many tokens
// (docs/cuda.md, "Mixtures of experts"): a grouped GEMM on the tensor cores
// (mma.sync m16n8k16, bf16 inputs, f32 accumulation) over the routing's
// groups, in place of moe.cu's warp-per-row kernels.
//
// A block: 4 warps, 16 output rows each (64 rows of one expert, gate and up
// together for gate/up), blockIdx.y the group; each warp walks the group's
// picks in tiles of 8 NI tokens. Weights go from global memory straight
// into the A fragments (each weight is used by one warp only), the tokens'
// activations into the B fragments (rounded once to bf16: xn for gate/up;
// gate/up writes its activation as bf16, which down reads as it is).
//
// Per (row, token) the inputs are summed in 32-input steps in order, two
// mma a step, from k = 0 to n_in - one accumulator, no split; quantized
// kinds per group: P = the mma's sum of codes times activations over the
// group from zero, then acc = fma(bias, S, fma(scale, P, acc)) (MLX
// 4-bit; S the group's sum of the rounded activations, summed in a fixed
// order) or acc = fma(scale, P, acc) (MXFP4, a group of 32). Nothing of
// that order depends on how many tokens the expert got, the token tile or
// the batch, and an mma's output (row, column) reads only that row of A
// and that column of B: a token's products are the same bits alone and in
// any batch. Down writes each pick's row (y), and the sum kernel adds each
// token's picks in expert-id order, weighted - moe.cu's down_sum order.
#include "tensor/cuda/moe.cuh"

namespace {

constexpr int TC_WARPS = 4;            // warps a block
constexpr int TC_ROWS = 16 * TC_WARPS; // output rows a block (a warp's 16: one m-tile)

// mma.sync m16n8k16, bf16 inputs, f32 accumulation (PTX ISA, "Matrix
// fragments for mma.m16n8k16"; lane = 4 g + q, g = lane / 4, q = lane % 4;
// a register of two bf16 holds the lower k in its low half):
//   A (16 x 16, row-major): a0 = (row g, k 2q, 2q+1), a1 = (row g+8, k 2q,
//   2q+1), a2 = (row g, k 2q+8, 2q+9), a3 = (row g+8, k 2q+8, 2q+9);
//   B (16 x 8, column-major): b0 = (k 2q, 2q+1, column g), b1 = (k 2q+8,
//   2q+9, column g);
//   C / D (16 x 8, f32): c0 = (row g, column 2q), c1 = (row g, column
//   2q+1), c2 = (row g+8, column 2q), c3 = (row g+8, column 2q+1).
// Which inputs the 16 k slots hold is ours to choose, the same for A and B.
// In a 32-input step starting at k0, lane q holds inputs k0 + 8q .. k0 + 8q
// + 7 (one 16-byte load of a bf16 row, one 32-bit word of 4-bit codes);
// mma s (0, 1) of the step takes inputs k0 + 8q + 4s + {0, 1} at k slots
// 2q, 2q+1 (a0, a1, b0) and k0 + 8q + 4s + {2, 3} at 2q+8, 2q+9 (a2, a3,
// b1) - bf16 and MXFP4; MLX 4-bit takes k0 + 8q + {2s, 2s+4} at 2q, 2q+1
// and k0 + 8q + {2s+1, 2s+5} at 2q+8, 2q+9 (one mask extracts codes i and
// i + 4 of a word). Rows: a warp's m-tile is rows r0 .. r0 + 15 of the matrix (lane
// row g: r0 + g and r0 + g + 8); columns: n-tile j is the picks p + 8j ..
// p + 8j + 7 of the group (lane column g: pick p + 8j + g for B; the C
// registers' columns 2q, 2q+1).

// Two floats as a bf16 pair, each rounded to nearest even (lo in the low half).
__device__ __forceinline__ uint32_t tc_bf2(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
__device__ __forceinline__ float tc_lo(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float tc_hi(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }

// MLX 4-bit codes i and i + 4 of a word (low nibble first) as a bf16
// pair equal to the codes: one shift and one mask put them in the two
// halves, 0x4300 | c is the bf16 128 + c (7 mantissa bits), less 128 in
// bf16 arithmetic - exact for small integers.
__device__ __forceinline__ uint32_t tc_q4_pair(uint32_t w, int i)
{
    const uint32_t u = ((w >> (4 * i)) & 0x000f000fu) | 0x43004300u;
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162 *>(&u);
    b = __hsub2(b, __floats2bfloat162_rn(128.0f, 128.0f));
    return *reinterpret_cast<const uint32_t *>(&b);
}

// MXFP4 (E2M1: sign, 2 exponent bits, 1 mantissa bit) codes 2p and 2p + 1
// as a bf16 pair of their values, exactly: the 3 magnitude bits pick each
// value's low and high byte from two 8-byte tables (byte_perm), the sign
// goes to bit 15. Values 0, 0.5, 1, 1.5, 2, 3, 4, 6 = bf16 0x0000, 0x3f00,
// 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0.
__device__ __forceinline__ uint32_t tc_mx4_pair(uint32_t w, int p)
{
    const uint32_t v = w >> (8 * p);
    const uint32_t sel = v & 0x77u;
    const uint32_t lo = __byte_perm(0xc0800000u, 0xc0804000u, sel);
    const uint32_t hi = __byte_perm(0x3f3f3f00u, 0x40404040u, sel);
    return __byte_perm(lo, hi, 0x5140u) | ((v & 0x8u) << 12) | ((v & 0x80u) << 24);
}

// Bytes of 32 inputs of a row.
template <int KIND> __host__ __device__ constexpr int tc_step_bytes() { return KIND == TCU_BF16 ? 64 : 16; }

// A lane's A fragments of one 32-input step (k0): rows r_lo (g) and r_hi
// (g + 8); a[s] for mma s of the step (the layout above).
template <int KIND>
__device__ __forceinline__ void tc_a_load(const uint8_t *r_lo, const uint8_t *r_hi, int k0, int q, uint32_t (&a)[2][4])
{
    if constexpr (KIND == TCU_BF16) {
        const size_t o = (size_t)(k0 + 8 * q) * 2;
        const uint4 u0 = __ldg((const uint4 *)(r_lo + o)), u1 = __ldg((const uint4 *)(r_hi + o));
        a[0][0] = u0.x, a[0][1] = u1.x, a[0][2] = u0.y, a[0][3] = u1.y;
        a[1][0] = u0.z, a[1][1] = u1.z, a[1][2] = u0.w, a[1][3] = u1.w;
    } else {
        const size_t o = (size_t)(k0 + 8 * q) / 2;
        const uint32_t w0 = __ldg((const uint32_t *)(r_lo + o)), w1 = __ldg((const uint32_t *)(r_hi + o));
#pragma unroll
        for (int s = 0; s < 2; s++) {
            if constexpr (KIND == TCU_Q4) {
                /* the pairs (i, i + 4): Q4's own slot order (tc_b_load) */
                a[s][0] = tc_q4_pair(w0, 2 * s), a[s][1] = tc_q4_pair(w1, 2 * s);
                a[s][2] = tc_q4_pair(w0, 2 * s + 1), a[s][3] = tc_q4_pair(w1, 2 * s + 1);
            } else {
                a[s][0] = tc_mx4_pair(w0, 2 * s), a[s][1] = tc_mx4_pair(w1, 2 * s);
                a[s][2] = tc_mx4_pair(w0, 2 * s + 1), a[s][3] = tc_mx4_pair(w1, 2 * s + 1);
            }
        }
    }
}

// A lane's B fragments of one step for its column's token row xr: b[s][0]
// (b0), b[s][1] (b1) of mma s. XBF: xr holds bf16 (down's input, already
// rounded); else f32, rounded here (nearest even). Plain loads: the
// block's 4 warps (and the SM's other blocks of the group) read the same
// rows, which L1 then serves. The lane's inputs x0..x7 go to the slots as
// the kind's A does: pairs (4s, 4s+1) at b0 and (4s+2, 4s+3) at b1 of mma
// s (bf16, MXFP4), or - MLX 4-bit, whose codes i and i + 4 one mask
// extracts - (2s, 2s+4) at b0 and (2s+1, 2s+5) at b1.
template <int KIND, bool XBF>
__device__ __forceinline__ void tc_b_load(const void *xr, int k0, int q, uint32_t (&b)[2][2])
{
    constexpr bool SPLIT = KIND == TCU_Q4;
    if constexpr (XBF) {
        const uint4 u = *(const uint4 *)((const uint16_t *)xr + k0 + 8 * q);
        if constexpr (SPLIT) {
            /* word s holds x(2s), x(2s+1); word s + 2 holds x(2s+4), x(2s+5) */
            b[0][0] = __byte_perm(u.x, u.z, 0x5410), b[0][1] = __byte_perm(u.x, u.z, 0x7632);
            b[1][0] = __byte_perm(u.y, u.w, 0x5410), b[1][1] = __byte_perm(u.y, u.w, 0x7632);
        } else {
            b[0][0] = u.x, b[0][1] = u.y, b[1][0] = u.z, b[1][1] = u.w;
        }
    } else {
        const float *p = (const float *)xr + k0 + 8 * q;
        const float4 f0 = *(const float4 *)p, f1 = *((const float4 *)p + 1);
        if constexpr (SPLIT) {
            b[0][0] = tc_bf2(f0.x, f1.x), b[0][1] = tc_bf2(f0.y, f1.y);
            b[1][0] = tc_bf2(f0.z, f1.z), b[1][1] = tc_bf2(f0.w, f1.w);
        } else {
            b[0][0] = tc_bf2(f0.x, f0.y), b[0][1] = tc_bf2(f0.z, f0.w);
            b[1][0] = tc_bf2(f1.x, f1.y), b[1][1] = tc_bf2(f1.z, f1.w);
        }
    }
}

// The sum of the 8 rounded activations a lane holds (MLX 4-bit's slot
// order, tc_b_load), in input order x0..x7.
__device__ __forceinline__ float tc_b_sum8(const uint32_t (&b)[2][2])
{
    /* x(i) for i < 4: the low half of b[i / 2][i % 2]; x(i + 4) its high half */
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++)
        s = __fadd_rn(s, tc_lo(b[i >> 1][i & 1]));
#pragma unroll
    for (int i = 0; i < 4; i++)
        s = __fadd_rn(s, tc_hi(b[i >> 1][i & 1]));
    return s;
}

// Row `row`'s group scales: {scale, bias} f32 pairs (MLX 4-bit), or MXFP4's
// E8M0 bytes (a group of 32).
template <int KIND> __device__ __forceinline__ const void *tc_scale_row(const void *base, int row, int n_in, int group)
{
    if constexpr (KIND == TCU_MX4)
        return (const uint8_t *)base + (size_t)row * (n_in / 32);
    else
        return (const float *)base + (size_t)row * (n_in / group) * 2;
}

// Group gi's scale (and bias) of a row: MXFP4's 2^(e - 127), e = 0 the
// subnormal 2^-127 (moe.cu's scale_load); MLX's pair.
template <int KIND> __device__ __forceinline__ void tc_scale(const void *sr, int gi, float &sc, float &bi)
{
    if constexpr (KIND == TCU_MX4) {
        const uint32_t e = __ldg((const uint8_t *)sr + gi);
        sc = __uint_as_float(e ? e << 23 : 0x00400000u);
        bi = 0.0f;
    } else {
        const float2 p = __ldg((const float2 *)sr + gi);
        sc = p.x, bi = p.y;
    }
}

// One warp's m-tile of NM matrices (sharing n_in) times NI n-tiles of
// tokens: acc[m][j] = the C fragment of matrix m, n-tile j (layout above).
// w_lo[m] / w_hi[m]: the lane's rows g / g + 8 of matrix m; s_lo / s_hi
// their scale rows (quantized kinds); xr[j]: the lane's column g token row
// of n-tile j (f32 or, XBF, bf16).
// PF (bf16; tcu_opts.moe bit TCU_MOE_TC_PF): the weights and activations
// of the next 2 steps are loaded into a second set of registers while the
// current 2 steps' mma run - the same sums in the same order.
template <int KIND, int NM, int NI, bool XBF, bool PF = false>
__device__ __forceinline__ void tc_tile(const uint8_t *const (&w_lo)[NM], const uint8_t *const (&w_hi)[NM],
                                        const void *const (&s_lo)[NM], const void *const (&s_hi)[NM], int n_in,
                                        int group, const void *const (&xr)[NI], float (&acc)[NM][NI][4])
{
    const int lane = threadIdx.x & 31, q = lane & 3;
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[m][j][c] = 0.0f;
    if constexpr (KIND == TCU_BF16 && PF) {
        constexpr int U = 2; /* steps a buffer */
        uint32_t a0[U][NM][2][4], b0[U][NI][2][2], a1[U][NM][2][4], b1[U][NI][2][2];
        auto load = [&](int k0, uint32_t(&a)[U][NM][2][4], uint32_t(&b)[U][NI][2][2]) {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (k0 + 32 * u < n_in) {
#pragma unroll
                    for (int m = 0; m < NM; m++)
                        tc_a_load<KIND>(w_lo[m], w_hi[m], k0 + 32 * u, q, a[u][m]);
#pragma unroll
                    for (int j = 0; j < NI; j++)
                        tc_b_load<KIND, XBF>(xr[j], k0 + 32 * u, q, b[u][j]);
                }
        };
        auto run = [&](int k0, const uint32_t(&a)[U][NM][2][4], const uint32_t(&b)[U][NI][2][2]) {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (k0 + 32 * u < n_in)
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int m = 0; m < NM; m++)
#pragma unroll
                            for (int j = 0; j < NI; j++)
                                tc_mma(acc[m][j], a[u][m][s], b[u][j][s][0], b[u][j][s][1]);
        };
        load(0, a0, b0);
        for (int k0 = 0;;) {
            if (k0 + 32 * U < n_in)
                load(k0 + 32 * U, a1, b1);
            run(k0, a0, b0);
            if ((k0 += 32 * U) >= n_in)
                break;
            if (k0 + 32 * U < n_in)
                load(k0 + 32 * U, a0, b0);
            run(k0, a1, b1);
            if ((k0 += 32 * U) >= n_in)
                break;
        }
    } else if constexpr (KIND == TCU_BF16) {
#pragma unroll 2
        for (int k0 = 0; k0 < n_in; k0 += 32) {
            uint32_t a[NM][2][4], b[NI][2][2];
#pragma unroll
            for (int m = 0; m < NM; m++)
                tc_a_load<KIND>(w_lo[m], w_hi[m], k0, q, a[m]);
#pragma unroll
            for (int j = 0; j < NI; j++)
                tc_b_load<KIND, XBF>(xr[j], k0, q, b[j]);
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int j = 0; j < NI; j++)
                        tc_mma(acc[m][j], a[m][s], b[j][s][0], b[j][s][1]);
        }
    } else {
        const int gs = KIND == TCU_MX4 ? 32 : group;
        const int quad = lane & ~3;
        for (int k0 = 0; k0 < n_in; k0 += gs) {
            float P[NM][NI][4], S[NI];
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int j = 0; j < NI; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        P[m][j][c] = 0.0f;
#pragma unroll
            for (int j = 0; j < NI; j++)
                S[j] = 0.0f;
            for (int k = k0; k < k0 + gs; k += 32) {
                uint32_t a[NM][2][4], b[NI][2][2];
#pragma unroll
                for (int m = 0; m < NM; m++)
                    tc_a_load<KIND>(w_lo[m], w_hi[m], k, q, a[m]);
#pragma unroll
                for (int j = 0; j < NI; j++)
                    tc_b_load<KIND, XBF>(xr[j], k, q, b[j]);
#pragma unroll
                for (int s = 0; s < 2; s++)
#pragma unroll
                    for (int m = 0; m < NM; m++)
#pragma unroll
                        for (int j = 0; j < NI; j++)
                            tc_mma(P[m][j], a[m][s], b[j][s][0], b[j][s][1]);
                if constexpr (KIND == TCU_Q4) {
                    /* the step's sum of token g's rounded activations: each
                     * lane's 8 in order, then the quad's lanes 0-3 in order */
#pragma unroll
                    for (int j = 0; j < NI; j++) {
                        const float s8 = tc_b_sum8(b[j]);
                        float s32 = __shfl_sync(0xffffffffu, s8, quad);
                        s32 = __fadd_rn(s32, __shfl_sync(0xffffffffu, s8, quad + 1));
                        s32 = __fadd_rn(s32, __shfl_sync(0xffffffffu, s8, quad + 2));
                        s32 = __fadd_rn(s32, __shfl_sync(0xffffffffu, s8, quad + 3));
                        S[j] = __fadd_rn(S[j], s32);
                    }
                }
            }
            const int gi = k0 / gs;
#pragma unroll
            for (int m = 0; m < NM; m++) {
                float sc0, bi0, sc1, bi1;
                tc_scale<KIND>(s_lo[m], gi, sc0, bi0);
                tc_scale<KIND>(s_hi[m], gi, sc1, bi1);
#pragma unroll
                for (int j = 0; j < NI; j++) {
                    if constexpr (KIND == TCU_Q4) {
                        /* column 2q's and 2q+1's group sums: held by quads 2q, 2q+1 */
                        const float S0 = __shfl_sync(0xffffffffu, S[j], 8 * q);
                        const float S1 = __shfl_sync(0xffffffffu, S[j], 8 * q + 4);
                        acc[m][j][0] = fmaf(bi0, S0, fmaf(sc0, P[m][j][0], acc[m][j][0]));
                        acc[m][j][1] = fmaf(bi0, S1, fmaf(sc0, P[m][j][1], acc[m][j][1]));
                        acc[m][j][2] = fmaf(bi1, S0, fmaf(sc1, P[m][j][2], acc[m][j][2]));
                        acc[m][j][3] = fmaf(bi1, S1, fmaf(sc1, P[m][j][3], acc[m][j][3]));
                    } else {
                        acc[m][j][0] = fmaf(sc0, P[m][j][0], acc[m][j][0]);
                        acc[m][j][1] = fmaf(sc0, P[m][j][1], acc[m][j][1]);
                        acc[m][j][2] = fmaf(sc1, P[m][j][2], acc[m][j][2]);
                        acc[m][j][3] = fmaf(sc1, P[m][j][3], acc[m][j][3]);
                    }
                }
            }
        }
    }
}

// Gate and up of group blockIdx.y's expert, rows blockIdx.x * TC_ROWS + 16
// w + (0..15) for warp w (tc_tile's two "matrices" gate and up), over all
// the group's picks in tiles of 8 NI: hb[pick][row] = the activation
// (moe_act), rounded to bf16.
template <int KIND, int NI, bool PF>
__global__ void __launch_bounds__(TC_WARPS * 32)
    moe_tc_gu_kernel(tcu_experts ex, const int32_t *meta, int G, const float *xn, uint16_t *hb)
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
    const int lane = threadIdx.x & 31, gl = lane >> 2, q = lane & 3;
    const int r0 = (blockIdx.x * TC_WARPS + (threadIdx.x >> 5)) * 16;
    if (r0 >= ex.ff)
        return;
    const size_t rbytes = (size_t)ex.dim / 32 * tc_step_bytes<KIND>();
    constexpr bool qk = KIND != TCU_BF16;
    const uint8_t *w_lo[2], *w_hi[2];
    const void *s_lo[2], *s_hi[2];
    /* rows past ff load the last row (their results are not stored) */
    const int ra = min(r0 + gl, ex.ff - 1), rb = min(r0 + gl + 8, ex.ff - 1);
#pragma unroll
    for (int m = 0; m < 2; m++) {
        w_lo[m] = (const uint8_t *)tab[m] + ra * rbytes;
        w_hi[m] = (const uint8_t *)tab[m] + rb * rbytes;
        s_lo[m] = qk ? tc_scale_row<KIND>(tab[3 + m], ra, ex.dim, ex.group) : nullptr;
        s_hi[m] = qk ? tc_scale_row<KIND>(tab[3 + m], rb, ex.dim, ex.group) : nullptr;
    }
    const int32_t *pk = mv.picks();
    for (int p = p0; p < p1; p += 8 * NI) {
        const void *xr[NI];
#pragma unroll
        for (int j = 0; j < NI; j++) {
            const int i = min(p + 8 * j + gl, p1 - 1); /* columns past the group repeat its last pick */
            xr[j] = xn + (size_t)(pk[i] / ex.n_used) * ex.dim;
        }
        float acc[2][NI][4];
        tc_tile<KIND, 2, NI, false, PF>(w_lo, w_hi, s_lo, s_hi, ex.dim, ex.group, xr, acc);
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = r0 + gl + (c >> 1) * 8, i = p + 8 * j + 2 * q + (c & 1);
                if (row < ex.ff && i < p1)
                    hb[(size_t)pk[i] * ex.ff + row] =
                        __bfloat16_as_ushort(__float2bfloat16_rn(moe_act(ex, e, row, acc[0][j][c], acc[1][j][c])));
            }
    }
}

// Down of group blockIdx.y's expert (rows as moe_tc_gu_kernel's) over its
// picks' bf16 activations: y[pick][row].
template <int KIND, int NI, bool PF>
__global__ void __launch_bounds__(TC_WARPS * 32)
    moe_tc_down_kernel(tcu_experts ex, const int32_t *meta, int G, const uint16_t *hb, float *y)
{
    pdl_wait();
    pdl_trigger();
    const meta_v mv{meta, G};
    const int g = blockIdx.y;
    if (g >= mv.groups())
        return;
    const int e = mv.expert(g), p0 = mv.start(g), p1 = mv.start(g + 1);
    const void *const *tab = ex.tab + (size_t)e * 6;
    const int lane = threadIdx.x & 31, gl = lane >> 2, q = lane & 3;
    const int r0 = (blockIdx.x * TC_WARPS + (threadIdx.x >> 5)) * 16;
    if (r0 >= ex.dim)
        return;
    const size_t rbytes = (size_t)ex.ff / 32 * tc_step_bytes<KIND>();
    constexpr bool qk = KIND != TCU_BF16;
    const int ra = min(r0 + gl, ex.dim - 1), rb = min(r0 + gl + 8, ex.dim - 1);
    const uint8_t *w_lo[1] = {(const uint8_t *)tab[2] + ra * rbytes}, *w_hi[1] = {(const uint8_t *)tab[2] + rb * rbytes};
    const void *s_lo[1] = {qk ? tc_scale_row<KIND>(tab[5], ra, ex.ff, ex.group) : nullptr},
               *s_hi[1] = {qk ? tc_scale_row<KIND>(tab[5], rb, ex.ff, ex.group) : nullptr};
    const int32_t *pk = mv.picks();
    for (int p = p0; p < p1; p += 8 * NI) {
        const void *xr[NI];
#pragma unroll
        for (int j = 0; j < NI; j++) {
            const int i = min(p + 8 * j + gl, p1 - 1);
            xr[j] = hb + (size_t)pk[i] * ex.ff;
        }
        float acc[1][NI][4];
        tc_tile<KIND, 1, NI, true, PF>(w_lo, w_hi, s_lo, s_hi, ex.ff, ex.group, xr, acc);
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int row = r0 + gl + (c >> 1) * 8, i = p + 8 * j + 2 * q + (c & 1);
                if (row < ex.dim && i < p1)
                    y[(size_t)pk[i] * ex.dim + row] = acc[0][j][c];
            }
    }
}

// x[t][r] += token t's picks' terms in expert-id order (sel is sorted by id
// per token), weighted - down_sum's arithmetic, a thread an element.
__global__ void __launch_bounds__(256)
    moe_tc_sum_kernel(tcu_experts ex, const float *y, const float *wt, const int32_t *sel, float *x, int T)
{
    pdl_wait();
    pdl_trigger();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * ex.dim)
        return;
    const int t = (int)(i / ex.dim), r = (int)(i % ex.dim), K = ex.n_used;
    float o = 0.0f;
    for (int k = 0; k < K; k++)
        o += moe_term(ex, y, wt, sel, (size_t)t * K + k, r);
    x[i] += o;
}

template <int KIND, int NI, bool PF>
int tc_launch_ni(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, int G, bool pdl,
                 cudaStream_t st)
{
    const dim3 blk(TC_WARPS * 32);
    uint16_t *hb = (uint16_t *)s.h; /* [T K][ff] bf16 in the f32 scratch's first half */
    int rc;
    {
        PROF(TCU_PROF_MOE_GU, st);
        rc = launch_pdl(pdl, moe_tc_gu_kernel<KIND, NI, PF>, dim3((e.ff + TC_ROWS - 1) / TC_ROWS, G), blk, 0, st, e,
                        (const int32_t *)s.meta, G, xn, hb);
    }
    if (rc)
        return rc;
    PROF(TCU_PROF_MOE_DOWN, st);
    rc = launch_pdl(pdl, moe_tc_down_kernel<KIND, NI, PF>, dim3((e.dim + TC_ROWS - 1) / TC_ROWS, G), blk, 0, st, e,
                    (const int32_t *)s.meta, G, (const uint16_t *)hb, s.y);
    if (rc)
        return rc;
    const size_t n = (size_t)T * e.dim;
    return launch_pdl(pdl, moe_tc_sum_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, st, e,
                      (const float *)s.y, (const float *)s.wt, (const int32_t *)s.sel, x, T);
}

// The token tile by the step's picks an expert (on average over the groups
// there can be: the token tile changes no bits).
template <int KIND, bool PF>
int tc_launch(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, bool pdl,
              cudaStream_t st)
{
    const int TK = T * e.n_used, G = e.n_expert < TK ? e.n_expert : TK, avg = (TK + G - 1) / G;
    if (avg <= 8)
        return tc_launch_ni<KIND, 1, PF>(e, s, xn, x, T, G, pdl, st);
    if (avg <= 16)
        return tc_launch_ni<KIND, 2, PF>(e, s, xn, x, T, G, pdl, st);
    return tc_launch_ni<KIND, 4, PF>(e, s, xn, x, T, G, pdl, st);
}

} // namespace

bool moe_tc_ok(const tcu_experts &e)
{
    if (e.dim % 32 || e.ff % 32)
        return false;
    if (e.kind == TCU_Q4)
        return (e.group == 32 || e.group == 64 || e.group == 128) && e.dim % e.group == 0 && e.ff % e.group == 0;
    return e.kind == TCU_BF16 || e.kind == TCU_MX4;
}

int moe_tc_launch(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, bool pdl,
                  int flags, cudaStream_t st)
{
    switch (e.kind) {
    case TCU_BF16:
        return flags & TCU_MOE_TC_PF ? tc_launch<TCU_BF16, true>(e, s, xn, x, T, pdl, st)
                                     : tc_launch<TCU_BF16, false>(e, s, xn, x, T, pdl, st);
    case TCU_Q4: return tc_launch<TCU_Q4, false>(e, s, xn, x, T, pdl, st);
    case TCU_MX4: return tc_launch<TCU_MX4, false>(e, s, xn, x, T, pdl, st);
    default: return (int)cudaErrorInvalidValue;
    }
}
