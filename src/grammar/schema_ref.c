/* JSON Schema $ref: resolved against the base URI where it sits (the $id
 * of the enclosing resources, RFC 3986 resolution), to an embedded
 * resource, an anchor or a JSON pointer (percent- and ~-escapes) into a
 * resource of the one document; a target gets one rule, so recursive
 * schemas become recursive rules (refused when the recursion consumes no
 * input). Other documents are unsupported. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

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

/* ---- URIs (RFC 3986 section 5.2: a reference resolved against a base) */

#define SC_URI_MAX 1024

typedef struct uri_parts {
    const char *scheme, *auth, *path, *query, *frag; /* NULL: absent */
    size_t ls, la, lp, lq, lf;
} uri_parts;

static void uri_split(const char *u, uri_parts *p)
{
    memset(p, 0, sizeof *p);
    const char *x = u;
    size_t k = strcspn(x, ":/?#");
    if (x[k] == ':' && k > 0) {
        p->scheme = x;
        p->ls = k;
        x += k + 1;
    }
    if (x[0] == '/' && x[1] == '/') {
        x += 2;
        p->auth = x;
        p->la = strcspn(x, "/?#");
        x += p->la;
    }
    p->path = x;
    p->lp = strcspn(x, "?#");
    x += p->lp;
    if (*x == '?') {
        p->query = ++x;
        p->lq = strcspn(x, "#");
        x += p->lq;
    }
    if (*x == '#') {
        p->frag = ++x;
        p->lf = strlen(x);
    }
}

/* Removes "." and ".." segments from path[0..n) into out. */
static void uri_dots(const char *path, size_t n, char *out, size_t cap)
{
    size_t o = 0, i = 0;
    while (i < n) {
        size_t e = i + 1;
        while (e < n && path[e] != '/')
            e++;
        const char *seg = path + i;
        size_t ls = e - i; /* "/name", or "name" for a relative first segment */
        const char *name = seg[0] == '/' ? seg + 1 : seg;
        size_t ln = seg[0] == '/' ? ls - 1 : ls;
        if (ln == 1 && name[0] == '.') {
            if (e >= n && o + 1 < cap)
                out[o++] = '/';
        } else if (ln == 2 && name[0] == '.' && name[1] == '.') {
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            if (e >= n && o + 1 < cap)
                out[o++] = '/';
        } else {
            for (size_t k = 0; k < ls && o + 1 < cap; k++)
                out[o++] = seg[k];
        }
        i = e;
    }
    out[o] = 0;
}

static void uri_put(char *out, size_t cap, size_t *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n && *o + 1 < cap; i++)
        out[(*o)++] = s[i];
    out[*o] = 0;
}

/* ref resolved against base into out (a non-empty fragment kept). */
static void uri_join(const char *base, const char *ref, char *out, size_t cap)
{
    uri_parts b, r;
    uri_split(base, &b);
    uri_split(ref, &r);
    char path[SC_URI_MAX], merged[SC_URI_MAX];
    size_t o = 0;
    out[0] = 0;
    const uri_parts *sa = r.scheme ? &r : &b;          /* the scheme's source */
    const uri_parts *au = r.scheme || r.auth ? &r : &b; /* the authority's */
    if (sa->scheme) {
        uri_put(out, cap, &o, sa->scheme, sa->ls);
        uri_put(out, cap, &o, ":", 1);
    }
    if (au->auth) {
        uri_put(out, cap, &o, "//", 2);
        uri_put(out, cap, &o, au->auth, au->la);
    }
    const char *q = r.query;
    size_t lq = r.lq;
    if (r.scheme || r.auth || (r.lp && r.path[0] == '/')) {
        uri_dots(r.path, r.lp, path, sizeof path);
    } else if (!r.lp) {
        snprintf(path, sizeof path, "%.*s", (int)b.lp, b.path);
        if (!r.query)
            q = b.query, lq = b.lq;
    } else {
        size_t keep = b.lp;
        while (keep > 0 && b.path[keep - 1] != '/')
            keep--;
        if (b.auth && !b.lp)
            snprintf(merged, sizeof merged, "/%.*s", (int)r.lp, r.path);
        else
            snprintf(merged, sizeof merged, "%.*s%.*s", (int)keep, b.path, (int)r.lp, r.path);
        uri_dots(merged, strlen(merged), path, sizeof path);
    }
    uri_put(out, cap, &o, path, strlen(path));
    if (q) {
        uri_put(out, cap, &o, "?", 1);
        uri_put(out, cap, &o, q, lq);
    }
    if (r.frag && r.lf) {
        uri_put(out, cap, &o, "#", 1);
        uri_put(out, cap, &o, r.frag, r.lf);
    }
}

