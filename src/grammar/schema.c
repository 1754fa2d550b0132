/* JSON Schema -> EBNF: entry point, keyword checks, $ref resolution and the
 * combinators. allOf is compiled by merging its members into one schema
 * (intersecting what can be intersected exactly, failing closed on the
 * rest); anyOf distributes over the sibling keywords; oneOf is an anyOf
 * whose branches are proven pairwise disjoint. Per-type grammars live in
 * schema_leaf.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

/* Deepest schema nesting (and merge chain) followed before giving up: real
 * schemas stay far below; hostile ones must not exhaust the stack. */
#define SC_MAX_DEPTH 96
/* Largest cross product when two anyOf/oneOf lists meet in an allOf. */
#define SC_MAX_CROSS 64
/* oneOf with overlapping branches is compiled as "branch i and not the
 * others" up to this many branches (the rewrite is quadratic). */
#define SC_ONEOF_NEGATE_MAX 4

void grammar_schema_opts_init(grammar_schema_opts *o)
{
    memset(o, 0, sizeof *o);
    o->any_whitespace = 1;
    o->max_whitespace = 20;
    o->strict = 1;
    o->max_ms = 2000;
    o->max_bytes = 4u << 20;
    o->draft = 2020;
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

static int over_time(sc *c)
{
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

static int has(json_object *s, const char *k)
{
    return json_object_is_type(s, json_type_object) && json_object_object_get_ex(s, k, NULL);
}

static json_object *get(json_object *s, const char *k)
{
    json_object *v = NULL;
    if (json_object_is_type(s, json_type_object))
        json_object_object_get_ex(s, k, &v);
    return v;
}

/* Shallow copy of s without the listed keys; owned by c. */
static json_object *without(sc *c, json_object *s, const char *const *keys, int n)
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

static int n_constraints(json_object *s)
{
    int n = 0;
    json_object_object_foreach(s, k, v) {
        (void)v;
        if (!sc_is_annotation(k))
            n++;
    }
    return n;
}

/* ------------------------------------------------------------ $ref */

static int pointer_unescape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '~' && i + 1 < n && (s[i + 1] == '0' || s[i + 1] == '1')) {
            ch = s[i + 1] == '0' ? '~' : '/';
            i++;
        } else if (ch == '%' && i + 2 < n) {
            int hv = 0, ok = 1;
            for (int k = 1; k <= 2; k++) {
                char h = s[i + k];
                hv = hv * 16 + (h >= '0' && h <= '9' ? h - '0'
                                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                       : (ok = 0));
            }
            if (ok) {
                ch = (char)hv;
                i += 2;
            }
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = ch;
    }
    out[o] = 0;
    return 0;
}

static json_object *find_anchor(json_object *s, const char *name, int depth)
{
    if (depth > 64)
        return NULL;
    if (json_object_is_type(s, json_type_object)) {
        json_object *a = get(s, "$anchor");
        if (a && json_object_is_type(a, json_type_string) && !strcmp(json_object_get_string(a), name))
            return s;
        json_object_object_foreach(s, k, v) {
            (void)k;
            json_object *r = find_anchor(v, name, depth + 1);
            if (r)
                return r;
        }
    } else if (json_object_is_type(s, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(s); i++) {
            json_object *r = find_anchor(json_object_array_get_idx(s, i), name, depth + 1);
            if (r)
                return r;
        }
    }
    return NULL;
}

/* Does any object below the root carry an "$id"? Then "#..." pointers may
 * be relative to an embedded resource, which tern does not track. */
static int nested_id(json_object *s, int depth, int is_root)
{
    if (depth > 64)
        return 1;
    if (json_object_is_type(s, json_type_object)) {
        json_object *id = get(s, "$id");
        if (!is_root && id && json_object_is_type(id, json_type_string))
            return 1;
        json_object_object_foreach(s, k, v) {
            (void)k;
            if (nested_id(v, depth + 1, 0))
                return 1;
        }
    } else if (json_object_is_type(s, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(s); i++)
            if (nested_id(json_object_array_get_idx(s, i), depth + 1, 0))
                return 1;
    }
    return 0;
}

static json_object *resolve_ref(sc *c, json_object *refv, const char *path)
{
    if (!json_object_is_type(refv, json_type_string)) {
        sc_fail(c, TERN_EINVAL, path, "$ref must be a string");
        return NULL;
    }
    const char *ref = json_object_get_string(refv);
    if (ref[0] != '#') {
        sc_fail(c, TERN_EUNSUPPORTED, path, "$ref '%.200s' to another document unsupported", ref);
        return NULL;
    }
    if (nested_id(c->root, 0, 1)) {
        sc_fail(c, TERN_EUNSUPPORTED, path,
                "$ref '%.200s' in a schema with embedded $id resources unsupported", ref);
        return NULL;
    }
    if (ref[1] && ref[1] != '/') {
        char name[512];
        if (pointer_unescape(ref + 1, strlen(ref + 1), name, sizeof name) == 0) {
            json_object *t = find_anchor(c->root, name, 0);
            if (t)
                return t;
        }
        sc_fail(c, TERN_EUNSUPPORTED, path, "$ref '%.200s': anchor not found", ref);
        return NULL;
    }
    json_object *cur = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char tok[512];
        if (pointer_unescape(p, n, tok, sizeof tok)) {
            cur = NULL;
            break;
        }
        if (json_object_is_type(cur, json_type_object)) {
            if (!json_object_object_get_ex(cur, tok, &cur))
                cur = NULL;
        } else if (json_object_is_type(cur, json_type_array)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            if (*end || idx < 0 || (size_t)idx >= json_object_array_length(cur))
                cur = NULL;
            else
                cur = json_object_array_get_idx(cur, (size_t)idx);
        } else {
            cur = NULL;
        }
        if (!cur)
            break;
        p += n;
    }
    if (!cur) {
        sc_fail(c, TERN_EINVAL, path, "$ref '%.200s' not found", ref);
        return NULL;
    }
    return cur;
}

