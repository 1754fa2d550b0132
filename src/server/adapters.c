/* LoRA adapters over HTTP (docs/lora.md): adapters registered per base model
 * (--lora [BASE:]NAME=DIR, POST /v1/load_lora_adapter, vLLM's shape), a
 * request's `model` naming one ("NAME", or "BASE:NAME") resolving to its
 * base, the adapter handed to the engine with the request, adapters listed
 * in /v1/models, and per-adapter counters in /stats and /metrics.
 *
 * An adapter is read against a loaded base (model_lora_load) and kept with
 * the base's load generation: when the pool evicts and reloads the base, the
 * next request reads the adapter again. Records live as long as the server
 * (an unloaded adapter is marked so, its counters kept), so a request and
 * the counters can point at one without a reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/lora.h"
#include "server/server_int.h"

struct srv_adapter {
    char *name, *dir;
    srv_model *base;
    int removed;            /* unloaded through the API (listed no more) */
    /* under s->adapters_mu */
    model_lora *lora;       /* read against base->m at load generation gen, or NULL */
    const tern_model *for_m;
    long long gen;
    atomic_llong requests, failed, prompt_tokens, completion_tokens, cached_tokens, loads;
};

void adapters_init(tern_server *s) { pthread_mutex_init(&s->adapters_mu, NULL); }

void adapters_free(tern_server *s)
{
    for (int i = 0; i < s->n_adapters; i++) {
        srv_adapter *a = s->adapters[i];
        model_lora_release(a->lora);
        free(a->name);
        free(a->dir);
        free(a);
    }
    free(s->adapters);
    s->adapters = NULL;
    s->n_adapters = 0;
    pthread_mutex_destroy(&s->adapters_mu);
}

/* The live adapter NAME of base (NULL: of any base), under adapters_mu. */
static srv_adapter *find(tern_server *s, const srv_model *base, const char *name, size_t len)
{
    for (int i = 0; i < s->n_adapters; i++) {
        srv_adapter *a = s->adapters[i];
        if (!a->removed && (!base || a->base == base) && strlen(a->name) == len && !strncmp(a->name, name, len))
            return a;
    }
    return NULL;
}

/* The base a `model` string names when it is no model's name: "BASE:NAME"
 * with NAME an adapter of BASE, or NAME an adapter's own name. */
srv_model *adapters_resolve(tern_server *s, const char *name)
{
    srv_model *base = NULL;
    const char *colon = strchr(name, ':');
    pthread_mutex_lock(&s->adapters_mu);
    if (colon) {
        for (int i = 0; i < s->n_models && !base; i++)
            if (strlen(s->models[i]->name) == (size_t)(colon - name) &&
                !strncmp(s->models[i]->name, name, (size_t)(colon - name)) &&
                find(s, s->models[i], colon + 1, strlen(colon + 1)))
                base = s->models[i];
    }
    if (!base) {
        srv_adapter *a = find(s, NULL, name, strlen(name));
        base = a ? a->base : NULL;
    }
    pthread_mutex_unlock(&s->adapters_mu);
    return base;
}

/* a->lora becomes l (NULL: none), its bytes charged to the base (under
 * adapters_mu). */
static void lora_set(srv_adapter *a, model_lora *l)
{
    if (a->lora)
        atomic_fetch_sub(&a->base->lora_bytes, (long long)model_lora_bytes(a->lora));
    model_lora_release(a->lora);
    a->lora = l;
    if (l)
        atomic_fetch_add(&a->base->lora_bytes, (long long)model_lora_bytes(l));
}

void adapters_base_down(tern_server *s, srv_model *base)
{
    pthread_mutex_lock(&s->adapters_mu);
    for (int i = 0; i < s->n_adapters; i++)
        if (s->adapters[i]->base == base)
            lora_set(s->adapters[i], NULL);
    pthread_mutex_unlock(&s->adapters_mu);
}

/* Reads a's adapter against its base's current model (under adapters_mu);
 * *fresh set when it was read now (its bytes newly charged). */
static int adapter_read(srv_adapter *a, int *fresh, tern_err *err)
{
    srv_model *mm = a->base;
    long long gen = atomic_load(&mm->met.loads);
    *fresh = 0;
    if (a->lora && a->for_m == mm->m && a->gen == gen)
        return 0;
    lora_set(a, NULL);
    lora_set(a, model_lora_load(mm->m, a->dir, err));
    if (!a->lora)
        return err->code ? err->code : TERN_EFORMAT;
    *fresh = 1;
    a->for_m = mm->m;
    a->gen = gen;
    atomic_fetch_add(&a->loads, 1);
    return 0;
}

