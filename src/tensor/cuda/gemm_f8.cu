// FP8 E4M3 products on tensor cores (mma.sync m16n8k32 e4m3, Hopper):
// the activations quantized per token and 128-input block (tcu_quant_f8),
// the weights as stored with their per-row block scales (TCU_F8), so a
// step reads one byte a weight whatever its tokens (docs/cuda.md, "FP8").
//
// Per (row, token): y = sum over the 128-input blocks c of
//   (ws[row][c] * xs[token][c]) * P_c,  P_c = the four 32-input mma steps
// of block c accumulated from zero,
// warp w of the block summing blocks c = w, w + 8, ... in order, then the
// 8 warps' sums added in warp order - an order fixed by the shape alone, so
// a token's result never depends on the batch (the mma's dot for one
// output element reads only that row and that column).
#include "tensor/cuda/common.cuh"

#define F8_WARPS 8
#define F8_ROWS 16 /* rows a block: one mma m-tile */
#define F8_NT 4    /* n-tiles a pass: 32 tokens */
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

// One warp a (token, 128-input block): scale = max|x| / 448 (1 for a zero
// block), codes = x / scale.
__global__ void quant_f8_kernel(const float *x, int T, int n_in, uint8_t *x8, float *xs)
{
    pdl_wait();
    pdl_trigger();
    const int nb = n_in / F8_KB, lane = threadIdx.x & 31;
    const long item = (long)blockIdx.x * (blockDim.x / WARP) + (threadIdx.x >> 5);
    if (item >= (long)T * nb)
        return;
    const long t = item / nb, c = item % nb;
    const float4 v = *reinterpret_cast<const float4 *>(x + t * n_in + c * F8_KB + lane * 4);
    float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float s = m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f;
    const uint32_t q = f8x2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)) | f8x2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)) << 16;
    *reinterpret_cast<uint32_t *>(x8 + t * n_in + c * F8_KB + lane * 4) = q;
    if (lane == 0)
        xs[t * nb + c] = s;
}

extern "C" int tcu_quant_f8(const float *x, int T, int n_in, uint8_t *x8, float *xs, const tcu_opts *o,
                            tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    if (n_in % F8_KB)
        return (int)cudaErrorInvalidValue;
    const long items = (long)T * (n_in / F8_KB);
    return launch_pdl(opts_or_default(o).pdl, quant_f8_kernel, dim3((unsigned)((items + 7) / 8)), dim3(256), 0,
                      (cudaStream_t)stream, x, T, n_in, x8, xs);
}

// Block b: rows 16b .. 16b + 15 for every token, F8_NT n-tiles a pass.
// Lane (g = lane / 4, q = lane % 4) loads bytes 8q .. 8q + 7 of each
// 32-input step for rows g and g + 8 (A) and for token g of each n-tile
// (B): the mma's k slots 4q .. 4q + 3 and 16 + 4q .. take inputs 8q ..
// 8q + 3 and 8q + 4 .. 8q + 7, the same for A and B, so the dot is over
// the step's 32 inputs.
__global__ void __launch_bounds__(F8_WARPS *WARP) f8_mm_kernel(const tcu_mat m, int n_in, const uint8_t *x8,
                                                               const float *xs, int T, int accumulate)
{
    __shared__ float red[F8_WARPS][F8_ROWS][F8_NT * 8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nb = n_in / F8_KB, ncol = (n_in + m.group - 1) / m.group;
    const int r0 = blockIdx.x * F8_ROWS;
    const int ra = r0 + g < m.n_out ? r0 + g : m.n_out - 1, rb = r0 + g + 8 < m.n_out ? r0 + g + 8 : m.n_out - 1;
    const uint8_t *wa = (const uint8_t *)m.w + (size_t)ra * n_in + 8 * q, *wb = (const uint8_t *)m.w + (size_t)rb * n_in + 8 * q;
    const float2 *sa = reinterpret_cast<const float2 *>(m.sb) + (size_t)ra * ncol;
    const float2 *sbr = reinterpret_cast<const float2 *>(m.sb) + (size_t)rb * ncol;
    /* the weights do not depend on an earlier kernel: the first block's
     * rows are requested before the wait */
    if (warp < nb)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wa + (size_t)warp * F8_KB));
    pdl_wait();
    pdl_trigger();
    for (int t0 = 0; t0 < T; t0 += F8_NT * 8) {
        float acc[F8_NT][4];
#pragma unroll
        for (int n = 0; n < F8_NT; n++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[n][j] = 0.0f;
        for (int c = warp; c < nb; c += F8_WARPS) {
            float blk[F8_NT][4];
#pragma unroll
            for (int n = 0; n < F8_NT; n++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    blk[n][j] = 0.0f;
            uint2 A[4][2];
#pragma unroll
            for (int s = 0; s < 4; s++) {
                A[s][0] = __ldcs(reinterpret_cast<const uint2 *>(wa + (size_t)c * F8_KB + 32 * s));
                A[s][1] = __ldcs(reinterpret_cast<const uint2 *>(wb + (size_t)c * F8_KB + 32 * s));
            }
#pragma unroll
            for (int n = 0; n < F8_NT; n++) {
                const int t = t0 + n * 8 + g;
                if (t0 + n * 8 >= T)
                    break;
                const uint2 *xb = reinterpret_cast<const uint2 *>(x8 + (size_t)(t < T ? t : T - 1) * n_in +
                                                                  (size_t)c * F8_KB + 8 * q);
#pragma unroll
                for (int s = 0; s < 4; s++) {
                    uint2 B = t < T ? __ldg(xb + 4 * s) : make_uint2(0, 0);
                    mma_e4m3(blk[n], A[s][0].x, A[s][1].x, A[s][0].y, A[s][1].y, B.x, B.y);
                }
            }
            const int sc = c * F8_KB / m.group;
            const float wsa = __ldg(sa + sc).x, wsb = __ldg(sbr + sc).x;
#pragma unroll
            for (int n = 0; n < F8_NT; n++) {
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
#pragma unroll
        for (int n = 0; n < F8_NT; n++) {
            red[warp][g][n * 8 + 2 * q] = acc[n][0];
            red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
            red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
            red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < F8_ROWS * F8_NT * 8; e += blockDim.x) {
            const int rr = e / (F8_NT * 8), tt = e % (F8_NT * 8);
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

extern "C" int tcu_f8_mm(const tcu_mat *m, int n_in, const uint8_t *x8, const float *xs, int T, int accumulate,
                         const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_GEMV, stream);
    if (m->kind != TCU_F8 || n_in % F8_KB || (m->group != n_in && m->group % F8_KB))
        return (int)cudaErrorInvalidValue;
    return launch_pdl(opts_or_default(o).pdl, f8_mm_kernel, dim3((unsigned)((m->n_out + F8_ROWS - 1) / F8_ROWS)),
                      dim3(F8_WARPS * WARP), 0, (cudaStream_t)stream, *m, n_in, x8, xs, T, accumulate);
}
