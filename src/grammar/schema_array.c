/* JSON Schema arrays -> EBNF: minItems / maxItems, prefixItems and items
 * (draft 7: items arrays and additionalItems; unevaluatedItems of the
 * schema holding the combinators), uniqueItems (trivially true, over
 * finite item domains in the grammar, else a rule named for the
 * matcher's run-time check: unique_int.h), contains with minContains /
 * maxContains. One function per keyword group; sc_array_gen combines
 * them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/unique_int.h"
#include "schema_int.h"

/* What an array schema says, read once. */
typedef struct arr_spec {
    long mn, mx;        /* minItems (0 when absent), maxItems (-1 when absent) */
    json_object *pre;   /* prefixItems (draft 7: an items array), or NULL */
    json_object *rest;  /* schema of the items after the prefix; NULL: any value */
    json_object *contains;
    long min_c, max_c;  /* minContains (default 1), maxContains (-1 when absent) */
    int unique;         /* uniqueItems over finite domains (array_unique_emit) */
} arr_spec;

/* {"allOf": [x, y]} owned by c. */
static json_object *all_of_own(sc *c, json_object *x, json_object *y)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return sc_own(c, NULL);
    }
    json_object_array_add(a, json_object_get(x));
    json_object_array_add(a, json_object_get(y));
    json_object_object_add(o, "allOf", a);
    return sc_own(c, o);
}

/* minItems / maxItems. 0, 1 (no array), or the error. */
static int array_counts_read(sc *c, json_object *s, const char *path, arr_spec *a)
{
    if (sc_count_get(c, s, "minItems", path, &a->mn) || sc_count_get(c, s, "maxItems", path, &a->mx))
        return c->rc;
    if (a->mn < 0)
        a->mn = 0;
    if (a->mx >= 0 && a->mx < a->mn)
        return 1;
    return 0;
}

/* prefixItems / items / additionalItems / unevaluatedItems: the prefix and
 * the schema of the rest (strict mode closes a prefix). 0, or the error. */
