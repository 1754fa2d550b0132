/* /v1/responses, request side: the Responses body -> a chat-completions
 * body, and the in-memory store behind previous_response_id (see
 * responses.h). The reply side is responses_out.c.
 *
 * Fields: model, input (string | items), instructions, text.format
 * {text | json_object | json_schema{name, schema, strict, description}},
 * tools [{type: function, name, description, parameters, strict}],
 * tool_choice, parallel_tool_calls, reasoning {effort, summary},
 * max_output_tokens, temperature, top_p, stream, previous_response_id,
 * store, metadata, user, truncation "disabled", service_tier,
 * prompt_cache_key, safety_identifier, include [], and tern's chat
 * extensions (guided_*, structured_outputs, seed, top_k, min_p,
 * repetition_penalty) - anything else is a 400.
 * Items: messages {role, content: string | [input_text | output_text]},
 * function_call {call_id, name, arguments}, function_call_output {call_id,
 * output}, reasoning (its text becomes the next assistant turn's
 * reasoning_content; templates drop the thoughts they do not show). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/strbuf.h"
#include "server/reasoning.h"
#include "server/responses_int.h"
#include "server/server_int.h"

/* ---- the store ---- */

typedef struct stored {
    char id[RESP_ID_MAX];
    char *history; /* JSON text of the conversation's chat messages */
    size_t len;
    struct stored *prev, *next; /* most recent first */
} stored;

typedef struct resp_store {
    pthread_mutex_t mu;
    stored *head, *tail;
    int n;
    size_t bytes;
} resp_store;

static pthread_mutex_t store_init_mu = PTHREAD_MUTEX_INITIALIZER;

static resp_store *store_get(tern_server *s)
{
    pthread_mutex_lock(&store_init_mu);
    if (!s->responses) {
        resp_store *st = calloc(1, sizeof *st);
        if (st)
            pthread_mutex_init(&st->mu, NULL);
        s->responses = st;
    }
    pthread_mutex_unlock(&store_init_mu);
    return s->responses;
}

static void unlink_entry(resp_store *st, stored *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        st->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        st->tail = e->prev;
    e->prev = e->next = NULL;
}

void responses_store_put(tern_server *s, const char *id, char *history)
{
    resp_store *st = store_get(s);
    stored *e = st ? calloc(1, sizeof *e) : NULL;
    if (!e) {
        free(history);
        return;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->history = history;
    e->len = strlen(history);
    pthread_mutex_lock(&st->mu);
    e->next = st->head;
    if (st->head)
        st->head->prev = e;
    st->head = e;
    if (!st->tail)
        st->tail = e;
    st->n++;
    st->bytes += e->len;
    while (st->tail && st->tail != e && (st->n > RESPONSES_STORE_MAX || st->bytes > RESPONSES_STORE_BYTES)) {
        stored *old = st->tail;
        unlink_entry(st, old);
        st->n--;
        st->bytes -= old->len;
        free(old->history);
        free(old);
    }
    pthread_mutex_unlock(&st->mu);
}

/* A parsed copy of a stored conversation (an array), or NULL. Using it
 * makes it the most recent. */
static json_object *store_lookup(tern_server *s, const char *id)
{
    resp_store *st = store_get(s);
    if (!st)
        return NULL;
    json_object *h = NULL;
    pthread_mutex_lock(&st->mu);
    for (stored *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id)) {
            h = tern_json_parse(e->history, e->len, NULL);
            unlink_entry(st, e);
            e->next = st->head;
            if (st->head)
                st->head->prev = e;
            st->head = e;
            if (!st->tail)
                st->tail = e;
            break;
        }
    pthread_mutex_unlock(&st->mu);
    return h;
}

