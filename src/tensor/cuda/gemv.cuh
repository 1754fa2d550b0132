// Shared by the GEMV kernel files (gemv.cu, gemv_tc.cu, gemv_ring.cu):
// weight-chunk arithmetic, the fused RMSNorm's factors.
#pragma once
#include "tensor/cuda/common.cuh"

// One 16-byte chunk of a weight row, by kind: values per chunk and the
// dot of those values with NV consecutive inputs x (with the quantized
// scale/bias applied per chunk: a chunk never straddles a group).
template <int KIND> struct chunk_traits;
template <> struct chunk_traits<TCU_F32> { static constexpr int NV = 4; };
template <> struct chunk_traits<TCU_BF16> { static constexpr int NV = 8; };
template <> struct chunk_traits<TCU_F16> { static constexpr int NV = 8; };
template <> struct chunk_traits<TCU_Q4> { static constexpr int NV = 32; };
template <> struct chunk_traits<TCU_Q8> { static constexpr int NV = 16; };
template <> struct chunk_traits<TCU_F8> { static constexpr int NV = 16; };
/* internal kind: 4-bit codes converted as 1 + q/16 (see chunk_dot_v) */
#define TCU_Q4F 100
template <> struct chunk_traits<TCU_Q4F> { static constexpr int NV = 32; };

// The matrix of a fused launch's output row gr (a row past the last
// matrix's is taken as the last's); *off = the rows of the matrices before.
__device__ __forceinline__ int gv_mat_of(const tcu_gemv_args &a, long gr, long *off)
{
    int k = 0;
    *off = 0;
    while (k < a.n - 1 && gr >= *off + a.m[k].n_out) {
        *off += a.m[k].n_out;
        k++;
    }
    return k;
}

// Output rows of a launch: a gate/up pair (glu) counts once.
__host__ __device__ inline long gv_out_rows(const tcu_gemv_args &a, bool glu)
{
    long rows = a.m[0].n_out;
    for (int k = 1; !glu && k < a.n; k++)
        rows += a.m[k].n_out;
    return rows;
}

// Swizzle of a chunk's 16-byte pieces in shared memory (P pieces a chunk).
template <int NV> __device__ __forceinline__ int gv_swz(int cc)
{
    constexpr int P = NV / 4;
    return P >= 8 ? (cc & 7) % P : (cc / (8 / P)) % P;
}

// Where input e of a staged row lives in shared memory.
template <int NV> __device__ __forceinline__ int gv_pos(int e)
{
    const int cc = e / NV, p = (e % NV) / 4;
    return cc * NV + ((p ^ gv_swz<NV>(cc)) * 4) + (e & 3);
}

// The RMSNorm factor of a row staged in shared memory (gv_pos layout):
// thread tid of nthr adds e = tid, tid + nthr, ... in double, sum() reduces
// over the threads - 256 of them in a fixed order, as rmsnorm_kernel, for
// the norm kernel's bits.
template <int NV, class Sum>
__device__ __forceinline__ float gv_staged_rnorm(const float *xr, int n_in, float eps, int tid, int nthr, Sum sum)
{
    double ss = 0.0;
    for (int e = tid; e < n_in; e += nthr) {
        const float v = xr[gv_pos<NV>(e)];
        ss += (double)v * v;
    }
    ss = sum(ss);
    return (float)(1.0 / sqrt(ss / n_in + eps));
}

// (x * r) * g per element, the fused RMSNorm's rounding (as tcu_rmsnorm).
__device__ __forceinline__ float4 norm4(float4 x, float r, float4 g)
{
    return make_float4(__fmul_rn(__fmul_rn(x.x, r), g.x), __fmul_rn(__fmul_rn(x.y, r), g.y),
                       __fmul_rn(__fmul_rn(x.z, r), g.z), __fmul_rn(__fmul_rn(x.w, r), g.w));
}

