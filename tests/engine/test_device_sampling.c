/* The engine's device greedy path (backend forward_start / argmax_finish),
 * on the CPU: a stand-in backend computes the forward with the CPU backend
 * and does the masked argmax the device would (its documented contract),
 * so the orchestration - masks computed ahead over the drafts and rolled
 * back, verification from ids, fallbacks to the host for sampled rows,
 * errors - is checked against the plain CPU engine token for token:
 * alone and batched, with a draft model, with prompt lookup, with a
 * state-dependent constraint, and mixed with sampled rows. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/backend.h"
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

/* ---- the stand-in device backend ---- */

typedef struct fake_be {
    model_backend base;
    model_backend *inner; /* the model's CPU backend */
    tern_model *m;
    float *logits;
    int cap, n_out;
    int n_finish, n_masked; /* argmax_finish calls, masked rows seen */
    int n_logits;           /* logits_finish calls */
} fake_be;

static int fk_matmul(model_backend *b, int n, const model_weight *const *w, const float *X, float *const *Y, int T,
                     tern_err *err)
{
    fake_be *f = (fake_be *)b;
    return f->inner->matmul(f->inner, n, w, X, Y, T, err);
}
static int fk_attention(model_backend *b, const model_attn *a, tern_err *err)
{
    fake_be *f = (fake_be *)b;
    return f->inner->attention(f->inner, a, err);
}
static int fk_threads(const model_backend *b) { return ((const fake_be *)b)->inner->n_threads(((const fake_be *)b)->inner); }
static void fk_free(model_backend *b) { (void)b; }

static int fk_start(model_backend *b, tern_model *m, kv_pool *kv, const fwd_batch *bt, tern_err *err)
{
    fake_be *f = (fake_be *)b;
    assert_ptr_equal(m, f->m);
    assert_int_equal(f->n_out, -1); /* argmax_finish followed the last start */
    if (bt->n_out > f->cap) {
        f->cap = bt->n_out;
        f->logits = realloc(f->logits, (size_t)f->cap * m->cfg.n_vocab * sizeof(float));
    }
    m->be = f->inner;
    int rc = model_forward(m, kv, bt, f->logits, err);
    m->be = &f->base;
    f->n_out = rc ? -1 : bt->n_out;
    return rc;
}

static int fk_finish(model_backend *b, const uint32_t *masks, int32_t nw, const uint8_t *on, int32_t *ids,
                     tern_err *err)
{
    fake_be *f = (fake_be *)b;
    (void)err;
    assert_true(f->n_out >= 0);
    int32_t V = f->m->cfg.n_vocab;
    for (int j = 0; j < f->n_out; j++) {
        const float *x = f->logits + (size_t)j * V;
        const uint32_t *mk = masks && on && on[j] ? masks + (size_t)j * nw : NULL;
        f->n_masked += mk != NULL;
        int32_t best = -1;
        for (int32_t t = 0; t < V; t++) {
            if (mk && !(mk[t >> 5] >> (t & 31) & 1))
                continue;
            if (isnan(x[t]))
                continue;
            if (best < 0 || x[t] > x[best])
                best = t;
        }
        if (mk && best >= 0 && x[best] == -INFINITY)
            best = -1;
        ids[j] = best;
    }
    f->n_out = -1;
    f->n_finish++;
    return 0;
}

static int fk_logits(model_backend *b, float *logits, tern_err *err)
{
    fake_be *f = (fake_be *)b;
    (void)err;
    assert_true(f->n_out >= 0);
    memcpy(logits, f->logits, (size_t)f->n_out * f->m->cfg.n_vocab * sizeof(float));
    f->n_out = -1;
    f->n_logits++;
    return 0;
}

static fake_be g_fk[2];

static void install(tern_model *m, fake_be *f)
{
    memset(f, 0, sizeof *f);
    f->inner = m->be;
    f->m = m;
    f->n_out = -1;
    f->base.name = "fake-device";
    f->base.matmul = fk_matmul;
    f->base.attention = fk_attention;
    f->base.n_threads = fk_threads;
    f->base.free = fk_free;
    f->base.forward_start = fk_start;
    f->base.argmax_finish = fk_finish;
    f->base.logits_finish = fk_logits;
    m->be = &f->base;
}