static int gen_ref(sc *c, json_object *target, const char *path, char name[GFE_NAME_MAX],
                   int *never)
{
    for (size_t i = 0; i < c->n_refs; i++) {
        sc_ref *r = &c->refs[i];
        if (r->target != target)
            continue;
        if (r->nest_at_entry >= 0 && r->nest_at_entry == c->nest)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "$ref recursion that consumes no input");
        if (r->nest_at_entry == -2) { /* finished, matches nothing */
            *never = 1;
            return 0;
        }
        r->referenced = 1;
        memcpy(name, r->name, GFE_NAME_MAX);
        return 0;
    }
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 16;
        sc_ref *p = realloc(c->refs, cap * sizeof *p);
        if (!p)
            return sc_fail(c, TERN_ENOMEM, path, "out of memory");
        c->refs = p;
        c->cap_refs = cap;
    }
    size_t idx = c->n_refs++;
    c->refs[idx].target = target;
    c->refs[idx].nest_at_entry = c->nest;
    c->refs[idx].referenced = 0;
    gfe_rule_reserve(&c->r, c->refs[idx].name);
    char inner[GFE_NAME_MAX];
    int nv = 0;
    int rc = sc_gen(c, target, path, inner, &nv);
    if (rc)
        return rc;
    sc_ref *r = &c->refs[idx];
    if (nv && r->referenced) /* its rule is used but could match nothing */
        return sc_fail(c, TERN_EUNSUPPORTED, path, "recursive $ref to a schema no value satisfies");
    if (!nv)
        gfe_rule_define(&c->r, r->name, inner);
    r->nest_at_entry = nv ? -2 : -1;
    if (nv) {
        *never = 1;
        return 0;
    }
    memcpy(name, r->name, GFE_NAME_MAX);
    return 0;
}

/* ------------------------------------------------------------ merging */

static json_object *merge(sc *c, json_object *a, json_object *b, const char *path);

/* A schema with a $ref: draft 7 ignores the siblings; 2020-12 applies them
 * too (merged with the target). Returns a schema without a top-level $ref. */
static json_object *deref(sc *c, json_object *s, const char *path)
{
    for (int hops = 0; json_object_is_type(s, json_type_object) && has(s, "$ref"); hops++) {
        if (hops > 32 || c->rc) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "$ref chain too long or cyclic");
            return NULL;
        }
        json_object *t = resolve_ref(c, get(s, "$ref"), path);
        if (!t)
            return NULL;
        if (c->draft == 7 || n_constraints(s) == 1) {
            s = t;
            continue;
        }
        static const char *const k[] = {"$ref"};
        json_object *rest = without(c, s, k, 1);
        if (!rest)
            return NULL;
        if (++c->depth > SC_MAX_DEPTH) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "schema nested too deeply");
            return NULL;
        }
        s = merge(c, rest, t, path);
        c->depth--;
        if (!s)
            return NULL;
    }
    return s;
}

static json_object *values_of(json_object *s, json_object **tmp)
{
    json_object *e = get(s, "enum");
    if (has(s, "const")) {
        *tmp = json_object_new_array();
        if (*tmp) {
            json_object_array_add(*tmp, json_object_get(get(s, "const")));
            if (e && json_object_is_type(e, json_type_array)) {
                /* const and enum together: keep const only if enum has it */
                int found = 0;
                for (size_t i = 0; i < json_object_array_length(e); i++)
                    found |= sc_json_equal(json_object_array_get_idx(e, i), get(s, "const"));
                if (!found) {
                    json_object_put(*tmp);
                    *tmp = json_object_new_array();
                }
            }
        }
        return *tmp;
    }
    return e;
}

static const char *const k_max_of[] = {"minimum", "exclusiveMinimum", "minLength", "minItems",
                                       "minProperties", "minContains"};
static const char *const k_min_of[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems",
                                       "maxProperties", "maxContains"};

static int in_list(const char *k, const char *const *l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i]))
            return 1;
    return 0;
}

static json_object *all_of2(json_object *x, json_object *y)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return NULL;
    }
    json_object_array_add(a, json_object_get(x));
    json_object_array_add(a, json_object_get(y));
    json_object_object_add(o, "allOf", a);
    return o;
}

static double numval(json_object *v)
{
    return json_object_is_type(v, json_type_int) ? (double)json_object_get_int64(v)
                                                 : json_object_get_double(v);
}

/* Object keywords of one side seen by the other: a name listed only in b is
 * constrained in a by a's additionalProperties (or patternProperties). */
static int merge_props(sc *c, json_object *m, json_object *a, json_object *b, const char *path)
{
    json_object *pa = get(a, "properties"), *pb = get(b, "properties");
    if (!pa && !pb)
        return 0;
    if ((has(a, "patternProperties") && pb) || (has(b, "patternProperties") && pa))
        return sc_fail(c, TERN_EUNSUPPORTED, path,
                       "allOf combining properties with patternProperties unsupported");
    json_object *out = json_object_new_object();
    if (!out)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    json_object *sides[2][2] = {{pa, pb}, {pb, pa}};
    json_object *owners[2][2] = {{a, b}, {b, a}};
    for (int s = 0; s < 2; s++) {
        json_object *p = sides[s][0], *q = sides[s][1], *other = owners[s][1];
        if (!p)
            continue;
        json_object_object_foreach(p, k, v) {
            if (json_object_object_get_ex(out, k, NULL))
                continue;
            json_object *w = NULL, *nv;
            if (q && json_object_object_get_ex(q, k, &w))
                nv = s == 0 ? all_of2(v, w) : all_of2(w, v);
            else if (get(other, "additionalProperties"))
                nv = all_of2(v, get(other, "additionalProperties"));
            else
                nv = json_object_get(v);
            if (!nv) {
                json_object_put(out);
                return sc_fail(c, TERN_ENOMEM, path, "out of memory");
            }
            json_object_object_add(out, k, nv);
        }
    }
    json_object_object_add(m, "properties", out);
    return 0;
}

