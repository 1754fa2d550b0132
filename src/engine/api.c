/* The embeddable API of include/tern.h: a thin layer over model, tokenizer
 * and engine. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tern.h"

_Static_assert(sizeof(tern_error) == sizeof(tern_err), "tern_error mirrors tern_err");

struct tern_ctx {
    tern_model *m;
    tern_tokenizer *tok;
    tern_engine *e;
};

tern_ctx *tern_open(const char *model_dir, const tern_open_opts *opts, tern_error *err)
{
    tern_err *e = (tern_err *)err;
    if (!model_dir) {
        tern_err_set(e, TERN_EINVAL, "tern_open: no model folder");
        return NULL;
    }
    tern_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        tern_err_set(e, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    engine_opts eo;
    engine_opts_default(&eo);
    eo.max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 16;
    if (opts && opts->kv_budget_gb > 0)
        eo.kv_budget_bytes = (size_t)(opts->kv_budget_gb * 1e9);
    if (!(t->m = model_load(model_dir, opts ? opts->n_threads : 0, e)) || !(t->tok = tokenizer_load(model_dir, e)) ||
        !(t->e = engine_new(t->m, t->tok, &eo, e))) {
        tern_close(t);
        return NULL;
    }
    return t;
}

void tern_close(tern_ctx *t)
{
    if (!t)
        return;
    engine_free(t->e);
    tokenizer_free(t->tok);
    model_free(t->m);
    free(t);
}

int tern_tokenize(tern_ctx *t, const char *text, int add_special, int32_t **ids, size_t *n_ids, tern_error *err)
{
    if (!t || !text || !ids || !n_ids)
        return tern_err_set((tern_err *)err, TERN_EINVAL, "tern_tokenize: NULL argument");
    return tokenizer_encode(t->tok, text, strlen(text), add_special, ids, n_ids, (tern_err *)err);
}

int tern_detokenize(tern_ctx *t, const int32_t *ids, size_t n_ids, char **text, tern_error *err)
{
    if (!t || !text || (!ids && n_ids))
        return tern_err_set((tern_err *)err, TERN_EINVAL, "tern_detokenize: NULL argument");
    return tokenizer_decode(t->tok, ids, n_ids, 1, text, NULL, (tern_err *)err);
}

void tern_gen_opts_init(tern_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->temperature = 0.8f;
    o->top_p = 1.0f;
}

int tern_generate(tern_ctx *t, const char *prompt, const tern_gen_opts *o, tern_token_cb cb, void *user,
                  int *n_generated, tern_error *err)
{
    tern_err *e = (tern_err *)err;
    if (!t || !prompt)
        return tern_err_set(e, TERN_EINVAL, "tern_generate: no context or prompt");
    tern_gen_opts def;
    if (!o) {
        tern_gen_opts_init(&def);
        o = &def;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(t->tok, prompt, strlen(prompt), 1, &ids, &n, e);
    if (rc)
        return rc;
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = o->max_tokens;
    p.sample.temperature = o->temperature;
    p.sample.top_p = o->top_p;
    p.sample.top_k = o->top_k;
    p.sample.seed = o->seed;
    int n_stop = 0;
    while (o->stop && o->stop[n_stop])
        n_stop++;
    p.stop = o->stop;
    p.n_stop = n_stop;
    engine_req *r = engine_submit(t->e, &p, NULL, NULL, e);
    free(ids);
    if (!r)
        return e ? e->code : TERN_EINVAL;
    engine_event ev;
    int gen = 0, stopped = 0;
    rc = 0;
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_TOKEN) {
            /* the engine runs ahead of the reader: tokens after a stop are dropped */
            if (!stopped) {
                gen++;
                if (cb && cb(user, ev.token, ev.text ? ev.text : "", ev.text_len)) {
                    stopped = 1;
                    engine_req_cancel(r);
                }
            }
        } else {
            /* text released at the end belongs to the last token */
            if (ev.text_len && cb && !stopped)
                cb(user, -1, ev.text, ev.text_len);
            if (ev.finish == ENGINE_FINISH_ERROR)
                rc = tern_err_set(e, TERN_EINTERNAL, "%s", ev.error);
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
    if (n_generated)
        *n_generated = gen;
    return rc;
}