/* ---- the document's resources, anchors and the base of every $ref */

static int res_add(sc *c, const char *uri, json_object *s)
{
    if (c->n_res == c->cap_res) {
        size_t cap = c->cap_res ? c->cap_res * 2 : 16;
        sc_res *p = realloc(c->res, cap * sizeof *p);
        if (!p)
            return -1;
        c->res = p;
        c->cap_res = cap;
    }
    char *u = strdup(uri);
    if (!u)
        return -1;
    c->res[c->n_res++] = (sc_res){u, s};
    return 0;
}

static int rb_add(sc *c, json_object *ref, const char *base)
{
    if (c->n_rb == c->cap_rb) {
        size_t cap = c->cap_rb ? c->cap_rb * 2 : 16;
        sc_rbase *p = realloc(c->rb, cap * sizeof *p);
        if (!p)
            return -1;
        c->rb = p;
        c->cap_rb = cap;
    }
    char *b = strdup(base);
    if (!b)
        return -1;
    c->rb[c->n_rb++] = (sc_rbase){ref, b};
    return 0;
}

/* Walks the document's schemas (through the keywords that hold them)
 * with the base URI in force: $id resources, anchors ($anchor,
 * $dynamicAnchor, draft 7's "#name" $id) and the base of every $ref.
 * Draft 7 ignores $ref's siblings, $id included. 0, or -1 out of memory. */
static int scan(sc *c, json_object *s, const char *base, int depth)
{
    if (depth > 200)
        return 0;
    if (json_object_is_type(s, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(s); i++)
            if (scan(c, json_object_array_get_idx(s, i), base, depth + 1))
                return -1;
        return 0;
    }
    if (!json_object_is_type(s, json_type_object))
        return 0;
    char here[SC_URI_MAX], t[SC_URI_MAX];
    snprintf(here, sizeof here, "%s", base);
    json_object *id = sc_get(s, "$id");
    if (json_object_is_type(id, json_type_string) && !(c->draft == 7 && sc_has(s, "$ref"))) {
        const char *iv = json_object_get_string(id);
        uri_join(base, iv, t, sizeof t);
        if (strchr(t, '#')) { /* draft 7 anchor: "#name" */
            if (res_add(c, t, s))
                return -1;
        } else {
            snprintf(here, sizeof here, "%s", t);
            if (res_add(c, here, s))
                return -1;
        }
    }
    static const char *const anchors[] = {"$anchor", "$dynamicAnchor"};
    for (int i = 0; i < 2; i++) {
        json_object *a = sc_get(s, anchors[i]);
        if (json_object_is_type(a, json_type_string)) {
            char frag[SC_URI_MAX];
            snprintf(frag, sizeof frag, "#%s", json_object_get_string(a));
            uri_join(here, frag, t, sizeof t);
            if (res_add(c, t, s))
                return -1;
        }
    }
    json_object *r = sc_get(s, "$ref");
    if (json_object_is_type(r, json_type_string) && rb_add(c, r, here))
        return -1;
    /* subschemas only: an $id under an unknown keyword names nothing */
    static const char *const one[] = {"additionalProperties", "unevaluatedProperties", "items", "additionalItems",
                                      "unevaluatedItems", "contains", "propertyNames", "not", "if", "then",
                                      "else", "contentSchema", "allOf", "anyOf", "oneOf", "prefixItems"};
    static const char *const map[] = {"properties", "patternProperties", "$defs", "definitions",
                                      "dependentSchemas", "dependencies"};
    json_object_object_foreach(s, k, v) {
        int is_one = 0, is_map = 0;
        for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
            is_one |= !strcmp(k, one[i]);
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            is_map |= !strcmp(k, map[i]);
        if (is_one && scan(c, v, here, depth + 1)) /* a schema, or a list of them */
            return -1;
        if (is_map && json_object_is_type(v, json_type_object)) {
            json_object_object_foreach(v, name, sub) {
                (void)name;
                if (json_object_is_type(sub, json_type_object) && scan(c, sub, here, depth + 1))
                    return -1;
            }
        }
    }
    return 0;
}