static json_object *merge(sc *c, json_object *a, json_object *b, const char *path)
{
    if (c->rc)
        return NULL;
    if (over_time(c)) {
        sc_fail(c, TERN_ETIMEOUT, path, "compile time limit exceeded");
        return NULL;
    }
    if (json_object_is_type(a, json_type_boolean))
        return json_object_get_boolean(a) ? b : a;
    if (json_object_is_type(b, json_type_boolean))
        return json_object_get_boolean(b) ? a : b;
    a = deref(c, a, path);
    b = a ? deref(c, b, path) : NULL;
    if (!a || !b)
        return NULL;
    if (!json_object_is_type(a, json_type_object) || !json_object_is_type(b, json_type_object))
        return merge(c, a, b, path);
    /* unevaluated*: a is the schema holding the combinator (or the $ref),
     * b a member. The base's keyword sees everything merged into it, which
     * is what "evaluated by an adjacent applicator" means; a member's own
     * unevaluated* sees only that member and cannot be lifted. */
    if (has(b, "unevaluatedProperties") || has(b, "unevaluatedItems")) {
        sc_fail(c, TERN_EUNSUPPORTED, path, "unevaluatedProperties/Items inside allOf/anyOf/oneOf/$ref member");
        return NULL;
    }
    json_object *m = sc_own(c, json_object_new_object());
    if (!m)
        return NULL;
    json_object_object_foreach(a, ka, va) {
        if (!sc_is_annotation(ka))
            json_object_object_add(m, ka, json_object_get(va));
    }
    json_object_object_foreach(b, k, vb) {
        if (sc_is_annotation(k))
            continue;
        json_object *va = get(a, k);
        if (!va) {
            json_object_object_add(m, k, json_object_get(vb));
            continue;
        }
        if (sc_json_equal(va, vb))
            continue;
        if (!strcmp(k, "type")) {
            int t = sc_type_mask(a) & sc_type_mask(b);
            static const struct { int bit; const char *n; } names[] = {
                {ST_NULL, "null"},   {ST_BOOL, "boolean"},  {ST_OBJECT, "object"},
                {ST_ARRAY, "array"}, {ST_STRING, "string"},
            };
            json_object *arr = json_object_new_array();
            for (size_t i = 0; arr && i < sizeof names / sizeof names[0]; i++)
                if (t & names[i].bit)
                    json_object_array_add(arr, json_object_new_string(names[i].n));
            if (arr && (t & ST_NUMBER))
                json_object_array_add(arr, json_object_new_string("number"));
            else if (arr && (t & ST_INTEGER))
                json_object_array_add(arr, json_object_new_string("integer"));
            if (!arr)
                return sc_own(c, NULL);
            json_object_object_add(m, "type", arr);
        } else if (!strcmp(k, "enum") || !strcmp(k, "const")) {
            /* handled after the loop */
        } else if (in_list(k, k_max_of, 6) || in_list(k, k_min_of, 6)) {
            if ((!json_object_is_type(va, json_type_int) && !json_object_is_type(va, json_type_double)) ||
                (!json_object_is_type(vb, json_type_int) && !json_object_is_type(vb, json_type_double))) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "non-numeric '%s'", k);
                return NULL;
            }
            int take_b = in_list(k, k_max_of, 6) ? numval(vb) > numval(va) : numval(vb) < numval(va);
            if (take_b)
                json_object_object_add(m, k, json_object_get(vb));
        } else if (!strcmp(k, "required")) {
            json_object *arr = json_object_new_array();
            if (!arr || !json_object_is_type(va, json_type_array) ||
                !json_object_is_type(vb, json_type_array)) {
                json_object_put(arr);
                sc_fail(c, TERN_EINVAL, path, "'required' must be an array");
                return NULL;
            }
            for (size_t i = 0; i < json_object_array_length(va); i++)
                json_object_array_add(arr, json_object_get(json_object_array_get_idx(va, i)));
            for (size_t i = 0; i < json_object_array_length(vb); i++) {
                json_object *e = json_object_array_get_idx(vb, i);
                int dup = 0;
                for (size_t j = 0; j < json_object_array_length(va); j++)
                    dup |= sc_json_equal(e, json_object_array_get_idx(va, j));
                if (!dup)
                    json_object_array_add(arr, json_object_get(e));
            }
            json_object_object_add(m, "required", arr);
        } else if (!strcmp(k, "properties")) {
            /* handled after the loop */
        } else if (!strcmp(k, "additionalProperties") || !strcmp(k, "propertyNames") ||
                   (!strcmp(k, "items") && !json_object_is_type(va, json_type_array) &&
                    !json_object_is_type(vb, json_type_array) && !has(a, "prefixItems") &&
                    !has(b, "prefixItems"))) {
            json_object *o = all_of2(va, vb);
            if (!o)
                return sc_own(c, NULL);
            json_object_object_add(m, k, o);
        } else if (!strcmp(k, "multipleOf")) {
            /* both: multiples of the least common multiple (exact decimals) */
            long pa, pb;
            int qa, qb;
            if (sc_decimal(va, &pa, &qa) || sc_decimal(vb, &pb, &qb)) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different 'multipleOf' values");
                return NULL;
            }
            int q = qa > qb ? qa : qb;
            for (int i = qa; i < q; i++)
                pa *= 10;
            for (int i = qb; i < q; i++)
                pb *= 10;
            long g = pa, h = pb;
            while (h) {
                long t = g % h;
                g = h;
                h = t;
            }
            long l = pa / g * pb;
            if (l > 1000000000L) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different 'multipleOf' values");
                return NULL;
            }
            char txt[48];
            double dv = (double)l;
            for (int i = 0; i < q; i++)
                dv /= 10;
            snprintf(txt, sizeof txt, "%.17g", dv);
            json_object_object_add(m, k, q ? json_object_new_double_s(dv, txt) : json_object_new_int64(l));
        } else if (!strcmp(k, "uniqueItems")) {
            json_object_object_add(m, k, json_object_new_boolean(
                json_object_get_boolean(va) || json_object_get_boolean(vb)));
        } else if (!strcmp(k, "allOf")) {
            json_object *arr = json_object_new_array();
            if (!arr)
                return sc_own(c, NULL);
            for (int s = 0; s < 2; s++) {
                json_object *l = s ? vb : va;
                for (size_t i = 0; json_object_is_type(l, json_type_array) && i < json_object_array_length(l); i++)
                    json_object_array_add(arr, json_object_get(json_object_array_get_idx(l, i)));
            }
            json_object_object_add(m, k, arr);
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
            if (!json_object_is_type(va, json_type_array) || !json_object_is_type(vb, json_type_array)) {
                sc_fail(c, TERN_EINVAL, path, "'%s' must be an array", k);
                return NULL;
            }
            size_t na = json_object_array_length(va), nb = json_object_array_length(vb);
            if (na * nb > SC_MAX_CROSS) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "allOf of two large '%s' lists", k);
                return NULL;
            }
            json_object *arr = json_object_new_array();
            for (size_t i = 0; arr && i < na; i++)
                for (size_t j = 0; j < nb; j++)
                    json_object_array_add(arr, all_of2(json_object_array_get_idx(va, i),
                                                       json_object_array_get_idx(vb, j)));
            if (!arr)
                return sc_own(c, NULL);
            json_object_object_add(m, k, arr);
        } else {
            sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different '%s' values", k);
            return NULL;
        }
    }
    if ((has(a, "properties") || has(b, "properties")) && merge_props(c, m, a, b, path))
        return NULL;
    if ((has(a, "patternProperties") && (has(b, "additionalProperties") || has(b, "patternProperties"))) ||
        (has(b, "patternProperties") && (has(a, "additionalProperties") || has(a, "patternProperties")))) {
        if (!sc_json_equal(a, b)) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "allOf combining patternProperties unsupported");
            return NULL;
        }
    }
    static const char *const arr_k[] = {"prefixItems", "items", "additionalItems", "contains",
                                        "unevaluatedItems", "unevaluatedProperties"};
    /* array keywords on both sides: only plain `items` schemas combine */
    {
        int na = 0, nb = 0, plain = 1;
        for (size_t j = 0; j < 6; j++) {
            na += has(a, arr_k[j]);
            nb += has(b, arr_k[j]);
        }
        na -= has(a, "unevaluatedItems"); /* the base's own: see above */
        if (na && nb) {
            int only_items = na == 1 && nb == 1 && has(a, "items") && has(b, "items") &&
                             !json_object_is_type(get(a, "items"), json_type_array) &&
                             !json_object_is_type(get(b, "items"), json_type_array);
            if (!only_items)
                for (size_t j = 0; j < 6; j++)
                    if (has(a, arr_k[j]) != has(b, arr_k[j]) ||
                        (has(a, arr_k[j]) && !sc_json_equal(get(a, arr_k[j]), get(b, arr_k[j]))))
                        plain = 0;
            if (!plain) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "allOf combining array item keywords");
                return NULL;
            }
        }
    }
    json_object *ta = NULL, *tb = NULL;
    json_object *ea = values_of(a, &ta), *eb = values_of(b, &tb);
    if (ea || eb) {
        json_object *arr = json_object_new_array();
        json_object *src = ea ? ea : eb, *flt = ea ? eb : NULL;
        for (size_t i = 0; arr && json_object_is_type(src, json_type_array) && i < json_object_array_length(src); i++) {
            json_object *v = json_object_array_get_idx(src, i);
            int keep = 1;
            if (flt) {
                keep = 0;
                for (size_t j = 0; json_object_is_type(flt, json_type_array) && j < json_object_array_length(flt); j++)
                    keep |= sc_json_equal(v, json_object_array_get_idx(flt, j));
            }
            if (keep)
                json_object_array_add(arr, json_object_get(v));
        }
        json_object_object_del(m, "const");
        if (arr)
            json_object_object_add(m, "enum", arr);
    }
    json_object_put(ta);
    json_object_put(tb);
    return m;
}

