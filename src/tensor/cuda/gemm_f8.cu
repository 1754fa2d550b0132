// FP8 E4M3 products on tensor cores (mma.sync m16n8k32 e4m3, Hopper):
// the activations quantized per token and 128-input block (tcu_quant_f8),
// the weights as stored with their per-row block scales (TCU_F8), so a
// step reads one byte a weight whatever its tokens (docs/cuda.md, "FP8").
//
// Per (row, token): y = sum over the 128-input blocks c of
//   (ws[row][c] * xs[token][c]) * P_c,  P_c = the four 32-input mma steps
// of block c accumulated from zero, summed in 8 contiguous chunks of
// blocks, each in order from zero, then the chunk sums in order - an order
// fixed by the shape alone, in both kernels below, so a token's result
// never depends on the batch (the mma's dot for one output element reads
// only that row and that column).
#include "tensor/cuda/common.cuh"

#define F8_WARPS 8
#define F8_ROWS 16 /* rows a block: one mma m-tile */
#define F8_KB 128  /* activation block */

__device__ __forceinline__ void mma_e4m3(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two f32 to two E4M3 (round to nearest even, saturating), lo in the low byte.
__device__ __forceinline__ uint32_t f8x2(float lo, float hi)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// One block a token: the fused RMSNorm first when g is given (the sums and
// products of rmsnorm_kernel; the normed row also written to xn), then warp
// w quantizes the 128-input blocks w, w + 8, ...: scale = max|x| / 448 (1
// for a zero block), codes = x / scale.
__global__ void __launch_bounds__(256) quant_f8_kernel(const float *x, const int32_t *rows, const float *g, float *xn,
                                                       float eps, int n_in, uint8_t *x8, float *xs)
{
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, nb = n_in / F8_KB, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *xr = x + (size_t)(g && rows ? rows[t] : t) * n_in;
    float r = 1.0f;
    if (g) {
        double ss = 0.0;
        for (int e = threadIdx.x; e < n_in; e += blockDim.x)
            ss += (double)xr[e] * xr[e];
        ss = block_sum_d(ss);
        r = (float)(1.0 / sqrt(ss / n_in + eps));
    }
    for (int c = warp; c < nb; c += blockDim.x / WARP) {
        const int k = c * F8_KB + lane * 4;
        float4 v = *reinterpret_cast<const float4 *>(xr + k);
        if (g) {
            const float4 gv = *reinterpret_cast<const float4 *>(g + k);
            v = make_float4((v.x * r) * gv.x, (v.y * r) * gv.y, (v.z * r) * gv.z, (v.w * r) * gv.w);
            *reinterpret_cast<float4 *>(xn + (size_t)t * n_in + k) = v;
        }
        float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
        *reinterpret_cast<uint32_t *>(x8 + (size_t)t * n_in + k) =
            f8x2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)) | f8x2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)) << 16;
        if (lane == 0)
            xs[(size_t)t * nb + c] = s;
    }
}

extern "C" int tcu_quant_f8(const float *x, const int32_t *rows, const float *g, float *xn, float eps, int T,
                            int n_in, uint8_t *x8, float *xs, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    if (n_in % F8_KB)
        return (int)cudaErrorInvalidValue;
    return launch_pdl(opts_or_default(o).pdl, quant_f8_kernel, dim3((unsigned)T), dim3(256), 0, (cudaStream_t)stream,
                      x, rows, g, xn, eps, n_in, x8, xs);
}

// The 128-input blocks of a row are summed in 8 contiguous chunks: chunk w
// is blocks [w nb / 8, (w + 1) nb / 8), each summed in order from zero,
// and the 8 chunk sums added in order - the order of every kernel below,
// whatever the tokens, so a token's bits never depend on its batch.
__device__ __forceinline__ int f8_chunk(int w, int nb) { return w * nb / F8_WARPS; }