/* An adapter just read (l, a's) is charged to its base: room is made in
 * --max-memory by evicting idle models, else it is dropped again and the
 * request refused (503 model_cannot_fit with the sizes). */
static int adapter_room(tern_server *s, srv_adapter *a, const model_lora *l, api_error *e)
{
    char what[256], why[TERN_ERR_MSG_MAX];
    snprintf(what, sizeof what, "adapter '%.200s'", a->name);
    if (!models_room(s, a->base, what, model_lora_bytes(l), why, sizeof why))
        return 0;
    pthread_mutex_lock(&s->adapters_mu);
    if (a->lora == l)
        lora_set(a, NULL);
    pthread_mutex_unlock(&s->adapters_mu);
    return api_error_set(e, 503, "server_error", "model_cannot_fit", "model", "%s", why);
}

int adapters_acquire(srv_model *mm, const char *name, srv_adapter **out, model_lora **lora, api_error *e)
{
    tern_server *s = mm->s;
    *out = NULL;
    *lora = NULL;
    if (!name || !name[0] || !strcmp(name, mm->name))
        return 0;
    size_t bl = strlen(mm->name);
    const char *an = !strncmp(name, mm->name, bl) && name[bl] == ':' ? name + bl + 1 : name;
    pthread_mutex_lock(&s->adapters_mu);
    srv_adapter *a = find(s, mm, an, strlen(an));
    tern_err te = {0};
    int rc = 0, fresh = 0;
    if (!a) {
        rc = api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                           "The model '%.200s' does not exist (see GET /v1/models)", name);
    } else if (model_lora_supported(mm->m, &te)) {
        rc = api_bad(e, "unsupported_device", "model", "adapter '%.100s': %s", a->name, te.msg);
    } else if (adapter_read(a, &fresh, &te)) {
        rc = api_bad(e, "adapter_load_failed", "model", "%s", te.msg);
    } else {
        model_lora_retain(a->lora);
        *lora = a->lora;
        *out = a;
    }
    pthread_mutex_unlock(&s->adapters_mu);
    if (!rc && fresh && (rc = adapter_room(s, a, *lora, e))) {
        model_lora_release(*lora);
        *lora = NULL;
        *out = NULL;
    }
    return rc ? -1 : 0;
}

void adapters_count_start(srv_adapter *a, int n_choices, long long prompt_tokens)
{
    if (!a)
        return;
    atomic_fetch_add(&a->requests, n_choices);
    atomic_fetch_add(&a->prompt_tokens, prompt_tokens);
}

void adapters_count_finish(srv_adapter *a, const engine_usage *u, int failed)
{
    if (!a)
        return;
    atomic_fetch_add(&a->completion_tokens, u->n_generated);
    atomic_fetch_add(&a->cached_tokens, u->n_cached);
    if (failed)
        atomic_fetch_add(&a->failed, 1);
}

/* Registers NAME (unique among models and live adapters) for base; reads it
 * now when the base is loaded. */
static int adapter_add(tern_server *s, srv_model *base, const char *name, const char *dir, api_error *e)
{
    if (!name[0] || strchr(name, ':') || strlen(name) > 200)
        return api_bad(e, "invalid_value", "lora_name", "an adapter name must be 1 to 200 characters without ':'");
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i]->name, name))
            return api_bad(e, "invalid_value", "lora_name", "'%.200s' is a model's name", name);
    pthread_mutex_lock(&s->adapters_mu);
    int rc = 0;
    srv_adapter *a = NULL;
    model_lora *l = NULL; /* read now: charged once the lock is dropped */
    if (find(s, NULL, name, strlen(name))) {
        rc = api_bad(e, "invalid_value", "lora_name", "The lora adapter '%.200s' has already been loaded.", name);
        goto out;
    }
    for (int i = 0; i < s->n_adapters && !a; i++) /* a name unloaded before: its record and counters again */
        if (!strcmp(s->adapters[i]->name, name))
            a = s->adapters[i];
    if (!a) {
        srv_adapter **na = realloc(s->adapters, (size_t)(s->n_adapters + 1) * sizeof *na);
        if (na)
            s->adapters = na;
        a = na ? calloc(1, sizeof *a) : NULL;
        if (a && !(a->name = strdup(name))) {
            free(a);
            a = NULL;
        }
        if (!a) {
            rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
        s->adapters[s->n_adapters++] = a;
    }
    lora_set(a, NULL);
    free(a->dir);
    a->dir = strdup(dir);
    a->base = base;
    a->removed = 1; /* listed once read */
    tern_err te = {0};
    int fresh = 0;
    if (!a->dir) {
        rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    } else if (base->m && adapter_read(a, &fresh, &te)) {
        rc = api_bad(e, "adapter_load_failed", "lora_path", "%s", te.msg);
    } else {
        a->removed = 0;
    }
    l = fresh ? a->lora : NULL;
out:
    pthread_mutex_unlock(&s->adapters_mu);
    if (!rc && l && (rc = adapter_room(s, a, l, e))) {
        pthread_mutex_lock(&s->adapters_mu);
        a->removed = 1; /* not added: as if never asked */
        pthread_mutex_unlock(&s->adapters_mu);
    }
    return rc ? -1 : 0;
}

