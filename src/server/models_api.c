/* The model pool over HTTP: GET /v1/models (every model with its state),
 * GET /v1/models/{id}, POST /v1/models/load and /v1/models/unload
 * ({"model": ID}; behind the API key like all of /v1), and the per-model
 * counters of /stats ("models": {id: {...}}) and /metrics (a `model`
 * label). Snapshots are taken under pool_mu, the JSON built after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/server_int.h"

/* One model's state, copied under pool_mu. */
typedef struct model_snap {
    const char *name; /* borrowed: names live as long as the server */
    srv_model_state state;
    int pinned, refs, ctx_size;
    size_t weights_bytes, kv_bytes, lora_bytes;
    char reason[TERN_ERR_MSG_MAX];
    engine_stats st; /* cumulative: earlier engines + the live one */
    long long gen_started, gen_finished, gen_failed, prompt_tokens, completion_tokens, cached_tokens;
    long long loads, load_failures, evictions, unloads, rejected_no_room, load_ms;
    int has_experts;          /* a loaded mixture of experts: xs holds its residency and counters */
    model_experts_stats xs;
} model_snap;

static void stats_add(engine_stats *a, const engine_stats *b)
{
    a->queue_len += b->queue_len;
    a->running += b->running;
    a->requests_total += b->requests_total;
    a->requests_finished += b->requests_finished;
    a->requests_cancelled += b->requests_cancelled;
    a->requests_rejected += b->requests_rejected;
    a->tokens_prefilled += b->tokens_prefilled;
    a->tokens_decoded += b->tokens_decoded;
    a->prefix_hit_tokens += b->prefix_hit_tokens;
    a->steps += b->steps;
    a->spec_drafted += b->spec_drafted;
    a->spec_accepted += b->spec_accepted;
    a->spec_target_forwards += b->spec_target_forwards;
    a->jump_tokens += b->jump_tokens;
    a->kv_blocks_total += b->kv_blocks_total;
    a->kv_blocks_used += b->kv_blocks_used;
    a->kv_blocks_cached += b->kv_blocks_cached;
    a->kv_bytes_total += b->kv_bytes_total;
    if (b->last_ttft_s > 0)
        a->last_ttft_s = b->last_ttft_s;
    if (b->last_decode_tps > 0)
        a->last_decode_tps = b->last_decode_tps;
    engine_stats_tiers_add(a, b, 1);
}

/* Snapshots of every model ([s->n_models], malloc'd; NULL when out of memory). */
static model_snap *snap_all(tern_server *s)
{
    model_snap *v = calloc((size_t)s->n_models, sizeof *v);
    if (!v)
        return NULL;
    pthread_mutex_lock(&s->pool_mu);
    for (int i = 0; i < s->n_models; i++) {
        srv_model *mm = s->models[i];
        model_snap *p = &v[i];
        p->name = mm->name;
        p->state = mm->state;
        p->pinned = mm->pinned;
        p->refs = mm->refs;
        p->ctx_size = mm->ctx_size;
        p->weights_bytes = mm->weights_bytes;
        p->kv_bytes = mm->kv_bytes;
        p->lora_bytes = (size_t)atomic_load(&mm->lora_bytes);
        snprintf(p->reason, sizeof p->reason, "%s", mm->reason);
        p->st = mm->retired;
        if (mm->state == MODEL_LOADED && mm->eng) {
            engine_stats live;
            engine_stats_get(mm->eng, &live);
            stats_add(&p->st, &live);
        }
        if (mm->state == MODEL_LOADED && mm->m)
            p->has_experts = model_experts_stats_get(mm->m, &p->xs) == 0;
        const srv_model_metrics *m = &mm->met;
        p->gen_started = atomic_load(&m->gen_started);
        p->gen_finished = atomic_load(&m->gen_finished);
        p->gen_failed = atomic_load(&m->gen_failed);
        p->prompt_tokens = atomic_load(&m->prompt_tokens);
        p->completion_tokens = atomic_load(&m->completion_tokens);
        p->cached_tokens = atomic_load(&m->cached_tokens);
        p->loads = atomic_load(&m->loads);
        p->load_failures = atomic_load(&m->load_failures);
        p->evictions = atomic_load(&m->evictions);
        p->unloads = atomic_load(&m->unloads);
        p->rejected_no_room = atomic_load(&m->rejected_no_room);
        p->load_ms = atomic_load(&m->load_ms_total);
    }
    pthread_mutex_unlock(&s->pool_mu);
    return v;
}

static int resident(srv_model_state st) { return st == MODEL_LOADED || st == MODEL_UNLOADING; }

/* ---- /v1/models ---- */

