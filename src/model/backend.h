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
struct model_lora;

/* Attention of one layer for every token of a batch. Token i's query heads
 * q[i][n_head][head_dim] attend to its own sequence's cached positions
 * max(0, pos - window + 1) .. pos (window 0 = all), already written to kv;
 * out[i][n_head][head_dim] gets the weighted values. Scores are
 * scale * q.k, then softcap * tanh(s / softcap) when softcap > 0. sinks
 * (NULL: none; gpt_oss) holds a logit per query head that joins the
 * softmax's denominator once and weights no value: the weights are
 * exp(s_j) / (sum_k exp(s_k) + exp(sink)). */
typedef struct model_attn {
    const kv_pool *kv;
    const fwd_batch *b;
    int layer, n_head, n_kv_head, head_dim, window;
    float scale, softcap;
    const float *q;
    float *out;
    const float *sinks; /* [n_head] or NULL */
} model_attn;

typedef struct model_backend {
    const char *name;
    /* The head dims the attention runs: multiples of head_dim_align up to
     * head_dim_max (0: no bound). model_head_dim_check applies it. */
    int head_dim_align, head_dim_max;
    /* The KV types (kv.h) its attention reads, a bit per kv_type (0: f32
     * only), and the one it uses when none is asked for. */
    unsigned kv_types;
    kv_type kv_default;
    /* Y[k][T][w[k]->n_out] = X[T][n_in] @ w[k]^T for k < n (all w[k] share
     * n_in), run as one parallel job: q/k/v and gate/up go together. */
    int (*matmul)(struct model_backend *be, int n, const model_weight *const *w, const float *X,
                  float *const *Y, int T, tern_err *err);
    /* Optional (NULL: the forward calls matmul per matrix): Y[k][T[k]][w[k]->n_out]
     * = X[k][T[k]][n_in] @ w[k]^T for k < n, every w[k] with its own inputs
     * and token count (T[k] >= 1), as one parallel job - a mixture's chosen
     * experts, each over its own tokens. Each (row, token) result has the
     * bits matmul gives it. */
    int (*matmul_grouped)(struct model_backend *be, int n, const model_weight *const *w, const float *const *X,
                          float *const *Y, const int *T, tern_err *err);
    int (*attention)(struct model_backend *be, const model_attn *a, tern_err *err);
    int (*n_threads)(const struct model_backend *be);
    void (*free)(struct model_backend *be);
    /* Optional (NULL: the caller runs fn(ctx, 0, n, 0) itself): fn over
     * [0, n) on the backend's host threads, in contiguous parts of at
     * least grain items, returning when all are done; worker < n_threads.
     * The host forward's element-wise work (norms, RoPE and the KV write,
     * the gate, residual adds) runs through it. */
    void (*par_for)(struct model_backend *be, long n, long grain, void (*fn)(void *ctx, long b, long e, int worker),
                    void *ctx);
    /* Optional (NULL on the CPU): the whole forward on the device, with the
     * contract of model_forward (inputs already checked there; model_forward
     * updates n_tokens). When set, model_forward hands the batch over to it. */
    int (*forward)(struct model_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b,
                   float *logits, tern_err *err);

    /* The rest is optional too (NULL on the CPU), for a backend with a
     * device forward. Each entry is the backend side of a model.h call and
     * has its contract: mem_reserve - model_mem_reserve, kv_bind -
     * model_kv_bind, forward_start - model_forward_start, argmax_finish /
     * logits_finish / sample_finish - model_forward_argmax / _logits /
     * _sample (exactly one finish after each start). The model.h calls
     * check the batch and update n_tokens; the backend does neither. A pool
     * given to kv_bind must not be used after the backend is freed. */
    int (*mem_reserve)(struct model_backend *be, int max_t, int max_out, size_t *free_bytes, size_t *total_bytes,
                       tern_err *err);
    int (*kv_bind)(struct model_backend *be, kv_pool *kv, tern_err *err);
    int (*forward_start)(struct model_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b,
                         tern_err *err);
    int (*argmax_finish)(struct model_backend *be, const uint32_t *masks, int32_t n_words, const uint8_t *mask_on,
                         int32_t *ids, tern_err *err);
    int (*logits_finish)(struct model_backend *be, float *logits, tern_err *err);
    /* (the CUDA backend's: tcu_sample_rows, cuda_sample.h) */
    int (*sample_finish)(struct model_backend *be, const dev_sample_row *rows, const uint32_t *masks,
                         int32_t n_words, const uint8_t *mask_on, int32_t *ids, tern_err *err);
    /* Optional (NULL: the device forward runs no LoRA adapters,
     * model_lora_supported). lora_upload - called by model_lora_load once
     * the adapter is read: copies it to the device (model_lora_dev_set);
     * lora_rows - row i of the next forward / forward_start (T rows) runs
     * adapter lora[i] (NULL = the base; lora NULL = every row), set by
     * model_forward_lora / model_forward_start_lora before each device
     * forward and used by that forward only. */
    int (*lora_upload)(struct model_backend *be, struct model_lora *a, tern_err *err);
    int (*lora_rows)(struct model_backend *be, const struct model_lora *const *lora, int T, tern_err *err);
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
/* Where be (a CPU backend) multiplies bf16 weights on tiles (kernels.h,
 * matmul_bf16t) or MLX affine weights as panels (imatmul_q4w / q8w; those
 * with bf16 pairs), not under --exact-products, gives m's such weights
 * (lm_head, the layers' projections and routers; not the experts, which
 * may stream) that layout, on be's threads, and drops the file mapping's
 * pages of each (the embedding's excepted: lookups read them). A weight it
 * cannot allocate keeps the row kernels (per weight, so every token count
 * of it still gives the same bits). */
void model_backend_cpu_tiles(model_backend *be, tern_model *m);

/* The CUDA backend (backend_cuda.c, docs/cuda.md) on GPU `device`: uploads
 * m's weights (m NULL: table path only, weights upload on first use). NULL
 * with err set when built without CUDA, no GPU, or the model does not fit. */
model_backend *model_backend_cuda_new(tern_model *m, int device, tern_err *err);

#endif
