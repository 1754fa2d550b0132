/* Request bodies of /v1/chat/completions and /v1/completions -> api_request.
 * Every field is either understood, a documented no-op hint, or a 400 that
 * names it: nothing the engine cannot honour is silently dropped. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/api.h"
#include "server/reasoning.h"
#include "server/structured.h"

int api_error_set(api_error *e, int status, const char *type, const char *code, const char *param,
                  const char *fmt, ...)
{
    if (!e)
        return -1;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int api_bad(api_error *e, const char *code, const char *param, const char *fmt, ...)
{
    if (!e)
        return -1;
    e->status = 400;
    e->type = "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- typed field readers: wrong type or range is a 400 naming the field ---- */

static int get_int(json_object *v, const char *key, long long lo, long long hi, long long *out, api_error *e)
{
    long long x;
    if (json_object_is_type(v, json_type_int)) {
        x = (long long)json_object_get_int64(v);
        /* values beyond int64 saturate; a uint64 above INT64_MAX reads as max */
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!isfinite(d) || d != floor(d))
            return api_bad(e, "invalid_type", key, "'%s' must be an integer", key);
        if (d < (double)lo || d > (double)hi)
            return api_bad(e, "invalid_value", key, "'%s' must be between %lld and %lld", key, lo, hi);
        x = (long long)d;
    } else {
        return api_bad(e, "invalid_type", key, "'%s' must be an integer", key);
    }
    if (x < lo || x > hi)
        return api_bad(e, "invalid_value", key, "'%s' must be between %lld and %lld", key, lo, hi);
    *out = x;
    return 0;
}

static int get_num(json_object *v, const char *key, double lo, double hi, double *out, api_error *e)
{
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return api_bad(e, "invalid_type", key, "'%s' must be a number", key);
    double d = json_object_get_double(v);
    if (!isfinite(d) || d < lo || d > hi)
        return api_bad(e, "invalid_value", key, "'%s' must be between %g and %g", key, lo, hi);
    *out = d;
    return 0;
}

static int get_bool(json_object *v, const char *key, int *out, api_error *e)
{
    if (!json_object_is_type(v, json_type_boolean))
        return api_bad(e, "invalid_type", key, "'%s' must be a boolean", key);
    *out = json_object_get_boolean(v);
    return 0;
}

static int need_type(json_object *v, json_type t, const char *key, const char *what, api_error *e)
{
    if (!json_object_is_type(v, t))
        return api_bad(e, "invalid_type", key, "'%s' must be %s", key, what);
    return 0;
}

/* ---- chat messages ---- */

static int valid_role(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i]))
            return 1;
    return 0;
}

/* content: a string, or an array of {type: "text", text} parts joined by
 * newlines. Other part types (images, audio, files) are refused. */
static int norm_content(json_object *c, const char *path, json_object **out, api_error *e)
{
    char key[192];
    if (json_object_is_type(c, json_type_string)) {
        *out = json_object_get(c);
        return 0;
    }
    if (!json_object_is_type(c, json_type_array))
        return api_bad(e, "invalid_type", path, "'%s' must be a string or an array of content parts", path);
    size_t n = json_object_array_length(c), total = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *p = json_object_array_get_idx(c, i), *t = NULL, *tx = NULL;
        snprintf(key, sizeof key, "%s[%zu]", path, i);
        if (!json_object_is_type(p, json_type_object) || !json_object_object_get_ex(p, "type", &t) ||
            !json_object_is_type(t, json_type_string))
            return api_bad(e, "invalid_type", key, "'%s' must be a content part object with a 'type'", key);
        const char *ts = json_object_get_string(t);
        if (strcmp(ts, "text") != 0)
            return api_bad(e, "unsupported_content", key, "content part type '%.40s' is not supported (text only)",
                           ts);
        json_object_object_foreach(p, k, v) {
            (void)v;
            if (strcmp(k, "type") && strcmp(k, "text"))
                return api_bad(e, "unsupported_parameter", key, "unsupported field '%.40s' in '%s'", k, key);
        }
        if (!json_object_object_get_ex(p, "text", &tx) || !json_object_is_type(tx, json_type_string))
            return api_bad(e, "invalid_type", key, "'%s.text' must be a string", key);
        total += (size_t)json_object_get_string_len(tx) + 1;
    }
    char *buf = malloc(total + 1), *w = buf;
    if (!buf)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *tx = NULL;
        json_object_object_get_ex(json_object_array_get_idx(c, i), "text", &tx);
        if (i)
            *w++ = '\n';
        size_t l = (size_t)json_object_get_string_len(tx);
        memcpy(w, json_object_get_string(tx), l);
        w += l;
    }
    *out = json_object_new_string_len(buf, (int)(w - buf));
    free(buf);
    return *out ? 0 : api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* An assistant message's tool_calls, as the template gets them: each call
 * {id?, type: "function", function: {name, arguments}}; arguments, which
 * OpenAI sends as JSON text, become the object they encode (templates
 * write `arguments | tojson`; text would come out quoted twice). *out is
 * a new array. */
