/* JSON Schema -> EBNF: the entry point, the compile context and the one
 * dispatch, sc_gen: a schema's applicator keywords are looked up in a
 * table (first match wins; each rewrites the schema or combines
 * subschemas, then comes back here), and a schema with none is a leaf
 * (schema_leaf.c: enum/const, then one emitter per type). The files of the
 * front end are listed in schema_int.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/unique_int.h"
#include "schema_int.h"

void grammar_schema_opts_init(grammar_schema_opts *o)
{
    memset(o, 0, sizeof *o);
    o->any_whitespace = 1;
    o->max_whitespace = 20;
    o->strict = 1;
    o->max_ms = 2000;
    o->max_bytes = 4u << 20;
    o->draft = 2020;
    o->len_product_max = GUQ_LEN_PRODUCT;
}

int sc_fail(sc *c, int code, const char *path, const char *fmt, ...)
{
    if (c->rc)
        return c->rc;
    char msg[TERN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rc = tern_err_set(c->err, code, "json schema: %s at %s", msg, path && *path ? path : "#");
    return c->rc;
}

json_object *sc_own(sc *c, json_object *o)
{
    if (!o) {
        sc_fail(c, TERN_ENOMEM, NULL, "out of memory");
        return NULL;
    }
    if (c->n_owned == c->cap_owned) {
        size_t cap = c->cap_owned ? c->cap_owned * 2 : 64;
        json_object **p = realloc(c->owned, cap * sizeof *p);
        if (!p) {
            json_object_put(o);
            sc_fail(c, TERN_ENOMEM, NULL, "out of memory");
            return NULL;
        }
        c->owned = p;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = o;
    return o;
}

int sc_is_own(sc *c, json_object *v)
{
    for (size_t i = c->n_owned; v && i-- > 0;)
        if (c->owned[i] == v)
            return 1;
    return 0;
}

int sc_patterns_internal(sc *c, json_object *v)
{
    return json_object_is_type(v, json_type_array) && sc_is_own(c, v);
}

int sc_over_time(sc *c)
{
    int stop = grammar_thread_stopped(); /* a compile worker's cancel or deadline */
    if (stop == TERN_ECANCELED) {
        sc_fail(c, stop, NULL, "compile cancelled");
        return 1;
    }
    if (stop)
        return 1;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long ms = (t.tv_sec - c->t0.tv_sec) * 1000 + (t.tv_nsec - c->t0.tv_nsec) / 1000000;
    return c->o.max_ms > 0 && ms > c->o.max_ms;
}

const char *sc_ws(sc *c)
{
    return gfe_json_ws(&c->st);
}

const char *sc_any(sc *c)
{
    if (!c->have_any) {
        gfe_json_define(&c->r, &c->st, c->any, NULL, NULL);
        c->have_any = 1;
    }
    return c->any;
}

const char *sc_unit(sc *c)
{
    if (!c->have_unit) {
        gfe_cset all = {0};
        gfe_buf b;
        gfe_buf_init(&b, 0);
        gfe_cset_add(&all, 0, GFE_CP_MAX);
        gfe_cset_emit_json(&b, &all);
        gfe_rule_add(&c->r, b.s ? b.s : "\"\"", c->unit);
        gfe_buf_free(&b);
        gfe_cset_free(&all);
        c->have_unit = 1;
    }
    return c->unit;
}

/* ------------------------------------------------------------ keywords */

static int known_keyword(const sc *c, const char *k)
{
    /* draft 7 made content* optional assertions; 2020-12 annotations */
    if (c->draft == 7 && (!strcmp(k, "contentMediaType") || !strcmp(k, "contentEncoding") ||
                          !strcmp(k, "contentSchema")))
        return 0;
    return sc_is_supported(k) || sc_is_annotation(k);
}

json_object *sc_without(sc *c, json_object *s, const char *const *keys, int n)
{
    json_object *m = json_object_new_object();
    if (!m)
        return sc_own(c, NULL);
    json_object_object_foreach(s, k, v) {
        int skip = 0;
        for (int i = 0; i < n; i++)
            skip |= !strcmp(k, keys[i]);
        if (!skip)
            json_object_object_add(m, k, json_object_get(v));
    }
    return sc_own(c, m);
}

int sc_n_constraints(json_object *s)
{
    int n = 0;
    json_object_object_foreach(s, k, v) {
        (void)v;
        if (!sc_is_annotation(k))
            n++;
    }
    return n;
}

/* ------------------------------------------------------------ dispatch */

/* The applicators, in priority order: the first row with a keyword present
 * compiles the schema (each removes its keywords and compiles the rest
 * through sc_gen again, so the others follow in turn). */
static const struct {
    const char *keys[3];
    sc_apply_fn fn;
} k_applicators[] = {
    {{"$ref"}, sc_apply_ref},
    {{"allOf"}, sc_apply_all_of},
    {{"anyOf", "oneOf"}, sc_apply_any_of},
    {{"dependentRequired", "dependentSchemas", "dependencies"}, sc_apply_dependencies},
    {{"not"}, sc_apply_not},
    {{"if", "then", "else"}, sc_apply_if},
    {{SC_MEMBER}, sc_apply_member},
};

