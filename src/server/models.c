/* The model pool: every model the server may serve, its state (unloaded,
 * loading, loaded, unloading, failed), the memory it is charged against
 * --max-memory (its weights files + its KV budget), and the one loader
 * thread that brings models up and evicts the least recently used idle
 * ones to make room. Each loaded model has its own engine (step loop
 * thread + KV pool), so a load never runs on, or locks, another model's
 * step loop: requests of loaded models only take pool_mu for a reference
 * (models_acquire / models_release), never across a load. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/json.h"
#include "base/log.h"
#include "model/config.h"
#include "model/kv.h"
#include "server/server_int.h"
#include "server/structured.h"
#include "server/toolcall.h"

/* A pooled model's KV budget when --kv-budget is not given: what max_batch
 * full contexts need, but at most this - the pool must be able to say what a
 * model costs before loading it, and half of free memory (the single-model
 * default) would let one model take the whole --max-memory. */
#define MODELS_KV_DEFAULT ((size_t)1 << 30)

/* How often a wait for a load re-checks for server shutdown. */
#define MODELS_WAIT_MS 200

/* How long a request waits for models in use to go idle when its model
 * could fit only by evicting one of them; then 503 with the sizes. Like a
 * full engine queue, waiting is fine and forever is not. */
#define MODELS_ROOM_WAIT_S 30.0

const char *models_state_name(srv_model_state st)
{
    static const char *const names[] = {"unloaded", "loading", "loaded", "unloading", "failed"};
    return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "?";
}

/* "12.3 MiB" / "1.50 GiB" */
static const char *size_str(size_t b, char *buf, size_t cap)
{
    if (b >= (size_t)1 << 30)
        snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
    else
        snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    return buf;
}

/* ---- a model's folder, before loading ---- */

/* Bytes of DIR's *.safetensors files (the weights: dense ones stay mapped). */
static int weights_size(const char *dir, size_t *out, tern_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return tern_err_set(err, TERN_ENOTFOUND, "cannot open the folder %s", dir);
    size_t total = 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0)
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            total += (size_t)st.st_size;
            n++;
        }
    }
    closedir(d);
    if (!n)
        return tern_err_set(err, TERN_ENOTFOUND, "no .safetensors weights in %s", dir);
    *out = total;
    return 0;
}

/* What a model of config c costs in KV under the engine options eo, and the
 * context it gets: --ctx-size capped by the model's maximum (a pool serves
 * models of different lengths with one flag). */
