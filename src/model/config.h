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
    ARCH_GEMMA2,  /* GELU-tanh, (1+w) norms, sandwich norms, soft-capping */
    ARCH_GEMMA3,  /* Gemma 2 + q/k norms, local/global RoPE bases */
} model_arch;

/* Mixture-of-experts layout of the MLP (the tensor names differ). */
typedef enum model_moe_style {
    MOE_NONE,
    MOE_QWEN3,   /* mlp.gate, mlp.experts.N.{gate,up,down}_proj */
    MOE_MIXTRAL, /* block_sparse_moe.gate, block_sparse_moe.experts.N.{w1,w3,w2} */
    MOE_GPT_OSS, /* mlp.router.{weight,bias}, stacked mlp.experts.{gate_up_proj,down_proj}[_bias]
                  * (or their MXFP4 _blocks / _scales); top-k of the logits, then softmax */
} model_moe_style;

typedef enum model_rope_scaling {
    ROPE_NONE,
    ROPE_LINEAR, /* inv_freq / factor */
    ROPE_LLAMA3, /* Llama 3.1 wavelength-banded scaling */
    ROPE_YARN,   /* YaRN: a ramp between interpolated and original frequencies, cos/sin scaled */
} model_rope_scaling;

#define MODEL_MAX_EOS 8
#define MODEL_MAX_LAYERS 1024

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
    int sliding_window; /* 0 = full attention; applies to layers with layer_sliding set */
    /* RoPE of full-attention layers; sliding layers of Gemma 3 use
     * rope_local_theta unscaled (else the same as full). */
    model_rope_scaling rope_scaling;
    float rope_factor, rope_low_freq, rope_high_freq; /* llama3 */
    int rope_orig_max_pos;                           /* llama3, yarn */
    float rope_beta_fast, rope_beta_slow;            /* yarn: the ramp's ends in rotations */
    int rope_truncate;                               /* yarn: ramp ends floored / ceiled (transformers' default) */
    float rope_attn_factor; /* cos and sin scaled by it (yarn's attention factor); 1 otherwise */
    float rope_local_theta;
    /* Gemma-style options (0 = off). */
    int gelu;              /* 1: GELU-tanh MLP, 0: SiLU */
    int norm_plus_one;     /* RMSNorm gains stored as w, applied as 1 + w */
    int sandwich_norms;    /* post-attention, pre/post feed-forward norms */
    int qk_norm;           /* per-head RMSNorm on q and k before RoPE */
    float embed_scale;     /* 0 = none, else multiply embeddings by it */
    float attn_scale;      /* score scale: 1/sqrt(query_pre_attn_scalar or head_dim) */
    float attn_softcap;    /* scores = c * tanh(scores / c) */
    float final_softcap;   /* logits = c * tanh(logits / c) */
    unsigned char layer_sliding[MODEL_MAX_LAYERS]; /* 1: layer uses sliding_window */
    /* Mixture of experts (qwen3_moe, mixtral; n_expert 0 = dense): a
     * layer with layer_moe set routes each token to the n_expert_used
     * experts of highest softmax(router) probability and sums their SiLU
     * MLPs (n_ff_expert wide) weighted by those probabilities, renormalized
     * to sum 1 when norm_topk; the other layers keep the dense MLP (n_ff). */
    model_moe_style moe;
    int n_expert;      /* num_experts / num_local_experts */
    int n_expert_used; /* num_experts_per_tok */
    int n_ff_expert;   /* moe_intermediate_size (mixtral: intermediate_size) */
    int norm_topk;     /* norm_topk_prob (always for mixtral) */
    unsigned char layer_moe[MODEL_MAX_LAYERS]; /* 1: layer is sparse */
    /* gpt_oss (moe MOE_GPT_OSS): every layer sparse; the router has a bias,
     * the weights are the softmax of the top-k logits; each expert's gate
     * and up (interleaved columns of gate_up_proj, biased) feed the clamped
     * SwiGLU (up' + 1) * g' * sigmoid(swiglu_alpha * g') with
     * g' = min(g, swiglu_limit), up' = clamp(up, -limit, limit); its down
     * product has a bias. Attention has a learned per-head sink logit in
     * the softmax's denominator (attn_sinks) and an o_proj bias (o_bias). */
    float swiglu_limit, swiglu_alpha;
    int attn_sinks, o_bias;
    /* MXFP4 experts declared by quantization_config (quant_method mxfp4):
     * NAME_blocks (uint8, two E2M1 codes a byte) + NAME_scales (E8M0 per 32
     * inputs), or by mlx-lm's "quantization" mode mxfp4 (the same bytes as
     * NAME.weight uint32 + NAME.scales uint8); 0 = none. */
    int mxfp4;
    /* MLX affine quantization from config.json's "quantization" (0 = none);
     * each tensor's own bits and group size are read from its shapes. */
    int quant_bits, quant_group;
    /* FP8 E4M3 weights declared by quantization_config (quant_method "fp8",
     * or "compressed-tensors" with 8-bit float weights; 0 = none): each
     * F8_E4M3 tensor's scale shape picks its layout (per tensor, per output
     * channel, or blocks of fp8_block_rows x fp8_block_cols, 0 when the
     * config declares no blocks). fp8_static_act: the checkpoint carries
     * static activation scales (input_scale), which tern does not use. */
    int fp8, fp8_block_rows, fp8_block_cols, fp8_static_act;
    int bos_id;        /* -1 if none */
    int n_eos;
    int eos_ids[MODEL_MAX_EOS]; /* generation_config.json's, else config.json's */
} model_config;

/* Reads DIR/config.json (required) and DIR/generation_config.json (optional). */
int model_config_load(model_config *cfg, const char *dir, tern_err *err);

#endif
