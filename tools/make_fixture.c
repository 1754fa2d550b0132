/* make_fixture: writes a random-initialized Hugging Face model folder of a
 * given family and shape, deterministic from a seed - for tests and
 * benchmarks of models we cannot download.
 *
 *   make_fixture --family llama|mistral|qwen2|qwen3|gemma2|gemma3|qwen3_moe|mixtral|gpt_oss --out DIR
 *                --tokenizer DIR
 *                [--preset tiny|0.5b|1b|8b|30b-a3b|gpt-oss-20b|gpt-oss-120b] [--dim N] [--layers N] [--heads N]
 *                [--kv-heads N] [--head-dim N] [--ff N] [--vocab N]
 *                [--dtype f32|bf16|f16] [--seed S] [--shards N] [--tie 0|1]
 *                [--max-pos N] [--rope-theta X] [--sliding-window N]
 *                [--rope-scaling llama3|linear] [--rope-factor X]
 *                [--rope-orig N] (llama3: original_max_position_embeddings)
 *                [--attn-softcap X] [--final-softcap X] [--qpas N]
 *                [--sw-pattern N] [--rope-local-theta X]   (gemma)
 *                [--experts N] [--top-k K] [--moe-ff N]      (qwen3_moe, mixtral)
 *                [--norm-topk 0|1] [--sparse-step N] [--mlp-only L,L,...] (qwen3_moe)
 *                [--mxfp4 1] [--mxfp4-decoded 1]                 (gpt_oss)
 *
 * Mixtures of experts: qwen3_moe writes the hub's layout (mlp.gate, the
 * experts' mlp.experts.N.{gate,up,down}_proj, --moe-ff wide; layers in
 * --mlp-only or off the --sparse-step keep a dense --ff MLP); mixtral writes
 * block_sparse_moe.gate and block_sparse_moe.experts.N.{w1,w2,w3}, --ff wide.
 * --preset 30b-a3b is Qwen3-30B-A3B's shape (qwen3_moe: 48 layers, 128
 * experts, 8 a token, 768 wide); a --layers given with a preset overrides
 * its layer count (a shorter stack of the same layers, for benchmarks).
 *
 * gpt_oss writes the hub's layout: attention with q/k/v/o biases and a
 * per-head sink logit (self_attn.sinks), layers alternating sliding and full
 * attention (layer 0 slides), YaRN RoPE (--rope-scaling yarn is the default
 * for the family: factor 32, original 4096, beta_fast 32, beta_slow 1,
 * truncate false, as published; --rope-factor / --rope-orig override), and a
 * sparse MLP in every layer: mlp.router.{weight,bias} and the stacked experts
 * mlp.experts.gate_up_proj [E, dim, 2*moe_ff] (input-major, gate and up
 * interleaved by column) + gate_up_proj_bias [E, 2*moe_ff], down_proj
 * [E, moe_ff, dim] + down_proj_bias [E, dim]. Sinks are drawn in [-3, 3] and
 * the gate_up biases in [-8, 8], so the sinks take a real share of the
 * softmax and the SwiGLU clamps (+-7) are hit; down_proj is drawn 32x smaller
 * so the experts' output stays at the scale of the other sublayers.
 * --mxfp4 1 writes the experts as the published checkpoints do: uint8
 * gate_up_proj_blocks [E, 2*moe_ff, dim/32, 16] + gate_up_proj_scales
 * [E, 2*moe_ff, dim/32] and down_proj_blocks [E, dim, moe_ff/32, 16] +
 * down_proj_scales (output-major; element 2i of a block is byte i's low
 * nibble, an FP4 E2M1 code; a scale byte s means 2^(s - 127)), plus a
 * quantization_config {quant_method mxfp4}. Their weights are random codes
 * times 2^k (k in [-8, -6] for gate_up, [-13, -11] for down), drawn per
 * block of 32; --mxfp4-decoded 1 (same seed) writes exactly those values as
 * plain --dtype experts (E2M1 times a power of two is exact in bf16 and f16
 * too), so a transformers golden of the decoded twin is the ground truth of
 * the MXFP4 folder.
 *
 * Gemma norms are stored as w with the effective gain 1 + w (HF's
 * convention), so their random values are drawn around 0 instead of 1.
 *
 * Weights are uniform in [-a, a] with a = sqrt(3) * 0.02 (std 0.02, HF's
 * initializer_range), norms are 1 + small noise, so activations stay in a
 * realistic range through many layers. The tokenizer files are copied from
 * --tokenizer; --vocab must be at least its size (default: read from the
 * tokenizer).
 *
 * The HF goldens in tests/golden/ were computed on fixtures written by this
 * generator (tests/golden/manifest.json holds the arguments; the tests
 * regenerate them): changing how weights are drawn changes every fixture,
 * so regenerate the goldens with tools/hf_goldens.py after such a change. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json.h"
#include "base/pool.h"
#include "base/rng.h"
#include "model/st_write.h"
#include "tokenizer/tokenizer.h"

typedef struct fixture {
    const char *family;
    int dim, layers, heads, kv_heads, head_dim, ff, vocab, max_pos, tie, shards;
    double rope_theta;
    tern_dtype dtype;
    uint64_t seed;
    int sliding_window, sw_pattern, rope_orig, tie_set;
    const char *rope_scaling;
    double rope_factor, attn_softcap, final_softcap, qpas, rope_local_theta;
    int experts, top_k, moe_ff, norm_topk, sparse_step;
    const char *mlp_only; /* comma-separated layer indices */
    int mxfp4, mxfp4_decoded; /* gpt_oss experts as MXFP4 blocks / as their decoded values */
} fixture;