/* ------------------------------------------------------------ oneOf */

static int value_mask(json_object *s)
{
    int m = sc_type_mask(s);
    if (m < 0)
        m = ST_ALL;
    json_object *tmp = NULL, *vals = values_of(s, &tmp);
    if (json_object_is_type(vals, json_type_array)) {
        int vm = 0;
        for (size_t i = 0; i < json_object_array_length(vals); i++)
            vm |= sc_value_type(json_object_array_get_idx(vals, i));
        m &= vm;
    }
    json_object_put(tmp);
    if (json_object_get_boolean(get(s, "nullable")))
        m |= ST_NULL;
    return m;
}

static int values_disjoint(json_object *x, json_object *y)
{
    json_object *tx = NULL, *ty = NULL;
    json_object *vx = values_of(x, &tx), *vy = values_of(y, &ty);
    int r = 0;
    if (json_object_is_type(vx, json_type_array) && json_object_is_type(vy, json_type_array)) {
        r = 1;
        for (size_t i = 0; i < json_object_array_length(vx); i++)
            for (size_t j = 0; j < json_object_array_length(vy); j++)
                if (sc_json_equal(json_object_array_get_idx(vx, i), json_object_array_get_idx(vy, j)))
                    r = 0;
    }
    json_object_put(tx);
    json_object_put(ty);
    return r;
}

static int is_required(json_object *s, const char *k)
{
    json_object *r = get(s, "required");
    for (size_t i = 0; json_object_is_type(r, json_type_array) && i < json_object_array_length(r); i++) {
        json_object *e = json_object_array_get_idx(r, i);
        if (json_object_is_type(e, json_type_string) && !strcmp(json_object_get_string(e), k))
            return 1;
    }
    return 0;
}

/* 1 when no value can satisfy both x and y (sound, not complete). */
/* Strict mode closes objects: can an instance of y hold key k? (only when
 * y is a plain object schema whose keys are all listed) */
static int closed_without(json_object *y, const char *k)
{
    static const char *const open_k[] = {"allOf", "anyOf", "oneOf", "not", "if", "$ref",
                                         "dependentSchemas", "dependencies", "patternProperties",
                                         "unevaluatedProperties", "propertyNames"};
    for (size_t i = 0; i < sizeof open_k / sizeof open_k[0]; i++)
        if (has(y, open_k[i]))
            return 0;
    json_object *ap = get(y, "additionalProperties");
    if (ap && !(json_object_is_type(ap, json_type_boolean) && !json_object_get_boolean(ap)))
        return 0;
    json_object *py = get(y, "properties");
    return !(py && json_object_object_get_ex(py, k, NULL)) && !is_required(y, k);
}

