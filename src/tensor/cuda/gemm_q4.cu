// MLX affine 4-bit weights (TCU_Q4) times batches of tokens on the tensor
// cores (mma.sync m16n8k16 bf16): the throughput mode's products of steps
// of several sequences (docs/cuda.md, "4-bit at batch"). The stored layout
// is read as it is (codes 8 a uint32, low nibble first; the f32 {scale,
// bias} pairs per group), so the one-token kernels and the CPU keep
// reading the same bytes.
//
// Per (row, token): y = sum over the row's groups of
//   scale * P + bias * S,   P = sum of code * x over the group (the mma,
//   codes 0..15 as exact bf16, x the token's activations rounded once to
//   bf16), S = the sum of those rounded activations over the group
// (tcu_q4_prep computes S once per token and group, in a fixed order).
// The groups of a row are summed in `nch` contiguous chunks of 128-input
// blocks (nch from the launch's shape alone: q4_chunks), each chunk from
// zero, group after group as acc = fma(bias, S, fma(scale, P, acc)), then
// the chunk sums added in order - so the order of every (row, token) is
// fixed by the shape, never by T, the token tile or the tile
// configuration, and a token's result is the same bits alone and in any
// batch (the mma's output element (row, column) reads only that row of A
// and that column of B).
#include <cooperative_groups.h>

#include "tensor/cuda/common.cuh"

#define Q4_KS 128 /* inputs a block of a stage: 4 steps of 32 (two k16 mma each); groups of 32, 64 or 128 */

// mma.sync m16n8k16, bf16 inputs, f32 accumulation (PTX ISA, "Matrix
// fragments for mma.m16n8k16"; lane = 4 g + q, g = lane / 4, q = lane % 4):
//   A (16 x 16, row-major), 4 registers of two bf16 (lower k in the low
//   half): a0 = (row g, k 2q, 2q+1), a1 = (row g+8, k 2q, 2q+1),
//   a2 = (row g, k 2q+8, 2q+9), a3 = (row g+8, k 2q+8, 2q+9);
//   B (16 x 8, column-major): b0 = (k 2q, 2q+1, column g),
//   b1 = (k 2q+8, 2q+9, column g);
//   C / D (16 x 8, f32): c0 = (row g, column 2q), c1 = (row g, column 2q+1),
//   c2 = (row g+8, column 2q), c3 = (row g+8, column 2q+1).
// Which inputs the 16 k slots hold is ours to choose, the same for A and
// B: in a 32-input step lane q holds inputs 8q .. 8q + 7 (its code word q
// of the step: one 32-bit word a row) as the pairs (i, i + 4): the step's
// first mma takes pairs (0, 4) at k 2q, 2q+1 and (1, 5) at k 2q+8, 2q+9,
// its second (2, 6) and (3, 7) - the order the gemv_tc throughput mode
// uses, and the order tcu_q4_prep writes a token's 8 activations in.
__device__ __forceinline__ void q4_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Codes p and p + 4 of a word (nibbles p and p + 4) as two bf16 equal to
// the codes, exactly: 128 + q is the bf16 0x4300 | q (7 mantissa bits),
// less 128 in bf16 arithmetic (exact: a small integer).
__device__ __forceinline__ uint32_t q4_pair(uint32_t w, int p)
{
    const uint32_t u = ((w >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162 *>(&u);
    v = __hsub2(v, __floats2bfloat162_rn(128.0f, 128.0f));
    return *reinterpret_cast<const uint32_t *>(&v);
}

// A bf16 pair (lo, hi) of two floats, each rounded to nearest even.
__device__ __forceinline__ uint32_t q4_bf2(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

__device__ __forceinline__ float q4_rf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// ---- the activations: RMSNorm (optional), bf16 in fragment order, group sums ----
//
// One block a token. With g: r = 1 / sqrt(mean(x^2) + eps) (double sums
// in a fixed order), x * r * g as tcu_quant_f8 computes it, written to xn.
// Each 8 inputs become one 16-byte piece of xb, the pairs (i, i + 4) in
// order i = 0..3 (the mma's k order above); xsum [T][n_in / G] = each
// group's sum of the rounded values: the 8-value sums in order, then those
// of the group in order.
__global__ void __launch_bounds__(256) q4_prep_kernel(const float *x, const int32_t *rows, const float *g, float *xn,
                                                      float eps, int n_in, int G, uint16_t *xb, float *xsum)
{
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float *xr = x + (size_t)(g && rows ? rows[t] : t) * n_in;
    float r = 1.0f;
    if (g) {
        double ss = 0.0;
        for (int e = threadIdx.x; e < n_in; e += blockDim.x)
            ss += (double)xr[e] * xr[e];
        ss = block_sum_d(ss);
        r = (float)(1.0 / sqrt(ss / n_in + eps));
    }
    const int lg = G / 8; /* lanes a group (G divides 256: a warp's 256 inputs are whole groups) */
    for (int e0 = warp * 256; e0 < n_in; e0 += nw * 256) {
        const int e = e0 + 8 * lane;
        float4 v0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v1 = v0;
        if (e < n_in) {
            v0 = *reinterpret_cast<const float4 *>(xr + e);
            v1 = *reinterpret_cast<const float4 *>(xr + e + 4);
            if (g) {
                const float4 g0 = *reinterpret_cast<const float4 *>(g + e),
                             g1 = *reinterpret_cast<const float4 *>(g + e + 4);
                v0 = make_float4((v0.x * r) * g0.x, (v0.y * r) * g0.y, (v0.z * r) * g0.z, (v0.w * r) * g0.w);
                v1 = make_float4((v1.x * r) * g1.x, (v1.y * r) * g1.y, (v1.z * r) * g1.z, (v1.w * r) * g1.w);
                *reinterpret_cast<float4 *>(xn + (size_t)t * n_in + e) = v0;
                *reinterpret_cast<float4 *>(xn + (size_t)t * n_in + e + 4) = v1;
            }
            *reinterpret_cast<uint4 *>(xb + (size_t)t * n_in + e) =
                make_uint4(q4_bf2(v0.x, v1.x), q4_bf2(v0.y, v1.y), q4_bf2(v0.z, v1.z), q4_bf2(v0.w, v1.w));
        }
        float s8 = __fadd_rn(__fadd_rn(__fadd_rn(q4_rf(v0.x), q4_rf(v0.y)), q4_rf(v0.z)), q4_rf(v0.w));
        s8 = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(s8, q4_rf(v1.x)), q4_rf(v1.y)), q4_rf(v1.z)), q4_rf(v1.w));
        const int base = lane & ~(lg - 1);
        float sum = 0.0f;
        for (int k = 0; k < lg; k++)
            sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, s8, base + k));
        if (e < n_in && lane == base)
            xsum[(size_t)t * (n_in / G) + e / G] = sum;
    }
}

