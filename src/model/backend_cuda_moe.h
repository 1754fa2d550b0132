/* The CUDA backend's mixture-of-experts layers (backend_cuda_moe.c): every
 * sparse layer's router and experts on the device, stacked per matrix, and
 * the scratch of the device routing (src/tensor/cuda/cuda_moe.h). Only
 * backend_cuda.c uses this, and only in a build with TERN_CUDA. */
#ifndef TERN_MODEL_BACKEND_CUDA_MOE_H
#define TERN_MODEL_BACKEND_CUDA_MOE_H

#include <stddef.h>

#include "base/err.h"
#include "model/model.h"
#include "tensor/cuda/cuda_kernels.h"

typedef struct cu_moe cu_moe;

/* Device bytes of m's routers and experts (with --experts-in host: the
 * routers and the cache; 0 for a dense model). */
size_t cu_moe_bytes(const tern_model *m);

/* Uploads the routers and experts of m's sparse layers to the current
 * device on stream (*out NULL for a dense model); with --experts-in host
 * (model_experts_opts_set) the experts go to pinned host memory instead,
 * with a cache of --expert-cache bytes of them in device memory. TERN_EUNSUPPORTED for a
 * shape the device routing does not take (more than TCU_MOE_MAX_EXPERTS
 * experts or TCU_MOE_MAX_USED a token, widths not a multiple of 8,
 * post-feed-forward norms, experts of mixed storage), naming it. */
int cu_moe_new(const tern_model *m, tcu_stream stream, cu_moe **out, tern_err *err);

/* The routing scratch for steps of up to T tokens; *grown is set to 1 when
 * buffers were replaced (captured graphs hold the old ones). */
int cu_moe_scratch_ensure(cu_moe *x, int T, int *grown, tern_err *err);

/* Whether layer l is sparse. */
int cu_moe_layer_sparse(const cu_moe *x, int l);

/* Layer l's sparse MLP over T tokens (tcu_moe): x += moe(rmsnorm(x) *
 * norm_g), xn scratch [T][dim]. A cudaError_t as an int. */
int cu_moe_run(cu_moe *x, int l, float *xres, const float *norm_g, float eps, float *xn, int T, const tcu_opts *o,
               tcu_stream stream);

/* --experts-in host, around each forward: step_begin (the previous step
 * finished) accounts the previous step's picks to the model's counters,
 * moves picked experts to the front of the cache's LRU and queues copies of
 * the missed ones into it on a copy stream (when the previous copies are
 * done); step_end (after the step is queued) queues the step's pick flags
 * and counts to the host. No-ops otherwise. */
int cu_moe_step_begin(cu_moe *x, tern_err *err);
int cu_moe_step_end(cu_moe *x, tern_err *err);

void cu_moe_free(cu_moe *x);

#endif