static int disjoint(sc *c, json_object *x, json_object *y)
{
    if (json_object_is_type(x, json_type_boolean) || json_object_is_type(y, json_type_boolean))
        return !json_object_get_boolean(x) || !json_object_get_boolean(y) ? 1 : 0;
    if (has(x, "$ref") || has(y, "$ref"))
        return 0;
    int mx = value_mask(x), my = value_mask(y);
    if (!(mx & my))
        return 1;
    if (values_disjoint(x, y))
        return 1;
    if ((mx & my) == ST_OBJECT) {
        json_object *px = get(x, "properties"), *py = get(y, "properties");
        if (json_object_is_type(px, json_type_object) && json_object_is_type(py, json_type_object)) {
            json_object_object_foreach(px, k, sx) {
                json_object *sy;
                if (!json_object_object_get_ex(py, k, &sy) || !is_required(x, k) || !is_required(y, k))
                    continue;
                if (json_object_is_type(sx, json_type_object) && json_object_is_type(sy, json_type_object) &&
                    !has(sx, "$ref") && !has(sy, "$ref") && disjoint(c, sx, sy))
                    return 1;
            }
        }
        /* strict: a property one side requires and the other cannot hold */
        if (c->o.strict) {
            json_object *rs[2] = {get(x, "required"), get(y, "required")};
            json_object *other[2] = {y, x};
            for (int side = 0; side < 2; side++)
                for (size_t i = 0; json_object_is_type(rs[side], json_type_array) &&
                                   i < json_object_array_length(rs[side]); i++) {
                    json_object *e = json_object_array_get_idx(rs[side], i);
                    if (json_object_is_type(e, json_type_string) &&
                        closed_without(other[side], json_object_get_string(e)))
                        return 1;
                }
        }
    }
    return 0;
}

/* ------------------------------------------------------------ negation */

static json_object *obj1(const char *k, json_object *v)
{
    json_object *o = json_object_new_object();
    if (o)
        json_object_object_add(o, k, v);
    else
        json_object_put(v);
    return o;
}

static json_object *typed(const char *type, const char *k, json_object *v)
{
    json_object *o = obj1(k, v);
    if (o)
        json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

static json_object *num_plus(json_object *v, long d)
{
    return json_object_new_int64(json_object_get_int64(v) + d);
}

/* A regex (ECMAScript syntax, anchored) matching every string except the
 * names[0..n) (all sharing their first d bytes): the trie complement. */
static void regex_notin(gfe_buf *b, const char **names, size_t n, size_t d, int depth)
{
    gfe_cset next = {0};
    int ends_here = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        uint32_t cp;
        if (d == len)
            ends_here = 1;
        else if (gfe_utf8_get(names[i] + d, len - d, &cp) > 0)
            gfe_cset_add(&next, cp, cp);
    }
    int n_alt = 0;
    gfe_buf_puts(b, "(?:");
    if (!ends_here) {
        n_alt++; /* end here: the empty alternative */
    }
    if (next.n) {
        gfe_buf_puts(b, n_alt++ ? "|[^" : "[^");
        for (size_t r = 0; r < next.n; r++) {
            gfe_buf_printf(b, "\\u{%X}", (unsigned)next.r[r].lo);
            if (next.r[r].hi > next.r[r].lo)
                gfe_buf_printf(b, "-\\u{%X}", (unsigned)next.r[r].hi);
        }
        gfe_buf_puts(b, "][\\s\\S]*");
    } else {
        gfe_buf_puts(b, n_alt++ ? "|[\\s\\S]+" : "[\\s\\S]+");
    }
    for (size_t r = 0; r < next.n && depth < 64; r++) {
        for (uint32_t cp = next.r[r].lo; cp <= next.r[r].hi; cp++) {
            const char **sub = malloc(n * sizeof *sub);
            size_t m = 0, adv = 0;
            if (!sub) {
                b->err = TERN_ENOMEM;
                break;
            }
            for (size_t i = 0; i < n; i++) {
                size_t len = strlen(names[i]);
                uint32_t x;
                int k;
                if (d < len && (k = gfe_utf8_get(names[i] + d, len - d, &x)) > 0 && x == cp) {
                    sub[m++] = names[i];
                    adv = (size_t)k;
                }
            }
            gfe_buf_printf(b, "|\\u{%X}", (unsigned)cp);
            regex_notin(b, sub, m, d + adv, depth + 1);
            free(sub);
        }
    }
    gfe_cset_free(&next);
    gfe_buf_puts(b, ")");
}

/* NOT (enum/const): values of other types, or of the same type but
 * different, for null, booleans, integers and strings. */
