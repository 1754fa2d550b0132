/* LoRA adapters on the CUDA backend's device forward (docs/lora.md), for
 * backend_cuda.c only: each adapter's A and B copied to the GPU when it is
 * loaded (cu_lora_upload, backend.h lora_upload), the rows of the next
 * forward (cu_lora_rows_set, backend.h lora_rows), and the per-row products
 * the forward adds after each adapted product (cu_lora_add: one launch a
 * product, rows of every adapter in it, base rows skipped). */
#ifndef TERN_MODEL_BACKEND_CUDA_LORA_H
#define TERN_MODEL_BACKEND_CUDA_LORA_H

#ifdef TERN_CUDA

#include "model/model_int.h"
#include "tensor/cuda/cuda_kernels.h"

typedef struct cu_lora cu_lora;

/* Copies adapter a (n_layer layers) to GPU `device` on a stream of its
 * own (any thread; the engine's stream is not touched) and attaches it
 * (model_lora_dev_set; freed with the adapter). A rank over
 * TCU_LORA_MAX_R or a GPU out of memory is an error naming it. */
int cu_lora_upload(int device, int n_layer, struct model_lora *a, tern_err *err);

/* Row i of the next forward (T rows) runs lora[i] (NULL = base; lora
 * NULL: all base): builds the step's per-row table and queues its copy on
 * `stream` (the forward's; the previous forward is finished). *st is made
 * on first use. */
int cu_lora_rows_set(cu_lora **st, int n_layer, const struct model_lora *const *lora, int T, tcu_stream stream,
                     tern_err *err);
/* Whether some row of the step set last has an adapter. */
int cu_lora_has_any(const cu_lora *st);
/* Whether some row of the step set last adapts module mod of layer l. */
int cu_lora_has(const cu_lora *st, int l, int mod);
/* y[t] += the row's adapter update of module mod of layer l, for the T
 * rows of the step (x [T][n_in], y [T][n_out]); a no-op when no row adapts
 * it. The cudaError_t of the launch (0 = ok). */
int cu_lora_add(const cu_lora *st, int l, int mod, const float *x, float *y, int n_in, int n_out, int T,
                const tcu_opts *o, tcu_stream stream);
/* The step's rows are used: later forwards run the base until the next
 * cu_lora_rows_set. */
void cu_lora_done(cu_lora *st);
void cu_lora_free(cu_lora *st);

#endif
#endif
