/* The engine's device sampling paths (backend forward_start, then
 * argmax_finish / sample_finish / logits_finish), on the CPU: a stand-in
 * backend computes the forward with the CPU backend and does the masked
 * argmax the device would, and the device sampler through an independent
 * sort-based reference of its contract (tests/sample_ref.h), so the
 * orchestration - masks computed ahead over the drafts and rolled back,
 * verification from ids, which steps go to which finish, one uniform per
 * sampled row from its own stream, errors - is checked against the plain
 * CPU engine token for token: alone and batched, with a draft model, with
 * prompt lookup, with a state-dependent constraint, mixed with sampled
 * rows; logprobs and min_tokens rows through the device sampler against
 * the host engine's tokens and logprobs (alone, batched with other kinds,
 * greedy rows speculating); and the empirical distribution of many seeded
 * device-sampled requests against sample_row's (total variation). */
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
#include "sample_ref.h"
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
    int n_sample, n_drawn;  /* sample_finish calls, rows drawn with temperature > 0 there */
    int n_sample_masked;    /* masked rows seen by sample_finish */
    int n_lp, n_stop;       /* sample_finish rows with logprobs, with a min_tokens stop set */
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
        f->logits = realloc(f->logits, (size_t)f->cap * model_config_get(m)->n_vocab * sizeof(float));
    }
    model_backend_swap(m, f->inner);
    int rc = model_forward(m, kv, bt, f->logits, err);
    model_backend_swap(m, &f->base);
    f->n_out = rc ? -1 : bt->n_out;
    return rc;
}