extern "C" int tcu_q4_mm_ok(int n_in, int group)
{
    return n_in > 0 && n_in % Q4_KS == 0 && (group == 32 || group == 64 || group == 128);
}

extern "C" int tcu_q4_prep(const float *x, const int32_t *rows, const float *g, float *xn, float eps, int T, int n_in,
                           int group, uint16_t *xb, float *xsum, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    if (!tcu_q4_mm_ok(n_in, group) || T < 1)
        return (int)cudaErrorInvalidValue;
    return launch_pdl(opts_or_default(o).pdl, q4_prep_kernel, dim3((unsigned)T), dim3(256), 0, (cudaStream_t)stream,
                      x, rows, g, xn, eps, n_in, group, xb, xsum);
}

// ---- the GEMM tile ----
//
// A block: BM = 16 MT WM weight rows by BN = 8 NT WN tokens, WM x WN warps
// of MT m-tiles by NT n-tiles; blockIdx.x the chunk of the inputs (a
// thread-block cluster of nch blocks along x when nch > 1, whose sums meet
// in distributed shared memory), blockIdx.y the row tile (of one of up to
// TCU_MM_MAX matrices), blockIdx.z the token tile. The chunk's 128-input
// blocks stream through shared memory in an ST-stage cp.async pipeline
// (SPS blocks a stage); each block holds the tile's codes [BM][64 bytes],
// activations [BN][256 bytes], {scale, bias} pairs [BM][128 / G] and group
// sums [BN][128 / G] (room for G = 32, the most of them). Rows past a
// matrix's end and tokens
// past T load the last one (their results are not stored).
struct q4_job {
    tcu_mat m[TCU_MM_MAX];
    int n;
    int tile0[TCU_MM_MAX + 1]; /* first row tile of each matrix; tile0[n] = the tiles */
};

