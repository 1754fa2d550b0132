/* LoRA adapter products of the CUDA backend (lora.cu), behind a plain C
 * launcher like cuda_kernels.h: device pointers, work queued on `stream`,
 * the launch's cudaError_t returned as an int (0 = ok). The host side is
 * src/model/backend_cuda_lora.c (docs/lora.md). */
#ifndef TERN_TENSOR_CUDA_LORA_H
#define TERN_TENSOR_CUDA_LORA_H

#include <stdint.h>

#include "tensor/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One adapted product of one adapter on the device: A [r][n_in] and
 * B [n_out][r] as f32, and its scale; a == NULL: the module is not adapted. */
typedef struct tcu_lora_mod {
    const float *a, *b;
    int r;
    float scale;
} tcu_lora_mod;

/* Largest rank the kernel takes (its rank-sized intermediate lives in
 * shared memory). */
#define TCU_LORA_MAX_R 4096

/* For every token t < T whose adapter table tabs[t] is set (NULL: a base
 * row, left alone) and adapts product `mod` (tabs[t][mod].a != NULL; a
 * table holds an adapter's products layer by layer, mod = layer * 7 +
 * module):
 *   y[t][o] += scale * sum_k B[o][k] * (sum_i A[k][i] * x[t][i])
 * x [T][n_in], y [T][n_out]. One block a token, sums in a fixed order: a
 * token's result does not depend on T or on the other tokens (the batch
 * invariance of backend.h). max_r >= every rank the tables hold. */
int tcu_lora_add(const tcu_lora_mod *const *tabs, int mod, const float *x, float *y, int n_in, int n_out, int T,
                 int max_r, const tcu_opts *o, tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