static int fk_finish(model_backend *b, const uint32_t *masks, int32_t nw, const uint8_t *on, int32_t *ids,
                     tern_err *err)
{
    fake_be *f = (fake_be *)b;
    (void)err;
    assert_true(f->n_out >= 0);
    int32_t V = model_config_get(f->m)->n_vocab;
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

/* The device sampler's contract through the sort-based reference. */
static int fk_sample(model_backend *b, const dev_sample_row *rows, const uint32_t *masks, int32_t nw,
                     const uint8_t *on, int32_t *ids, tern_err *err)
{
    fake_be *f = (fake_be *)b;
    (void)err;
    assert_true(f->n_out >= 0);
    int32_t V = model_config_get(f->m)->n_vocab;
    for (int j = 0; j < f->n_out; j++) {
        const dev_sample_row *d = &rows[j];
        const uint32_t *mk = masks && on && on[j] ? masks + (size_t)j * nw : NULL;
        int32_t bid[64];
        float bval[64];
        assert_true(d->n_bias <= 64);
        for (int k = 0; k < d->n_bias; k++) {
            bid[k] = d->bias[k].id;
            bval[k] = d->bias[k].bias;
        }
        int32_t *pc = d->n_pen > 0 ? malloc((size_t)d->n_pen * sizeof *pc) : NULL;
        assert_true(d->n_pen == 0 || (pc && d->pen_ids && d->count));
        for (int k = 0; k < d->n_pen; k++)
            pc[k] = (int32_t)d->count[d->pen_ids[k]];
        sref_params p = {d->temperature, d->top_p, d->min_p, d->top_k, bid, bval, d->n_bias,
                         d->rep != 1.0f || d->pres != 0.0f || d->freq != 0.0f, d->rep, d->pres, d->freq,
                         d->pen_ids, pc, d->n_pen, d->stop, d->n_stop};
        assert_true(d->u >= 0.0 && d->u < 1.0);
        sref_row r;
        ids[j] = sref_prepare(&r, f->logits + (size_t)j * V, V, &p, mk, 0.0) ? -1 : sref_draw(&r, r.k_nom, d->u);
        if (d->lp) { /* the reference's logprobs, rounded to float as the device reports them */
            double lp, tl[SAMPLE_MAX_LOGPROBS];
            int32_t ti[SAMPLE_MAX_LOGPROBS];
            assert_true(d->n_top >= 0 && d->n_top <= SAMPLE_MAX_LOGPROBS);
            memset(d->lp, 0, sizeof *d->lp);
            d->lp->id = ids[j];
            if (ids[j] >= 0) {
                d->lp->n_top = sref_logprobs(&r, r.k_nom, ids[j], d->n_top, &lp, ti, tl);
                d->lp->logprob = (float)lp;
                for (int k = 0; k < d->lp->n_top; k++) {
                    d->lp->top[k].id = ti[k];
                    d->lp->top[k].logprob = (float)tl[k];
                }
            }
            f->n_lp++;
        }
        f->n_stop += d->n_stop > 0;
        sref_free(&r);
        free(pc);
        f->n_drawn += d->temperature > 0.0f;
        f->n_sample_masked += mk != NULL;
    }
    f->n_out = -1;
    f->n_sample++;
    return 0;
}

static int fk_logits(model_backend *b, float *logits, tern_err *err)
{
    fake_be *f = (fake_be *)b;
    (void)err;
    assert_true(f->n_out >= 0);
    memcpy(logits, f->logits, (size_t)f->n_out * model_config_get(f->m)->n_vocab * sizeof(float));
    f->n_out = -1;
    f->n_logits++;
    return 0;
}

static fake_be g_fk[2];

static void install(tern_model *m, fake_be *f)
{
    memset(f, 0, sizeof *f);
    f->inner = model_backend_get(m);
    f->m = m;
    f->n_out = -1;
    f->base.name = "fake-device";
    f->base.kv_types = f->inner->kv_types; /* the attention is the inner backend's */
    f->base.kv_default = f->inner->kv_default;
    f->base.matmul = fk_matmul;
    f->base.attention = fk_attention;
    f->base.n_threads = fk_threads;
    f->base.free = fk_free;
    f->base.forward_start = fk_start;
    f->base.argmax_finish = fk_finish;
    f->base.logits_finish = fk_logits;
    f->base.sample_finish = fk_sample;
    model_backend_swap(m, &f->base);
}

static void uninstall(tern_model *m, fake_be *f)
{
    model_backend_swap(m, f->inner);
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

/* Submits p with prompt pi as its prompt. */
static engine_req *submit_params(tern_engine *e, int pi, engine_params *p)
{
    int32_t *ids;
    size_t n;
    tern_err err;
    assert_int_equal(tokenizer_encode(g_tok, prompts[pi], strlen(prompts[pi]), 1, &ids, &n, &err), 0);
    p->prompt = ids;
    p->n_prompt = n;
    engine_req *r = engine_submit(e, p, NULL, NULL, &err);
    if (!r)
        fail_msg("%s", err.msg);
    free(ids);
    return r;
}

static engine_req *submit(tern_engine *e, int pi, float temp, uint64_t seed, int constrained, int logprobs)
{
    engine_params p;
    engine_params_default(&p);
    p.max_tokens = 24;
    p.sample.temperature = temp;
    p.sample.seed = seed;
    if (logprobs)
        p.sample.n_logprobs = 2;
    if (constrained) {
        toy *t = calloc(1, sizeof *t);
        t->V = model_config_get(g_target)->n_vocab;
        t->mode = constrained - 1;
        p.constraint = &toy_ops;
        p.constraint_ctx = t;
    }
    return submit_params(e, pi, &p);
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
    toy t = {0, 0, model_config_get(g_target)->n_vocab};
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
        int logits_before = g_fk[0].n_logits, sample_before = g_fk[0].n_sample;
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
            same(&o, &ref[i % NP][kind], "mixed batch", i); /* sampled: the device sampler as sample_row */
        }
        if (mode == 0)
            assert_true(g_fk[0].n_sample > sample_before && g_fk[0].n_sample_masked > 0); /* the device sampler ran */
        else
            assert_true(g_fk[0].n_logits > logits_before); /* sampled rows verifying drafts: the host */
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

/* ---- the device sampler (sample_finish) ---- */

static engine_req *submit_sp(tern_engine *e, int pi, const sample_params *sp, int max_tokens)
{
    engine_params p;
    engine_params_default(&p);
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    p.sample = *sp;
    return submit_params(e, pi, &p);
}

static const sample_bias g_bias[3] = {{300, 6.0f}, {301, -100.0f}, {300, 2.5f}};

/* Request kinds the device samples: temperatures, top-k, top-p, min-p,
 * logit_bias (repeated ids add up), a greedy row with a bias, and
 * repetition / presence / frequency penalties (sampled with a bias, and
 * greedy: the greedy ones are 6 and 9). */
#define NS 10
static void kind_params(int k, sample_params *sp)
{
    sample_params_default(sp);
    sp->seed = 1000 + 17 * (uint64_t)k;
    switch (k) {
    case 0: break; /* the OpenAI default: temperature 1, top_p 1 */
    case 1: sp->temperature = 0.7f, sp->top_p = 0.9f; break;
    case 2: sp->temperature = 1.2f, sp->top_k = 5; break;
    case 3: sp->temperature = 1.5f, sp->min_p = 0.05f; break;
    case 4: sp->temperature = 0.9f, sp->top_k = 40, sp->top_p = 0.8f, sp->min_p = 0.02f; break;
    case 5: sp->temperature = 1.0f, sp->bias = g_bias, sp->n_bias = 3; break;
    case 6: sp->temperature = 0.0f, sp->bias = g_bias, sp->n_bias = 3; break; /* greedy with a bias */
    case 8:
        sp->temperature = 0.8f, sp->top_k = 30, sp->bias = g_bias, sp->n_bias = 2;
        sp->repetition_penalty = 4.0f, sp->presence_penalty = 1.5f, sp->frequency_penalty = 2.0f;
        break;
    case 9: sp->temperature = 0.0f, sp->repetition_penalty = 8.0f, sp->frequency_penalty = 2.0f; break;
    default: sp->temperature = 2.0f, sp->top_p = 0.5f, sp->bias = g_bias, sp->n_bias = 2; break;
    }
}

typedef struct counts {
    int finish, sample, drawn, logits;
} counts;
/* The device sampler's tests run on the small draft model (g_fk[1]), as
 * the engine's target: cheap forwards, the same vocabulary. */
static counts counts_now(void)
{
    counts c = {g_fk[1].n_finish, g_fk[1].n_sample, g_fk[1].n_drawn, g_fk[1].n_logits};
    return c;
}

static tern_engine *small_engine_ex(int batch, int ngram)
{
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = batch;
    o.spec_ngram = ngram;
    o.n_draft = 4;
    tern_err err;
    tern_engine *e = engine_new(g_draft, g_tok, &o, &err);
    if (!e)
        fail_msg("%s", err.msg);
    return e;
}
static tern_engine *small_engine(int batch) { return small_engine_ex(batch, 0); }

/* Every kind alone and all in one batch give the host engine's tokens
 * (TERN_GPU_SAMPLING=0: sample_row over the same logits) for the same seeds;
 * which finish ran is checked by counts: sampleable rows use sample_finish
 * (one draw per sampled row per token), logprobs and penalties rows the
 * host path, TERN_GPU_SAMPLING=0 neither. */
static void test_device_sampler(void **state)
{
    (void)state;
    enum { T = 12 };
    out host[NS], o;
    setenv("TERN_GPU_SAMPLING", "0", 1); /* read by engine_new */
    tern_engine *e = small_engine(NS);
    unsetenv("TERN_GPU_SAMPLING");
    counts c0 = counts_now();
    for (int k = 0; k < NS; k++) {
        sample_params sp;
        kind_params(k, &sp);
        drain(submit_sp(e, k % NP, &sp, T), &host[k]);
        assert_int_equal(host[k].finish, ENGINE_FINISH_LENGTH);
    }
    counts c1 = counts_now();
    assert_memory_equal(&c0, &c1, sizeof c0); /* no device finish at all */
    engine_free(e);

    e = small_engine(NS);
    for (int k = 0; k < NS; k++) { /* alone */
        sample_params sp;
        kind_params(k, &sp);
        c0 = counts_now();
        drain(submit_sp(e, k % NP, &sp, T), &o);
        c1 = counts_now();
        same(&o, &host[k], "device sampler, alone", k);
        if (c1.sample - c0.sample != T || c1.logits != c0.logits || c1.finish != c0.finish)
            fail_msg("kind %d: %d sample_finish, %d logits_finish, %d argmax_finish calls for %d tokens", k,
                     c1.sample - c0.sample, c1.logits - c0.logits, c1.finish - c0.finish, T);
        assert_int_equal(c1.drawn - c0.drawn, sp.temperature > 0 ? T : 0);
    }
    engine_req *r[NS];
    c0 = counts_now();
    for (int k = 0; k < NS; k++) { /* batched */
        sample_params sp;
        kind_params(k, &sp);
        r[k] = submit_sp(e, k % NP, &sp, T);
    }
    for (int k = 0; k < NS; k++) {
        drain(r[k], &o);
        same(&o, &host[k], "device sampler, batched", k);
    }
    c1 = counts_now();
    assert_true(c1.sample > c0.sample && c1.sample - c0.sample < NS * T); /* shared steps */
    assert_int_equal(c1.drawn - c0.drawn, (NS - 2) * T);                  /* one draw per sampled row and token */
    assert_int_equal(c1.logits, c0.logits);

    /* logprobs: the device samples them too (test_device_logprobs checks the values) */
    {
        sample_params sp;
        kind_params(1, &sp);
        sp.n_logprobs = 2;
        c0 = counts_now();
        drain(submit_sp(e, 1, &sp, T), &o);
        c1 = counts_now();
        assert_int_equal(o.finish, ENGINE_FINISH_LENGTH);
        assert_int_equal(c1.sample - c0.sample, T);
        assert_int_equal(c1.logits, c0.logits);
        same(&o, &host[1], "logprobs row on the device", 1);
    }
    engine_free(e);

    /* a greedy row with a bias that speculates (prompt lookup): its K + 1
     * positions go to sample_finish and verify from the ids; tokens as on
     * the host */
    sample_params sp;
    kind_params(6, &sp);
    out ho;
    setenv("TERN_GPU_SAMPLING", "0", 1);
    e = small_engine_ex(1, 1);
    unsetenv("TERN_GPU_SAMPLING");
    drain(submit_sp(e, 0, &sp, 24), &ho);
    engine_free(e);
    e = small_engine_ex(1, 1);
    c0 = counts_now();
    drain(submit_sp(e, 0, &sp, 24), &o);
    c1 = counts_now();
    engine_free(e);
    same(&o, &ho, "speculating greedy row with a bias", 0);
    printf("speculating greedy row with a bias: %d drafted, %d accepted, %d sample_finish calls\n", o.u.n_drafted,
           o.u.n_accepted, c1.sample - c0.sample);
    assert_true(o.u.n_drafted > 0);
    assert_true(c1.sample > c0.sample && c1.logits == c0.logits && c1.finish == c0.finish);
}

/* ---- logprobs and min_tokens on the device ---- */

typedef struct lp_out {
    out o;
    sample_result lp[128]; /* each token's, when it came with logprobs */
    int n_lp;
} lp_out;

static void drain_lp(engine_req *r, lp_out *o)
{
    engine_event ev;
    memset(o, 0, sizeof *o);
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_TOKEN) {
            if (o->o.n < 128) {
                if (ev.has_logprob)
                    o->lp[o->n_lp++] = ev.lp;
                o->o.ids[o->o.n++] = ev.token;
            }
        } else {
            o->o.finish = ev.finish;
            o->o.u = ev.usage;
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
}

/* A device row (a: the reference's logprobs through the fake backend)
 * against the host engine's (b: sample_row's): the same tokens, each with
 * logprobs when asked, the same top ids, values within 1e-5 (relative
 * above 1). */
static void lp_same(const lp_out *a, const lp_out *b, int want_lp, const char *what, int k)
{
    same(&a->o, &b->o, what, k);
    if (a->n_lp != (want_lp ? a->o.n : 0) || b->n_lp != a->n_lp)
        fail_msg("%s %d: %d and %d tokens with logprobs of %d", what, k, a->n_lp, b->n_lp, a->o.n);
    for (int i = 0; i < a->n_lp; i++) {
        const sample_result *x = &a->lp[i], *y = &b->lp[i];
        int bad = x->id != a->o.ids[i] || x->n_top != y->n_top ||
                  !(fabsf(x->logprob - y->logprob) <= 1e-5f * (1 + fabsf(y->logprob)));
        for (int j = 0; !bad && j < x->n_top; j++)
            bad = x->top[j].id != y->top[j].id ||
                  !(fabsf(x->top[j].logprob - y->top[j].logprob) <= 1e-5f * (1 + fabsf(y->top[j].logprob)));
        if (bad)
            fail_msg("%s %d, token %d (id %d): device logprob %.7g with %d top (first %d %.7g), host %.7g with %d "
                     "top (first %d %.7g)",
                     what, k, i, a->o.ids[i], x->logprob, x->n_top, x->n_top ? x->top[0].id : -1,
                     x->n_top ? x->top[0].logprob : 0.0f, y->logprob, y->n_top, y->n_top ? y->top[0].id : -1,
                     y->n_top ? y->top[0].logprob : 0.0f);
    }
}

/* The rows of test_device_logprobs: logprobs over greedy, untruncated,
 * truncated, penalized and biased rows (0-20 alternatives), rows without
 * them in the same batch, and min_tokens rows whose stop id is the argmax
 * (a +100 bias): EOS for a greedy row (with and without logprobs), a
 * stop_token_ids entry for a sampled one. */
#define NL 10
static sample_bias g_eos_bias[1], g_sid_bias[1]; /* set by lp_kind */
static int32_t g_stop_id[1];
static void lp_kind(int k, engine_params *p)
{
    engine_params_default(p);
    p->max_tokens = 12;
    p->ignore_eos = 1;
    sample_params *sp = &p->sample;
    int eos = model_config_get(g_draft)->eos_ids[0];
    g_eos_bias[0].id = eos, g_eos_bias[0].bias = 100.0f;
    g_stop_id[0] = 321;
    g_sid_bias[0].id = g_stop_id[0], g_sid_bias[0].bias = 100.0f;
    switch (k) {
    case 0: sample_params_default(sp), sp->temperature = 0, sp->n_logprobs = 3; break;
    case 1: kind_params(0, sp), sp->n_logprobs = 5; break;  /* untruncated: the top over every token */
    case 2: kind_params(4, sp), sp->n_logprobs = 20; break; /* top-k + top-p + min-p */
    case 3: kind_params(8, sp), sp->n_logprobs = 0; break;  /* penalties, bias, top-k; no alternatives */
    case 4: kind_params(6, sp), sp->n_logprobs = 20; break; /* greedy with a bias */
    case 5: kind_params(1, sp); break;                      /* no logprobs */
    case 6: sample_params_default(sp), sp->temperature = 0; break; /* plain greedy */
    case 7: /* greedy, EOS the argmax: masked for 5 tokens, then it ends the row */
        sample_params_default(sp), sp->temperature = 0, sp->bias = g_eos_bias, sp->n_bias = 1;
        p->ignore_eos = 0, p->min_tokens = 5;
        break;
    case 8: /* the same with logprobs */
        sample_params_default(sp), sp->temperature = 0, sp->bias = g_eos_bias, sp->n_bias = 1, sp->n_logprobs = 4;
        p->ignore_eos = 0, p->min_tokens = 5;
        break;
    default: /* sampled, a stop id the argmax: masked for 4 tokens */
        kind_params(1, sp), sp->bias = g_sid_bias, sp->n_bias = 1, sp->n_logprobs = 2;
        p->stop_ids = g_stop_id, p->n_stop_ids = 1, p->min_tokens = 4;
        break;
    }
    sp->seed = 4000 + (uint64_t)k;
}

static engine_req *lp_submit(tern_engine *e, int k)
{
    engine_params p;
    lp_kind(k, &p);
    return submit_params(e, k % NP, &p);
}

static void test_device_logprobs(void **state)
{
    (void)state;
    lp_out host[NL], o;
    assert_true(model_config_get(g_draft)->n_eos > 0);
    setenv("TERN_GPU_SAMPLING", "0", 1);
    tern_engine *e = small_engine(NL);
    unsetenv("TERN_GPU_SAMPLING");
    for (int k = 0; k < NL; k++)
        drain_lp(lp_submit(e, k), &host[k]);
    engine_free(e);
    /* the min_tokens rows: their stop id after exactly min_tokens tokens */
    for (int k = 7; k < NL; k++) {
        engine_params p;
        lp_kind(k, &p);
        int32_t stop = k == 9 ? g_stop_id[0] : model_config_get(g_draft)->eos_ids[0];
        if (host[k].o.n != p.min_tokens + 1 || host[k].o.ids[p.min_tokens] != stop ||
            host[k].o.finish != ENGINE_FINISH_STOP)
            fail_msg("host min_tokens row %d: %d tokens, last %d, finish %d", k, host[k].o.n,
                     host[k].o.ids[host[k].o.n - 1], host[k].o.finish);
    }
    e = small_engine(NL);
    int lp0 = g_fk[1].n_lp, st0 = g_fk[1].n_stop;
    for (int k = 0; k < NL; k++) { /* alone */
        engine_params p;
        lp_kind(k, &p);
        counts c0 = counts_now();
        drain_lp(lp_submit(e, k), &o);
        counts c1 = counts_now();
        lp_same(&o, &host[k], p.sample.n_logprobs >= 0, "device logprobs / min_tokens, alone", k);
        if (c1.logits != c0.logits)
            fail_msg("row kind %d: %d logits_finish calls (the host path)", k, c1.logits - c0.logits);
    }
    assert_true(g_fk[1].n_lp > lp0 && g_fk[1].n_stop > st0);
    engine_req *r[NL];
    counts c0 = counts_now();
    for (int k = 0; k < NL; k++) /* batched */
        r[k] = lp_submit(e, k);
    for (int k = 0; k < NL; k++) {
        engine_params p;
        lp_kind(k, &p);
        drain_lp(r[k], &o);
        lp_same(&o, &host[k], p.sample.n_logprobs >= 0, "device logprobs / min_tokens, batched", k);
    }
    counts c1 = counts_now();
    assert_int_equal(c1.logits, c0.logits);
    assert_true(c1.sample > c0.sample);
    engine_free(e);

    /* a greedy row with logprobs that speculates (prompt lookup): every
     * verified position's logprobs from the device */
    lp_out ho;
    setenv("TERN_GPU_SAMPLING", "0", 1);
    e = small_engine_ex(1, 1);
    unsetenv("TERN_GPU_SAMPLING");
    engine_params p;
    lp_kind(4, &p);
    p.max_tokens = 24;
    drain_lp(submit_params(e, 0, &p), &ho);
    engine_free(e);
    e = small_engine_ex(1, 1);
    lp_kind(4, &p);
    p.max_tokens = 24;
    c0 = counts_now();
    drain_lp(submit_params(e, 0, &p), &o);
    c1 = counts_now();
    engine_free(e);
    lp_same(&o, &ho, 1, "speculating greedy row with logprobs", 0);
    printf("speculating greedy row with logprobs: %d drafted, %d accepted, %d sample_finish calls\n", o.o.u.n_drafted,
           o.o.u.n_accepted, c1.sample - c0.sample);
    assert_true(o.o.u.n_drafted > 0);
    assert_true(c1.sample > c0.sample && c1.logits == c0.logits);
}

/* Sanitizer builds run the statistical check as a smoke test (few draws). */
#if defined(__SANITIZE_ADDRESS__)
#define TERN_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TERN_TEST_SANITIZED 1
#endif
#endif
#ifdef TERN_TEST_SANITIZED
#define DIST_DRAWS 64
#else
#define DIST_DRAWS 512
#endif

/* The first token of many seeded requests sampled on the device against
 * sample_row's distribution on the same logits (sample_dist): no token
 * outside its kept set, and the total variation over buckets (its 6 most
 * likely tokens, the rest together) within a few times its expected size. */
static void test_device_distribution(void **state)
{
    (void)state;
    enum { N = DIST_DRAWS, NB = 7 };
    tern_model *m = g_draft;
    int32_t V = model_config_get(m)->n_vocab;
    const int pi = 2;
    /* the prompt's next-token logits on the CPU */
    int32_t *toks;
    size_t n;
    tern_err err;
    assert_int_equal(tokenizer_encode(g_tok, prompts[pi], strlen(prompts[pi]), 1, &toks, &n, &err), 0);
    kv_pool kv;
    kv_seq sq = {0};
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, (int)n / 16 + 2, &err),
                     0);
    assert_int_equal(kv_seq_reserve(&kv, &sq, (int)n, &err), 0);
    int32_t *pos = malloc(n * sizeof *pos), last = (int32_t)n - 1;
    kv_seq **seqs = malloc(n * sizeof *seqs);
    for (size_t i = 0; i < n; i++) {
        pos[i] = (int32_t)i;
        seqs[i] = &sq;
    }
    float *lg = malloc((size_t)V * sizeof *lg), *x = malloc((size_t)V * sizeof *x), *p = malloc((size_t)V * sizeof *p);
    int *bucket = malloc((size_t)V * sizeof *bucket);
    fwd_batch b = {(int)n, toks, pos, seqs, 1, &last};
    assert_int_equal(model_forward(m, &kv, &b, lg, &err), 0);
    kv_seq_free(&kv, &sq);
    kv_pool_free(&kv);
    static const int kinds[] = {3, 4}; /* min-p (hundreds of tokens kept), top-k + top-p + min-p */
    for (int ki = 0; ki < 2; ki++) {
        int k = kinds[ki];
        sample_params sp;
        kind_params(k, &sp);
        sample_state ss;
        assert_int_equal(sample_state_init(&ss, &sp, V, NULL, 0, &err), 0);
        memcpy(x, lg, (size_t)V * sizeof *x);
        assert_int_equal(sample_dist(&ss, &sp, x, NULL, p), 0);
        sample_state_free(&ss);
        /* buckets: the NB - 1 most likely tokens, then the rest of the kept set */
        double pb[NB] = {0}, hb[NB] = {0};
        int support = 0;
        for (int32_t t = 0; t < V; t++) {
            bucket[t] = NB - 1;
            support += p[t] > 0;
        }
        for (int r = 0; r < NB - 1; r++) {
            int32_t best = -1;
            for (int32_t t = 0; t < V; t++)
                if (bucket[t] == NB - 1 && p[t] > 0 && (best < 0 || p[t] > p[best]))
                    best = t;
            if (best >= 0)
                bucket[best] = r;
        }
        for (int32_t t = 0; t < V; t++)
            pb[bucket[t]] += p[t];
        tern_engine *e = small_engine(64);
        engine_req *r[64];
        counts c0 = counts_now();
        for (int i = 0; i < N; i += 64) {
            for (int j = 0; j < 64; j++) {
                sp.seed = 5000 + (uint64_t)(i + j);
                r[j] = submit_sp(e, pi, &sp, 1);
            }
            for (int j = 0; j < 64; j++) {
                out o;
                drain(r[j], &o);
                assert_int_equal(o.n, 1);
                if (p[o.ids[0]] == 0)
                    fail_msg("kind %d: token %d drawn, outside sample_row's kept set", k, o.ids[0]);
                hb[bucket[o.ids[0]]] += 1.0 / N;
            }
        }
        counts c1 = counts_now();
        assert_int_equal(c1.drawn - c0.drawn, N);
        assert_int_equal(c1.logits, c0.logits);
        engine_free(e);
        double tv = 0, expect = 0;
        for (int q = 0; q < NB; q++) {
            tv += fabs(hb[q] - pb[q]) / 2;
            expect += sqrt(pb[q] * (1 - pb[q]) / N) * 0.3989; /* E|binomial deviation| / 2 */
        }
        printf("kind %d: %d tokens kept, bucket probabilities %.3f %.3f %.3f .. rest %.3f, total variation %.4f "
               "(expected about %.4f)\n",
               k, support, pb[0], pb[1], pb[2], pb[NB - 1], tv, expect);
        if (tv > 3 * expect + 0.01)
            fail_msg("kind %d: total variation %.4f from sample_row's distribution (bound %.4f)", k, tv,
                     3 * expect + 0.01);
    }
    free(bucket);
    free(lg);
    free(x);
    free(p);
    free(pos);
    free(seqs);
    free(toks);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_device_sampler),
        cmocka_unit_test(test_device_logprobs),
        cmocka_unit_test(test_device_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