// Small steps (up to 8 tokens): block b, rows 16b .. 16b + 15, warp w the
// chunk w. Lane (g = lane / 4, q = lane % 4) loads bytes 16q .. 16q + 15 of
// each 64 inputs for rows g and g + 8 (A) and for token g of each n-tile
// (B); of those, bytes 0-3 / 4-7 feed the first 32-input mma's k slots 4q
// .. and 16 + 4q .., bytes 8-11 / 12-15 the second's - the same for A and
// B, so each mma is a dot over 32 distinct inputs. A warp loads two
// blocks (c and c + 1) before its products, the next pair in flight.
template <int NT>
__global__ void __launch_bounds__(F8_WARPS *WARP) f8_mm_kernel(const tcu_mat m, int n_in, const uint8_t *x8,
                                                               const float *xs, int T, int accumulate)
{
    __shared__ float red[F8_WARPS][F8_ROWS][NT * 8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nb = n_in / F8_KB, ncol = (n_in + m.group - 1) / m.group;
    const int cb = f8_chunk(warp, nb), ce = f8_chunk(warp + 1, nb);
    const int r0 = blockIdx.x * F8_ROWS;
    const int ra = r0 + g < m.n_out ? r0 + g : m.n_out - 1, rb = r0 + g + 8 < m.n_out ? r0 + g + 8 : m.n_out - 1;
    const uint8_t *wa = (const uint8_t *)m.w + (size_t)ra * n_in + 16 * q;
    const uint8_t *wb = (const uint8_t *)m.w + (size_t)rb * n_in + 16 * q;
    const float2 *sa = reinterpret_cast<const float2 *>(m.sb) + (size_t)ra * ncol;
    const float2 *sbr = reinterpret_cast<const float2 *>(m.sb) + (size_t)rb * ncol;
    /* the weights do not depend on an earlier kernel: request the first
     * blocks before the wait */
    uint4 A[2][2][2], An[2][2][2]; /* [block of the pair][64-input half][row g, g + 8]; the next pair */
    auto load_a = [&](uint4(&A)[2][2][2], int c0) {
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int c = c0 + b;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                A[b][h][0] = c < ce ? __ldcs(reinterpret_cast<const uint4 *>(wa + (size_t)c * F8_KB + 64 * h))
                                    : make_uint4(0, 0, 0, 0);
                A[b][h][1] = c < ce ? __ldcs(reinterpret_cast<const uint4 *>(wb + (size_t)c * F8_KB + 64 * h))
                                    : make_uint4(0, 0, 0, 0);
            }
        }
    };
    load_a(A, cb);
    bool have_a = true;
    pdl_wait();
    pdl_trigger();
    for (int t0 = 0; t0 < T; t0 += NT * 8) {
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[n][j] = 0.0f;
        for (int c0 = cb; c0 < ce; c0 += 2) {
            if (!have_a)
                load_a(A, c0);
            have_a = false;
            if (c0 + 2 < ce) /* the next pair's weights in flight during these products */
                load_a(An, c0 + 2);
            uint4 B[2][NT][2];
#pragma unroll
            for (int b = 0; b < 2; b++)
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const int c = c0 + b, t = t0 + n * 8 + g;
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        B[b][n][h] = c < ce && t < T ? __ldg(reinterpret_cast<const uint4 *>(
                                                           x8 + (size_t)t * n_in + (size_t)c * F8_KB + 64 * h + 16 * q))
                                                     : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int b = 0; b < 2; b++) {
                const int c = c0 + b;
                if (c >= ce)
                    break;
                float blk[NT][4];
#pragma unroll
                for (int n = 0; n < NT; n++) {
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        blk[n][j] = 0.0f;
                    if (t0 + n * 8 >= T)
                        continue;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint4 a0 = A[b][h][0], a1 = A[b][h][1], bb = B[b][n][h];
                        mma_e4m3(blk[n], a0.x, a1.x, a0.y, a1.y, bb.x, bb.y);
                        mma_e4m3(blk[n], a0.z, a1.z, a0.w, a1.w, bb.z, bb.w);
                    }
                }
                const int sc = c * F8_KB / m.group;
                const float wsa = __ldg(sa + sc).x, wsb = __ldg(sbr + sc).x;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const int t = t0 + n * 8 + 2 * q;
                    if (t0 + n * 8 >= T)
                        break;
                    const float x0 = t < T ? __ldg(xs + (size_t)t * nb + c) : 0.0f;
                    const float x1 = t + 1 < T ? __ldg(xs + (size_t)(t + 1) * nb + c) : 0.0f;
                    acc[n][0] = fmaf(__fmul_rn(wsa, x0), blk[n][0], acc[n][0]);
                    acc[n][1] = fmaf(__fmul_rn(wsa, x1), blk[n][1], acc[n][1]);
                    acc[n][2] = fmaf(__fmul_rn(wsb, x0), blk[n][2], acc[n][2]);
                    acc[n][3] = fmaf(__fmul_rn(wsb, x1), blk[n][3], acc[n][3]);
                }
            }
            if (c0 + 2 < ce) {
#pragma unroll
                for (int b = 0; b < 2; b++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        A[b][h][0] = An[b][h][0];
                        A[b][h][1] = An[b][h][1];
                    }
                have_a = true;
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            red[warp][g][n * 8 + 2 * q] = acc[n][0];
            red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
            red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
            red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < F8_ROWS * NT * 8; e += blockDim.x) {
            const int rr = e / (NT * 8), tt = e % (NT * 8);
            if (r0 + rr >= m.n_out || t0 + tt >= T)
                continue;
            float v = red[0][rr][tt];
#pragma unroll
            for (int w = 1; w < F8_WARPS; w++)
                v = __fadd_rn(v, red[w][rr][tt]);
            float *y = m.y + (size_t)(t0 + tt) * m.n_out + r0 + rr;
            *y = accumulate ? *y + v : v;
        }
        __syncthreads();
    }
}