template <int BM, int BN> struct q4_smem {
    static constexpr int A = 0;                 /* codes: [BM][4 pieces of 16 bytes], pieces swizzled */
    static constexpr int B = A + BM * 64;       /* activations: [BN][16 pieces of 16 bytes], swizzled */
    static constexpr int SB = B + BN * 256;     /* {scale, bias}: [BM][128 / G][2] floats (<= 32 bytes a row) */
    static constexpr int XS = SB + BM * 32;     /* group sums: [BN][128 / G] floats (<= 16 bytes a token) */
    static constexpr int STAGE = XS + BN * 16;  /* bytes a stage */
    static constexpr int RED = BN + 4;          /* the reduction's row stride (floats; banks spread) */
};

// Piece `c` (0-3) of row `r`'s codes: the pieces rotate by (r / 2) % 4, so
// the 32 lanes' word loads (rows g, q words of one piece) hit 32 banks.
__device__ __forceinline__ int q4_a_off(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }
// Piece `c` (0-15) of token `t`'s activations: odd tokens swap the 64-byte
// halves of each 128, so a quarter warp's 16-byte loads (tokens 2j, 2j + 1,
// pieces 4s + q) hit distinct banks.
__device__ __forceinline__ int q4_b_off(int t, int c) { return t * 256 + ((c ^ ((t & 1) << 2)) << 4); }

// cp.async of 4, 8 or 16 bytes (cache-all: the sizes below 16 need .ca).
__device__ __forceinline__ void q4_cp_small(void *smem, const void *gmem, int bytes)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(gmem) : "memory");
    else if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(gmem) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(gmem) : "memory");
}

// 16 bytes global -> shared, the L2 fetching the 256-byte block around it
// on a miss (the row's next stages: fewer, longer DRAM bursts).
__device__ __forceinline__ void q4_cp16_l2(void *smem, const void *gmem)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(gmem) : "memory");
}

