/* Structured output: request fields -> grammar spec -> compiled grammar
 * (cached per server, keyed by the normalized spec) -> a constraint per
 * engine row. See structured.h and docs/structured-output.md.
 *
 * Field shapes accepted:
 *   response_format {type: text | json_object | json_schema,
 *                    json_schema: {name, schema, strict, description,
 *                                  any_whitespace, max_whitespace}}
 *   guided_json (schema object or JSON text), guided_grammar (EBNF text),
 *   guided_regex (text), guided_choice ([strings]),
 *   structured_outputs: a bare schema, or vLLM's object form
 *                       {json | regex | choice | grammar | json_object,
 *                        disable_any_whitespace}. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "base/json.h"
#include "base/log.h"
#include "engine/constraint.h"
#include "grammar/cache.h"
#include "grammar/frontend.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "server/server_int.h"
#include "server/structured.h"

/* Whitespace run cap between JSON tokens when the request says nothing:
 * enough for any pretty-printing, and a weak model cannot spin on blanks. */
#define STRUCTURED_DEFAULT_MAX_WS 20
/* Think tokens before </think> is forced, when max_tokens leaves no hint. */
#define STRUCTURED_THINK_CAP 4096

typedef enum spec_kind {
    SPEC_NONE = 0,
    SPEC_GRAMMAR,
    SPEC_SCHEMA,
    SPEC_JSON_OBJECT,
    SPEC_REGEX,
    SPEC_CHOICE,
} spec_kind;

static const char *const kind_names[] = {"none", "grammar", "json_schema", "json_object", "regex", "choice"};

typedef struct spec {
    spec_kind kind;
    char param[96];      /* the request field it came from */
    json_object *json;   /* SCHEMA / CHOICE: borrowed from the request or owned below */
    json_object *owned;  /* a schema parsed from JSON text */
    const char *text;    /* GRAMMAR / REGEX: borrowed */
    size_t text_len;
    int any_ws, max_ws, strict;
} spec;

typedef struct structured_server {
    grammar_vocab *v;
    grammar_cache *cache;
    int32_t think_open, think_close; /* -1 when the vocabulary has none */
} structured_server;

