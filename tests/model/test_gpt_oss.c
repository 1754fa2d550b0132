/* gpt_oss against an independent double-precision reference written here
 * from transformers' modeling_gpt_oss.py (so it holds before and beside the
 * HF goldens): the weights read straight from the safetensors file (the
 * stacked experts in their hub layout, [expert][input][output], gate and up
 * interleaved by column), YaRN's inverse frequencies and attention factor
 * from their formulas, attention with a sink logit per head and sliding
 * windows on alternate layers, the router's top-k of the logits then
 * softmax, the clamped SwiGLU with biases. The fixture's window (4) is
 * crossed by the 12 tokens; its gate_up biases reach past the clamp (+-7)
 * and its sinks take a real share of the softmax (make_fixture). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "model/model_int.h" /* internals: the RoPE table */
#include "model/safetensors.h"
#include "test_util.h"

enum { N = 12, D = 64, L = 4, H = 4, KV = 2, HD = 32, E = 8, K = 4, I = 32, WIN = 4 };
static const int32_t IDS[N] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};

static char g_dir[64];

static const char *build(void) { return getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build"; }

static st_set g_st;

/* Tensor name (printf-style) as doubles, checking its element count. */
static double *tensor(long n, const char *fmt, ...)
{
    char name[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const st_tensor *t = st_find(&g_st, name);
    if (!t)
        fail_msg("fixture lacks %s", name);
    assert_int_equal(st_numel(t), n);
    assert_int_equal(t->dtype, TERN_F32);
    double *out = malloc((size_t)n * sizeof *out);
    for (long i = 0; i < n; i++)
        out[i] = ((const float *)t->data)[i];
    return out;
}

/* y[o] = sum_i W[o][i] x[i] + b[o] (nn.Linear); b may be NULL. */
static void linear(const double *W, const double *b, const double *x, int n_out, int n_in, double *y)
{
    for (int o = 0; o < n_out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < n_in; i++)
            s += W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void rmsnorm(const double *x, const double *w, double *out)
{
    double ss = 0;
    for (int i = 0; i < D; i++)
        ss += x[i] * x[i];
    double r = 1 / sqrt(ss / D + 1e-5);
    for (int i = 0; i < D; i++)
        out[i] = x[i] * r * w[i];
}

/* YaRN (factor 32, original 4096, beta 32 / 1, no truncation, theta 150000). */
static void yarn(double *inv, double *af)
{
    double theta = 150000, f = 32, orig = 4096;
    double lo = HD * log(orig / (32 * 2 * M_PI)) / (2 * log(theta)), hi = HD * log(orig / (1 * 2 * M_PI)) / (2 * log(theta));
    lo = fmax(lo, 0), hi = fmin(hi, HD - 1);
    for (int i = 0; i < HD / 2; i++) {
        double p = pow(theta, 2.0 * i / HD), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        double extrap = 1 - ramp; /* the share of the original frequency */
        inv[i] = 1 / (f * p) * (1 - extrap) + 1 / p * extrap;
    }
    *af = 0.1 * log(f) + 1;
}

static void reference(double *logits /* [N][V] */, int V)
{
    double inv[HD / 2], af;
    yarn(inv, &af);
    double *emb = tensor((long)V * D, "model.embed_tokens.weight");
    double x[N][D], xn[N][D], q[N][H * HD], k[N][KV * HD], v[N][KV * HD], att[N][H * HD], tmp[D];
    for (int t = 0; t < N; t++)
        for (int i = 0; i < D; i++)
            x[t][i] = emb[(size_t)IDS[t] * D + i];
    free(emb);
    for (int l = 0; l < L; l++) {
        double *an = tensor(D, "model.layers.%d.input_layernorm.weight", l);
        double *wq = tensor(H * HD * D, "model.layers.%d.self_attn.q_proj.weight", l),
               *bq = tensor(H * HD, "model.layers.%d.self_attn.q_proj.bias", l);
        double *wk = tensor(KV * HD * D, "model.layers.%d.self_attn.k_proj.weight", l),
               *bk = tensor(KV * HD, "model.layers.%d.self_attn.k_proj.bias", l);
        double *wv = tensor(KV * HD * D, "model.layers.%d.self_attn.v_proj.weight", l),
               *bv = tensor(KV * HD, "model.layers.%d.self_attn.v_proj.bias", l);
        double *wo = tensor(D * H * HD, "model.layers.%d.self_attn.o_proj.weight", l),
               *bo = tensor(D, "model.layers.%d.self_attn.o_proj.bias", l);
        double *sinks = tensor(H, "model.layers.%d.self_attn.sinks", l);
        double *fn = tensor(D, "model.layers.%d.post_attention_layernorm.weight", l);
        double *wr = tensor(E * D, "model.layers.%d.mlp.router.weight", l), *br = tensor(E, "model.layers.%d.mlp.router.bias", l);
        double *gu = tensor((long)E * D * 2 * I, "model.layers.%d.mlp.experts.gate_up_proj", l);
        double *gub = tensor(E * 2 * I, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        double *dn = tensor((long)E * I * D, "model.layers.%d.mlp.experts.down_proj", l);
        double *dnb = tensor(E * D, "model.layers.%d.mlp.experts.down_proj_bias", l);
        for (int t = 0; t < N; t++) {
            rmsnorm(x[t], an, xn[t]);
            linear(wq, bq, xn[t], H * HD, D, q[t]);
            linear(wk, bk, xn[t], KV * HD, D, k[t]);
            linear(wv, bv, xn[t], KV * HD, D, v[t]);
            for (int hh = 0; hh < H + KV; hh++) { /* rotate_half with cos, sin times the attention factor */
                double *h = hh < H ? q[t] + hh * HD : k[t] + (hh - H) * HD;
                for (int i = 0; i < HD / 2; i++) {
                    double c = cos(t * inv[i]) * af, s = sin(t * inv[i]) * af, a = h[i], b = h[i + HD / 2];
                    h[i] = a * c - b * s;
                    h[i + HD / 2] = b * c + a * s;
                }
            }
        }
        for (int t = 0; t < N; t++)
            for (int h = 0; h < H; h++) {
                int kvh = h / (H / KV), lo = l % 2 == 0 && t - WIN + 1 > 0 ? t - WIN + 1 : 0; /* even layers slide */
                double sc[N], mx = sinks[h], sum = 0;
                for (int j = lo; j <= t; j++) {
                    double d = 0;
                    for (int e = 0; e < HD; e++)
                        d += q[t][h * HD + e] * k[j][kvh * HD + e];
                    sc[j] = d / sqrt(HD);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = lo; j <= t; j++)
                    sum += sc[j] = exp(sc[j] - mx);
                sum += exp(sinks[h] - mx); /* the sink's probability is dropped */
                for (int e = 0; e < HD; e++) {
                    double o = 0;
                    for (int j = lo; j <= t; j++)
                        o += sc[j] / sum * v[j][kvh * HD + e];
                    att[t][h * HD + e] = o;
                }
            }
        for (int t = 0; t < N; t++) {
            linear(wo, bo, att[t], D, H * HD, tmp);
            for (int i = 0; i < D; i++)
                x[t][i] += tmp[i];
            rmsnorm(x[t], fn, xn[t]);
            double lg[E], w[K];
            int sel[K], used[E] = {0};
            linear(wr, br, xn[t], E, D, lg);
            for (int c = 0; c < K; c++) { /* top-k of the logits, then their softmax */
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!used[e] && (best < 0 || lg[e] > lg[best]))
                        best = e;
                used[best] = 1;
                sel[c] = best;
            }
            double s = 0;
            for (int c = 0; c < K; c++)
                s += w[c] = exp(lg[sel[c]] - lg[sel[0]]);
            double out[D] = {0};
            for (int c = 0; c < K; c++) {
                int e = sel[c];
                double act[I], y[D];
                for (int j = 0; j < I; j++) { /* columns 2j (gate) and 2j + 1 (up) of [D][2I] */
                    double g = gub[e * 2 * I + 2 * j], u = gub[e * 2 * I + 2 * j + 1];
                    for (int i = 0; i < D; i++) {
                        g += xn[t][i] * gu[((size_t)e * D + i) * 2 * I + 2 * j];
                        u += xn[t][i] * gu[((size_t)e * D + i) * 2 * I + 2 * j + 1];
                    }
                    g = fmin(g, 7.0);
                    u = fmin(fmax(u, -7.0), 7.0);
                    act[j] = (u + 1) * g / (1 + exp(-1.702 * g));
                }
                for (int o = 0; o < D; o++) { /* down [I][D] */
                    y[o] = dnb[e * D + o];
                    for (int j = 0; j < I; j++)
                        y[o] += act[j] * dn[((size_t)e * I + j) * D + o];
                    out[o] += y[o] * w[c] / s;
                }
            }
            for (int i = 0; i < D; i++)
                x[t][i] += out[i];
        }
        free(an), free(wq), free(bq), free(wk), free(bk), free(wv), free(bv), free(wo), free(bo), free(sinks), free(fn);
        free(wr), free(br), free(gu), free(gub), free(dn), free(dnb);
    }
    double *nw = tensor(D, "model.norm.weight"), *head = tensor((long)V * D, "lm_head.weight");
    for (int t = 0; t < N; t++) {
        rmsnorm(x[t], nw, xn[t]);
        linear(head, NULL, xn[t], V, D, logits + (size_t)t * V);
    }
    free(nw), free(head);
}

static void test_reference(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(g_dir, sizeof g_dir, "/tmp/tern-gptoss-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    snprintf(cmd, sizeof cmd,
             "%s/tools/make_fixture --family gpt_oss --dim %d --layers %d --heads %d --kv-heads %d --head-dim %d "
             "--experts %d --top-k %d --moe-ff %d --sliding-window %d --seed 43 --out %s --tokenizer %s",
             build(), D, L, H, KV, HD, E, K, I, WIN, g_dir, shared_path("models/stories260K"));
    assert_int_equal(system(cmd), 0);
    tern_err err = {0};
    tern_model *m = model_load(g_dir, 2, &err);
    if (!m)
        fail_msg("%s", err.msg);
    const model_config *c = model_config_get(m);
    int V = c->n_vocab;
    double inv[HD / 2], af;
    yarn(inv, &af);
    for (int i = 0; i < HD / 2; i++)
        if (fabs(m->rope_inv_freq[i] - inv[i]) > 1e-6 * inv[i])
            fail_msg("YaRN inv_freq[%d] = %.9g, want %.9g", i, m->rope_inv_freq[i], inv[i]);
    assert_true(fabs(m->layers[0].rope_af - af) < 1e-6);
    kv_pool kv;
    kv_seq a = {0};
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 4, 16, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &a, N, &err), 0);
    int32_t pos[N], rows[N];
    kv_seq *seqs[N];
    for (int i = 0; i < N; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &a;
    }
    float *got = malloc((size_t)N * V * sizeof(float));
    double *want = malloc((size_t)N * V * sizeof(double));
    fwd_batch b = {N, IDS, pos, seqs, N, rows};
    assert_int_equal(model_forward(m, &kv, &b, got, &err), 0);
    assert_int_equal(st_open_dir(&g_st, g_dir, &err), 0);
    reference(want, V);
    st_close(&g_st);
    double worst = 0, mag = 0;
    for (size_t i = 0; i < (size_t)N * V; i++) {
        worst = fmax(worst, fabs(got[i] - want[i]));
        mag = fmax(mag, fabs(want[i]));
    }
    printf("gpt_oss vs the double-precision reference: max |delta logit| %.3g (logits up to %.3g)\n", worst, mag);
    assert_true(worst < 1e-4);
    kv_seq_free(&kv, &a);
    kv_pool_free(&kv);
    free(got);
    free(want);
    model_free(m);
}

/* Sets config.json's key to the JSON text val. */
static void config_set(const char *dir, const char *key, const char *val)
{
    char path[256];
    tern_err err = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *o = tern_json_parse_file(path, &err);
    assert_non_null(o);
    json_object_object_del(o, key);
    json_object_object_add(o, key, json_tokener_parse(val));
    assert_int_equal(json_object_to_file(path, o), 0);
    json_object_put(o);
}

/* YaRN is a RoPE type of every family (Qwen's configs use it): the old
 * "type" key, transformers' defaults (beta 32 / 1, truncation on, the
 * attention factor 0.1 ln(factor) + 1), an explicit attention_factor, and
 * DeepSeek's mscale / mscale_all_dim ratio; the inverse frequencies with the
 * ramp's ends floored and ceiled. */
static void test_yarn_qwen(void **state)
{
    (void)state;
    char dir[64], cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/tern-yarn-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "%s/tools/make_fixture --family qwen3 --dim 64 --layers 1 --heads 4 --kv-heads 2 --head-dim 32 --ff 64 "
             "--rope-theta 1000000 --seed 44 --out %s --tokenizer %s",
             build(), dir, shared_path("models/stories260K"));
    assert_int_equal(system(cmd), 0);
    config_set(dir, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}");
    tern_err err = {0};
    tern_model *m = model_load(dir, 1, &err);
    if (!m)
        fail_msg("%s", err.msg);
    const model_config *c = model_config_get(m);
    assert_int_equal(c->rope_scaling, ROPE_YARN);
    assert_true(c->rope_factor == 4.0f && c->rope_orig_max_pos == 64 && c->rope_truncate);
    assert_true(c->rope_beta_fast == 32.0f && c->rope_beta_slow == 1.0f);
    assert_true(fabs(c->rope_attn_factor - (0.1 * log(4.0) + 1)) < 1e-6);
    double lo = floor(32 * log(64 / (32 * 2 * M_PI)) / (2 * log(1e6))), hi = ceil(32 * log(64 / (2 * M_PI)) / (2 * log(1e6)));
    lo = fmax(lo, 0), hi = fmin(hi, 31);
    for (int i = 0; i < 16; i++) {
        double p = pow(1e6, i / 16.0), keep = 1 - fmin(fmax((i - lo) / (hi - lo), 0), 1);
        double want = 1 / (4 * p) * (1 - keep) + 1 / p * keep;
        if (fabs(m->rope_inv_freq[i] - want) > 1e-6 * want)
            fail_msg("yarn inv_freq[%d] = %.9g, want %.9g (ramp %g..%g)", i, m->rope_inv_freq[i], want, lo, hi);
    }
    model_free(m);
    config_set(dir, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 0.5}");
    assert_non_null(m = model_load(dir, 1, &err));
    assert_true(model_config_get(m)->rope_attn_factor == 0.5f);
    assert_int_equal(model_config_get(m)->rope_orig_max_pos, model_config_get(m)->max_pos);
    model_free(m);
    config_set(dir, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 40.0, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}");
    assert_non_null(m = model_load(dir, 1, &err));
    assert_true(fabs(model_config_get(m)->rope_attn_factor - (0.1 * log(40.0) + 1) / (0.05 * log(40.0) + 1)) < 1e-6);
    model_free(m);
    config_set(dir, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 0.5}");
    assert_null(m = model_load(dir, 1, &err));
    assert_non_null(strstr(err.msg, "factor"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* attention_bias as transformers reads it per family: q, k, v and o for
 * Llama (a folder without o_proj's bias is a load error naming it), q/k/v
 * only for Qwen2 (which never has an o bias). */
static void test_attention_bias(void **state)
{
    (void)state;
    char dir[64], cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/tern-abias-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "%s/tools/make_fixture --family qwen2 --dim 64 --layers 1 --heads 4 --kv-heads 2 --ff 64 --seed 45 "
             "--out %s --tokenizer %s",
             build(), dir, shared_path("models/stories260K"));
    assert_int_equal(system(cmd), 0);
    tern_err err = {0};
    tern_model *m = model_load(dir, 1, &err);
    if (!m)
        fail_msg("%s", err.msg);
    assert_true(model_config_get(m)->qkv_bias && !model_config_get(m)->o_bias);
    model_free(m);
    config_set(dir, "model_type", "\"llama\"");
    config_set(dir, "architectures", "[\"LlamaForCausalLM\"]");
    assert_null(m = model_load(dir, 1, &err));
    if (!strstr(err.msg, "o_proj.bias"))
        fail_msg("llama with attention_bias and no o_proj bias: '%s'", err.msg);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static int cleanup(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_yarn_qwen),
        cmocka_unit_test(test_attention_bias),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup);
}