// SPS: 128-input blocks a pipeline stage (1 or 2; the chunks stay in
// 128-input blocks, so the order of sums does not depend on it); PF: the
// weight copies ask the L2 for 256-byte blocks (q4_cp16_l2).
template <int WM, int WN, int MT, int NT, int ST, int SPS, int PF>
__global__ void __launch_bounds__(WM *WN *WARP, (WM * WN * WARP >= 256) ? 1 : 2)
    q4_gemm_kernel(const q4_job job, int n_in, int G, const uint16_t *xb, const float *xsum, int T, int accumulate,
                   int glu)
{
    namespace cg = cooperative_groups;
    constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN, NTH = WM * WN * WARP;
    using L = q4_smem<BM, BN>;
    extern __shared__ __align__(16) unsigned char q4s[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int nch = gridDim.x, ch = blockIdx.x, nst = n_in / Q4_KS;
    const int cs = (int)((long)ch * nst / nch), ce = (int)((long)(ch + 1) * nst / nch);
    const int nloc = (ce - cs + SPS - 1) / SPS; /* stages */
    /* the row tile's matrix (selected by unrolled compares: a parameter
     * array indexed at run time would be copied to local memory); glu: the
     * tile's first BM / 2 rows are gate's (m[0]) rows r0 .., the others
     * up's (m[1]) same rows */
    tcu_mat M = job.m[0];
    int tile0 = 0;
#pragma unroll
    for (int k = 1; k < TCU_MM_MAX; k++)
        if (!glu && k < job.n && (int)blockIdx.y >= job.tile0[k]) {
            M = job.m[k];
            tile0 = job.tile0[k];
        }
    const int HB = glu ? BM / 2 : BM; /* output rows of the tile */
    const int r0 = ((int)blockIdx.y - tile0) * HB, t0 = (int)blockIdx.z * BN;
    const int ng = n_in / G, gps = Q4_KS / G, spg = G / 32; /* groups a stage, 32-input steps a group */
    const int sbb = 8 * gps, xsb = 4 * gps;                 /* bytes a stage of a row's pairs, a token's sums */
    const size_t rowb = (size_t)n_in / 2;
    const uint8_t *w0 = (const uint8_t *)M.w, *w1 = (const uint8_t *)job.m[1].w;
    const float *sb0 = M.sb, *sb1 = job.m[1].sb;
    /* tile row -> its matrix row (past the end: the last one) */
    auto src_row = [&](int row, const uint8_t *&w, const float *&sb) {
        int r = r0 + row;
        w = w0;
        sb = sb0;
        if (glu && row >= HB) {
            r -= HB;
            w = w1;
            sb = sb1;
        }
        return r < M.n_out ? r : M.n_out - 1;
    };

    /* the weights' part of stage st into slot `slot` (no kernel writes them:
     * the first stages go out before the PDL wait) */
    auto load_w = [&](unsigned char *s, int st) {
#pragma unroll
        for (int i0 = 0; i0 < BM * 4; i0 += NTH) {
            const int i = i0 + tid;
            if (BM * 4 % NTH == 0 || i < BM * 4) {
                const int row = i >> 2, c = i & 3;
                const uint8_t *w;
                const float *sb;
                const int r = src_row(row, w, sb);
                if (PF)
                    q4_cp16_l2(s + L::A + q4_a_off(row, c), w + (size_t)r * rowb + (size_t)st * 64 + 16 * c);
                else
                    cp_async16(s + L::A + q4_a_off(row, c), w + (size_t)r * rowb + (size_t)st * 64 + 16 * c, 16);
            }
        }
        const int pc = sbb < 16 ? sbb : 16, np = sbb / pc; /* pieces a row */
        for (int i = tid; i < BM * np; i += NTH) {
            const int row = i / np, c = i % np;
            const uint8_t *w;
            const float *sb;
            const int r = src_row(row, w, sb);
            const unsigned char *src = (const unsigned char *)(sb + ((size_t)r * ng + (size_t)st * gps) * 2) + c * pc;
            if (PF && pc == 16)
                q4_cp16_l2(s + L::SB + row * 32 + c * pc, src);
            else
                q4_cp_small(s + L::SB + row * 32 + c * pc, src, pc);
        }
    };
    /* the activations' part (written by tcu_q4_prep: after the wait) */
    auto load_x = [&](unsigned char *s, int st) {
#pragma unroll
        for (int i0 = 0; i0 < BN * 16; i0 += NTH) {
            const int i = i0 + tid;
            if (BN * 16 % NTH == 0 || i < BN * 16) {
                const int tok = i >> 4, c = i & 15, t = t0 + tok < T ? t0 + tok : T - 1;
                cp_async16(s + L::B + q4_b_off(tok, c), xb + (size_t)t * n_in + (size_t)st * Q4_KS + 8 * c, 16);
            }
        }
        for (int i = tid; i < BN; i += NTH) {
            const int t = t0 + i < T ? t0 + i : T - 1;
            q4_cp_small(s + L::XS + i * 16, xsum + (size_t)t * ng + (size_t)st * gps, xsb);
        }
    };

    /* stage i into slot `slot`: its 128-input blocks (SPS, the last stage
     * of a chunk perhaps fewer) */
    auto stage_w = [&](int slot, int i) {
#pragma unroll
        for (int b = 0; b < SPS; b++)
            if (cs + i * SPS + b < ce)
                load_w(q4s + (size_t)(slot * SPS + b) * L::STAGE, cs + i * SPS + b);
    };
    auto stage_x = [&](int slot, int i) {
#pragma unroll
        for (int b = 0; b < SPS; b++)
            if (cs + i * SPS + b < ce)
                load_x(q4s + (size_t)(slot * SPS + b) * L::STAGE, cs + i * SPS + b);
    };
#pragma unroll
    for (int s = 0; s < ST - 1; s++)
        if (s < nloc)
            stage_w(s, s);
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nloc)
            stage_x(s, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }

    float acc[MT][NT][4], P[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = P[mi][ni][e] = 0.0f;

    for (int i = 0; i < nloc; i++) {
        if (i + ST - 1 < nloc) {
            stage_w((i + ST - 1) % ST, i + ST - 1);
            stage_x((i + ST - 1) % ST, i + ST - 1);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 1) : "memory");
        __syncthreads();
#pragma unroll
        for (int b = 0; b < SPS; b++) {
            if (cs + i * SPS + b >= ce)
                break;
            const unsigned char *s = q4s + (size_t)((i % ST) * SPS + b) * L::STAGE;
#pragma unroll
            for (int st = 0; st < Q4_KS / 32; st++) {
                if (st % spg == 0) /* a group starts: its P from zero */
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < NT; ni++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                P[mi][ni][e] = 0.0f;
                uint32_t A[MT][2][4]; /* [m-tile][row g, g + 8][pairs (0,4) (1,5) (2,6) (3,7)] */
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = (wm * MT + mi) * 16 + g + 8 * h;
                        const uint32_t w = *reinterpret_cast<const uint32_t *>(s + L::A + q4_a_off(row, st) + 4 * q);
#pragma unroll
                        for (int p = 0; p < 4; p++)
                            A[mi][h][p] = q4_pair(w, p);
                    }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const int tok = (wn * NT + ni) * 8 + g;
                    const uint4 xv = *reinterpret_cast<const uint4 *>(s + L::B + q4_b_off(tok, 4 * st + q));
#pragma unroll
                    for (int mi = 0; mi < MT; mi++) {
                        q4_mma(P[mi][ni], A[mi][0][0], A[mi][1][0], A[mi][0][1], A[mi][1][1], xv.x, xv.y);
                        q4_mma(P[mi][ni], A[mi][0][2], A[mi][1][2], A[mi][0][3], A[mi][1][3], xv.z, xv.w);
                    }
                }
                if (st % spg == spg - 1) { /* the group ends: acc = fma(bias, S, fma(scale, P, acc)) */
                    const int gl = st / spg;
                    float2 sv[MT][2];
                    float xv[NT][2];
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            sv[mi][h] = *reinterpret_cast<const float2 *>(
                                s + L::SB + ((wm * MT + mi) * 16 + g + 8 * h) * 32 + 8 * gl);
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int j = 0; j < 2; j++)
                            xv[ni][j] = *reinterpret_cast<const float *>(
                                s + L::XS + ((wn * NT + ni) * 8 + 2 * q + j) * 16 + 4 * gl);
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
#pragma unroll
                        for (int ni = 0; ni < NT; ni++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                acc[mi][ni][e] = fmaf(sv[mi][e >> 1].y, xv[ni][e & 1],
                                                      fmaf(sv[mi][e >> 1].x, P[mi][ni][e], acc[mi][ni][e]));
                }
            }
        }
        __syncthreads(); /* the slot is refilled next */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

    if (nch == 1 && !glu) { /* one chunk: its sum is the row's */
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + (wm * MT + mi) * 16 + g + 8 * h;
                if (r >= M.n_out)
                    continue;
#pragma unroll
                for (int ni = 0; ni < NT; ni++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int t = t0 + (wn * NT + ni) * 8 + 2 * q + j;
                        if (t >= T)
                            continue;
                        float *y = M.y + (size_t)t * M.n_out + r;
                        const float v = acc[mi][ni][2 * h + j];
                        *y = accumulate ? *y + v : v;
                    }
            }
        return;
    }
    /* each block's sums into its shared memory; then (chunks of a cluster)
     * block `ch` adds rows [ch HB / nch, (ch + 1) HB / nch) of every
     * block's in chunk order; glu: act(gate) * up of the two halves */
    float *red = reinterpret_cast<float *>(q4s);
    __syncthreads(); /* every warp is done with the stages */
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[((wm * MT + mi) * 16 + g + 8 * (e >> 1)) * L::RED + (wn * NT + ni) * 8 + 2 * q + (e & 1)] =
                    acc[mi][ni][e];
    if (nch > 1)
        cg::this_cluster().sync();
    else
        __syncthreads();
    auto total = [&](int idx) {
        if (nch == 1)
            return red[idx];
        cg::cluster_group cl = cg::this_cluster();
        float v = 0.0f;
        for (int c = 0; c < nch; c++) {
            const float part = cl.map_shared_rank(red, c)[idx];
            v = c ? __fadd_rn(v, part) : part;
        }
        return v;
    };
    const int ra = ch * HB / nch, rb = (ch + 1) * HB / nch;
    for (int i = tid; i < (rb - ra) * BN; i += NTH) {
        const int row = ra + i / BN, tok = i % BN, r = r0 + row, t = t0 + tok;
        if (r >= M.n_out || t >= T)
            continue;
        float v = total(row * L::RED + tok);
        float *y = M.y + (size_t)t * M.n_out + r;
        if (glu)
            *y = (glu == 2 ? gelu_f(v) : silu_f(v)) * total((row + HB) * L::RED + tok);
        else
            *y = accumulate ? *y + v : v;
    }
    if (nch > 1)
        cg::this_cluster().sync(); /* the others have read this block's sums */
}

