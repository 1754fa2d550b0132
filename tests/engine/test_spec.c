/* Speculative decoding in the batch: greedy output with a draft model (or
 * prompt lookup) is token-for-token the target's own, alone and in a batch of
 * 16 mixed rows (speculating, opted out, constrained); seeded sampling with
 * speculation does not depend on the batch; telemetry counts add up; the
 * drafts of constrained rows obey the row's grammar, so a sparse grammar's
 * rows accept about as many drafts as plain rows (not almost none). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "test_util.h"

static tern_model *g_target, *g_draft;
static tern_tokenizer *g_tok;

static const char *prompts[] = {
    "<|im_start|>user\nRepeat this text exactly: Small models are useful for testing.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n",
    "The old lighthouse",
    "<|im_start|>user\nAnswer in JSON with keys title, words: The quick brown fox.<|im_end|>\n<|im_start|>assistant\n",
};
#define NP 4

/* A toy constraint: token ids divisible by 3 are forbidden (keyed: every
 * other token is forced, id 100 + n at the n-th, as a JSON schema forces
 * its keys and punctuation between free values); it terminates after 12
 * accepted tokens. Enough to show masks apply at every verified position
 * and termination mid-burst ends the row. */
typedef struct toy { int n, keyed; int32_t V; } toy;
static int toy_allows(const toy *t, int32_t i) { return t->keyed && t->n % 2 == 0 ? i == 100 + t->n : i % 3 != 0; }
static int toy_mask(void *ctx, uint32_t *mask, int32_t nw)
{
    toy *t = ctx;
    memset(mask, 0, (size_t)nw * 4);
    for (int32_t i = 0; i < t->V; i++)
        if (toy_allows(t, i))
            mask[i >> 5] |= 1u << (i & 31);
    return 0;
}
static int toy_accept(void *ctx, int32_t tok)
{
    toy *t = ctx;
    if (!toy_allows(t, tok))
        return -1;
    t->n++;
    return 0;
}
static int toy_term(void *ctx) { return ((toy *)ctx)->n >= 12; }
static int toy_rollback(void *ctx, int n)
{
    ((toy *)ctx)->n -= n;
    return 0;
}
static void toy_free(void *ctx) { free(ctx); }
static const engine_constraint_ops toy_ops = {toy_mask, toy_accept, toy_term, toy_rollback, toy_free, NULL};

typedef struct out {
    int32_t ids[128];
    int n;
    engine_finish finish;
    engine_usage u;
} out;

static engine_req *submit(tern_engine *e, int pi, float temp, uint64_t seed, int constrained, int no_spec)
{
    int32_t *ids;
    size_t n;
    tern_err err;
    assert_int_equal(tokenizer_encode(g_tok, prompts[pi], strlen(prompts[pi]), 1, &ids, &n, &err), 0);
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = 28;
    p.sample.temperature = temp;
    p.sample.seed = seed;
    p.no_speculation = no_spec;
    if (constrained) {
        toy *t = calloc(1, sizeof *t);
        t->V = model_config_get(g_target)->n_vocab;
        t->keyed = constrained == 2;
        p.constraint = &toy_ops;
        p.constraint_ctx = t;
    }
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r)
        fail_msg("%s", err.msg);
    free(ids);
    return r;
}

static void drain(engine_req *r, out *o)
{
    engine_event ev;
    memset(o, 0, sizeof *o);
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_TOKEN)
            o->ids[o->n++] = ev.token;
        else {
            o->finish = ev.finish;
            o->u = ev.usage;
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
}

static tern_engine *engine(int mode, int batch)
{
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = batch;
    o.prefix_cache = 1;
    o.draft = mode == 1 ? g_draft : NULL;
    o.spec_ngram = mode == 2;
    o.n_draft = 4;
    tern_err err;
    tern_engine *e = engine_new(g_target, g_tok, &o, &err);
    if (!e)
        fail_msg("%s", err.msg);
    return e;
}

static out ref_plain[NP], ref_toy[NP], ref_keyed[NP];

static int setup(void **state)
{
    (void)state;
    tern_err err;
    g_target = model_load(repo_path("models/tern-demo"), 2, &err);
    g_draft = g_target ? model_load(repo_path("models/tern-demo-draft"), 2, &err) : NULL;
    g_tok = g_draft ? tokenizer_load(repo_path("models/tern-demo"), &err) : NULL;
    if (!g_tok) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    tern_engine *e = engine(0, 1);
    for (int i = 0; i < NP; i++) {
        drain(submit(e, i, 0, 0, 0, 0), &ref_plain[i]);
        drain(submit(e, i, 0, 0, 1, 0), &ref_toy[i]);
        drain(submit(e, i, 0, 0, 2, 0), &ref_keyed[i]);
    }
    engine_free(e);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    model_free(g_draft);
    model_free(g_target);
    return 0;
}

