/* Response bodies in OpenAI's shapes: errors, envelopes of completions and
 * stream chunks, usage blocks, logprob entries, and the SSE framing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

#define JSON_FLAGS (JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)

char *api_json_take(json_object *o)
{
    const char *s = json_object_to_json_string_ext(o, JSON_FLAGS);
    char *out = s ? strdup(s) : NULL;
    json_object_put(o);
    return out;
}

char *api_error_json(const api_error *e)
{
    json_object *o = json_object_new_object(), *in = json_object_new_object();
    if (!o || !in) {
        json_object_put(o);
        json_object_put(in);
        return NULL;
    }
    json_object_object_add(in, "message", api_json_string(e->msg, strlen(e->msg)));
    json_object_object_add(in, "type", json_object_new_string(e->type ? e->type : "invalid_request_error"));
    json_object_object_add(in, "param", e->param[0] ? api_json_string(e->param, strlen(e->param)) : NULL);
    json_object_object_add(in, "code", e->code ? json_object_new_string(e->code) : NULL);
    json_object_object_add(o, "error", in);
    return api_json_take(o);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

size_t api_utf8_valid_len(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t l = utf8_seq(u + i, len - i);
        if (!l)
            break;
        i += l;
    }
    return i;
}

json_object *api_json_string(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t l = utf8_seq(u + i, len - i);
        if (!l || (l == 1 && u[i] == 0))
            break;
        i += l;
    }
    if (i == len)
        return json_object_new_string_len(s, (int)len);
    /* slow path: replace each invalid byte (and NUL) by U+FFFD */
    char *buf = malloc(len * 3 + 1), *w = buf;
    if (!buf)
        return NULL;
    for (i = 0; i < len;) {
        size_t l = utf8_seq(u + i, len - i);
        if (!l || (l == 1 && u[i] == 0)) {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        } else {
            memcpy(w, s + i, l);
            w += l;
            i += l;
        }
    }
    json_object *o = json_object_new_string_len(buf, (int)(w - buf));
    free(buf);
    return o;
}

static json_object *bytes_array(const char *b, size_t n)
{
    json_object *a = json_object_new_array_ext((int)n);
    for (size_t i = 0; i < n; i++)
        json_object_array_add(a, json_object_new_int((unsigned char)b[i]));
    return a;
}

static json_object *chat_lp_entry(int32_t id, float logprob, api_token_fn fn, void *ctx)
{
    api_token_text t = fn(ctx, id);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "token", api_json_string(t.bytes, t.len));
    json_object_object_add(o, "logprob", json_object_new_double((double)logprob));
    json_object_object_add(o, "bytes", bytes_array(t.bytes, t.len));
    return o;
}

json_object *api_chat_logprob(const sample_result *lp, int n_top, api_token_fn fn, void *ctx)
{
    json_object *o = chat_lp_entry(lp->id, lp->logprob, fn, ctx);
    json_object *top = json_object_new_array();
    int n = lp->n_top < n_top ? lp->n_top : n_top;
    for (int i = 0; i < n; i++)
        json_object_array_add(top, chat_lp_entry(lp->top[i].id, lp->top[i].logprob, fn, ctx));
    json_object_object_add(o, "top_logprobs", top);
    return o;
}

static json_object *arr_field(json_object *o, const char *k)
{
    json_object *a = NULL;
    if (!json_object_object_get_ex(o, k, &a)) {
        a = json_object_new_array();
        json_object_object_add(o, k, a);
    }
    return a;
}

void api_completion_logprob_add(json_object **lp_obj, const sample_result *lp, int n_top, size_t text_offset,
                                api_token_fn fn, void *ctx)
{
    if (!*lp_obj)
        *lp_obj = json_object_new_object();
    json_object *o = *lp_obj;
    api_token_text t = fn(ctx, lp->id);
    json_object_array_add(arr_field(o, "tokens"), api_json_string(t.bytes, t.len));
    json_object_array_add(arr_field(o, "token_logprobs"), json_object_new_double((double)lp->logprob));
    json_object *top = json_object_new_object();
    int n = lp->n_top < n_top ? lp->n_top : n_top;
    for (int i = 0; i < n; i++) {
        api_token_text a = fn(ctx, lp->top[i].id);
        json_object *s = api_json_string(a.bytes, a.len);
        json_object_object_add(top, json_object_get_string(s), json_object_new_double((double)lp->top[i].logprob));
        json_object_put(s);
    }
    json_object_array_add(arr_field(o, "top_logprobs"), top);
    json_object_array_add(arr_field(o, "text_offset"), json_object_new_int64((int64_t)text_offset));
}

json_object *api_usage(int n_prompt, int n_completion, int n_cached)
{
    json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(n_completion));
    json_object_object_add(u, "total_tokens", json_object_new_int(n_prompt + n_completion));
    json_object_object_add(d, "cached_tokens", json_object_new_int(n_cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

json_object *api_envelope(const char *id, const char *object, long long created, const char *model,
                          json_object **choices)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(id));
    json_object_object_add(o, "object", json_object_new_string(object));
    json_object_object_add(o, "created", json_object_new_int64(created));
    json_object_object_add(o, "model", api_json_string(model, strlen(model)));
    json_object_object_add(o, "system_fingerprint", json_object_new_string("tern"));
    *choices = json_object_new_array();
    json_object_object_add(o, "choices", *choices);
    return o;
}

int api_buf_append(api_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return TERN_ENOMEM;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int api_buf_sse(api_buf *b, json_object *o)
{
    const char *s = json_object_to_json_string_ext(o, JSON_FLAGS);
    int rc = !s ? TERN_ENOMEM : 0;
    if (!rc)
        rc = api_buf_append(b, "data: ", 6);
    if (!rc)
        rc = api_buf_append(b, s, strlen(s));
    if (!rc)
        rc = api_buf_append(b, "\n\n", 2);
    json_object_put(o);
    return rc;
}

void api_buf_free(api_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}