static size_t kv_estimate(const model_config *c, const engine_opts *eo, int *ctx)
{
    *ctx = eo->ctx_size > 0 && eo->ctx_size < c->max_pos ? eo->ctx_size : c->max_pos;
    size_t per_block = kv_bytes_per_token(c->n_layer, c->n_kv_head * c->head_dim) * KV_BLOCK_DEFAULT;
    size_t want = per_block * (size_t)((*ctx + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT + 1) *
                  (size_t)(eo->max_batch > 0 ? eo->max_batch : 64);
    size_t cap = eo->kv_budget_bytes ? eo->kv_budget_bytes : MODELS_KV_DEFAULT;
    return want < cap ? want : cap;
}

/* Reads what the pool needs to know before loading: weights size, KV
 * budget, context. A folder that fails here is listed as failed. */
static int model_survey(tern_server *s, srv_model *mm, tern_err *err)
{
    model_config c;
    memset(&c, 0, sizeof c);
    if (model_config_load(&c, mm->dir, err) || weights_size(mm->dir, &mm->weights_bytes, err))
        return -1;
    mm->kv_bytes = kv_estimate(&c, &s->o.engine, &mm->ctx_size);
    return 0;
}

/* ---- a model's server state (template, tools, thinking, embeddings) ---- */

static int model_state_open(tern_server *s, srv_model *mm, tern_err *err)
{
    mm->has_think = reasoning_delims_find(mm->tok, &mm->think);
    mm->has_harmony = harmony_detect(mm->tok, &mm->harmony);
    if (mm->has_harmony)
        mm->has_think = 0; /* the analysis channel is its thought (harmony.h) */
    if (mm->dir) {
        tern_err te;
        int rc = tern_chat_template_load(mm->dir, &mm->chat, &te);
        if (rc && rc != TERN_ENOTFOUND)
            return tern_err_set(err, rc, "chat template: %s", te.msg);
        if (rc)
            TERN_WARN("server: %s has no chat template; /v1/chat/completions will answer 400", mm->dir);
        /* a sentence-transformers folder: /v1/embeddings (a config tern cannot honour fails the load) */
        rc = embed_config_load(mm->dir, model_hidden_dim(mm->m), &mm->embed, &te);
        if (rc && rc != TERN_ENOTFOUND)
            return tern_err_set(err, rc, "embedding config: %s", te.msg);
        if (!rc)
            TERN_INFO("server: %s: embedding model (%s pooling%s%s); /v1/embeddings %s", mm->name,
                      embed_pooling_name(mm->embed.pooling), mm->embed.normalize ? ", normalized" : "",
                      mm->embed.prompt ? ", default prompt" : "",
                      model_hidden_supported(mm->m) ? "is served" : "needs the CPU backend (--device cpu)");
    }
    if (toolfmt_detect(&mm->chat, mm->tok, &mm->tools, err))
        return -1;
    if (s->o.tool_call_format) {
        const toolfmt *f = toolfmt_by_name(s->o.tool_call_format);
        if (!f)
            return tern_err_set(err, TERN_EINVAL, "unknown tool-call format '%s' (one of %s)",
                                s->o.tool_call_format, toolfmt_names());
        mm->tools.fmt = f;
        mm->tools.why = "--tool-call-format";
    }
    if (mm->has_harmony)
        TERN_INFO("server: %s: harmony format (its vocabulary's channel tokens): analysis -> reasoning, final -> "
                  "content, messages to functions.NAME -> tool calls%s",
                  mm->name, mm->tools.renders_tools ? "" : "; the template does not render tools");
    else if (mm->chat.tpl)
        TERN_INFO("server: %s: tool calls: %s (%s)%s", mm->name, mm->tools.fmt->name, mm->tools.why,
                  mm->tools.renders_tools ? "" : "; the template does not render tools");
    return 0;
}

/* Frees everything of a loaded model (no request holds it). The engine goes
 * first: rows it still finishes hold constraints over the grammar cache. */
static void model_teardown(srv_model *mm)
{
    adapters_base_down(mm->s, mm); /* read against mm->m: they go with it */
    if (!mm->borrowed)
        engine_free(mm->eng);
    toolcall_server_free(mm);
    structured_server_free(mm);
    tern_chat_template_free(&mm->chat);
    embed_config_free(&mm->embed);
    memset(&mm->tools, 0, sizeof mm->tools);
    if (!mm->borrowed) {
        tokenizer_free(mm->tok);
        model_free(mm->m);
    }
    mm->eng = NULL;
    mm->tok = NULL;
    mm->m = NULL;
}

/* Loader thread: the model, its tokenizer, its engine, its server state. */
static int model_bring_up(tern_server *s, srv_model *mm, tern_err *err)
{
    if (s->o.load(s->o.load_ctx, mm->dir, &mm->m, &mm->tok, err))
        return -1;
    engine_opts eo = s->o.engine;
    eo.ctx_size = mm->ctx_size;
    eo.kv_budget_bytes = mm->kv_bytes;
    char topic[256]; /* a pool's events: each model under its own topic */
    if (eo.kv_events && s->o.n_models > 0) {
        snprintf(topic, sizeof topic, "%s%s", eo.kv_events_topic ? eo.kv_events_topic : "", mm->name);
        eo.kv_events_topic = topic;
    }
    if (eo.kv_disk_dir && kvdisk_model_id(mm->dir, &eo.kv_disk_model_id, err)) /* its own disk-tier folder */
        goto fail;
    if (!(mm->eng = engine_new(mm->m, mm->tok, &eo, err)))
        goto fail;
    engine_stats st;
    engine_stats_get(mm->eng, &st);
    mm->kv_bytes = st.kv_bytes_total; /* the pool it got (whole blocks of the budget) */
    if (model_state_open(s, mm, err))
        goto fail;
    return 0;
fail:
    model_teardown(mm);
    return -1;
}

/* ---- memory ---- */

static size_t charged(const srv_model *mm)
{
    return mm->state == MODEL_LOADED || mm->state == MODEL_UNLOADING || mm->state == MODEL_LOADING
               ? mm->weights_bytes + mm->kv_bytes + (size_t)atomic_load(&mm->lora_bytes)
               : 0;
}

static int evictable(const srv_model *mm)
{
    return mm->state == MODEL_LOADED && !mm->refs && !mm->waiters && !mm->pinned && !mm->borrowed;
}

/* Bytes held by models that cannot give them up now (in use, pinned,
 * loading), other than mm, and of those the pinned ones' (held for good);
 * their names into who. Under pool_mu. */
static size_t held_bytes(tern_server *s, const srv_model *mm, size_t *pinned, char *who, size_t cap)
{
    size_t held = 0, off = 0;
    *pinned = 0;
    if (cap)
        who[0] = 0;
    for (int i = 0; i < s->n_models; i++) {
        srv_model *o = s->models[i];
        if (o == mm || o->state == MODEL_UNLOADING || evictable(o) || !charged(o))
            continue;
        held += charged(o);
        if (o->pinned || o->borrowed)
            *pinned += charged(o);
        if (off < cap) {
            int n = snprintf(who + off, cap - off, "%s%s (%s)", off ? ", " : "", o->name,
                             o->state == MODEL_LOADING ? "loading" : o->pinned ? "pinned" : "in use");
            off += n > 0 ? (size_t)n : 0;
        }
    }
    return held;
}

/* Whether mm fits in --max-memory by evicting idle models: 1 now, 0 once
 * models in use go idle, -1 never (pinned models leave too little room).
 * When not now, the reason with the sizes goes into mm->reason. Under
 * pool_mu. */
static int fits(tern_server *s, srv_model *mm)
{
    size_t need = mm->weights_bytes + mm->kv_bytes, max = s->o.max_memory, pinned;
    char who[200], a[32], b[32], c[32], d[32], f[32]; /* the reason fits TERN_ERR_MSG_MAX */
    size_t held = held_bytes(s, mm, &pinned, who, sizeof who);
    if (!max || held + need <= max)
        return 1;
    snprintf(mm->reason, sizeof mm->reason,
             "model '%.48s' needs %s (weights %s + KV %s) but only %s of --max-memory %s can be made free%s%.199s",
             mm->name, size_str(need, a, sizeof a), size_str(mm->weights_bytes, b, sizeof b),
             size_str(mm->kv_bytes, c, sizeof c), size_str(held < max ? max - held : 0, d, sizeof d),
             size_str(max, f, sizeof f), who[0] ? "; held by " : "", who);
    return pinned + need <= max ? 0 : -1;
}

/* The least recently used evictable model other than mm, or NULL. */
static srv_model *lru_victim(tern_server *s, const srv_model *mm)
{
    srv_model *v = NULL;
    for (int i = 0; i < s->n_models; i++) {
        srv_model *o = s->models[i];
        if (o != mm && evictable(o) && (!v || o->last_used < v->last_used))
            v = o;
    }
    return v;
}

/* LOADED -> UNLOADING: its engine's counters are kept. Under pool_mu. */
static void begin_unload(srv_model *mm)
{
    engine_stats st;
    engine_stats_get(mm->eng, &st);
    engine_stats *r = &mm->retired;
    r->requests_total += st.requests_total;
    r->requests_finished += st.requests_finished;
    r->requests_cancelled += st.requests_cancelled;
    r->requests_rejected += st.requests_rejected;
    r->tokens_prefilled += st.tokens_prefilled;
    r->tokens_decoded += st.tokens_decoded;
    r->prefix_hit_tokens += st.prefix_hit_tokens;
    r->steps += st.steps;
    r->spec_drafted += st.spec_drafted;
    r->spec_accepted += st.spec_accepted;
    r->spec_target_forwards += st.spec_target_forwards;
    r->jump_tokens += st.jump_tokens;
    engine_stats_tiers_add(r, &st, 0);
    mm->state = MODEL_UNLOADING;
}

/* Unloads mm (UNLOADING) with pool_mu held on entry and exit, dropping it
 * meanwhile. */
static void finish_unload(tern_server *s, srv_model *mm)
{
    pthread_mutex_unlock(&s->pool_mu);
    model_teardown(mm);
    pthread_mutex_lock(&s->pool_mu);
    mm->state = MODEL_UNLOADED;
    pthread_cond_broadcast(&s->pool_cv);
}

int models_room(tern_server *s, srv_model *keep, const char *what, size_t bytes, char *reason, size_t cap)
{
    int rc = 0;
    pthread_mutex_lock(&s->pool_mu);
    for (;;) {
        size_t used = 0;
        for (int i = 0; i < s->n_models; i++)
            used += charged(s->models[i]);
        if (!s->o.max_memory || used <= s->o.max_memory)
            break;
        srv_model *v = lru_victim(s, keep);
        if (!v) {
            size_t pinned, held, max = s->o.max_memory, mine = charged(keep);
            char who[200], a[32], b[32], d[32], f[32];
            held = held_bytes(s, keep, &pinned, who, sizeof who);
            snprintf(reason, cap, "%.200s (%s) does not fit: model '%.48s' would hold %s but only %s of --max-memory %s "
                     "can be made free%s%.199s", what, size_str(bytes, a, sizeof a), keep->name,
                     size_str(mine, b, sizeof b), size_str(held < max ? max - held : 0, d, sizeof d),
                     size_str(max, f, sizeof f), who[0] ? "; held by " : "", who);
            rc = -1;
            break;
        }
        TERN_INFO("models: evicting %s (least recently used) for %s", v->name, what);
        begin_unload(v);
        atomic_fetch_add(&v->met.evictions, 1);
        finish_unload(s, v);
    }
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
}

/* ---- the loader thread ---- */

static srv_model *next_queued(tern_server *s)
{
    for (int i = 0; i < s->n_models; i++)
        if (s->models[i]->state == MODEL_LOADING && !s->models[i]->in_loader)
            return s->models[i];
    return NULL;
}

/* One load, under pool_mu (dropped while evicting and loading). */
static void load_one(tern_server *s, srv_model *mm)
{
    /* make room: evict idle models, least recently used first */
    for (;;) {
        size_t used = 0, need = mm->weights_bytes + mm->kv_bytes;
        for (int i = 0; i < s->n_models; i++)
            if (s->models[i] != mm && s->models[i]->state != MODEL_LOADING)
                used += charged(s->models[i]);
        if (!s->o.max_memory || used + need <= s->o.max_memory)
            break;
        srv_model *v = lru_victim(s, mm);
        if (!v) {
            if (fits(s, mm) > 0) /* else it wrote the refusal with the sizes */
                snprintf(mm->reason, sizeof mm->reason, "model '%s' does not fit in --max-memory", mm->name);
            TERN_WARN("models: %s", mm->reason);
            mm->state = MODEL_UNLOADED;
            pthread_cond_broadcast(&s->pool_cv);
            return;
        }
        TERN_INFO("models: evicting %s (least recently used) to load %s", v->name, mm->name);
        begin_unload(v);
        atomic_fetch_add(&v->met.evictions, 1);
        finish_unload(s, v);
    }
    mm->in_loader = 1;
    pthread_mutex_unlock(&s->pool_mu);
    double t0 = tern_time_s();
    tern_err err = {0};
    TERN_INFO("models: loading %s from %s", mm->name, mm->dir);
    int rc = model_bring_up(s, mm, &err);
    double dt = tern_time_s() - t0;
    pthread_mutex_lock(&s->pool_mu);
    mm->in_loader = 0;
    if (rc) {
        snprintf(mm->reason, sizeof mm->reason, "%s", err.msg[0] ? err.msg : "load failed");
        mm->state = MODEL_FAILED;
        atomic_fetch_add(&mm->met.load_failures, 1);
        TERN_WARN("models: %s failed to load: %s", mm->name, mm->reason);
    } else {
        mm->reason[0] = 0;
        mm->state = MODEL_LOADED;
        mm->loaded_at = tern_time_s();
        mm->last_used = ++s->tick;
        atomic_fetch_add(&mm->met.loads, 1);
        atomic_fetch_add(&mm->met.load_ms_total, (long long)(dt * 1000.0));
        TERN_INFO("models: %s loaded in %.2fs", mm->name, dt);
    }
    pthread_cond_broadcast(&s->pool_cv);
}

static void *loader_main(void *arg)
{
    tern_server *s = arg;
    pthread_mutex_lock(&s->pool_mu);
    for (;;) {
        srv_model *mm = NULL;
        while (!s->loader_quit && !(mm = next_queued(s)))
            pthread_cond_wait(&s->pool_cv, &s->pool_mu);
        if (s->loader_quit)
            break;
        load_one(s, mm);
    }
    for (int i = 0; i < s->n_models; i++)
        if (s->models[i]->state == MODEL_LOADING)
            s->models[i]->state = MODEL_UNLOADED;
    pthread_cond_broadcast(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
    return NULL;
}

/* ---- requests ---- */

srv_model *models_resolve(tern_server *s, const char *name, api_error *e)
{
    if (!name || !name[0]) {
        if (s->n_models == 1)
            return s->models[0];
        api_bad(e, "missing_required_parameter", "model",
                "'model' is required: this server serves several models (see GET /v1/models)");
        return NULL;
    }
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i]->name, name))
            return s->models[i];
    /* adapters (BASE:ADAPTER, or an adapter's own name) resolve here too, to their base */
    srv_model *base = adapters_resolve(s, name);
    if (base)
        return base;
    api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                  "The model '%.200s' does not exist (see GET /v1/models)", name);
    return NULL;
}