static json_object *negate_values(sc *c, json_object *vals, const char *path)
{
    int types = 0; /* types present among the values */
    size_t n = json_object_array_length(vals);
    const char **strs = calloc(n + 1, sizeof *strs);
    size_t n_str = 0;
    json_object *alts = json_object_new_array();
    int has_true = 0, has_false = 0;
    json_object *ints = json_object_new_array();
    if (!strs || !alts || !ints)
        goto fail_mem;
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(vals, i);
        int t = sc_value_type(v);
        if (t & ST_STRING) {
            const char *sv = json_object_get_string(v);
            if ((size_t)json_object_get_string_len(v) != strlen(sv))
                goto fail_unsup; /* embedded NUL */
            strs[n_str++] = sv;
        } else if (t & ST_BOOL) {
            if (json_object_get_boolean(v))
                has_true = 1;
            else
                has_false = 1;
        } else if (t == (ST_NUMBER | ST_INTEGER) && fabs(sc_num(v)) < 1e15) {
            json_object_array_add(ints, json_object_new_int64((int64_t)sc_num(v)));
        } else if (t != ST_NULL) {
            goto fail_unsup;
        }
        types |= t & ST_INTEGER ? ST_NUMBER : t;
    }
    static const struct { int bit; const char *n; } names[] = {
        {ST_NULL, "null"}, {ST_BOOL, "boolean"}, {ST_OBJECT, "object"},
        {ST_ARRAY, "array"}, {ST_STRING, "string"}, {ST_NUMBER, "number"},
    };
    json_object *other = json_object_new_array();
    for (size_t i = 0; other && i < sizeof names / sizeof names[0]; i++)
        if (!(types & names[i].bit))
            json_object_array_add(other, json_object_new_string(names[i].n));
    json_object *to = json_object_new_object();
    if (!other || !to) {
        json_object_put(other);
        json_object_put(to);
        goto fail_mem;
    }
    json_object_object_add(to, "type", other);
    json_object_array_add(alts, to);
    if (has_true != has_false) {
        json_object *b = json_object_new_object(), *e = json_object_new_array();
        json_object_array_add(e, json_object_new_boolean(has_false));
        json_object_object_add(b, "enum", e);
        json_object_array_add(alts, b);
    }
    if (json_object_array_length(ints)) {
        /* numbers other than the listed integers: below, between, above
         * each one (bounds exclusive) */
        size_t k = json_object_array_length(ints);
        int64_t *iv = malloc(k * sizeof *iv);
        if (!iv)
            goto fail_mem;
        for (size_t i = 0; i < k; i++)
            iv[i] = json_object_get_int64(json_object_array_get_idx(ints, i));
        for (size_t i = 0; i < k; i++) /* insertion sort: k is small */
            for (size_t j = i; j > 0 && iv[j - 1] > iv[j]; j--) {
                int64_t t = iv[j];
                iv[j] = iv[j - 1];
                iv[j - 1] = t;
            }
        for (size_t i = 0; i <= k; i++) {
            json_object *o = json_object_new_object();
            json_object_object_add(o, "type", json_object_new_string("number"));
            if (i > 0)
                json_object_object_add(o, "exclusiveMinimum", json_object_new_int64(iv[i - 1]));
            if (i < k)
                json_object_object_add(o, "exclusiveMaximum", json_object_new_int64(iv[i]));
            json_object_array_add(alts, o);
        }
        free(iv);
    }
    if (n_str) {
        gfe_buf re;
        gfe_buf_init(&re, 1u << 20);
        gfe_buf_puts(&re, "^");
        regex_notin(&re, strs, n_str, 0, 0);
        gfe_buf_puts(&re, "$");
        json_object *o = json_object_new_object();
        json_object_object_add(o, "type", json_object_new_string("string"));
        if (!re.err)
            json_object_object_add(o, "pattern", json_object_new_string(re.s));
        json_object_array_add(alts, o);
        int err = re.err;
        gfe_buf_free(&re);
        if (err)
            goto fail_mem;
    }
    free(strs);
    json_object_put(ints);
    return sc_own(c, obj1("anyOf", alts));
fail_unsup:
    free(strs);
    json_object_put(alts);
    json_object_put(ints);
    sc_fail(c, TERN_EUNSUPPORTED, path, "'not' / 'if' of an enum/const with non-scalar or fractional values");
    return NULL;
fail_mem:
    free(strs);
    json_object_put(alts);
    json_object_put(ints);
    sc_fail(c, TERN_ENOMEM, path, "out of memory");
    return NULL;
}

json_object *sc_negate(sc *c, json_object *s, int no_eval, const char *path)
{
    if (c->rc)
        return NULL;
    if (json_object_is_type(s, json_type_boolean))
        return sc_own(c, json_object_new_boolean(!json_object_get_boolean(s)));
    if (!json_object_is_type(s, json_type_object)) {
        sc_fail(c, TERN_EINVAL, path, "a schema must be an object or a boolean");
        return NULL;
    }
    if (++c->depth > SC_MAX_DEPTH) {
        c->depth--;
        sc_fail(c, TERN_EUNSUPPORTED, path, "schema nested too deeply");
        return NULL;
    }
    json_object *r = NULL;
    s = deref(c, s, path);
    if (!s)
        goto out;
    if (json_object_is_type(s, json_type_boolean)) {
        r = sc_own(c, json_object_new_boolean(!json_object_get_boolean(s)));
        goto out;
    }
    /* NOT (k1 AND k2 ...) = (NOT k1) OR (NOT k2) ... */
    json_object *alts = sc_own(c, json_object_new_array());
    if (!alts)
        goto out;
    static const struct { const char *k, *type, *inv; long d; } bounds[] = {
        {"minimum", "number", "exclusiveMaximum", 0}, {"exclusiveMinimum", "number", "maximum", 0},
        {"maximum", "number", "exclusiveMinimum", 0}, {"exclusiveMaximum", "number", "minimum", 0},
        {"minLength", "string", "maxLength", -1},     {"maxLength", "string", "minLength", 1},
        {"minItems", "array", "maxItems", -1},        {"maxItems", "array", "minItems", 1},
        {"minProperties", "object", "maxProperties", -1}, {"maxProperties", "object", "minProperties", 1},
    };
    json_object_object_foreach(s, k, v) {
        if (sc_is_annotation(k))
            continue;
        json_object *alt = NULL;
        size_t bi;
        for (bi = 0; bi < sizeof bounds / sizeof bounds[0]; bi++)
            if (!strcmp(k, bounds[bi].k))
                break;
        if (bi < sizeof bounds / sizeof bounds[0]) {
            if (!json_object_is_type(v, json_type_int) && !(json_object_is_type(v, json_type_double) && !bounds[bi].d)) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of a non-integer '%s'", k);
                goto out;
            }
            if (bounds[bi].d < 0 && json_object_get_int64(v) <= 0)
                continue; /* minX 0 always holds: its negation is empty */
            alt = typed(bounds[bi].type, bounds[bi].inv, bounds[bi].d ? num_plus(v, bounds[bi].d) : json_object_get(v));
        } else if (!strcmp(k, "type")) {
            int m = sc_type_mask(s);
            if (m < 0 || ((m & ST_INTEGER) && !(m & ST_NUMBER))) {
                sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of type integer");
                goto out;
            }
            static const struct { int bit; const char *n; } names[] = {
                {ST_NULL, "null"}, {ST_BOOL, "boolean"}, {ST_OBJECT, "object"},
                {ST_ARRAY, "array"}, {ST_STRING, "string"}, {ST_NUMBER, "number"},
            };
            json_object *arr = json_object_new_array();
            for (size_t i = 0; arr && i < sizeof names / sizeof names[0]; i++)
                if (!(m & names[i].bit))
                    json_object_array_add(arr, json_object_new_string(names[i].n));
            alt = obj1("type", arr);
        } else if (!strcmp(k, "required") && json_object_is_type(v, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(v); i++) {
                json_object *nm = json_object_array_get_idx(v, i);
                if (!json_object_is_type(nm, json_type_string))
                    continue;
                json_object *ps = obj1(json_object_get_string(nm), json_object_new_boolean(0));
                json_object_array_add(alts, typed("object", "properties", ps));
            }
            continue;
        } else if (!strcmp(k, "properties") && json_object_is_type(v, json_type_object) && !no_eval) {
            json_object_object_foreach(v, pn, ps) {
                json_object *np = sc_negate(c, ps, 0, path);
                if (!np)
                    goto out;
                json_object *o = typed("object", "properties", obj1(pn, json_object_get(np)));
                json_object *rq = json_object_new_array();
                json_object_array_add(rq, json_object_new_string(pn));
                if (o)
                    json_object_object_add(o, "required", rq);
                else
                    json_object_put(rq);
                json_object_array_add(alts, o);
            }
            continue;
        } else if (!strcmp(k, "anyOf") && json_object_is_type(v, json_type_array)) {
            /* NOT anyOf = allOf of the negations */
            json_object *all = json_object_new_array();
            for (size_t i = 0; i < json_object_array_length(v); i++) {
                json_object *ni = sc_negate(c, json_object_array_get_idx(v, i), no_eval, path);
                if (!ni) {
                    json_object_put(all);
                    goto out;
                }
                json_object_array_add(all, json_object_get(ni));
            }
            alt = obj1("allOf", all);
        } else if (!strcmp(k, "allOf") && json_object_is_type(v, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(v); i++) {
                json_object *ni = sc_negate(c, json_object_array_get_idx(v, i), no_eval, path);
                if (!ni)
                    goto out;
                json_object_array_add(alts, json_object_get(ni));
            }
            continue;
        } else if (!strcmp(k, "const") || !strcmp(k, "enum")) {
            if (!strcmp(k, "enum") && has(s, "const"))
                continue; /* const alone decides; enum's negation is wider */
            json_object *tmp = NULL, *vals = values_of(s, &tmp);
            json_object *nv = json_object_is_type(vals, json_type_array) ? negate_values(c, vals, path) : NULL;
            json_object_put(tmp);
            if (!nv) {
                if (!c->rc)
                    sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of a malformed enum");
                goto out;
            }
            alt = json_object_get(nv);
        } else if (!strcmp(k, "not") && !no_eval) {
            alt = json_object_get(v); /* NOT NOT x = x (its annotations would count) */
        } else {
            sc_fail(c, TERN_EUNSUPPORTED, path, "'not' / 'if' of keyword '%.100s' unsupported", k);
            goto out;
        }
        if (!alt) {
            sc_fail(c, TERN_ENOMEM, path, "out of memory");
            goto out;
        }
        json_object_array_add(alts, alt);
    }
    if (json_object_array_length(alts) == 0)
        r = sc_own(c, json_object_new_boolean(0));
    else if (json_object_array_length(alts) == 1)
        r = json_object_array_get_idx(alts, 0);
    else
        r = sc_own(c, obj1("anyOf", json_object_get(alts)));