// Wider steps: a GEMM tile of 64 rows x 64 tokens a block (4 warps of 32 x
// 32), the 128-input blocks through shared memory in a 3-stage cp.async
// pipeline. Each (row, token) is summed by one thread in the order above:
// a block's 4 mma steps from zero with the same k slots as f8_mm_kernel
// (the bytes of the two kernels' fragments are the same), scaled into the
// chunk's sum, the chunk sums added in order - so the tile gives the small
// kernel's bits and a threshold on T keeps batch invariance.
#define F8T_ROWS 64
#define F8T_TOK 64
#define F8T_STAGES 3
#define F8T_SMEM (F8T_STAGES * (F8T_ROWS + F8T_TOK) * F8_KB) /* 48 KB: no opt-in needed */

// Byte offset of 16-byte piece `part` (0-7) of shared row `row`: odd rows
// swap the halves, so the 8 lanes of a quarter warp (rows g, g + 1, pieces
// q or 4 + q) read 8 different bank groups.
__device__ __forceinline__ int f8t_off(int row, int part) { return row * F8_KB + ((part ^ ((row & 1) << 2)) << 4); }

__global__ void __launch_bounds__(128) f8_tile_kernel(const tcu_mat m, int n_in, const uint8_t *x8, const float *xs,
                                                      int T, int accumulate)
{
    extern __shared__ __align__(16) uint8_t f8t_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;
    const int nb = n_in / F8_KB, ncol = (n_in + m.group - 1) / m.group;
    const int t0 = blockIdx.x * F8T_TOK, r0 = blockIdx.y * F8T_ROWS;
    /* stage s: A rows at s * (ROWS + TOK) * LD, B tokens after them */
    auto stage_a = [&](int s) { return f8t_smem + (size_t)s * (F8T_ROWS + F8T_TOK) * F8_KB; };
    auto stage_b = [&](int s) { return stage_a(s) + F8T_ROWS * F8_KB; };
    /* 128 threads copy a block's 64 x 128 weight bytes and 64 x 128 input
     * bytes, 16 a copy: 4 + 4 each; rows and tokens past the end read the
     * last one (their results are not stored) */
    auto load_stage = [&](int s, int c) {
        uint8_t *sa = stage_a(s), *sbb = stage_b(s);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int e = threadIdx.x + 128 * i, row = e >> 3, part = e & 7;
            const int r = r0 + row < m.n_out ? r0 + row : m.n_out - 1;
            cp_async16(sa + f8t_off(row, part), (const uint8_t *)m.w + (size_t)r * n_in + (size_t)c * F8_KB + 16 * part,
                       16);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int e = threadIdx.x + 128 * i, tok = e >> 3, part = e & 7;
            const int t = t0 + tok < T ? t0 + tok : T - 1;
            cp_async16(sbb + f8t_off(tok, part), x8 + (size_t)t * n_in + (size_t)c * F8_KB + 16 * part, 16);
        }
    };
    pdl_wait();
    pdl_trigger();
    float tot[2][4][4], tmp[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                tot[i][n][j] = tmp[i][n][j] = 0.0f;
    int rows[2][2], toks[4][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + wm * 32 + i * 16 + g + 8 * h;
            rows[i][h] = r < m.n_out ? r : m.n_out - 1;
        }
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = t0 + wn * 32 + n * 8 + 2 * q + j;
            toks[n][j] = t < T ? t : T - 1;
        }
