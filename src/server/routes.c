/* Routes: which URL does what, and the two generation endpoints from a
 * validated request to engine requests: chat template, tokenization,
 * context checks, then a JSON reply or an SSE stream (gen.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/responses.h"
#include "server/server_int.h"
#include "server/structured.h"
#include "server/toolcall.h"
#include "template/template.h"

/* The chat page, embedded from web/ by tools/embed.cmake. */
typedef struct tern_asset {
    const char *path;
    const unsigned char *data;
    size_t len;
} tern_asset;
extern const tern_asset tern_assets[];

const char *const srv_route_names[ROUTE_N] = {"chat_completions", "completions", "embeddings", "responses", "models",
                                              "health", "stats", "metrics", "tokenize", "detokenize",
                                              "version", "page", "other"};

srv_route routes_classify(const char *url)
{
    if (!strcmp(url, "/v1/chat/completions"))
        return ROUTE_CHAT;
    if (!strcmp(url, "/v1/completions"))
        return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/embeddings"))
        return ROUTE_EMBEDDINGS;
    if (!strcmp(url, "/v1/responses"))
        return ROUTE_RESPONSES;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11) || !strcmp(url, "/v1/load_lora_adapter") ||
        !strcmp(url, "/v1/unload_lora_adapter"))
        return ROUTE_MODELS;
    if (!strcmp(url, "/health"))
        return ROUTE_HEALTH;
    if (!strcmp(url, "/stats"))
        return ROUTE_STATS;
    if (!strcmp(url, "/metrics"))
        return ROUTE_METRICS;
    if (!strcmp(url, "/tokenize"))
        return ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize"))
        return ROUTE_DETOKENIZE;
    if (!strcmp(url, "/version"))
        return ROUTE_VERSION;
    if (strncmp(url, "/v1/", 4) != 0)
        return ROUTE_PAGE;
    return ROUTE_OTHER;
}

int routes_keyed(srv_route route)
{
    return route == ROUTE_TOKENIZE || route == ROUTE_DETOKENIZE || route == ROUTE_VERSION;
}

static const char *content_type(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot)
        return "application/octet-stream";
    if (!strcmp(dot, ".html"))
        return "text/html; charset=utf-8";
    if (!strcmp(dot, ".js"))
        return "text/javascript; charset=utf-8";
    if (!strcmp(dot, ".css"))
        return "text/css; charset=utf-8";
    if (!strcmp(dot, ".svg"))
        return "image/svg+xml";
    if (!strcmp(dot, ".png"))
        return "image/png";
    if (!strcmp(dot, ".ico"))
        return "image/x-icon";
    return "application/octet-stream";
}

static enum MHD_Result serve_asset(srv_conn *c, const char *url)
{
    const char *path = !strcmp(url, "/") ? "/index.html" : url;
    for (const tern_asset *a = tern_assets; a->path; a++)
        if (!strcmp(a->path, path)) {
            struct MHD_Response *r =
                MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
            if (!r)
                return MHD_NO;
            MHD_add_response_header(r, "Content-Type", content_type(path));
            MHD_add_response_header(r, "Cache-Control", "no-cache");
            MHD_add_response_header(r, "Content-Security-Policy",
                                    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:");
            return http_reply_response(c, 200, r);
        }
    api_error e;
    api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "no such page: %.200s", url);
    return http_reply_error(c, &e);
}

/* ---- prompts ---- */

static int encode(srv_model *mm, const char *text, size_t len, int add_special, int32_t **ids, size_t *n,
                  api_error *e)
{
    tern_err te;
    if (tokenizer_encode(mm->tok, text, len, add_special, ids, n, &te))
        return api_bad(e, "invalid_value", NULL, "cannot tokenize the prompt: %s", te.msg);
    return 0;
}

/* The messages as a harmony template gets them: gpt-oss's template has one
 * slot for the text of a tool-calling turn (its analysis) and refuses a turn
 * with both content and a thought, which is what a preamble (content),
 * its thought and its calls echoed back make; the preamble joins the
 * thought there. Other messages are shared. A new reference. */