/* How a tensor's values are drawn. Each tensor draws from its own stream;
 * MXFP4 blocks and scales share the stream of the expert tensor they encode,
 * so a --mxfp4 folder and its --mxfp4-decoded twin hold the same weights. */
typedef enum fill_kind {
    FILL_PLAIN,      /* by name: norms near 1 (gemma: 0), biases small, weights std 0.02 */
    FILL_SINK,       /* attention sink logits, uniform in [-3, 3] */
    FILL_WIDE_BIAS,  /* gpt_oss gate_up biases, uniform in [-8, 8] */
    FILL_SMALL,      /* gpt_oss down_proj: weights 32x smaller */
    FILL_MX_BLOCKS,  /* uint8 [E, rows, groups, 16]: two E2M1 codes a byte */
    FILL_MX_SCALES,  /* uint8 [E, rows, groups]: E8M0 scale bytes */
    FILL_MX_DECODED, /* the values of the blocks/scales, stored input-major */
} fill_kind;

typedef struct fill_info {
    uint64_t stream;
    fill_kind kind;
    int rows, in_dim;  /* MXFP4 kinds: output rows and inputs of one expert */
    int k_lo;          /* MXFP4 kinds: scale exponents drawn in [k_lo, k_lo + 2] */
} fill_info;

static int is_gemma(const char *f) { return !strncmp(f, "gemma", 5); }

static int is_moe(const char *f) { return !strcmp(f, "qwen3_moe") || !strcmp(f, "mixtral"); }

static int is_gpt_oss(const char *f) { return !strcmp(f, "gpt_oss"); }

/* Whether layer l of a qwen3_moe fixture is sparse (transformers' rule). */
static int layer_sparse(const fixture *fx, int l)
{
    if (!strcmp(fx->family, "mixtral"))
        return 1;
    if (strcmp(fx->family, "qwen3_moe") || (l + 1) % fx->sparse_step)
        return 0;
    for (const char *p = fx->mlp_only; p && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        if (v == l)
            return 0;
        p = *end == ',' ? end + 1 : end;
    }
    return 1;
}

typedef struct fill_ctx {
    const st_out_tensor *ts;
    const fill_info *info; /* parallel to ts */
    uint64_t seed;
    int first_index; /* global index of ts[0], so shards draw distinct streams */
    int gemma;       /* norms stored as gain - 1 */
    tern_pool *pool;
    /* the chunk being produced */
    int i;
    int64_t first;
    void *buf;
} fill_ctx;

/* E2M1 code c (sign bit 3, two exponent bits, one mantissa bit) as a float. */
static float e2m1_value(unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}

/* Block q (expert, row, group of 32 inputs, output-major) of an MXFP4 tensor
 * is 17 draws of its stream from 17 q: the scale exponent, then 16 bytes of
 * codes. Fills the scale byte and the 16 code bytes. */
static void mx_block(uint64_t seed, const fill_info *fi, int64_t q, uint8_t *scale, uint8_t codes[16])
{
    tern_rng rng;
    tern_rng_seed(&rng, seed, fi->stream);
    tern_rng_advance(&rng, (uint64_t)q * 17);
    *scale = (uint8_t)(127 + fi->k_lo + (int)(tern_rng_u32(&rng) % 3));
    for (int i = 0; i < 16; i++)
        codes[i] = (uint8_t)(tern_rng_u32(&rng) >> 24);
}

static void store(const st_out_tensor *t, void *buf, long k, float v)
{
    switch (t->dtype) {
    case TERN_F32: ((float *)buf)[k] = v; break;
    case TERN_BF16: ((uint16_t *)buf)[k] = tern_f32_to_bf16(v); break;
    default: ((uint16_t *)buf)[k] = tern_f32_to_f16(v); break;
    }
}

/* MXFP4 kinds: elements [first + b, first + e) of blocks, scales or their
 * decoded values (the decoded tensor is [E, in_dim, rows], input-major). */
static void fill_mx(const fill_ctx *c, const st_out_tensor *t, const fill_info *fi, long b, long e)
{
    int groups = fi->in_dim / 32;
    uint8_t scale = 127, codes[16] = {0};
    int64_t have = -1;
    for (long k = b; k < e; k++) {
        int64_t at = c->first + k, q, pos = 0;
        if (fi->kind == FILL_MX_BLOCKS) {
            q = at / 16, pos = at % 16;
        } else if (fi->kind == FILL_MX_SCALES) {
            q = at;
        } else {
            int64_t row = at % fi->rows, in = at / fi->rows % fi->in_dim, ex = at / ((int64_t)fi->rows * fi->in_dim);
            q = (ex * fi->rows + row) * groups + in / 32, pos = in % 32;
        }
        if (q != have)
            mx_block(c->seed, fi, q, &scale, codes), have = q;
        if (fi->kind == FILL_MX_BLOCKS)
            ((uint8_t *)c->buf)[k] = codes[pos];
        else if (fi->kind == FILL_MX_SCALES)
            ((uint8_t *)c->buf)[k] = scale;
        else
            store(t, c->buf, k, ldexpf(e2m1_value(codes[pos / 2] >> (pos % 2 * 4) & 15), scale - 127));
    }
}