static int norm_tool_calls(json_object *v, const char *key, json_object **out, api_error *e)
{
    char k[192];
    if (!json_object_is_type(v, json_type_array))
        return api_bad(e, "invalid_type", key, "'%s' must be an array", key);
    json_object *arr = json_object_new_array();
    if (!arr)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *c = json_object_array_get_idx(v, i), *fn = NULL, *name = NULL, *args = NULL, *id = NULL;
        snprintf(k, sizeof k, "%s[%zu]", key, i);
        if (!json_object_is_type(c, json_type_object) || !json_object_object_get_ex(c, "function", &fn) ||
            !json_object_is_type(fn, json_type_object) || !json_object_object_get_ex(fn, "name", &name) ||
            !json_object_is_type(name, json_type_string)) {
            json_object_put(arr);
            return api_bad(e, "invalid_value", k, "'%s' must be {type: \"function\", function: {name, arguments}}", k);
        }
        if (json_object_object_get_ex(c, "id", &id) && id && !json_object_is_type(id, json_type_string)) {
            json_object_put(arr);
            return api_bad(e, "invalid_type", k, "'%s.id' must be a string", k);
        }
        json_object *nc = json_object_new_object(), *nf = json_object_new_object();
        if (id)
            json_object_object_add(nc, "id", json_object_get(id));
        json_object_object_add(nc, "type", json_object_new_string("function"));
        json_object_object_add(nf, "name", json_object_get(name));
        json_object *a = NULL;
        if (json_object_object_get_ex(fn, "arguments", &args) && args) {
            if (json_object_is_type(args, json_type_string)) {
                a = tern_json_parse(json_object_get_string(args), (size_t)json_object_get_string_len(args), NULL);
                if (!a || !json_object_is_type(a, json_type_object)) {
                    json_object_put(a);
                    json_object_put(nc);
                    json_object_put(nf);
                    json_object_put(arr);
                    return api_bad(e, "invalid_value", k, "'%s.function.arguments' must be a JSON object (as text)", k);
                }
            } else if (json_object_is_type(args, json_type_object)) {
                a = json_object_get(args);
            } else {
                json_object_put(nc);
                json_object_put(nf);
                json_object_put(arr);
                return api_bad(e, "invalid_type", k, "'%s.function.arguments' must be a string", k);
            }
        }
        json_object_object_add(nf, "arguments", a ? a : json_object_new_object());
        json_object_object_add(nc, "function", nf);
        json_object_array_add(arr, nc);
    }
    *out = arr;
    return 0;
}

static int parse_message(json_object *m, size_t idx, json_object *out_arr, api_error *e)
{
    char path[96], key[128];
    snprintf(path, sizeof path, "messages[%zu]", idx);
    if (!json_object_is_type(m, json_type_object))
        return api_bad(e, "invalid_type", path, "'%s' must be an object", path);
    json_object *role = NULL, *content = NULL;
    if (!json_object_object_get_ex(m, "role", &role) || !json_object_is_type(role, json_type_string))
        return api_bad(e, "invalid_type", path, "'%s.role' must be a string", path);
    const char *rs = json_object_get_string(role);
    if (!valid_role(rs))
        return api_bad(e, "invalid_value", path, "'%s.role' must be one of system, developer, user, assistant, tool",
                       path);
    json_object *nm = json_object_new_object();
    if (!nm)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    /* templates know "system"; OpenAI's "developer" is the same slot */
    json_object_object_add(nm, "role", json_object_new_string(!strcmp(rs, "developer") ? "system" : rs));
    int has_tool_calls = 0;
    json_object_object_foreach(m, k, v) {
        snprintf(key, sizeof key, "%s.%s", path, k);
        if (!strcmp(k, "role"))
            continue;
        if (!strcmp(k, "content")) {
            content = v;
            continue;
        }
        if (!strcmp(k, "name") || !strcmp(k, "tool_call_id") || !strcmp(k, "reasoning_content") ||
            !strcmp(k, "refusal")) {
            if (v && !json_object_is_type(v, json_type_string))
                goto bad_str;
            if (v)
                json_object_object_add(nm, k, json_object_get(v));
            continue;
        }
        /* Fields of the server's own response message, echoed back by clients
         * that append it to the history (the openai client's runTools does):
         * `reasoning` is the alias of reasoning_content; `parsed` (the client's
         * parse of content) and `annotations` are derived from content and hold
         * nothing a template renders. Accepted on assistant messages only. */
        if (!strcmp(rs, "assistant") && (!strcmp(k, "reasoning") || !strcmp(k, "thinking"))) {
            if (v && !json_object_is_type(v, json_type_string))
                goto bad_str;
            json_object *rc = NULL;
            if (v && (!json_object_object_get_ex(m, "reasoning_content", &rc) || !rc) &&
                !json_object_object_get_ex(nm, "reasoning_content", NULL))
                json_object_object_add(nm, "reasoning_content", json_object_get(v));
            continue;
        }
        if (!strcmp(rs, "assistant") && (!strcmp(k, "parsed") || !strcmp(k, "annotations")))
            continue;
        if (!strcmp(k, "tool_calls")) {
            if (!v)
                continue;
            json_object *calls = NULL;
            if (norm_tool_calls(v, key, &calls, e)) {
                json_object_put(nm);
                return -1;
            }
            has_tool_calls = json_object_array_length(calls) > 0;
            json_object_object_add(nm, k, calls);
            continue;
        }
        json_object_put(nm);
        return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
    bad_str:
        json_object_put(nm);
        return api_bad(e, "invalid_type", key, "'%s' must be a string", key);
    }
    snprintf(key, sizeof key, "%s.content", path);
    if (!content) {
        if (strcmp(rs, "assistant") != 0 || !has_tool_calls) {
            json_object_put(nm);
            return api_bad(e, "invalid_value", key, "'%s' is required", key);
        }
        json_object_object_add(nm, "content", json_object_new_string("")); /* templates test and split content */
    } else {
        json_object *c = NULL;
        if (norm_content(content, key, &c, e)) {
            json_object_put(nm);
            return -1;
        }
        json_object_object_add(nm, "content", c);
    }
    /* the thought under both names templates read: reasoning_content (Qwen3,
     * DeepSeek) and thinking (gpt-oss) */
    json_object *thought = NULL;
    if (!strcmp(rs, "assistant") && json_object_object_get_ex(nm, "reasoning_content", &thought) && thought)
        json_object_object_add(nm, "thinking", json_object_get(thought));
    json_object_array_add(out_arr, nm);
    return 0;
}

