/* The step loop against its own single-request runs: batching, joining
 * mid-decode, cancellation, prefix-cache reuse and eviction, seeded sampling
 * across batch compositions, stop strings across token boundaries. Runs on
 * the demo model (bf16 weights, f32 activations: kernels are batch-invariant,
 * so batched greedy output must be identical, not merely close).
 * TERN_TEST_DEVICE=cuda: the model on the GPU in the default (throughput)
 * products with TERN_CUDA_INVARIANT=3 - a step of one sequence on the
 * batched steps' products and attention splits - and TERN_CUDA_GEMM_MIN_T=1000000 (prefill
 * chunks on the tensor-core GEMV too, not cuBLAS, whose bits depend on the
 * step's size): every check here holds there as on the CPU. */
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

static tern_model *g_model;
static tern_tokenizer *g_tok;

static const char *prompts[] = {
    "The old lighthouse",
    "Once upon a time there was",
    "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n",
    "In the morning the sailors",
    "A small model is useful for",
    "The river ran quietly past the mill, and",
    "Numbers: 1, 2, 3,",
    "She opened the door and saw",
};
#define N_PROMPTS (int)(sizeof prompts / sizeof prompts[0])

typedef struct result {
    int32_t ids[256];
    int n;
    char text[4096];
    size_t text_len;
    engine_finish finish;
    engine_usage usage;
} result;

static engine_req *submit(tern_engine *e, const char *prompt, int max_tokens, float temp, uint64_t seed,
                          const char *stop)
{
    int32_t *ids;
    size_t n;
    tern_err err;
    assert_int_equal(tokenizer_encode(g_tok, prompt, strlen(prompt), 1, &ids, &n, &err), 0);
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = max_tokens;
    p.sample.temperature = temp;
    p.sample.seed = seed;
    const char *stops[1] = {stop};
    if (stop) {
        p.stop = stops;
        p.n_stop = 1;
    }
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r)
        fail_msg("submit: %s", err.msg);
    free(ids);
    return r;
}

/* Drains events into res; stops after max_events tokens if > 0 (returns 0
 * then, 1 when the request finished). */
static int drain(engine_req *r, result *res, int max_events)
{
    engine_event ev;
    while (engine_req_next(r, &ev, -1)) {
        if (ev.text_len) {
            assert_true(res->text_len + ev.text_len < sizeof res->text);
            memcpy(res->text + res->text_len, ev.text, ev.text_len);
            res->text_len += ev.text_len;
        }
        if (ev.kind == ENGINE_EV_TOKEN)
            res->ids[res->n++] = ev.token;
        else {
            res->finish = ev.finish;
            res->usage = ev.usage;
            engine_event_clear(&ev);
            return 1;
        }
        engine_event_clear(&ev);
        if (max_events > 0 && res->n >= max_events)
            return 0;
    }
    return 0;
}

static tern_engine *new_engine(int max_batch, size_t kv_bytes, int prefix_cache)
{
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = max_batch;
    o.kv_budget_bytes = kv_bytes;
    o.prefix_cache = prefix_cache;
    o.prefill_chunk = 32; /* small chunks: long prompts interleave with decode rows */
    tern_err err;
    tern_engine *e = engine_new(g_model, g_tok, &o, &err);
    if (!e)
        fail_msg("engine: %s", err.msg);
    return e;
}

static result alone[N_PROMPTS];
static const int lens[N_PROMPTS] = {24, 40, 32, 16, 28, 36, 20, 12};

static int setup(void **state)
{
    (void)state;
    tern_err err;
    model_load_opts lo = {2, getenv("TERN_TEST_DEVICE") ? getenv("TERN_TEST_DEVICE") : "cpu"};
    if (strcmp(lo.device, "cpu") != 0) {
        setenv("TERN_CUDA_INVARIANT", "3", 1);
        setenv("TERN_CUDA_GEMM_MIN_T", "1000000", 1);
    }
    g_model = model_load_ex(repo_path("models/tern-demo"), &lo, &err);
    g_tok = g_model ? tokenizer_load(repo_path("models/tern-demo"), &err) : NULL;
    if (!g_tok) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    /* reference: each prompt alone, batch of one, no cache */
    tern_engine *e = new_engine(1, 0, 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        engine_req *r = submit(e, prompts[i], lens[i], 0, 0, NULL);
        drain(r, &alone[i], 0);
        engine_req_release(r);
    }
    engine_free(e);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    model_free(g_model);
    return 0;
}