/* Elements [first + b, first + e) of the chunk: tensor i's stream advanced
 * to its element first + b, so the pieces equal one sequential pass. */
static void fill_part(void *vctx, long b, long e, int worker)
{
    (void)worker;
    fill_ctx *c = vctx;
    const st_out_tensor *t = &c->ts[c->i];
    const fill_info *fi = &c->info[c->i];
    if (fi->kind >= FILL_MX_BLOCKS) {
        fill_mx(c, t, fi, b, e);
        return;
    }
    tern_rng rng;
    tern_rng_seed(&rng, c->seed, fi->stream);
    tern_rng_advance(&rng, (uint64_t)(c->first + b));
    int is_norm = t->n_dims == 1 && strstr(t->name, "norm");
    int is_bias = t->n_dims == 1 && strstr(t->name, "bias");
    const float a = 0.0346410f; /* sqrt(3) * 0.02 */
    for (long k = b; k < e; k++) {
        float u = tern_rng_f32(&rng) * 2.0f - 1.0f;
        float v = fi->kind == FILL_SINK        ? 3.0f * u
                  : fi->kind == FILL_WIDE_BIAS ? 8.0f * u
                  : fi->kind == FILL_SMALL     ? a / 32 * u
                  : is_norm                    ? (c->gemma ? 0.0f : 1.0f) + 0.1f * u
                  : is_bias                    ? 0.02f * u
                                               : a * u;
        store(t, c->buf, k, v);
    }
}

/* Each tensor has its own stream (seed, global index) so any element can be
 * regenerated without the others; a chunk is produced by all cores. */
static int fill(void *vctx, int i, int64_t first, int64_t n, void *buf)
{
    fill_ctx *c = vctx;
    tern_dtype dt = c->ts[i].dtype;
    if (dt != TERN_F32 && dt != TERN_BF16 && dt != TERN_F16 && !(dt == TERN_U8 && c->info[i].kind >= FILL_MX_BLOCKS))
        return TERN_EINVAL;
    c->i = i;
    c->first = first;
    c->buf = buf;
    tern_pool_for(c->pool, (long)n, 4096, fill_part, c);
    return 0;
}

/* The tensor list being built; info[k] says how ts[k] is drawn. */
typedef struct tlist {
    st_out_tensor *ts;
    fill_info *info;
    int n;
    uint64_t n_streams; /* one per logical tensor: blocks and scales share one */
} tlist;

/* Appends a tensor of up to 4 dims (trailing zero dims dropped), drawn from
 * the next stream (1, 2, ... in list order, so the families written before
 * gpt_oss keep their streams) unless stream is nonzero. */
static fill_info *add_nd(tlist *tl, tern_dtype dt, const int64_t *shape, const char *fmt, int l, uint64_t stream,
                         fill_kind kind)
{
    st_out_tensor *t = &tl->ts[tl->n];
    fill_info *fi = &tl->info[tl->n];
    memset(t, 0, sizeof *t);
    memset(fi, 0, sizeof *fi);
    snprintf(t->name, sizeof t->name, fmt, l);
    t->dtype = dt;
    while (t->n_dims < 4 && shape[t->n_dims])
        t->shape[t->n_dims] = shape[t->n_dims], t->n_dims++;
    fi->stream = stream ? stream : ++tl->n_streams;
    fi->kind = kind;
    tl->n++;
    return fi;
}

static void add(tlist *tl, tern_dtype dt, int64_t d0, int64_t d1, const char *fmt, int l)
{
    int64_t shape[4] = {d0, d1, 0, 0};
    add_nd(tl, dt, shape, fmt, l, 0, FILL_PLAIN);
}

/* A gpt_oss expert tensor of E experts, rows outputs and in_dim inputs each:
 * plain [E, in_dim, rows] (input-major, as the hub stores them), or as MXFP4
 * blocks + scales (output-major), or their decoded values. */