static json_object *entry_json(tern_server *s, const model_snap *p)
{
    json_object *m = json_object_new_object(), *mem = json_object_new_object();
    json_object_object_add(m, "id", api_json_string(p->name, strlen(p->name)));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64(s->started));
    json_object_object_add(m, "owned_by", json_object_new_string("tern"));
    if (p->ctx_size > 0)
        json_object_object_add(m, "max_model_len", json_object_new_int(p->ctx_size));
    json_object_object_add(m, "state", json_object_new_string(models_state_name(p->state)));
    if (p->reason[0] && (p->state == MODEL_FAILED || p->state == MODEL_UNLOADED))
        json_object_object_add(m, "reason", api_json_string(p->reason, strlen(p->reason)));
    json_object_object_add(m, "pinned", json_object_new_boolean(p->pinned));
    json_object_object_add(m, "active_requests", json_object_new_int(p->refs));
    json_object_object_add(mem, "weights_bytes", json_object_new_int64((long long)p->weights_bytes));
    json_object_object_add(mem, "kv_bytes", json_object_new_int64((long long)p->kv_bytes));
    json_object_object_add(mem, "adapters_bytes", json_object_new_int64((long long)p->lora_bytes));
    json_object_object_add(m, "memory", mem);
    return m;
}

static enum MHD_Result reply_entry(srv_conn *c, srv_model *mm)
{
    model_snap *v = snap_all(c->s);
    if (!v)
        return MHD_NO;
    int i = 0;
    while (c->s->models[i] != mm)
        i++;
    json_object *o = entry_json(c->s, &v[i]);
    free(v);
    return http_reply_json(c, 200, api_json_take(o));
}

/* {"model": ID} -> the model (resolve's 404 when unknown). */
static srv_model *body_model(srv_conn *c, api_error *e)
{
    tern_err je;
    json_object *root = tern_json_parse(c->body.data ? c->body.data : "", c->body.len, &je), *v = NULL;
    srv_model *mm = NULL;
    if (!root || !json_object_is_type(root, json_type_object)) {
        api_bad(e, root ? "invalid_type" : "invalid_json", NULL, "the body must be a JSON object {\"model\": ID}");
        goto out;
    }
    json_object_object_foreach(root, k, val) {
        if (strcmp(k, "model") != 0) {
            api_bad(e, "unsupported_parameter", k, "Unsupported parameter: '%.60s' (the body is {\"model\": ID})", k);
            goto out;
        }
        v = val;
    }
    if (!v || !json_object_is_type(v, json_type_string) || !json_object_get_string_len(v)) {
        api_bad(e, v ? "invalid_type" : "missing_required_parameter", "model", "'model' must name a model");
        goto out;
    }
    mm = models_resolve(c->s, json_object_get_string(v), e);
out:
    json_object_put(root);
    return mm;
}

enum MHD_Result models_route_serve(srv_conn *c, const char *method, const char *url)
{
    tern_server *s = c->s;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    api_error e;
    const char *id = !strncmp(url, "/v1/models/", 11) ? url + 11 : NULL;
    if (!strcmp(method, "POST") && id && (!strcmp(id, "load") || !strcmp(id, "unload"))) {
        srv_model *mm = body_model(c, &e);
        if (!mm)
            return http_reply_error(c, &e);
        http_timeout_lift(c); /* a load may take long */
        if (id[0] == 'l' ? models_load(s, mm, &e) : models_unload(s, mm, &e))
            return http_reply_error(c, &e);
        return reply_entry(c, mm);
    }
    if (!get) {
        api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.20s is not allowed on %.200s",
                      method, url);
        return http_reply_error(c, &e);
    }
    if (id) {
        srv_model *mm = models_resolve(s, id, &e);
        return mm ? reply_entry(c, mm) : http_reply_error(c, &e);
    }
    model_snap *v = snap_all(s);
    if (!v)
        return MHD_NO;
    json_object *o = json_object_new_object(), *data = json_object_new_array();
    json_object_object_add(o, "object", json_object_new_string("list"));
    for (int i = 0; i < s->n_models; i++)
        json_object_array_add(data, entry_json(s, &v[i]));
    adapters_models_json(s, data);
    json_object_object_add(o, "data", data);
    free(v);
    return http_reply_json(c, 200, api_json_take(o));
}

/* ---- /stats and /metrics ---- */

static const char *experts_where(int w)
{
    return w == MODEL_EXPERTS_DISK ? "disk" : w == MODEL_EXPERTS_HOST ? "host" : "mapped";
}

/* A mixture's expert residency (--experts-in, --expert-cache) and counters:
 * picks (one per chosen expert per layer per forward) that found the expert
 * resident or not, and the bytes read in and the time it took. Counted on
 * the host forward; "mapped" keeps no counters. */