static int array_items_read(sc *c, json_object *s, const char *path, arr_spec *a)
{
    json_object *items = sc_get(s, "items");
    if (c->draft == 7 && json_object_is_type(items, json_type_array)) {
        a->pre = items;
        a->rest = sc_get(s, "additionalItems");
    } else {
        if (json_object_is_type(items, json_type_array))
            return sc_fail(c, TERN_EINVAL, path, "'items' must be a schema (use prefixItems)");
        a->pre = sc_get(s, "prefixItems");
        a->rest = items;
        /* additionalItems beside no items array has no effect (draft 7,
         * 2019-09; not a 2020-12 keyword at all) */
    }
    if (a->pre && !json_object_is_type(a->pre, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "prefixItems must be an array");
    if (!a->rest && sc_get(s, "unevaluatedItems"))
        a->rest = sc_get(s, "unevaluatedItems");
    if (!a->rest && c->o.strict && a->pre) { /* strict mode: no items past prefixItems unless allowed */
        a->rest = sc_own(c, json_object_new_boolean(0));
        if (!a->rest)
            return c->rc;
    }
    return 0;
}

/* uniqueItems: trivially true where at most one item is allowed; else
 * over finite item domains (array_unique_emit). */
static int array_unique_check(sc *c, json_object *s, const char *path, arr_spec *a)
{
    json_object *uq = sc_get(s, "uniqueItems");
    if (uq && !json_object_is_type(uq, json_type_boolean))
        return sc_fail(c, TERN_EINVAL, path, "'uniqueItems' must be a boolean");
    if (uq && json_object_get_boolean(uq) && !(a->mx >= 0 && a->mx <= 1))
        a->unique = 1;
    return 0;
}

/* uniqueItems over at most this many distinct values (a rule per subset
 * of used values). */
#define SC_UNIQUE_MAX 8

/* The values schema x admits when they are finitely many (enum / const,
 * or null / boolean types alone), added to u (distinct) with their bits
 * in *bits. 0, or -1 (not finite, or too many: unsupported). */
static int unique_domain(sc *c, json_object *x, json_object *u, unsigned *bits)
{
    *bits = 0;
    if (json_object_is_type(x, json_type_boolean) && !json_object_get_boolean(x))
        return 0;
    if (!json_object_is_type(x, json_type_object))
        return -1;
    json_object *tmp = NULL, *vals = sc_values_of(x, &tmp);
    json_object *owned = NULL;
    if (!vals) {
        int m = sc_type_mask(x);
        if (m < 0 || (m & ~(ST_NULL | ST_BOOL)))
            return -1;
        vals = owned = json_object_new_array();
        if (!owned)
            return -1;
        if (m & ST_NULL)
            json_object_array_add(owned, NULL);
        if (m & ST_BOOL) {
            json_object_array_add(owned, json_object_new_boolean(1));
            json_object_array_add(owned, json_object_new_boolean(0));
        }
    }
    int rc = 0;
    for (size_t i = 0; !rc && json_object_is_type(vals, json_type_array) && i < json_object_array_length(vals); i++) {
        json_object *v = json_object_array_get_idx(vals, i);
        int ok = sc_validate(c, v, x, 0);
        if (ok < 0) {
            rc = -1;
            break;
        }
        if (!ok)
            continue;
        size_t j, n = json_object_array_length(u);
        for (j = 0; j < n && !sc_json_equal(json_object_array_get_idx(u, j), v); j++)
            ;
        if (j == n) {
            if (n >= SC_UNIQUE_MAX) {
                rc = -1;
                break;
            }
            json_object_array_add(u, json_object_get(v));
        }
        *bits |= 1u << j;
    }
    json_object_put(tmp);
    json_object_put(owned);
    return rc;
}

/* uniqueItems with every item from a finite domain: a rule per set of
 * values used so far (its size is the position), each offering the
 * values not used yet that the position admits. 0, 1 (no array), 2 (the
 * domain is not finite: the run-time check), or the error. */
static int array_unique_emit(sc *c, const arr_spec *a, const char *path, gfe_buf *out)
{
    json_object *u = sc_own(c, json_object_new_array());
    if (!u)
        return c->rc;
    size_t k = a->pre ? json_object_array_length(a->pre) : 0;
    unsigned dom[SC_UNIQUE_MAX + 1], rest_dom = 0;
    int fin = 1;
    long mx = a->mx;
    for (size_t i = 0; i < k && fin; i++) {
        if (i >= SC_UNIQUE_MAX || unique_domain(c, json_object_array_get_idx(a->pre, i), u, &dom[i]))
            fin = 0;
    }
    int rest_any = mx < 0 || mx > (long)k; /* items past the prefix can occur */
    if (fin && rest_any && (!a->rest || unique_domain(c, a->rest, u, &rest_dom)))
        fin = 0;
    if (!fin || a->contains)
        return 2; /* the run-time check (sc_array_gen) */
    size_t n = json_object_array_length(u);
    unsigned full = (1u << n) - 1;
    /* live[m]: from the set m an array can end (m's size >= minItems) */
    char live[1u << SC_UNIQUE_MAX];
    char names[1u << SC_UNIQUE_MAX][GFE_NAME_MAX];
    for (unsigned m = full + 1; m-- > 0;) {
        int pos = __builtin_popcount(m);
        live[m] = pos >= a->mn && (mx < 0 || pos <= mx);
        if (mx >= 0 && pos >= mx)
            continue;
        unsigned allow = (size_t)pos < k ? dom[pos] : rest_dom;
        for (size_t v = 0; v < n && !live[m]; v++)
            if ((allow >> v & 1) && !(m >> v & 1) && live[m | 1u << v])
                live[m] = 1;
    }
    for (unsigned m = 1; m <= full; m++)
        if (live[m])
            gfe_rule_reserve(&c->r, names[m]);
    const char *w = sc_ws(c);
    gfe_buf b;
    gfe_buf_init(&b, 0);
    for (unsigned m = 1; m <= full; m++) {
        if (!live[m])
            continue;
        int pos = __builtin_popcount(m), n_alt = 0;
        unsigned allow = (size_t)pos < k ? dom[pos] : rest_dom;
        b.len = 0;
        if (pos >= a->mn) {
            gfe_buf_puts(&b, "\"\"");
            n_alt++;
        }
        for (size_t v = 0; v < n && (mx < 0 || pos < mx); v++) {
            unsigned t = m | 1u << v;
            if (!(allow >> v & 1) || (m >> v & 1) || !live[t])
                continue;
            gfe_buf_printf(&b, "%s%s\",\"%s", n_alt++ ? " | " : "", w, w);
            sc_emit_value(c, &b, json_object_array_get_idx(u, v));
            gfe_buf_printf(&b, " %s", names[t]);
        }
        gfe_rule_define(&c->r, names[m], b.s);
    }
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (a->mn == 0) {
        gfe_buf_printf(out, "\"[\"%s\"]\"", c->st.any_whitespace ? " ws " : " ");
        n_alt++;
    }
    for (size_t v = 0; v < n && (mx < 0 || mx >= 1); v++) {
        unsigned t = 1u << v;
        if (!((k ? dom[0] : rest_dom) >> v & 1) || !live[t])
            continue;
        gfe_buf_printf(out, "%s\"[\"%s", n_alt++ ? " | " : "", w);
        sc_emit_value(c, out, json_object_array_get_idx(u, v));
        gfe_buf_printf(out, " %s%s\"]\"", names[t], w);
    }
    gfe_buf_puts(out, ")");
    int err = b.err;
    gfe_buf_free(&b);
    if (err)
        return sc_fail(c, err, path, "grammar too large");
    return n_alt ? 0 : 1;
}

/* contains / minContains / maxContains. 0, 1 (no array), or the error. */
static int array_contains_read(sc *c, json_object *s, const char *path, arr_spec *a)
{
    a->contains = sc_get(s, "contains");
    a->min_c = 1;
    if (sc_get(s, "minContains") || sc_get(s, "maxContains")) {
        long t;
        if (sc_count_get(c, s, "minContains", path, &t))
            return c->rc;
        if (t >= 0)
            a->min_c = t;
        if (sc_count_get(c, s, "maxContains", path, &a->max_c))
            return c->rc;
        if (!a->contains) {
            a->min_c = 1;
            a->max_c = -1;
        }
    } else {
        a->max_c = -1;
    }
    if (a->max_c >= 0 && a->max_c < a->min_c)
        return 1;
    return 0;
}

/* maxContains: min_c..max_c elements match contains (cn), the others
 * must not (yn: rest AND NOT contains). */
static int array_contains_counted(sc *c, const arr_spec *a, const char *cn, char *sub, const char *path,
                                  gfe_buf *out)
{
    const char *w = sc_ws(c);
    json_object *nc = sc_negate(c, a->contains, 1, path);
    json_object *y = nc ? (a->rest ? all_of_own(c, a->rest, nc) : nc) : NULL;
    if (!y)
        return c->rc;
    char yn[GFE_NAME_MAX];
    int ynever = 0;
    if (sc_gen(c, y, sub, yn, &ynever))
        return c->rc;
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (a->min_c == 0) {
        gfe_buf_printf(out, "\"[\"%s\"]\"", c->st.any_whitespace ? " ws " : " ");
        n_alt++;
        if (!ynever)
            gfe_buf_printf(out, " | \"[\"%s%s (%s\",\"%s%s)*%s\"]\"", w, yn, w, w, yn, w);
    }
    if (a->max_c >= 1) {
        long lo = a->min_c > 1 ? a->min_c - 1 : 0, hi = a->max_c - 1;
        gfe_buf_puts(out, n_alt++ ? " | " : "");
        if (ynever) {
            gfe_buf_printf(out, "\"[\"%s%s (%s\",\"%s%s)", w, cn, w, w, cn);
        } else {
            gfe_buf_printf(out, "\"[\"%s(%s%s\",\"%s)* %s ((%s\",\"%s%s)*%s\",\"%s%s)", w, yn, w, w, cn, w, w,
                           yn, w, w, cn);
        }
        sc_rep(out, lo, hi);
        if (!ynever)
            gfe_buf_printf(out, " (%s\",\"%s%s)*", w, w, yn);
        gfe_buf_printf(out, "%s\"]\"", w);
    }
    gfe_buf_puts(out, ")");
    return n_alt ? 0 : 1;
}

/* contains: at least min_c elements match contains (and items). 0, 1 (no
 * array), or the error. */
static int array_contains_emit(sc *c, const arr_spec *a, const char *rest_name, int rest_never,
                               const char *path, gfe_buf *out)
{
    const char *w = sc_ws(c);
    char sub[256];
    if (a->pre || a->mn > 0 || a->mx >= 0)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'contains' together with prefixItems/minItems/maxItems");
    json_object *both = json_object_new_object(), *arr = json_object_new_array();
    if (!both || !arr) {
        json_object_put(both);
        json_object_put(arr);
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    }
    json_object_array_add(arr, json_object_get(a->contains));
    if (a->rest)
        json_object_array_add(arr, json_object_get(a->rest));
    json_object_object_add(both, "allOf", arr);
    sc_own(c, both);
    char cn[GFE_NAME_MAX];
    int cnever = 0;
    snprintf(sub, sizeof sub, "%.200s/contains", path);
    if (sc_gen(c, both, sub, cn, &cnever))
        return c->rc;
    if (cnever)
        return 1;
    if (rest_never) /* only contains elements... but items forbids all */
        return 1;
    if (a->max_c >= 0)
        return array_contains_counted(c, a, cn, sub, path, out);
    /* "[" (X ",")* C (("," X)* "," C){min_c-1} ("," X)* "]" */
    gfe_buf_printf(out, "(\"[\"%s(%s%s\",\"%s)* %s ((%s\",\"%s%s)*%s\",\"%s%s)", w, rest_name, w, w, cn, w, w,
                   rest_name, w, w, cn);
    sc_rep(out, a->min_c - 1, a->min_c - 1);
    gfe_buf_printf(out, " (%s\",\"%s%s)*%s\"]\")", w, w, rest_name, w);
    return 0;
}

/* The prefix elements, then the rest up to maxItems, positions past
 * minItems optional; a never element truncates the array. 0, 1 (no
 * array), or the error. */
static int array_prefix_emit(sc *c, const arr_spec *a, const char *rest_name, int rest_never, const char *path,
                             gfe_buf *out)
{
    const char *w = sc_ws(c);
    char sub[256];
    long mn = a->mn;
    size_t k = a->pre ? json_object_array_length(a->pre) : 0;
    gfe_buf b;
    gfe_buf_init(&b, 0);
    size_t k_ok = k;
    char (*pn)[GFE_NAME_MAX] = k ? calloc(k, sizeof *pn) : NULL;
    if (k && !pn)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    for (size_t i = 0; i < k; i++) {
        int nv = 0;
        snprintf(sub, sizeof sub, "%.200s/prefixItems/%zu", path, i);
        if (sc_gen(c, json_object_array_get_idx(a->pre, i), sub, pn[i], &nv)) {
            free(pn);
            gfe_buf_free(&b);
            return c->rc;
        }
        if (nv) {
            k_ok = i;
            break;
        }
    }
    long max_len = a->mx;
    if ((long)k_ok < (long)k || rest_never) {
        long cap = (long)k_ok;
        if (max_len < 0 || max_len > cap)
            max_len = cap;
    }
    if (mn > max_len && max_len >= 0) {
        free(pn);
        gfe_buf_free(&b);
        return 1;
    }
    /* elements after the first: each ", elem"; nested optional groups */
    int n_open = 0;
    long first_opt = mn; /* positions >= mn are optional */
    for (long i = 1; i < (long)k_ok && (max_len < 0 || i < max_len); i++) {
        if (i >= first_opt) {
            gfe_buf_puts(&b, "(");
            n_open++;
        }
        gfe_buf_printf(&b, "%s\",\"%s%s ", w, w, pn[i]);
    }
    long done = (long)k_ok > 0 ? (long)k_ok : 1;
    if ((max_len < 0 || done < max_len) && !rest_never && (long)k_ok == (long)k) {
        long lo = mn > done ? mn - done : 0;
        long hi = max_len < 0 ? -1 : max_len - done;
        if (k_ok == 0) { /* first element comes from items too */
            lo = mn > 1 ? mn - 1 : 0;
            hi = max_len < 0 ? -1 : max_len - 1;
        }
        gfe_buf_printf(&b, "(%s\",\"%s%s)", w, w, rest_name);
        sc_rep(&b, lo, hi);
    }
    for (int i = 0; i < n_open; i++)
        gfe_buf_puts(&b, ")?");
    const char *first = k_ok ? pn[0] : (rest_never ? NULL : rest_name);
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (first && (max_len < 0 || max_len >= 1)) {
        gfe_buf_printf(out, "\"[\"%s%s %s%s\"]\"", w, first, b.s ? b.s : "", w);
        n_alt++;
    }
    if (mn == 0)
        gfe_buf_printf(out, "%s\"[\"%s\"]\"", n_alt++ ? " | " : "", c->st.any_whitespace ? " ws " : " ");
    gfe_buf_puts(out, ")");
    free(pn);
    int err = b.err;
    gfe_buf_free(&b);
    if (err)
        return sc_fail(c, err, path, "grammar too large");
    return n_alt ? 0 : 1;
}

static int array_plain_emit(sc *c, arr_spec *a_, const char *path, gfe_buf *out);

int sc_array_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    (void)mask;
    arr_spec a = {0};
    int rc;
    if ((rc = array_counts_read(c, s, path, &a)) || (rc = array_items_read(c, s, path, &a)) ||
        (rc = array_unique_check(c, s, path, &a)) || (rc = array_contains_read(c, s, path, &a)))
        return rc;
    if (a.unique && (rc = array_unique_emit(c, &a, path, out)) != 2)
        return rc;
    if (a.unique) {
        /* uniqueItems over an unbounded domain: the array as without it, in
         * a rule the matcher recognizes by name; it compares the items'
         * values as they complete (unique_int.h) */
        gfe_buf b;
        gfe_buf_init(&b, 0);
        a.unique = 0;
        rc = array_plain_emit(c, &a, path, &b);
        if (!rc && !b.err) {
            char name[GFE_NAME_MAX];
            snprintf(name, sizeof name, GUQ_RULE_PREFIX "%u", c->r.next++);
            gfe_rule_define(&c->r, name, b.s);
            gfe_buf_puts(out, name);
        }
        int err = b.err;
        gfe_buf_free(&b);
        if (err)
            return sc_fail(c, err, path, "grammar too large");
        return rc;
    }
    return array_plain_emit(c, &a, path, out);
}

/* The array without uniqueItems: items, prefixItems, contains. */
static int array_plain_emit(sc *c, arr_spec *a_, const char *path, gfe_buf *out)
{
    arr_spec a = *a_;
    char sub[256];
    char rest_name[GFE_NAME_MAX];
    int rest_never = 0;
    if (a.rest) {
        snprintf(sub, sizeof sub, "%.200s/items", path);
        if (sc_gen(c, a.rest, sub, rest_name, &rest_never))
            return c->rc;
    } else {
        memcpy(rest_name, sc_any(c), GFE_NAME_MAX);
    }
    if (a.contains && !(a.min_c == 0 && a.max_c < 0))
        return array_contains_emit(c, &a, rest_name, rest_never, path, out);
    return array_prefix_emit(c, &a, rest_name, rest_never, path, out);
}
