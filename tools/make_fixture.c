/* make_fixture: writes a random-initialized Hugging Face model folder of a
 * given family and shape, deterministic from a seed - for tests and
 * benchmarks of models we cannot download.
 *
 *   make_fixture --family llama|mistral|qwen2|qwen3|gemma2|gemma3|qwen3_moe|mixtral --out DIR
 *                --tokenizer DIR
 *                [--preset tiny|0.5b|1b|8b|30b-a3b] [--dim N] [--layers N] [--heads N]
 *                [--kv-heads N] [--head-dim N] [--ff N] [--vocab N]
 *                [--dtype f32|bf16|f16] [--seed S] [--shards N] [--tie 0|1]
 *                [--max-pos N] [--rope-theta X] [--sliding-window N]
 *                [--rope-scaling llama3|linear] [--rope-factor X]
 *                [--rope-orig N] (llama3: original_max_position_embeddings)
 *                [--attn-softcap X] [--final-softcap X] [--qpas N]
 *                [--sw-pattern N] [--rope-local-theta X]   (gemma)
 *                [--experts N] [--top-k K] [--moe-ff N]      (qwen3_moe, mixtral)
 *                [--norm-topk 0|1] [--sparse-step N] [--mlp-only L,L,...] (qwen3_moe)
 *
 * Mixtures of experts: qwen3_moe writes the hub's layout (mlp.gate, the
 * experts' mlp.experts.N.{gate,up,down}_proj, --moe-ff wide; layers in
 * --mlp-only or off the --sparse-step keep a dense --ff MLP); mixtral writes
 * block_sparse_moe.gate and block_sparse_moe.experts.N.{w1,w2,w3}, --ff wide.
 * --preset 30b-a3b is Qwen3-30B-A3B's shape (qwen3_moe: 48 layers, 128
 * experts, 8 a token, 768 wide); a --layers given with a preset overrides
 * its layer count (a shorter stack of the same layers, for benchmarks).
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
} fixture;

static int is_gemma(const char *f) { return !strncmp(f, "gemma", 5); }

static int is_moe(const char *f) { return !strcmp(f, "qwen3_moe") || !strcmp(f, "mixtral"); }

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
    uint64_t seed;
    int first_index; /* global index of ts[0], so shards draw distinct streams */
    int gemma;       /* norms stored as gain - 1 */
    tern_pool *pool;
    /* the chunk being produced */
    int i;
    int64_t first;
    void *buf;
} fill_ctx;

/* Elements [first + b, first + e) of the chunk: tensor i's stream advanced
 * to its element first + b, so the pieces equal one sequential pass. */
static void fill_part(void *vctx, long b, long e, int worker)
{
    (void)worker;
    fill_ctx *c = vctx;
    const st_out_tensor *t = &c->ts[c->i];
    tern_rng rng;
    tern_rng_seed(&rng, c->seed, (uint64_t)(c->first_index + c->i) + 1);
    tern_rng_advance(&rng, (uint64_t)(c->first + b));
    int is_norm = t->n_dims == 1 && strstr(t->name, "norm");
    int is_bias = t->n_dims == 1 && strstr(t->name, "bias");
    const float a = 0.0346410f; /* sqrt(3) * 0.02 */
    for (long k = b; k < e; k++) {
        float u = tern_rng_f32(&rng) * 2.0f - 1.0f;
        float v = is_norm ? (c->gemma ? 0.0f : 1.0f) + 0.1f * u : is_bias ? 0.02f * u : a * u;
        switch (t->dtype) {
        case TERN_F32: ((float *)c->buf)[k] = v; break;
        case TERN_BF16: ((uint16_t *)c->buf)[k] = tern_f32_to_bf16(v); break;
        default: ((uint16_t *)c->buf)[k] = tern_f32_to_f16(v); break;
        }
    }
}

/* Each tensor has its own stream (seed, global index) so any element can be
 * regenerated without the others; a chunk is produced by all cores. */
static int fill(void *vctx, int i, int64_t first, int64_t n, void *buf)
{
    fill_ctx *c = vctx;
    tern_dtype dt = c->ts[i].dtype;
    if (dt != TERN_F32 && dt != TERN_BF16 && dt != TERN_F16)
        return TERN_EINVAL;
    c->i = i;
    c->first = first;
    c->buf = buf;
    tern_pool_for(c->pool, (long)n, 4096, fill_part, c);
    return 0;
}

