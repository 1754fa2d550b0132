/* LoRA adapters through the step loop: requests of the base and of two
 * adapters (random PEFT adapters of the demo model, written by
 * build/tools/make_lora) decode together in one batch and each gets the
 * greedy tokens it gets alone - which are the tokens of the model's own
 * adapter forward (model_forward_lora, held to PEFT by tests/model/test_lora.c)
 * step by step. The prefix cache (keyed by adapter) never hands a request
 * KV computed under another adapter (or the base), and does reuse its own
 * adapter's. With TERN_TEST_DEVICE=cuda the target runs on the GPU (its
 * device forward and device sampling). Adapter rows speculate (a draft model without the adapter, and
 * prompt lookup) and keep exactly the tokens they get without. */
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
#include "model/lora.h"
#include "tensor/kernels.h"
#include "test_util.h"

#define N_NEW 12

static tern_model *g_model, *g_draft;
static tern_tokenizer *g_tok;
static model_lora *g_a, *g_b;
static char g_root[64];

static const char *prompts[] = {
    "Once upon a time there was a little fox who lived in the forest near the river, and every morning",
    "The old lighthouse",
    "In the morning the sailors",
};
#define N_PROMPTS 3

static int setup(void **state)
{
    (void)state;
    tern_err err = {0};
    /* TERN_TEST_DEVICE=cuda: the same checks with the target on the GPU,
     * with exact products - the GPU's default throughput products give a
     * step of several sequences other bits than a row alone (knife-edge
     * token flips, docs/cuda.md), which is not what "the same tokens as
     * alone" is about; exact products keep every step on one rule */
    model_load_opts lo = {2, getenv("TERN_TEST_DEVICE") ? getenv("TERN_TEST_DEVICE") : "cpu"};
    if (strcmp(lo.device, "cpu") != 0)
        tern_kernels_exact_set(1);
    g_model = model_load_ex(repo_path("models/tern-demo"), &lo, &err);
    if (!g_model)
        fprintf(stderr, "%s\n", err.msg);
    g_tok = tokenizer_load(repo_path("models/tern-demo"), &err);
    g_draft = model_load(repo_path("models/tern-demo-draft"), 2, &err);
    snprintf(g_root, sizeof g_root, "/tmp/tern-elora-XXXXXX");
    if (!g_model || !g_tok || !g_draft || !mkdtemp(g_root))
        return -1;
    const char *bin = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/tools/make_lora --base %s --out %s/a --r 8 --alpha 16 --targets q_proj,v_proj --seed 1 && "
             "%s/tools/make_lora --base %s --out %s/b --r 4 --alpha 8 --rslora --seed 2 "
             "--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
             bin, repo_path("models/tern-demo"), g_root, bin, repo_path("models/tern-demo"), g_root);
    if (system(cmd) != 0)
        return -1;
    snprintf(cmd, sizeof cmd, "%s/a", g_root);
    g_a = model_lora_load(g_model, cmd, &err);
    snprintf(cmd, sizeof cmd, "%s/b", g_root);
    g_b = model_lora_load(g_model, cmd, &err);
    return g_a && g_b ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
    if (system(cmd) != 0)
        return -1;
    model_lora_release(g_a);
    model_lora_release(g_b);
    tokenizer_free(g_tok);
    model_free(g_model);
    model_free(g_draft);
    return 0;
}

/* spec: 0 none, 1 the draft model, 2 prompt lookup */
static tern_engine *engine_spec(int spec)
{
    engine_opts o;
    engine_opts_default(&o);
    if (spec) {
        o.draft = spec == 1 ? g_draft : NULL;
        o.n_draft = 4;
    }
    o.kv_budget_bytes = 64u << 20;
    o.prefill_chunk = 24; /* long prompts prefill over several steps, beside decoding rows */
    tern_err err = {0};
    tern_engine *e = engine_new(g_model, g_tok, &o, &err);
    if (!e)
        fail_msg("engine: %s", err.msg);
    return e;
}

static tern_engine *engine(void) { return engine_spec(0); }

