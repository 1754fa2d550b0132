// LoRA products of the CUDA backend (cuda_lora.h): per token, u = A x then
// y += scale * B u, rows of several adapters (and base rows, skipped) in
// one launch - the Punica / S-LoRA "segmented" product, one block a token.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/cuda_lora.h"

#define LORA_THREADS 256

// Block t: token t. Warps take A's rows k (k = warp, warp + 8, ...), each a
// dot product over n_in summed lane-strided then by warp_sum (a fixed
// order); then each thread takes outputs o (o = tid, tid + 256, ...) and
// sums B[o][0..r) * u in order. Nothing depends on the other tokens.
__global__ void __launch_bounds__(LORA_THREADS)
    lora_add_kernel(const tcu_lora_mod *const *tabs, int mod, const float *x, float *y, int n_in, int n_out)
{
    extern __shared__ float u[];
    pdl_wait();
    int t = blockIdx.x;
    const tcu_lora_mod *tab = tabs[t];
    if (!tab) {
        pdl_trigger();
        return;
    }
    const tcu_lora_mod md = tab[mod];
    if (!md.a) {
        pdl_trigger();
        return;
    }
    const float *xt = x + (size_t)t * n_in;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    for (int k = warp; k < md.r; k += LORA_THREADS / WARP) {
        const float *ak = md.a + (size_t)k * n_in;
        float s = 0.0f;
        for (int i = lane; i < n_in; i += WARP)
            s = fmaf(ak[i], xt[i], s);
        s = warp_sum(s);
        if (lane == 0)
            u[k] = s;
    }
    __syncthreads();
    float *yt = y + (size_t)t * n_out;
    for (int o = threadIdx.x; o < n_out; o += LORA_THREADS) {
        const float *bo = md.b + (size_t)o * md.r;
        float s = 0.0f;
        for (int k = 0; k < md.r; k++)
            s = fmaf(bo[k], u[k], s);
        yt[o] += s * md.scale;
    }
    pdl_trigger();
}

extern "C" int tcu_lora_add(const tcu_lora_mod *const *tabs, int mod, const float *x, float *y, int n_in, int n_out,
                            int T, int max_r, const tcu_opts *o, tcu_stream stream)
{
    if (T <= 0)
        return 0;
    if (max_r < 1 || max_r > TCU_LORA_MAX_R)
        return (int)cudaErrorInvalidValue;
    PROF(TCU_PROF_OTHER, stream);
    size_t smem = (size_t)max_r * sizeof(float); /* <= 16 KiB */
    return launch_pdl(opts_or_default(o).pdl, lora_add_kernel, dim3((unsigned)T), dim3(LORA_THREADS), smem,
                      (cudaStream_t)stream, tabs, mod, x, y, n_in, n_out);
}
