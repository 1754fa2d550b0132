/* tern bench through the engine: one cell is a fresh engine with the cell's
 * speculation and prefix cache, kept busy by `concurrency` streams (a new
 * request is submitted the moment one finishes) until the cell's requests
 * have all run. One collector thread drains every request's events as the
 * engine's notify callback wakes it, stamping each token as a client would
 * see it. Grammar rows run under a wrapper of their constraint that times
 * every mask, accept and rollback, so the grammar's own cost is measured
 * inside the real batched run. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/strbuf.h"
#include "bench.h"
#include "engine/constraint.h"

/* ---- prompts ---- */

int bench_local_prompts(bench_local *b, const char *model_dir, tern_err *err)
{
    tern_chat_template ct;
    int have_tpl = tern_chat_template_load(model_dir, &ct, err) == 0;
    int n = bench_n_messages(), rc = 0;
    b->prompts = calloc((size_t)n, sizeof *b->prompts);
    b->n_prompt = calloc((size_t)n, sizeof *b->n_prompt);
    if (!b->prompts || !b->n_prompt) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    b->n_prompts = n;
    for (int i = 0; i < n && !rc; i++) {
        char *text = NULL;
        size_t len = 0;
        if (have_tpl) {
            json_object *rq = json_object_new_object(), *msgs = json_object_new_array();
            json_object *sys = json_object_new_object(), *usr = json_object_new_object();
            json_object_object_add(sys, "role", json_object_new_string("system"));
            json_object_object_add(sys, "content", json_object_new_string(bench_system_prompt()));
            json_object_object_add(usr, "role", json_object_new_string("user"));
            json_object_object_add(usr, "content", json_object_new_string(bench_message(i)));
            json_object_array_add(msgs, sys);
            json_object_array_add(msgs, usr);
            json_object_object_add(rq, "messages", msgs);
            json_object_object_add(rq, "add_generation_prompt", json_object_new_boolean(1));
            text = tern_chat_template_apply(&ct, rq, NULL, &len, err);
            json_object_put(rq);
        } else { /* a base model: plain text, as /v1/completions would send it */
            tern_sbuf sb = {0};
            tern_sbuf_str(&sb, bench_system_prompt());
            tern_sbuf_str(&sb, "\n\nQuestion: ");
            tern_sbuf_str(&sb, bench_message(i));
            tern_sbuf_str(&sb, "\nAnswer:");
            text = sb.oom ? (free(sb.s), NULL) : sb.s;
            len = sb.n;
            if (!text)
                tern_err_set(err, TERN_ENOMEM, "out of memory");
        }
        if (!text) {
            rc = err->code ? err->code : TERN_EINVAL;
            break;
        }
        rc = tokenizer_encode(b->tok, text, len, !have_tpl, &b->prompts[i], &b->n_prompt[i], err);
        free(text);
    }
out:
    if (have_tpl)
        tern_chat_template_free(&ct);
    return rc;
}

void bench_local_free(bench_local *b)
{
    for (int i = 0; i < b->n_prompts; i++)
        free(b->prompts[i]);
    free(b->prompts);
    free(b->n_prompt);
    b->prompts = NULL;
    b->n_prompt = NULL;
    b->n_prompts = 0;
}

/* ---- the timing wrapper around a row's constraint ---- */

typedef struct timed_constraint {
    const engine_constraint_ops *ops;
    void *ctx;
    _Atomic long long *ns; /* the cell's total, added to on every call */
} timed_constraint;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int timed_fill(void *c, uint32_t *mask, int32_t n_words)
{
    timed_constraint *t = c;
    long long t0 = now_ns();
    int rc = t->ops->fill_mask(t->ctx, mask, n_words);
    atomic_fetch_add(t->ns, now_ns() - t0);
    return rc;
}

static int timed_accept(void *c, int32_t token)
{
    timed_constraint *t = c;
    long long t0 = now_ns();
    int rc = t->ops->accept(t->ctx, token);
    atomic_fetch_add(t->ns, now_ns() - t0);
    return rc;
}