static void uninstall(tern_model *m, fake_be *f)
{
    m->be = f->inner;
    free(f->logits);
}

/* ---- constraints ---- */

/* State-dependent: after an even number of accepted tokens, ids divisible
 * by 3 are forbidden, after an odd number ids divisible by 5; terminates
 * after 10 tokens. A mask computed for the wrong state shows. mode 1: the
 * mask cannot be computed at the 3rd token; mode 2: nothing is allowed at
 * the 3rd token. */
typedef struct toy {
    int n, mode;
    int32_t V;
} toy;
static int toy_ok(const toy *t, int32_t id) { return t->n % 2 ? id % 5 != 0 : id % 3 != 0; }
static int toy_mask(void *ctx, uint32_t *mask, int32_t nw)
{
    toy *t = ctx;
    memset(mask, 0, (size_t)nw * 4);
    if (t->mode == 1 && t->n == 2)
        return -1;
    if (t->mode == 2 && t->n == 2)
        return 0;
    for (int32_t i = 0; i < t->V; i++)
        if (toy_ok(t, i))
            mask[i >> 5] |= 1u << (i & 31);
    return 0;
}
static int toy_accept(void *ctx, int32_t tok)
{
    toy *t = ctx;
    if (!toy_ok(t, tok))
        return -1;
    t->n++;
    return 0;
}
static int toy_term(void *ctx) { return ((toy *)ctx)->n >= 10; }
static int toy_rollback(void *ctx, int n)
{
    ((toy *)ctx)->n -= n;
    return 0;
}
static void toy_free(void *ctx) { free(ctx); }
static const engine_constraint_ops toy_ops = {toy_mask, toy_accept, toy_term, toy_rollback, toy_free, NULL};

/* ---- requests ---- */

typedef struct out {
    int32_t ids[128];
    int n;
    engine_finish finish;
    engine_usage u;
} out;

static engine_req *submit(tern_engine *e, int pi, float temp, uint64_t seed, int constrained, int logprobs)
{
    int32_t *ids;
    size_t n;
    tern_err err;
    assert_int_equal(tokenizer_encode(g_tok, prompts[pi], strlen(prompts[pi]), 1, &ids, &n, &err), 0);
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = 24;
    p.sample.temperature = temp;
    p.sample.seed = seed;
    if (logprobs)
        p.sample.n_logprobs = 2;
    if (constrained) {
        toy *t = calloc(1, sizeof *t);
        t->V = g_target->cfg.n_vocab;
        t->mode = constrained - 1;
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
        if (ev.kind == ENGINE_EV_TOKEN) {
            if (o->n < 128)
                o->ids[o->n++] = ev.token;
        } else {
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
    o.draft = mode == 1 ? g_draft : NULL;
    o.spec_ngram = mode == 2;
    o.n_draft = 4;
    tern_err err;
    tern_engine *e = engine_new(g_target, g_tok, &o, &err);
    if (!e)
        fail_msg("%s", err.msg);
    return e;
}

/* references from the plain CPU engine: [prompt][plain, constrained, sampled,
 * sampled constrained],
 * and with the draft model [prompt][plain, constrained] (for its counts:
 * the device's greedy drafts must be the host's) */
static out ref[NP][4], ref_draft[NP][2];

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
        drain(submit(e, i, 0, 0, 0, 0), &ref[i][0]);
        drain(submit(e, i, 0, 0, 1, 0), &ref[i][1]);
        drain(submit(e, i, 0.8f, 77 + i, 0, 0), &ref[i][2]);
        drain(submit(e, i, 0.8f, 91 + i, 1, 0), &ref[i][3]); /* sampled under the constraint */
    }
    engine_free(e);
    e = engine(1, 1);
    for (int i = 0; i < NP; i++) {
        drain(submit(e, i, 0, 0, 0, 0), &ref_draft[i][0]);
        drain(submit(e, i, 0, 0, 1, 0), &ref_draft[i][1]);
    }
    engine_free(e);
    install(g_target, &g_fk[0]);
    install(g_draft, &g_fk[1]);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    uninstall(g_target, &g_fk[0]);
    uninstall(g_draft, &g_fk[1]);
    tokenizer_free(g_tok);
    model_free(g_draft);
    model_free(g_target);
    return 0;
}

