/* The body of a loaded model, for src/model (the loader, the forward, the
 * backends) and the tests of its internals - everyone else holds the
 * opaque handle of model.h (SQLite's btree.h / btreeInt.h split). */
#ifndef TERN_MODEL_INT_H
#define TERN_MODEL_INT_H

#include <stdint.h>

#include "model/backend.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tensor/kernels.h"

/* A 2-D weight [n_out][n_in] borrowed from the safetensors mapping. Dense
 * (f32/bf16/f16: data is [n_out][n_in] of dtype) or MLX affine-quantized
 * (qbits 4 or 8: data is the packed uint32 words, read as bytes
 * [n_out][n_in * qbits / 8]; w = scale * q + bias per group of `group`
 * inputs, sb the owned f32 copy [n_out][n_in / group][2] of {scale, bias}). */
struct model_weight {
    tern_dtype dtype; /* of the dense data, or of the stored scales when quantized */
    const void *data;
    int n_out, n_in;
    int qbits, group; /* 0 when dense */
    float *sb;        /* owned; made after load by model_weight_pairs; NULL when dense or on panels */
    uint16_t *sb16;   /* owned; sb as bf16 pairs where the file stores bf16 scales (the same values: the
                       * one-token products read these, half the bytes), else NULL (also on panels) */
    /* FP8 (dtype TERN_F8E4M3): w[r][i] = e4m3(data[r * n_in + i]) * fs[(r / fs_rows) * fs_ncol + i / fs_cols],
     * fs_ncol = ceil(n_in / fs_cols): a scale per block of fs_rows x fs_cols weights (1 x n_in: per output
     * channel; n_out x n_in: per tensor; 128 x 128: the hub's block-scaled checkpoints). Owned f32; else NULL. */
    float *fs;
    int fs_rows, fs_cols;
    /* MXFP4 (dtype TERN_U8, mx set): data is the blocks, [n_out][n_in / 2] bytes, input 2i in byte i's low
     * nibble and 2i + 1 in its high one, each an FP4 E2M1 code (sign, 2 exponent bits, 1 mantissa bit:
     * 0, 0.5, 1, 1.5, 2, 3, 4, 6); mx the E8M0 scales [n_out][n_in / 32]: w = e2m1 * 2^(mx - 127). Both
     * borrowed from the mapping (n_in a multiple of 32). group says what the product's inputs become
     * (unless --exact-products: f32): 32 int8 (tern_imxmatmul_fn: gpt_oss's gate_up), 16 int16
     * (tern_imx16matmul_fn: its down, whose inputs - the clamped SwiGLU's - are heavy-tailed: int8 moved
     * the test fixture's logits by 0.12), 0 f32. */
    const uint8_t *mx;
    /* An owned copy of data (gpt_oss's input-major experts transposed at load), freed with the model;
     * else NULL. */
    void *own;
    /* bf16 weights rearranged for the CPU's tile product (kernels.h, tern_bf16_tiles_make), made at load where
     * the kernels have one (model_backend_cpu_tiles): owned; else NULL. */
    uint16_t *tiles;
    /* MLX affine weights rearranged for the CPU's panel product (kernels.h, tern_iq_panels_make), made at load
     * where the kernels have one (model_backend_cpu_tiles): owned (a mixture's experts: in their layer's
     * exp_layout); else NULL. */
    uint8_t *panels;
    /* MLX affine: the file's scales and biases [n_out][n_in / group] (dtype), which sb / sb16 are made
     * from (model_weight_pairs); else NULL. */
    const void *f_scales, *f_biases;
};

typedef struct model_layer {
    model_weight wq;      /* [n_head*head_dim][dim] */
    model_weight wk, wv;  /* [n_kv_head*head_dim][dim] */
    model_weight wo;      /* [dim][n_head*head_dim] */
    model_weight w_gate, w_up; /* [n_ff][dim]; unset in a sparse layer */
    model_weight w_down;  /* [dim][n_ff] */
    /* A sparse layer (cfg.layer_moe): the router and every expert's MLP. */
    model_weight router;  /* [n_expert][dim] */
    model_weight *experts; /* [n_expert][3] gate, up [n_ff_expert][dim], down [dim][n_ff_expert]; owned, else NULL.
                            * gpt_oss: [0] is gate_up [2 * n_ff_expert][dim] (rows 2i gate, 2i + 1 up, as the
                            * hub interleaves them), [1] unused (n_out 0), [2] down */
    void *exp_layout;    /* the experts' panels, one block (model_backend_cpu_tiles; experts[i].panels point
                          * into it), else NULL */
    float *router_b;     /* [n_expert] router bias (gpt_oss), else NULL */
    float *exp_b_gu;     /* [n_expert][2 * n_ff_expert] gate_up biases (gpt_oss), else NULL */
    float *exp_b_down;   /* [n_expert][dim] down biases (gpt_oss), else NULL */
    float *sinks;        /* [n_head] attention sink logits (gpt_oss), else NULL */
    float *bo;           /* [dim] o_proj bias (gpt_oss), else NULL */
    float *attn_norm, *ffn_norm; /* [dim], owned f32 gains (Gemma's 1 + w applied) */
    float *post_attn_norm, *post_ffn_norm; /* [dim] (gemma), else NULL */
    float *q_norm, *k_norm;      /* [head_dim] (qwen3, gemma3), else NULL */
    float *bq, *bk, *bv;         /* q/k/v biases (qwen2), else NULL */
    int window;                  /* sliding window of this layer, 0 = full attention */
    const float *rope_inv_freq;  /* [head_dim/2], the model's global or local table */
    float rope_af;               /* cos and sin scaled by it (YaRN's attention factor on the global table), else 1 */
} model_layer;