static json_object *harmony_messages(json_object *msgs)
{
    json_object *out = json_object_new_array();
    for (size_t i = 0; out && i < json_object_array_length(msgs); i++) {
        json_object *m = json_object_array_get_idx(msgs, i), *calls = NULL, *c = NULL, *t = NULL;
        if (!json_object_object_get_ex(m, "tool_calls", &calls) || !json_object_array_length(calls) ||
            !json_object_object_get_ex(m, "content", &c) || !json_object_is_type(c, json_type_string) ||
            !json_object_get_string_len(c) || !json_object_object_get_ex(m, "thinking", &t) ||
            !json_object_is_type(t, json_type_string) || !json_object_get_string_len(t)) {
            json_object_array_add(out, json_object_get(m));
            continue;
        }
        json_object *nm = json_object_new_object();
        json_object_object_foreach(m, k, v) json_object_object_add(nm, k, json_object_get(v));
        size_t n = (size_t)json_object_get_string_len(t) + (size_t)json_object_get_string_len(c) + 3;
        char *joined = malloc(n);
        if (joined) {
            int l = snprintf(joined, n, "%s\n\n%s", json_object_get_string(t), json_object_get_string(c));
            json_object_object_add(nm, "thinking", json_object_new_string_len(joined, l));
            json_object_object_add(nm, "reasoning_content", json_object_new_string_len(joined, l));
            json_object_object_add(nm, "content", json_object_new_string(""));
            free(joined);
        }
        json_object_array_add(out, nm);
    }
    return out;
}

static char *render_chat(srv_model *mm, const api_request *q, int add_gen, size_t *len, api_error *e)
{
    if (!mm->chat.tpl) {
        api_bad(e, "no_chat_template", "messages", "this model has no chat template; use /v1/completions");
        return NULL;
    }
    json_object *rq = json_object_new_object();
    if (!rq) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    if (q->template_kwargs) {
        json_object_object_foreach(q->template_kwargs, k, v) json_object_object_add(rq, k, json_object_get(v));
    }
    /* reasoning_effort's switch, unless the kwargs say it themselves */
    if (q->enable_thinking >= 0 && !json_object_object_get_ex(rq, "enable_thinking", NULL))
        json_object_object_add(rq, "enable_thinking", json_object_new_boolean(q->enable_thinking));
    /* reasoning_effort as sent (gpt-oss's template writes "Reasoning: low|medium|high"; it knows no lower
     * level, so none and minimal reach a harmony template as low and the budget does the rest) */
    if (q->reasoning_effort && !json_object_object_get_ex(rq, "reasoning_effort", NULL)) {
        const char *eff = q->reasoning_effort;
        if (mm->has_harmony && (!strcmp(eff, "none") || !strcmp(eff, "minimal")))
            eff = "low";
        json_object_object_add(rq, "reasoning_effort", json_object_new_string(eff));
    }
    json_object_object_add(rq, "messages", mm->has_harmony ? harmony_messages(q->messages) : json_object_get(q->messages));
    if (q->tools)
        json_object_object_add(rq, "tools", json_object_get(q->tools));
    json_object_object_add(rq, "add_generation_prompt", json_object_new_boolean(add_gen));
    tern_err te;
    char *text = tern_chat_template_apply(&mm->chat, rq, NULL, len, &te);
    json_object_put(rq);
    if (!text)
        api_bad(e, "template_error", "messages", "chat template: %s", te.msg);
    return text;
}

/* Builds the prompt ids of a request; *boundary is where the KV stays worth
 * caching (chat: the end of the conversation before the generation primer,
 * which the next turn's prompt shares). */
