// Greedy sampling on the device (see cuda_sample.h): a masked argmax per
// logits row, so that only the chosen ids leave the GPU.
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "tensor/cuda/cuda_sample.h"

// (v, i) beats (bv, bi): a larger value, or an equal one at a lower id. A
// NaN compares false either way, so it never replaces anything.
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void am_warp(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

// One block per row; blockDim.x a multiple of 32, at most 1024. "Nothing
// yet" is (-inf, INT_MAX): the first -inf candidate still beats it on id.
__global__ void argmax_rows_kernel(const float *logits, int n_vocab, const uint32_t *masks, int n_words,
                                   const int32_t *mask_on, int32_t *ids)
{
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * n_vocab;
    const uint32_t *mk = masks && mask_on && mask_on[row] ? masks + (size_t)row * n_words : nullptr;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        if (mk && !((mk[i >> 5] >> (i & 31)) & 1u))
            continue;
        float v = x[i];
        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    am_warp(bv, bi);
    __shared__ float sv[32];
    __shared__ int si[32];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : INT_MAX;
        am_warp(bv, bi);
        if (lane == 0) {
            int id = bi == INT_MAX ? -1 : bi;
            if (mk && bv == -INFINITY)
                id = -1;
            ids[row] = id;
        }
    }
}

extern "C" int tcu_argmax_rows(const float *logits, int n_rows, int n_vocab, const uint32_t *masks, int n_words,
                               const int32_t *mask_on, int32_t *ids, tcu_stream stream)
{
    if (n_rows <= 0)
        return 0;
    if (masks && (long)n_words * 32 < n_vocab)
        return (int)cudaErrorInvalidValue;
    int threads = n_vocab >= 32768 ? 1024 : 256;
    argmax_rows_kernel<<<n_rows, threads, 0, (cudaStream_t)stream>>>(logits, n_vocab, masks, n_words, mask_on, ids);
    return (int)cudaGetLastError();
}
