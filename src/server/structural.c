/* Structural tags (xgrammar's, as vLLM accepts them): free text in which a
 * trigger starts a tagged segment - begin, a constrained content, end -
 * after which the text is free again (constraint.h: a rearming lazy
 * grammar). Shapes accepted (response_format, or structured_outputs'
 * structural_tag as an object or as JSON text):
 *
 *   {"type": "structural_tag", "structures": [{"begin", "schema", "end"}...],
 *    "triggers": [...]}                                           (vLLM's first form)
 *   {"type": "structural_tag", "format": {"type": "triggered_tags",
 *    "triggers": [...], "tags": [{"begin", "content", "end"}...],
 *    "at_least_one": false, "stop_after_first": false}}            (xgrammar's)
 *   {"type": "structural_tag", "format": {"type": "tag", "begin", "content", "end"}}
 *                                                       (one segment, no free text)
 *   content: {"type": "json_schema", "json_schema": SCHEMA} | {"type": "const_string", "value": TEXT}
 *          | {"type": "regex", "pattern": RE} | {"type": "grammar", "grammar": EBNF}
 *
 * Every tag's begin starts with one of the triggers (as xgrammar requires),
 * so a trigger in the free text can only go on as one of the tags. Other
 * format types (sequence, or, any_text, tags_with_separator, ...) are a 400
 * naming the type. The grammar of one segment:
 *
 *   root ::= st0 | st1 | ...      stI ::= BEGIN stI_root END
 *
 * with stI_root the content's grammar, its rules renamed with the prefix
 * stI_. The grammar text plus the triggers is the cache key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/strbuf.h"
#include "engine/constraint.h"
#include "grammar/frontend.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "server/server_int.h"
#include "server/structured.h"

/* Tags and triggers one request may hold (each tag compiles a content). */
#define STRUCTURAL_MAX_TAGS 256

typedef struct st_build {
    tern_sbuf g;               /* the grammar */
    const char *trig[STRUCTURAL_MAX_TAGS];
    size_t n_trig, n_tags;
    int free_text;             /* triggered: free text around the tags */
    int rearm, at_least_one;
    int any_ws, max_ws;
} st_build;

void structured_ebnf_literal(tern_sbuf *b, const char *s, size_t len)
{
    char tmp[8];
    tern_sbuf_str(b, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            tern_sbuf_put(b, tmp, 2);
        } else if (c == '\n') {
            tern_sbuf_str(b, "\\n");
        } else if (c == '\t') {
            tern_sbuf_str(b, "\\t");
        } else if (c == '\r') {
            tern_sbuf_str(b, "\\r");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            tern_sbuf_str(b, tmp);
        } else {
            tern_sbuf_put(b, s + i, 1);
        }
    }
    tern_sbuf_str(b, "\"");
}

static int name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int name_char(char c) { return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

void structured_ebnf_renamed(tern_sbuf *b, const char *ebnf, const char *prefix)
{
    const char *p = ebnf;
    while (*p) {
        const char *q = p;
        if (*p == '"' || *p == '\'' || *p == '[') {
            char close = *p == '[' ? ']' : *p;
            q++;
            while (*q && *q != close)
                q += q[0] == '\\' && q[1] ? 2 : 1;
            if (*q)
                q++;
        } else if (*p == '#') {
            while (*q && *q != '\n')
                q++;
        } else if (name_start(*p)) {
            while (name_char(*q))
                q++;
            tern_sbuf_str(b, prefix);
        } else {
            q++;
        }
        tern_sbuf_put(b, p, (size_t)(q - p));
        p = q;
    }
    tern_sbuf_str(b, "\n");
}

/* A string field; NULL (with e set) if missing or not a string. */
static const char *str_field(json_object *o, const char *key, const char *at, int may_be_empty, api_error *e)
{
    char param[320];
    snprintf(param, sizeof param, "%.240s.%s", at, key);
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) {
        api_bad(e, "invalid_value", param, "'%s' must be a string", param);
        return NULL;
    }
    if (!may_be_empty && json_object_get_string_len(v) == 0) {
        api_bad(e, "invalid_value", param, "'%s' must not be empty", param);
        return NULL;
    }
    return json_object_get_string(v);
}

/* Only the listed keys (and "type") may appear in o. */
static int only_keys(json_object *o, const char *const *keys, const char *at, api_error *e)
{
    json_object_object_foreach(o, k, v) {
        (void)v;
        int known = !strcmp(k, "type");
        for (size_t i = 0; keys[i] && !known; i++)
            known = !strcmp(k, keys[i]);
        if (!known) {
            char param[320];
            snprintf(param, sizeof param, "%.240s.%.40s", at, k);
            return api_bad(e, "unsupported_parameter", param, "unsupported field '%s'", param);
        }
    }
    return 0;
}

