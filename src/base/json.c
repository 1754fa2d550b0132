/* json-c glue (see json.h). */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"

json_object *tern_json_parse(const char *buf, size_t len, tern_err *err)
{
    json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!tok) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tok, buf, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    if (!o || je != json_tokener_success || (size_t)json_tokener_get_parse_end(tok) != len) {
        size_t end = json_tokener_get_parse_end(tok);
        /* trailing whitespace is fine */
        int only_ws = o && je == json_tokener_success;
        for (size_t i = end; only_ws && i < len; i++)
            if (!strchr(" \t\r\n", buf[i]))
                only_ws = 0;
        if (!only_ws) {
            tern_err_set_pos(err, TERN_EFORMAT, (long)end, "invalid JSON at byte %zu: %s", end,
                             je == json_tokener_success ? "trailing data"
                             : je == json_tokener_continue ? "unexpected end of input"
                                                           : json_tokener_error_desc(je));
            json_object_put(o);
            o = NULL;
        }
    }
    json_tokener_free(tok);
    return o;
}

json_object *tern_json_parse_file(const char *path, tern_err *err)
{
    size_t len;
    char *buf = tern_file_read(path, &len, 0, err);
    if (!buf)
        return NULL;
    json_object *o = tern_json_parse(buf, len, err);
    free(buf);
    if (!o)
        tern_err_wrap(err, "%s", path);
    return o;
}

static json_object *field(json_object *o, const char *key)
{
    json_object *v = NULL;
    if (!o || !json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, key, &v))
        return NULL;
    return v; /* NULL for JSON null too */
}

int tern_json_get_int(json_object *o, const char *key, int64_t *out, const char *doc, tern_err *err)
{
    json_object *v = field(o, key);
    if (!v)
        return TERN_ENOTFOUND;
    if (json_object_is_type(v, json_type_int)) {
        *out = json_object_get_int64(v);
        return 0;
    }
    if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (d == (double)(int64_t)d) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return tern_err_set(err, TERN_EFORMAT, "%s: field '%s' must be an integer", doc, key);
}

int tern_json_get_num(json_object *o, const char *key, double *out, const char *doc, tern_err *err)
{
    json_object *v = field(o, key);
    if (!v)
        return TERN_ENOTFOUND;
    if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
        *out = json_object_get_double(v);
        return 0;
    }
    return tern_err_set(err, TERN_EFORMAT, "%s: field '%s' must be a number", doc, key);
}

int tern_json_get_bool(json_object *o, const char *key, int *out, const char *doc, tern_err *err)
{
    json_object *v = field(o, key);
    if (!v)
        return TERN_ENOTFOUND;
    if (json_object_is_type(v, json_type_boolean)) {
        *out = json_object_get_boolean(v);
        return 0;
    }
    return tern_err_set(err, TERN_EFORMAT, "%s: field '%s' must be true or false", doc, key);
}

int tern_json_get_str(json_object *o, const char *key, const char **out, const char *doc, tern_err *err)
{
    json_object *v = field(o, key);
    if (!v)
        return TERN_ENOTFOUND;
    if (json_object_is_type(v, json_type_string)) {
        *out = json_object_get_string(v);
        return 0;
    }
    return tern_err_set(err, TERN_EFORMAT, "%s: field '%s' must be a string", doc, key);
}

size_t tern_json_escape(char *out, size_t cap, const char *s, size_t len)
{
    size_t n = 0;
#define PUT(c) do { if (n + 1 < cap) out[n] = (c); n++; } while (0)
    PUT('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': PUT('\\'); PUT('"'); break;
        case '\\': PUT('\\'); PUT('\\'); break;
        case '\n': PUT('\\'); PUT('n'); break;
        case '\r': PUT('\\'); PUT('r'); break;
        case '\t': PUT('\\'); PUT('t'); break;
        case '\b': PUT('\\'); PUT('b'); break;
        case '\f': PUT('\\'); PUT('f'); break;
        default:
            if (c < 0x20) {
                char hex[8];
                snprintf(hex, sizeof hex, "\\u%04x", c);
                for (int k = 0; hex[k]; k++)
                    PUT(hex[k]);
            } else {
                PUT((char)c);
            }
        }
    }
    PUT('"');
#undef PUT
    if (cap)
        out[n < cap ? n : cap - 1] = '\0';
    return n;
}