int adapters_add_spec(tern_server *s, const char *spec, tern_err *err)
{
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return tern_err_set(err, TERN_EINVAL, "--lora %s: expected [BASE:]NAME=DIR", spec);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(eq - spec < 255 ? eq - spec : 255), spec);
    srv_model *base = s->models[0];
    char *colon = strchr(name, ':');
    if (colon) {
        *colon = 0;
        base = NULL;
        for (int i = 0; i < s->n_models && !base; i++)
            if (!strcmp(s->models[i]->name, name))
                base = s->models[i];
        if (!base)
            return tern_err_set(err, TERN_EINVAL, "--lora %s: '%s' names no served model", spec, name);
        memmove(name, colon + 1, strlen(colon + 1) + 1);
    }
    api_error e;
    if (adapter_add(s, base, name, eq + 1, &e))
        return tern_err_set(err, TERN_EINVAL, "--lora %s: %s", spec, e.msg);
    return 0;
}

/* ---- POST /v1/load_lora_adapter, /v1/unload_lora_adapter ---- */

enum MHD_Result adapters_route_serve(srv_conn *c, const char *url)
{
    tern_server *s = c->s;
    int load = !strcmp(url, "/v1/load_lora_adapter");
    api_error e;
    tern_err je;
    json_object *root = tern_json_parse(c->body.data ? c->body.data : "", c->body.len, &je);
    const char *name = NULL, *path = NULL, *model = NULL;
    srv_model *base = NULL;
    char msg[400];
    if (!root || !json_object_is_type(root, json_type_object)) {
        api_bad(&e, root ? "invalid_type" : "invalid_json", NULL, "the body must be a JSON object");
        goto fail;
    }
    json_object_object_foreach(root, k, v) {
        const char **dst = !strcmp(k, "lora_name") ? &name : !strcmp(k, "lora_path") && load ? &path
                           : !strcmp(k, "model") ? &model : NULL;
        if (!dst) {
            api_bad(&e, "unsupported_parameter", k, "Unsupported parameter: '%.60s'", k);
            goto fail;
        }
        if (!json_object_is_type(v, json_type_string)) {
            api_bad(&e, "invalid_type", k, "'%.60s' must be a string", k);
            goto fail;
        }
        *dst = json_object_get_string(v);
    }
    if (!name || (load && !path)) {
        api_bad(&e, "missing_required_parameter", !name ? "lora_name" : "lora_path", "'%s' is required",
                !name ? "lora_name" : "lora_path");
        goto fail;
    }
    if (model && !(base = models_resolve(s, model, &e)))
        goto fail;
    if (load) {
        if (!base)
            base = s->models[0];
        http_timeout_lift(c);
        if (models_acquire(s, base, &e)) /* the adapter is read against the loaded base */
            goto fail;
        int rc = adapter_add(s, base, name, path, &e);
        models_release(base);
        if (rc)
            goto fail;
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' added successfully.", name);
    } else {
        pthread_mutex_lock(&s->adapters_mu);
        srv_adapter *a = find(s, base, name, strlen(name));
        if (a) { /* requests that hold it keep their reference */
            a->removed = 1;
            lora_set(a, NULL);
        }
        pthread_mutex_unlock(&s->adapters_mu);
        if (!a) {
            api_error_set(&e, 404, "invalid_request_error", "model_not_found", "lora_name",
                          "The lora adapter '%.200s' cannot be found.", name);
            goto fail;
        }
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' removed successfully.", name);
    }
    json_object_put(root);
    return http_reply(c, 200, "text/plain; charset=utf-8", msg, strlen(msg), MHD_RESPMEM_MUST_COPY);
fail:
    json_object_put(root);
    return http_reply_error(c, &e);
}

/* ---- /v1/models, /stats, /metrics ---- */