static int parse_messages(api_request *r, json_object *v, api_error *e)
{
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
        return api_bad(e, "invalid_type", "messages", "'messages' must be a non-empty array");
    r->messages = json_object_new_array();
    if (!r->messages)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t n = json_object_array_length(v);
    for (size_t i = 0; i < n; i++)
        if (parse_message(json_object_array_get_idx(v, i), i, r->messages, e))
            return -1;
    return 0;
}

static int tool_name_ok(const char *n, size_t len)
{
    if (len == 0 || len > API_MAX_TOOL_NAME)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= 'A' && n[i] <= 'Z') || (n[i] >= '0' && n[i] <= '9') ||
              n[i] == '_' || n[i] == '-'))
            return 0;
    return 1;
}

/* One tool: {type: "function", function: {name, description?, parameters?,
 * strict?}}; every other key is a 400 naming it. The parameters' schema is
 * compiled later (toolcall.c), where a bad one is a 400 naming it too. */
static int parse_tool(json_object *t, size_t i, api_error *e)
{
    char key[96];
    snprintf(key, sizeof key, "tools[%zu]", i);
    json_object *ty = NULL, *fn = NULL, *name = NULL;
    if (!json_object_is_type(t, json_type_object) || !json_object_object_get_ex(t, "type", &ty) ||
        !json_object_is_type(ty, json_type_string) || strcmp(json_object_get_string(ty), "function") != 0)
        return api_bad(e, "invalid_value", key, "'%s' must be an object with type \"function\"", key);
    json_object_object_foreach(t, tk, tv) {
        (void)tv;
        if (strcmp(tk, "type") && strcmp(tk, "function")) {
            snprintf(key, sizeof key, "tools[%zu].%.40s", i, tk);
            return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
        }
    }
    snprintf(key, sizeof key, "tools[%zu].function", i);
    if (!json_object_object_get_ex(t, "function", &fn) || !json_object_is_type(fn, json_type_object))
        return api_bad(e, "invalid_type", key, "'%s' must be an object", key);
    json_object_object_foreach(fn, k, v) {
        snprintf(key, sizeof key, "tools[%zu].function.%.40s", i, k);
        if (!strcmp(k, "name")) {
            name = v;
        } else if (!strcmp(k, "description")) {
            if (v && !json_object_is_type(v, json_type_string))
                return api_bad(e, "invalid_type", key, "'%s' must be a string", key);
        } else if (!strcmp(k, "parameters")) {
            if (v && !json_object_is_type(v, json_type_object))
                return api_bad(e, "invalid_type", key, "'%s' must be a JSON Schema object", key);
        } else if (!strcmp(k, "strict")) {
            if (v && !json_object_is_type(v, json_type_boolean))
                return api_bad(e, "invalid_type", key, "'%s' must be a boolean", key);
        } else {
            return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
        }
    }
    snprintf(key, sizeof key, "tools[%zu].function.name", i);
    if (!name || !json_object_is_type(name, json_type_string))
        return api_bad(e, name ? "invalid_type" : "missing_required_parameter", key, "'%s' must be a string", key);
    if (!tool_name_ok(json_object_get_string(name), (size_t)json_object_get_string_len(name)))
        return api_bad(e, "invalid_value", key,
                       "'%s' must be 1 to %d characters of a-z, A-Z, 0-9, underscores and dashes", key,
                       API_MAX_TOOL_NAME);
    return 0;
}

const char *api_tool_name(json_object *tool)
{
    json_object *fn = NULL, *name = NULL;
    if (!json_object_object_get_ex(tool, "function", &fn) || !json_object_object_get_ex(fn, "name", &name))
        return NULL;
    return json_object_get_string(name);
}

static int parse_tools(json_object *v, api_error *e)
{
    if (!json_object_is_type(v, json_type_array))
        return api_bad(e, "invalid_type", "tools", "'tools' must be an array");
    size_t n = json_object_array_length(v);
    for (size_t i = 0; i < n; i++) {
        if (parse_tool(json_object_array_get_idx(v, i), i, e))
            return -1;
        const char *name = api_tool_name(json_object_array_get_idx(v, i));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(name, api_tool_name(json_object_array_get_idx(v, j)))) {
                char key[64];
                snprintf(key, sizeof key, "tools[%zu].function.name", i);
                return api_bad(e, "duplicate_tool_name", key, "'%s': tools[%zu] is already named '%.64s'", key, j,
                               name);
            }
    }
    return 0;
}

/* tool_choice: "none" | "auto" | "required" | {type: "function",
 * function: {name}}. That the tools exist (and hold the name) is checked
 * once every field is read. */