static void add_experts(tlist *tl, const fixture *fx, const char *name, int l, int rows, int in_dim, int k_lo,
                        fill_kind plain_kind)
{
    char fmt[128];
    uint64_t stream = ++tl->n_streams; /* the same for all three forms */
    int64_t E = fx->experts;
    if (fx->mxfp4) {
        int64_t bs[4] = {E, rows, in_dim / 32, 16}, ss[4] = {E, rows, in_dim / 32, 0};
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%s_blocks", name);
        fill_info *fi = add_nd(tl, TERN_U8, bs, fmt, l, stream, FILL_MX_BLOCKS);
        fi->rows = rows, fi->in_dim = in_dim, fi->k_lo = k_lo;
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%s_scales", name);
        fi = add_nd(tl, TERN_U8, ss, fmt, l, stream, FILL_MX_SCALES);
        fi->rows = rows, fi->in_dim = in_dim, fi->k_lo = k_lo;
    } else {
        int64_t sh[4] = {E, in_dim, rows, 0};
        snprintf(fmt, sizeof fmt, "model.layers.%%d.mlp.experts.%s", name);
        fill_info *fi = add_nd(tl, fx->dtype, sh, fmt, l, stream, fx->mxfp4_decoded ? FILL_MX_DECODED : plain_kind);
        fi->rows = rows, fi->in_dim = in_dim, fi->k_lo = k_lo;
    }
}

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, int required)
{
    char *s = tern_path_join(src_dir, name), *d = tern_path_join(dst_dir, name);
    size_t len;
    tern_err err;
    char *buf = tern_file_read(s, &len, 0, &err);
    int rc = 0;
    if (!buf) {
        if (required) {
            fprintf(stderr, "make_fixture: %s\n", err.msg);
            rc = 1;
        }
    } else {
        FILE *f = fopen(d, "wb");
        if (!f || fwrite(buf, 1, len, f) != len) {
            fprintf(stderr, "make_fixture: cannot write %s\n", d);
            rc = 1;
        }
        if (f)
            fclose(f);
    }
    free(buf);
    free(s);
    free(d);
    return rc;
}