static engine_req *submit(tern_engine *e, const char *prompt, const model_lora *a)
{
    int32_t *ids;
    size_t n;
    tern_err err = {0};
    assert_int_equal(tokenizer_encode(g_tok, prompt, strlen(prompt), 1, &ids, &n, &err), 0);
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = N_NEW;
    p.ignore_eos = 1;
    p.sample.temperature = 0;
    p.lora = a;
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r)
        fail_msg("submit: %s", err.msg);
    free(ids);
    return r;
}

static int drain(engine_req *r, int32_t *ids, engine_usage *u)
{
    engine_event ev;
    int n = 0;
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_TOKEN && n < N_NEW)
            ids[n++] = ev.token;
        if (ev.kind == ENGINE_EV_FINISH) {
            if (ev.finish == ENGINE_FINISH_ERROR)
                fail_msg("request failed: %s", ev.error);
            if (u)
                *u = ev.usage;
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
    return n;
}

/* Greedy tokens of prompt under adapter a straight from the model's forward. */
static void reference(const char *prompt, const model_lora *a, int32_t *out)
{
    int32_t *ids;
    size_t n;
    tern_err err = {0};
    assert_int_equal(tokenizer_encode(g_tok, prompt, strlen(prompt), 1, &ids, &n, &err), 0);
    const model_config *c = model_config_get(g_model);
    kv_pool kv;
    kv_spec ks; /* the KV type the engine uses by default */
    kv_spec_init(&ks, model_kv_type_default(g_model));
    assert_int_equal(model_kv_pool_init(g_model, &kv, &ks, 16, 16, 0, 1, &err), 0);
    kv_seq seq = {0};
    float *lg = malloc((size_t)c->n_vocab * sizeof(float));
    int32_t pos[256], row = 0;
    kv_seq *sq[256];
    const model_lora *rl[256];
    int32_t cur[256];
    int m = (int)n, p0 = 0;
    memcpy(cur, ids, n * sizeof *ids);
    for (int k = 0; k <= N_NEW - 1 + 0; k++) {
        assert_int_equal(kv_seq_reserve(&kv, &seq, p0 + m, &err), 0);
        for (int i = 0; i < m; i++) {
            pos[i] = p0 + i;
            sq[i] = &seq;
            rl[i] = a;
        }
        row = m - 1;
        fwd_batch b = {m, cur, pos, sq, 1, &row};
        assert_int_equal(model_forward_lora(g_model, &kv, &b, rl, lg, NULL, &err), 0);
        int best = 0;
        for (int t = 1; t < c->n_vocab; t++)
            if (lg[t] > lg[best])
                best = t;
        out[k] = best;
        p0 += m;
        m = 1;
        cur[0] = best;
    }
    free(lg);
    free(ids);
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
}

static void test_mixed_equals_alone(void **state)
{
    (void)state;
    const model_lora *who[3] = {NULL, g_a, g_b};
    int32_t alone[N_PROMPTS][3][N_NEW], mixed[N_PROMPTS][3][N_NEW], ref[N_NEW];
    tern_engine *e = engine();
    for (int p = 0; p < N_PROMPTS; p++)
        for (int w = 0; w < 3; w++) {
            assert_int_equal(drain(submit(e, prompts[p], who[w]), alone[p][w], NULL), N_NEW);
            reference(prompts[p], who[w], ref);
            assert_memory_equal(alone[p][w], ref, sizeof ref);
        }
    engine_free(e);
    e = engine(); /* fresh: no cached prefixes */
    engine_req *rs[N_PROMPTS][3];
    for (int w = 0; w < 3; w++) /* interleaved arrival: base, A, B rows in every step */
        for (int p = 0; p < N_PROMPTS; p++)
            rs[p][w] = submit(e, prompts[p], who[(w + p) % 3]);
    for (int w = 0; w < 3; w++)
        for (int p = 0; p < N_PROMPTS; p++)
            assert_int_equal(drain(rs[p][w], mixed[p][(w + p) % 3], NULL), N_NEW);
    engine_free(e);
    int differ = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        for (int w = 0; w < 3; w++)
            if (memcmp(alone[p][w], mixed[p][w], sizeof alone[p][w]))
                fail_msg("prompt %d, adapter %d: mixed-batch tokens differ from alone", p, w);
        differ += memcmp(alone[p][0], alone[p][1], sizeof alone[p][0]) != 0;
        differ += memcmp(alone[p][0], alone[p][2], sizeof alone[p][0]) != 0;
    }
    assert_true(differ >= 3); /* the adapters change the answers */
}