int models_acquire(tern_server *s, srv_model *mm, api_error *e)
{
    int rc = 0;
    double deadline = tern_time_s() + MODELS_ROOM_WAIT_S;
    pthread_mutex_lock(&s->pool_mu);
    for (;;) {
        if (atomic_load(&s->stopping)) {
            rc = api_error_set(e, 503, "server_error", NULL, NULL, "server shutting down");
            break;
        }
        if (mm->state == MODEL_LOADED) {
            mm->refs++;
            mm->last_used = ++s->tick;
            break;
        }
        if (mm->state == MODEL_FAILED) {
            rc = api_error_set(e, 503, "server_error", "model_load_failed", "model",
                               "model '%.200s' cannot be loaded: %s", mm->name, mm->reason);
            break;
        }
        if (mm->state == MODEL_UNLOADED) {
            int f = fits(s, mm);
            if (f < 0 || (f == 0 && tern_time_s() > deadline)) {
                atomic_fetch_add(&mm->met.rejected_no_room, 1);
                rc = api_error_set(e, 503, "server_error", "model_cannot_fit", "model", "%s%s", mm->reason,
                                   f < 0 ? "" : " (waited for models in use to go idle)");
                break;
            }
            if (f > 0) {
                mm->reason[0] = 0;
                mm->state = MODEL_LOADING;
                pthread_cond_broadcast(&s->pool_cv);
            }
        }
        /* loading, unloading, or waiting for room: a release or a state change wakes us */
        mm->waiters++;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += MODELS_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->pool_cv, &s->pool_mu, &ts);
        mm->waiters--;
    }
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
}

