/* A mixture-of-experts layer's MLP on the device (moe.cu), behind a plain-C
 * launcher for the host glue (src/model/backend_cuda_moe.c). Every pointer
 * is a device pointer; the launcher queues work on `stream` and returns the
 * first launch's cudaError_t as an int (0 = ok).
 *
 * The steps, all on the device (no host round trip, so a decode step stays
 * one CUDA graph):
 *  1. RMSNorm of the residual rows into xn;
 *  2. the router's logits [T][n_expert] (a warp a router row);
 *  3. routing, one block: per token the softmax over the experts, the
 *     n_used most probable (the lower id on a tie), renormalized to sum 1
 *     when norm_topk, sorted by expert id (gpt_oss: the router's bias, the
 *     n_used largest logits, their softmax - tcu_experts.topk_softmax);
 *     then the step's picks grouped by expert (ascending ids; a group's
 *     tokens in token order);
 *  4. gate/up of every group's expert over the group's tokens, SiLU(gate) *
 *     up - a warp an expert row, the row's weights read once for all the
 *     tokens routed to it;
 *  5. down likewise, each pick's output row kept; the last block of a row
 *     tile sums each token's experts in id order, weighted, and adds the
 *     sum to the residual.
 * Every (row, token) dot product is summed in an order fixed by n_in alone,
 * and each token's experts in id order, so a token's result does not depend
 * on the batch (bit for bit). Weights stay in their stored form (f32, bf16,
 * f16, MLX affine 4/8-bit with f32 {scale, bias} pairs, MXFP4 with its E8M0
 * scale bytes). */
#ifndef TERN_TENSOR_CUDA_MOE_H
#define TERN_TENSOR_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds of the device routing: experts a layer, experts a token. */
#define TCU_MOE_MAX_EXPERTS 512
#define TCU_MOE_MAX_USED 32
/* Throughput mode (tcu_opts.exact 0, tcu_opts.moe bit TCU_MOE_TC): steps
 * of at least this many tokens take the tensor-core grouped GEMM
 * (moe_tc.cu) for their experts, by kind; smaller steps (a step of one
 * token always) the warp kernels (f32 activations). H200, Qwen3-30B-A3B
 * layer (bench_moe --kernels, us a layer): bf16 (with its prefetch) T 2
 * 70.5 against 85.2, T 4 107 against 139, T 8 186 against 242; 4-bit T 2
 * 78 against 107, T 8 139 against 329 (docs/cuda.md, "Mixtures of
 * experts"); MXFP4 not measured below 8 tokens. */
#define TCU_MOE_TC_MIN_T_BF16 2
#define TCU_MOE_TC_MIN_T_Q4 2
#define TCU_MOE_TC_MIN_T_MX4 8
/* Output rows a block of the expert kernels (the down kernel's row tile). */
#define TCU_MOE_ROWS 8

/* One sparse layer on the device. The router [n_expert][dim] is a tcu_mat
 * (y unused); expert e's matrices are found through tab, a device table
 * [n_expert][6] of pointers read at run time - gate [ff][dim], up
 * [ff][dim], down [dim][ff], then their {scale, bias} pairs [n_out][n_in /
 * group][2] (MLX kinds), or their scale bytes [n_out][n_in / 32] (TCU_MX4),
 * else NULL - so that experts may move (a
 * cache in device memory, the rest in mapped host memory) without a new
 * launch or graph. Optional counting (used NULL: none): used[e] set to 1
 * for every expert the step picks, and count[0] / count[1] incremented per
 * pick whose gate weights are read from [cache_lo, cache_hi) / elsewhere. */
typedef struct tcu_experts {
    tcu_mat router;
    const void *const *tab;
    int kind, group; /* TCU_* and group size of the experts */
    int n_expert, n_used, dim, ff, norm_topk;
    unsigned char *used;
    unsigned long long *count;
    const void *cache_lo, *cache_hi;
    /* gpt_oss (NULL / 0 for the other families): router_b [n_expert] is
     * added to the router's logits; topk_softmax: the n_used largest
     * (biased) logits, the lower id on a tie, then their softmax as the
     * weights (no softmax over all experts first, norm_topk unused);
     * swiglu_clamp: the activation is the clamped SwiGLU with the
     * experts' biases - g = min(gate + b_gate, limit), u = clamp(up + b_up,
     * -limit, limit), (u + 1) * g * sigmoid(swiglu_alpha * g) - and each
     * pick's down output gets b_down before its routing weight. b_gate,
     * b_up [n_expert][ff], b_down [n_expert][dim]. */
    const float *router_b;
    int topk_softmax, swiglu_clamp;
    float swiglu_limit, swiglu_alpha;
    const float *b_gate, *b_up, *b_down;
} tcu_experts;

/* Scratch for T tokens (K = n_used): rl [T][n_expert], wt [T K], sel
 * [T K], meta [2 + 2 min(n_expert, T K) + T K], h [T K][ff] (f32; the
 * tensor-core path keeps bf16 [T K][ff] in its first half), y [T K][dim],
 * cnt [tcu_moe_cnt_len(dim, n_expert)] - zero when allocated (each launch
 * leaves it zero). */
typedef struct tcu_moe_scratch {
    float *rl, *wt, *h, *y;
    int32_t *sel, *meta, *cnt;
} tcu_moe_scratch;

/* ints of meta for T tokens */
size_t tcu_moe_meta_len(int n_expert, int n_used, int T);
/* ints of cnt: a counter per row tile of TCU_MOE_ROWS down rows, the
 * routing's, then (TCU_MOE_FUSED) an exit counter and one per group */
size_t tcu_moe_cnt_len(int dim, int n_expert);

/* The sparse MLP of T tokens: xn = rmsnorm(x) * norm_g, then x += the
 * mixture's output (the steps above; 1-3 are one launch for steps of up to
 * 64 tokens - the last block of the router's routes -, three above). o->pdl
 * applies. */
int tcu_moe(const tcu_experts *e, const tcu_moe_scratch *s, float *x, const float *norm_g, float norm_eps, float *xn,
            int T, const tcu_opts *o, tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