void responses_server_free(tern_server *s)
{
    resp_store *st = s->responses;
    if (!st)
        return;
    for (stored *e = st->head, *next; e; e = next) {
        next = e->next;
        free(e->history);
        free(e);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
    s->responses = NULL;
}

/* ---- translation ---- */

static int bad_type(api_error *e, const char *param, const char *what)
{
    return api_bad(e, "invalid_type", param, "'%s' must be %s", param, what);
}

static json_object *copy(json_object *v) { return v ? json_object_get(v) : NULL; }

/* Text of a message's content: a string, or parts input_text / output_text
 * / text joined by newlines. */
static int content_text(json_object *c, const char *path, json_object **out, api_error *e)
{
    if (json_object_is_type(c, json_type_string)) {
        *out = json_object_get(c);
        return 0;
    }
    if (!json_object_is_type(c, json_type_array))
        return bad_type(e, path, "a string or an array of content parts");
    tern_sbuf b = {0};
    for (size_t i = 0; i < json_object_array_length(c); i++) {
        char key[160];
        snprintf(key, sizeof key, "%s[%zu]", path, i);
        json_object *p = json_object_array_get_idx(c, i), *t = NULL, *tx = NULL;
        if (!json_object_is_type(p, json_type_object) || !json_object_object_get_ex(p, "type", &t) ||
            !json_object_is_type(t, json_type_string)) {
            free(b.s);
            return bad_type(e, key, "a content part with a 'type'");
        }
        const char *ty = json_object_get_string(t);
        if (strcmp(ty, "input_text") && strcmp(ty, "output_text") && strcmp(ty, "text")) {
            free(b.s);
            return api_bad(e, "unsupported_content", key, "content part type '%.40s' is not supported (text only)", ty);
        }
        if (!json_object_object_get_ex(p, "text", &tx) || !json_object_is_type(tx, json_type_string)) {
            free(b.s);
            return bad_type(e, key, "a part with a string 'text'");
        }
        if (i)
            tern_sbuf_put(&b, "\n", 1);
        tern_sbuf_put(&b, json_object_get_string(tx), (size_t)json_object_get_string_len(tx));
    }
    *out = json_object_new_string_len(b.s ? b.s : "", (int)b.n);
    free(b.s);
    return *out ? 0 : api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

static json_object *chat_msg(const char *role, json_object *content /* takes */)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", content);
    return m;
}

static int str_field(json_object *o, const char *k, const char *path, json_object **out, api_error *e)
{
    char key[192];
    snprintf(key, sizeof key, "%s.%s", path, k);
    if (!json_object_object_get_ex(o, k, out) || !json_object_is_type(*out, json_type_string))
        return bad_type(e, key, "a string");
    return 0;
}

/* One input item appended to msgs (chat messages). */
/* The text of a reasoning item: its reasoning_text parts (else its
 * summary_text parts), joined; NULL when it has none. */
static json_object *reasoning_text(json_object *it)
{
    static const char *const fields[][2] = {{"content", "reasoning_text"}, {"summary", "summary_text"}};
    for (size_t f = 0; f < 2; f++) {
        json_object *arr = NULL;
        if (!json_object_object_get_ex(it, fields[f][0], &arr) || !json_object_is_type(arr, json_type_array))
            continue;
        tern_sbuf b = {0};
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            json_object *p = json_object_array_get_idx(arr, i), *ty = NULL, *tx = NULL;
            if (json_object_object_get_ex(p, "type", &ty) && !strcmp(json_object_get_string(ty), fields[f][1]) &&
                json_object_object_get_ex(p, "text", &tx) && json_object_is_type(tx, json_type_string)) {
                if (b.n)
                    tern_sbuf_str(&b, "\n\n");
                tern_sbuf_str(&b, json_object_get_string(tx));
            }
        }
        json_object *o = b.n && !b.oom ? json_object_new_string_len(b.s, (int)b.n) : NULL;
        free(b.s);
        if (o)
            return o;
    }
    return NULL;
}

/* One input item onto msgs. *thought: the text of a reasoning item just
 * before, for the assistant turn that follows it (gpt-oss's template shows
 * the thought of a tool-calling turn); other items drop it. */