static int parse_tool_choice(api_request *r, json_object *v, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        static const struct {
            const char *s;
            api_tool_choice c;
        } modes[] = {{"auto", API_TOOL_AUTO}, {"none", API_TOOL_NONE}, {"required", API_TOOL_REQUIRED}};
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
            if (!strcmp(json_object_get_string(v), modes[i].s)) {
                r->tool_choice = modes[i].c;
                return 0;
            }
        return api_bad(e, "invalid_value", "tool_choice",
                       "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
    }
    if (!json_object_is_type(v, json_type_object))
        return api_bad(e, "invalid_type", "tool_choice", "'tool_choice' must be a string or an object");
    json_object *ty = NULL, *fn = NULL, *name = NULL;
    json_object_object_foreach(v, k, x) {
        (void)x;
        if (strcmp(k, "type") && strcmp(k, "function")) {
            char key[64];
            snprintf(key, sizeof key, "tool_choice.%.40s", k);
            return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
        }
    }
    if (!json_object_object_get_ex(v, "type", &ty) || !json_object_is_type(ty, json_type_string) ||
        strcmp(json_object_get_string(ty), "function") != 0)
        return api_bad(e, "invalid_value", "tool_choice.type", "'tool_choice.type' must be \"function\"");
    if (!json_object_object_get_ex(v, "function", &fn) || !json_object_is_type(fn, json_type_object) ||
        !json_object_object_get_ex(fn, "name", &name) || !json_object_is_type(name, json_type_string))
        return api_bad(e, "missing_required_parameter", "tool_choice.function.name",
                       "'tool_choice.function.name' must be a string");
    json_object_object_foreach(fn, fk, fx) {
        (void)fx;
        if (strcmp(fk, "name")) {
            char key[64];
            snprintf(key, sizeof key, "tool_choice.function.%.40s", fk);
            return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
        }
    }
    r->tool_choice = API_TOOL_NAMED;
    r->tool_name = json_object_get_string(name);
    return 0;
}

/* After every field: tool_choice needs tools, and a named one must be there. */
static int check_tools(api_request *r, int seen_choice, api_error *e)
{
    size_t n = r->tools ? json_object_array_length(r->tools) : 0;
    if (seen_choice && n == 0)
        return api_bad(e, "invalid_value", "tool_choice", "'tool_choice' is only allowed when 'tools' are specified");
    if (r->tool_choice == API_TOOL_NAMED) {
        size_t i = 0;
        while (i < n && strcmp(api_tool_name(json_object_array_get_idx(r->tools, i)), r->tool_name) != 0)
            i++;
        if (i == n)
            return api_bad(e, "invalid_value", "tool_choice.function.name",
                           "'tool_choice.function.name': no tool named '%.64s' in 'tools'", r->tool_name);
    }
    if (n == 0 || r->tool_choice == API_TOOL_NONE)
        r->tools = NULL; /* hidden from the template, nothing to enforce */
    return 0;
}

/* ---- completions prompt ---- */

static int parse_id_array(api_request *r, json_object *a, const api_limits *lim, api_error *e)
{
    size_t n = json_object_array_length(a);
    r->prompt_ids = malloc((n ? n : 1) * sizeof *r->prompt_ids);
    if (!r->prompt_ids)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        long long id;
        if (get_int(json_object_array_get_idx(a, i), "prompt", 0, (long long)lim->n_vocab - 1, &id, e))
            return api_bad(e, "invalid_value", "prompt", "token ids in 'prompt' must be integers in [0, %d)",
                           lim->n_vocab);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = n;
    return 0;
}

