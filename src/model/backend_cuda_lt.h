/* The CUDA backend's cuBLASLt products (docs/cuda.md "Products"), for
 * backend_cuda.c only: y[T][n_out] (+)= x[T][n_in] @ W[n_out][n_in]^T with
 * 16-bit W and x and f32 sums, on an algorithm cuBLASLt's heuristic picks
 * for each (shape, T) with split-K forced off. Every such algorithm
 * (Hopper's wgmma kernels, whatever their tile) sums each output element
 * over K in one order, so a row's bits do not depend on T or on its column
 * - batch-invariant like the GEMVs (checked by tests/cuda: T = 1..256 and
 * every column against one token alone). */
#ifndef TERN_MODEL_BACKEND_CUDA_LT_H
#define TERN_MODEL_BACKEND_CUDA_LT_H

#ifdef TERN_CUDA

#include <stdint.h>

#include "base/err.h"

typedef struct cu_lt cu_lt;

/* A handle for GPU `device` (current) launching on `stream` (a
 * cudaStream_t), with its own workspace. */
int cu_lt_new(cu_lt **out, void *stream, tern_err *err);
void cu_lt_free(cu_lt *lt);

/* y (+= when accumulate) x @ W^T: W [n_out][n_in] bf16 (f16 when f16),
 * x [T][n_in] of the same type, y [T][n_out] f32. Queued on the stream
 * (capturable into a graph: the algorithms are chosen on the host, the
 * workspace is fixed). */
int cu_lt_matmul(cu_lt *lt, const void *w, int f16, const uint16_t *x, float *y, int n_out, int n_in, int T,
                 int accumulate, tern_err *err);

#endif
#endif
