/* The batch matcher (src/engine/masks.c): eight concurrent greedy rows,
 * each under its own grammar (JSON schemas with strings, numbers, enums,
 * a regex), give the same tokens whether the step's masks are computed on
 * one thread or spread over four; every output is a sentence of its
 * grammar (the byte-level checker) - on the demo model (8,192-token
 * vocabulary, CPU). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define N_ROWS 8
#define N_TOKENS 48

static const char *const SPECS[N_ROWS] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
    "\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"minItems\":2}",
    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"n\":{\"type\":\"number\"}},"
    "\"required\":[\"color\",\"n\"]}",
    "R[a-z ]{1,40}\\.",
    "{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\"}",
    "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}}}",
    "{\"type\":\"integer\",\"minimum\":10,\"maximum\":99999}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"}},"
    "\"required\":[\"a\",\"b\"]}",
};

static grammar_compiled *compile_spec(int i, const grammar_vocab *v)
{
    tern_err err = {0};
    char *ebnf = NULL;
    if (SPECS[i][0] == 'R') {
        assert_int_equal(grammar_regex_to_ebnf(SPECS[i] + 1, strlen(SPECS[i] + 1), &ebnf, &err), 0);
    } else {
        json_object *o = tern_json_parse(SPECS[i], strlen(SPECS[i]), &err);
        assert_non_null(o);
        assert_int_equal(grammar_schema_to_ebnf(o, NULL, &ebnf, &err), 0);
        json_object_put(o);
    }
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &err);
    free(ebnf);
    if (!cg)
        fail_msg("spec %d: %s", i, err.msg);
    return cg;
}

/* Runs the eight rows together; out[i] gets row i's tokens. */
static void run_rows(tern_model *m, tern_tokenizer *tok, grammar_compiled **cg, int32_t out[N_ROWS][N_TOKENS + 1],
                     int *n_out, int threads)
{
    tern_err err = {0};
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = N_ROWS;
    o.prefix_cache = 0;
    o.mask_threads = threads;
    tern_engine *e = engine_new(m, tok, &o, &err);
    assert_non_null(e);
    int32_t V = model_config_get(m)->n_vocab;
    engine_req *reqs[N_ROWS];
    for (int i = 0; i < N_ROWS; i++) {
        int32_t prompt[6];
        for (int k = 0; k < 6; k++)
            prompt[k] = 100 + (int32_t)((unsigned)(i * 7 + k * 13) % 500u);
        engine_params p;
        engine_params_default(&p);
        p.prompt = prompt;
        p.n_prompt = 6;
        p.max_tokens = N_TOKENS;
        p.sample.temperature = 0;
        assert_int_equal(constraint_grammar_new(cg[i], NULL, V, NULL, NULL, &p.constraint, &p.constraint_ctx, &err), 0);
        reqs[i] = engine_submit(e, &p, NULL, NULL, &err);
        assert_non_null(reqs[i]);
    }
    for (int i = 0; i < N_ROWS; i++) {
        engine_event ev;
        n_out[i] = 0;
        while (engine_req_next(reqs[i], &ev, -1)) {
            int fin = ev.kind == ENGINE_EV_FINISH;
            if (ev.kind == ENGINE_EV_TOKEN && n_out[i] < N_TOKENS + 1)
                out[i][n_out[i]++] = ev.token;
            if (fin && ev.finish == ENGINE_FINISH_ERROR)
                fail_msg("row %d: %s", i, ev.error);
            engine_event_clear(&ev);
            if (fin)
                break;
        }
        engine_req_release(reqs[i]);
    }
    engine_free(e);
}

static void test_threads_agree(void **state)
{
    (void)state;
    tern_err err = {0};
    const char *dir = repo_path("models/tern-demo");
    tern_model *m = model_load(dir, 0, &err);
    if (!m) {
        dir = shared_path("models/tern-demo-16m");
        m = model_load(dir, 0, &err);
    }
    if (!m) {
        print_message("skipping: %s\n", err.msg);
        skip();
    }
    tern_tokenizer *tok = tokenizer_load(dir, &err);
    assert_non_null(tok);
    grammar_vocab *v = grammar_vocab_new(tok, model_config_get(m)->n_vocab, NULL, 0, &err);
    assert_non_null(v);
    grammar_compiled *cg[N_ROWS];
    for (int i = 0; i < N_ROWS; i++)
        cg[i] = compile_spec(i, v);
    static int32_t a[N_ROWS][N_TOKENS + 1], b[N_ROWS][N_TOKENS + 1];
    int na[N_ROWS], nb[N_ROWS];
    run_rows(m, tok, cg, a, na, 1);
    run_rows(m, tok, cg, b, nb, 4);
    for (int i = 0; i < N_ROWS; i++) {
        assert_true(na[i] > 0);
        if (na[i] != nb[i] || memcmp(a[i], b[i], (size_t)na[i] * sizeof a[i][0]))
            fail_msg("row %d: one thread and four threads differ", i);
        /* the text (stop tokens aside) is a prefix of a sentence, or a
         * whole one when the row stopped early */
        char text[4096];
        size_t n = 0;
        for (int k = 0; k < na[i]; k++) {
            size_t len;
            const char *s = grammar_vocab_token(v, a[i][k], &len);
            if (s && n + len < sizeof text) {
                memcpy(text + n, s, len);
                n += len;
            }
        }
        const grammar *g = grammar_compiled_grammar(cg[i]);
        int ok = na[i] < N_TOKENS ? grammar_check_text(g, text, n) : grammar_check_prefix(g, text, n);
        if (ok != 1)
            fail_msg("row %d: output '%.*s' is not in its grammar", i, (int)n, text);
    }
    for (int i = 0; i < N_ROWS; i++)
        grammar_compiled_free(cg[i]);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads_agree)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