static int take_item(json_object *it, size_t idx, json_object *msgs, json_object **thought, api_error *e)
{
    char path[64];
    snprintf(path, sizeof path, "input[%zu]", idx);
    if (!json_object_is_type(it, json_type_object))
        return bad_type(e, path, "an object");
    json_object *ty = NULL, *role = NULL;
    const char *type = json_object_object_get_ex(it, "type", &ty) && json_object_is_type(ty, json_type_string)
                           ? json_object_get_string(ty)
                           : "message";
    if (!strcmp(type, "message")) {
        json_object *c = NULL, *text = NULL;
        if (str_field(it, "role", path, &role, e))
            return -1;
        const char *r = json_object_get_string(role);
        if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
            return api_bad(e, "invalid_value", path, "'%s.role' must be user, assistant, system or developer", path);
        char key[96];
        snprintf(key, sizeof key, "%s.content", path);
        if (!json_object_object_get_ex(it, "content", &c) || !c)
            return api_bad(e, "missing_required_parameter", key, "'%s' is required", key);
        if (content_text(c, key, &text, e))
            return -1;
        json_object *m = chat_msg(!strcmp(r, "developer") ? "system" : r, text);
        if (*thought && !strcmp(r, "assistant"))
            json_object_object_add(m, "reasoning_content", json_object_get(*thought));
        json_object_put(*thought);
        *thought = NULL;
        json_object_array_add(msgs, m);
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        json_object *cid = NULL, *name = NULL, *args = NULL;
        if (str_field(it, "call_id", path, &cid, e) || str_field(it, "name", path, &name, e) ||
            str_field(it, "arguments", path, &args, e))
            return -1;
        json_object *call = json_object_new_object(), *fn = json_object_new_object();
        json_object_object_add(call, "id", copy(cid));
        json_object_object_add(call, "type", json_object_new_string("function"));
        json_object_object_add(fn, "name", copy(name));
        json_object_object_add(fn, "arguments", copy(args));
        json_object_object_add(call, "function", fn);
        /* consecutive calls belong to one assistant turn */
        size_t n = json_object_array_length(msgs);
        json_object *last = n ? json_object_array_get_idx(msgs, n - 1) : NULL, *lr = NULL, *calls = NULL;
        if (!(last && json_object_object_get_ex(last, "role", &lr) && !strcmp(json_object_get_string(lr), "assistant"))) {
            last = chat_msg("assistant", json_object_new_string(""));
            json_object_array_add(msgs, last);
        }
        if (*thought && !json_object_object_get_ex(last, "reasoning_content", NULL))
            json_object_object_add(last, "reasoning_content", json_object_get(*thought));
        json_object_put(*thought);
        *thought = NULL;
        if (!json_object_object_get_ex(last, "tool_calls", &calls)) {
            calls = json_object_new_array();
            json_object_object_add(last, "tool_calls", calls);
        }
        json_object_array_add(calls, call);
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        json_object *cid = NULL, *out = NULL, *text = NULL;
        char key[96];
        snprintf(key, sizeof key, "%s.output", path);
        if (str_field(it, "call_id", path, &cid, e))
            return -1;
        if (!json_object_object_get_ex(it, "output", &out) || !out)
            return api_bad(e, "missing_required_parameter", key, "'%s' is required", key);
        if (content_text(out, key, &text, e))
            return -1;
        json_object_put(*thought);
        *thought = NULL;
        json_object *m = chat_msg("tool", text);
        json_object_object_add(m, "tool_call_id", copy(cid));
        json_object_array_add(msgs, m);
        return 0;
    }
    if (!strcmp(type, "reasoning")) { /* kept for the next assistant turn; templates drop what they do not show */
        json_object_put(*thought);
        *thought = reasoning_text(it);
        return 0;
    }
    return api_bad(e, "unsupported_value", path, "input item type '%.40s' is not supported", type);
}