void adapters_models_json(tern_server *s, json_object *data)
{
    pthread_mutex_lock(&s->adapters_mu);
    for (int i = 0; i < s->n_adapters; i++) {
        const srv_adapter *a = s->adapters[i];
        if (a->removed)
            continue;
        json_object *m = json_object_new_object();
        json_object_object_add(m, "id", api_json_string(a->name, strlen(a->name)));
        json_object_object_add(m, "object", json_object_new_string("model"));
        json_object_object_add(m, "created", json_object_new_int64(s->started));
        json_object_object_add(m, "owned_by", json_object_new_string("tern"));
        json_object_object_add(m, "root", api_json_string(a->dir, strlen(a->dir)));
        json_object_object_add(m, "parent", api_json_string(a->base->name, strlen(a->base->name)));
        json_object_object_add(m, "kind", json_object_new_string("lora"));
        if (a->lora) {
            json_object_object_add(m, "rank", json_object_new_int(model_lora_rank(a->lora)));
            json_object_object_add(m, "bytes", json_object_new_int64((long long)model_lora_bytes(a->lora)));
        }
        json_object_array_add(data, m);
    }
    pthread_mutex_unlock(&s->adapters_mu);
}

json_object *adapters_stats_json(tern_server *s)
{
    json_object *o = json_object_new_object();
    pthread_mutex_lock(&s->adapters_mu);
    for (int i = 0; i < s->n_adapters; i++) {
        srv_adapter *a = s->adapters[i];
        json_object *m = json_object_new_object();
        json_object_object_add(m, "parent", api_json_string(a->base->name, strlen(a->base->name)));
        json_object_object_add(m, "loaded", json_object_new_boolean(!a->removed));
#define AI(k, x) json_object_object_add(m, k, json_object_new_int64(atomic_load(&a->x)))
        AI("requests", requests);
        AI("failed", failed);
        AI("prompt_tokens", prompt_tokens);
        AI("completion_tokens", completion_tokens);
        AI("cached_tokens", cached_tokens);
        AI("reads", loads);
#undef AI
        json_object_object_add(o, a->name, m);
    }
    pthread_mutex_unlock(&s->adapters_mu);
    return o;
}

void adapters_prometheus(tern_server *s, api_buf *b)
{
    static const char *const fam[][3] = {
        {"requests_total", "counter", "Choices generated with the adapter."},
        {"failed_total", "counter", "Choices with the adapter that ended in an error."},
        {"prompt_tokens_total", "counter", "Prompt tokens of requests with the adapter."},
        {"completion_tokens_total", "counter", "Completion tokens generated with the adapter."},
        {"cached_tokens_total", "counter", "Prompt tokens reused from the prefix cache under the adapter."},
    };
    pthread_mutex_lock(&s->adapters_mu);
    for (size_t f = 0; s->n_adapters && f < sizeof fam / sizeof fam[0]; f++) {
        char line[600];
        int n = snprintf(line, sizeof line, "# HELP tern_lora_%s %s\n# TYPE tern_lora_%s %s\n", fam[f][0], fam[f][2],
                         fam[f][0], fam[f][1]);
        if (n > 0 && (size_t)n < sizeof line)
            api_buf_append(b, line, (size_t)n);
        for (int i = 0; i < s->n_adapters; i++) {
            srv_adapter *a = s->adapters[i];
            long long v = f == 0 ? atomic_load(&a->requests) : f == 1 ? atomic_load(&a->failed)
                        : f == 2 ? atomic_load(&a->prompt_tokens) : f == 3 ? atomic_load(&a->completion_tokens)
                                                                          : atomic_load(&a->cached_tokens);
            char ln[200], pn[200];
            size_t k = 0;
            for (const char *p = a->name; *p && k + 3 < sizeof ln; p++) { /* label escaping */
                if (*p == '\\' || *p == '"' || *p == '\n')
                    ln[k++] = '\\';
                ln[k++] = *p == '\n' ? 'n' : *p;
            }
            ln[k] = 0;
            k = 0;
            for (const char *p = a->base->name; *p && k + 3 < sizeof pn; p++) {
                if (*p == '\\' || *p == '"' || *p == '\n')
                    pn[k++] = '\\';
                pn[k++] = *p == '\n' ? 'n' : *p;
            }
            pn[k] = 0;
            n = snprintf(line, sizeof line, "tern_lora_%s{adapter=\"%s\",model=\"%s\"} %lld\n", fam[f][0], ln, pn, v);
            if (n > 0 && (size_t)n < sizeof line)
                api_buf_append(b, line, (size_t)n);
        }
    }
    pthread_mutex_unlock(&s->adapters_mu);
}