/* A list of prompts: all strings, or all token-id lists. */
static int parse_batch(api_request *r, json_object *v, const api_limits *lim, api_error *e)
{
    size_t n = json_object_array_length(v);
    if (n > API_MAX_N)
        return api_bad(e, "invalid_value", "prompt", "'prompt' may hold at most %d prompts", API_MAX_N);
    if (!(r->batch = calloc(n, sizeof *r->batch)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int strings = json_object_is_type(json_object_array_get_idx(v, 0), json_type_string);
    for (size_t i = 0; i < n; i++) {
        json_object *p = json_object_array_get_idx(v, i);
        api_prompt *b = &r->batch[r->n_batch];
        if (strings && json_object_is_type(p, json_type_string)) {
            b->text = json_object_get_string(p);
            b->len = (size_t)json_object_get_string_len(p);
        } else if (!strings && json_object_is_type(p, json_type_array) && json_object_array_length(p) > 0) {
            if (parse_id_array(r, p, lim, e))
                return -1;
            b->ids = r->prompt_ids;
            b->n_ids = r->n_prompt_ids;
            r->prompt_ids = NULL;
            r->n_prompt_ids = 0;
        } else {
            return api_bad(e, "invalid_type", "prompt",
                           "'prompt[%zu]': a batch is a list of strings or a list of non-empty token-id lists", i);
        }
        r->n_batch++;
    }
    return 0;
}

static int parse_prompt(api_request *r, json_object *v, const api_limits *lim, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        r->prompt = json_object_get_string(v);
        r->prompt_len = (size_t)json_object_get_string_len(v);
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return api_bad(e, "invalid_type", "prompt", "'prompt' must be a string or an array of token ids");
    size_t n = json_object_array_length(v);
    if (n == 0)
        return api_bad(e, "invalid_value", "prompt", "'prompt' must not be empty");
    json_object *first = json_object_array_get_idx(v, 0);
    if (json_object_is_type(first, json_type_int) || json_object_is_type(first, json_type_double))
        return parse_id_array(r, v, lim, e);
    if (n > 1)
        return parse_batch(r, v, lim, e);
    if (json_object_is_type(first, json_type_string))
        return parse_prompt(r, first, lim, e);
    if (json_object_is_type(first, json_type_array))
        return parse_id_array(r, first, lim, e);
    return api_bad(e, "invalid_type", "prompt", "'prompt' must be a string or an array of token ids");
}

/* ---- common fields ---- */

static int parse_stop(api_request *r, json_object *v, api_error *e)
{
    size_t n = 1;
    if (json_object_is_type(v, json_type_array)) {
        n = json_object_array_length(v);
        if (n > API_MAX_STOP)
            return api_bad(e, "invalid_value", "stop", "'stop' may hold at most %d strings", API_MAX_STOP);
    } else if (!json_object_is_type(v, json_type_string)) {
        return api_bad(e, "invalid_type", "stop", "'stop' must be a string or an array of strings");
    }
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *s = json_object_is_type(v, json_type_array) ? json_object_array_get_idx(v, i) : v;
        if (!json_object_is_type(s, json_type_string))
            return api_bad(e, "invalid_type", "stop", "'stop' must be a string or an array of strings");
        int len = json_object_get_string_len(s);
        if (len == 0 || len > API_MAX_STOP_LEN)
            return api_bad(e, "invalid_value", "stop", "stop strings must be 1 to %d bytes long", API_MAX_STOP_LEN);
        r->stop[r->n_stop++] = json_object_get_string(s);
    }
    return 0;
}

/* stop_token_ids: an array of token ids below the vocabulary size. */
static int parse_stop_ids(api_request *r, json_object *v, const api_limits *lim, api_error *e)
{
    const char *k = "stop_token_ids";
    if (need_type(v, json_type_array, k, "an array of token ids", e))
        return -1;
    size_t n = json_object_array_length(v);
    if (n > API_MAX_BIAS)
        return api_bad(e, "invalid_value", k, "'%s' may hold at most %d ids", k, API_MAX_BIAS);
    free(r->stop_ids);
    r->n_stop_ids = 0;
    if (!(r->stop_ids = malloc((n ? n : 1) * sizeof *r->stop_ids)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t j = 0; j < n; j++) {
        json_object *t = json_object_array_get_idx(v, j);
        int64_t id = json_object_is_type(t, json_type_int) ? json_object_get_int64(t) : -1;
        if (id < 0 || id >= lim->n_vocab)
            return api_bad(e, "invalid_value", k, "'%s[%zu]' must be a token id in [0, %d)", k, j, lim->n_vocab);
        r->stop_ids[r->n_stop_ids++] = (int32_t)id;
    }
    return 0;
}

/* llama-server's names for OpenAI / vLLM fields, once every field is read:
 * n_predict -> max_tokens (the OpenAI names win), repeat_penalty ->
 * repetition_penalty, grammar -> guided_grammar, json_schema -> guided_json
 * (api_structured.c reads those from the body). Giving both names with
 * different values is a 400 naming the llama-server one. */
static int resolve_aliases(api_request *r, api_error *e)
{
    json_object *v = NULL, *o = NULL;
    if (json_object_object_get_ex(r->root, "n_predict", &v) && v && r->max_tokens < 0)
        r->max_tokens = (int)json_object_get_int64(v) > 0 ? (int)json_object_get_int64(v) : -1;
    if (json_object_object_get_ex(r->root, "repeat_penalty", &v) && v) {
        float p = (float)json_object_get_double(v);
        if (json_object_object_get_ex(r->root, "repetition_penalty", &o) && o && r->sample.repetition_penalty != p)
            return api_bad(e, "invalid_value", "repeat_penalty",
                           "'repeat_penalty' and 'repetition_penalty' disagree; send one");
        r->sample.repetition_penalty = p;
    }
    static const char *const alias[][2] = {{"grammar", "guided_grammar"}, {"json_schema", "guided_json"}};
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        if (!json_object_object_get_ex(r->root, alias[i][0], &v) || !v)
            continue;
        if ((json_object_object_get_ex(r->root, alias[i][1], &o) && o) ||
            (i == 1 && json_object_object_get_ex(r->root, "response_format", &o) && o))
            return api_bad(e, "invalid_value", alias[i][0], "'%s' cannot be combined with '%s'", alias[i][0],
                           i == 1 && !json_object_object_get_ex(r->root, "guided_json", NULL) ? "response_format"
                                                                                          : alias[i][1]);
        if (json_object_object_add(r->root, alias[i][1], json_object_get(v)))
            return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

static int parse_logit_bias(api_request *r, json_object *v, const api_limits *lim, api_error *e)
{
    if (need_type(v, json_type_object, "logit_bias", "an object of token id -> bias", e))
        return -1;
    int n = json_object_object_length(v);
    if (n > API_MAX_BIAS)
        return api_bad(e, "invalid_value", "logit_bias", "'logit_bias' may hold at most %d entries", API_MAX_BIAS);
    r->bias = calloc(n ? (size_t)n : 1, sizeof *r->bias);
    if (!r->bias)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    json_object_object_foreach(v, k, val) {
        char *end;
        long id = strtol(k, &end, 10);
        if (end == k || *end || id < 0 || id >= lim->n_vocab)
            return api_bad(e, "invalid_value", "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)",
                           k, lim->n_vocab);
        double b;
        if (!val || get_num(val, "logit_bias", -100, 100, &b, e))
            return api_bad(e, "invalid_value", "logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->bias[r->n_bias].id = (int32_t)id;
        r->bias[r->n_bias].bias = (float)b;
        r->n_bias++;
    }
    return 0;
}

static int parse_stream_options(api_request *r, json_object *v, api_error *e)
{
    if (need_type(v, json_type_object, "stream_options", "an object", e))
        return -1;
    json_object_object_foreach(v, k, val) {
        if (!strcmp(k, "include_usage")) {
            if (val && get_bool(val, "stream_options.include_usage", &r->include_usage, e))
                return -1;
        } else {
            char key[96];
            snprintf(key, sizeof key, "stream_options.%.60s", k);
            return api_bad(e, "unsupported_parameter", key, "unsupported field '%s'", key);
        }
    }
    return 0;
}

static int parse_response_format(json_object *v, api_error *e)
{
    json_object *t = NULL;
    if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return api_bad(e, "invalid_type", "response_format", "'response_format' must be an object with a 'type'");
    return 0; /* the rest is checked by api_structured_parse */
}

/* Fields OpenAI defines as hints with no effect on the output. */
static int is_noop_hint(const char *k)
{
    static const char *const hints[] = {"user", "metadata", "store", "service_tier"};
    for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
        if (!strcmp(k, hints[i]))
            return 1;
    return 0;
}

static int is_structured(const char *k)
{
    static const char *const keys[] = {"guided_json", "guided_grammar", "guided_regex", "guided_choice",
                                       "structured_outputs"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i]))
            return 1;
    return 0;
}

/* Every top-level field name either endpoint understands, for "did you mean". */
static const char *const known_fields[] = {
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "seed", "stop", "n",
    "best_of", "logprobs", "top_logprobs", "stream", "stream_options", "ignore_eos", "skip_special_tokens", "echo",
    "suffix", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "add_generation_prompt",
    "include_reasoning", "reasoning_effort", "response_format", "guided_json", "guided_grammar", "guided_regex",
    "guided_choice", "structured_outputs", "user", "metadata", "store", "service_tier", "min_tokens",
    "stop_token_ids", "include_stop_str_in_output", "cache_prompt", "n_predict", "repeat_penalty", "grammar",
    "json_schema"};

/* Levenshtein distance of a and b, capped at 3 (names past 63 bytes: 3). */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 3;
    if ((la > lb ? la - lb : lb - la) > 2)
        return 3;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb] < 3 ? row[lb] : 3;
}