static int timed_terminated(void *c)
{
    timed_constraint *t = c;
    return t->ops->is_terminated(t->ctx);
}

static int timed_rollback(void *c, int n)
{
    timed_constraint *t = c;
    long long t0 = now_ns();
    int rc = t->ops->rollback(t->ctx, n);
    atomic_fetch_add(t->ns, now_ns() - t0);
    return rc;
}

static void timed_free(void *c)
{
    timed_constraint *t = c;
    t->ops->free(t->ctx);
    free(t);
}

/* jump_forward stays NULL: the bench leaves grammar jump-forward off. */
static const engine_constraint_ops TIMED_OPS = {timed_fill, timed_accept, timed_terminated, timed_rollback, timed_free,
                                                NULL};

typedef struct cache_hold {
    grammar_cache *cache;
    grammar_cache_ref *ref;
} cache_hold;

static void cache_hold_release(void *user)
{
    cache_hold *h = user;
    grammar_cache_release(h->cache, h->ref);
    free(h);
}

/* A timed constraint for one row of feature f; *ops and *ctx as
 * in constraint_grammar_new. */
static int constraint_make(bench_local *b, bench_feature f, _Atomic long long *ns, const engine_constraint_ops **ops,
                           void **ctx, tern_err *err)
{
    int hit;
    double ms;
    const char *key = bench_feature_name(f);
    grammar_cache_ref *ref =
        grammar_cache_get(b->gcache, key, strlen(key), bench_feature_ebnf, (void *)(intptr_t)f, &hit, &ms, err);
    if (!ref)
        return err->code;
    cache_hold *h = malloc(sizeof *h);
    timed_constraint *t = malloc(sizeof *t);
    if (!h || !t) {
        free(h), free(t);
        grammar_cache_release(b->gcache, ref);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    h->cache = b->gcache;
    h->ref = ref;
    int rc = constraint_grammar_new(grammar_cache_ref_compiled(ref), NULL, model_config_get(b->model)->n_vocab,
                                    cache_hold_release, h, &t->ops, &t->ctx, err);
    if (rc) {
        free(t);
        cache_hold_release(h);
        return rc;
    }
    t->ns = ns;
    *ops = &TIMED_OPS;
    *ctx = t;
    return 0;
}

/* ---- the run ---- */

typedef struct waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
} waker;

/* Called by the engine thread with the request's lock held: only flags. */
static void waker_notify(void *user)
{
    waker *w = user;
    pthread_mutex_lock(&w->mu);
    w->pending = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void waker_wait(waker *w, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&w->mu);
    while (!w->pending)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts))
            break;
    w->pending = 0;
    pthread_mutex_unlock(&w->mu);
}

typedef struct stream {
    engine_req *req;
    double t_submit, t_first, t_last;
    int n_events;
    tern_sbuf text;
} stream;

typedef struct cell_run {
    bench_local *b;
    bench_cell *cell;
    tern_engine *eng;
    waker w;
    int max_tokens;
    _Atomic long long grammar_ns;
    long long grammar_tokens;
    double *ttft, *itl;
    int n_ttft, n_itl;
} cell_run;

static void fail(cell_run *cr, const char *why)
{
    cr->cell->r.n_failed++;
    if (!cr->cell->r.error[0])
        snprintf(cr->cell->r.error, sizeof cr->cell->r.error, "%.200s", why);
}

/* Submits request number idx into s; on failure counts it as failed and
 * leaves s->req NULL. */
static void stream_submit(cell_run *cr, stream *s, int idx)
{
    bench_local *b = cr->b;
    tern_err err = {0};
    engine_params p;
    engine_params_default(&p);
    int k = idx % b->n_prompts;
    p.prompt = b->prompts[k];
    p.n_prompt = b->n_prompt[k];
    p.max_tokens = cr->max_tokens;
    p.sample.temperature = 0;
    p.ignore_eos = cr->cell->feature == BENCH_PLAIN; /* plain rows decode the full budget */
    memset(s, 0, sizeof *s);
    cr->cell->r.n_requests++;
    if (cr->cell->feature != BENCH_PLAIN &&
        constraint_make(b, cr->cell->feature, &cr->grammar_ns, &p.constraint, &p.constraint_ctx, &err)) {
        fail(cr, err.msg);
        return;
    }
    s->t_submit = tern_time_s();
    s->req = engine_submit(cr->eng, &p, waker_notify, &cr->w, &err);
    if (!s->req) {
        if (p.constraint)
            p.constraint->free(p.constraint_ctx);
        fail(cr, err.msg);
    }
}