/* Fails naming the run when got differs from want. */
static void tokens_check(const int32_t *got, const int32_t *want, const char *what)
{
    if (memcmp(got, want, N_NEW * sizeof *got))
        fail_msg("%s: tokens %d %d %d %d ... differ from the adapter's forward %d %d %d %d ...", what, got[0], got[1],
                 got[2], got[3], want[0], want[1], want[2], want[3]);
}

/* The long prompt's full blocks: cached after the base ran it, but not for
 * A; A's own run caches them for A only, and A's second run reuses them
 * (with the same tokens as uncached). The references run in between on
 * their own pools: on a device the engine's KV lives only in its pool's
 * mirror, which such a forward must not lose. */
static void test_prefix_cache_keyed(void **state)
{
    (void)state;
    int32_t base[N_NEW], a1[N_NEW], a2[N_NEW], b1[N_NEW], ref[N_NEW], ref0[N_NEW];
    engine_usage u;
    tern_engine *e = engine();
    drain(submit(e, prompts[0], NULL), base, &u);
    assert_int_equal(u.n_cached, 0);
    drain(submit(e, prompts[0], g_a), a1, &u);
    assert_int_equal(u.n_cached, 0); /* the base's KV is not A's */
    reference(prompts[0], g_a, ref);
    tokens_check(a1, ref, "A after the base");
    drain(submit(e, prompts[0], g_a), a2, &u);
    printf("second run under A reused %d cached positions\n", u.n_cached);
    assert_true(u.n_cached >= 16); /* its own blocks, at least one */
    tokens_check(a2, ref, "A again, from its cached blocks");
    drain(submit(e, prompts[0], g_b), b1, &u);
    assert_int_equal(u.n_cached, 0); /* nor A's B's */
    reference(prompts[0], g_b, ref);
    tokens_check(b1, ref, "B after A");
    reference(prompts[0], NULL, ref0);
    tokens_check(base, ref0, "the base");
    drain(submit(e, prompts[0], NULL), base, &u);
    assert_true(u.n_cached > 0); /* the base still finds its own */
    tokens_check(base, ref0, "the base again, from its cached blocks");
    engine_free(e);
}

/* Base, A and B requests together under speculation (a draft model, then
 * prompt lookup): every one keeps the tokens of the adapter's forward, and
 * the adapter rows did draft from the draft model. */
static void test_adapter_rows_speculate(void **state)
{
    (void)state;
    const model_lora *who[3] = {NULL, g_a, g_b};
    int32_t ref[N_PROMPTS][3][N_NEW];
    for (int p = 0; p < N_PROMPTS; p++)
        for (int w = 0; w < 3; w++)
            reference(prompts[p], who[w], ref[p][w]);
    for (int spec = 1; spec <= 2; spec++) {
        tern_engine *e = engine_spec(spec);
        engine_req *rs[N_PROMPTS][3];
        for (int p = 0; p < N_PROMPTS; p++)
            for (int w = 0; w < 3; w++)
                rs[p][w] = submit(e, prompts[p], who[w]);
        int drafted = 0, accepted = 0;
        for (int p = 0; p < N_PROMPTS; p++)
            for (int w = 0; w < 3; w++) {
                int32_t got[N_NEW];
                engine_usage u;
                assert_int_equal(drain(rs[p][w], got, &u), N_NEW);
                if (memcmp(got, ref[p][w], sizeof got))
                    fail_msg("%s, prompt %d, adapter %d: tokens differ from the adapter's forward",
                             spec == 1 ? "draft" : "lookup", p, w);
                if (w > 0) {
                    drafted += u.n_drafted;
                    accepted += u.n_accepted;
                }
            }
        engine_free(e);
        printf("adapter rows, %s: %d drafted, %d accepted\n", spec == 1 ? "draft model" : "prompt lookup", drafted,
               accepted);
        assert_true(drafted > 0 || spec == 2); /* these prompts repeat little: lookup may find nothing */
        assert_true(accepted <= drafted);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_equals_alone),
        cmocka_unit_test(test_prefix_cache_keyed),
        cmocka_unit_test(test_adapter_rows_speculate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
