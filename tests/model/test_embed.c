/* Embedding models, the model side: sentence-transformers folders (what
 * loads, and every unsupported setting a load error naming it), the pooling
 * arithmetic, and model_forward_hidden - the hidden rows are exactly what
 * lm_head reads (their products with the head's rows are the logits), and
 * a row's hidden state does not depend on what else is in the batch. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/embed.h"
#include "model/model_int.h" /* internals: the head's weight rows */
#include "model/safetensors.h"
#include "model/st_write.h"
#include "test_util.h"

/* ---- folders ---- */

static char dir[] = "/tmp/tern_embed_XXXXXX";

static void put(const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    char *slash = strrchr(p, '/');
    *slash = 0;
    mkdir(p, 0755);
    *slash = '/';
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void reset(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s/*", dir);
    assert_int_equal(system(cmd), 0);
}

#define MODS3 "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"}," \
              "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"}," \
              "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}]"

static void pool_cfg(const char *modes)
{
    char buf[512];
    snprintf(buf, sizeof buf, "{\"word_embedding_dimension\": 16, %s}", modes);
    put("1_Pooling/config.json", buf);
}

/* Loads the folder; the error message must contain want (NULL = success). */
static void expect_load(const char *want, embed_config *c)
{
    tern_err err = {0};
    int rc = embed_config_load(dir, 16, c, &err);
    if (!want) {
        if (rc)
            fail_msg("load failed: %s", err.msg);
        return;
    }
    if (rc == 0)
        fail_msg("loaded; expected an error naming '%s'", want);
    if (!strstr(err.msg, want))
        fail_msg("error '%s' does not name '%s'", err.msg, want);
    assert_int_equal(c->pooling, EMBED_POOL_NONE);
}

static void test_config(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(dir));
    embed_config c;
    tern_err err = {0};
    assert_int_equal(embed_config_load(dir, 16, &c, &err), TERN_ENOTFOUND); /* a plain model */

    put("modules.json", MODS3);
    pool_cfg("\"pooling_mode_lasttoken\": true, \"pooling_mode_mean_tokens\": false");
    put("sentence_bert_config.json", "{\"max_seq_length\": 77, \"do_lower_case\": false}");
    expect_load(NULL, &c);
    assert_int_equal(c.pooling, EMBED_POOL_LAST);
    assert_int_equal(c.normalize, 1);
    assert_int_equal(c.max_seq_length, 77);
    assert_int_equal(c.dim, 16);
    assert_null(c.prompt);
    embed_config_free(&c);

    /* newer sentence-transformers module paths, no Normalize, a default prompt */
    put("modules.json",
        "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.base.modules.transformer.Transformer\"},"
        "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.sentence_transformer.modules.pooling.Pooling\"}]");
    pool_cfg("\"pooling_mode_mean_tokens\": true");
    put("config_sentence_transformers.json", "{\"prompts\": {\"q\": \"Query: \", \"d\": \"\"}, \"default_prompt_name\": \"q\"}");
    expect_load(NULL, &c);
    assert_int_equal(c.pooling, EMBED_POOL_MEAN);
    assert_int_equal(c.normalize, 0);
    assert_string_equal(c.prompt, "Query: ");
    embed_config_free(&c);
    put("config_sentence_transformers.json", "{\"prompts\": {\"q\": \"Query: \"}, \"default_prompt_name\": \"zz\"}");
    expect_load("default_prompt_name", &c);
    pool_cfg("\"pooling_mode_mean_tokens\": true, \"include_prompt\": false");
    put("config_sentence_transformers.json", "{\"prompts\": {\"q\": \"Query: \"}, \"default_prompt_name\": \"q\"}");
    expect_load("include_prompt", &c);
    put("config_sentence_transformers.json", "{\"prompts\": {\"q\": \"Query: \"}, \"default_prompt_name\": null}");
    expect_load(NULL, &c); /* include_prompt false without a prompt changes nothing */
    assert_null(c.prompt);
    embed_config_free(&c);

    put("modules.json", MODS3);
    pool_cfg("\"pooling_mode_cls_token\": true");
    expect_load(NULL, &c);
    assert_int_equal(c.pooling, EMBED_POOL_CLS);
    embed_config_free(&c);

    /* what tern cannot honour is named */
    pool_cfg("\"pooling_mode_max_tokens\": true");
    expect_load("pooling_mode_max_tokens", &c);
    pool_cfg("\"pooling_mode_mean_sqrt_len_tokens\": true");
    expect_load("pooling_mode_mean_sqrt_len_tokens", &c);
    pool_cfg("\"pooling_mode_weightedmean_tokens\": true");
    expect_load("pooling_mode_weightedmean_tokens", &c);
    pool_cfg("\"pooling_mode_cls_token\": true, \"pooling_mode_mean_tokens\": true");
    expect_load("pooling_mode_mean_tokens", &c);
    pool_cfg("\"pooling_mode_cls_token\": false");
    expect_load("no pooling mode", &c);
    put("1_Pooling/config.json", "{\"word_embedding_dimension\": 17, \"pooling_mode_cls_token\": true}");
    expect_load("word_embedding_dimension", &c);
    pool_cfg("\"pooling_mode_cls_token\": true");
    put("sentence_bert_config.json", "{\"do_lower_case\": true}");
    expect_load("do_lower_case", &c);
    put("sentence_bert_config.json", "{}");
    put("modules.json",
        "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
        "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
        "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]");
    expect_load("sentence_transformers.models.Dense", &c);
    put("modules.json",
        "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"}]");
    expect_load("no Pooling", &c);
    put("modules.json", "{\"a\": 1}");
    expect_load("must be a list", &c);
    put("modules.json", "[{\"idx\":0,");
    expect_load("modules.json", &c);
    reset();
    rmdir(dir);
}