out:
    c->depth--;
    return r;
}

/* ------------------------------------------------------------ dispatch */

static int gen_alts(sc *c, json_object *base, json_object *list, const char *kw, const char *path,
                    char name[GFE_NAME_MAX], int *never)
{
    if (!json_object_is_type(list, json_type_array) || json_object_array_length(list) == 0)
        return sc_fail(c, TERN_EINVAL, path, "'%s' must be a non-empty array", kw);
    size_t n = json_object_array_length(list);
    json_object **br = calloc(n, sizeof *br);
    if (!br)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    char sub[256];
    for (size_t i = 0; i < n && !c->rc; i++) {
        snprintf(sub, sizeof sub, "%.200s/%s/%zu", path, kw, i);
        br[i] = merge(c, base, json_object_array_get_idx(list, i), sub);
        if (br[i] && !strcmp(kw, "oneOf"))
            br[i] = deref(c, br[i], sub);
    }
    if (!c->rc && !strcmp(kw, "oneOf")) {
        size_t oi = 0, oj = 0;
        int overlap = 0;
        for (size_t i = 0; i < n && !overlap; i++)
            for (size_t j = i + 1; j < n && !overlap; j++)
                if (!disjoint(c, br[i], br[j]))
                    overlap = 1, oi = i, oj = j;
        /* not provably disjoint: exactly one holds = branch i AND NOT every
         * other branch, when the negations are expressible */
        if (overlap && n <= SC_ONEOF_NEGATE_MAX) {
            json_object **neg = calloc(n, sizeof *neg);
            tern_err saved = c->err ? *c->err : (tern_err){0};
            for (size_t i = 0; neg && i < n && !c->rc; i++)
                neg[i] = sc_negate(c, br[i], 1, path);
            if (neg && !c->rc) {
                for (size_t i = 0; i < n && !c->rc; i++) {
                    json_object *x = br[i];
                    for (size_t j = 0; j < n && x; j++)
                        if (j != i)
                            x = merge(c, x, neg[j], path);
                    br[i] = x;
                }
                overlap = c->rc != 0;
            }
            if (c->rc) { /* forget the negation's error; report the overlap */
                c->rc = 0;
                if (c->err)
                    *c->err = saved;
            }
            free(neg);
        }
        if (overlap)
            sc_fail(c, TERN_EUNSUPPORTED, path,
                    "oneOf branches %zu and %zu may overlap (exclusivity not enforceable)", oi, oj);
    }
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int n_ok = 0;
    for (size_t i = 0; i < n && !c->rc; i++) {
        char nm[GFE_NAME_MAX];
        int nv = 0;
        snprintf(sub, sizeof sub, "%.200s/%s/%zu", path, kw, i);
        if (sc_gen(c, br[i], sub, nm, &nv))
            break;
        if (nv)
            continue;
        gfe_buf_puts(&b, n_ok++ ? " | " : "");
        gfe_buf_puts(&b, nm);
    }
    free(br);
    if (!c->rc && b.err)
        sc_fail(c, b.err, path, "grammar too large");
    if (!c->rc) {
        if (!n_ok)
            *never = 1;
        else
            gfe_rule_add(&c->r, b.s, name);
    }
    gfe_buf_free(&b);
    return c->rc;
}

