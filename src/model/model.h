/* A loaded model: config, memory-mapped weights, and the batched forward
 * pass that every caller (run, server, speculation) goes through. */
#ifndef TERN_MODEL_H
#define TERN_MODEL_H

#include <stdint.h>

#include "base/err.h"
#include "model/config.h"
#include "model/kv.h"
#include "model/safetensors.h"
#include "tensor/kernels.h"

/* A 2-D weight [n_out][n_in] borrowed from the safetensors mapping. Dense
 * (f32/bf16/f16: data is [n_out][n_in] of dtype) or MLX affine-quantized
 * (qbits 4 or 8: data is the packed uint32 words, read as bytes
 * [n_out][n_in * qbits / 8]; w = scale * q + bias per group of `group`
 * inputs, sb the owned f32 copy [n_out][n_in / group][2] of {scale, bias}). */
typedef struct model_weight {
    tern_dtype dtype; /* of the dense data, or of the stored scales when quantized */
    const void *data;
    int n_out, n_in;
    int qbits, group; /* 0 when dense */
    float *sb;        /* owned; NULL when dense */
} model_weight;

typedef struct model_layer {
    model_weight wq;      /* [n_head*head_dim][dim] */
    model_weight wk, wv;  /* [n_kv_head*head_dim][dim] */
    model_weight wo;      /* [dim][n_head*head_dim] */
    model_weight w_gate, w_up; /* [n_ff][dim] */
    model_weight w_down;  /* [dim][n_ff] */
    float *attn_norm, *ffn_norm; /* [dim], owned f32 gains (Gemma's 1 + w applied) */
    float *post_attn_norm, *post_ffn_norm; /* [dim] (gemma), else NULL */
    float *q_norm, *k_norm;      /* [head_dim] (qwen3, gemma3), else NULL */
    float *bq, *bk, *bv;         /* q/k/v biases (qwen2), else NULL */
    int window;                  /* sliding window of this layer, 0 = full attention */
    const float *rope_inv_freq;  /* [head_dim/2], the model's global or local table */
} model_layer;

typedef struct model_scratch model_scratch;

typedef struct tern_model {
    model_config cfg;
    st_set st;
    model_weight embed;   /* [n_vocab][dim] */
    model_weight lm_head; /* [n_vocab][dim], = embed when tied */
    float *final_norm;    /* [dim] */
    model_layer *layers;  /* [n_layer] */
    float *rope_inv_freq; /* [head_dim/2] full-attention layers */
    float *rope_inv_freq_local; /* [head_dim/2] Gemma 3 sliding layers, else NULL */
    const tern_kernels *kern;   /* the CPU backend's table (tests, tools) */
    struct model_backend *be;   /* where the forward's compute runs */
    model_scratch *scratch;
} tern_model;

/* Loads DIR (config.json, safetensors, generation_config.json). n_threads
 * <= 0 uses every core. NULL with err set on failure. */
tern_model *model_load(const char *dir, int n_threads, tern_err *err);
/* model_load with a choice of device: NULL or "cpu" (the default), "cuda"
 * or "cuda:N" (GPU N), "auto" (cuda when built with it and a GPU is
 * present, else cpu). */
typedef struct model_load_opts {
    int n_threads;
    const char *device;
} model_load_opts;
tern_model *model_load_ex(const char *dir, const model_load_opts *o, tern_err *err);
void model_free(tern_model *m);

/* One batched forward. Token i of the batch is tokens[i] at position pos[i]
 * of sequence seqs[i]; every sequence's KV must be reserved through its
 * largest position (kv_seq_reserve). Tokens of one sequence must come in
 * increasing position order, and positions below a token's must already be
 * cached or earlier in the batch. Logits are computed only for the batch rows
 * listed in out_rows, into logits[n_out][n_vocab]. Updates each sequence's
 * n_tokens to its largest position + 1. */
typedef struct fwd_batch {
    int n;
    const int32_t *tokens; /* [n] */
    const int32_t *pos;    /* [n] */
    kv_seq *const *seqs;   /* [n] */
    int n_out;
    const int32_t *out_rows; /* [n_out] indices into the batch */
} fwd_batch;

int model_forward(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, tern_err *err);

/* Bytes of weights one decode step reads (for bandwidth floors): every
 * matrix but the embedding, with quantized scales and biases as the f32
 * pairs the kernels read. */
size_t model_weight_bytes(const tern_model *m);

/* Row r of w (dense or quantized) as f32 into out[n_in]. */
void model_weight_row(const model_weight *w, int r, float *out);

/* RoPE inverse frequencies for theta and the config's scaling (HF's
 * formulas), into out[head_dim/2]. */
void model_rope_freqs(const model_config *c, double theta, int scaled, float *out);

#endif
