// Shared by the mixture-of-experts kernel files (moe.cu: the router, the
// routing and the CUDA-core expert kernels; moe_tc.cu: the tensor-core
// grouped expert GEMM for steps of many tokens): the routing's group table,
// the experts' activation and the weighted sum's term.
#pragma once
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/cuda_moe.h"

// meta layout (cuda_moe.h): [0] groups, [1, 1 + G) their experts, [1 + G,
// 2 + 2G) their first picks (and the end), then the picks t K + k grouped.
struct meta_v {
    const int32_t *m;
    int G;
    __device__ int groups() const { return m[0]; }
    __device__ int expert(int g) const { return m[1 + g]; }
    __device__ int start(int g) const { return m[1 + G + g]; }
    __device__ const int32_t *picks() const { return m + 2 + 2 * G; }
};

// The activation of expert e's gate/up row `row` (products g, u):
// silu(g) * u, or gpt_oss's clamped SwiGLU with the row's biases
// (tcu_experts.swiglu_clamp) in the CPU's order of operations.
__device__ __forceinline__ float moe_act(const tcu_experts &ex, int e, int row, float g, float u)
{
    if (ex.swiglu_clamp) {
        const float lim = ex.swiglu_limit;
        g += ex.b_gate[(size_t)e * ex.ff + row];
        u += ex.b_up[(size_t)e * ex.ff + row];
        g = g > lim ? lim : g;
        u = u > lim ? lim : u < -lim ? -lim : u;
        const float glu = g * (1.0f / (1.0f + expf(-(g * ex.swiglu_alpha))));
        return (u + 1.0f) * glu;
    }
    return silu_f(g) * u;
}

// The weighted sum's term of pick i = t K + k (output row r): its down
// output times its routing weight, with gpt_oss's down bias (of the pick's
// expert sel[i]) added first, as the CPU does.
__device__ __forceinline__ float moe_term(const tcu_experts &ex, const float *y, const float *wt, const int32_t *sel,
                                          size_t i, int r)
{
    const float yv = __ldcg(y + i * ex.dim + r), w = __ldcg(wt + i);
    if (ex.b_down)
        return (yv + ex.b_down[(size_t)__ldcg(sel + i) * ex.dim + r]) * w;
    return yv * w;
}

// ---- the tensor-core grouped GEMM (moe_tc.cu) ----

// Whether moe_tc.cu serves experts of this kind and shape: bf16, MLX 4-bit
// with groups of 32, 64 or 128, MXFP4; dim and ff multiples of 32 (a step
// of the GEMM's inputs).
bool moe_tc_ok(const tcu_experts &e);

// Steps of at least this many tokens take it (cuda_moe.h's TCU_MOE_TC_MIN_T_*).
static inline int moe_tc_min_t(int kind)
{
    return kind == TCU_Q4 ? TCU_MOE_TC_MIN_T_Q4 : kind == TCU_MX4 ? TCU_MOE_TC_MIN_T_MX4 : TCU_MOE_TC_MIN_T_BF16;
}

// Gate/up, down and the weighted sum of a step of T tokens on the tensor
// cores, after the routing wrote s.meta, s.sel and s.wt: h holds the
// activations as bf16 ([T K][ff]), y each pick's down row (f32); x += each
// token's picks in expert-id order, weighted (moe.cu's order). flags:
// tcu_opts.moe. Returns the first launch's error.
int moe_tc_launch(const tcu_experts &e, const tcu_moe_scratch &s, const float *xn, float *x, int T, bool pdl,
                  int flags, cudaStream_t st);
