/* POST /v1/embeddings: parse the body, turn each input into token ids (the
 * folder's default prompt + text, with the tokenizer's special tokens; or
 * the ids as sent), run them through the engine as embedding requests -
 * prefill chunks in the same step loop as every generation, so a long
 * input delays others by no more than a step's prefill budget - and reply
 * with OpenAI's list of embeddings. One HTTP request keeps at most
 * EMBED_MAX_INFLIGHT engine requests queued; the rest follow as those end. */
#include "server/embeddings.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/log.h"
#include "model/embed.h"
#include "server/server_int.h"

#define EMBED_POLL_MS 250 /* how often a wait re-checks for server shutdown */

/* ---- the request body ---- */

void embed_request_free(embed_request *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_in; i++)
        free(r->in[i].ids);
    free(r->in);
    json_object_put(r->root);
    memset(r, 0, sizeof *r);
}

static int is_number(json_object *v)
{
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

/* A list of token ids into in->ids; idx < 0: the list is `input` itself. */
static int parse_ids(embed_input *in, json_object *a, long idx, const api_limits *lim, api_error *e)
{
    size_t n = json_object_array_length(a);
    char where[32] = "";
    if (idx >= 0)
        snprintf(where, sizeof where, "[%ld]", idx);
    if (n == 0)
        return api_bad(e, "invalid_value", "input", "'input%s' is an empty token list", where);
    if (!(in->ids = malloc(n * sizeof *in->ids)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(a, i);
        double d = is_number(t) ? json_object_get_double(t) : -1;
        int64_t id = json_object_is_type(t, json_type_int) ? json_object_get_int64(t) : (int64_t)d;
        if (!is_number(t) || d != (double)id || id < 0 || id >= lim->n_vocab)
            return api_bad(e, "invalid_value", "input", "'input%s[%zu]' must be a token id in [0, %d)", where, i,
                           lim->n_vocab);
        in->ids[i] = (int32_t)id;
    }
    in->n_ids = n;
    return 0;
}

static int parse_input(embed_request *r, json_object *v, const api_limits *lim, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        if (!(r->in = calloc(1, sizeof *r->in)))
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        r->n_in = 1;
        r->in[0].text = json_object_get_string(v);
        r->in[0].text_len = (size_t)json_object_get_string_len(v);
        if (r->in[0].text_len == 0)
            return api_bad(e, "invalid_value", "input", "'input' is an empty string");
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return api_bad(e, "invalid_type", "input",
                       "'input' must be a string, a list of strings, a list of token ids or a list of such lists");
    size_t n = json_object_array_length(v);
    if (n == 0)
        return api_bad(e, "invalid_value", "input", "'input' is an empty list");
    json_object *first = json_object_array_get_idx(v, 0);
    if (is_number(first)) { /* one input as token ids */
        if (!(r->in = calloc(1, sizeof *r->in)))
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        r->n_in = 1;
        return parse_ids(&r->in[0], v, -1, lim, e);
    }
    if (n > EMBED_MAX_INPUTS)
        return api_bad(e, "invalid_value", "input", "'input' has %zu items; at most %d are allowed", n,
                       EMBED_MAX_INPUTS);
    int strings = json_object_is_type(first, json_type_string);
    if (!strings && !json_object_is_type(first, json_type_array))
        return api_bad(e, "invalid_type", "input",
                       "'input' must be a string, a list of strings, a list of token ids or a list of such lists");
    if (!(r->in = calloc(n, sizeof *r->in)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    r->n_in = n;
    for (size_t i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(v, i);
        if (strings) {
            if (!json_object_is_type(x, json_type_string))
                return api_bad(e, "invalid_type", "input", "'input[%zu]' must be a string like the items before it", i);
            r->in[i].text = json_object_get_string(x);
            r->in[i].text_len = (size_t)json_object_get_string_len(x);
            if (r->in[i].text_len == 0)
                return api_bad(e, "invalid_value", "input", "'input[%zu]' is an empty string", i);
        } else {
            if (!json_object_is_type(x, json_type_array))
                return api_bad(e, "invalid_type", "input", "'input[%zu]' must be a list of token ids like the items before it", i);
            if (parse_ids(&r->in[i], x, (long)i, lim, e))
                return -1;
        }
    }
    return 0;
}

static int parse_field(embed_request *r, const char *k, json_object *v, const api_limits *lim, int dim, api_error *e)
{
    if (!strcmp(k, "input"))
        return parse_input(r, v, lim, e);
    if (!strcmp(k, "model")) {
        if (!json_object_is_type(v, json_type_string))
            return api_bad(e, "invalid_type", "model", "'model' must be a string");
        r->model = json_object_get_string(v);
        return 0;
    }
    if (!strcmp(k, "dimensions")) {
        double d = is_number(v) ? json_object_get_double(v) : 0;
        if (!is_number(v) || d != (double)(long long)d)
            return api_bad(e, "invalid_type", "dimensions", "'dimensions' must be an integer");
        if (d < 1 || d > dim)
            return api_bad(e, "invalid_value", "dimensions", "'dimensions' must be between 1 and %d (the model's size)",
                           dim);
        r->dimensions = (int)d;
        return 0;
    }
    if (!strcmp(k, "encoding_format")) {
        const char *f = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return api_bad(e, "invalid_value", "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = !strcmp(f, "base64");
        return 0;
    }
    if (!strcmp(k, "user")) { /* a hint for abuse monitoring: no effect here */
        if (!json_object_is_type(v, json_type_string))
            return api_bad(e, "invalid_type", "user", "'user' must be a string");
        return 0;
    }
    return api_bad(e, "unsupported_parameter", k, "Unsupported parameter: '%.60s' is not supported by /v1/embeddings",
                   k);
}

int embed_request_parse(embed_request *r, const char *body, size_t len, const api_limits *lim, int dim,
                        api_error *e)
{
    memset(r, 0, sizeof *r);
    size_t valid = api_utf8_valid_len(body, len);
    if (valid != len)
        return api_bad(e, "invalid_encoding", NULL, "request body is not valid UTF-8 (at byte %zu)", valid);
    tern_err je;
    if (!(r->root = tern_json_parse(body, len, &je)))
        return api_bad(e, "invalid_json", NULL, "request body is not valid JSON: %s", je.msg);
    if (!json_object_is_type(r->root, json_type_object)) {
        api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
        goto fail;
    }
    json_object_object_foreach(r->root, k, v) {
        if (!v)
            continue; /* null = absent, as OpenAI's SDKs send it */
        if (parse_field(r, k, v, lim, dim, e))
            goto fail;
    }
    if (!r->in) {
        api_bad(e, "missing_required_parameter", "input", "'input' is required");
        goto fail;
    }
    if (r->model && lim->model_name && strcmp(r->model, lim->model_name) != 0) {
        api_error_set(e, 400, "invalid_request_error", "model_not_found", "model",
                      "The model '%.200s' does not exist (this server serves '%.200s')", r->model, lim->model_name);
        goto fail;
    }
    return 0;
fail:
    embed_request_free(r);
    return -1;
}

/* ---- the response body ---- */

void embed_truncate(float *v, int d)
{
    embed_l2_normalize(v, d);
}

/* base64 (RFC 4648, padded) of the vector's little-endian float32 bytes. */
static json_object *base64_f32(const float *v, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, olen = (nb + 2) / 3 * 4;
    unsigned char *b = malloc(nb ? nb : 1);
    char *out = malloc(olen + 1);
    json_object *s = NULL;
    if (!b || !out)
        goto out;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++)
            b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
    size_t o = 0;
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        out[o++] = tab[x >> 18 & 63];
        out[o++] = tab[x >> 12 & 63];
        out[o++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
        out[o++] = i + 2 < nb ? tab[x & 63] : '=';
    }
    out[o] = '\0';
    s = json_object_new_string_len(out, (int)o);
out:
    free(b);
    free(out);
    return s;
}

static json_object *float_array(const float *v, int n)
{
    json_object *a = json_object_new_array_ext(n);
    char buf[32];
    for (int i = 0; a && i < n; i++) {
        snprintf(buf, sizeof buf, "%.9g", (double)v[i]); /* 9 digits: every float32 reads back exactly */
        json_object_array_add(a, json_object_new_double_s((double)v[i], buf));
    }
    return a;
}

char *embed_response_json(const char *model, const float *const *vecs, size_t n, int dim, int base64,
                          long long n_tokens)
{
    json_object *o = json_object_new_object(), *data = json_object_new_array_ext((int)n);
    if (!o || !data) {
        json_object_put(o);
        json_object_put(data);
        return NULL;
    }
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", data);
    for (size_t i = 0; i < n; i++) {
        json_object *d = json_object_new_object();
        json_object *emb = base64 ? base64_f32(vecs[i], dim) : float_array(vecs[i], dim);
        if (!d || !emb) {
            json_object_put(d);
            json_object_put(emb);
            json_object_put(o);
            return NULL;
        }
        json_object_object_add(d, "object", json_object_new_string("embedding"));
        json_object_object_add(d, "index", json_object_new_int((int)i));
        json_object_object_add(d, "embedding", emb);
        json_object_array_add(data, d);
    }
    json_object_object_add(o, "model", api_json_string(model, strlen(model)));
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64(n_tokens));
    json_object_object_add(u, "total_tokens", json_object_new_int64(n_tokens));
    json_object_object_add(o, "usage", u);
    return api_json_take(o);
}

/* ---- the route ---- */

typedef struct embed_job {
    tern_server *s;
    srv_model *mm;        /* the model it runs on (the route holds the reference) */
    srv_waker *wk;
    int client_fd;
    engine_req **r;       /* [n] the engine request of each input while it runs, else NULL */
    float **vec;          /* [n] owned vectors as they arrive */
    size_t n, next, n_live, n_done;
    long long n_tokens;   /* usage: every input's tokens */
} embed_job;

/* Tokenizes input i (prompt + text with the tokenizer's specials, or the
 * ids as sent) and checks it against the length limit. */
static int input_ids(srv_model *mm, const embed_input *in, size_t i, int32_t **ids, size_t *n, api_error *e)
{
    int limit = mm->embed.max_seq_length > 0 && mm->embed.max_seq_length < mm->ctx_size ? mm->embed.max_seq_length
                                                                                      : mm->ctx_size;
    *ids = NULL;
    *n = 0;
    if (in->ids) {
        if (!(*ids = malloc(in->n_ids * sizeof **ids)))
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, in->ids, in->n_ids * sizeof **ids);
        *n = in->n_ids;
    } else {
        size_t pl = mm->embed.prompt ? strlen(mm->embed.prompt) : 0;
        char *text = malloc(pl + in->text_len + 1);
        if (!text)
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        if (pl)
            memcpy(text, mm->embed.prompt, pl);
        memcpy(text + pl, in->text, in->text_len);
        tern_err te;
        int rc = tokenizer_encode(mm->tok, text, pl + in->text_len, 1, ids, n, &te);
        free(text);
        if (rc)
            return api_bad(e, "invalid_value", "input", "cannot tokenize input[%zu]: %s", i, te.msg);
        if (*n == 0) {
            api_bad(e, "invalid_value", "input", "input[%zu] has no tokens", i);
            goto fail;
        }
    }
    if (*n > (size_t)limit) {
        api_bad(e, "context_length_exceeded", "input",
                "input[%zu] has %zu tokens; this model embeds at most %d tokens per input", i, *n, limit);
        goto fail;
    }
    return 0;
fail:
    free(*ids);
    *ids = NULL;
    return -1;
}

/* Takes the finished inputs' vectors; -1 with e set when one failed. */
static int job_drain(embed_job *j, api_error *e)
{
    uint64_t cnt;
    ssize_t rd = read(j->wk->efd, &cnt, sizeof cnt); /* reset before reading the queues */
    (void)rd;
    for (size_t i = 0; i < j->n; i++) {
        engine_event ev;
        while (j->r[i] && engine_req_next(j->r[i], &ev, 0)) {
            if (ev.kind == ENGINE_EV_FINISH) {
                int ok = ev.finish == ENGINE_FINISH_STOP && ev.embedding;
                if (ok) {
                    j->vec[i] = ev.embedding;
                    ev.embedding = NULL;
                } else if (ev.finish == ENGINE_FINISH_CANCELLED) {
                    api_error_set(e, 503, "server_error", NULL, NULL, "request cancelled (server shutting down)");
                } else {
                    api_error_set(e, 500, "server_error", NULL, NULL, "embedding failed: %s", ev.error);
                }
                engine_req_release(j->r[i]);
                j->r[i] = NULL;
                j->n_live--;
                j->n_done++;
                engine_event_clear(&ev);
                if (!ok)
                    return -1;
                break;
            }
            engine_event_clear(&ev);
        }
    }
    return 0;
}

/* Submits inputs until EMBED_MAX_INFLIGHT are queued; a full engine queue
 * waits for this job's own requests to end (429 only when none is queued). */
static int job_submit(embed_job *j, const embed_request *q, api_error *e)
{
    tern_server *s = j->s;
    srv_model *mm = j->mm;
    while (j->next < j->n && j->n_live < EMBED_MAX_INFLIGHT) {
        size_t i = j->next;
        int32_t *ids;
        size_t n;
        if (input_ids(mm, &q->in[i], i, &ids, &n, e))
            return -1;
        engine_params p;
        engine_params_default(&p);
        p.prompt = ids;
        p.n_prompt = n;
        p.embed_pooling = mm->embed.pooling;
        p.embed_normalize = mm->embed.normalize;
        tern_err te;
        j->r[i] = engine_submit(mm->eng, &p, srv_waker_notify, j->wk, &te);
        free(ids);
        if (!j->r[i]) {
            if (te.code == TERN_EFULL && j->n_live > 0)
                return 0; /* wait for our own to make room */
            if (te.code == TERN_EFULL)
                return api_error_set(e, 429, "server_busy", "queue_full", NULL, "server busy: %s; retry later",
                                     te.msg);
            if (te.code == TERN_ERANGE)
                return api_bad(e, "context_length_exceeded", "input", "input[%zu]: %s", i, te.msg);
            if (te.code == TERN_EUNSUPPORTED || te.code == TERN_EINVAL)
                return api_bad(e, "unsupported_value", "input", "%s", te.msg);
            return api_error_set(e, 500, "server_error", NULL, NULL, "%s", te.msg);
        }
        atomic_fetch_add(&s->met.prompt_tokens, (long long)n);
        atomic_fetch_add(&mm->met.prompt_tokens, (long long)n);
        j->n_tokens += (long long)n;
        j->n_live++;
        j->next++;
    }
    return 0;
}

/* Waits for an engine event; -1 when the client left (499) or the server stops. */
static int job_wait(embed_job *j, api_error *e)
{
    if (atomic_load(&j->s->stopping))
        return api_error_set(e, 503, "server_error", NULL, NULL, "request abandoned (server shutting down)");
    struct pollfd p[2] = {{.fd = j->wk->efd, .events = POLLIN}, {.fd = j->client_fd, .events = POLLRDHUP}};
    int np = j->client_fd >= 0 ? 2 : 1;
    int rc = poll(p, (nfds_t)np, EMBED_POLL_MS);
    if (rc < 0 && errno != EINTR)
        return api_error_set(e, 500, "server_error", NULL, NULL, "poll failed");
    if (np == 2 && rc > 0 && srv_peer_closed(j->client_fd, p[1].revents))
        return api_error_set(e, 499, "server_error", NULL, NULL, "client went away");
    return 0;
}

static void job_free(embed_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        if (j->r && j->r[i])
            engine_req_release(j->r[i]); /* cancels it if still queued or running */
        if (j->vec)
            free(j->vec[i]);
    }
    free(j->r);
    free(j->vec);
    srv_waker_put(j->s, j->wk);
}

static enum MHD_Result embed_serve(srv_conn *c, srv_model *mm);

enum MHD_Result embed_route_serve(srv_conn *c)
{
    tern_server *s = c->s;
    api_error e;
    srv_model *mm = models_acquire_body(s, c->body.data ? c->body.data : "", c->body.len, &e);
    if (!mm)
        return http_reply_error(c, &e);
    enum MHD_Result ret = embed_serve(c, mm);
    models_release(mm);
    return ret;
}

static enum MHD_Result embed_serve(srv_conn *c, srv_model *mm)
{
    tern_server *s = c->s;
    api_error e;
    if (!mm->embed.pooling) {
        api_bad(&e, "model_not_embedding", "model",
                "'%.200s' is not an embedding model: its folder has no sentence-transformers modules.json with a "
                "Pooling module, so it has no pooling to embed with (serve an embedding model's folder)",
                mm->name);
        return http_reply_error(c, &e);
    }
    if (!model_hidden_supported(mm->m)) {
        api_bad(&e, "unsupported_device", "model",
                "embeddings run on the CPU backend only; this server runs the model on a device (serve it with "
                "--device cpu)");
        return http_reply_error(c, &e);
    }
    embed_request q;
    api_limits lim = {.n_vocab = tokenizer_vocab_size(mm->tok)};
    if (embed_request_parse(&q, c->body.data ? c->body.data : "", c->body.len, &lim, mm->embed.dim, &e))
        return http_reply_error(c, &e);
    embed_job j = {.s = s, .mm = mm, .client_fd = http_client_fd(c), .n = q.n_in};
    j.r = calloc(q.n_in, sizeof *j.r);
    j.vec = calloc(q.n_in, sizeof *j.vec);
    j.wk = srv_waker_get(s);
    if (!j.r || !j.vec || !j.wk) {
        api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    http_timeout_lift(c);
    while (j.n_done < j.n) {
        if (job_submit(&j, &q, &e) || job_drain(&j, &e))
            goto out;
        if (j.n_done < j.n && j.n_live > 0 && job_wait(&j, &e))
            goto out;
    }
    if (q.dimensions)
        for (size_t i = 0; i < q.n_in; i++)
            embed_truncate(j.vec[i], q.dimensions);
    char *json = embed_response_json(mm->name, (const float *const *)j.vec, j.n,
                                     q.dimensions ? q.dimensions : mm->embed.dim, q.base64, j.n_tokens);
    if (!json)
        api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
    job_free(&j);
    embed_request_free(&q);
    return json ? http_reply_json(c, 200, json) : http_reply_error(c, &e);
out:
    job_free(&j);
    embed_request_free(&q);
    return e.status == 499 ? MHD_NO : http_reply_error(c, &e);
}