static int take_input(json_object *v, json_object *msgs, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        json_object_array_add(msgs, chat_msg("user", json_object_get(v)));
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return bad_type(e, "input", "a string or an array of items");
    json_object *thought = NULL;
    int rc = 0;
    for (size_t i = 0; !rc && i < json_object_array_length(v); i++)
        rc = take_item(json_object_array_get_idx(v, i), i, msgs, &thought, e);
    json_object_put(thought);
    return rc ? -1 : 0;
}

/* text.format -> response_format */
static int take_text(json_object *v, json_object *chat, api_error *e)
{
    if (!json_object_is_type(v, json_type_object))
        return bad_type(e, "text", "an object");
    json_object_object_foreach(v, k, f) {
        if (!f)
            continue;
        if (!strcmp(k, "verbosity"))
            continue; /* a hint */
        if (strcmp(k, "format"))
            return api_bad(e, "unsupported_parameter", "text", "unsupported field 'text.%.40s'", k);
        json_object *t = NULL;
        if (!json_object_is_type(f, json_type_object) || !json_object_object_get_ex(f, "type", &t) ||
            !json_object_is_type(t, json_type_string))
            return bad_type(e, "text.format", "an object with a 'type'");
        const char *ty = json_object_get_string(t);
        json_object *rf = json_object_new_object();
        json_object_object_add(rf, "type", json_object_new_string(ty));
        if (!strcmp(ty, "json_schema")) {
            json_object *js = json_object_new_object();
            json_object_object_foreach(f, fk, fv) {
                if (!strcmp(fk, "type"))
                    continue;
                if (strcmp(fk, "name") && strcmp(fk, "schema") && strcmp(fk, "strict") && strcmp(fk, "description")) {
                    json_object_put(js);
                    json_object_put(rf);
                    return api_bad(e, "unsupported_parameter", "text.format", "unsupported field 'text.format.%.40s'", fk);
                }
                json_object_object_add(js, fk, copy(fv));
            }
            json_object_object_add(rf, "json_schema", js);
        } else if (strcmp(ty, "json_object") && strcmp(ty, "text")) {
            json_object_put(rf);
            return api_bad(e, "invalid_value", "text.format.type",
                           "'text.format.type' must be text, json_object or json_schema");
        }
        json_object_object_add(chat, "response_format", rf);
    }
    return 0;
}

static int take_tools(json_object *v, json_object *chat, api_error *e)
{
    if (!json_object_is_type(v, json_type_array))
        return bad_type(e, "tools", "an array");
    json_object *out = json_object_new_array();
    json_object_object_add(chat, "tools", out);
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        char key[48];
        snprintf(key, sizeof key, "tools[%zu]", i);
        json_object *t = json_object_array_get_idx(v, i), *ty = NULL;
        if (!json_object_is_type(t, json_type_object) || !json_object_object_get_ex(t, "type", &ty) ||
            !json_object_is_type(ty, json_type_string))
            return bad_type(e, key, "a tool object with a 'type'");
        if (strcmp(json_object_get_string(ty), "function"))
            return api_bad(e, "unsupported_value", key, "tool type '%.40s' is not supported (function tools only)",
                           json_object_get_string(ty));
        json_object *fn = json_object_new_object(), *ct = json_object_new_object();
        json_object_object_add(ct, "type", json_object_new_string("function"));
        json_object_object_add(ct, "function", fn);
        json_object_array_add(out, ct);
        json_object_object_foreach(t, k, f) {
            if (!strcmp(k, "type") || !f)
                continue;
            if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "parameters") && strcmp(k, "strict"))
                return api_bad(e, "unsupported_parameter", key, "unsupported field '%s.%.40s'", key, k);
            json_object_object_add(fn, k, copy(f));
        }
    }
    return 0;
}

