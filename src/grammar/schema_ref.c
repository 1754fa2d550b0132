/* JSON Schema $ref: "#" JSON pointers (percent- and ~-escapes) and
 * "#anchor" within the one document; a target gets one rule, so recursive
 * schemas become recursive rules (refused when the recursion consumes no
 * input). Other documents and embedded $id resources are unsupported. */
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

static json_object *find_anchor(json_object *s, const char *name, int depth)
{
    if (depth > 64)
        return NULL;
    if (json_object_is_type(s, json_type_object)) {
        json_object *a = sc_get(s, "$anchor");
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
        json_object *id = sc_get(s, "$id");
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

json_object *sc_ref_resolve(sc *c, json_object *refv, const char *path)
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
