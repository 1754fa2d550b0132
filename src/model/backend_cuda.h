/* The CUDA backend's options (tcu_opts, src/tensor/cuda/cuda_kernels.h): a
 * backend is made with a set of them, filled once, read-only after. The
 * environment's overrides (TERN_CUDA_*, docs/cuda.md) are for developer
 * experiments - A/B measurements and tests - and read here alone. */
#ifndef TERN_MODEL_BACKEND_CUDA_H
#define TERN_MODEL_BACKEND_CUDA_H

#include "model/backend.h"
#include "tensor/cuda/cuda_kernels.h"

/* o = the defaults (tcu_opts_init) with the environment's TERN_CUDA_*
 * overrides; a malformed value is TERN_EINVAL naming the variable.
 * TERN_EUNSUPPORTED without CUDA. */
int model_cuda_opts_from_env(tcu_opts *o, tern_err *err);

/* model_backend_cuda_new with the options o (copied; borrowed for the
 * call) instead of model_cuda_opts_from_env's. */
model_backend *model_backend_cuda_new_opts(struct tern_model *m, int device, const tcu_opts *o, tern_err *err);

#endif