static int bool_field(json_object *o, const char *key, const char *at, int *out, api_error *e)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v) || !v)
        return 0;
    if (!json_object_is_type(v, json_type_boolean)) {
        char param[320];
        snprintf(param, sizeof param, "%.240s.%s", at, key);
        return api_bad(e, "invalid_type", param, "'%s' must be a boolean", param);
    }
    *out = json_object_get_boolean(v);
    return 0;
}

/* Appends tag I's content grammar (its rules prefixed stI_) to the build. */
static int put_content(st_build *b, size_t i, int kind_schema, json_object *schema, const char *type,
                       json_object *content, const char *at, api_error *e)
{
    char *ebnf = NULL;
    tern_err te = {0};
    int rc = 0;
    char param[320];
    snprintf(param, sizeof param, "%.240s", at);
    if (kind_schema) {
        grammar_schema_opts o;
        grammar_schema_opts_init(&o);
        o.any_whitespace = b->any_ws;
        o.max_whitespace = b->max_ws;
        rc = grammar_schema_to_ebnf(schema, &o, &ebnf, &te);
    } else if (!strcmp(type, "json_schema")) {
        static const char *const keys[] = {"json_schema", NULL};
        json_object *s = NULL;
        if (only_keys(content, keys, at, e))
            return -1;
        if (!json_object_object_get_ex(content, "json_schema", &s) ||
            (!json_object_is_type(s, json_type_object) && !json_object_is_type(s, json_type_boolean)))
            return api_bad(e, "invalid_value", param, "'%s' needs 'json_schema': a JSON Schema", param);
        return put_content(b, i, 1, s, NULL, NULL, at, e);
    } else if (!strcmp(type, "const_string")) {
        static const char *const keys[] = {"value", NULL};
        const char *v = only_keys(content, keys, at, e) ? NULL : str_field(content, "value", at, 1, e);
        if (!v)
            return -1;
        tern_sbuf lit = {0};
        tern_sbuf_str(&lit, "root ::= ");
        structured_ebnf_literal(&lit, v, strlen(v));
        if (!*v)
            tern_sbuf_str(&lit, " | \"\"");
        ebnf = lit.s;
        if (lit.oom)
            rc = tern_err_set(&te, TERN_ENOMEM, "out of memory");
    } else if (!strcmp(type, "regex")) {
        static const char *const keys[] = {"pattern", NULL};
        const char *re = only_keys(content, keys, at, e) ? NULL : str_field(content, "pattern", at, 0, e);
        if (!re)
            return -1;
        rc = grammar_regex_to_ebnf(re, strlen(re), &ebnf, &te);
    } else if (!strcmp(type, "grammar")) {
        static const char *const keys[] = {"grammar", NULL};
        const char *g = only_keys(content, keys, at, e) ? NULL : str_field(content, "grammar", at, 0, e);
        if (!g)
            return -1;
        if (!(ebnf = strdup(g)))
            rc = tern_err_set(&te, TERN_ENOMEM, "out of memory");
    } else {
        snprintf(param, sizeof param, "%.240s.type", at);
        return api_bad(e, "unsupported_value", param,
                       "'%s' '%.40s' is not supported (json_schema, const_string, regex or grammar)", param, type);
    }
    if (rc) {
        free(ebnf);
        return api_bad(e, structured_error_code(te.code), at, "%s: cannot compile the content: %s", at, te.msg);
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "st%zu_", i);
    structured_ebnf_renamed(&b->g, ebnf, prefix);
    free(ebnf);
    return 0;
}

/* One tag: stI ::= BEGIN stI_root END, and its content's rules. */
static int put_tag(st_build *b, const char *begin, const char *end, int kind_schema, json_object *schema,
                   json_object *content, const char *at, api_error *e)
{
    size_t i = b->n_tags;
    if (i == STRUCTURAL_MAX_TAGS)
        return api_bad(e, "invalid_value", at, "at most %d tags", STRUCTURAL_MAX_TAGS);
    if (b->free_text) {
        int ok = 0;
        for (size_t k = 0; k < b->n_trig && !ok; k++)
            ok = !strncmp(begin, b->trig[k], strlen(b->trig[k]));
        if (!ok) {
            char param[320];
            snprintf(param, sizeof param, "%.240s.begin", at);
            return api_bad(e, "invalid_value", param, "'%s' must start with one of the triggers", param);
        }
    }
    const char *type = NULL;
    if (!kind_schema) {
        json_object *t = NULL;
        char param[320];
        snprintf(param, sizeof param, "%.240s.content", at);
        if (!json_object_is_type(content, json_type_object) || !json_object_object_get_ex(content, "type", &t) ||
            !json_object_is_type(t, json_type_string))
            return api_bad(e, "invalid_value", param, "'%s' must be an object with a 'type'", param);
        type = json_object_get_string(t);
        if (put_content(b, i, 0, NULL, type, content, param, e))
            return -1;
    } else if (put_content(b, i, 1, schema, NULL, NULL, at, e)) {
        return -1;
    }
    char line[48];
    snprintf(line, sizeof line, "st%zu ::= ", i);
    tern_sbuf_str(&b->g, line);
    structured_ebnf_literal(&b->g, begin, strlen(begin));
    snprintf(line, sizeof line, " st%zu_root ", i);
    tern_sbuf_str(&b->g, line);
    structured_ebnf_literal(&b->g, end, strlen(end));
    tern_sbuf_str(&b->g, "\n");
    b->n_tags++;
    return 0;
}