/* A field no branch took: a known name (of the other endpoint) or a likely
 * misspelling of one is a 400; anything else is ignored and listed in
 * r->ignored (the server sends it back in a Warning header). */
static int unknown_field(api_request *r, const char *k, api_error *e)
{
    const char *near = NULL;
    int best = 3;
    for (size_t i = 0; i < sizeof known_fields / sizeof known_fields[0]; i++) {
        int d = edit_distance(k, known_fields[i]);
        if (d < best) {
            best = d;
            near = known_fields[i];
        }
    }
    if (best == 0)
        return api_bad(e, "unsupported_parameter", k, "Unsupported parameter: '%.60s' is not supported on this endpoint",
                       k);
    if (near)
        return api_bad(e, "unsupported_parameter", k, "Unknown parameter: '%.60s' (did you mean '%s'?)", k, near);
    size_t used = strlen(r->ignored), kl = strlen(k);
    if (used + kl + 3 < sizeof r->ignored)
        snprintf(r->ignored + used, sizeof r->ignored - used, "%s%s", used ? ", " : "", k);
    else if (used + 5 < sizeof r->ignored && strcmp(r->ignored + used - 3, "...") != 0)
        snprintf(r->ignored + used, sizeof r->ignored - used, ", ...");
    return 0;
}

