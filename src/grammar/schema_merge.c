/* allOf as one schema: sc_merge intersects two schemas keyword by keyword
 * through a table of per-keyword mergers (bounds take the tighter value,
 * required the union, type the intersection, subschemas nest as allOf, ...)
 * and fails closed on pairs it cannot intersect exactly. $ref siblings
 * (2020-12) are merged with the target here too (sc_deref). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

/* Largest cross product when two anyOf/oneOf lists meet in an allOf. */
#define SC_MAX_CROSS 64

json_object *sc_deref(sc *c, json_object *s, const char *path)
{
    for (int hops = 0; json_object_is_type(s, json_type_object) && sc_has(s, "$ref"); hops++) {
        if (hops > 32 || c->rc) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "$ref chain too long or cyclic");
            return NULL;
        }
        json_object *t = sc_ref_resolve(c, sc_get(s, "$ref"), path);
        if (!t)
            return NULL;
        if (c->draft == 7 || sc_n_constraints(s) == 1) {
            s = t;
            continue;
        }
        static const char *const k[] = {"$ref"};
        json_object *rest = sc_without(c, s, k, 1);
        if (!rest)
            return NULL;
        if (++c->depth > SC_MAX_DEPTH) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "schema nested too deeply");
            return NULL;
        }
        s = sc_merge(c, rest, t, path);
        c->depth--;
        if (!s)
            return NULL;
    }
    return s;
}