static void same(const out *a, const out *b, const char *what, int i)
{
    if (a->n != b->n || memcmp(a->ids, b->ids, (size_t)a->n * 4) || a->finish != b->finish)
        fail_msg("%s, prompt %d: output differs from the plain CPU engine (%d vs %d tokens)", what, i, a->n, b->n);
}

static void test_alone(void **state)
{
    (void)state;
    static const char *names[] = {"no speculation", "draft model", "prompt lookup"};
    for (int mode = 0; mode <= 2; mode++) {
        tern_engine *e = engine(mode, 1);
        int before = g_fk[0].n_finish, masked = g_fk[0].n_masked, accepted = 0;
        for (int i = 0; i < NP; i++) {
            out o;
            for (int c = 0; c <= 1; c++) {
                drain(submit(e, i, 0, 0, c, 0), &o);
                same(&o, &ref[i][c], names[mode], i);
                accepted += o.u.n_accepted;
                if (mode == 1 && (o.u.n_drafted != ref_draft[i][c].u.n_drafted ||
                                  o.u.n_accepted != ref_draft[i][c].u.n_accepted))
                    fail_msg("prompt %d: %d/%d drafts accepted, the host engine %d/%d", i, o.u.n_accepted,
                             o.u.n_drafted, ref_draft[i][c].u.n_accepted, ref_draft[i][c].u.n_drafted);
            }
            drain(submit(e, i, 0, 0, 0, 1), &o); /* logprobs: the host path */
            same(&o, &ref[i][0], names[mode], i);
        }
        assert_true(g_fk[0].n_finish > before);   /* the device path ran */
        if (mode == 1)
            assert_true(g_fk[1].n_finish > 0);    /* for the drafts too */
        assert_true(g_fk[0].n_masked > masked);   /* with masks */
        if (mode == 1)
            assert_true(accepted > 0);            /* and verified drafts under the constraint */
        engine_free(e);
    }
}

/* Replays the toy constraint over a row's tokens (an independent check of
 * adherence); 1 when every token was allowed where it was emitted. */
static int toy_valid(const out *o)
{
    toy t = {0, 0, g_target->cfg.n_vocab};
    for (int i = 0; i < o->n; i++)
        if (toy_accept(&t, o->ids[i]))
            return 0;
    return 1;
}

static void test_mixed_batch(void **state)
{
    (void)state;
    for (int mode = 0; mode <= 2; mode++) {
        tern_engine *e = engine(mode, 16);
        int logits_before = g_fk[0].n_logits;
        engine_req *r[16];
        for (int i = 0; i < 16; i++) { /* greedy, constrained, sampled, sampled constrained rows */
            int kind = i / NP;
            r[i] = kind >= 2 ? submit(e, i % NP, 0.8f, (kind == 2 ? 77 : 91) + i % NP, kind - 2, 0)
                             : submit(e, i % NP, 0, 0, kind, 0);
        }
        for (int i = 0; i < 16; i++) {
            out o;
            drain(r[i], &o);
            int kind = i / NP;
            if (o.finish == ENGINE_FINISH_ERROR)
                fail_msg("mode %d row %d: finished with an error", mode, i);
            if ((kind == 1 || kind == 3) && !toy_valid(&o))
                fail_msg("mode %d row %d: a token the constraint forbids", mode, i);
            if (kind >= 2 && mode != 0)
                continue; /* sampled rows with speculation draw differently (same distribution) */
            same(&o, &ref[i % NP][kind], "mixed batch", i);
        }
        assert_true(g_fk[0].n_logits > logits_before); /* the host-sampling device path ran */
        engine_free(e);
    }
}

static void test_errors(void **state)
{
    (void)state;
    for (int mode = 0; mode <= 1; mode++) {
        tern_engine *e = engine(mode, 4);
        for (int c = 2; c <= 3; c++) {
            out o;
            drain(submit(e, 0, 0, 0, c, 0), &o);
            assert_int_equal(o.finish, ENGINE_FINISH_ERROR);
            assert_int_equal(o.n, 2); /* two tokens, then no mask / nothing allowed */
        }
        engine_free(e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
