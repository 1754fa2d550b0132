/* Structured output: the request's typed spec (api_structured_spec, read
 * and checked by api_structured.c) -> normalized cache key and EBNF ->
 * compiled grammar (cached per server) -> a constraint per engine row.
 * See structured.h and docs/structured-output.md. */
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
#include "server/toolcall.h"

/* Think tokens before </think> is forced, when max_tokens leaves no hint. */
#define STRUCTURED_THINK_CAP 4096

/* By api_spec_kind. */
static const char *const kind_names[] = {"none", "grammar", "json_schema", "json_object", "regex", "choice",
                                         "structural_tag"};

typedef api_structured_spec spec;

typedef struct structured_server {
    grammar_vocab *v;
    grammar_cache *cache;
    int32_t think_open, think_close; /* -1 when the vocabulary has none */
    int harmony;                     /* a harmony model: v holds its header tokens as control bytes (harmony.h) */
    constraint_think harmony_think;  /* its analysis block */
} structured_server;

struct srv_structured {
    structured_server *ss; /* borrowed */
    grammar_cache_ref *ref;
    int lazy;              /* the grammar starts at a trigger (tool calls, toolcall.c) */
    int from_rf;           /* the spec came from response_format (not guided_* / structured_outputs) */
    constraint_lazy lz;
    struct trig_ref *trig; /* owned triggers of lz (structural tags), shared by the rows */
    api_spec_kind kind;
    double compile_ms;
    int cache_hit;
};

/* Triggers a request built for itself, freed with the last row using them. */
typedef struct trig_ref {
    constraint_triggers *t;
    int refs; /* under trig_mu */
} trig_ref;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t trig_mu = PTHREAD_MUTEX_INITIALIZER;

static void trig_ref_change(trig_ref *r, int by)
{
    if (!r)
        return;
    pthread_mutex_lock(&trig_mu);
    int left = r->refs += by;
    pthread_mutex_unlock(&trig_mu);
    if (left == 0) {
        constraint_triggers_free(r->t);
        free(r);
    }
}

int structured_own_triggers(srv_structured *st, constraint_triggers *t)
{
    trig_ref *r = malloc(sizeof *r);
    if (!r)
        return TERN_ENOMEM;
    r->t = t;
    r->refs = 1;
    st->trig = r;
    return 0;
}

/* ---- server-wide state ---- */

