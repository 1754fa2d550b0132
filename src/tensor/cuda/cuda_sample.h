/* Sampling kernels of the CUDA backend (sample.cu), behind a plain C
 * launcher like cuda_kernels.h: device pointers, work queued on `stream`,
 * the launch's cudaError_t returned as an int (0 = ok). */
#ifndef TERN_TENSOR_CUDA_SAMPLE_H
#define TERN_TENSOR_CUDA_SAMPLE_H

#include <stdint.h>

#include "tensor/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Greedy choice per row: ids[j] = the lowest id among the largest values of
 * logits[j][0 .. n_vocab), the same rule as the CPU's sample_argmax (a NaN
 * never wins). When masks and mask_on are set and mask_on[j] != 0, only
 * tokens t with bit (t & 31) of masks[j * n_words + (t >> 5)] set compete,
 * and the row gets -1 if none does or all of them are -inf (the CPU
 * sampler's "no token is allowed"). One block per row; n_rows may be 0. */
int tcu_argmax_rows(const float *logits, int n_rows, int n_vocab, const uint32_t *masks, int n_words,
                    const int32_t *mask_on, int32_t *ids, tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