// Chunks of the inputs (a power of two, at most 8) from the launch's shape
// alone: split while 64-row tiles are fewer than two a multiprocessor and
// each chunk keeps at least 8 stages (1024 inputs) - 8B shapes: q/k/v 4, o
// 4, down 8, gate/up and lm_head 1.
static int q4_chunks(long rows, int n_in)
{
    const long tiles = (rows + 63) / 64;
    const int nst = n_in / Q4_KS;
    int nch = 1;
    while (nch < 8 && tiles * nch < 2L * sm_count() && nst / (2 * nch) >= 8)
        nch *= 2;
    return nch;
}

template <int WM, int WN, int MT, int NT, int ST, int SPS, int PF>
static int q4_launch(const tcu_mat *m, int n, int n_in, const uint16_t *xb, const float *xsum, int T, int accumulate,
                     int glu, int nch, bool pdl, cudaStream_t s)
{
    constexpr int BM = 16 * MT * WM, BN = 8 * NT * WN;
    using L = q4_smem<BM, BN>;
    constexpr size_t smem_pipe = (size_t)ST * SPS * L::STAGE, smem_red = (size_t)BM * L::RED * sizeof(float);
    constexpr size_t smem_max = smem_pipe > smem_red ? smem_pipe : smem_red;
    static bool attr_set = false;
    if (!attr_set) {
        const int rc = (int)cudaFuncSetAttribute(q4_gemm_kernel<WM, WN, MT, NT, ST, SPS, PF>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_max);
        if (rc)
            return rc;
        attr_set = true;
    }
    q4_job job;
    memset(&job, 0, sizeof job);
    job.n = n;
    for (int k = 0; k < n; k++) {
        job.m[k] = m[k];
        job.tile0[k + 1] = job.tile0[k] + (m[k].n_out + BM - 1) / BM;
    }
    if (glu) /* gate's rows and up's in each tile: half a tile of each */
        job.tile0[1] = job.tile0[n] = (m[0].n_out + BM / 2 - 1) / (BM / 2);
    const size_t smem = nch > 1 || glu ? smem_max : smem_pipe;
    const dim3 grid((unsigned)nch, (unsigned)job.tile0[n], (unsigned)((T + BN - 1) / BN));
    return launch_cl(pdl, nch > 1 ? (unsigned)nch : 0u, q4_gemm_kernel<WM, WN, MT, NT, ST, SPS, PF>, grid,
                     dim3(WM * WN * WARP), smem, s, job, n_in, m[0].group, xb, xsum, T, accumulate, glu);
}