static int write_config(const fixture *fx, const char *out)
{
    json_object *c = json_object_new_object();
    const char *arch = !strcmp(fx->family, "llama") ? "LlamaForCausalLM"
                       : !strcmp(fx->family, "mistral") ? "MistralForCausalLM"
                       : !strcmp(fx->family, "qwen2") ? "Qwen2ForCausalLM"
                       : !strcmp(fx->family, "gemma2") ? "Gemma2ForCausalLM"
                       : !strcmp(fx->family, "gemma3") ? "Gemma3ForCausalLM"
                       : !strcmp(fx->family, "qwen3_moe") ? "Qwen3MoeForCausalLM"
                       : !strcmp(fx->family, "mixtral") ? "MixtralForCausalLM"
                       : is_gpt_oss(fx->family)         ? "GptOssForCausalLM"
                                                       : "Qwen3ForCausalLM";
    json_object *archs = json_object_new_array();
    json_object_array_add(archs, json_object_new_string(arch));
    json_object_object_add(c, "architectures", archs);
    json_object_object_add(c, "model_type",
                           json_object_new_string(!strcmp(fx->family, "gemma3") ? "gemma3_text" : fx->family));
    json_object_object_add(c, "vocab_size", json_object_new_int(fx->vocab));
    json_object_object_add(c, "hidden_size", json_object_new_int(fx->dim));
    json_object_object_add(c, "intermediate_size", json_object_new_int(fx->ff));
    json_object_object_add(c, "num_hidden_layers", json_object_new_int(fx->layers));
    json_object_object_add(c, "num_attention_heads", json_object_new_int(fx->heads));
    json_object_object_add(c, "num_key_value_heads", json_object_new_int(fx->kv_heads));
    json_object_object_add(c, "head_dim", json_object_new_int(fx->head_dim));
    if (is_gemma(fx->family)) {
        json_object_object_add(c, "hidden_activation", json_object_new_string("gelu_pytorch_tanh"));
        json_object_object_add(c, "hidden_act", json_object_new_string("gelu_pytorch_tanh"));
        json_object_object_add(c, "query_pre_attn_scalar", json_object_new_int(fx->qpas > 0 ? (int)fx->qpas : fx->head_dim));
        json_object_object_add(c, "attn_logit_softcapping",
                               fx->attn_softcap > 0 ? json_object_new_double(fx->attn_softcap) : NULL);
        json_object_object_add(c, "final_logit_softcapping",
                               fx->final_softcap > 0 ? json_object_new_double(fx->final_softcap) : NULL);
        /* Gemma 2 alternates sliding (even layers) and full attention;
         * Gemma 3 slides except every sw_pattern-th layer. */
        json_object *lt = json_object_new_array();
        for (int l = 0; l < fx->layers; l++) {
            int sliding = !strcmp(fx->family, "gemma2") ? l % 2 == 0 : (l + 1) % fx->sw_pattern != 0;
            json_object_array_add(lt, json_object_new_string(sliding ? "sliding_attention" : "full_attention"));
        }
        json_object_object_add(c, "layer_types", lt);
        if (!strcmp(fx->family, "gemma3")) {
            json_object_object_add(c, "sliding_window_pattern", json_object_new_int(fx->sw_pattern));
            json_object_object_add(c, "rope_local_base_freq", json_object_new_double(fx->rope_local_theta));
        }
        json_object_object_add(c, "bos_token_id", json_object_new_int(2));
        json_object_object_add(c, "pad_token_id", json_object_new_int(0));
    } else {
        json_object_object_add(c, "hidden_act", json_object_new_string("silu"));
    }
    if (!strcmp(fx->family, "qwen3_moe")) {
        json_object_object_add(c, "num_experts", json_object_new_int(fx->experts));
        json_object_object_add(c, "num_experts_per_tok", json_object_new_int(fx->top_k));
        json_object_object_add(c, "moe_intermediate_size", json_object_new_int(fx->moe_ff));
        json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(fx->norm_topk));
        json_object_object_add(c, "decoder_sparse_step", json_object_new_int(fx->sparse_step));
        json_object *mo = json_object_new_array();
        for (int l = 0; l < fx->layers; l++)
            if ((l + 1) % fx->sparse_step == 0 && !layer_sparse(fx, l))
                json_object_array_add(mo, json_object_new_int(l));
        json_object_object_add(c, "mlp_only_layers", mo);
        json_object_object_add(c, "output_router_logits", json_object_new_boolean(0));
    } else if (!strcmp(fx->family, "mixtral")) {
        json_object_object_add(c, "num_local_experts", json_object_new_int(fx->experts));
        json_object_object_add(c, "num_experts_per_tok", json_object_new_int(fx->top_k));
        json_object_object_add(c, "output_router_logits", json_object_new_boolean(0));
    } else if (is_gpt_oss(fx->family)) {
        /* the published config's keys (intermediate_size is the experts' width) */
        json_object_object_add(c, "intermediate_size", json_object_new_int(fx->moe_ff));
        json_object_object_add(c, "num_local_experts", json_object_new_int(fx->experts));
        json_object_object_add(c, "num_experts_per_tok", json_object_new_int(fx->top_k));
        json_object_object_add(c, "experts_per_token", json_object_new_int(fx->top_k));
        json_object_object_add(c, "swiglu_limit", json_object_new_double(7.0));
        json_object_object_add(c, "initial_context_length", json_object_new_int(fx->rope_orig));
        json_object_object_add(c, "output_router_logits", json_object_new_boolean(0));
        json_object_object_add(c, "router_aux_loss_coef", json_object_new_double(0.9));
        json_object *lt = json_object_new_array();
        for (int l = 0; l < fx->layers; l++)
            json_object_array_add(lt, json_object_new_string(l % 2 == 0 ? "sliding_attention" : "full_attention"));
        json_object_object_add(c, "layer_types", lt);
        if (fx->mxfp4) {
            json_object *q = json_object_new_object(), *keep = json_object_new_array();
            const char *nk[4] = {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                 "lm_head"};
            for (int k = 0; k < 4; k++)
                json_object_array_add(keep, json_object_new_string(nk[k]));
            json_object_object_add(q, "modules_to_not_convert", keep);
            json_object_object_add(q, "quant_method", json_object_new_string("mxfp4"));
            json_object_object_add(c, "quantization_config", q);
        }
    }
    if (fx->sliding_window > 0)
        json_object_object_add(c, "sliding_window", json_object_new_int(fx->sliding_window));
    if (fx->rope_scaling) {
        json_object *rs = json_object_new_object();
        json_object_object_add(rs, "rope_type", json_object_new_string(fx->rope_scaling));
        json_object_object_add(rs, "factor", json_object_new_double(fx->rope_factor));
        if (!strcmp(fx->rope_scaling, "llama3")) {
            json_object_object_add(rs, "low_freq_factor", json_object_new_double(1.0));
            json_object_object_add(rs, "high_freq_factor", json_object_new_double(4.0));
            json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(fx->rope_orig));
        } else if (!strcmp(fx->rope_scaling, "yarn")) { /* gpt-oss's published values */
            json_object_object_add(rs, "beta_fast", json_object_new_double(32.0));
            json_object_object_add(rs, "beta_slow", json_object_new_double(1.0));
            json_object_object_add(rs, "truncate", json_object_new_boolean(0));
            json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(fx->rope_orig));
        }
        json_object_object_add(c, "rope_scaling", rs);
    }
    json_object_object_add(c, "max_position_embeddings", json_object_new_int(fx->max_pos));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(is_gpt_oss(fx->family) ? 1e-5 : 1e-6));
    json_object_object_add(c, "rope_theta", json_object_new_double(fx->rope_theta));
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(fx->tie));
    json_object_object_add(c, "attention_bias",
                           json_object_new_boolean(!strcmp(fx->family, "qwen2") || is_gpt_oss(fx->family)));
    json_object_object_add(c, "torch_dtype", json_object_new_string(fx->dtype == TERN_F32 ? "float32"
                                                                   : fx->dtype == TERN_BF16 ? "bfloat16"
                                                                                            : "float16"));
    json_object_object_add(c, "eos_token_id", json_object_new_int(0));
    char *path = tern_path_join(out, "config.json");
    int rc = json_object_to_file_ext(path, c, JSON_C_TO_STRING_PRETTY) ? 1 : 0;
    free(path);
    json_object_put(c);
    return rc;
}