static json_object *experts_json(const model_experts_stats *x)
{
    json_object *o = json_object_new_object();
    const uint64_t picks = x->hits + x->misses;
    json_object_object_add(o, "where", json_object_new_string(experts_where(x->where)));
#define XI(k, v) json_object_object_add(o, k, json_object_new_int64((long long)(v)))
    XI("hits", x->hits);
    XI("misses", x->misses);
    XI("streamed_bytes", x->streamed_bytes);
    XI("resident_bytes", x->resident_bytes);
    XI("total_bytes", x->total_bytes);
    XI("cache_bytes", x->cache_bytes);
#undef XI
    json_object_object_add(o, "hit_rate", json_object_new_double(picks ? (double)x->hits / (double)picks : 0.0));
    json_object_object_add(o, "stream_seconds", json_object_new_double(x->stream_seconds));
    json_object_object_add(o, "locked", json_object_new_boolean(x->locked));
    return o;
}

json_object *models_stats_json(tern_server *s, engine_stats *total)
{
    memset(total, 0, sizeof *total);
    json_object *o = json_object_new_object();
    model_snap *v = snap_all(s);
    for (int i = 0; v && i < s->n_models; i++) {
        const model_snap *p = &v[i];
        stats_add(total, &p->st);
        json_object *m = json_object_new_object();
        json_object_object_add(m, "state", json_object_new_string(models_state_name(p->state)));
        if (p->reason[0])
            json_object_object_add(m, "reason", api_json_string(p->reason, strlen(p->reason)));
        json_object_object_add(m, "pinned", json_object_new_boolean(p->pinned));
#define MI(k, x) json_object_object_add(m, k, json_object_new_int64((long long)(x)))
        MI("active_requests", p->refs);
        MI("weights_bytes", p->weights_bytes);
        MI("kv_bytes", p->kv_bytes);
        MI("adapters_bytes", p->lora_bytes);
        MI("loads", p->loads);
        MI("load_failures", p->load_failures);
        MI("evictions", p->evictions);
        MI("unloads", p->unloads);
        MI("rejected_no_room", p->rejected_no_room);
        json_object_object_add(m, "load_seconds_total", json_object_new_double(p->load_ms / 1000.0));
        MI("queue_len", p->st.queue_len);
        MI("running", p->st.running);
        MI("requests_total", p->st.requests_total);
        MI("requests_finished", p->st.requests_finished);
        MI("requests_cancelled", p->st.requests_cancelled);
        MI("tokens_prefilled", p->st.tokens_prefilled);
        MI("tokens_decoded", p->st.tokens_decoded);
        MI("prefix_hit_tokens", p->st.prefix_hit_tokens);
        MI("steps", p->st.steps);
        MI("generations_started", p->gen_started);
        MI("generations_finished", p->gen_finished);
        MI("generations_failed", p->gen_failed);
        MI("prompt_tokens", p->prompt_tokens);
        MI("completion_tokens", p->completion_tokens);
        MI("cached_tokens", p->cached_tokens);
#undef MI
        if (p->has_experts)
            json_object_object_add(m, "experts", experts_json(&p->xs));
        json_object_object_add(o, p->name, m);
    }
    free(v);
    return o;
}

/* A label value with \, " and newlines escaped (the exposition format). */
static void label_escape(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (; *in && o + 3 < cap; in++) {
        if (*in == '\\' || *in == '"' || *in == '\n') {
            out[o++] = '\\';
            out[o++] = *in == '\n' ? 'n' : *in;
        } else {
            out[o++] = *in;
        }
    }
    out[o] = 0;
}