/* Handles one event; returns 1 when the request finished. */
static int stream_event(cell_run *cr, stream *s, engine_event *ev)
{
    double t = tern_time_s();
    tern_sbuf_put(&s->text, ev->text ? ev->text : "", ev->text_len);
    if (ev->kind == ENGINE_EV_TOKEN) {
        if (!s->n_events++)
            s->t_first = t;
        s->t_last = t;
        return 0;
    }
    bench_result *r = &cr->cell->r;
    const engine_usage *u = &ev->usage;
    r->n_prompt += u->n_prompt;
    r->n_cached += u->n_cached;
    r->n_drafted += u->n_drafted;
    r->n_accepted += u->n_accepted;
    char why[256];
    if (ev->finish == ENGINE_FINISH_ERROR || ev->finish == ENGINE_FINISH_CANCELLED) {
        snprintf(why, sizeof why, "request %s: %.200s", engine_finish_name(ev->finish), ev->error);
        fail(cr, why);
    } else if (s->text.oom) {
        fail(cr, "out of memory");
    } else if (s->n_events == 0) {
        fail(cr, "no token generated");
    } else if (bench_output_check(cr->cell->feature, s->text.s ? s->text.s : "", s->text.n, why, sizeof why)) {
        r->n_invalid++;
        fail(cr, why);
    } else {
        r->n_tokens += u->n_generated;
        if (cr->cell->feature != BENCH_PLAIN)
            cr->grammar_tokens += u->n_generated;
        cr->ttft[cr->n_ttft++] = s->t_first - s->t_submit;
        if (s->n_events > 1)
            cr->itl[cr->n_itl++] = (s->t_last - s->t_first) / (s->n_events - 1);
    }
    return 1;
}

/* The longest token prefix every prompt shares: the system prompt's part. */
static size_t common_prefix(const bench_local *b)
{
    size_t n = b->n_prompt[0];
    for (int i = 1; i < b->n_prompts; i++) {
        size_t k = 0;
        while (k < n && k < b->n_prompt[i] && b->prompts[i][k] == b->prompts[0][k])
            k++;
        n = k;
    }
    return n;
}

/* Runs the shared prefix once so the cache holds it before the clock starts. */
static int prime_cache(cell_run *cr, tern_err *err)
{
    engine_params p;
    engine_params_default(&p);
    p.prompt = cr->b->prompts[0];
    p.n_prompt = common_prefix(cr->b);
    if (p.n_prompt < 1)
        p.n_prompt = cr->b->n_prompt[0];
    p.max_tokens = 1;
    p.sample.temperature = 0;
    p.no_speculation = 1;
    engine_req *r = engine_submit(cr->eng, &p, NULL, NULL, err);
    if (!r)
        return err->code;
    engine_event ev;
    while (engine_req_next(r, &ev, -1)) {
        int fin = ev.kind == ENGINE_EV_FINISH;
        engine_event_clear(&ev);
        if (fin)
            break;
    }
    engine_req_release(r);
    return 0;
}