// The RMSNorm factor of tokens t0 .. t0 + nt - 1 of a GEMV's input, into
// rnorm[] (shared), reduced as rmsnorm_kernel does (the same 256 threads,
// double sums), so a fused norm gives the norm kernel's bits. Whole block.
static __device__ void gv_norm_factors(const tcu_gemv_args &a, int t0, int nt, float *rnorm)
{
    for (int tt = 0; tt < nt; tt++) {
        const float *xr = a.x + (size_t)(a.norm_rows ? a.norm_rows[t0 + tt] : t0 + tt) * a.n_in;
        double ss = 0.0;
        for (int e = threadIdx.x; e < a.n_in; e += blockDim.x)
            ss += (double)xr[e] * xr[e];
        ss = block_sum_d(ss);
        if (threadIdx.x == 0)
            rnorm[tt] = (float)(1.0 / sqrt(ss / a.n_in + a.norm_eps));
    }
    __syncthreads();
}

__device__ __forceinline__ float q_byte(uint32_t w, int k_sel)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)k_sel)) - 8388608.0f;
}

// dot of a 16-byte chunk with activations xv[NV] (in registers); sx is the
// sum of xv (quantized kinds only).
template <int KIND>
__device__ __forceinline__ float chunk_dot_v(const uint4 &raw, const float *xv, float sx, float scale, float bias)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (KIND == TCU_BF16) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t h = (j & 1) ? (w[j >> 1] & 0xffff0000u) : (w[j >> 1] << 16);
            s = fmaf(__uint_as_float(h), xv[j], s);
        }
        return s;
    } else if constexpr (KIND == TCU_F8) {
        /* byte k of a word shifted to the top, an arithmetic shift by 4
         * puts the sign in bit 31 (and 30-27) and the other 7 bits at 26-20:
         * masked, an f32 of 2^-120 the code's value (f8e4m3_f) */
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; e++) {
            const int32_t t = (int32_t)(w[e >> 2] << (8 * (3 - (e & 3))));
            s = fmaf(__uint_as_float((uint32_t)(t >> 4) & 0x87f00000u), xv[e], s);
        }
        return __fmul_rn(scale, __fmul_rn(s, 0x1p120f));
    } else if constexpr (KIND == TCU_Q8) {
        float sq = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; e++)
            sq = fmaf(q_byte(w[e >> 2], e & 3), xv[e], sq);
        return fmaf(scale, sq, __fmul_rn(bias, sx));
    } else if constexpr (KIND == TCU_Q4F) {
        /* each code q moved to bits 19-22 of a byte pattern 0x80 | q << 3,
         * one byte_perm makes the float 1 + q/16 (exact); sum (1 + q/16) x
         * - sum x = sum q x / 16: two instructions per code instead of
         * three, at a few ulps more rounding */
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = ((w[k] << 3) & 0x78787878u) | 0x80808080u, hi = ((w[k] >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                s = fmaf(__uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u | (uint32_t)(b << 8))), xv[k * 8 + 2 * b], s);
                s = fmaf(__uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u | (uint32_t)(b << 8))), xv[k * 8 + 2 * b + 1],
                         s);
            }
        }
        return fmaf(scale * 16.0f, __fsub_rn(s, sx), __fmul_rn(bias, sx));
    } else { /* TCU_Q4: element e = nibble e % 8 of word e / 8, low nibble first */
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                sq = fmaf(q_byte(lo, b), xv[k * 8 + 2 * b], sq);
                sq = fmaf(q_byte(hi, b), xv[k * 8 + 2 * b + 1], sq);
            }
        }
        return fmaf(scale, sq, __fmul_rn(bias, sx));
    }
}

// The tensor-core GEMV (gemv_tc.cu): bf16 and 4-bit; -1 when the launch's
// weights do not suit it. pdl: tcu_opts.pdl; exact: tcu_opts.exact (three
// bf16 parts an activation, else one).
int gemv_tc(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl, bool exact);
// One token of bf16 weights through a shared-memory ring (gemv_ring.cu);
// -1 when the launch does not suit it.
int gemv_ring(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl);