static void expect_same(const result *got, const result *want, const char *what)
{
    if (got->n != want->n || memcmp(got->ids, want->ids, (size_t)want->n * sizeof(int32_t)))
        fail_msg("%s: tokens differ from the request run alone", what);
    if (got->text_len != want->text_len || memcmp(got->text, want->text, want->text_len))
        fail_msg("%s: text differs from the request run alone", what);
}

/* N concurrent greedy requests with staggered arrivals: each equals alone. */
static void test_batched_equals_alone(void **state)
{
    (void)state;
    const int ns[3] = {1, 4, 16};
    for (int k = 0; k < 3; k++) {
        int n = ns[k];
        tern_engine *e = new_engine(16, 0, 1);
        engine_req *reqs[16];
        result res[16];
        memset(res, 0, sizeof res);
        /* half now; the rest join after the first has produced a few tokens */
        for (int i = 0; i < n; i++) {
            if (i == (n + 1) / 2)
                drain(reqs[0], &res[0], 3);
            reqs[i] = submit(e, prompts[i % N_PROMPTS], lens[i % N_PROMPTS], 0, 0, NULL);
        }
        for (int i = 0; i < n; i++) {
            drain(reqs[i], &res[i], 0);
            engine_req_release(reqs[i]);
            char what[64];
            snprintf(what, sizeof what, "batch %d, request %d", n, i);
            expect_same(&res[i], &alone[i % N_PROMPTS], what);
            assert_int_equal(res[i].finish, alone[i % N_PROMPTS].finish);
        }
        engine_free(e);
    }
}

/* Requests cancelled mid-stream free their rows; the others are unaffected. */
static void test_cancel_mid_stream(void **state)
{
    (void)state;
    tern_engine *e = new_engine(8, 0, 0);
    engine_req *reqs[8];
    result res[8];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 8; i++)
        reqs[i] = submit(e, prompts[i], lens[i], 0, 0, NULL);
    for (int i = 0; i < 8; i += 2) { /* cancel the even ones after 2 tokens */
        drain(reqs[i], &res[i], 2);
        engine_req_cancel(reqs[i]);
    }
    for (int i = 0; i < 8; i++) {
        int done = drain(reqs[i], &res[i], 0);
        assert_true(done);
        if (i % 2 == 0)
            assert_true(res[i].finish == ENGINE_FINISH_CANCELLED || res[i].n == alone[i].n);
        else
            expect_same(&res[i], &alone[i], "uncancelled neighbour");
        engine_req_release(reqs[i]);
    }
    engine_stats st;
    for (int tries = 0; tries < 100; tries++) { /* the engine retires rows right after their last event */
        engine_stats_get(e, &st);
        if (st.running == 0 && st.kv_blocks_used == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(st.running, 0);
    assert_int_equal(st.kv_blocks_used, 0); /* every block returned (no prefix cache here) */
    engine_free(e);
}

/* A repeated prompt reuses cached blocks and prefills only the rest. */
static void test_prefix_cache(void **state)
{
    (void)state;
    const char *long_prompt =
        "<|im_start|>system\nYou are a helpful assistant that answers briefly and precisely, "
        "with one sentence, and never more than twenty words.<|im_end|>\n<|im_start|>user\n"
        "Continue this text: The old ship left the harbour at dawn.<|im_end|>\n<|im_start|>assistant\n";
    result a = {0}, b = {0};
    tern_engine *e = new_engine(4, 0, 1);
    engine_req *r = submit(e, long_prompt, 20, 0, 0, NULL);
    drain(r, &a, 0);
    engine_req_release(r);
    engine_stats s0, s1;
    engine_stats_get(e, &s0);
    r = submit(e, long_prompt, 20, 0, 0, NULL);
    drain(r, &b, 0);
    engine_req_release(r);
    engine_stats_get(e, &s1);
    expect_same(&b, &a, "cached repeat");
    printf("prompt %d tokens, cached %d, prefilled %lld\n", b.usage.n_prompt, b.usage.n_cached,
           s1.tokens_prefilled - s0.tokens_prefilled);
    assert_true(b.usage.n_cached >= b.usage.n_prompt - 16); /* all but the last partial block */
    assert_int_equal(s1.tokens_prefilled - s0.tokens_prefilled, b.usage.n_prompt - b.usage.n_cached - 1);
    engine_free(e);
    /* a tiny budget forces eviction between requests; results stay identical */
    size_t per_tok = kv_bytes_per_token(model_config_get(g_model)->n_layer, model_kv_dim(g_model));
    e = new_engine(2, per_tok * 16 * 12, 1);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 4; i++) {
            result x = {0};
            r = submit(e, prompts[i], lens[i], 0, 0, NULL);
            drain(r, &x, 0);
            engine_req_release(r);
            expect_same(&x, &alone[i], "under eviction");
        }
    engine_free(e);
}