/* ---- pooling ---- */

static void test_pool(void **state)
{
    (void)state;
    const float h[3][2] = {{1, 2}, {3, 4}, {5, 12}};
    float out[2];
    embed_pool p;
    assert_int_equal(embed_pool_init(&p, EMBED_POOL_MEAN, 2), 0);
    for (int i = 0; i < 3; i++)
        if (embed_pool_wants(EMBED_POOL_MEAN, i, 3))
            embed_pool_add(&p, h[i]);
    embed_pool_finish(&p, 0, out);
    assert_float_equal(out[0], 3.0f, 1e-7);
    assert_float_equal(out[1], 6.0f, 1e-7);
    embed_pool_free(&p);

    assert_true(embed_pool_wants(EMBED_POOL_CLS, 0, 3) && !embed_pool_wants(EMBED_POOL_CLS, 1, 3));
    assert_true(embed_pool_wants(EMBED_POOL_LAST, 2, 3) && !embed_pool_wants(EMBED_POOL_LAST, 1, 3));
    assert_int_equal(embed_pool_init(&p, EMBED_POOL_LAST, 2), 0);
    embed_pool_add(&p, h[2]);
    embed_pool_finish(&p, 1, out);
    assert_float_equal(out[0], 5.0f / 13, 1e-7);
    assert_float_equal(out[1], 12.0f / 13, 1e-7);
    embed_pool_free(&p);
}

/* ---- the hidden-state forward ---- */

static void test_hidden_forward(void **state)
{
    (void)state;
    tern_err err = {0};
    tern_model *m = model_load(shared_path("models/stories260K"), 2, &err);
    if (!m)
        fail_msg("%s", err.msg);
    assert_true(model_hidden_supported(m));
    int dim = model_hidden_dim(m), V = model_config_get(m)->n_vocab;
    enum { N = 9 };
    const int32_t ids[N] = {1, 403, 407, 261, 378, 400, 275, 299, 46};
    kv_pool kv;
    kv_seq a = {0}, b = {0};
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &a, N, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &b, N, &err), 0);
    int32_t pos[2 * N], rows[N];
    kv_seq *seqs[2 * N];
    for (int i = 0; i < N; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &a;
    }
    float *hid = malloc((size_t)N * dim * sizeof *hid), *logits = malloc((size_t)V * sizeof *logits);
    int32_t last = N - 1;
    fwd_batch fb = {N, ids, pos, seqs, 1, &last};
    fwd_hidden fh = {N, rows, hid};
    assert_int_equal(model_forward_hidden(m, &kv, &fb, logits, &fh, &err), 0);
    /* the last hidden row is what the head reads: its products are the logits */
    float *w = malloc((size_t)dim * sizeof *w);
    double worst = 0;
    for (int v = 0; v < V; v++) {
        model_weight_row(&m->lm_head, v, w);
        double s = 0;
        for (int k = 0; k < dim; k++)
            s += (double)hid[(size_t)(N - 1) * dim + k] * w[k];
        worst = fmax(worst, fabs(s - logits[v]));
    }
    if (worst > 1e-4)
        fail_msg("hidden . lm_head differs from the logits by %g", worst);
    /* the same sequence again, mixed with a prefix of another one in one
     * batch, hidden rows only (no logits): bit-identical rows */
    int32_t ids2[2 * N], rows2[N];
    int n2 = 0;
    for (int i = 0; i < N; i++) {
        ids2[n2] = ids[i];
        pos[n2] = i;
        seqs[n2] = &b;
        rows2[i] = n2++;
        if (i < 4) {
            ids2[n2] = ids[(i + 3) % N];
            pos[n2] = i;
            seqs[n2++] = &a; /* overwrites a's first positions: a different sequence now */
        }
    }
    float *hid2 = malloc((size_t)N * dim * sizeof *hid2);
    fwd_batch fb2 = {n2, ids2, pos, seqs, 0, NULL};
    fwd_hidden fh2 = {N, rows2, hid2};
    assert_int_equal(model_forward_hidden(m, &kv, &fb2, NULL, &fh2, &err), 0);
    assert_memory_equal(hid, hid2, (size_t)N * dim * sizeof *hid);
    /* rows outside the batch are refused */
    int32_t bad = n2;
    fwd_hidden fh3 = {1, &bad, hid2};
    assert_int_equal(model_forward_hidden(m, &kv, &fb2, NULL, &fh3, &err), TERN_EINVAL);
    free(hid);
    free(hid2);
    free(logits);
    free(w);
    kv_seq_free(&kv, &a);
    kv_seq_free(&kv, &b);
    kv_pool_free(&kv);
    model_free(m);
}