static int take_tool_choice(json_object *v, json_object *chat, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        json_object_object_add(chat, "tool_choice", copy(v));
        return 0;
    }
    json_object *ty = NULL, *name = NULL;
    if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "type", &ty) ||
        !json_object_is_type(ty, json_type_string) || strcmp(json_object_get_string(ty), "function") ||
        !json_object_object_get_ex(v, "name", &name) || !json_object_is_type(name, json_type_string))
        return api_bad(e, "invalid_value", "tool_choice",
                       "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
    json_object *tc = json_object_new_object(), *fn = json_object_new_object();
    json_object_object_add(tc, "type", json_object_new_string("function"));
    json_object_object_add(fn, "name", copy(name));
    json_object_object_add(tc, "function", fn);
    json_object_object_add(chat, "tool_choice", tc);
    return 0;
}

static int take_reasoning(resp_state *r, json_object *v, json_object *chat, api_error *e)
{
    if (!json_object_is_type(v, json_type_object))
        return bad_type(e, "reasoning", "an object");
    json_object_object_foreach(v, k, f) {
        if (!f)
            continue;
        if (!strcmp(k, "effort")) {
            int en, bud;
            if (!json_object_is_type(f, json_type_string) || reasoning_effort_parse(json_object_get_string(f), &en, &bud))
                return api_bad(e, "invalid_value", "reasoning.effort",
                               "'reasoning.effort' must be none, minimal, low, medium or high");
            json_object_object_add(chat, "reasoning_effort", copy(f));
        } else if (!strcmp(k, "summary") || !strcmp(k, "generate_summary")) {
            if (!json_object_is_type(f, json_type_string))
                return bad_type(e, "reasoning.summary", "auto, concise or detailed");
            r->summary = 1;
        } else {
            return api_bad(e, "unsupported_parameter", "reasoning", "unsupported field 'reasoning.%.40s'", k);
        }
    }
    return 0;
}

/* Copies field k of the request into the chat body under name ck. */
static void pass(json_object *chat, const char *ck, json_object *v) { json_object_object_add(chat, ck, copy(v)); }

static int translate_field(tern_server *s, resp_state *r, const char *k, json_object *v, json_object *chat,
                           json_object **input, json_object **prev, api_error *e)
{
    (void)s;
    static const char *const hints[] = {"metadata", "user", "service_tier", "prompt_cache_key", "safety_identifier"};
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
        if (!strcmp(k, hints[i])) {
            json_object_object_add(r->echo, k, copy(v));
            return 0;
        }
    if (!strcmp(k, "model") || !strcmp(k, "temperature") || !strcmp(k, "top_p") || !strcmp(k, "parallel_tool_calls")) {
        pass(chat, k, v);
        if (strcmp(k, "model"))
            json_object_object_add(r->echo, k, copy(v));
        return 0;
    }
    /* tern's chat extensions, same meaning (structured output, seeding) */
    static const char *const ext[] = {"guided_json", "guided_grammar", "guided_regex", "guided_choice",
                                      "structured_outputs", "seed", "top_k", "min_p", "repetition_penalty"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (!strcmp(k, ext[i])) {
            pass(chat, k, v);
            return 0;
        }
    if (!strcmp(k, "input"))
        return *input = v, 0;
    if (!strcmp(k, "instructions")) {
        if (!json_object_is_type(v, json_type_string))
            return bad_type(e, k, "a string");
        json_object_object_add(r->echo, k, copy(v));
        return 0;
    }
    if (!strcmp(k, "max_output_tokens")) {
        pass(chat, "max_completion_tokens", v);
        json_object_object_add(r->echo, k, copy(v));
        return 0;
    }
    if (!strcmp(k, "stream")) {
        if (!json_object_is_type(v, json_type_boolean))
            return bad_type(e, k, "a boolean");
        r->streaming = json_object_get_boolean(v);
        pass(chat, k, v);
        return 0;
    }
    if (!strcmp(k, "store")) {
        if (!json_object_is_type(v, json_type_boolean))
            return bad_type(e, k, "a boolean");
        r->store = json_object_get_boolean(v);
        return 0;
    }
    if (!strcmp(k, "previous_response_id")) {
        if (!json_object_is_type(v, json_type_string))
            return bad_type(e, k, "a string");
        *prev = v;
        return 0;
    }
    if (!strcmp(k, "text")) {
        json_object_object_add(r->echo, k, copy(v));
        return take_text(v, chat, e);
    }
    if (!strcmp(k, "tools")) {
        json_object_object_add(r->echo, k, copy(v));
        return take_tools(v, chat, e);
    }
    if (!strcmp(k, "tool_choice")) {
        json_object_object_add(r->echo, k, copy(v));
        return take_tool_choice(v, chat, e);
    }
    if (!strcmp(k, "reasoning")) {
        json_object_object_add(r->echo, k, copy(v));
        return take_reasoning(r, v, chat, e);
    }
    if (!strcmp(k, "truncation")) {
        if (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "disabled"))
            return api_bad(e, "unsupported_value", k, "only 'truncation: disabled' is supported");
        return 0;
    }
    if (!strcmp(k, "include")) {
        if (!json_object_is_type(v, json_type_array))
            return bad_type(e, k, "an array");
        if (json_object_array_length(v) > 0)
            return api_bad(e, "unsupported_value", k, "'include' values are not supported");
        return 0;
    }
    if (!strcmp(k, "background")) {
        if (!json_object_is_type(v, json_type_boolean) || json_object_get_boolean(v))
            return api_bad(e, "unsupported_value", k, "background responses are not supported");
        return 0;
    }
    return api_bad(e, "unsupported_parameter", k, "Unsupported parameter: '%.60s' is not supported by /v1/responses", k);
}