// The tile configurations (tcu_opts.q4_tile; every one gives the same
// bits): WM x WN warps of MT x NT mma tiles (BM rows x BN tokens), ST
// stages of SPS 128-input blocks, PF: weight copies ask for 256-byte L2 blocks.
#define Q4_TILES 24
struct q4_cfg {
    int wm, wn, mt, nt, st, sps, pf;
};
static constexpr q4_cfg q4_cfgs[Q4_TILES + 1] = {
    {0, 0, 0, 0, 0, 0, 0}, /* 0: by T (q4_tile_of) */
    {4, 1, 1, 1, 4, 1, 0}, /*  1: 64 x 8 */
    {4, 1, 1, 2, 4, 1, 0}, /*  2: 64 x 16 */
    {2, 2, 2, 2, 4, 1, 0}, /*  3: 64 x 32 */
    {4, 2, 2, 4, 3, 1, 0}, /*  4: 128 x 64 */
    {4, 2, 2, 8, 3, 1, 0}, /*  5: 128 x 128 */
    {2, 2, 2, 4, 3, 1, 0}, /*  6: 64 x 64 */
    {2, 2, 2, 8, 3, 1, 0}, /*  7: 64 x 128 */
    {4, 1, 1, 4, 4, 1, 0}, /*  8: 64 x 32 */
    {8, 1, 1, 1, 4, 1, 0}, /*  9: 128 x 8 */
    {4, 2, 2, 8, 4, 1, 0}, /* 10: 128 x 128, 4 stages */
    {4, 1, 2, 1, 4, 1, 0}, /* 11: 128 x 8, two m-tiles a warp */
    {4, 1, 2, 2, 4, 1, 0}, /* 12: 128 x 16 */
    {4, 1, 1, 1, 6, 1, 0}, /* 13: 64 x 8, 6 stages */
    {2, 2, 4, 4, 3, 1, 0}, /* 14: 128 x 64, 4 warps of 64 x 32 */
    {4, 2, 1, 8, 3, 1, 0}, /* 15: 64 x 128, 8 warps of 16 x 64 */
    {8, 1, 1, 4, 3, 1, 0}, /* 16: 128 x 32, 8 warps of 16 x 32 */
    {4, 1, 1, 1, 4, 1, 1}, /* 17: 1 with 256-byte L2 blocks */
    {4, 1, 1, 1, 3, 2, 1}, /* 18: 17 with 256-input stages */
    {4, 1, 1, 2, 4, 1, 1}, /* 19: 2, L2 blocks */
    {4, 1, 1, 2, 3, 2, 1}, /* 20: 19, 256-input stages */
    {4, 1, 1, 4, 4, 1, 1}, /* 21: 8, L2 blocks */
    {4, 1, 1, 4, 3, 2, 1}, /* 22: 21, 256-input stages */
    {2, 2, 2, 4, 3, 1, 1}, /* 23: 6, L2 blocks */
    {4, 2, 2, 8, 3, 1, 1}, /* 24: 5, L2 blocks */
};

