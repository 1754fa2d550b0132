/* The compute under a forward pass, behind a small table so that a CUDA
 * backend can sit beside the CPU one: the two things that need a device's
 * memory and parallelism - weight products and attention over the paged KV
 * cache. Everything else in forward.c is O(tokens * dim) glue.
 *
 * Contract for every backend: the product of one output row with one token
 * must not depend on the batch or on how rows are split among workers (the
 * batched forward reproduces single-sequence decoding bit for bit).
 *
 * This header is for src/model, backend implementers and the tests and
 * benchmarks that compare or wrap backends. The engine and every other
 * caller go through model.h: model_forward (and its device halves) check
 * the batch and keep the sequences' n_tokens, so no entry below does. */
#ifndef TERN_MODEL_BACKEND_H
#define TERN_MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/kv.h"
#include "model/model.h"

/* A 2-D weight as the products read it (the body is in model_int.h). */
typedef struct model_weight model_weight;

/* Attention of one layer for every token of a batch. Token i's query heads
 * q[i][n_head][head_dim] attend to its own sequence's cached positions
 * max(0, pos - window + 1) .. pos (window 0 = all), already written to kv;
 * out[i][n_head][head_dim] gets the weighted values. Scores are
 * scale * q.k, then softcap * tanh(s / softcap) when softcap > 0. */
typedef struct model_attn {
    const kv_pool *kv;
    const fwd_batch *b;
    int layer, n_head, n_kv_head, head_dim, window;
    float scale, softcap;
    const float *q;
    float *out;
} model_attn;

typedef struct model_backend {
    const char *name;
    /* The head dims the attention runs: multiples of head_dim_align up to
     * head_dim_max (0: no bound). model_head_dim_check applies it. */
    int head_dim_align, head_dim_max;
    /* Y[k][T][w[k]->n_out] = X[T][n_in] @ w[k]^T for k < n (all w[k] share
     * n_in), run as one parallel job: q/k/v and gate/up go together. */
    int (*matmul)(struct model_backend *be, int n, const model_weight *const *w, const float *X,
                  float *const *Y, int T, tern_err *err);
    int (*attention)(struct model_backend *be, const model_attn *a, tern_err *err);
    int (*n_threads)(const struct model_backend *be);
    void (*free)(struct model_backend *be);
    /* Optional (NULL on the CPU): the whole forward on the device, with the
     * contract of model_forward (inputs already checked there; model_forward
     * updates n_tokens). When set, model_forward hands the batch over to it. */
    int (*forward)(struct model_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b,
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
     * checked; model_forward_start updates n_tokens) whose n_out
     * logits rows stay on the device, and returns without waiting.
     * One of argmax_finish, sample_finish or logits_finish must follow
     * (and only one, on this backend). argmax_finish writes
     * ids[j] = the lowest id among the largest logits of row j, over the
     * tokens allowed by row j's mask when mask_on[j] (masks: [n_out][n_words]
     * packed 32-bit words, bit t & 31 of word t >> 5 set = token t allowed;
     * masks and mask_on may be NULL = no masks), -1 when a masked row allows
     * nothing (or only -inf logits). It waits for the device. Only ids come
     * back; the logits never leave the device. */
    int (*forward_start)(struct model_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b,
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

/* The one head_dim rule: even (RoPE rotates the pairs i, i + head_dim / 2:
 * TERN_EFORMAT), and within what be declares (head_dim_align,
 * head_dim_max: TERN_EUNSUPPORTED naming the backend). The loader applies
 * it to the CPU backend, a device backend before it uploads anything, and
 * the table path of a backend without a model (kernel tests) per call. */
int model_head_dim_check(const model_backend *be, int head_dim, tern_err *err);

/* The backend m's forward runs on (borrowed). */
model_backend *model_backend_get(const tern_model *m);
/* For tests and benchmarks that compare backends or wrap one: installs be
 * and returns the one it replaces. The caller owns the returned backend
 * and must put the model's own back before model_free (which frees the
 * installed one). */
model_backend *model_backend_swap(tern_model *m, model_backend *be);

/* The CPU backend: the best kernel table for this CPU (tern_kernels_best)
 * and a pool of n_threads workers (<= 0: one per core). NULL with err set. */
model_backend *model_backend_cpu_new(int n_threads, tern_err *err);

/* The CUDA backend (backend_cuda.c, docs/cuda.md) on GPU `device`: uploads
 * m's weights (m NULL: table path only, weights upload on first use). NULL
 * with err set when built without CUDA, no GPU, or the model does not fit. */
model_backend *model_backend_cuda_new(tern_model *m, int device, tern_err *err);

#endif