int responses_translate(tern_server *s, const char *body, size_t len, char **chat_out, resp_state **out,
                        api_error *e)
{
    *chat_out = NULL;
    *out = NULL;
    size_t valid = api_utf8_valid_len(body, len);
    if (valid != len)
        return api_bad(e, "invalid_encoding", NULL, "request body is not valid UTF-8 (at byte %zu)", valid);
    tern_err je;
    json_object *root = tern_json_parse(body, len, &je);
    if (!root)
        return api_bad(e, "invalid_json", NULL, "request body is not valid JSON: %s", je.msg);
    resp_state *r = resp_state_new(s);
    json_object *chat = json_object_new_object(), *msgs = json_object_new_array();
    json_object *input = NULL, *prev = NULL, *history = NULL;
    int rc = -1;
    if (!r || !chat || !msgs) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (!json_object_is_type(root, json_type_object)) {
        api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
        goto out;
    }
    json_object_object_foreach(root, k, v) {
        if (v && translate_field(s, r, k, v, chat, &input, &prev, e))
            goto out;
    }
    if (!input) {
        api_bad(e, "missing_required_parameter", "input", "'input' is required");
        goto out;
    }
    /* the conversation: a stored one, then this input */
    if (prev) {
        history = store_lookup(s, json_object_get_string(prev));
        if (!history) {
            api_error_set(e, 404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                          "Previous response with id '%.100s' not found", json_object_get_string(prev));
            goto out;
        }
        json_object_object_add(r->echo, "previous_response_id", copy(prev));
    } else {
        history = json_object_new_array();
    }
    if (take_input(input, history, e))
        goto out;
    r->history = strdup(json_object_to_json_string_ext(history, JSON_C_TO_STRING_PLAIN));
    /* instructions lead this request only (not carried to the next turn) */
    json_object *ins = NULL;
    if (json_object_object_get_ex(r->echo, "instructions", &ins))
        json_object_array_add(msgs, chat_msg("system", json_object_get(ins)));
    for (size_t i = 0; i < json_object_array_length(history); i++)
        json_object_array_add(msgs, json_object_get(json_object_array_get_idx(history, i)));
    json_object_object_add(chat, "messages", msgs);
    msgs = NULL;
    const char *text = json_object_to_json_string_ext(chat, JSON_C_TO_STRING_PLAIN);
    if (!r->history || !(*chat_out = strdup(text))) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    *out = r;
    r = NULL;
    rc = 0;
out:
    responses_state_free(r);
    json_object_put(history);
    json_object_put(msgs);
    json_object_put(chat);
    json_object_put(root);
    return rc;
}