static int build_prompt(srv_model *mm, const api_request *q, int32_t **ids, size_t *n, size_t *boundary,
                        char **echo, api_error *e)
{
    *ids = NULL;
    *n = *boundary = 0;
    *echo = NULL;
    if (q->kind == API_CHAT) {
        size_t len;
        char *text = render_chat(mm, q, q->add_generation_prompt, &len, e);
        if (!text)
            return -1;
        int rc = encode(mm, text, len, 0, ids, n, e);
        free(text);
        if (rc)
            return -1;
        if (q->add_generation_prompt) {
            int32_t *pre = NULL;
            size_t n_pre = 0;
            api_error ignore;
            char *t2 = render_chat(mm, q, 0, &len, &ignore);
            if (t2 && !encode(mm, t2, len, 0, &pre, &n_pre, &ignore) && n_pre <= *n &&
                !memcmp(pre, *ids, n_pre * sizeof *pre))
                *boundary = n_pre;
            free(t2);
            free(pre);
        }
        return 0;
    }
    if (q->prompt_ids) {
        *ids = malloc((q->n_prompt_ids ? q->n_prompt_ids : 1) * sizeof **ids);
        if (!*ids)
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, q->prompt_ids, q->n_prompt_ids * sizeof **ids);
        *n = q->n_prompt_ids;
        if (q->echo) {
            tern_err te;
            size_t l;
            if (tokenizer_decode(mm->tok, *ids, *n, 0, echo, &l, &te))
                return api_bad(e, "invalid_value", "prompt", "cannot decode the prompt: %s", te.msg);
        }
        return 0;
    }
    if (q->echo && !(*echo = strndup(q->prompt, q->prompt_len)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return encode(mm, q->prompt, q->prompt_len, 1, ids, n, e);
}

static int check_context(srv_model *mm, const api_request *q, size_t n, api_error *e)
{
    const char *param = q->kind == API_CHAT ? "messages" : "prompt";
    if (n == 0)
        return api_bad(e, "invalid_value", param, "the prompt is empty");
    if (n >= (size_t)mm->ctx_size)
        return api_bad(e, "context_length_exceeded", param,
                       "This model's maximum context length is %d tokens. However, your prompt has %zu tokens.",
                       mm->ctx_size, n);
    if (q->max_tokens > 0 && n + (size_t)q->max_tokens > (size_t)mm->ctx_size)
        return api_bad(e, "context_length_exceeded", q->kind == API_CHAT ? "max_completion_tokens" : "max_tokens",
                       "This model's maximum context length is %d tokens. However, you requested %zu tokens "
                       "(%zu in the prompt, %d for the completion).",
                       mm->ctx_size, n + (size_t)q->max_tokens, n, q->max_tokens);
    return 0;
}

/* A generation request from its body; resp (taken, may be NULL) makes it a
 * Responses API reply over the chat body it was translated into. */
static enum MHD_Result serve_generate_body(srv_conn *c, api_kind kind, const char *body, size_t len, resp_state *resp)
{
    tern_server *s = c->s;
    api_request q;
    api_error e;
    /* the model first: the body is checked against its vocabulary */
    srv_model *mm = models_acquire_body(s, body, len, &e);
    if (!mm) {
        responses_state_free(resp);
        return http_reply_error(c, &e);
    }
    api_limits lim = {.n_vocab = model_config_get(mm->m)->n_vocab};
    if (api_parse(&q, kind, body, len, &lim, &e)) {
        models_release(mm);
        responses_state_free(resp);
        return http_reply_error(c, &e);
    }
    q.reasoning_budget = reasoning_budget_combine(q.reasoning_budget, s->o.reasoning_budget);
    if (q.ignored[0]) { /* unknown fields: ignored, and said so */
        char clean[160];
        snprintf(clean, sizeof clean, "%s", q.ignored);
        for (char *p = clean; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\' || (unsigned char)*p >= 0x7f)
                *p = '?';
        snprintf(c->warning, sizeof c->warning, "299 tern \"unknown fields ignored: %s\"", clean);
    }
    if (structured_prepare_request(mm, &q, http_client_fd(c), c->t_start, c->warning, &e)) { /* on the compile pool */
        api_request_free(&q);
        models_release(mm);
        responses_state_free(resp);
        return e.status == 499 ? MHD_NO : http_reply_error(c, &e);
    }
    /* one prompt, or each of a batch's (completions) */
    int n_pr = q.n_batch ? q.n_batch : 1, rc = 0;
    gen_prompt pr[API_MAX_N];
    memset(pr, 0, sizeof pr);
    api_prompt *batch = q.batch;
    for (int b = 0; b < n_pr && !rc; b++) {
        if (batch) {
            q.prompt = batch[b].text;
            q.prompt_len = batch[b].len;
            q.prompt_ids = batch[b].ids;
            q.n_prompt_ids = batch[b].n_ids;
        }
        int32_t *ids;
        char *echo;
        rc = build_prompt(mm, &q, &ids, &pr[b].n, &pr[b].cache_boundary, &echo, &e) ||
             check_context(mm, &q, pr[b].n, &e);
        pr[b].ids = ids;
        pr[b].echo = echo;
    }
    if (batch) { /* the batch owns its ids */
        q.prompt = NULL;
        q.prompt_ids = NULL;
        q.n_prompt_ids = 0;
    }
    int stream = q.stream;
    gen_job *j = NULL;
    if (!rc) {
        http_timeout_lift(c);
        rc = gen_start(mm, &q, pr, n_pr, http_client_fd(c), &j, &e); /* takes the model's reference */
    } else {
        api_request_free(&q);
        models_release(mm);
    }
    for (int b = 0; b < n_pr; b++) {
        free((void *)pr[b].ids);
        free((void *)pr[b].echo);
    }
    if (rc) {
        responses_state_free(resp);
        return http_reply_error(c, &e);
    }
    if (resp)
        gen_set_responses(j, resp);
    if (stream)
        return gen_stream(c, j);
    char *json = NULL;
    rc = gen_collect(j, &json, &e);
    gen_access(j, &c->acc);
    gen_free(j);
    if (rc)
        return e.status == 499 ? MHD_NO : http_reply_error(c, &e);
    return http_reply_json(c, 200, json);
}

static enum MHD_Result serve_generate(srv_conn *c, api_kind kind)
{
    return serve_generate_body(c, kind, c->body.data ? c->body.data : "", c->body.len, NULL);
}

/* /v1/responses: translated into a chat body, then the chat path. */
static enum MHD_Result serve_responses(srv_conn *c)
{
    char *chat = NULL;
    resp_state *r = NULL;
    api_error e;
    if (responses_translate(c->s, c->body.data ? c->body.data : "", c->body.len, &chat, &r, &e))
        return http_reply_error(c, &e);
    enum MHD_Result rc = serve_generate_body(c, API_CHAT, chat, strlen(chat), r);
    free(chat);
    return rc;
}

enum MHD_Result routes_dispatch(srv_conn *c, const char *method, const char *url)
{
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int post = !strcmp(method, "POST");
    api_error e;
    switch (c->route) {
    case ROUTE_CHAT:
    case ROUTE_COMPLETIONS:
        if (!post)
            break;
        return serve_generate(c, c->route == ROUTE_CHAT ? API_CHAT : API_COMPLETION);
    case ROUTE_EMBEDDINGS:
        if (!post)
            break;
        return embed_route_serve(c);
    case ROUTE_RESPONSES:
        if (!post)
            break;
        return serve_responses(c);
    case ROUTE_MODELS:
        if (strstr(url, "_lora_adapter")) {
            if (!strcmp(method, "POST"))
                return adapters_route_serve(c, url);
            api_error e;
            api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "use POST on %.100s", url);
            return http_reply_error(c, &e);
        }
        return models_route_serve(c, method, url);
    case ROUTE_HEALTH: {
        if (!get)
            break;
        static const char ok[] = "{\"status\":\"ok\"}";
        return http_reply(c, 200, "application/json", ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT);
    }
    case ROUTE_STATS:
        if (!get)
            break;
        return http_reply_json(c, 200, metrics_stats_json(c->s));
    case ROUTE_METRICS: {
        if (!get)
            break;
        size_t len;
        char *text = metrics_prometheus(c->s, &len);
        if (!text)
            return MHD_NO;
        return http_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, MHD_RESPMEM_MUST_FREE);
    }
    case ROUTE_TOKENIZE:
        if (!post)
            break;
        return compat_tokenize_serve(c);
    case ROUTE_DETOKENIZE:
        if (!post)
            break;
        return compat_detokenize_serve(c);
    case ROUTE_VERSION:
        if (!get)
            break;
        return compat_version_serve(c);
    case ROUTE_PAGE:
        if (!get)
            break;
        return serve_asset(c, url);
    default:
        api_error_set(&e, 404, "invalid_request_error", "not_found", NULL, "unknown endpoint %.200s %.200s", method,
                      url);
        return http_reply_error(c, &e);
    }
    api_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.20s is not allowed on %.200s",
                  method, url);
    return http_reply_error(c, &e);
}