static void same(const out *a, const out *b, const char *what)
{
    if (a->n != b->n || memcmp(a->ids, b->ids, (size_t)a->n * 4) || a->finish != b->finish)
        fail_msg("%s: output differs from the target alone (%d vs %d tokens)", what, a->n, b->n);
}

static void test_greedy_alone(void **state)
{
    (void)state;
    for (int mode = 1; mode <= 2; mode++) {
        tern_engine *e = engine(mode, 1);
        int drafted = 0, accepted = 0;
        for (int i = 0; i < NP; i++) {
            out o;
            drain(submit(e, i, 0, 0, 0, 0), &o);
            same(&o, &ref_plain[i], mode == 1 ? "draft, alone" : "lookup, alone");
            drafted += o.u.n_drafted;
            accepted += o.u.n_accepted;
            int by_pos = 0;
            for (int k = 0; k < ENGINE_MAX_DRAFT; k++)
                by_pos += o.u.accepted_by_pos[k];
            assert_int_equal(by_pos, o.u.n_accepted);
            assert_true(o.u.n_accepted <= o.u.n_drafted);
            /* every forward yields at least one token */
            assert_true(o.u.n_target_forwards <= o.n + 1);
            drain(submit(e, i, 0, 0, 1, 0), &o);
            same(&o, &ref_toy[i], mode == 1 ? "draft, constrained" : "lookup, constrained");
        }
        printf("mode %s: %d drafted, %d accepted\n", mode == 1 ? "draft" : "lookup", drafted, accepted);
        assert_true(drafted > 0 && accepted > 0);
        engine_free(e);
    }
}

static void test_greedy_mixed_batch(void **state)
{
    (void)state;
    for (int mode = 1; mode <= 2; mode++) {
        tern_engine *e = engine(mode, 16);
        engine_req *r[16];
        for (int i = 0; i < 16; i++) /* speculating, opted-out and constrained rows */
            r[i] = submit(e, i % NP, 0, 0, (i / NP) == 2, (i / NP) == 1);
        for (int i = 0; i < 16; i++) {
            out o;
            drain(r[i], &o);
            same(&o, (i / NP) == 2 ? &ref_toy[i % NP] : &ref_plain[i % NP], "mixed batch of 16");
            if ((i / NP) == 1)
                assert_int_equal(o.u.n_drafted, 0);
        }
        engine_free(e);
    }
}

static void test_seeded_sampling_batch_invariant(void **state)
{
    (void)state;
    tern_engine *e = engine(1, 8);
    out alone, in_batch, other;
    drain(submit(e, 1, 0.8f, 1234, 0, 0), &alone);
    engine_req *rs[5];
    for (int i = 0; i < 4; i++)
        rs[i] = submit(e, i, 0.7f, 50 + i, 0, 0);
    rs[4] = submit(e, 1, 0.8f, 1234, 0, 0);
    drain(rs[4], &in_batch);
    for (int i = 0; i < 4; i++)
        drain(rs[i], &other);
    same(&in_batch, &alone, "seeded sampling with speculation");
    assert_true(alone.u.n_drafted > 0);
    engine_free(e);
}

/* Rows of a keyed grammar (every other token forced) with a draft model:
 * their drafts are proposed among the allowed ids, so a forced one is
 * always accepted when the walk gets there (unmasked, the draft would
 * almost never propose it, and every walk would end by the second
 * position); greedy output is the target's own, and a sampled row emits
 * the forced ids. */
static void test_constrained_drafts(void **state)
{
    (void)state;
    tern_engine *e = engine(1, 8);
    int pd = 0, pa = 0, cd = 0, ca = 0;
    for (int i = 0; i < NP; i++) {
        out o;
        drain(submit(e, i, 0, 0, 0, 0), &o);
        pd += o.u.n_drafted;
        pa += o.u.n_accepted;
        drain(submit(e, i, 0, 0, 2, 0), &o);
        same(&o, &ref_keyed[i], "draft, keyed grammar");
        cd += o.u.n_drafted;
        ca += o.u.n_accepted;
        drain(submit(e, i, 0.8f, 77 + (uint64_t)i, 2, 0), &o);
        assert_int_equal(o.finish, ENGINE_FINISH_STOP);
        assert_int_equal(o.n, 12);
        for (int k = 0; k < o.n; k += 2)
            assert_int_equal(o.ids[k], 100 + k);
    }
    double rp = pd ? (double)pa / pd : 0, rc = cd ? (double)ca / cd : 0;
    printf("draft acceptance: plain %d/%d = %.2f, keyed grammar %d/%d = %.2f\n", pa, pd, rp, ca, cd, rc);
    assert_true(cd > 0 && pd > 0);
    /* measured: 0.27 masked, 0.05 with the drafts unmasked (plain 0.54:
     * the free positions of this toy are text the models rarely agree on) */
    assert_true(rc >= 0.15);
    engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_alone),
        cmocka_unit_test(test_greedy_mixed_batch),
        cmocka_unit_test(test_seeded_sampling_batch_invariant),
        cmocka_unit_test(test_constrained_drafts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
