/* The KV budget counts real bytes: at one fixed --kv-budget, the engine's
 * pool holds 2x the blocks with a bf16 cache, >= 3.5x with q8 and >= 6.5x
 * with q4/r4 than with f32, and admits as many more concurrent sequences
 * (the peak of engine_stats.running over a burst of equal requests). Also
 * every type serves a request through the engine, with the draft model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "test_util.h"

static tern_model *g_model, *g_draft;
static tern_tokenizer *g_tok;

#define N_REQ 64
#define PROMPT 16
#define GEN 16

static tern_engine *new_engine(kv_type t, size_t budget, int max_batch, tern_model *draft, int quant_start)
{
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = max_batch;
    o.kv_budget_bytes = budget;
    kv_spec_init(&o.kv, t);
    o.kv.quant_start = quant_start;
    o.kv_type_given = 1;
    o.draft = draft;
    tern_err err;
    tern_engine *e = engine_new(g_model, g_tok, &o, &err);
    if (!e)
        fail_msg("engine: %s", err.msg);
    return e;
}

static engine_req *submit(tern_engine *e, int i, int max_tokens)
{
    int32_t ids[PROMPT];
    for (int j = 0; j < PROMPT; j++)
        ids[j] = 100 + 7 * i + 3 * j; /* distinct prompts: nothing shared through the prefix cache */
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = PROMPT;
    p.max_tokens = max_tokens;
    p.sample.temperature = 0;
    tern_err err;
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r)
        fail_msg("submit: %s", err.msg);
    return r;
}

/* Runs N_REQ requests at once; returns the peak number running together. */
static int burst(tern_engine *e)
{
    engine_req *r[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        r[i] = submit(e, i, GEN);
    int peak = 0;
    for (;;) {
        engine_stats st;
        engine_stats_get(e, &st);
        if (st.running > peak)
            peak = st.running;
        if (st.requests_finished >= N_REQ)
            break;
        usleep(500);
    }
    for (int i = 0; i < N_REQ; i++) {
        engine_event ev;
        while (engine_req_next(r[i], &ev, -1)) {
            int end = ev.kind != ENGINE_EV_TOKEN;
            engine_event_clear(&ev);
            if (end)
                break;
        }
        engine_req_release(r[i]);
    }
    return peak;
}

static void test_admitted_grows(void **state)
{
    (void)state;
    const model_config *c = model_config_get(g_model);
    kv_spec f32;
    kv_spec_init(&f32, KV_F32);
    size_t per_f32 = kv_spec_block_bytes(&f32, c->n_layer, c->n_kv_head, c->head_dim, KV_BLOCK_DEFAULT, 0);
    /* 20 f32 blocks; a request takes 3: (16 + 16) / 16 positions, plus one
     * kept for a copy-on-write (engine.c projected_blocks) */
    size_t budget = 20 * per_f32;
    static const kv_type types[] = {KV_F32, KV_BF16, KV_Q8, KV_Q4, KV_R4, KV_R3, KV_F8};
    static const double factor[] = {1, 2, 3.5, 6.5, 6.5, 6.5, 3.5};
    int blocks0 = 0, peak0 = 0;
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        tern_engine *e = new_engine(types[k], budget, N_REQ, NULL, 0);
        engine_stats st;
        engine_stats_get(e, &st);
        int peak = burst(e);
        engine_free(e);
        if (k == 0) {
            blocks0 = st.kv_blocks_total;
            peak0 = peak;
        }
        printf("%-4s: %3d blocks (%zu bytes of %zu), peak %2d running (f32 x %.2f)\n", kv_type_name(types[k]),
               st.kv_blocks_total, st.kv_bytes_total, budget, peak, (double)peak / peak0);
        assert_true(st.kv_bytes_total <= budget);
        if (types[k] == KV_BF16)
            assert_int_equal(st.kv_blocks_total, 2 * blocks0);
        else
            assert_true(st.kv_blocks_total >= factor[k] * blocks0);
        /* admission: every request that fits its 3 blocks runs at once */
        assert_int_equal(peak, st.kv_blocks_total / 3 < N_REQ ? st.kv_blocks_total / 3 : N_REQ);
        assert_true(peak >= (int)(factor[k] * peak0));
    }
    assert_int_equal(blocks0, 20);
}

/* Every type (and a 16-bit start) through the engine with the draft model:
 * greedy output the same with and without speculation. */
static void test_types_with_draft(void **state)
{
    (void)state;
    static const kv_type types[] = {KV_BF16, KV_F16, KV_Q8, KV_Q4, KV_R4, KV_R3, KV_F8};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        int32_t out[2][24];
        int n[2] = {0, 0};
        for (int spec = 0; spec < 2; spec++) {
            tern_engine *e = new_engine(types[k], 0, 4, spec ? g_draft : NULL, k % 2 ? 16 : 0);
            engine_req *r = submit(e, 3, 24);
            engine_event ev;
            while (engine_req_next(r, &ev, -1)) {
                int end = ev.kind != ENGINE_EV_TOKEN;
                if (!end && n[spec] < 24)
                    out[spec][n[spec]++] = ev.token;
                if (end)
                    assert_int_not_equal(ev.finish, ENGINE_FINISH_ERROR);
                engine_event_clear(&ev);
                if (end)
                    break;
            }
            engine_req_release(r);
            engine_free(e);
        }
        if (n[0] != n[1] || memcmp(out[0], out[1], (size_t)n[0] * sizeof(int32_t)))
            fail_msg("%s: greedy output with the draft model differs", kv_type_name(types[k]));
    }
}

static int setup(void **state)
{
    (void)state;
    tern_err err;
    g_model = model_load(repo_path("models/tern-demo"), 2, &err);
    g_draft = g_model ? model_load(repo_path("models/tern-demo-draft"), 2, &err) : NULL;
    g_tok = g_draft ? tokenizer_load(repo_path("models/tern-demo"), &err) : NULL;
    if (!g_tok) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    model_free(g_draft);
    model_free(g_model);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admitted_grows),
        cmocka_unit_test(test_types_with_draft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