/* ---- a base-model checkpoint (no "model." prefix) ---- */

static int copy_fill(void *ctx, int i, int64_t first, int64_t n, void *buf)
{
    const st_set *st = ctx;
    size_t es = st->tensors[i].n_bytes / (size_t)st_numel(&st->tensors[i]);
    memcpy(buf, (const char *)st->tensors[i].data + (size_t)first * es, (size_t)n * es);
    return 0;
}

/* stories260K rewritten as transformers' AutoModel saves it (embed_tokens,
 * layers.N..., norm; tied head): the same model, the same logits bit for bit. */
static void test_base_checkpoint(void **state)
{
    (void)state;
    tern_err err = {0};
    char tmp[] = "/tmp/tern_base_XXXXXX", path[600], cmd[1400];
    assert_non_null(mkdtemp(tmp));
    st_set st = {0};
    assert_int_equal(st_open_dir(&st, shared_path("models/stories260K"), &err), 0);
    st_out_tensor *ts = calloc((size_t)st.n_tensors, sizeof *ts);
    for (int i = 0; i < st.n_tensors; i++) {
        const st_tensor *t = &st.tensors[i];
        assert_int_equal(strncmp(t->name, "model.", 6), 0);
        snprintf(ts[i].name, sizeof ts[i].name, "%s", t->name + 6);
        ts[i].dtype = t->dtype;
        ts[i].n_dims = t->n_dims;
        memcpy(ts[i].shape, t->shape, sizeof ts[i].shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    assert_int_equal(st_write_file(path, ts, st.n_tensors, copy_fill, &st, &err), 0);
    snprintf(cmd, sizeof cmd, "cp %s %s/", shared_path("models/stories260K/config.json"), tmp);
    assert_int_equal(system(cmd), 0);
    tern_model *a = model_load(shared_path("models/stories260K"), 1, &err), *b = model_load(tmp, 1, &err);
    if (!a || !b)
        fail_msg("%s", err.msg);
    enum { N = 6 };
    const int32_t ids[N] = {1, 403, 407, 261, 378, 400};
    int V = model_config_get(a)->n_vocab;
    float *la = malloc((size_t)N * V * sizeof *la), *lb = malloc((size_t)N * V * sizeof *lb);
    tern_model *ms[2] = {a, b};
    float *ls[2] = {la, lb};
    for (int k = 0; k < 2; k++) {
        kv_pool kv;
        kv_seq seq = {0};
        assert_int_equal(kv_pool_init(&kv, model_config_get(a)->n_layer, model_kv_dim(a), 4, 16, &err), 0);
        assert_int_equal(kv_seq_reserve(&kv, &seq, N, &err), 0);
        int32_t pos[N], rows[N];
        kv_seq *seqs[N];
        for (int i = 0; i < N; i++) {
            pos[i] = rows[i] = i;
            seqs[i] = &seq;
        }
        fwd_batch fb = {N, ids, pos, seqs, N, rows};
        assert_int_equal(model_forward(ms[k], &kv, &fb, ls[k], &err), 0);
        kv_seq_free(&kv, &seq);
        kv_pool_free(&kv);
    }
    assert_memory_equal(la, lb, (size_t)N * V * sizeof *la);
    free(la);
    free(lb);
    free(ts);
    model_free(a);
    model_free(b);
    st_close(&st);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_hidden_forward),
        cmocka_unit_test(test_base_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