static structured_server *server_state(srv_model *mm, api_error *e)
{
    pthread_mutex_lock(&init_mu);
    structured_server *ss = mm->structured;
    if (!ss) {
        tern_err te = {0};
        ss = calloc(1, sizeof *ss);
        if (ss) {
            const model_config *cfg = model_config_get(mm->m);
            ss->harmony = mm->has_harmony;
            if (ss->harmony)
                ss->v = harmony_think(mm->tok, &mm->harmony, &ss->harmony_think, &te)
                            ? NULL
                            : harmony_grammar_vocab(mm->tok, &mm->harmony, cfg->n_vocab, cfg->eos_ids,
                                                    (size_t)cfg->n_eos, &te);
            else
                ss->v = grammar_vocab_new(mm->tok, cfg->n_vocab, cfg->eos_ids, (size_t)cfg->n_eos, &te);
            ss->cache = ss->v ? grammar_cache_new(ss->v, 0, NULL, &te) : NULL;
            ss->think_open = tokenizer_token_id(mm->tok, "<think>");
            ss->think_close = tokenizer_token_id(mm->tok, "</think>");
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
        mm->structured = ss;
    }
    pthread_mutex_unlock(&init_mu);
    return ss;
}

const grammar_vocab *structured_vocab(srv_model *mm, api_error *e)
{
    structured_server *ss = server_state(mm, e);
    return ss ? ss->v : NULL;
}

const constraint_think *structured_harmony_think(srv_model *mm, api_error *e)
{
    structured_server *ss = server_state(mm, e);
    return ss && ss->harmony ? &ss->harmony_think : NULL;
}

void structured_server_free(srv_model *mm)
{
    structured_server *ss = mm->structured;
    if (!ss)
        return;
    grammar_cache_free(ss->cache);
    grammar_vocab_free(ss->v);
    free(ss);
    mm->structured = NULL;
}

void structured_free(srv_structured *st)
{
    if (!st)
        return;
    grammar_cache_release(st->ss->cache, st->ref);
    trig_ref_change(st->trig, -1);
    free(st);
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
    case API_SPEC_GRAMMAR:
        if (!(*ebnf = strndup(sp->text, sp->text_len)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    case API_SPEC_SCHEMA: {
        grammar_schema_opts o;
        grammar_schema_opts_init(&o);
        o.any_whitespace = sp->any_ws;
        o.max_whitespace = sp->max_ws;
        o.strict = sp->strict;
        return grammar_schema_to_ebnf(sp->json, &o, ebnf, err);
    }
    case API_SPEC_JSON_OBJECT:
        if (!(*ebnf = grammar_json_builtin_ebnf(GRAMMAR_JSON_OBJECT, sp->any_ws, sp->max_ws)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    case API_SPEC_REGEX:
        return grammar_regex_to_ebnf(sp->text, sp->text_len, ebnf, err);
    case API_SPEC_CHOICE:
        return grammar_choice_to_ebnf(sp->json, ebnf, err);
    default:
        return tern_err_set(err, TERN_EINVAL, "no grammar");
    }
}

/* On a harmony model the spec's grammar is the final message's body: after
 * the analysis' <|end|> the grammar matches the final header, then it. */
static int build_harmony(void *user, char **ebnf, tern_err *err)
{
    char *inner = NULL;
    int rc = build_ebnf(user, &inner, err);
    if (rc)
        return rc;
    tern_sbuf b = {0};
    tern_sbuf_str(&b, "root ::= " HARMONY_FINAL_EBNF " h_root\n");
    structured_ebnf_renamed(&b, inner, "h_");
    free(inner);
    if (b.oom) {
        free(b.s);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    *ebnf = b.s;
    return 0;
}

int structured_spec_key(const api_request *q, char **key, api_error *e)
{
    const spec *sp = &q->structured_spec;
    *key = NULL;
    size_t len;
    if (sp->kind && !(*key = spec_key(sp, &len)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

int structured_spec_ebnf(const api_request *q, char **ebnf, char **key, api_error *e)
{
    const spec *sp = &q->structured_spec;
    *ebnf = *key = NULL;
    if (!sp->kind)
        return 0;
    size_t len;
    tern_err te = {0};
    int rc = 0;
    if (!(*key = spec_key(sp, &len)))
        rc = api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    else if (build_ebnf((void *)sp, ebnf, &te))
        rc = compile_error(e, sp, &te);
    if (rc) {
        free(*key);
        *key = NULL;
    }
    return rc;
}

/* ---- fallback: the spec into the prompt ---- */

static char *fallback_instruction(const spec *sp)
{
    tern_sbuf b = {0};
    switch (sp->kind) {
    case API_SPEC_SCHEMA:
        tern_sbuf_str(&b, "Answer with a single JSON value, and nothing else, that conforms to this JSON Schema:\n");
        tern_sbuf_str(&b, json_object_to_json_string_ext(sp->json, JSON_C_TO_STRING_PLAIN));
        break;
    case API_SPEC_JSON_OBJECT:
        tern_sbuf_str(&b, "Answer with a single JSON object and nothing else.");
        break;
    case API_SPEC_GRAMMAR:
        tern_sbuf_str(&b, "Answer with text, and nothing else, that this grammar (EBNF, start rule root) accepts:\n");
        tern_sbuf_put(&b, sp->text, sp->text_len);
        break;
    case API_SPEC_REGEX:
        tern_sbuf_str(&b, "Answer with text, and nothing else, that matches this regular expression in full:\n");
        tern_sbuf_put(&b, sp->text, sp->text_len);
        break;
    case API_SPEC_CHOICE:
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

int structured_prepare(srv_model *mm, api_request *q, char *warning, api_error *e)
{
    const spec *sp = &q->structured_spec;
    q->structured = NULL;
    if (!sp->kind)
        return 0;
    if (sp->kind == API_SPEC_STRUCTURAL)
        return structural_prepare(mm, q, e);
    structured_server *ss = server_state(mm, e);
    if (!ss)
        return -1;
    size_t key_len = 0;
    char *key = spec_key(sp, &key_len);
    if (!key)
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int hit = 0;
    double ms = 0;
    tern_err te = {0};
    /* a harmony model's cache holds only wrapped grammars (its own vocabulary), so the key stays the spec's */
    grammar_cache_ref *ref = grammar_cache_get(ss->cache, key, key_len, ss->harmony ? build_harmony : build_ebnf,
                                               (void *)sp, &hit, &ms, &te);
    free(key);
    if (!ref) {
        int rc = compile_error(e, sp, &te);
        if (mm->s->o.grammar_fallback && te.code != TERN_ENOMEM) {
            char *instr = fallback_instruction(sp);
            if (instr && inject_prompt(q, instr) == 0) {
                warning_value(warning, STRUCTURED_WARNING_MAX, kind_names[sp->kind], te.msg);
                TERN_INFO("structured: %s", e->msg);
                rc = 0;
            }
            free(instr);
        }
        return rc;
    }
    srv_structured *st = calloc(1, sizeof *st);
    if (!st) {
        grammar_cache_release(ss->cache, ref);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    st->ss = ss;
    st->ref = ref;
    st->kind = sp->kind;
    st->from_rf = !strncmp(sp->param, "response_format", 15);
    st->compile_ms = ms;
    st->cache_hit = hit;
    TERN_DEBUG("structured: %s from '%s', %s in %.2f ms", kind_names[sp->kind], sp->param,
               hit ? "cached" : "compiled", ms);
    q->structured = st;
    return 0;
}

typedef struct prepare_args {
    srv_model *mm;
    api_request *q;
    char *warning;
} prepare_args;

static int prepare_both(void *arg, api_error *e)
{
    prepare_args *a = arg;
    return structured_prepare(a->mm, a->q, a->warning, e) || toolcall_prepare(a->mm, a->q, e) ? -1 : 0;
}

int structured_prepare_request(srv_model *mm, api_request *q, int client_fd, double t_start, char *warning,
                               api_error *e)
{
    prepare_args a = {mm, q, warning};
    if (!q->structured_spec.kind && !(q->kind == API_CHAT && q->tools))
        return prepare_both(&a, e); /* nothing to compile: no thread hop */
    return srv_compile_run(mm->s, client_fd, t_start, prepare_both, &a, e);
}

static int build_given(void *user, char **ebnf, tern_err *err)
{
    if (!(*ebnf = strdup(user)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    return 0;
}

int structured_from_response_format(const srv_structured *st) { return st && st->from_rf; }

int structured_set_ebnf(srv_model *mm, api_request *q, const char *key, size_t key_len, const char *ebnf,
                        const constraint_lazy *lazy, const char *param, api_error *e)
{
    structured_server *ss = server_state(mm, e);
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
    st->kind = API_SPEC_GRAMMAR;
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

int structured_attach(srv_model *mm, const api_request *q, const int32_t *prompt, size_t n_prompt, size_t boundary,
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
    trig_ref_change(row->trig, +1);
    constraint_think th = {0};
    if (ss->harmony && q->kind == API_CHAT) {
        th = ss->harmony_think;
    } else {
        th.mode = think_mode(ss, q, prompt, n_prompt, boundary);
        th.open_id = ss->think_open;
        th.close_id = ss->think_close;
    }
    th.max_tokens = q->max_tokens > 0 ? (q->max_tokens + 1) / 2 : STRUCTURED_THINK_CAP;
    if (q->reasoning_budget >= 0 && q->reasoning_budget < th.max_tokens) { /* reasoning.h */
        th.max_tokens = q->reasoning_budget;
        th.capped = 1;
    }
    tern_err te = {0};
    int32_t n_vocab = model_config_get(mm->m)->n_vocab;
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