json_object *sc_values_of(json_object *s, json_object **tmp)
{
    json_object *e = sc_get(s, "enum");
    if (sc_has(s, "const")) {
        *tmp = json_object_new_array();
        if (*tmp) {
            json_object_array_add(*tmp, json_object_get(sc_get(s, "const")));
            if (e && json_object_is_type(e, json_type_array)) {
                /* const and enum together: keep const only if enum has it */
                int found = 0;
                for (size_t i = 0; i < json_object_array_length(e); i++)
                    found |= sc_json_equal(json_object_array_get_idx(e, i), sc_get(s, "const"));
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

json_object *sc_all_of2(json_object *x, json_object *y)
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

/* ------------------------------------------------------------ per keyword */

/* A keyword present in both a (value va) and b (vb), with different
 * values: writes the intersection into m. 0, or the error (set). */
typedef int (*merge_fn)(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                        json_object *vb, const char *path);

/* type: the intersection of the type sets. */
static int merge_type(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                      json_object *vb, const char *path)
{
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
    if (!arr) {
        sc_own(c, NULL);
        return c->rc;
    }
    json_object_object_add(m, "type", arr);
    return 0;
}

/* enum, const and properties: combined after the keyword loop. */
static int merge_later(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                       json_object *vb, const char *path)
{
    return 0;
}

static const char *const k_max_of[] = {"minimum", "exclusiveMinimum", "minLength", "minItems",
                                       "minProperties", "minContains"};

/* Lower bounds take the larger value, upper bounds the smaller. */
static int merge_bound(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                       json_object *vb, const char *path)
{
    if (!sc_is_num(va) || !sc_is_num(vb))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "non-numeric '%s'", k);
    int is_min = 0;
    for (size_t i = 0; i < sizeof k_max_of / sizeof k_max_of[0]; i++)
        is_min |= !strcmp(k, k_max_of[i]);
    int take_b = is_min ? sc_numv(vb) > sc_numv(va) : sc_numv(vb) < sc_numv(va);
    if (take_b)
        json_object_object_add(m, k, json_object_get(vb));
    return 0;
}

/* required: the union. */
static int merge_required(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                          json_object *vb, const char *path)
{
    json_object *arr = json_object_new_array();
    if (!arr || !json_object_is_type(va, json_type_array) || !json_object_is_type(vb, json_type_array)) {
        json_object_put(arr);
        return sc_fail(c, TERN_EINVAL, path, "'required' must be an array");
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
    return 0;
}

/* Keywords holding one subschema that applies to the same instances on
 * both sides: {"allOf": [va, vb]}. */
static int merge_sub(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                     json_object *vb, const char *path)
{
    json_object *o = sc_all_of2(va, vb);
    if (!o) {
        sc_own(c, NULL);
        return c->rc;
    }
    json_object_object_add(m, k, o);
    return 0;
}

static int merge_differ(sc *c, const char *k, const char *path)
{
    return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different '%s' values", k);
}

/* multipleOf: multiples of the least common multiple (exact decimals). */
static int merge_multiple(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                          json_object *vb, const char *path)
{
    long pa, pb;
    int qa, qb;
    if (sc_decimal(va, &pa, &qa) || sc_decimal(vb, &pb, &qb))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different 'multipleOf' values");
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
    if (l > 1000000000L)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with two different 'multipleOf' values");
    char txt[48];
    double dv = (double)l;
    for (int i = 0; i < q; i++)
        dv /= 10;
    snprintf(txt, sizeof txt, "%.17g", dv);
    json_object_object_add(m, k, q ? json_object_new_double_s(dv, txt) : json_object_new_int64(l));
    return 0;
}

static int merge_unique(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                        json_object *vb, const char *path)
{
    json_object_object_add(m, k, json_object_new_boolean(json_object_get_boolean(va) || json_object_get_boolean(vb)));
    return 0;
}

/* allOf: the concatenation. */
static int merge_all_of(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                        json_object *vb, const char *path)
{
    json_object *arr = json_object_new_array();
    if (!arr) {
        sc_own(c, NULL);
        return c->rc;
    }
    for (int s = 0; s < 2; s++) {
        json_object *l = s ? vb : va;
        for (size_t i = 0; json_object_is_type(l, json_type_array) && i < json_object_array_length(l); i++)
            json_object_array_add(arr, json_object_get(json_object_array_get_idx(l, i)));
    }
    json_object_object_add(m, k, arr);
    return 0;
}

/* anyOf / oneOf on both sides: the cross product of the branches. */
static int merge_cross(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                       json_object *vb, const char *path)
{
    if (!json_object_is_type(va, json_type_array) || !json_object_is_type(vb, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "'%s' must be an array", k);
    size_t na = json_object_array_length(va), nb = json_object_array_length(vb);
    if (na * nb > SC_MAX_CROSS)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf of two large '%s' lists", k);
    json_object *arr = json_object_new_array();
    for (size_t i = 0; arr && i < na; i++)
        for (size_t j = 0; j < nb; j++)
            json_object_array_add(arr, sc_all_of2(json_object_array_get_idx(va, i), json_object_array_get_idx(vb, j)));
    if (!arr) {
        sc_own(c, NULL);
        return c->rc;
    }
    json_object_object_add(m, k, arr);
    return 0;
}

/* pattern on both sides: both regexes, kept as a list the string leaf
 * intersects (sc_patterns_internal marks it as the compiler's own; its
 * entries are strings, or {"not": string} from a negation). */
static int merge_pattern(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                         json_object *vb, const char *path)
{
    json_object *arr = sc_own(c, json_object_new_array());
    if (!arr)
        return c->rc;
    json_object *sides[2] = {va, vb};
    for (int i = 0; i < 2; i++) {
        json_object *v = sides[i];
        if (json_object_is_type(v, json_type_string)) {
            json_object_array_add(arr, json_object_get(v));
        } else if (sc_patterns_internal(c, v)) {
            for (size_t j = 0; j < json_object_array_length(v); j++)
                json_object_array_add(arr, json_object_get(json_object_array_get_idx(v, j)));
        } else {
            return sc_fail(c, TERN_EINVAL, path, "'pattern' must be a string");
        }
    }
    if (json_object_array_length(arr) > GFE_RE_MAX_TERMS)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf with more than %d different 'pattern' values",
                       GFE_RE_MAX_TERMS);
    json_object_object_add(m, k, json_object_get(arr));
    return 0;
}

/* not on both sides: NOT x AND NOT y = NOT (x OR y). */
static int merge_not(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                     json_object *vb, const char *path)
{
    json_object *o = json_object_new_object(), *l = json_object_new_array();
    if (!o || !l) {
        json_object_put(o);
        json_object_put(l);
        sc_own(c, NULL);
        return c->rc;
    }
    json_object_array_add(l, json_object_get(va));
    json_object_array_add(l, json_object_get(vb));
    json_object_object_add(o, "anyOf", l);
    json_object_object_add(m, k, o);
    return 0;
}

/* SC_MEMBER on both sides: both members required, one list. */
static int merge_member(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                        json_object *vb, const char *path)
{
    (void)a;
    (void)b;
    json_object *arr = sc_own(c, json_object_new_array());
    if (!arr)
        return c->rc;
    json_object *sides[2] = {va, vb};
    for (int i = 0; i < 2; i++) {
        if (!sc_patterns_internal(c, sides[i]))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword '%s' unsupported", k);
        for (size_t j = 0; j < json_object_array_length(sides[i]); j++)
            json_object_array_add(arr, json_object_get(json_object_array_get_idx(sides[i], j)));
    }
    json_object_object_add(m, k, json_object_get(arr));
    return 0;
}

/* Keywords without a row differ: unsupported. */
static const struct {
    const char *k;
    merge_fn fn;
} k_mergers[] = {
    {"type", merge_type},
    {"enum", merge_later},
    {"const", merge_later},
    {"properties", merge_later},
    {"minimum", merge_bound},
    {"exclusiveMinimum", merge_bound},
    {"minLength", merge_bound},
    {"minItems", merge_bound},
    {"minProperties", merge_bound},
    {"minContains", merge_bound},
    {"maximum", merge_bound},
    {"exclusiveMaximum", merge_bound},
    {"maxLength", merge_bound},
    {"maxItems", merge_bound},
    {"maxProperties", merge_bound},
    {"maxContains", merge_bound},
    {"required", merge_required},
    {"additionalProperties", merge_sub},
    {"propertyNames", merge_sub},
    {"items", merge_later},
    {"prefixItems", merge_later},
    {"additionalItems", merge_later},
    {"multipleOf", merge_multiple},
    {"uniqueItems", merge_unique},
    {"allOf", merge_all_of},
    {"anyOf", merge_cross},
    {"oneOf", merge_cross},
    {"not", merge_not},
    {"pattern", merge_pattern},
    {SC_MEMBER, merge_member},
};

static int merge_keyword(sc *c, json_object *m, const char *k, json_object *a, json_object *b, json_object *va,
                         json_object *vb, const char *path)
{
    for (size_t i = 0; i < sizeof k_mergers / sizeof k_mergers[0]; i++)
        if (!strcmp(k, k_mergers[i].k))
            return k_mergers[i].fn(c, m, k, a, b, va, vb, path);
    return merge_differ(c, k, path);
}

/* ------------------------------------------------------------ across keywords */

/* Object keywords of one side seen by the other: a name listed only in b is
 * constrained in a by a's additionalProperties (or patternProperties). */
static int merge_props(sc *c, json_object *m, json_object *a, json_object *b, const char *path)
{
    json_object *pa = sc_get(a, "properties"), *pb = sc_get(b, "properties");
    if (!pa && !pb)
        return 0;
    if ((sc_has(a, "patternProperties") && pb) || (sc_has(b, "patternProperties") && pa))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf combining properties with patternProperties unsupported");
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
                nv = s == 0 ? sc_all_of2(v, w) : sc_all_of2(w, v);
            else if (sc_get(other, "additionalProperties"))
                nv = sc_all_of2(v, sc_get(other, "additionalProperties"));
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

/* patternProperties meeting additionalProperties or other patterns: only
 * identical schemas combine. */
static int merge_check_patterns(sc *c, json_object *a, json_object *b, const char *path)
{
    if ((sc_has(a, "patternProperties") && (sc_has(b, "additionalProperties") || sc_has(b, "patternProperties"))) ||
        (sc_has(b, "patternProperties") && (sc_has(a, "additionalProperties") || sc_has(a, "patternProperties")))) {
        if (!sc_json_equal(a, b))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "allOf combining patternProperties unsupported");
    }
    return 0;
}

/* One side's array items as a prefix and the schema of the rest (NULL:
 * absent, any item): prefixItems / items (2020-12), or a draft 7 items
 * array / additionalItems. */
static void items_of(const sc *c, json_object *s, json_object **pre, json_object **rest)
{
    json_object *items = sc_get(s, "items");
    *pre = NULL;
    *rest = items;
    if (c->draft == 7 && json_object_is_type(items, json_type_array)) {
        *pre = items;
        *rest = sc_get(s, "additionalItems");
    } else if (c->draft != 7) {
        *pre = sc_get(s, "prefixItems");
    }
    if (!json_object_is_type(*pre, json_type_array))
        *pre = NULL;
}

/* Item i of one side: its prefix schema, else the rest (NULL: any). */
static json_object *item_at(json_object *pre, json_object *rest, size_t i)
{
    return pre && i < json_object_array_length(pre) ? json_object_array_get_idx(pre, i) : rest;
}

/* x AND y where either may be NULL (any value); a new reference. */
static json_object *both_of(json_object *x, json_object *y)
{
    if (!x || !y)
        return json_object_get(x ? x : y);
    return sc_json_equal(x, y) ? json_object_get(x) : sc_all_of2(x, y);
}

/* Array items on both sides: position by position, item i satisfies both
 * sides' schema for position i (a prefix entry, else the side's rest), and
 * items past both prefixes both rests -- the exact intersection, written
 * in the draft's own spelling. 0, or the error. */
static int merge_array(sc *c, json_object *m, json_object *a, json_object *b, const char *path)
{
    json_object *pa, *ra, *pb, *rb;
    items_of(c, a, &pa, &ra);
    items_of(c, b, &pb, &rb);
    if (!(pa || ra) || !(pb || rb))
        return 0; /* one side says nothing: the other's keywords are in m */
    size_t na = pa ? json_object_array_length(pa) : 0, nb = pb ? json_object_array_length(pb) : 0;
    size_t n = na > nb ? na : nb;
    json_object *pre = json_object_new_array();
    if (!pre)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *x = both_of(item_at(pa, ra, i), item_at(pb, rb, i));
        json_object_array_add(pre, x ? x : json_object_new_boolean(1));
    }
    json_object *rest = both_of(ra, rb);
    json_object_object_del(m, "prefixItems");
    json_object_object_del(m, "items");
    json_object_object_del(m, "additionalItems");
    if (c->draft == 7) {
        if (n) {
            json_object_object_add(m, "items", pre);
            if (rest)
                json_object_object_add(m, "additionalItems", rest);
        } else {
            json_object_put(pre);
            if (rest)
                json_object_object_add(m, "items", rest);
        }
    } else {
        if (n)
            json_object_object_add(m, "prefixItems", pre);
        else
            json_object_put(pre);
        if (rest)
            json_object_object_add(m, "items", rest);
    }
    return 0;
}

/* enum / const of either side: the values both allow, as one enum. */
static void merge_values(json_object *m, json_object *a, json_object *b)
{
    json_object *ta = NULL, *tb = NULL;
    json_object *ea = sc_values_of(a, &ta), *eb = sc_values_of(b, &tb);
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
}

/* A member's own unevaluatedProperties / unevaluatedItems, when the member
 * has no in-place applicator (nothing else of it can evaluate a property or
 * an item), is exactly its additionalProperties / items (additionalItems
 * after a draft 7 items array), or asserts nothing where that keyword is
 * present: the member rewritten (owned), or NULL with an error. The
 * rewritten member then evaluates every property (item), which is what the
 * base's own unevaluated* sees after merging. */
static json_object *member_unevaluated(sc *c, json_object *b, const char *path)
{
    static const char *const applicators[] = {"allOf", "anyOf", "oneOf", "$ref", "if", "then", "else",
                                              "dependentSchemas", "dependencies"};
    for (size_t i = 0; i < sizeof applicators / sizeof applicators[0]; i++)
        if (sc_has(b, applicators[i])) {
            sc_fail(c, TERN_EUNSUPPORTED, path,
                    "unevaluatedProperties/Items of an allOf/anyOf/oneOf/$ref member holding '%s'", applicators[i]);
            return NULL;
        }
    if (sc_has(b, "unevaluatedItems") && sc_has(b, "contains")) {
        sc_fail(c, TERN_EUNSUPPORTED, path, "unevaluatedItems beside contains in an allOf/anyOf/oneOf/$ref member");
        return NULL;
    }
    static const char *const k[] = {"unevaluatedProperties", "unevaluatedItems"};
    json_object *m = sc_without(c, b, k, 2);
    if (!m)
        return NULL;
    json_object *up = sc_get(b, "unevaluatedProperties"), *ui = sc_get(b, "unevaluatedItems");
    if (up && !sc_has(b, "additionalProperties"))
        json_object_object_add(m, "additionalProperties", json_object_get(up));
    if (ui) {
        json_object *items = sc_get(b, "items");
        if (json_object_is_type(items, json_type_array)) { /* draft 7 form */
            if (!sc_has(b, "additionalItems"))
                json_object_object_add(m, "additionalItems", json_object_get(ui));
        } else if (!items) {
            json_object_object_add(m, "items", json_object_get(ui));
        }
    }
    return m;
}

/* if without then/else, or then/else without if, asserts nothing: s
 * without them (they must not meet another side's half when merged). */
static json_object *cond_alone(sc *c, json_object *s)
{
    int has_if = sc_has(s, "if"), has_te = sc_has(s, "then") || sc_has(s, "else");
    if (has_if == has_te)
        return s;
    static const char *const k[] = {"if", "then", "else"};
    return sc_without(c, s, k, 3);
}

/* b's if/then/else as one anyOf member, (if AND then) OR (NOT if AND else),
 * when a has its own: b rewritten (owned), or NULL with an error. */
static json_object *cond_as_any_of(sc *c, json_object *a, json_object *b, const char *path)
{
    int no_eval = sc_has(a, "unevaluatedProperties") || sc_has(a, "unevaluatedItems");
    json_object *f = sc_get(b, "if"), *t = sc_get(b, "then"), *e = sc_get(b, "else");
    json_object *nf = sc_negate(c, f, no_eval, path);
    if (!nf)
        return NULL;
    static const char *const k[] = {"if", "then", "else"};
    json_object *rest = sc_without(c, b, k, 3);
    json_object *alts = json_object_new_array(), *any = json_object_new_object();
    if (!rest || !alts || !any) {
        json_object_put(alts);
        json_object_put(any);
        sc_own(c, NULL);
        return NULL;
    }
    json_object_array_add(alts, t ? sc_all_of2(f, t) : json_object_get(f));
    json_object_array_add(alts, e ? sc_all_of2(nf, e) : json_object_get(nf));
    json_object_object_add(any, "anyOf", alts);
    json_object *w = sc_own(c, sc_all_of2(rest, any));
    json_object_put(any);
    return w;
}

json_object *sc_merge(sc *c, json_object *a, json_object *b, const char *path)
{
    if (c->rc)
        return NULL;
    if (sc_over_time(c)) {
        sc_fail(c, TERN_ETIMEOUT, path, "compile time limit exceeded");
        return NULL;
    }
    if (json_object_is_type(a, json_type_boolean))
        return json_object_get_boolean(a) ? b : a;
    if (json_object_is_type(b, json_type_boolean))
        return json_object_get_boolean(b) ? a : b;
    /* nothing to intersect with a reference: keep it a reference, so a
     * recursive one (anyOf [{"$ref": "#"}...] under an empty base) stays a
     * rule call instead of being copied into itself until the depth bound */
    if (json_object_is_type(a, json_type_object) && !sc_n_constraints(a) && json_object_is_type(b, json_type_object) &&
        sc_has(b, "$ref") && !sc_has(b, "unevaluatedProperties") && !sc_has(b, "unevaluatedItems"))
        return b;
    a = sc_deref(c, a, path);
    b = a ? sc_deref(c, b, path) : NULL;
    if (!a || !b)
        return NULL;
    if (!json_object_is_type(a, json_type_object) || !json_object_is_type(b, json_type_object))
        return sc_merge(c, a, b, path);
    /* unevaluated*: a is the schema holding the combinator (or the $ref),
     * b a member. The base's keyword sees everything merged into it, which
     * is what "evaluated by an adjacent applicator" means; a member's own
     * unevaluated* sees only that member: without applicators of its own it
     * is the member's additional* keyword (member_unevaluated). */
    if (sc_has(b, "unevaluatedProperties") || sc_has(b, "unevaluatedItems")) {
        b = member_unevaluated(c, b, path);
        if (!b)
            return NULL;
    }
    a = cond_alone(c, a);
    b = a ? cond_alone(c, b) : NULL;
    if (a && b && sc_has(a, "if") && sc_has(b, "if") &&
        !(sc_json_equal(sc_get(a, "if"), sc_get(b, "if")) && sc_json_equal(sc_get(a, "then"), sc_get(b, "then")) &&
          sc_json_equal(sc_get(a, "else"), sc_get(b, "else"))))
        b = cond_as_any_of(c, a, b, path);
    if (!a || !b)
        return NULL;
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
        json_object *va = sc_get(a, k);
        if (!va) {
            json_object_object_add(m, k, json_object_get(vb));
            continue;
        }
        if (sc_json_equal(va, vb))
            continue;
        if (merge_keyword(c, m, k, a, b, va, vb, path))
            return NULL;
    }
    if ((sc_has(a, "properties") || sc_has(b, "properties")) && merge_props(c, m, a, b, path))
        return NULL;
    if (merge_check_patterns(c, a, b, path) || merge_array(c, m, a, b, path))
        return NULL;
    merge_values(m, a, b);
    return m;
}
