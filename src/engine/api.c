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
    embed_config ec;   /* the folder's sentence-transformers config, when ec_rc is 0 */
    int ec_rc;         /* embed_config_load's result (TERN_ENOTFOUND: a plain model) */
    tern_err ec_err;
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
    /* a setting tern cannot honour fails tern_embed, not generation */
    t->ec_rc = embed_config_load(model_dir, model_hidden_dim(t->m), &t->ec, &t->ec_err);
    return t;
}

void tern_close(tern_ctx *t)
{
    if (!t)
        return;
    engine_free(t->e);
    embed_config_free(&t->ec);
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

int tern_embed(tern_ctx *t, const char *text, float *out, int cap, int *dim, tern_error *err)
{
    tern_err *e = (tern_err *)err;
    if (!t || !text || !out)
        return tern_err_set(e, TERN_EINVAL, "tern_embed: NULL argument");
    if (!text[0])
        return tern_err_set(e, TERN_EINVAL, "tern_embed: empty text");
    if (t->ec_rc == TERN_ENOTFOUND)
        return tern_err_set(e, TERN_EUNSUPPORTED, "not an embedding model: the folder has no modules.json");
    if (t->ec_rc)
        return tern_err_set(e, TERN_EUNSUPPORTED, "embedding config: %s", t->ec_err.msg);
    if (dim)
        *dim = t->ec.dim;
    if (cap < t->ec.dim)
        return tern_err_set(e, TERN_ERANGE, "tern_embed: out holds %d floats; the embedding has %d", cap, t->ec.dim);
    size_t pl = t->ec.prompt ? strlen(t->ec.prompt) : 0, tl = strlen(text);
    char *full = malloc(pl + tl + 1);
    if (!full)
        return tern_err_set(e, TERN_ENOMEM, "out of memory");
    if (pl)
        memcpy(full, t->ec.prompt, pl);
    memcpy(full + pl, text, tl + 1);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(t->tok, full, pl + tl, 1, &ids, &n, e);
    free(full);
    if (rc)
        return rc;
    if (t->ec.max_seq_length > 0 && n > (size_t)t->ec.max_seq_length) {
        free(ids);
        return tern_err_set(e, TERN_ERANGE, "the text has %zu tokens; the model embeds at most %d", n,
                            t->ec.max_seq_length);
    }
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.embed_pooling = t->ec.pooling;
    p.embed_normalize = t->ec.normalize;
    engine_req *r = engine_submit(t->e, &p, NULL, NULL, e);
    free(ids);
    if (!r)
        return e ? e->code : TERN_EINVAL;
    engine_event ev;
    rc = TERN_EINTERNAL;
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_FINISH) {
            if (ev.finish == ENGINE_FINISH_STOP && ev.embedding && ev.n_embedding == t->ec.dim) {
                memcpy(out, ev.embedding, (size_t)ev.n_embedding * sizeof *out);
                rc = 0;
            } else {
                tern_err_set(e, TERN_EINTERNAL, "embedding failed: %s", ev.error);
            }
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
    return rc;
}