static sc_apply_fn applicator_of(json_object *s)
{
    for (size_t i = 0; i < sizeof k_applicators / sizeof k_applicators[0]; i++)
        for (int j = 0; j < 3 && k_applicators[i].keys[j]; j++)
            if (sc_has(s, k_applicators[i].keys[j]) &&
                !(k_applicators[i].fn == sc_apply_not && sc_not_fraction(s)))
                return k_applicators[i].fn;
    return sc_leaf;
}

int sc_gen(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    *never = 0;
    if (c->rc)
        return c->rc;
    if (sc_over_time(c))
        return sc_fail(c, TERN_ETIMEOUT, path, "compile time limit exceeded");
    if (c->r.out.err)
        return sc_fail(c, c->r.out.err, path, "grammar larger than the output limit");
    if (json_object_is_type(s, json_type_boolean)) {
        if (!json_object_get_boolean(s)) {
            *never = 1;
            return 0;
        }
        memcpy(name, sc_any(c), GFE_NAME_MAX);
        return c->r.out.err ? sc_fail(c, c->r.out.err, path, "grammar too large") : 0;
    }
    if (!json_object_is_type(s, json_type_object))
        return sc_fail(c, TERN_EINVAL, path, "a schema must be an object or a boolean");
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        return sc_fail(c, TERN_EUNSUPPORTED, path, "schema nested too deeply");
    }
    int rc = 0;
    json_object_object_foreach(s, k, v) {
        (void)v;
        if (!known_keyword(c, k)) {
            rc = sc_fail(c, TERN_EUNSUPPORTED, path, "keyword '%.100s' unsupported", k);
            break;
        }
    }
    if (!rc)
        rc = applicator_of(s)(c, s, path, name, never);
    c->depth--;
    return rc;
}

int grammar_schema_to_ebnf(json_object *schema, const grammar_schema_opts *opts, char **ebnf_out,
                           tern_err *err)
{
    *ebnf_out = NULL;
    sc c;
    memset(&c, 0, sizeof c);
    if (opts)
        c.o = *opts;
    else
        grammar_schema_opts_init(&c.o);
    c.err = err;
    c.root = schema;
    c.draft = c.o.draft == 7 ? 7 : 2020;
    json_object *sv = sc_get(schema, "$schema");
    if (sv && json_object_is_type(sv, json_type_string)) {
        const char *u = json_object_get_string(sv);
        if (strstr(u, "draft-07") || strstr(u, "draft-06") || strstr(u, "draft-04"))
            c.draft = 7;
        else if (strstr(u, "2020-12") || strstr(u, "2019-09"))
            c.draft = 2020;
    }
    c.st.any_whitespace = c.o.any_whitespace && c.o.max_whitespace != 0;
    c.st.max_whitespace = c.o.max_whitespace < 0 ? -1 : c.o.max_whitespace;
    clock_gettime(CLOCK_MONOTONIC, &c.t0);
    gfe_rules_init(&c.r, c.o.max_bytes ? c.o.max_bytes : (4u << 20));
    if (!schema) {
        tern_err_set(err, TERN_EINVAL, "json schema: missing schema");
        c.rc = TERN_EINVAL;
        goto out;
    }
    if (c.st.any_whitespace) {
        char ws[64];
        if (c.st.max_whitespace < 0)
            snprintf(ws, sizeof ws, "[ \\n\\t\\r]*");
        else
            snprintf(ws, sizeof ws, "[ \\n\\t\\r]{0,%d}", c.st.max_whitespace);
        gfe_rule_define(&c.r, "ws", ws);
        c.r.has_ws = 1;
    }
    char name[GFE_NAME_MAX];
    int never = 0;
    if (sc_gen(&c, schema, "#", name, &never))
        goto out;
    if (never) {
        if (c.strict_emptied)
            sc_fail(&c, TERN_EUNSUPPORTED, "#",
                    "no value satisfies the schema in strict mode (a negation needs a property name strict mode "
                    "closes out)");
        else
            sc_fail(&c, TERN_EINVAL, "#", "no JSON value satisfies the schema");
        goto out;
    }
    gfe_rule_define(&c.r, "root", name);
    if (c.r.out.err) {
        sc_fail(&c, c.r.out.err, "#", c.r.out.err == TERN_EFULL ? "grammar larger than the output limit" : "out of memory");
        goto out;
    }
    *ebnf_out = gfe_buf_take(&c.r.out);
    if (!*ebnf_out)
        sc_fail(&c, TERN_ENOMEM, "#", "out of memory");
out:
    for (size_t i = 0; i < c.n_owned; i++)
        json_object_put(c.owned[i]);
    free(c.owned);
    free(c.refs);
    sc_ref_free(&c);
    gfe_rules_free(&c.r);
    return c.rc;
}