#pragma unroll
    for (int s = 0; s < F8T_STAGES - 1; s++) {
        if (s < nb)
            load_stage(s, s);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    int w = 0, wend = f8_chunk(1, nb);
    while (w < F8_WARPS && wend == 0) { /* empty leading chunks: sums of zero */
        w++;
        wend = f8_chunk(w + 1, nb);
    }
    for (int c = 0; c < nb; c++) {
        if (c + F8T_STAGES - 1 < nb)
            load_stage((c + F8T_STAGES - 1) % F8T_STAGES, c + F8T_STAGES - 1);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group %0;" ::"n"(F8T_STAGES - 1) : "memory");
        __syncthreads();
        const uint8_t *sa = stage_a(c % F8T_STAGES), *sbb = stage_b(c % F8T_STAGES);
        float blk[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    blk[i][n][j] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 a[2][2], b[4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                a[i][0] = *reinterpret_cast<const uint4 *>(sa + f8t_off(wm * 32 + i * 16 + g, 4 * h + q));
                a[i][1] = *reinterpret_cast<const uint4 *>(sa + f8t_off(wm * 32 + i * 16 + g + 8, 4 * h + q));
            }
#pragma unroll
            for (int n = 0; n < 4; n++)
                b[n] = *reinterpret_cast<const uint4 *>(sbb + f8t_off(wn * 32 + n * 8 + g, 4 * h + q));
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    mma_e4m3(blk[i][n], a[i][0].x, a[i][1].x, a[i][0].y, a[i][1].y, b[n].x, b[n].y);
                    mma_e4m3(blk[i][n], a[i][0].z, a[i][1].z, a[i][0].w, a[i][1].w, b[n].z, b[n].w);
                }
        }
        const int sc = c * F8_KB / m.group;
        float ws[2][2], xv[4][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                ws[i][h] = __ldg(reinterpret_cast<const float2 *>(m.sb) + (size_t)rows[i][h] * ncol + sc).x;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                xv[n][j] = __ldg(xs + (size_t)toks[n][j] * nb + c);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int n = 0; n < 4; n++) {
                tmp[i][n][0] = fmaf(__fmul_rn(ws[i][0], xv[n][0]), blk[i][n][0], tmp[i][n][0]);
                tmp[i][n][1] = fmaf(__fmul_rn(ws[i][0], xv[n][1]), blk[i][n][1], tmp[i][n][1]);
                tmp[i][n][2] = fmaf(__fmul_rn(ws[i][1], xv[n][0]), blk[i][n][2], tmp[i][n][2]);
                tmp[i][n][3] = fmaf(__fmul_rn(ws[i][1], xv[n][1]), blk[i][n][3], tmp[i][n][3]);
            }
        if (c + 1 == wend) { /* chunk w done (and any empty ones after it): into the total, in order */
            do {
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int n = 0; n < 4; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            tot[i][n][j] = w == 0 ? tmp[i][n][j] : __fadd_rn(tot[i][n][j], tmp[i][n][j]);
                            tmp[i][n][j] = 0.0f;
                        }
                w++;
                wend = w < F8_WARPS ? f8_chunk(w + 1, nb) : nb + 1;
            } while (w < F8_WARPS && wend == c + 1);
        }
        __syncthreads(); /* the stage is refilled next */
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + wm * 32 + i * 16 + g + 8 * h;
            if (r >= m.n_out)
                continue;
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int t = t0 + wn * 32 + n * 8 + 2 * q + j;
                    if (t >= T)
                        continue;
                    float *y = m.y + (size_t)t * m.n_out + r;
                    const float v = tot[i][n][2 * h + j];
                    *y = accumulate ? *y + v : v;
                }
        }
}

extern "C" int tcu_f8_mm(const tcu_mat *m, int n_in, const uint8_t *x8, const float *xs, int T, int accumulate,
                         const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_GEMV, stream);
    if (m->kind != TCU_F8 || n_in % F8_KB || (m->group != n_in && m->group % F8_KB))
        return (int)cudaErrorInvalidValue;
    const bool pdl = opts_or_default(o).pdl != 0;
    /* up to 64 tokens: a warp per chunk over 16 rows (8 or 32 tokens a
     * pass); more: the GEMM tile, whose 64-row blocks are too few below
     * that (H200, 8B shapes: b32 2,459 tok/s on the warps, 2,033 on the
     * tile; b128 2,837 and 5,464). All give the same bits. */
    if (T <= 64) {
        const dim3 grid((unsigned)((m->n_out + F8_ROWS - 1) / F8_ROWS)), block(F8_WARPS * WARP);
        return T <= 8 ? launch_pdl(pdl, f8_mm_kernel<1>, grid, block, 0, (cudaStream_t)stream, *m, n_in, x8, xs, T,
                                   accumulate)
                      : launch_pdl(pdl, f8_mm_kernel<4>, grid, block, 0, (cudaStream_t)stream, *m, n_in, x8, xs, T,
                                   accumulate);
    }
    const dim3 grid((unsigned)((T + F8T_TOK - 1) / F8T_TOK), (unsigned)((m->n_out + F8T_ROWS - 1) / F8T_ROWS));
    return launch_pdl(pdl, f8_tile_kernel, grid, dim3(128), F8T_SMEM, (cudaStream_t)stream, *m, n_in, x8, xs, T,
                      accumulate);
}