/* One top-level field. Returns 0, or -1 with e set. */
static int parse_field(api_request *r, const char *k, json_object *v, const api_limits *lim, int *seen_lp,
                       int *seen_top, int *seen_choice, long long *best_of, api_error *e)
{
    int chat = r->kind == API_CHAT;
    long long i;
    double d;
    if (!strcmp(k, "model")) {
        if (need_type(v, json_type_string, k, "a string", e))
            return -1;
        r->model = json_object_get_string(v);
        return 0;
    }
    if (chat && !strcmp(k, "messages"))
        return parse_messages(r, v, e);
    if (!chat && !strcmp(k, "prompt"))
        return parse_prompt(r, v, lim, e);
    if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens")) {
        if (get_int(v, k, 1, 1 << 30, &i, e))
            return -1;
        /* max_completion_tokens wins over the deprecated max_tokens */
        if (!strcmp(k, "max_completion_tokens") || r->max_tokens < 0)
            r->max_tokens = (int)i;
        return 0;
    }
    if (!strcmp(k, "temperature")) {
        if (get_num(v, k, 0, 2, &d, e))
            return -1;
        r->sample.temperature = (float)d;
        return 0;
    }
    if (!strcmp(k, "top_p")) {
        if (get_num(v, k, 0, 1, &d, e))
            return -1;
        if (d <= 0)
            return api_bad(e, "invalid_value", k, "'top_p' must be greater than 0 and at most 1");
        r->sample.top_p = (float)d;
        return 0;
    }
    if (!strcmp(k, "top_k")) {
        if (get_int(v, k, -1, 1 << 30, &i, e))
            return -1;
        r->sample.top_k = i < 0 ? 0 : (int)i;
        return 0;
    }
    if (!strcmp(k, "min_p")) {
        if (get_num(v, k, 0, 1, &d, e))
            return -1;
        r->sample.min_p = (float)d;
        return 0;
    }
    if (!strcmp(k, "repetition_penalty")) {
        if (get_num(v, k, 0, 100, &d, e))
            return -1;
        if (d <= 0)
            return api_bad(e, "invalid_value", k, "'repetition_penalty' must be greater than 0");
        r->sample.repetition_penalty = (float)d;
        return 0;
    }
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty")) {
        if (get_num(v, k, -2, 2, &d, e))
            return -1;
        if (k[0] == 'p')
            r->sample.presence_penalty = (float)d;
        else
            r->sample.frequency_penalty = (float)d;
        return 0;
    }
    if (!strcmp(k, "logit_bias"))
        return parse_logit_bias(r, v, lim, e);
    if (!strcmp(k, "seed")) {
        if (get_int(v, k, INT64_MIN, INT64_MAX, &i, e))
            return -1;
        r->sample.seed = (uint64_t)i;
        r->has_seed = 1;
        return 0;
    }
    if (!strcmp(k, "stop"))
        return parse_stop(r, v, e);
    if (!strcmp(k, "n")) {
        if (get_int(v, k, 1, API_MAX_N, &i, e))
            return -1;
        r->n = (int)i;
        return 0;
    }
    if (!chat && !strcmp(k, "best_of"))
        return get_int(v, k, 1, API_MAX_N, best_of, e);
    if (!strcmp(k, "logprobs")) {
        *seen_lp = 1;
        if (chat)
            return get_bool(v, k, &r->logprobs, e);
        if (json_object_is_type(v, json_type_boolean))
            return api_bad(e, "invalid_type", k, "'logprobs' must be an integer for completions");
        if (get_int(v, k, 0, API_MAX_TOP_LOGPROBS, &i, e))
            return -1;
        r->logprobs = 1;
        r->top_logprobs = (int)i;
        return 0;
    }
    if (chat && !strcmp(k, "top_logprobs")) {
        *seen_top = 1;
        if (get_int(v, k, 0, API_MAX_TOP_LOGPROBS, &i, e))
            return -1;
        r->top_logprobs = (int)i;
        return 0;
    }
    if (!strcmp(k, "stream"))
        return get_bool(v, k, &r->stream, e);
    if (!strcmp(k, "stream_options"))
        return parse_stream_options(r, v, e);
    if (!strcmp(k, "ignore_eos"))
        return get_bool(v, k, &r->ignore_eos, e);
    if (!strcmp(k, "min_tokens")) {
        if (get_int(v, k, 0, 1 << 30, &i, e))
            return -1;
        r->min_tokens = (int)i;
        return 0;
    }
    if (!strcmp(k, "stop_token_ids"))
        return parse_stop_ids(r, v, lim, e);
    if (!strcmp(k, "include_stop_str_in_output"))
        return get_bool(v, k, &r->include_stop_str, e);
    /* llama-server's names; resolved against the OpenAI ones in api_parse */
    if (!strcmp(k, "cache_prompt")) /* the prefix cache is always on */
        return get_bool(v, k, &(int){0}, e);
    if (!strcmp(k, "n_predict")) {
        if (get_int(v, k, -1, 1 << 30, &i, e))
            return -1;
        if (i == 0)
            return api_bad(e, "invalid_value", k, "'n_predict' must be -1 (no limit) or at least 1");
        return 0;
    }
    if (!strcmp(k, "repeat_penalty")) {
        if (get_num(v, k, 0, 100, &d, e))
            return -1;
        if (d <= 0)
            return api_bad(e, "invalid_value", k, "'repeat_penalty' must be greater than 0");
        return 0;
    }
    if (!strcmp(k, "grammar"))
        return need_type(v, json_type_string, k, "a string (GBNF / EBNF grammar)", e);
    if (!strcmp(k, "json_schema"))
        return need_type(v, json_type_object, k, "an object (a JSON schema)", e);
    if (!strcmp(k, "skip_special_tokens"))
        return get_bool(v, k, &r->skip_special, e);
    if (!chat && !strcmp(k, "echo"))
        return get_bool(v, k, &r->echo, e);
    if (!chat && !strcmp(k, "suffix")) {
        if (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0)
            return 0;
        return api_bad(e, "unsupported_parameter", k, "'suffix' is not supported");
    }
    if (chat && !strcmp(k, "tools"))
        return parse_tools(v, e) ? -1 : (r->tools = v, 0);
    if (chat && !strcmp(k, "tool_choice"))
        return *seen_choice = 1, parse_tool_choice(r, v, e);
    if (chat && !strcmp(k, "parallel_tool_calls"))
        return get_bool(v, k, &r->parallel_tool_calls, e);
    if (chat && !strcmp(k, "chat_template_kwargs")) {
        if (need_type(v, json_type_object, k, "an object", e))
            return -1;
        r->template_kwargs = v;
        return 0;
    }
    if (chat && !strcmp(k, "add_generation_prompt"))
        return get_bool(v, k, &r->add_generation_prompt, e);
    if (chat && !strcmp(k, "include_reasoning"))
        return get_bool(v, k, &r->include_reasoning, e);
    if (chat && !strcmp(k, "reasoning_effort")) {
        if (need_type(v, json_type_string, k, "a string", e) ||
            reasoning_effort_parse(json_object_get_string(v), &r->enable_thinking, &r->reasoning_budget))
            return api_bad(e, "invalid_value", k, "'reasoning_effort' must be one of none, minimal, low, medium, high");
        r->reasoning_effort = json_object_get_string(v);
        return 0;
    }
    if (!strcmp(k, "response_format"))
        return parse_response_format(v, e);
    if (is_structured(k))
        return 0; /* read from root by api_structured_parse */
    if (is_noop_hint(k))
        return 0;
    return unknown_field(r, k, e);
}

