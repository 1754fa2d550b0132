/* The compute under a forward pass, behind a small table so that a CUDA
 * backend can sit beside the CPU one: the two things that need a device's
 * memory and parallelism - weight products and attention over the paged KV
 * cache. Everything else in forward.c is O(tokens * dim) glue.
 *
 * Contract for every backend: the product of one output row with one token
 * must not depend on the batch or on how rows are split among workers (the
 * batched forward reproduces single-sequence decoding bit for bit). */
#ifndef TERN_MODEL_BACKEND_H
#define TERN_MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/kv.h"

struct model_weight;
struct fwd_batch;
struct tern_model;

/* Attention of one layer for every token of a batch. Token i's query heads
 * q[i][n_head][head_dim] attend to its own sequence's cached positions
 * max(0, pos - window + 1) .. pos (window 0 = all), already written to kv;
 * out[i][n_head][head_dim] gets the weighted values. Scores are
 * scale * q.k, then softcap * tanh(s / softcap) when softcap > 0. */
typedef struct model_attn {
    const kv_pool *kv;
    const struct fwd_batch *b;
    int layer, n_head, n_kv_head, head_dim, window;
    float scale, softcap;
    const float *q;
    float *out;
} model_attn;

struct sample_bias;

/* One output row of sample_finish: the row's sampling parameters (as in
 * sample_params: temperature 0 = argmax; top_k 0, top_p 1, min_p 0 = off),
 * its logit_bias entries (borrowed for the call), and u, a uniform in
 * [0, 1) drawn on the host from the row's own stream (unused at
 * temperature 0). */
typedef struct dev_sample_row {
    float temperature, top_p, min_p;
    int32_t top_k;
    const struct sample_bias *bias;
    int32_t n_bias;
    double u;
} dev_sample_row;

typedef struct model_backend {
    const char *name;
    /* Y[k][T][w[k]->n_out] = X[T][n_in] @ w[k]^T for k < n (all w[k] share
     * n_in), run as one parallel job: q/k/v and gate/up go together. */
    int (*matmul)(struct model_backend *be, int n, const struct model_weight *const *w, const float *X,
                  float *const *Y, int T, tern_err *err);
    int (*attention)(struct model_backend *be, const model_attn *a, tern_err *err);
    int (*n_threads)(const struct model_backend *be);
    void (*free)(struct model_backend *be);
    /* Optional (NULL on the CPU): the whole forward on the device, with the
     * contract of model_forward (inputs already validated there; it updates
     * n_tokens). When set, model_forward hands the batch over to it. */
    int (*forward)(struct model_backend *be, struct tern_model *m, kv_pool *kv, const struct fwd_batch *b,
                   float *logits, tern_err *err);

    /* The rest is optional too (NULL on the CPU), for a backend with a
     * device forward whose KV pool lives in device memory. */
    /* Allocates the forward's scratch for batches of up to max_t tokens with
     * up to max_out logits rows (later batches within those bounds allocate
     * nothing more), then reports the device memory still free, and its total. */
    int (*mem_reserve)(struct model_backend *be, int max_t, int max_out, size_t *free_bytes, size_t *total_bytes,
                       tern_err *err);
    /* Allocates kv's device mirror now (TERN_ENOMEM with the sizes when it
     * does not fit) and installs kv's dev_copy hook, so copy-on-write reaches
     * the device. The pool's host storage is then unused (it may have none).
     * The pool must not be used after the backend is freed. */
    int (*kv_bind)(struct model_backend *be, kv_pool *kv, tern_err *err);
    /* Greedy sampling on the device, in two halves so that the host can work
     * (e.g. compute grammar masks) while the device runs the forward:
     * forward_start queues a forward with forward's contract (inputs already
     * validated; the caller updates the sequences' n_tokens) whose n_out
     * logits rows stay on the device, and returns without waiting.
     * One of argmax_finish, sample_finish or logits_finish must follow
     * (and only one, on this backend). argmax_finish writes
     * ids[j] = the lowest id among the largest logits of row j, over the
     * tokens allowed by row j's mask when mask_on[j] (masks: [n_out][n_words]
     * packed 32-bit words, bit t & 31 of word t >> 5 set = token t allowed;
     * masks and mask_on may be NULL = no masks), -1 when a masked row allows
     * nothing (or only -inf logits). It waits for the device. Only ids come
     * back; the logits never leave the device. */
    int (*forward_start)(struct model_backend *be, struct tern_model *m, kv_pool *kv, const struct fwd_batch *b,
                         tern_err *err);
    int (*argmax_finish)(struct model_backend *be, const uint32_t *masks, int32_t n_words, const uint8_t *mask_on,
                         int32_t *ids, tern_err *err);
    /* The other way to finish a forward_start: downloads its n_out logits
     * rows into logits[n_out][n_vocab] and waits (host sampling). */
    int (*logits_finish)(struct model_backend *be, float *logits, tern_err *err);
    /* The third way (optional): sampling on the device. ids[j] = output row
     * j's draw under rows[j] (masks and mask_on as for argmax_finish), with
     * sample_row's processing and draw minus penalties and logprobs (the
     * contract of tcu_sample_rows, cuda_sample.h; temperature 0 rows get
     * argmax_finish's choice, with their bias), -1 when nothing can be drawn.
     * Only ids come back. */
    int (*sample_finish)(struct model_backend *be, const dev_sample_row *rows, const uint32_t *masks,
                         int32_t n_words, const uint8_t *mask_on, int32_t *ids, tern_err *err);
} model_backend;

/* The CPU backend: the best kernel table for this CPU (tern_kernels_best)
 * and a pool of n_threads workers (<= 0: one per core). NULL with err set. */
model_backend *model_backend_cpu_new(int n_threads, tern_err *err);

/* The CUDA backend (backend_cuda.c, docs/cuda.md) on GPU `device`: uploads
 * m's weights (m NULL: table path only, weights upload on first use). NULL
 * with err set when built without CUDA, no GPU, or the model does not fit. */
model_backend *model_backend_cuda_new(struct tern_model *m, int device, tern_err *err);
/* GPUs visible to the CUDA backend (0 when built without it). */
int model_cuda_device_count(void);

#endif