static void family(api_buf *b, const char *name, const char *type, const char *help)
{
    char line[512];
    int n = snprintf(line, sizeof line, "# HELP tern_model_%s %s\n# TYPE tern_model_%s %s\n", name, help, name, type);
    if (n > 0)
        api_buf_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void sample(api_buf *b, const char *name, const char *label, const char *extra, double x)
{
    char line[512];
    int n = snprintf(line, sizeof line, "tern_model_%s{model=\"%s\"%s} %.17g\n", name, label, extra, x);
    if (n > 0)
        api_buf_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

void models_prometheus(tern_server *s, api_buf *b)
{
    model_snap *v = snap_all(s);
    if (!v)
        return;
    char (*lab)[160] = calloc((size_t)s->n_models, sizeof *lab);
    if (!lab) {
        free(v);
        return;
    }
    for (int i = 0; i < s->n_models; i++)
        label_escape(v[i].name, lab[i], sizeof lab[i]);
    char line[256];
    int n = snprintf(line, sizeof line,
                     "# HELP tern_max_memory_bytes The model pool's memory limit (0 = none).\n"
                     "# TYPE tern_max_memory_bytes gauge\ntern_max_memory_bytes %zu\n",
                     s->o.max_memory);
    if (n > 0 && (size_t)n < sizeof line)
        api_buf_append(b, line, (size_t)n);
    /* one family at a time, a sample per model */
#define FAM(nm, type, help, expr)                                                                             \
    do {                                                                                                      \
        family(b, nm, type, help);                                                                            \
        for (int i = 0; i < s->n_models; i++) {                                                               \
            const model_snap *p = &v[i];                                                                      \
            sample(b, nm, lab[i], "", (double)(expr));                                                        \
        }                                                                                                     \
    } while (0)
    family(b, "state", "gauge", "1 for the model's current state (unloaded, loading, loaded, unloading, failed).");
    for (int i = 0; i < s->n_models; i++)
        for (int st = MODEL_UNLOADED; st <= MODEL_FAILED; st++) {
            char extra[48];
            snprintf(extra, sizeof extra, ",state=\"%s\"", models_state_name((srv_model_state)st));
            sample(b, "state", lab[i], extra, v[i].state == (srv_model_state)st);
        }
    FAM("pinned", "gauge", "1 when the model is pinned (never evicted).", p->pinned);
    FAM("active_requests", "gauge", "Requests holding the model.", p->refs);
    family(b, "memory_bytes", "gauge", "Memory charged to the model against --max-memory while resident.");
    for (int i = 0; i < s->n_models; i++) {
        int r = resident(v[i].state);
        sample(b, "memory_bytes", lab[i], ",kind=\"weights\"", r ? (double)v[i].weights_bytes : 0);
        sample(b, "memory_bytes", lab[i], ",kind=\"kv\"", r ? (double)v[i].kv_bytes : 0);
        sample(b, "memory_bytes", lab[i], ",kind=\"adapters\"", r ? (double)v[i].lora_bytes : 0);
    }
    FAM("loads_total", "counter", "Times the model was loaded.", p->loads);
    FAM("load_failures_total", "counter", "Loads that failed.", p->load_failures);
    FAM("load_seconds_total", "counter", "Seconds spent loading the model.", p->load_ms / 1000.0);
    FAM("evictions_total", "counter", "Times the model was evicted to make room for another.", p->evictions);
    FAM("unloads_total", "counter", "Times the model was unloaded on request.", p->unloads);
    FAM("rejected_no_room_total", "counter", "Loads refused because the model cannot fit.", p->rejected_no_room);
    FAM("queue_length", "gauge", "Requests waiting for admission.", p->st.queue_len);
    FAM("running_requests", "gauge", "Requests in the running batch.", p->st.running);
    FAM("engine_requests_total", "counter", "Requests submitted to the model's engine.", p->st.requests_total);
    FAM("prompt_tokens_prefilled_total", "counter", "Prompt tokens run through the model.", p->st.tokens_prefilled);
    FAM("tokens_decoded_total", "counter", "Tokens generated.", p->st.tokens_decoded);
    FAM("prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the prefix cache.",
        p->st.prefix_hit_tokens);
    FAM("engine_steps_total", "counter", "Batched forward steps.", p->st.steps);
    FAM("generations_started_total", "counter", "Choices submitted by HTTP generation requests.", p->gen_started);
    FAM("generations_finished_total", "counter", "Choices finished.", p->gen_finished);
    FAM("generations_failed_total", "counter", "Choices that ended in an engine error.", p->gen_failed);
    FAM("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", p->prompt_tokens);
    FAM("completion_tokens_total", "counter", "Completion tokens returned.", p->completion_tokens);
#undef FAM
    /* a mixture of experts' residency counters, for the loaded ones */
#define XFAM(nm, type, help, expr)                                                                            \
    do {                                                                                                      \
        family(b, nm, type, help);                                                                            \
        for (int i = 0; i < s->n_models; i++)                                                                 \
            if (v[i].has_experts) {                                                                           \
                const model_experts_stats *x = &v[i].xs;                                                      \
                char extra[48];                                                                               \
                snprintf(extra, sizeof extra, ",where=\"%s\"", experts_where(x->where));                      \
                sample(b, nm, lab[i], extra, (double)(expr));                                                 \
            }                                                                                                 \
    } while (0)
    int any_x = 0;
    for (int i = 0; i < s->n_models; i++)
        any_x |= v[i].has_experts;
    if (any_x) {
        XFAM("expert_hits_total", "counter", "Expert picks that found the expert resident.", x->hits);
        XFAM("expert_misses_total", "counter", "Expert picks that read the expert in.", x->misses);
        XFAM("expert_streamed_bytes_total", "counter", "Expert bytes read in (misses, and host's load).",
             x->streamed_bytes);
        XFAM("expert_stream_seconds_total", "counter", "Seconds spent reading experts in.", x->stream_seconds);
        XFAM("expert_resident_bytes", "gauge", "Expert bytes held resident now.", x->resident_bytes);
    }
#undef XFAM
    free(lab);
    free(v);
}
