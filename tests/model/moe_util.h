/* Helpers of the mixture-of-experts tests (test_moe.c, test_gpt_oss_mlx.c):
 * fixtures in temporary folders, config.json edits, the batch contract,
 * logits of a folder, load errors, tensors renamed in place. Static: each
 * test program has its own copy (and its own folders to remove). */
#ifndef TERN_TEST_MOE_UTIL_H
#define TERN_TEST_MOE_UTIL_H

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
#include "model/model_int.h"
#include "test_util.h"

static char g_dirs[48][64];
static int g_n_dirs;

static inline const char *tmpdir(void)
{
    char *d = g_dirs[g_n_dirs++];
    snprintf(d, 64, "/tmp/tern-moe-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static inline void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static inline const char *bin(void) { return getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern"; }
static inline const char *build(void) { return getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build"; }

/* A fixture of family with extra make_fixture arguments, into a new folder. */
static inline const char *fixture(const char *args)
{
    const char *d = tmpdir();
    sh("%s/tools/make_fixture %s --out %s --tokenizer %s", build(), args, d, shared_path("models/stories260K"));
    return d;
}

/* Sets config.json's key to the JSON text val (NULL: removes it). */
static inline void config_set(const char *dir, const char *key, const char *val)
{
    char path[256];
    tern_err err = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *o = tern_json_parse_file(path, &err);
    assert_non_null(o);
    json_object_object_del(o, key);
    if (val)
        json_object_object_add(o, key, json_tokener_parse(val));
    assert_int_equal(json_object_to_file(path, o), 0);
    json_object_put(o);
}

static const int32_t IDS[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};

/* The batch contract on a mixture: one batch of 12 tokens == the same
 * tokens one by one == a batch mixing two sequences at other positions;
 * and the backend's grouped expert products == one product per expert.
 */
static inline void check_batch(const char *dir, int exact)
{
    tern_err err = {0};
    tern_kernels_exact_set(exact);
    tern_model *m = model_load(dir, 2, &err);
    tern_kernels_exact_set(0);
    if (!m)
        fail_msg("%s", err.msg);
    const model_config *c = model_config_get(m);
    assert_true(c->n_expert > 0);
    const int n = 12, V = c->n_vocab;
    kv_pool kv;
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    kv_seq a = {0}, b2 = {0};
    float *ref = malloc((size_t)n * V * sizeof(float)), *lg = malloc((size_t)2 * V * sizeof(float));
    int32_t pos[12], rows[12];
    kv_seq *seqs[12];
    assert_int_equal(kv_seq_reserve(&kv, &a, n, &err), 0);
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &a;
    }
    fwd_batch b = {n, IDS, pos, seqs, n, rows};
    assert_int_equal(model_forward(m, &kv, &b, ref, &err), 0);
    kv_seq_free(&kv, &a);
    a = (kv_seq){0};
    { /* the grouped products (one job per layer) == one product per expert */
        model_backend *be = model_backend_get(m);
        assert_non_null(be->matmul_grouped);
        int (*grouped)(model_backend *, int, const model_weight *const *, const float *const *, float *const *,
                       const int *, tern_err *) = be->matmul_grouped;
        be->matmul_grouped = NULL;
        float *each = malloc((size_t)n * V * sizeof(float));
        assert_int_equal(kv_seq_reserve(&kv, &a, n, &err), 0);
        assert_int_equal(model_forward(m, &kv, &b, each, &err), 0);
        be->matmul_grouped = grouped;
        assert_memory_equal(each, ref, (size_t)n * V * sizeof(float));
        free(each);
        kv_seq_free(&kv, &a);
        a = (kv_seq){0};
    }
    for (int i = 0; i < n; i++) { /* token by token */
        assert_int_equal(kv_seq_reserve(&kv, &a, i + 1, &err), 0);
        int32_t p = i, r = 0;
        kv_seq *sp = &a;
        fwd_batch one = {1, &IDS[i], &p, &sp, 1, &r};
        assert_int_equal(model_forward(m, &kv, &one, lg, &err), 0);
        for (int t = 0; t < V; t++)
            if (lg[t] != ref[(size_t)i * V + t])
                fail_msg("%s: token %d alone differs from the batch at logit %d (%g vs %g)", dir, i, t, lg[t],
                         ref[(size_t)i * V + t]);
    }
    /* b2: 5 tokens prefilled, then its tokens 5..7 with a (truncated to 9) at 9 */
    assert_int_equal(kv_seq_reserve(&kv, &b2, 5, &err), 0);
    {
        int32_t p5[5] = {0, 1, 2, 3, 4};
        kv_seq *s5[5] = {&b2, &b2, &b2, &b2, &b2};
        fwd_batch pre = {5, IDS, p5, s5, 0, NULL};
        assert_int_equal(model_forward(m, &kv, &pre, NULL, &err), 0);
    }
    kv_seq_truncate(&kv, &a, 9);
    assert_int_equal(kv_seq_reserve(&kv, &a, 10, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &b2, 8, &err), 0);
    int32_t toks[4] = {IDS[5], IDS[9], IDS[6], IDS[7]}, mp[4] = {5, 9, 6, 7}, mr[2] = {1, 3};
    kv_seq *ms[4] = {&b2, &a, &b2, &b2};
    fwd_batch mixed = {4, toks, mp, ms, 2, mr};
    assert_int_equal(model_forward(m, &kv, &mixed, lg, &err), 0);
    for (int t = 0; t < V; t++) {
        assert_true(lg[t] == ref[(size_t)9 * V + t]);
        assert_true(lg[V + t] == ref[(size_t)7 * V + t]);
    }
    kv_seq_free(&kv, &a);
    kv_seq_free(&kv, &b2);
    kv_pool_free(&kv);
    free(ref);
    free(lg);
    model_free(m);
}

/* Loading dir must fail with code, the message naming want. */
static inline void load_fails(const char *dir, int code, const char *want)
{
    tern_err err = {0};
    tern_model *m = model_load(dir, 1, &err);
    if (m)
        fail_msg("%s loaded; expected an error naming '%s'", dir, want);
    if (err.code != code || !strstr(err.msg, want))
        fail_msg("error %d '%s'; expected %d naming '%s'", err.code, err.msg, code, want);
}

/* The logits of IDS as one batch. */
static inline float *logits_of(const char *dir)
{
    tern_err err = {0};
    tern_model *m = model_load(dir, 2, &err);
    if (!m)
        fail_msg("%s: %s", dir, err.msg);
    const model_config *c = model_config_get(m);
    const int n = 12, V = c->n_vocab;
    kv_pool kv;
    kv_seq a = {0};
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &a, n, &err), 0);
    int32_t pos[12], rows[12];
    kv_seq *seqs[12];
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &a;
    }
    float *out = malloc((size_t)n * V * sizeof(float));
    fwd_batch b = {n, IDS, pos, seqs, n, rows};
    assert_int_equal(model_forward(m, &kv, &b, out, &err), 0);
    kv_seq_free(&kv, &a);
    kv_pool_free(&kv);
    model_free(m);
    return out;
}

