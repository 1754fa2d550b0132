/* The combinators of JSON Schema, each an applicator of sc_gen's table:
 * allOf (merged into one schema, schema_merge.c), anyOf / oneOf (one
 * alternative per branch, each merged with the siblings; oneOf's branches
 * proven pairwise disjoint, or made exclusive by negation), the dependent*
 * keywords (rewritten as "absent, or present and ..."), not and
 * if / then / else (through sc_negate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

/* oneOf with overlapping branches is compiled as "branch i and not the
 * others" up to this many branches (the rewrite is quadratic). */
#define SC_ONEOF_NEGATE_MAX 4

/* ------------------------------------------------------------ oneOf */

static int value_mask(json_object *s)
{
    int m = sc_type_mask(s);
    if (m < 0)
        m = ST_ALL;
    json_object *tmp = NULL, *vals = sc_values_of(s, &tmp);
    if (json_object_is_type(vals, json_type_array)) {
        int vm = 0;
        for (size_t i = 0; i < json_object_array_length(vals); i++)
            vm |= sc_value_type(json_object_array_get_idx(vals, i));
        m &= vm;
    }
    json_object_put(tmp);
    if (json_object_get_boolean(sc_get(s, "nullable")))
        m |= ST_NULL;
    return m;
}

static int values_disjoint(json_object *x, json_object *y)
{
    json_object *tx = NULL, *ty = NULL;
    json_object *vx = sc_values_of(x, &tx), *vy = sc_values_of(y, &ty);
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
    json_object *r = sc_get(s, "required");
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
        if (sc_has(y, open_k[i]))
            return 0;
    json_object *ap = sc_get(y, "additionalProperties");
    if (ap && !(json_object_is_type(ap, json_type_boolean) && !json_object_get_boolean(ap)))
        return 0;
    json_object *py = sc_get(y, "properties");
    return !(py && json_object_object_get_ex(py, k, NULL)) && !is_required(y, k);
}

/* Strings: the patterns (searched) and lengths of x and y together admit
 * no string (their product automaton is empty), or the listed strings of
 * one side all fail the other's patterns. */
static int strings_disjoint(sc *c, json_object *x, json_object *y)
{
    gfe_re_term t[GFE_RE_MAX_TERMS];
    int n = 0;
    long mn = 0, mx = -1;
    json_object *xy[2] = {x, y};
    for (int side = 0; side < 2; side++) {
        json_object *s = xy[side], *p = sc_get(s, "pattern"), *v;
        int internal = sc_patterns_internal(c, p);
        size_t k = internal ? json_object_array_length(p) : p ? 1 : 0;
        for (size_t i = 0; i < k; i++) {
            json_object *e = internal ? json_object_array_get_idx(p, i) : p;
            int neg = internal && json_object_object_get_ex(e, "not", &e);
            if (!json_object_is_type(e, json_type_string) || n == GFE_RE_MAX_TERMS)
                return 0;
            t[n++] = (gfe_re_term){json_object_get_string(e), (size_t)json_object_get_string_len(e), neg};
        }
        if ((v = sc_get(s, "minLength")) && json_object_is_type(v, json_type_int) && json_object_get_int64(v) > mn)
            mn = (long)json_object_get_int64(v);
        if ((v = sc_get(s, "maxLength")) && json_object_is_type(v, json_type_int) && json_object_get_int64(v) >= 0 &&
            (mx < 0 || json_object_get_int64(v) < mx))
            mx = (long)json_object_get_int64(v);
    }
    if (mx >= 0 && mx < mn)
        return 1;
    /* listed strings against the other side's patterns */
    for (int side = 0; side < 2; side++) {
        json_object *tmp = NULL, *vals = sc_values_of(xy[side], &tmp), *p = sc_get(xy[1 - side], "pattern");
        int all_fail = json_object_is_type(vals, json_type_array) && json_object_is_type(p, json_type_string);
        for (size_t i = 0; all_fail && i < json_object_array_length(vals); i++) {
            json_object *e = json_object_array_get_idx(vals, i);
            all_fail = json_object_is_type(e, json_type_string) &&
                       sc_regex_search(json_object_get_string(p), json_object_get_string(e),
                                       (size_t)json_object_get_string_len(e)) == 0;
        }
        json_object_put(tmp);
        if (all_fail)
            return 1;
    }
    if (n < 2)
        return 0;
    int never = 0;
    tern_err e = {0};
    char nm[GFE_NAME_MAX];
    return gfe_regex_emit_terms(NULL, t, n, mn, mx, nm, &never, &e) == 0 && never;
}