/* Same seed, same tokens, whatever else runs in the batch. */
static void test_seeded_across_batches(void **state)
{
    (void)state;
    result solo = {0};
    tern_engine *e = new_engine(8, 0, 0);
    engine_req *r = submit(e, prompts[0], 24, 0.9f, 4242, NULL);
    drain(r, &solo, 0);
    engine_req_release(r);
    engine_req *reqs[6];
    result res[6];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 6; i++)
        reqs[i] = submit(e, prompts[i], 24, 0.9f, i == 3 ? 4242 : 100 + i, NULL);
    /* request 3 uses prompt 3; resubmit prompt 0 with the seed inside the batch */
    engine_req *mine = submit(e, prompts[0], 24, 0.9f, 4242, NULL);
    result m = {0};
    drain(mine, &m, 0);
    engine_req_release(mine);
    for (int i = 0; i < 6; i++) {
        drain(reqs[i], &res[i], 0);
        engine_req_release(reqs[i]);
    }
    expect_same(&m, &solo, "seeded sample in a batch");
    engine_free(e);
}

/* Stop strings: found across token boundaries and never partly emitted. */
static void test_stop_strings(void **state)
{
    (void)state;
    const result *ref = &alone[1];
    assert_true(ref->text_len > 12);
    /* a stop string straddling tokens: take 5 bytes from the middle */
    char stop[8];
    size_t at = ref->text_len / 2;
    memcpy(stop, ref->text + at, 5);
    stop[5] = '\0';
    const char *first = memmem(ref->text, ref->text_len, stop, 5);
    size_t cut = (size_t)(first - ref->text);
    tern_engine *e = new_engine(2, 0, 0);
    result x = {0};
    engine_req *r = submit(e, prompts[1], lens[1], 0, 0, stop);
    drain(r, &x, 0);
    engine_req_release(r);
    engine_free(e);
    assert_int_equal(x.finish, ENGINE_FINISH_STOP);
    assert_int_equal(x.text_len, cut);
    assert_memory_equal(x.text, ref->text, cut);
    printf("stop %s: text cut at %zu of %zu bytes after %d tokens\n", stop, cut, ref->text_len, x.n);
}

static void test_rejections(void **state)
{
    (void)state;
    tern_engine *e = new_engine(2, 0, 0);
    tern_err err;
    engine_params p;
    engine_params_default(&p);
    int32_t big[3000];
    for (int i = 0; i < 3000; i++)
        big[i] = 100 + i % 50;
    p.prompt = big;
    p.n_prompt = 3000; /* context is 2048 */
    assert_null(engine_submit(e, &p, NULL, NULL, &err));
    assert_int_equal(err.code, TERN_ERANGE);
    p.n_prompt = 4;
    big[1] = 1 << 20;
    assert_null(engine_submit(e, &p, NULL, NULL, &err));
    assert_int_equal(err.code, TERN_ERANGE);
    big[1] = 5;
    p.sample.top_p = 2;
    assert_null(engine_submit(e, &p, NULL, NULL, &err));
    engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone), cmocka_unit_test(test_cancel_mid_stream),
        cmocka_unit_test(test_prefix_cache),         cmocka_unit_test(test_seeded_across_batches),
        cmocka_unit_test(test_stop_strings),         cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