typedef struct model_scratch model_scratch;
typedef struct model_lora_scratch model_lora_scratch;
typedef struct model_expert_cache model_expert_cache;

struct tern_model {
    model_config cfg;
    st_set st;
    model_weight embed;   /* [n_vocab][dim] */
    model_weight lm_head; /* [n_vocab][dim], = embed when tied */
    float *final_norm;    /* [dim] */
    model_layer *layers;  /* [n_layer] */
    float *rope_inv_freq; /* [head_dim/2] full-attention layers */
    float *rope_inv_freq_local; /* [head_dim/2] Gemma 3 sliding layers, else NULL */
    model_backend *be;          /* where the forward's compute runs */
    model_scratch *scratch;     /* forward.c's, grown on demand */
    model_lora_scratch *lora_scratch; /* lora.c's, grown on demand */
    model_expert_cache *xc;     /* experts.c's residency of expert weights, NULL when not managed */
};

/* Makes w's {scale, bias} pairs from the file's scales and biases where
 * missing: f32 (sb) and, bf16 where the file stores bf16 scales (sb16). A
 * no-op for a weight that is not MLX affine. TERN_ENOMEM when out of
 * memory. */
int model_weight_pairs(model_weight *w, int f32, int bf16, tern_err *err);

/* Row r of w (dense or quantized) as f32 into out[n_in]. */
void model_weight_row(const model_weight *w, int r, float *out);

/* RoPE inverse frequencies for theta and the config's scaling (HF's
 * formulas), into out[head_dim/2]. */
void model_rope_freqs(const model_config *c, double theta, int scaled, float *out);

/* Expert `expert` of sparse layer `layer` is about to be read (experts.c):
 * its weights are paged in and kept resident within the cache budget;
 * counts a hit or the bytes streamed. From disk, a miss also makes the
 * expert's {scale, bias} pair copies (TERN_ENOMEM when out of memory),
 * which stay while it is held. No-op without a cache. */
int model_experts_touch(tern_model *m, int layer, int expert, tern_err *err);
/* Frees the pair copies of the experts that left the cache (or were read
 * once) since the last call: at the start of a sparse layer, when no
 * product still reads them. */
void model_experts_settle(tern_model *m);

/* Drops the pages wholly w's own from the process (experts.c; w's data a
 * read-only file mapping: a later read faults them back in). */
void model_weight_release(const model_weight *w);
/* The same for n bytes at p of the mapping (a tensor read once at load). */
void model_bytes_release(const void *p, size_t n);
/* Maps every page of w's data at once (a weight read whole right after, as
 * a CPU layout's making: one call instead of a fault a page). */
void model_weight_populate(const model_weight *w);

/* A device backend's expert cache reports into the model's counters
 * (experts.c; a no-op without them): picks that found the expert cached and
 * not, bytes copied into the cache and the seconds it took, bytes held. */
void model_experts_add(tern_model *m, uint64_t hits, uint64_t misses, double copied_bytes, double seconds,
                       size_t resident);

/* experts.c: sets up the residency model_experts_opts_set asked for (a
 * model without experts, or MAPPED: nothing), and frees it, logging its
 * counters at info level. */
int model_experts_init(tern_model *m, tern_err *err);
void model_experts_free(tern_model *m);

/* forward.c's scratch, freed with the model; NULL is a no-op. */
void model_scratch_free(model_scratch *s);

struct model_lora;
/* lora.c: adds each row's adapter update to module mod of layer l - the
 * rows i with lora[i] adapting it get Y[i] += B (A X[i]) * scale (X [T][n_in]
 * the product's input, Y [T][n_out] its output). lora NULL: nothing. */
int model_lora_apply(tern_model *m, const struct model_lora *const *lora, int T, int l, int mod, const float *X,
                     float *Y, tern_err *err);
void model_lora_scratch_free(model_lora_scratch *s);
/* lora.c, for a device backend: module mod of layer l of a - A [r][n_in]
 * and B [n_out][r] (host f32), their shape and the scale; 0 when a leaves
 * it alone. */
int model_lora_mod_get(const struct model_lora *a, int l, int mod, const float **A, const float **B, int *r,
                       int *n_in, int *n_out, float *scale);
/* The device copy a backend keeps with the adapter (lora_upload, backend.h):
 * set once; free(dev) runs when the last reference goes. */
void model_lora_dev_set(struct model_lora *a, void *dev, void (*free_fn)(void *dev));
void *model_lora_dev(const struct model_lora *a);

#ifdef __x86_64__
/* act_avx2.c: g[i] = silu(g[i]) * u[i] for i < n with a vector e^x (AVX2 +
 * FMA CPUs only; the forward's gate unless --exact-products). */
void model_silu_mul_avx2(float *g, const float *u, long n);
#endif

#endif