int api_thinking_off(const api_request *r)
{
    json_object *et = NULL;
    if (r->template_kwargs && json_object_object_get_ex(r->template_kwargs, "enable_thinking", &et) && et)
        return !json_object_get_boolean(et);
    return r->enable_thinking == 0;
}

void api_request_free(api_request *r)
{
    if (!r)
        return;
    json_object_put(r->messages);
    json_object_put(r->root);
    api_structured_free(&r->structured_spec);
    free(r->prompt_ids);
    free(r->bias);
    free(r->stop);
    free(r->stop_ids);
    for (int i = 0; i < r->n_batch; i++)
        free(r->batch[i].ids);
    free(r->batch);
    structured_free(r->structured);
    memset(r, 0, sizeof *r);
}

int api_parse(api_request *r, api_kind kind, const char *body, size_t len, const api_limits *lim,
              api_error *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->n = 1;
    r->skip_special = 1;
    r->add_generation_prompt = 1;
    r->include_reasoning = 1;
    r->enable_thinking = -1;
    r->reasoning_budget = -1;
    r->parallel_tool_calls = 1;
    sample_params_default(&r->sample);
    size_t valid = api_utf8_valid_len(body, len);
    if (valid != len)
        return api_bad(e, "invalid_encoding", NULL, "request body is not valid UTF-8 (at byte %zu)", valid);
    tern_err je;
    r->root = tern_json_parse(body, len, &je);
    if (!r->root)
        return api_bad(e, "invalid_json", NULL, "request body is not valid JSON: %s", je.msg);
    if (!json_object_is_type(r->root, json_type_object)) {
        api_request_free(r);
        return api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
    }
    int seen_lp = 0, seen_top = 0, seen_choice = 0;
    long long best_of = 0;
    json_object_object_foreach(r->root, k, v) {
        if (!v)
            continue; /* null = absent, as OpenAI's SDKs send it */
        if (parse_field(r, k, v, lim, &seen_lp, &seen_top, &seen_choice, &best_of, e))
            goto fail;
    }
    if (resolve_aliases(r, e))
        goto fail;
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens) {
        api_bad(e, "invalid_value", "min_tokens", "'min_tokens' (%d) must not exceed the maximum tokens (%d)",
                r->min_tokens, r->max_tokens);
        goto fail;
    }
    if (kind == API_CHAT && !r->messages) {
        api_bad(e, "missing_required_parameter", "messages", "'messages' is required");
        goto fail;
    }
    if (r->n_batch && r->n_batch * r->n > API_MAX_N) {
        api_bad(e, "invalid_value", "prompt", "%d prompts x n=%d is more than %d choices", r->n_batch, r->n, API_MAX_N);
        goto fail;
    }
    if (kind == API_COMPLETION && !r->prompt && !r->prompt_ids && !r->n_batch) {
        api_bad(e, "missing_required_parameter", "prompt", "'prompt' is required");
        goto fail;
    }
    if (r->model && lim->model_name && strcmp(r->model, lim->model_name) != 0) {
        api_error_set(e, 400, "invalid_request_error", "model_not_found", "model",
                      "The model '%.200s' does not exist (this server serves '%.200s')", r->model, lim->model_name);
        goto fail;
    }
    if (kind == API_CHAT && seen_top && !r->logprobs && r->top_logprobs > 0) {
        api_bad(e, "invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        goto fail;
    }
    if (best_of && best_of != r->n) {
        api_bad(e, "unsupported_value", "best_of", "'best_of' other than 'n' is not supported");
        goto fail;
    }
    if (r->include_usage && !r->stream) {
        api_bad(e, "invalid_value", "stream_options", "'stream_options' is only allowed when 'stream' is true");
        goto fail;
    }
    if (r->echo && r->logprobs) {
        api_bad(e, "unsupported_value", "echo", "'echo' together with 'logprobs' is not supported");
        goto fail;
    }
    if (kind == API_CHAT && check_tools(r, seen_choice, e))
        goto fail;
    (void)seen_lp;
    r->sample.n_logprobs = r->logprobs ? r->top_logprobs : -1;
    r->sample.bias = r->bias;
    r->sample.n_bias = r->n_bias;
    tern_err se;
    if (sample_params_check(&r->sample, lim->n_vocab, &se)) {
        api_bad(e, "invalid_value", NULL, "%s", se.msg);
        goto fail;
    }
    if (api_structured_parse(r, e)) /* last: every other field's 400 comes first */
        goto fail;
    return 0;
fail:
    api_request_free(r);
    return -1;
}