static void add(st_out_tensor *ts, int *n, tern_dtype dt, int64_t d0, int64_t d1, const char *fmt, int l)
{
    st_out_tensor *t = &ts[(*n)++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, l);
    t->dtype = dt;
    t->n_dims = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
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
        }
        json_object_object_add(c, "rope_scaling", rs);
    }
    json_object_object_add(c, "max_position_embeddings", json_object_new_int(fx->max_pos));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(1e-6));
    json_object_object_add(c, "rope_theta", json_object_new_double(fx->rope_theta));
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(fx->tie));
    json_object_object_add(c, "attention_bias", json_object_new_boolean(!strcmp(fx->family, "qwen2")));
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
                  0, 0, 0, 10000.0, 8, 2, 32, 1, 1, NULL};
    const char *out = NULL, *tokdir = NULL, *preset = NULL;
    int layers_arg = 0;
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
        else if (!strcmp(a, "--max-pos")) fx.max_pos = atoi(v);
        else if (!strcmp(a, "--tie")) fx.tie = atoi(v), fx.tie_set = 1;
        else if (!strcmp(a, "--sliding-window")) fx.sliding_window = atoi(v);
        else if (!strcmp(a, "--sw-pattern")) fx.sw_pattern = atoi(v);
        else if (!strcmp(a, "--rope-orig")) fx.rope_orig = atoi(v);
        else if (!strcmp(a, "--rope-scaling")) fx.rope_scaling = v;
        else if (!strcmp(a, "--rope-factor")) fx.rope_factor = atof(v);
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
        else if (!strcmp(a, "--seed")) fx.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--rope-theta")) fx.rope_theta = atof(v);
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
        !is_moe(fx.family)) {
        fprintf(stderr, "make_fixture: family must be llama, mistral, qwen2, qwen3, gemma2, gemma3, qwen3_moe or "
                        "mixtral\n");
        return 2;
    }
    if (is_moe(fx.family) && (fx.experts < 1 || fx.top_k < 1 || fx.top_k > fx.experts || fx.moe_ff < 1 ||
                              fx.sparse_step < 1)) {
        fprintf(stderr, "make_fixture: need 1 <= --top-k <= --experts, --moe-ff >= 1, --sparse-step >= 1\n");
        return 2;
    }
    if (fx.rope_scaling && strcmp(fx.rope_scaling, "llama3") && strcmp(fx.rope_scaling, "linear")) {
        fprintf(stderr, "make_fixture: --rope-scaling must be llama3 or linear\n");
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
    int max_t = 4 + L * (16 + (is_moe(fx.family) ? 1 + 3 * fx.experts : 0));
    int gemma = is_gemma(fx.family);
    st_out_tensor *ts = calloc((size_t)max_t, sizeof *ts);
    int n = 0;
    tern_dtype dt = fx.dtype;
    add(ts, &n, dt, fx.vocab, fx.dim, "model.embed_tokens.weight", 0);
    for (int l = 0; l < L; l++) {
        add(ts, &n, dt, fx.dim, 0, "model.layers.%d.input_layernorm.weight", l);
        add(ts, &n, dt, qd, fx.dim, "model.layers.%d.self_attn.q_proj.weight", l);
        add(ts, &n, dt, kvd, fx.dim, "model.layers.%d.self_attn.k_proj.weight", l);
        add(ts, &n, dt, kvd, fx.dim, "model.layers.%d.self_attn.v_proj.weight", l);
        if (!strcmp(fx.family, "qwen2")) {
            add(ts, &n, dt, qd, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(ts, &n, dt, kvd, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(ts, &n, dt, kvd, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (!strcmp(fx.family, "qwen3") || !strcmp(fx.family, "gemma3") || !strcmp(fx.family, "qwen3_moe")) {
            add(ts, &n, dt, fx.head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add(ts, &n, dt, fx.head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add(ts, &n, dt, fx.dim, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        add(ts, &n, dt, fx.dim, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (gemma) {
            add(ts, &n, dt, fx.dim, 0, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            add(ts, &n, dt, fx.dim, 0, "model.layers.%d.post_feedforward_layernorm.weight", l);
        }
        if (is_moe(fx.family) && layer_sparse(&fx, l)) {
            int mix = !strcmp(fx.family, "mixtral"), eff = mix ? fx.ff : fx.moe_ff;
            const char *blk = mix ? "block_sparse_moe" : "mlp";
            char fmt[128];
            snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.gate.weight", blk);
            add(ts, &n, dt, fx.experts, fx.dim, fmt, l);
            for (int e = 0; e < fx.experts; e++) {
                const char *nm[3] = {mix ? "w1" : "gate_proj", mix ? "w3" : "up_proj", mix ? "w2" : "down_proj"};
                for (int k = 0; k < 3; k++) {
                    snprintf(fmt, sizeof fmt, "model.layers.%%d.%s.experts.%d.%s.weight", blk, e, nm[k]);
                    add(ts, &n, dt, k < 2 ? eff : fx.dim, k < 2 ? fx.dim : eff, fmt, l);
                }
            }
        } else {
            add(ts, &n, dt, fx.ff, fx.dim, "model.layers.%d.mlp.gate_proj.weight", l);
            add(ts, &n, dt, fx.ff, fx.dim, "model.layers.%d.mlp.up_proj.weight", l);
            add(ts, &n, dt, fx.dim, fx.ff, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
    add(ts, &n, dt, fx.dim, 0, "model.norm.weight", 0);
    if (!fx.tie)
        add(ts, &n, dt, fx.vocab, fx.dim, "lm_head.weight", 0);

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
        fill_ctx fc = {ts + first, fx.seed, first, gemma, pool, 0, 0, NULL};
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
        return 1;
    }
    free(ts);
    if (write_config(&fx, out) || copy_file(tokdir, out, "tokenizer.json", 1) ||
        copy_file(tokdir, out, "tokenizer_config.json", 0))
        return 1;
    return 0;
}