static int take_triggers(st_build *b, json_object *o, const char *at, api_error *e)
{
    char param[320];
    snprintf(param, sizeof param, "%.240s.triggers", at);
    json_object *t = NULL;
    if (!json_object_object_get_ex(o, "triggers", &t) || !json_object_is_type(t, json_type_array) ||
        json_object_array_length(t) == 0)
        return api_bad(e, "invalid_value", param, "'%s' must be a non-empty array of strings", param);
    if (json_object_array_length(t) > STRUCTURAL_MAX_TAGS)
        return api_bad(e, "invalid_value", param, "'%s' holds more than %d triggers", param, STRUCTURAL_MAX_TAGS);
    for (size_t i = 0; i < json_object_array_length(t); i++) {
        json_object *s = json_object_array_get_idx(t, i);
        size_t len = json_object_is_type(s, json_type_string) ? (size_t)json_object_get_string_len(s) : 0;
        if (len == 0 || len > CONSTRAINT_TRIGGER_MAX)
            return api_bad(e, "invalid_value", param, "'%s[%zu]' must be a string of 1 to %d bytes", param, i,
                           CONSTRAINT_TRIGGER_MAX);
        b->trig[b->n_trig++] = json_object_get_string(s);
    }
    return 0;
}

/* The body of the tag object (its shape checked), into the build. */
static int build(st_build *b, json_object *tag, const char *P, api_error *e)
{
    json_object *structures = NULL, *format = NULL, *tags = NULL, *t = NULL;
    if (json_object_object_get_ex(tag, "structures", &structures)) { /* vLLM's first form */
        static const char *const keys[] = {"structures", "triggers", NULL};
        if (only_keys(tag, keys, P, e))
            return -1;
        b->free_text = b->rearm = 1;
        if (take_triggers(b, tag, P, e))
            return -1;
        char param[320];
        snprintf(param, sizeof param, "%.240s.structures", P);
        if (!json_object_is_type(structures, json_type_array) || json_object_array_length(structures) == 0)
            return api_bad(e, "invalid_value", param, "'%s' must be a non-empty array", param);
        for (size_t i = 0; i < json_object_array_length(structures); i++) {
            json_object *s = json_object_array_get_idx(structures, i), *schema = NULL;
            char at[320];
            snprintf(at, sizeof at, "%.240s[%zu]", param, i);
            static const char *const skeys[] = {"begin", "schema", "end", NULL};
            if (!json_object_is_type(s, json_type_object))
                return api_bad(e, "invalid_value", at, "'%s' must be an object {begin, schema, end}", at);
            const char *begin, *end;
            if (only_keys(s, skeys, at, e) || !(begin = str_field(s, "begin", at, 0, e)) ||
                !(end = str_field(s, "end", at, 1, e)))
                return -1;
            if (!json_object_object_get_ex(s, "schema", &schema) ||
                (!json_object_is_type(schema, json_type_object) && !json_object_is_type(schema, json_type_boolean)))
                return api_bad(e, "invalid_value", at, "'%s' needs 'schema': a JSON Schema", at);
            if (put_tag(b, begin, end, 1, schema, NULL, at, e))
                return -1;
        }
        return 0;
    }
    static const char *const keys[] = {"format", NULL};
    if (only_keys(tag, keys, P, e))
        return -1;
    char fp[320];
    snprintf(fp, sizeof fp, "%.240s.format", P);
    if (!json_object_object_get_ex(tag, "format", &format) || !json_object_is_type(format, json_type_object) ||
        !json_object_object_get_ex(format, "type", &t) || !json_object_is_type(t, json_type_string))
        return api_bad(e, "invalid_value", P, "'%s' needs 'structures' and 'triggers', or a 'format' object with a "
                                              "'type'", P);
    const char *type = json_object_get_string(t);
    if (!strcmp(type, "tag")) { /* one segment, nothing around it */
        static const char *const tkeys[] = {"begin", "content", "end", NULL};
        const char *begin, *end;
        json_object *content = NULL;
        if (only_keys(format, tkeys, fp, e) || !(begin = str_field(format, "begin", fp, 1, e)) ||
            !(end = str_field(format, "end", fp, 1, e)))
            return -1;
        json_object_object_get_ex(format, "content", &content);
        return put_tag(b, begin, end, 0, NULL, content, fp, e);
    }
    if (strcmp(type, "triggered_tags")) {
        char param[320];
        snprintf(param, sizeof param, "%.240s.type", fp);
        return api_bad(e, "unsupported_value", param,
                       "'%s' '%.40s' is not supported (triggered_tags or tag)", param, type);
    }
    static const char *const fkeys[] = {"triggers", "tags", "at_least_one", "stop_after_first", NULL};
    int stop_after_first = 0;
    if (only_keys(format, fkeys, fp, e) || take_triggers(b, format, fp, e) ||
        bool_field(format, "at_least_one", fp, &b->at_least_one, e) ||
        bool_field(format, "stop_after_first", fp, &stop_after_first, e))
        return -1;
    b->free_text = 1;
    b->rearm = !stop_after_first;
    char param[320];
    snprintf(param, sizeof param, "%.240s.tags", fp);
    if (!json_object_object_get_ex(format, "tags", &tags) || !json_object_is_type(tags, json_type_array) ||
        json_object_array_length(tags) == 0)
        return api_bad(e, "invalid_value", param, "'%s' must be a non-empty array", param);
    for (size_t i = 0; i < json_object_array_length(tags); i++) {
        json_object *tg = json_object_array_get_idx(tags, i), *content = NULL;
        char at[320];
        snprintf(at, sizeof at, "%.240s[%zu]", param, i);
        static const char *const tkeys[] = {"begin", "content", "end", NULL};
        if (!json_object_is_type(tg, json_type_object))
            return api_bad(e, "invalid_value", at, "'%s' must be an object {begin, content, end}", at);
        const char *begin, *end;
        if (only_keys(tg, tkeys, at, e) || !(begin = str_field(tg, "begin", at, 0, e)) ||
            !(end = str_field(tg, "end", at, 1, e)))
            return -1;
        json_object_object_get_ex(tg, "content", &content);
        if (put_tag(b, begin, end, 0, NULL, content, at, e))
            return -1;
    }
    return 0;
}