static int cmp_rb(const void *a, const void *b)
{
    const sc_rbase *x = a, *y = b;
    return (uintptr_t)x->ref < (uintptr_t)y->ref ? -1 : (uintptr_t)x->ref > (uintptr_t)y->ref;
}

void sc_ref_free(sc *c)
{
    for (size_t i = 0; i < c->n_res; i++)
        free(c->res[i].uri);
    for (size_t i = 0; i < c->n_rb; i++)
        free(c->rb[i].base);
    free(c->res);
    free(c->rb);
}

/* The resource or anchor named uri (the first one the walk met). */
static json_object *res_find(const sc *c, const char *uri)
{
    for (size_t i = 0; i < c->n_res; i++)
        if (!strcmp(c->res[i].uri, uri))
            return c->res[i].s;
    return NULL;
}

json_object *sc_ref_resolve(sc *c, json_object *refv, const char *path)
{
    if (!json_object_is_type(refv, json_type_string)) {
        sc_fail(c, TERN_EINVAL, path, "$ref must be a string");
        return NULL;
    }
    if (!c->scanned) {
        c->scanned = 1;
        if (res_add(c, "", c->root) || scan(c, c->root, "", 0)) {
            sc_fail(c, TERN_ENOMEM, path, "out of memory");
            return NULL;
        }
        qsort(c->rb, c->n_rb, sizeof *c->rb, cmp_rb);
    }
    const char *ref = json_object_get_string(refv);
    sc_rbase key = {refv, NULL};
    sc_rbase *at = c->n_rb ? bsearch(&key, c->rb, c->n_rb, sizeof *c->rb, cmp_rb) : NULL;
    char full[SC_URI_MAX], doc[SC_URI_MAX];
    uri_join(at ? at->base : "", ref, full, sizeof full);
    const char *hash = strchr(full, '#');
    snprintf(doc, sizeof doc, "%.*s", (int)(hash ? (size_t)(hash - full) : strlen(full)), full);
    if (hash && hash[1] != '/') { /* an anchor */
        json_object *t = res_find(c, full);
        if (!t)
            sc_fail(c, TERN_EUNSUPPORTED, path, "$ref '%.200s': anchor not found", ref);
        return t;
    }
    json_object *res = res_find(c, doc);
    if (!res) {
        sc_fail(c, TERN_EUNSUPPORTED, path, "$ref '%.200s' to another document unsupported", ref);
        return NULL;
    }
    ref = hash ? hash : "#";
    json_object *cur = res;
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

int sc_apply_ref(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    if (c->draft == 7 || sc_n_constraints(s) == 1) {
        char sub[256];
        json_object *t = sc_ref_resolve(c, sc_get(s, "$ref"), path);
        snprintf(sub, sizeof sub, "%.240s", json_object_get_string(sc_get(s, "$ref")));
        return t ? gen_ref(c, t, sub, name, never) : c->rc;
    }
    json_object *m = sc_deref(c, s, path);
    return m ? sc_gen(c, m, path, name, never) : c->rc;
}
