/* The embeddable API (include/tern.h) end to end on stories260K: greedy
 * generation through the callback equals llama2.c's golden text; tern_embed
 * on the stories-mean embedding folder (tests/embedding) matches its
 * sentence-transformers golden. */
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
#include "tern.h"
#include "test_util.h"

typedef struct sink {
    char text[8192];
    size_t len;
    int calls;
} sink;

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    sink *s = user;
    (void)token;
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->text[s->len] = '\0';
    s->calls++;
    return 0;
}

static int stop_after_3(void *user, int32_t token, const char *text, size_t len)
{
    on_token(user, token, text, len);
    return ((sink *)user)->calls >= 3;
}

static void test_generate_golden(void **state)
{
    (void)state;
    tern_error err;
    tern_ctx *t = tern_open(shared_path("models/stories260K"), NULL, &err);
    if (!t)
        fail_msg("%s", err.msg);
    tern_err e2;
    json_object *g = tern_json_parse_file(shared_path("models/stories260K/golden/reference_greedy.json"), &e2);
    assert_non_null(g);
    json_object *runs = json_object_object_get(g, "runs"), *run = json_object_array_get_idx(runs, 0);
    const char *prompt = json_object_get_string(json_object_object_get(run, "prompt"));
    const char *want = json_object_get_string(json_object_object_get(run, "stdout_128_new_tokens"));
    tern_gen_opts o;
    tern_gen_opts_init(&o);
    o.temperature = 0;
    o.max_tokens = 128;
    sink s = {0};
    int n = 0;
    assert_int_equal(tern_generate(t, prompt, &o, on_token, &s, &n, &err), 0);
    assert_int_equal(n, 128);
    /* llama2.c prints the prompt, the continuation and a newline */
    assert_int_equal(strlen(prompt) + s.len + 1, strlen(want));
    assert_memory_equal(want + strlen(prompt), s.text, s.len);
    /* the callback can stop generation */
    sink s3 = {0};
    assert_int_equal(tern_generate(t, prompt, &o, stop_after_3, &s3, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(s3.calls, 3);
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tern_tokenize(t, prompt, 1, &ids, &n_ids, &err), 0);
    assert_int_equal(ids[0], 1); /* BOS */
    char *text;
    assert_int_equal(tern_detokenize(t, ids, n_ids, &text, &err), 0);
    assert_string_equal(text, prompt);
    free(text);
    free(ids);
    json_object_put(g);
    tern_close(t);
    assert_null(tern_open("/nonexistent/model", NULL, &err));
    assert_true(err.code < 0 && err.msg[0]);
}

/* Bad arguments are TERN_EINVAL with a message naming the function, never
 * a crash; the codes are those tern.h's contract comments name. */
static void test_bad_arguments(void **state)
{
    (void)state;
    tern_error err;
    memset(&err, 0, sizeof err);
    assert_null(tern_open(NULL, NULL, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    assert_non_null(strstr(err.msg, "tern_open"));
    assert_null(tern_open("/nonexistent/model", NULL, NULL)); /* err may be NULL */
    tern_close(NULL);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(tern_tokenize(NULL, "x", 1, &ids, &n_ids, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "tern_tokenize"));
    char *text = NULL;
    assert_int_equal(tern_detokenize(NULL, NULL, 0, &text, &err), TERN_EINVAL);
    assert_int_equal(tern_generate(NULL, "x", NULL, NULL, NULL, NULL, &err), TERN_EINVAL);
    assert_non_null(strstr(err.msg, "tern_generate"));
    tern_ctx *t = tern_open(shared_path("models/stories260K"), NULL, &err);
    if (!t)
        fail_msg("%s", err.msg);
    assert_int_equal(tern_tokenize(t, NULL, 1, &ids, &n_ids, &err), TERN_EINVAL);
    assert_int_equal(tern_detokenize(t, NULL, 3, &text, &err), TERN_EINVAL);
    assert_int_equal(tern_generate(t, NULL, NULL, NULL, NULL, NULL, &err), TERN_EINVAL);
    /* an empty prompt encodes to BOS alone: generation still runs */
    tern_gen_opts o;
    tern_gen_opts_init(&o);
    o.max_tokens = 2;
    int n = -1;
    assert_int_equal(tern_generate(t, "", &o, NULL, NULL, &n, &err), 0);
    assert_int_equal(n, 2);
    tern_close(t);
}

/* The stories-mean folder: stories260K's files linked, the recipe's copied
 * (as tests/server/embeddings.mjs and tools/st_goldens.py build it). */
static void build_stories_mean(char *dir)
{
    char cmd[2048];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "for f in %s/*; do [ -f \"$f\" ] && ln -s \"$f\" %s/; done; cp -r %s/. %s/ && rm %s/recipe.json",
             shared_path("models/stories260K"), dir, repo_path("tests/embedding/stories-mean"), dir, dir);
    assert_int_equal(system(cmd), 0);
}

static void test_embed_golden(void **state)
{
    (void)state;
    char dir[] = "/tmp/tern_api_embed_XXXXXX", cmd[600];
    build_stories_mean(dir);
    tern_error err;
    tern_ctx *t = tern_open(dir, NULL, &err);
    if (!t)
        fail_msg("%s", err.msg);
    tern_err je;
    json_object *g = tern_json_parse_file(repo_path("tests/golden/embed_stories-mean.json"), &je);
    if (!g)
        fail_msg("%s", je.msg);
    json_object *inputs;
    assert_true(json_object_object_get_ex(g, "inputs", &inputs));
    float out[64];
    for (size_t i = 0; i < json_object_array_length(inputs); i++) {
        json_object *in = json_object_array_get_idx(inputs, i), *text, *emb;
        assert_true(json_object_object_get_ex(in, "text", &text));
        assert_true(json_object_object_get_ex(in, "embedding", &emb));
        int dim = 0;
        assert_int_equal(tern_embed(t, json_object_get_string(text), out, 64, &dim, &err), 0);
        assert_int_equal(dim, (int)json_object_array_length(emb));
        double d = 0, na = 0, nb = 0;
        for (int k = 0; k < dim; k++) {
            double w = json_object_get_double(json_object_array_get_idx(emb, k));
            d += out[k] * w;
            na += (double)out[k] * out[k];
            nb += w * w;
        }
        double cos = d / sqrt(na * nb);
        if (cos < 0.9999 || fabs(sqrt(na / nb) - 1) > 1e-3)
            fail_msg("input %zu: cosine %.9f, norm ratio %.6f", i, cos, sqrt(na / nb));
    }
    json_object_put(g);
    int dim = 0;
    assert_int_equal(tern_embed(t, "x", out, 8, &dim, &err), TERN_ERANGE); /* out too small */
    assert_int_equal(dim, 64);
    assert_int_equal(tern_embed(t, "", out, 64, NULL, &err), TERN_EINVAL);
    assert_int_equal(tern_embed(t, NULL, out, 64, NULL, &err), TERN_EINVAL);
    tern_close(t);
    /* a plain model is no embedding model */
    t = tern_open(shared_path("models/stories260K"), NULL, &err);
    assert_non_null(t);
    assert_int_equal(tern_embed(t, "x", out, 64, NULL, &err), TERN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "modules.json"));
    tern_close(t);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_generate_golden), cmocka_unit_test(test_bad_arguments),
                                       cmocka_unit_test(test_embed_golden)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