int bench_local_run(bench_local *b, bench_cell *cell, const bench_load *load, tern_err *err)
{
    bench_result *r = &cell->r;
    memset(r, 0, sizeof *r);
    r->grammar_us_per_token = -1;
    cell_run cr = {.b = b, .cell = cell};
    cr.max_tokens = load->max_tokens;
    if (cell->feature != BENCH_PLAIN && cr.max_tokens < 64)
        cr.max_tokens = 64; /* the grammar ends these rows; the bound only guards a runaway */
    atomic_init(&cr.grammar_ns, 0);
    pthread_mutex_init(&cr.w.mu, NULL);
    pthread_cond_init(&cr.w.cv, NULL);
    int n = load->n_requests, conc = cell->concurrency, rc = 0;
    stream *st = calloc((size_t)conc, sizeof *st);
    cr.ttft = calloc((size_t)n, sizeof *cr.ttft);
    cr.itl = calloc((size_t)n, sizeof *cr.itl);
    if (!st || !cr.ttft || !cr.itl) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = conc;
    o.prefix_cache = cell->warm;
    o.draft = cell->spec == BENCH_SPEC_DRAFT ? b->draft : NULL;
    o.spec_ngram = cell->spec == BENCH_SPEC_NGRAM;
    o.n_draft = b->n_draft;
    if (strcmp(cell->kv_type, "default")) {
        if ((rc = kv_type_parse(cell->kv_type, &o.kv.type, err)))
            goto out;
        o.kv_type_given = 1;
    }
    if (!(cr.eng = engine_new(b->model, b->tok, &o, err))) {
        rc = err->code;
        goto out;
    }
    if (cell->warm && (rc = prime_cache(&cr, err)))
        goto out;
    double t0 = tern_time_s(), t_end = t0, kv_per_block = 0;
    int submitted = 0, finished = 0;
    for (int s = 0; s < conc && submitted < n; s++) {
        stream_submit(&cr, &st[s], submitted++);
        if (!st[s].req)
            finished++;
    }
    while (finished < n) {
        waker_wait(&cr.w, 20);
        engine_stats es;
        engine_stats_get(cr.eng, &es);
        if (es.kv_blocks_total > 0)
            kv_per_block = (double)es.kv_bytes_total / es.kv_blocks_total;
        double kv = kv_per_block * es.kv_blocks_used / (1024.0 * 1024.0), rss = bench_rss_mb();
        if (kv > r->kv_peak_mb)
            r->kv_peak_mb = kv;
        if (rss > r->rss_peak_mb)
            r->rss_peak_mb = rss;
        for (int s = 0; s < conc; s++) {
            engine_event ev;
            while (st[s].req && engine_req_next(st[s].req, &ev, 0) == 1) {
                int fin = stream_event(&cr, &st[s], &ev);
                engine_event_clear(&ev);
                if (!fin)
                    continue;
                t_end = tern_time_s();
                engine_req_release(st[s].req);
                free(st[s].text.s);
                st[s].text = (tern_sbuf){0};
                st[s].req = NULL;
                finished++;
                while (submitted < n && !st[s].req) { /* keep the stream busy */
                    stream_submit(&cr, &st[s], submitted++);
                    if (!st[s].req)
                        finished++;
                }
            }
        }
    }
    r->wall_s = t_end - t0;
    r->tok_s = r->wall_s > 0 ? r->n_tokens / r->wall_s : 0;
    r->ttft_p50 = bench_quantile(cr.ttft, cr.n_ttft, 0.5);
    r->ttft_p99 = bench_quantile(cr.ttft, cr.n_ttft, 0.99);
    r->itl_p50 = bench_quantile(cr.itl, cr.n_itl, 0.5);
    r->itl_p99 = bench_quantile(cr.itl, cr.n_itl, 0.99);
out:
    engine_free(cr.eng); /* frees every row's constraint: grammar_ns is final after this */
    if (cr.grammar_tokens > 0)
        r->grammar_us_per_token = atomic_load(&cr.grammar_ns) / 1e3 / (double)cr.grammar_tokens;
    if (rc) { /* the cell could not run: every request it was to run failed */
        snprintf(r->error, sizeof r->error, "%.200s", err->msg);
        r->n_requests = r->n_failed = n;
    }
    if (st)
        for (int s = 0; s < conc; s++)
            free(st[s].text.s);
    free(st);
    free(cr.ttft);
    free(cr.itl);
    pthread_cond_destroy(&cr.w.cv);
    pthread_mutex_destroy(&cr.w.mu);
    cell->done = 1;
    return rc;
}
