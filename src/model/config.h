/* A model folder's config.json and generation_config.json, validated: every
 * field that changes the math is either understood or a load error. */
#ifndef TERN_MODEL_CONFIG_H
#define TERN_MODEL_CONFIG_H

#include <stdint.h>

#include "base/err.h"

typedef enum model_arch {
    ARCH_LLAMA,   /* llama, mistral */
    ARCH_QWEN2,   /* q/k/v bias */
    ARCH_QWEN3,   /* per-head q/k RMSNorm */
} model_arch;

#define MODEL_MAX_EOS 8

typedef struct model_config {
    model_arch arch;
    char model_type[32];
    int n_vocab;       /* vocab_size: logits width */
    int dim;           /* hidden_size */
    int n_ff;          /* intermediate_size */
    int n_layer;       /* num_hidden_layers */
    int n_head;        /* num_attention_heads */
    int n_kv_head;     /* num_key_value_heads */
    int head_dim;      /* head_dim, default dim / n_head */
    int max_pos;       /* max_position_embeddings */
    float norm_eps;    /* rms_norm_eps */
    float rope_theta;
    int tie_embeddings;
    int qkv_bias;      /* attention_bias (always on for qwen2) */
    int sliding_window; /* 0 = full attention */
    int bos_id;        /* -1 if none */
    int n_eos;
    int eos_ids[MODEL_MAX_EOS]; /* generation_config.json's, else config.json's */
} model_config;

/* Reads DIR/config.json (required) and DIR/generation_config.json (optional). */
int model_config_load(model_config *cfg, const char *dir, tern_err *err);

#endif