/* Renames tensor from to to (the same length) in a safetensors file's
 * header, in place: a folder missing that tensor without rewriting it. */
static inline void rename_tensor(const char *path, const char *from, const char *to)
{
    assert_int_equal(strlen(from), strlen(to));
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    unsigned char h8[8];
    assert_int_equal(fread(h8, 1, 8, f), 8);
    size_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | h8[i];
    char *hdr = malloc(n + 1), key[200];
    assert_int_equal(fread(hdr, 1, n, f), n);
    hdr[n] = 0;
    snprintf(key, sizeof key, "\"%s\"", from);
    char *at = strstr(hdr, key);
    if (!at)
        fail_msg("%s: no tensor %s", path, from);
    assert_int_equal(fseek(f, 8 + (long)(at - hdr) + 1, SEEK_SET), 0);
    assert_int_equal(fwrite(to, 1, strlen(to), f), strlen(to));
    fclose(f);
    free(hdr);
}

/* gpt_oss's fixture: 4 layers alternating sliding (a window of 4, crossed by IDS) and full, 8 experts,
 * top 4 */
#define GPT_OSS "--family gpt_oss --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --top-k 4 " \
                "--moe-ff 32 --sliding-window 4 --seed 41"

/* cmocka's group teardown: removes the folders tmpdir made. */
static inline int cleanup(void **state)
{
    (void)state;
    for (int i = 0; i < g_n_dirs; i++)
        sh("rm -rf %s", g_dirs[i]);
    return 0;
}

#endif