int structural_prepare(srv_model *mm, api_request *q, api_error *e)
{
    const api_structured_spec *sp = &q->structured_spec;
    st_build b = {0};
    b.any_ws = sp->any_ws;
    b.max_ws = sp->max_ws;
    if (!json_object_is_type(sp->json, json_type_object))
        return api_bad(e, "invalid_value", sp->param, "'%s' must be a structural tag object", sp->param);
    /* the tags first (their rules), then root over them */
    tern_sbuf root = {0};
    int rc = build(&b, sp->json, sp->param, e);
    if (!rc) {
        tern_sbuf_str(&root, "root ::= ");
        for (size_t i = 0; i < b.n_tags; i++) {
            char alt[32];
            snprintf(alt, sizeof alt, "%sst%zu", i ? " | " : "", i);
            tern_sbuf_str(&root, alt);
        }
        tern_sbuf_str(&root, "\n");
        tern_sbuf_put(&root, b.g.s ? b.g.s : "", b.g.n);
        tern_sbuf key = {0};
        tern_sbuf_str(&key, "structural_tag|");
        tern_sbuf_put(&key, root.s, root.n);
        if (root.oom || b.g.oom || key.oom) {
            rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        } else if (!b.free_text) {
            rc = structured_set_ebnf(mm, q, key.s, key.n, root.s, NULL, sp->param, e);
        } else {
            tern_err te = {0};
            const grammar_vocab *v = structured_vocab(mm, e);
            constraint_triggers *t = v ? constraint_triggers_new(v, b.trig, b.n_trig, NULL, 0, 0, &te) : NULL;
            if (!v) {
                rc = -1;
            } else if (!t) {
                rc = api_error_set(e, 500, "server_error", NULL, NULL, "structural tag: %s", te.msg);
            } else {
                constraint_lazy lz = {.triggers = t, .rearm = b.rearm, .at_least_one = b.at_least_one};
                rc = structured_set_ebnf(mm, q, key.s, key.n, root.s, &lz, sp->param, e);
                if (rc || structured_own_triggers(q->structured, t)) {
                    constraint_triggers_free(t);
                    if (!rc)
                        rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                }
            }
        }
        free(key.s);
    }
    free(root.s);
    free(b.g.s);
    return rc ? -1 : 0;
}