static int disjoint(sc *c, json_object *x, json_object *y)
{
    if (json_object_is_type(x, json_type_boolean) || json_object_is_type(y, json_type_boolean))
        return !json_object_get_boolean(x) || !json_object_get_boolean(y) ? 1 : 0;
    if (sc_has(x, "$ref") || sc_has(y, "$ref"))
        return 0;
    int mx = value_mask(x), my = value_mask(y);
    if (!(mx & my))
        return 1;
    if (values_disjoint(x, y))
        return 1;
    if ((mx & my) == ST_STRING && strings_disjoint(c, x, y))
        return 1;
    if ((mx & my) == ST_OBJECT) {
        json_object *px = sc_get(x, "properties"), *py = sc_get(y, "properties");
        if (json_object_is_type(px, json_type_object) && json_object_is_type(py, json_type_object)) {
            json_object_object_foreach(px, k, sx) {
                json_object *sy;
                if (!json_object_object_get_ex(py, k, &sy) || !is_required(x, k) || !is_required(y, k))
                    continue;
                if (json_object_is_type(sx, json_type_object) && json_object_is_type(sy, json_type_object) &&
                    !sc_has(sx, "$ref") && !sc_has(sy, "$ref") && disjoint(c, sx, sy))
                    return 1;
            }
        }
        /* strict: a property one side requires and the other cannot hold */
        if (c->o.strict) {
            json_object *rs[2] = {sc_get(x, "required"), sc_get(y, "required")};
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

/* ------------------------------------------------------------ applicators */

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
        br[i] = sc_merge(c, base, json_object_array_get_idx(list, i), sub);
        if (br[i] && !strcmp(kw, "oneOf"))
            br[i] = sc_deref(c, br[i], sub);
    }
    if (!c->rc && !strcmp(kw, "oneOf")) {
        size_t oi = 0, oj = 0;
        char why[160] = "";
        int overlap = 0;
        for (size_t i = 0; i < n && !overlap; i++)
            for (size_t j = i + 1; j < n && !overlap; j++)
                if (!disjoint(c, br[i], br[j]))
                    overlap = 1, oi = i, oj = j;
        /* not provably disjoint: exactly one holds = branch i AND NOT every
         * other branch, when the negations are expressible */
        if (overlap && n <= SC_ONEOF_NEGATE_MAX) {
            json_object **neg = calloc(n, sizeof *neg);
            int no_eval = sc_has(base, "unevaluatedProperties") || sc_has(base, "unevaluatedItems");
            tern_err saved = c->err ? *c->err : (tern_err){0};
            /* base AND b_i AND NOT (base AND b_j) = base AND b_i AND NOT
             * b_j: the branch's own keywords are negated, not the
             * siblings merged into it */
            for (size_t i = 0; neg && i < n && !c->rc; i++)
                neg[i] = sc_negate(c, json_object_array_get_idx(list, i), no_eval, path);
            if (neg && !c->rc) {
                for (size_t i = 0; i < n && !c->rc; i++) {
                    json_object *x = br[i];
                    for (size_t j = 0; j < n && x; j++)
                        if (j != i)
                            x = sc_merge(c, x, neg[j], path);
                    br[i] = x;
                }
                overlap = c->rc != 0;
            }
            if (c->rc) { /* report the overlap, with why negation failed */
                c->rc = 0;
                if (c->err) {
                    snprintf(why, sizeof why, "%.150s", c->err->msg);
                    *c->err = saved;
                }
            }
            free(neg);
        }
        if (overlap)
            sc_fail(c, TERN_EUNSUPPORTED, path,
                    "oneOf branches %zu and %zu may overlap (exclusivity not enforceable%s%.120s)", oi, oj,
                    why[0] ? ": " : "", why);
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

int sc_apply_all_of(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    json_object *l = sc_get(s, "allOf");
    if (!json_object_is_type(l, json_type_array) || json_object_array_length(l) == 0)
        return sc_fail(c, TERN_EINVAL, path, "'allOf' must be a non-empty array");
    static const char *const k[] = {"allOf"};
    json_object *m = sc_without(c, s, k, 1);
    for (size_t i = 0; m && i < json_object_array_length(l); i++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%.200s/allOf/%zu", path, i);
        m = sc_merge(c, m, json_object_array_get_idx(l, i), sub);
    }
    return m ? sc_gen(c, m, path, name, never) : c->rc;
}

int sc_apply_any_of(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    const char *kw = sc_has(s, "anyOf") ? "anyOf" : "oneOf";
    const char *const k[] = {kw};
    json_object *base = sc_without(c, s, k, 1);
    return base ? gen_alts(c, base, sc_get(s, kw), kw, path, name, never) : c->rc;
}

/* One dependency, "if name is present then v" (v: a list of required
 * names, or a schema), as anyOf[name absent, name present and v]. */
static json_object *dependency_alt(const char *name, json_object *v, int is_list)
{
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
    return alt;
}

/* dependentRequired / dependentSchemas / dependencies: "if name is present
 * then X" is exactly anyOf[name absent, name present and X], rewritten into
 * allOf members and compiled again. */
int sc_apply_dependencies(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    static const char *const k[] = {"dependentRequired", "dependentSchemas", "dependencies", "allOf"};
    json_object *m = sc_without(c, s, k, 4);
    json_object *list = json_object_new_array();
    if (!m || !list) {
        json_object_put(list);
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    }
    json_object_object_add(m, "allOf", list);
    json_object *old = sc_get(s, "allOf");
    for (size_t i = 0; json_object_is_type(old, json_type_array) && i < json_object_array_length(old); i++)
        json_object_array_add(list, json_object_get(json_object_array_get_idx(old, i)));
    for (int d = 0; d < 3; d++) {
        json_object *dv = sc_get(s, k[d]);
        if (!dv)
            continue;
        if (!json_object_is_type(dv, json_type_object))
            return sc_fail(c, TERN_EINVAL, path, "'%s' must be an object", k[d]);
        json_object_object_foreach(dv, dep, v) {
            int is_list = json_object_is_type(v, json_type_array);
            if ((d == 0 && !is_list) || (d == 1 && is_list))
                return sc_fail(c, TERN_EINVAL, path, "bad '%s' entry", k[d]);
            json_object_array_add(list, dependency_alt(dep, v, is_list));
        }
    }
    if (json_object_array_length(list) == 0)
        json_object_object_del(m, "allOf");
    return sc_gen(c, m, path, name, never);
}

/* not beside enum / const: the listed values the negated schema rejects,
 * when each can be checked (1), else 0 (negate instead). */
static int not_values(sc *c, json_object *rest, json_object *ns, const char *path, char name[GFE_NAME_MAX],
                      int *never, int *rc)
{
    json_object *tmp = NULL, *vals = sc_values_of(rest, &tmp), *keep = json_object_new_array();
    int ok = json_object_is_type(vals, json_type_array) && keep;
    for (size_t i = 0; ok && i < json_object_array_length(vals); i++) {
        json_object *v = json_object_array_get_idx(vals, i);
        int r = sc_validate(c, v, ns, 0);
        if (r < 0)
            ok = 0;
        else if (!r)
            json_object_array_add(keep, json_object_get(v));
    }
    json_object_put(tmp);
    if (!ok) {
        json_object_put(keep);
        return 0;
    }
    static const char *const k[] = {"enum", "const"};
    json_object *m = sc_without(c, rest, k, 2);
    if (!m) {
        json_object_put(keep);
        *rc = c->rc;
        return 1;
    }
    json_object_object_add(m, "enum", keep);
    *rc = json_object_array_length(keep) ? sc_gen(c, m, path, name, never) : (*never = 1, 0);
    return 1;
}

/* not: the siblings merged with the negation. */
int sc_apply_not(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    static const char *const k[] = {"not"};
    json_object *rest = sc_without(c, s, k, 1);
    int vrc = 0;
    if (rest && (sc_has(rest, "enum") || sc_has(rest, "const")) &&
        not_values(c, rest, sc_get(s, "not"), path, name, never, &vrc))
        return vrc;
    int no_eval = sc_has(s, "unevaluatedProperties") || sc_has(s, "unevaluatedItems");
    json_object *n = rest ? sc_negate(c, sc_get(s, "not"), no_eval, path) : NULL;
    json_object *m = n ? sc_merge(c, rest, n, path) : NULL;
    return m ? sc_gen(c, m, path, name, never) : c->rc;
}

/* if / then / else: (if AND then) OR (NOT if AND else), merged with the
 * siblings; then / else without if (or if alone) assert nothing. */
int sc_apply_if(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    static const char *const k[] = {"if", "then", "else"};
    json_object *rest = sc_without(c, s, k, 3);
    if (!rest || !sc_has(s, "if") || (!sc_has(s, "then") && !sc_has(s, "else")))
        return rest ? sc_gen(c, rest, path, name, never) : c->rc;
    int no_eval = sc_has(s, "unevaluatedProperties") || sc_has(s, "unevaluatedItems");
    json_object *f = sc_get(s, "if");
    json_object *nf = sc_negate(c, f, no_eval, path);
    if (!nf)
        return c->rc;
    json_object *t = sc_has(s, "then") ? sc_get(s, "then") : NULL, *e = sc_has(s, "else") ? sc_get(s, "else") : NULL;
    json_object *b1 = t ? sc_all_of2(f, t) : json_object_get(f);
    json_object *b2 = e ? sc_all_of2(nf, e) : json_object_get(nf);
    json_object *alts = json_object_new_array(), *any = json_object_new_object();
    json_object_array_add(alts, b1);
    json_object_array_add(alts, b2);
    json_object_object_add(any, "anyOf", alts);
    sc_own(c, any);
    json_object *m = sc_merge(c, rest, any, path);
    return m ? sc_gen(c, m, path, name, never) : c->rc;
}