void models_release(srv_model *mm)
{
    if (!mm)
        return;
    tern_server *s = mm->s;
    pthread_mutex_lock(&s->pool_mu);
    mm->last_used = ++s->tick;
    if (--mm->refs == 0) /* requests waiting for room may fit now */
        pthread_cond_broadcast(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
}

srv_model *models_acquire_body(tern_server *s, const char *body, size_t len, api_error *e)
{
    tern_err je;
    json_object *root = tern_json_parse(body, len, &je);
    json_object *v = NULL;
    const char *name = NULL;
    if (root && json_object_is_type(root, json_type_object) && json_object_object_get_ex(root, "model", &v) && v) {
        if (!json_object_is_type(v, json_type_string)) {
            json_object_put(root);
            api_bad(e, "invalid_type", "model", "'model' must be a string");
            return NULL;
        }
        name = json_object_get_string(v);
    }
    if ((!root || !json_object_is_type(root, json_type_object)) && s->n_models > 1) {
        json_object_put(root);
        api_bad(e, root ? "invalid_type" : "invalid_json", NULL, "%s",
                root ? "request body must be a JSON object" : "request body is not valid JSON");
        return NULL;
    }
    /* one model: a body that is no JSON object is the parser's to report, after us */
    srv_model *mm = models_resolve(s, name, e);
    json_object_put(root);
    if (mm && models_acquire(s, mm, e))
        return NULL;
    return mm;
}

int models_load(tern_server *s, srv_model *mm, api_error *e)
{
    pthread_mutex_lock(&s->pool_mu);
    if (mm->state == MODEL_FAILED) { /* a retry: the folder may have been fixed */
        tern_err err = {0};
        if (model_survey(s, mm, &err)) {
            snprintf(mm->reason, sizeof mm->reason, "%s", err.msg);
            pthread_mutex_unlock(&s->pool_mu);
            return api_error_set(e, 503, "server_error", "model_load_failed", "model",
                                 "model '%.200s' cannot be loaded: %s", mm->name, mm->reason);
        }
        mm->state = MODEL_UNLOADED;
    }
    if (mm->state == MODEL_UNLOADED)
        mm->reason[0] = 0;
    pthread_mutex_unlock(&s->pool_mu);
    if (models_acquire(s, mm, e))
        return -1;
    models_release(mm);
    return 0;
}

int models_unload(tern_server *s, srv_model *mm, api_error *e)
{
    int rc = 0;
    pthread_mutex_lock(&s->pool_mu);
    while (mm->state == MODEL_LOADING || mm->state == MODEL_UNLOADING) {
        if (mm->state == MODEL_LOADING && !mm->in_loader) { /* only queued: take it off the queue */
            mm->state = MODEL_UNLOADED;
            pthread_cond_broadcast(&s->pool_cv);
            break;
        }
        pthread_cond_wait(&s->pool_cv, &s->pool_mu);
    }
    if (mm->state == MODEL_LOADED) {
        if (mm->pinned || mm->borrowed)
            rc = api_error_set(e, 409, "invalid_request_error", "model_pinned", "model",
                               "model '%.200s' is pinned (--pin) and stays loaded", mm->name);
        else if (mm->refs || mm->waiters)
            rc = api_error_set(e, 409, "invalid_request_error", "model_busy", "model",
                               "model '%.200s' has %d requests running; unload it when idle", mm->name,
                               mm->refs + mm->waiters);
        else {
            begin_unload(mm);
            atomic_fetch_add(&mm->met.unloads, 1);
            TERN_INFO("models: unloading %s", mm->name);
            finish_unload(s, mm);
        }
    }
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
}

void models_wake(tern_server *s)
{
    if (!s->models)
        return;
    pthread_mutex_lock(&s->pool_mu);
    pthread_cond_broadcast(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
}

/* ---- lifetime ---- */

static srv_model *model_new(tern_server *s, const char *name, const char *dir, int pinned)
{
    srv_model *mm = calloc(1, sizeof *mm);
    if (!mm)
        return NULL;
    mm->s = s;
    mm->name = strdup(name ? name : "tern");
    mm->dir = dir ? strdup(dir) : NULL;
    mm->pinned = pinned;
    if (!mm->name || (dir && !mm->dir)) {
        free(mm->name);
        free(mm->dir);
        free(mm);
        return NULL;
    }
    return mm;
}

int models_init(tern_server *s, tern_model *m, const tern_tokenizer *tok, tern_engine *eng, tern_err *err)
{
    const server_opts *o = &s->o;
    int n = m ? 1 : o->n_models;
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_cond_init(&s->pool_cv, NULL);
    if (n < 1)
        return tern_err_set(err, TERN_EINVAL, "no model to serve");
    if (!m && !o->load)
        return tern_err_set(err, TERN_EINVAL, "a model pool needs a loader");
    s->models = calloc((size_t)n, sizeof *s->models);
    if (!s->models)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (m) { /* one model, loaded by the caller */
        srv_model *mm = s->models[0] = model_new(s, o->model_name, o->model_dir, 1);
        if (!mm)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        s->n_models = 1;
        mm->borrowed = 1;
        mm->m = m;
        mm->tok = (tern_tokenizer *)tok;
        mm->eng = eng;
        mm->ctx_size = o->ctx_size > 0 ? o->ctx_size : model_config_get(m)->max_pos;
        engine_stats st;
        engine_stats_get(eng, &st);
        mm->kv_bytes = st.kv_bytes_total;
        if (!mm->dir || weights_size(mm->dir, &mm->weights_bytes, err))
            mm->weights_bytes = model_weight_bytes(m);
        if (model_state_open(s, mm, err))
            return -1;
        mm->state = MODEL_LOADED;
        mm->loaded_at = tern_time_s();
        atomic_store(&mm->met.loads, 1);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const server_model_spec *sp = &o->models[i];
        for (int j = 0; j < i; j++)
            if (!strcmp(sp->name, o->models[j].name))
                return tern_err_set(err, TERN_EINVAL, "two models are named '%s'", sp->name);
        srv_model *mm = s->models[i] = model_new(s, sp->name, sp->dir, sp->pinned);
        if (!mm)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        s->n_models = i + 1;
        tern_err e2 = {0};
        if (model_survey(s, mm, &e2)) {
            mm->state = MODEL_FAILED;
            snprintf(mm->reason, sizeof mm->reason, "%s", e2.msg);
            TERN_WARN("models: %s (%s) cannot be served: %s", mm->name, mm->dir, mm->reason);
        }
    }
    if (pthread_create(&s->loader, NULL, loader_main, s) != 0)
        return tern_err_set(err, TERN_ENOMEM, "cannot start the model loader thread");
    s->loader_started = 1;
    for (int i = 0; i < n; i++) { /* pinned models come up now */
        srv_model *mm = s->models[i];
        api_error e;
        if (mm->pinned && mm->state != MODEL_FAILED && models_load(s, mm, &e))
            TERN_WARN("models: pinned %s is not loaded: %s", mm->name, e.msg);
    }
    return 0;
}

void models_free(tern_server *s)
{
    if (!s->models)
        return;
    if (s->loader_started) {
        pthread_mutex_lock(&s->pool_mu);
        s->loader_quit = 1;
        pthread_cond_broadcast(&s->pool_cv);
        pthread_mutex_unlock(&s->pool_mu);
        pthread_join(s->loader, NULL);
    }
    for (int i = 0; i < s->n_models; i++) {
        srv_model *mm = s->models[i];
        if (mm->state == MODEL_LOADED || mm->m)
            model_teardown(mm);
        free(mm->name);
        free(mm->dir);
        free(mm);
    }
    free(s->models);
    s->models = NULL;
    pthread_cond_destroy(&s->pool_cv);
    pthread_mutex_destroy(&s->pool_mu);
}