int main(int argc, char **argv)
{
    fixture fx = {"llama", 64, 2, 4, 2, 0, 128, 0, 512, 0, 1, 10000.0, TERN_F32, 1, 0, 6, 8192, 0, NULL, 8.0,
                  0, 0, 0, 10000.0, 8, 2, 32, 1, 1, NULL, 0, 0};
    const char *out = NULL, *tokdir = NULL, *preset = NULL;
    int layers_arg = 0, factor_set = 0, orig_set = 0, max_pos_set = 0, theta_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "make_fixture: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--family")) fx.family = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--tokenizer")) tokdir = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--dim")) fx.dim = atoi(v);
        else if (!strcmp(a, "--layers")) fx.layers = layers_arg = atoi(v);
        else if (!strcmp(a, "--heads")) fx.heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) fx.kv_heads = atoi(v);
        else if (!strcmp(a, "--head-dim")) fx.head_dim = atoi(v);
        else if (!strcmp(a, "--ff")) fx.ff = atoi(v);
        else if (!strcmp(a, "--vocab")) fx.vocab = atoi(v);
        else if (!strcmp(a, "--max-pos")) fx.max_pos = atoi(v), max_pos_set = 1;
        else if (!strcmp(a, "--tie")) fx.tie = atoi(v), fx.tie_set = 1;
        else if (!strcmp(a, "--sliding-window")) fx.sliding_window = atoi(v);
        else if (!strcmp(a, "--sw-pattern")) fx.sw_pattern = atoi(v);
        else if (!strcmp(a, "--rope-orig")) fx.rope_orig = atoi(v), orig_set = 1;
        else if (!strcmp(a, "--rope-scaling")) fx.rope_scaling = v;
        else if (!strcmp(a, "--rope-factor")) fx.rope_factor = atof(v), factor_set = 1;
        else if (!strcmp(a, "--attn-softcap")) fx.attn_softcap = atof(v);
        else if (!strcmp(a, "--final-softcap")) fx.final_softcap = atof(v);
        else if (!strcmp(a, "--qpas")) fx.qpas = atof(v);
        else if (!strcmp(a, "--rope-local-theta")) fx.rope_local_theta = atof(v);
        else if (!strcmp(a, "--shards")) fx.shards = atoi(v);
        else if (!strcmp(a, "--experts")) fx.experts = atoi(v);
        else if (!strcmp(a, "--top-k")) fx.top_k = atoi(v);
        else if (!strcmp(a, "--moe-ff")) fx.moe_ff = atoi(v);
        else if (!strcmp(a, "--norm-topk")) fx.norm_topk = atoi(v);
        else if (!strcmp(a, "--sparse-step")) fx.sparse_step = atoi(v);
        else if (!strcmp(a, "--mlp-only")) fx.mlp_only = v;
        else if (!strcmp(a, "--mxfp4")) fx.mxfp4 = atoi(v);
        else if (!strcmp(a, "--mxfp4-decoded")) fx.mxfp4_decoded = atoi(v);
        else if (!strcmp(a, "--seed")) fx.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--rope-theta")) fx.rope_theta = atof(v), theta_set = 1;
        else if (!strcmp(a, "--dtype")) {
            fx.dtype = !strcmp(v, "f32") ? TERN_F32 : !strcmp(v, "bf16") ? TERN_BF16 : !strcmp(v, "f16") ? TERN_F16 : TERN_DTYPE_COUNT;
            if (fx.dtype == TERN_DTYPE_COUNT) {
                fprintf(stderr, "make_fixture: --dtype must be f32, bf16 or f16\n");
                return 2;
            }
        } else {
            fprintf(stderr, "make_fixture: unknown option %s\n", a);
            return 2;
        }
    }
    if (preset) { /* shapes of real models of that size */
        if (!strcmp(preset, "tiny")) {
            fx.dim = 64, fx.layers = 2, fx.heads = 4, fx.kv_heads = 2, fx.ff = 128;
        } else if (!strcmp(preset, "0.5b")) { /* Qwen2.5-0.5B */
            fx.dim = 896, fx.layers = 24, fx.heads = 14, fx.kv_heads = 2, fx.head_dim = 64, fx.ff = 4864;
            fx.tie = 1, fx.max_pos = 4096, fx.rope_theta = 1e6;
        } else if (!strcmp(preset, "1b")) { /* Llama-3.2-1B */
            fx.dim = 2048, fx.layers = 16, fx.heads = 32, fx.kv_heads = 8, fx.head_dim = 64, fx.ff = 8192;
            fx.tie = 1, fx.max_pos = 4096, fx.rope_theta = 500000;
        } else if (!strcmp(preset, "8b")) { /* Llama-3.1-8B */
            fx.dim = 4096, fx.layers = 32, fx.heads = 32, fx.kv_heads = 8, fx.head_dim = 128, fx.ff = 14336;
            fx.tie = 0, fx.max_pos = 8192, fx.rope_theta = 500000;
        } else if (!strcmp(preset, "gpt-oss-20b") || !strcmp(preset, "gpt-oss-120b")) { /* openai/gpt-oss-* */
            const int big = !strcmp(preset, "gpt-oss-120b");
            fx.family = "gpt_oss";
            fx.dim = 2880, fx.layers = big ? 36 : 24, fx.heads = 64, fx.kv_heads = 8, fx.head_dim = 64;
            fx.experts = big ? 128 : 32, fx.top_k = 4, fx.moe_ff = 2880, fx.sliding_window = 128;
            fx.tie = 0, fx.rope_theta = 150000;
            if (!fx.vocab) /* a --vocab given overrides it (a small head, to time the layers) */
                fx.vocab = 201088;
        } else if (!strcmp(preset, "30b-a3b")) { /* Qwen3-30B-A3B */
            fx.family = "qwen3_moe";
            fx.dim = 2048, fx.layers = 48, fx.heads = 32, fx.kv_heads = 4, fx.head_dim = 128, fx.ff = 6144;
            fx.experts = 128, fx.top_k = 8, fx.moe_ff = 768, fx.norm_topk = 1, fx.sparse_step = 1;
            fx.tie = 0, fx.max_pos = 40960, fx.rope_theta = 1e6;
        } else {
            fprintf(stderr, "make_fixture: unknown preset %s\n", preset);
            return 2;
        }
        if (layers_arg > 0)
            fx.layers = layers_arg;
    }
    if (!out || !tokdir) {
        fprintf(stderr, "usage: make_fixture --family F --out DIR --tokenizer DIR [options] (see source)\n");
        return 2;
    }
    if (strcmp(fx.family, "llama") && strcmp(fx.family, "mistral") && strcmp(fx.family, "qwen2") &&
        strcmp(fx.family, "qwen3") && strcmp(fx.family, "gemma2") && strcmp(fx.family, "gemma3") &&
        !is_moe(fx.family) && !is_gpt_oss(fx.family)) {
        fprintf(stderr, "make_fixture: family must be llama, mistral, qwen2, qwen3, gemma2, gemma3, qwen3_moe, "
                        "mixtral or gpt_oss\n");
        return 2;
    }
    if (is_gpt_oss(fx.family)) {
        if (!fx.rope_scaling) {
            fx.rope_scaling = "yarn";
            if (!orig_set)
                fx.rope_orig = 4096;
            if (!factor_set)
                fx.rope_factor = 32;
        }
        if (!theta_set && !preset)
            fx.rope_theta = 150000; /* as published */
        /* as published: max_position_embeddings = factor * original (some
         * transformers versions derive the YaRN factor from that ratio) */
        if (!max_pos_set)
            fx.max_pos = (int)(fx.rope_factor * fx.rope_orig);
        if (fx.experts < 1 || fx.top_k < 1 || fx.top_k > fx.experts || fx.moe_ff < 1) {
            fprintf(stderr, "make_fixture: need 1 <= --top-k <= --experts, --moe-ff >= 1\n");
            return 2;
        }
        if ((fx.mxfp4 || fx.mxfp4_decoded) && (fx.dim % 32 || fx.moe_ff % 32)) {
            fprintf(stderr, "make_fixture: MXFP4 experts need --dim and --moe-ff multiples of 32\n");
            return 2;
        }
        if (fx.mxfp4 && fx.mxfp4_decoded) {
            fprintf(stderr, "make_fixture: --mxfp4 and --mxfp4-decoded exclude each other\n");
            return 2;
        }
    } else if (fx.mxfp4 || fx.mxfp4_decoded) {
        fprintf(stderr, "make_fixture: --mxfp4 and --mxfp4-decoded are for gpt_oss\n");
        return 2;
    }
    if (is_moe(fx.family) && (fx.experts < 1 || fx.top_k < 1 || fx.top_k > fx.experts || fx.moe_ff < 1 ||
                              fx.sparse_step < 1)) {
        fprintf(stderr, "make_fixture: need 1 <= --top-k <= --experts, --moe-ff >= 1, --sparse-step >= 1\n");
        return 2;
    }
    if (fx.rope_scaling && strcmp(fx.rope_scaling, "llama3") && strcmp(fx.rope_scaling, "linear") &&
        strcmp(fx.rope_scaling, "yarn")) {
        fprintf(stderr, "make_fixture: --rope-scaling must be llama3, linear or yarn\n");
        return 2;
    }
    if (fx.sw_pattern < 1)
        fx.sw_pattern = 1;
    if (is_gemma(fx.family) && !fx.tie_set)
        fx.tie = 1; /* every released Gemma ties its head to the embedding */
    if (fx.head_dim == 0)
        fx.head_dim = fx.dim / fx.heads;
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(tokdir, &err);
    if (!tok) {
        fprintf(stderr, "make_fixture: %s\n", err.msg);
        return 1;
    }
    int tv = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    if (fx.vocab == 0)
        fx.vocab = tv;
    if (fx.vocab < tv) {
        fprintf(stderr, "make_fixture: --vocab %d is smaller than the tokenizer's %d ids\n", fx.vocab, tv);
        return 2;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_fixture: cannot create %s: %s\n", out, strerror(errno));
        return 1;
    }
    int L = fx.layers, qd = fx.heads * fx.head_dim, kvd = fx.kv_heads * fx.head_dim;
    int max_t = 4 + L * (24 + (is_moe(fx.family) ? 1 + 3 * fx.experts : 0));
    int gemma = is_gemma(fx.family);
    tlist tl = {calloc((size_t)max_t, sizeof(st_out_tensor)), calloc((size_t)max_t, sizeof(fill_info)), 0, 0};
    if (!tl.ts || !tl.info) {
        fprintf(stderr, "make_fixture: out of memory\n");
        return 1;
    }
    st_out_tensor *ts = tl.ts;
    tern_dtype dt = fx.dtype;
    add(&tl, dt, fx.vocab, fx.dim, "model.embed_tokens.weight", 0);
    for (int l = 0; l < L; l++) {
        add(&tl, dt, fx.dim, 0, "model.layers.%d.input_layernorm.weight", l);
        add(&tl, dt, qd, fx.dim, "model.layers.%d.self_attn.q_proj.weight", l);
        add(&tl, dt, kvd, fx.dim, "model.layers.%d.self_attn.k_proj.weight", l);
        add(&tl, dt, kvd, fx.dim, "model.layers.%d.self_attn.v_proj.weight", l);
        if (!strcmp(fx.family, "qwen2") || is_gpt_oss(fx.family)) {
            add(&tl, dt, qd, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(&tl, dt, kvd, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(&tl, dt, kvd, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (!strcmp(fx.family, "qwen3") || !strcmp(fx.family, "gemma3") || !strcmp(fx.family, "qwen3_moe")) {
            add(&tl, dt, fx.head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(&tl, dt, fx.head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add(&tl, dt, fx.dim, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        if (is_gpt_oss(fx.family)) {
            add(&tl, dt, fx.dim, 0, "model.layers.%d.self_attn.o_proj.bias", l);
            int64_t sh[4] = {fx.heads, 0, 0, 0};
            add_nd(&tl, dt, sh, "model.layers.%d.self_attn.sinks", l, 0, FILL_SINK);
        }
        add(&tl, dt, fx.dim, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (gemma) {
            add(&tl, dt, fx.dim, 0, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            add(&tl, dt, fx.dim, 0, "model.layers.%d.post_feedforward_layernorm.weight", l);
        }
        if (is_gpt_oss(fx.family)) {
            int64_t E = fx.experts, I = fx.moe_ff;
            add(&tl, dt, E, fx.dim, "model.layers.%d.mlp.router.weight", l);
            add(&tl, dt, E, 0, "model.layers.%d.mlp.router.bias", l);
            add_experts(&tl, &fx, "gate_up_proj", l, 2 * fx.moe_ff, fx.dim, -8, FILL_PLAIN);
            int64_t gb[4] = {E, 2 * I, 0, 0}, db[4] = {E, fx.dim, 0, 0};
            add_nd(&tl, dt, gb, "model.layers.%d.mlp.experts.gate_up_proj_bias", l, 0, FILL_WIDE_BIAS);
            add_experts(&tl, &fx, "down_proj", l, fx.dim, fx.moe_ff, -13, FILL_SMALL);
            add_nd(&tl, dt, db, "model.layers.%d.mlp.experts.down_proj_bias", l, 0, FILL_PLAIN);
        } else if (is_moe(fx.family) && layer_sparse(&fx, l)) {
            int mix = !strcmp(fx.family, "mixtral"), eff = mix ? fx.ff : fx.moe_ff;
            const char *blk = mix ? "block_sparse_moe" : "mlp";
            char fmt[128];
            snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.gate.weight", blk);
            add(&tl, dt, fx.experts, fx.dim, fmt, l);
            for (int e = 0; e < fx.experts; e++) {
                const char *nm[3] = {mix ? "w1" : "gate_proj", mix ? "w3" : "up_proj", mix ? "w2" : "down_proj"};
                for (int k = 0; k < 3; k++) {
                    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.experts.%d.%s.weight", blk, e, nm[k]);
                    add(&tl, dt, k < 2 ? eff : fx.dim, k < 2 ? fx.dim : eff, fmt, l);
                }
            }
        } else {
            add(&tl, dt, fx.ff, fx.dim, "model.layers.%d.mlp.gate_proj.weight", l);
            add(&tl, dt, fx.ff, fx.dim, "model.layers.%d.mlp.up_proj.weight", l);
            add(&tl, dt, fx.dim, fx.ff, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    add(&tl, dt, fx.dim, 0, "model.norm.weight", 0);
    if (!fx.tie)
        add(&tl, dt, fx.vocab, fx.dim, "lm_head.weight", 0);

    int n = tl.n;
    int shards = fx.shards < 1 ? 1 : fx.shards > n ? n : fx.shards;
    json_object *wm = json_object_new_object();
    int rc = 0;
    tern_pool *pool = tern_pool_new(0);
    if (!pool) {
        fprintf(stderr, "make_fixture: cannot start threads\n");
        return 1;
    }
    for (int s = 0, first = 0; s < shards && !rc; s++) {
        int last = (int)((long)n * (s + 1) / shards);
        char name[64];
        if (shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
        char *path = tern_path_join(out, name);
        fill_ctx fc = {ts + first, tl.info + first, fx.seed, first, gemma, pool, 0, 0, NULL};
        rc = st_write_file(path, ts + first, last - first, fill, &fc, &err);
        free(path);
        for (int k = first; k < last; k++)
            json_object_object_add(wm, ts[k].name, json_object_new_string(name));
        first = last;
    }
    tern_pool_free(pool);
    if (!rc && shards > 1) {
        json_object *idx = json_object_new_object();
        json_object_object_add(idx, "metadata", json_object_new_object());
        json_object_object_add(idx, "weight_map", wm);
        char *path = tern_path_join(out, "model.safetensors.index.json");
        rc = json_object_to_file_ext(path, idx, JSON_C_TO_STRING_PRETTY) ? tern_err_set(&err, TERN_EIO, "cannot write index") : 0;
        free(path);
        json_object_put(idx);
    } else {
        json_object_put(wm);
    }
    if (rc) {
        fprintf(stderr, "make_fixture: %s\n", err.msg);
        free(ts);
        free(tl.info);
        return 1;
    }
    free(ts);
    free(tl.info);
    if (write_config(&fx, out) || copy_file(tokdir, out, "tokenizer.json", 1) ||
        copy_file(tokdir, out, "tokenizer_config.json", 0))
        return 1;
    return 0;
}