// 0 (the default) picks by T and rows, the best of the first measured
// configurations (H200, 8B shapes, bench_cuda --q4): 1 up to 8 tokens, 2
// up to 16, 8 up to 32, 6 up to 64; above, 5 for launches of 8192+ rows
// (gate/up, lm_head), else 6.
static int q4_tile_of(int T, long rows, int forced)
{
    if (forced >= 1 && forced <= Q4_TILES)
        return forced;
    return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 8 : T <= 64 ? 6 : rows >= 8192 ? 5 : 6;
}

#define Q4_CASE(k)                                                                                                     \
    case k:                                                                                                            \
        return q4_launch<q4_cfgs[k].wm, q4_cfgs[k].wn, q4_cfgs[k].mt, q4_cfgs[k].nt, q4_cfgs[k].st, q4_cfgs[k].sps,   \
                         q4_cfgs[k].pf>(                                                                               \
            m, n, n_in, xb, xsum, T, accumulate, glu, nch, pdl, s)

extern "C" int tcu_q4_mm(int n, const tcu_mat *m, int n_in, const uint16_t *xb, const float *xsum, int T,
                         int accumulate, int glu, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_GEMV, stream);
    if (n < 1 || n > TCU_MM_MAX || T < 1 || !tcu_q4_mm_ok(n_in, m[0].group) || glu < 0 || glu > 2 ||
        (glu && (n != 2 || accumulate || m[1].n_out != m[0].n_out)))
        return (int)cudaErrorInvalidValue;
    long rows = 0;
    for (int k = 0; k < n; k++) {
        if (m[k].kind != TCU_Q4 || m[k].group != m[0].group || m[k].n_out < 1)
            return (int)cudaErrorInvalidValue;
        rows += m[k].n_out;
    }
    const tcu_opts &op = opts_or_default(o);
    const bool pdl = op.pdl != 0;
    int nch = q4_chunks(rows, n_in);
    if (op.q4_split == 1 || op.q4_split == 2 || op.q4_split == 4 || op.q4_split == 8) /* measurements: other bits */
        nch = op.q4_split <= n_in / Q4_KS ? op.q4_split : nch;
    const cudaStream_t s = (cudaStream_t)stream;
    switch (q4_tile_of(T, rows, op.q4_tile)) {
        Q4_CASE(1);
        Q4_CASE(2);
        Q4_CASE(3);
        Q4_CASE(4);
        Q4_CASE(5);
        Q4_CASE(6);
        Q4_CASE(7);
        Q4_CASE(8);
        Q4_CASE(9);
        Q4_CASE(10);
        Q4_CASE(11);
        Q4_CASE(12);
        Q4_CASE(13);
        Q4_CASE(14);
        Q4_CASE(15);
        Q4_CASE(16);
        Q4_CASE(17);
        Q4_CASE(18);
        Q4_CASE(19);
        Q4_CASE(20);
        Q4_CASE(21);
        Q4_CASE(22);
        Q4_CASE(23);
        Q4_CASE(24);
    default:
        return (int)cudaErrorInvalidValue;
    }
}
