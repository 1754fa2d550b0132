/* The CUDA backend's cuBLASLt products (docs/cuda.md "Products"), for
 * backend_cuda.c only: y[T][n_out] (+)= x[T][n_in] @ W[n_out][n_in]^T with
 * 16-bit W and x and f32 sums, on an algorithm cuBLASLt's heuristic picks
 * for each (shape, T) with split-K forced to one number a shape (off, or
 * the heuristic's own choice at 8 tokens, for every T). Every such
 * algorithm (Hopper's wgmma kernels, whatever their tile) sums each output
 * element over the same K ranges in one order, so a row's bits do not
 * depend on T or on its column - batch-invariant like the GEMVs (checked
 * by tests/cuda: T = 1..256 and every column against one token alone, and
 * the 8B shapes with their split-K). */
#ifndef TERN_MODEL_BACKEND_CUDA_LT_H
#define TERN_MODEL_BACKEND_CUDA_LT_H

#ifdef TERN_CUDA

#include <stdint.h>

#include "base/err.h"

typedef struct cu_lt cu_lt;

/* A handle for GPU `device` (current) launching on `stream` (a
 * cudaStream_t), with its own workspace; splitk: each shape's products
 * split over K as cuBLASLt's heuristic splits it at a few tokens, at every
 * T (tcu_opts.lt_splitk; 0: never split). */
int cu_lt_new(cu_lt **out, void *stream, int splitk, tern_err *err);
void cu_lt_free(cu_lt *lt);

/* The split-K of (n_out, n_in) products (1: one pass over K). */
int cu_lt_splitk(cu_lt *lt, int n_out, int n_in, int f16);

/* y (+= when accumulate) x @ W^T: W [n_out][n_in] bf16 (f16 when f16),
 * x [T][n_in] of the same type, y [T][n_out] f32. Queued on the stream
 * (capturable into a graph: the algorithms are chosen on the host, the
 * workspace is fixed). */
int cu_lt_matmul(cu_lt *lt, const void *w, int f16, const uint16_t *x, float *y, int n_out, int n_in, int T,
                 int accumulate, tern_err *err);

#endif
#endif