int sc_gen(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    *never = 0;
    if (c->rc)
        return c->rc;
    if (over_time(c))
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
            goto out;
        }
    }
    if (has(s, "$ref")) {
        if (c->draft == 7 || n_constraints(s) == 1) {
            char sub[256];
            json_object *t = resolve_ref(c, get(s, "$ref"), path);
            snprintf(sub, sizeof sub, "%.240s", json_object_get_string(get(s, "$ref")));
            rc = t ? gen_ref(c, t, sub, name, never) : c->rc;
        } else {
            json_object *m = deref(c, s, path);
            rc = m ? sc_gen(c, m, path, name, never) : c->rc;
        }
        goto out;
    }
    if (has(s, "allOf")) {
        json_object *l = get(s, "allOf");
        if (!json_object_is_type(l, json_type_array) || json_object_array_length(l) == 0) {
            rc = sc_fail(c, TERN_EINVAL, path, "'allOf' must be a non-empty array");
            goto out;
        }
        static const char *const k[] = {"allOf"};
        json_object *m = without(c, s, k, 1);
        for (size_t i = 0; m && i < json_object_array_length(l); i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%.200s/allOf/%zu", path, i);
            m = merge(c, m, json_object_array_get_idx(l, i), sub);
        }
        rc = m ? sc_gen(c, m, path, name, never) : c->rc;
        goto out;
    }
    if (has(s, "anyOf") || has(s, "oneOf")) {
        const char *kw = has(s, "anyOf") ? "anyOf" : "oneOf";
        const char *const k[] = {kw};
        json_object *base = without(c, s, k, 1);
        rc = base ? gen_alts(c, base, get(s, kw), kw, path, name, never) : c->rc;
        goto out;
    }
    if (has(s, "dependentRequired") || has(s, "dependentSchemas") || has(s, "dependencies")) {
        /* "if name is present then X" is exactly anyOf[name absent, name
         * present and X]: rewritten into allOf members and compiled again */
        static const char *const k[] = {"dependentRequired", "dependentSchemas", "dependencies", "allOf"};
        json_object *m = without(c, s, k, 4);
        json_object *list = json_object_new_array();
        if (!m || !list) {
            json_object_put(list);
            rc = sc_fail(c, TERN_ENOMEM, path, "out of memory");
            goto out;
        }
        json_object_object_add(m, "allOf", list);
        json_object *old = get(s, "allOf");
        for (size_t i = 0; json_object_is_type(old, json_type_array) && i < json_object_array_length(old); i++)
            json_object_array_add(list, json_object_get(json_object_array_get_idx(old, i)));
        for (int d = 0; d < 3; d++) {
            json_object *dv = get(s, k[d]);
            if (!dv)
                continue;
            if (!json_object_is_type(dv, json_type_object)) {
                rc = sc_fail(c, TERN_EINVAL, path, "'%s' must be an object", k[d]);
                goto out;
            }
            json_object_object_foreach(dv, name, v) {
                int is_list = json_object_is_type(v, json_type_array);
                if ((d == 0 && !is_list) || (d == 1 && is_list)) {
                    rc = sc_fail(c, TERN_EINVAL, path, "bad '%s' entry", k[d]);
                    goto out;
                }
                json_object *absent = json_object_new_object(), *ap = json_object_new_object();
                json_object *present = json_object_new_object(), *req = json_object_new_array();
                json_object *alt = json_object_new_object(), *alts = json_object_new_array();
                json_object_object_add(ap, name, json_object_new_boolean(0));
                json_object_object_add(absent, "properties", ap);
                json_object_array_add(req, json_object_new_string(name));
                if (is_list) {
                    for (size_t i = 0; i < json_object_array_length(v); i++)
                        json_object_array_add(req, json_object_get(json_object_array_get_idx(v, i)));
                    json_object_object_add(present, "required", req);
                } else {
                    json_object *r1 = json_object_new_object(), *both = json_object_new_array();
                    json_object_object_add(r1, "required", req);
                    json_object_array_add(both, r1);
                    json_object_array_add(both, json_object_get(v));
                    json_object_object_add(present, "allOf", both);
                }
                json_object_array_add(alts, absent);
                json_object_array_add(alts, present);
                json_object_object_add(alt, "anyOf", alts);
                json_object_array_add(list, alt);
            }
        }
        if (json_object_array_length(list) == 0)
            json_object_object_del(m, "allOf");
        rc = sc_gen(c, m, path, name, never);
        goto out;
    }
    if (has(s, "not")) {
        static const char *const k[] = {"not"};
        json_object *rest = without(c, s, k, 1);
        int no_eval = has(s, "unevaluatedProperties") || has(s, "unevaluatedItems");
        json_object *n = rest ? sc_negate(c, get(s, "not"), no_eval, path) : NULL;
        json_object *m = n ? merge(c, rest, n, path) : NULL;
        rc = m ? sc_gen(c, m, path, name, never) : c->rc;
        goto out;
    }
    if (has(s, "if") || has(s, "then") || has(s, "else")) {
        static const char *const k[] = {"if", "then", "else"};
        json_object *rest = without(c, s, k, 3);
        if (!rest || !has(s, "if") || (!has(s, "then") && !has(s, "else"))) {
            rc = rest ? sc_gen(c, rest, path, name, never) : c->rc;
            goto out;
        }
        /* (if AND then) OR (NOT if AND else) */
        int no_eval = has(s, "unevaluatedProperties") || has(s, "unevaluatedItems");
        json_object *f = get(s, "if");
        json_object *nf = sc_negate(c, f, no_eval, path);
        if (!nf) {
            rc = c->rc;
            goto out;
        }
        json_object *t = has(s, "then") ? get(s, "then") : NULL, *e = has(s, "else") ? get(s, "else") : NULL;
        json_object *b1 = t ? all_of2(f, t) : json_object_get(f);
        json_object *b2 = e ? all_of2(nf, e) : json_object_get(nf);
        json_object *alts = json_object_new_array(), *any = json_object_new_object();
        json_object_array_add(alts, b1);
        json_object_array_add(alts, b2);
        json_object_object_add(any, "anyOf", alts);
        sc_own(c, any);
        json_object *m = merge(c, rest, any, path);
        rc = m ? sc_gen(c, m, path, name, never) : c->rc;
        goto out;
    }
    rc = sc_leaf(c, s, path, name, never);
out:
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
    json_object *sv = get(schema, "$schema");
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
    gfe_rules_free(&c.r);
    return c.rc;
}