struct srv_structured {
    structured_server *ss; /* borrowed */
    grammar_cache_ref *ref;
    int lazy;              /* the grammar starts at a trigger (tool calls, toolcall.c) */
    int from_rf;           /* the spec came from response_format (not guided_* / structured_outputs) */
    constraint_lazy lz;
    spec_kind kind;
    double compile_ms;
    int cache_hit;
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- server-wide state ---- */

static structured_server *server_state(tern_server *s, api_error *e)
{
    pthread_mutex_lock(&init_mu);
    structured_server *ss = s->structured;
    if (!ss) {
        tern_err te = {0};
        ss = calloc(1, sizeof *ss);
        if (ss) {
            const model_config *cfg = model_config_get(s->m);
            ss->v = grammar_vocab_new(s->tok, cfg->n_vocab, cfg->eos_ids, (size_t)cfg->n_eos, &te);
            ss->cache = ss->v ? grammar_cache_new(ss->v, 0, NULL, &te) : NULL;
            ss->think_open = tokenizer_token_id(s->tok, "<think>");
            ss->think_close = tokenizer_token_id(s->tok, "</think>");
        } else {
            tern_err_set(&te, TERN_ENOMEM, "out of memory");
        }
        if (!ss || !ss->cache) {
            if (ss)
                grammar_vocab_free(ss->v);
            free(ss);
            ss = NULL;
            api_error_set(e, 500, "server_error", NULL, NULL, "structured output: %s", te.msg);
        }
        s->structured = ss;
    }
    pthread_mutex_unlock(&init_mu);
    return ss;
}

const grammar_vocab *structured_vocab(tern_server *s, api_error *e)
{
    structured_server *ss = server_state(s, e);
    return ss ? ss->v : NULL;
}

void structured_server_free(tern_server *s)
{
    structured_server *ss = s->structured;
    if (!ss)
        return;
    grammar_cache_free(ss->cache);
    grammar_vocab_free(ss->v);
    free(ss);
    s->structured = NULL;
}

void structured_free(srv_structured *st)
{
    if (!st)
        return;
    grammar_cache_release(st->ss->cache, st->ref);
    free(st);
}

/* ---- fields -> spec ---- */

static int bad_type(api_error *e, const char *param, const char *what)
{
    return api_bad(e, "invalid_type", param, "'%s' must be %s", param, what);
}

static int get_string_field(json_object *v, const char *param, const char **s, size_t *len, api_error *e)
{
    if (!json_object_is_type(v, json_type_string))
        return bad_type(e, param, "a string");
    *s = json_object_get_string(v);
    *len = (size_t)json_object_get_string_len(v);
    if (*len == 0)
        return api_bad(e, "invalid_value", param, "'%s' must not be empty", param);
    return 0;
}

/* A schema given as an object, or as JSON text (vLLM accepts both). */
static int take_schema(spec *sp, json_object *v, const char *param, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        tern_err je;
        json_object *o = tern_json_parse(json_object_get_string(v), (size_t)json_object_get_string_len(v), &je);
        if (!o)
            return api_bad(e, "invalid_value", param, "'%s' is not valid JSON: %s", param, je.msg);
        sp->owned = o;
        v = o;
    }
    if (!json_object_is_type(v, json_type_object) && !json_object_is_type(v, json_type_boolean))
        return bad_type(e, param, "a JSON Schema (an object)");
    sp->kind = SPEC_SCHEMA;
    sp->json = v;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int take_choice(spec *sp, json_object *v, const char *param, api_error *e)
{
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
        return bad_type(e, param, "a non-empty array of strings");
    for (size_t i = 0; i < json_object_array_length(v); i++)
        if (!json_object_is_type(json_object_array_get_idx(v, i), json_type_string))
            return bad_type(e, param, "a non-empty array of strings");
    sp->kind = SPEC_CHOICE;
    sp->json = v;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int take_text(spec *sp, spec_kind kind, json_object *v, const char *param, api_error *e)
{
    if (get_string_field(v, param, &sp->text, &sp->text_len, e))
        return -1;
    sp->kind = kind;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int get_bool_field(json_object *v, const char *param, int *out, api_error *e)
{
    if (!json_object_is_type(v, json_type_boolean))
        return bad_type(e, param, "a boolean");
    *out = json_object_get_boolean(v);
    return 0;
}

static int parse_json_schema_obj(spec *sp, json_object *js, api_error *e)
{
    const char *P = "response_format.json_schema";
    if (!json_object_is_type(js, json_type_object))
        return bad_type(e, P, "an object {name, schema, strict}");
    json_object *schema = NULL;
    json_object_object_foreach(js, k, v) {
        char param[96];
        snprintf(param, sizeof param, "%s.%.40s", P, k);
        if (!v)
            continue;
        if (!strcmp(k, "schema")) {
            schema = v;
        } else if (!strcmp(k, "name") || !strcmp(k, "description")) {
            if (!json_object_is_type(v, json_type_string))
                return bad_type(e, param, "a string");
        } else if (!strcmp(k, "strict")) {
            if (get_bool_field(v, param, &sp->strict, e))
                return -1;
        } else if (!strcmp(k, "any_whitespace")) {
            if (get_bool_field(v, param, &sp->any_ws, e))
                return -1;
        } else if (!strcmp(k, "max_whitespace")) {
            if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
                json_object_get_int64(v) > 256)
                return api_bad(e, "invalid_value", param, "'%s' must be an integer from 0 to 256", param);
            sp->max_ws = (int)json_object_get_int64(v);
        } else {
            return api_bad(e, "unsupported_parameter", param, "unsupported field '%s'", param);
        }
    }
    if (!schema) /* OpenAI: a json_schema without a schema admits any object */
        return sp->kind = SPEC_JSON_OBJECT, snprintf(sp->param, sizeof sp->param, "%s", P), 0;
    return take_schema(sp, schema, "response_format.json_schema.schema", e);
}

static int parse_response_format(json_object *rf, spec *schema_sp, spec *object_sp, api_error *e)
{
    json_object *t = NULL;
    if (!json_object_is_type(rf, json_type_object) || !json_object_object_get_ex(rf, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return api_bad(e, "invalid_type", "response_format", "'response_format' must be an object with a 'type'");
    const char *type = json_object_get_string(t);
    json_object_object_foreach(rf, k, v) {
        if (!strcmp(k, "type") || (!strcmp(type, "json_schema") && !strcmp(k, "json_schema")))
            continue;
        (void)v;
        char param[96];
        snprintf(param, sizeof param, "response_format.%.40s", k);
        return api_bad(e, "unsupported_parameter", param, "unsupported field '%s' for type '%.40s'", param, type);
    }
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        object_sp->kind = SPEC_JSON_OBJECT;
        snprintf(object_sp->param, sizeof object_sp->param, "response_format");
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        json_object *js = NULL;
        if (!json_object_object_get_ex(rf, "json_schema", &js) || !js)
            return api_bad(e, "missing_required_parameter", "response_format.json_schema",
                           "response_format type 'json_schema' needs 'json_schema'");
        return parse_json_schema_obj(schema_sp, js, e);
    }
    return api_bad(e, "invalid_value", "response_format.type",
                   "response_format type must be 'text', 'json_object' or 'json_schema', not '%.40s'", type);
}

/* structured_outputs: vLLM's object form, or a bare schema. */
static int parse_structured_outputs(json_object *v, spec *sp, api_error *e)
{
    static const char *const form_keys[] = {"json", "regex", "choice", "grammar", "json_object"};
    int is_form = 0;
    if (json_object_is_type(v, json_type_object))
        for (size_t i = 0; i < sizeof form_keys / sizeof form_keys[0]; i++)
            is_form |= json_object_object_get_ex(v, form_keys[i], NULL);
    if (!is_form)
        return take_schema(sp, v, "structured_outputs", e);
    /* precedence inside the form follows the top level's */
    spec g = {0}, js = {0}, jo = {0}, re = {0}, ch = {0};
    g.any_ws = js.any_ws = jo.any_ws = re.any_ws = ch.any_ws = sp->any_ws;
    g.max_ws = js.max_ws = jo.max_ws = re.max_ws = ch.max_ws = sp->max_ws;
    g.strict = js.strict = jo.strict = re.strict = ch.strict = sp->strict;
    int any_ws = sp->any_ws;
    json_object_object_foreach(v, k, f) {
        char param[96];
        snprintf(param, sizeof param, "structured_outputs.%.40s", k);
        if (!f)
            continue;
        int rc = 0;
        if (!strcmp(k, "json"))
            rc = take_schema(&js, f, param, e);
        else if (!strcmp(k, "grammar"))
            rc = take_text(&g, SPEC_GRAMMAR, f, param, e);
        else if (!strcmp(k, "regex"))
            rc = take_text(&re, SPEC_REGEX, f, param, e);
        else if (!strcmp(k, "choice"))
            rc = take_choice(&ch, f, param, e);
        else if (!strcmp(k, "json_object")) {
            int on = 0;
            rc = get_bool_field(f, param, &on, e);
            if (on) {
                jo.kind = SPEC_JSON_OBJECT;
                snprintf(jo.param, sizeof jo.param, "%s", param);
            }
        } else if (!strcmp(k, "disable_any_whitespace")) {
            int off = 0;
            rc = get_bool_field(f, param, &off, e);
            any_ws = !off;
        } else if (!strcmp(k, "disable_additional_properties")) {
            int off = 0;
            rc = get_bool_field(f, param, &off, e);
            if (off)
                sp->strict = 1;
        } else {
            rc = api_bad(e, "unsupported_parameter", param, "unsupported field '%s'", param);
        }
        if (rc) {
            json_object_put(js.owned);
            return -1;
        }
    }
    spec *pick = g.kind ? &g : js.kind ? &js : jo.kind ? &jo : re.kind ? &re : ch.kind ? &ch : NULL;
    if (pick) {
        int strict = sp->strict;
        *sp = *pick;
        sp->any_ws = any_ws;
        sp->strict = strict;
        if (pick != &js)
            json_object_put(js.owned);
    }
    return 0;
}

static void spec_free(spec *sp) { json_object_put(sp->owned); }

/* Collects every structured field of q and keeps the winner in *out. */
static int collect(const api_request *q, spec *out, api_error *e)
{
    spec s[6]; /* by precedence: grammar, json_schema, json_object, structured_outputs, regex, choice */
    memset(s, 0, sizeof s);
    for (int i = 0; i < 6; i++) {
        s[i].any_ws = 1;
        s[i].max_ws = STRUCTURED_DEFAULT_MAX_WS;
        s[i].strict = 1;
    }
    int rc = 0;
    json_object_object_foreach(q->root, k, v) {
        if (!v || rc)
            continue;
        if (!strcmp(k, "response_format")) {
            spec_free(&s[1]); /* wins over a guided_json seen earlier */
            s[1].owned = NULL;
            s[1].kind = SPEC_NONE;
            rc = parse_response_format(v, &s[1], &s[2], e);
        }
        else if (!strcmp(k, "guided_grammar"))
            rc = take_text(&s[0], SPEC_GRAMMAR, v, k, e);
        else if (!strcmp(k, "guided_json") && !s[1].kind) /* response_format's json_schema wins */
            rc = take_schema(&s[1], v, k, e);
        else if (!strcmp(k, "structured_outputs"))
            rc = parse_structured_outputs(v, &s[3], e);
        else if (!strcmp(k, "guided_regex"))
            rc = take_text(&s[4], SPEC_REGEX, v, k, e);
        else if (!strcmp(k, "guided_choice"))
            rc = take_choice(&s[5], v, k, e);
    }
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 6; i++) {
        if (!rc && s[i].kind && !out->kind)
            *out = s[i];
        else
            spec_free(&s[i]);
    }
    return rc ? -1 : 0;
}

/* ---- spec -> key, EBNF ---- */

const char *structured_error_code(int code)
{
    return code == TERN_EUNSUPPORTED                         ? "unsupported_schema"
           : code == TERN_ETIMEOUT || code == TERN_EFULL ? "grammar_too_complex"
           : code == TERN_ENOMEM                           ? "grammar_too_complex"
                                                           : "invalid_grammar";
}

static int compile_error(api_error *e, const spec *sp, const tern_err *te)
{
    return api_bad(e, structured_error_code(te->code), sp->param, "%s: cannot compile the %s: %s", sp->param,
                   kind_names[sp->kind], te->msg);
}

static void canonical(tern_sbuf *b, json_object *o, int depth);

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* JSON text with object keys sorted: equal schemas give equal keys. */
void structured_canonical(tern_sbuf *b, json_object *o) { canonical(b, o, 0); }

static void canonical(tern_sbuf *b, json_object *o, int depth)
{
    if (depth > 512) { /* deeper than any real schema; keep the key unique anyway */
        tern_sbuf_str(b, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
        return;
    }
    if (json_object_is_type(o, json_type_object)) {
        size_t n = (size_t)json_object_object_length(o), i = 0;
        const char **keys = malloc((n ? n : 1) * sizeof *keys);
        if (!keys) {
            b->oom = 1;
            return;
        }
        json_object_object_foreach(o, k, v) {
            (void)v;
            keys[i++] = k;
        }
        qsort(keys, n, sizeof *keys, cmp_str);
        tern_sbuf_str(b, "{");
        for (i = 0; i < n; i++) {
            json_object *ks = json_object_new_string(keys[i]);
            tern_sbuf_str(b, i ? "," : "");
            tern_sbuf_str(b, ks ? json_object_to_json_string_ext(ks, JSON_C_TO_STRING_PLAIN) : "\"\"");
            json_object_put(ks);
            tern_sbuf_str(b, ":");
            canonical(b, json_object_object_get(o, keys[i]), depth + 1);
        }
        tern_sbuf_str(b, "}");
        free(keys);
    } else if (json_object_is_type(o, json_type_array)) {
        tern_sbuf_str(b, "[");
        for (size_t i = 0; i < json_object_array_length(o); i++) {
            tern_sbuf_str(b, i ? "," : "");
            canonical(b, json_object_array_get_idx(o, i), depth + 1);
        }
        tern_sbuf_str(b, "]");
    } else {
        tern_sbuf_str(b, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    }
}

static char *spec_key(const spec *sp, size_t *len)
{
    tern_sbuf b = {0};
    char head[96];
    snprintf(head, sizeof head, "%s|ws=%d|cap=%d|strict=%d|", kind_names[sp->kind], sp->any_ws, sp->max_ws,
             sp->strict);
    tern_sbuf_str(&b, head);
    if (sp->json)
        canonical(&b, sp->json, 0);
    else if (sp->text)
        tern_sbuf_put(&b, sp->text, sp->text_len);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *len = b.n;
    return b.s;
}

static int build_ebnf(void *user, char **ebnf, tern_err *err)
{
    const spec *sp = user;
    switch (sp->kind) {
    case SPEC_GRAMMAR:
        if (!(*ebnf = strndup(sp->text, sp->text_len)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    case SPEC_SCHEMA: {
        grammar_schema_opts o;
        grammar_schema_opts_init(&o);
        o.any_whitespace = sp->any_ws;
        o.max_whitespace = sp->max_ws;
        o.strict = sp->strict;
        return grammar_schema_to_ebnf(sp->json, &o, ebnf, err);
    }
    case SPEC_JSON_OBJECT:
        if (!(*ebnf = grammar_json_builtin_ebnf(GRAMMAR_JSON_OBJECT, sp->any_ws, sp->max_ws)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    case SPEC_REGEX:
        return grammar_regex_to_ebnf(sp->text, sp->text_len, ebnf, err);
    case SPEC_CHOICE:
        return grammar_choice_to_ebnf(sp->json, ebnf, err);
    default:
        return tern_err_set(err, TERN_EINVAL, "no grammar");
    }
}

int structured_spec_key(const api_request *q, char **key, api_error *e)
{
    spec sp;
    *key = NULL;
    if (collect(q, &sp, e))
        return -1;
    size_t len;
    if (sp.kind && !(*key = spec_key(&sp, &len))) {
        spec_free(&sp);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    spec_free(&sp);
    return 0;
}

int structured_spec_ebnf(const api_request *q, char **ebnf, char **key, api_error *e)
{
    spec sp;
    *ebnf = *key = NULL;
    if (collect(q, &sp, e))
        return -1;
    if (!sp.kind)
        return 0;
    size_t len;
    tern_err te = {0};
    int rc = 0;
    if (!(*key = spec_key(&sp, &len)))
        rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    else if (build_ebnf(&sp, ebnf, &te))
        rc = compile_error(e, &sp, &te);
    if (rc) {
        free(*key);
        *key = NULL;
    }
    spec_free(&sp);
    return rc;
}

/* ---- fallback: the spec into the prompt ---- */

static char *fallback_instruction(const spec *sp)
{
    tern_sbuf b = {0};
    switch (sp->kind) {
    case SPEC_SCHEMA:
        tern_sbuf_str(&b, "Answer with a single JSON value, and nothing else, that conforms to this JSON Schema:\n");
        tern_sbuf_str(&b, json_object_to_json_string_ext(sp->json, JSON_C_TO_STRING_PLAIN));
        break;
    case SPEC_JSON_OBJECT:
        tern_sbuf_str(&b, "Answer with a single JSON object and nothing else.");
        break;
    case SPEC_GRAMMAR:
        tern_sbuf_str(&b, "Answer with text, and nothing else, that this grammar (EBNF, start rule root) accepts:\n");
        tern_sbuf_put(&b, sp->text, sp->text_len);
        break;
    case SPEC_REGEX:
        tern_sbuf_str(&b, "Answer with text, and nothing else, that matches this regular expression in full:\n");
        tern_sbuf_put(&b, sp->text, sp->text_len);
        break;
    case SPEC_CHOICE:
        tern_sbuf_str(&b, "Answer with exactly one of these, and nothing else: ");
        tern_sbuf_str(&b, json_object_to_json_string_ext(sp->json, JSON_C_TO_STRING_PLAIN));
        break;
    default:
        break;
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

static int inject_prompt(api_request *q, const char *instr)
{
    if (q->kind == API_CHAT) {
        json_object *m0 = json_object_array_get_idx(q->messages, 0), *role = NULL, *content = NULL;
        if (m0 && json_object_object_get_ex(m0, "role", &role) && !strcmp(json_object_get_string(role), "system") &&
            json_object_object_get_ex(m0, "content", &content) && json_object_is_type(content, json_type_string)) {
            size_t n = (size_t)json_object_get_string_len(content) + strlen(instr) + 3;
            char *t = malloc(n);
            if (!t)
                return -1;
            snprintf(t, n, "%s\n\n%s", json_object_get_string(content), instr);
            json_object_object_add(m0, "content", json_object_new_string(t));
            free(t);
            return 0;
        }
        json_object *sys = json_object_new_object(), *arr = json_object_new_array();
        if (!sys || !arr) {
            json_object_put(sys);
            json_object_put(arr);
            return -1;
        }
        json_object_object_add(sys, "role", json_object_new_string("system"));
        json_object_object_add(sys, "content", json_object_new_string(instr));
        json_object_array_add(arr, sys);
        for (size_t i = 0; i < json_object_array_length(q->messages); i++)
            json_object_array_add(arr, json_object_get(json_object_array_get_idx(q->messages, i)));
        json_object_put(q->messages);
        q->messages = arr;
        return 0;
    }
    if (!q->prompt)
        return -1; /* token prompts: nothing to prepend text to */
    size_t n = strlen(instr) + q->prompt_len + 3;
    char *t = malloc(n);
    if (!t)
        return -1;
    int len = snprintf(t, n, "%s\n\n%.*s", instr, (int)q->prompt_len, q->prompt);
    json_object *js = json_object_new_string_len(t, len);
    free(t);
    if (!js)
        return -1;
    /* the root owns the new prompt, like every other borrowed string of q */
    json_object_object_add(q->root, "\x01tern_fallback_prompt", js);
    q->prompt = json_object_get_string(js);
    q->prompt_len = (size_t)json_object_get_string_len(js);
    return 0;
}

/* A Warning header value: 299 tern "<kind> not enforced (<why>); ..." with
 * the reason reduced to printable ASCII without quotes or backslashes. */
static void warning_value(char *dst, size_t cap, const char *kind, const char *why)
{
    char clean[192];
    snprintf(clean, sizeof clean, "%.160s", why);
    for (char *p = clean; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\' || (unsigned char)*p >= 0x7f)
            *p = ' ';
    snprintf(dst, cap, "299 tern \"%s not enforced (%s); it was added to the prompt instead\"", kind, clean);
}

/* ---- prepare / attach ---- */

int structured_prepare(tern_server *s, api_request *q, char *warning, api_error *e)
{
    spec sp;
    q->structured = NULL;
    if (collect(q, &sp, e))
        return -1;
    if (!sp.kind)
        return 0;
    structured_server *ss = server_state(s, e);
    if (!ss) {
        spec_free(&sp);
        return -1;
    }
    size_t key_len = 0;
    char *key = spec_key(&sp, &key_len);
    if (!key) {
        spec_free(&sp);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int hit = 0;
    double ms = 0;
    tern_err te = {0};
    grammar_cache_ref *ref = grammar_cache_get(ss->cache, key, key_len, build_ebnf, &sp, &hit, &ms, &te);
    free(key);
    if (!ref) {
        int rc = compile_error(e, &sp, &te);
        if (s->o.grammar_fallback && te.code != TERN_ENOMEM) {
            char *instr = fallback_instruction(&sp);
            if (instr && inject_prompt(q, instr) == 0) {
                warning_value(warning, STRUCTURED_WARNING_MAX, kind_names[sp.kind], te.msg);
                TERN_INFO("structured: %s", e->msg);
                rc = 0;
            }
            free(instr);
        }
        spec_free(&sp);
        return rc;
    }
    srv_structured *st = calloc(1, sizeof *st);
    if (!st) {
        grammar_cache_release(ss->cache, ref);
        spec_free(&sp);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    st->ss = ss;
    st->ref = ref;
    st->kind = sp.kind;
    st->from_rf = !strncmp(sp.param, "response_format", 15);
    st->compile_ms = ms;
    st->cache_hit = hit;
    TERN_DEBUG("structured: %s from '%s', %s in %.2f ms", kind_names[sp.kind], sp.param, hit ? "cached" : "compiled",
               ms);
    spec_free(&sp);
    q->structured = st;
    return 0;
}

static int build_given(void *user, char **ebnf, tern_err *err)
{
    if (!(*ebnf = strdup(user)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    return 0;
}

int structured_from_response_format(const srv_structured *st) { return st && st->from_rf; }

int structured_set_ebnf(tern_server *s, api_request *q, const char *key, size_t key_len, const char *ebnf,
                        const constraint_lazy *lazy, const char *param, api_error *e)
{
    structured_server *ss = server_state(s, e);
    if (!ss)
        return -1;
    int hit = 0;
    double ms = 0;
    tern_err te = {0};
    grammar_cache_ref *ref = grammar_cache_get(ss->cache, key, key_len, build_given, (void *)ebnf, &hit, &ms, &te);
    if (!ref)
        return api_bad(e, structured_error_code(te.code), param, "%s: cannot compile the grammar: %s", param, te.msg);
    srv_structured *st = calloc(1, sizeof *st);
    if (!st) {
        grammar_cache_release(ss->cache, ref);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    st->ss = ss;
    st->ref = ref;
    st->kind = SPEC_GRAMMAR;
    st->compile_ms = ms;
    st->cache_hit = hit;
    if (lazy) {
        st->lazy = 1;
        st->lz = *lazy;
    }
    TERN_DEBUG("structured: %s grammar from '%s', %s in %.2f ms", lazy ? "lazy" : "forced", param,
               hit ? "cached" : "compiled", ms);
    structured_free(q->structured);
    q->structured = st;
    return 0;
}

/* Where the think block stands for this row (see constraint.h). */
static constraint_think_mode think_mode(const structured_server *ss, const api_request *q, const int32_t *prompt,
                                        size_t n, size_t boundary)
{
    if (q->kind != API_CHAT || ss->think_open < 0 || ss->think_close < 0)
        return CONSTRAINT_THINK_OFF;
    /* the generation primer decides when it mentions the block */
    for (size_t i = n; i-- > boundary;) {
        if (prompt[i] == ss->think_close)
            return CONSTRAINT_THINK_OFF;
        if (prompt[i] == ss->think_open)
            return CONSTRAINT_THINK_INSIDE;
    }
    return api_thinking_off(q) ? CONSTRAINT_THINK_OFF : CONSTRAINT_THINK_MAY;
}

static void release_ref(void *user)
{
    srv_structured *st = user;
    structured_free(st);
}

int structured_attach(tern_server *s, const api_request *q, const int32_t *prompt, size_t n_prompt, size_t boundary,
                      engine_params *p, api_error *e)
{
    const srv_structured *st = q->structured;
    if (!st)
        return 0;
    structured_server *ss = st->ss;
    /* each row holds its own reference, released by its constraint */
    srv_structured *row = calloc(1, sizeof *row);
    if (!row)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    *row = *st;
    grammar_cache_ref_retain(ss->cache, row->ref);
    constraint_think th = {0};
    th.mode = think_mode(ss, q, prompt, n_prompt, boundary);
    th.open_id = ss->think_open;
    th.close_id = ss->think_close;
    th.max_tokens = q->max_tokens > 0 ? (q->max_tokens + 1) / 2 : STRUCTURED_THINK_CAP;
    if (q->reasoning_budget >= 0 && q->reasoning_budget < th.max_tokens) { /* reasoning.h */
        th.max_tokens = q->reasoning_budget;
        th.capped = 1;
    }
    tern_err te = {0};
    int32_t n_vocab = model_config_get(s->m)->n_vocab;
    int rc = row->lazy ? constraint_grammar_new_lazy(grammar_cache_ref_compiled(row->ref), &th, &row->lz, n_vocab,
                                                     release_ref, row, &p->constraint, &p->constraint_ctx, &te)
                       : constraint_grammar_new(grammar_cache_ref_compiled(row->ref), &th, n_vocab, release_ref, row,
                                                &p->constraint, &p->constraint_ctx, &te);
    if (rc) {
        structured_free(row);
        return api_error_set(e, 500, "server_error", NULL, NULL, "structured output: %s", te.msg);
    }
    return 0;
}
