/* Negation: sc_negate turns a schema into one matching exactly the values
 * it rejects (for not, if/then/else and oneOf exclusivity). NOT (k1 AND k2
 * ...) = (NOT k1) OR (NOT k2) ...: each keyword's negation comes from a
 * table of per-keyword negators; keywords without one are unsupported. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

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
void sc_regex_notin(gfe_buf *b, const char **names, size_t n, size_t d, int depth)
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
            sc_regex_notin(b, sub, m, d + adv, depth + 1);
            free(sub);
        }
    }
    gfe_cset_free(&next);
    gfe_buf_puts(b, ")");
}

/* The scalars an enum/const lists, by type. */
typedef struct value_set {
    int types;         /* types present (integers count as numbers) */
    const char **strs; /* the strings (no embedded NUL) */
    size_t n_str;
    int has_true, has_false;
    json_object *ints; /* the integers (|v| < 1e15), as an array */
} value_set;

/* Sorts vals into *vs. 0, 1 (a value tern cannot negate: non-scalar,
 * fractional, huge, a string with a NUL), -1 out of memory. */
static int values_scan(json_object *vals, value_set *vs)
{
    size_t n = json_object_array_length(vals);
    vs->strs = calloc(n + 1, sizeof *vs->strs);
    vs->ints = json_object_new_array();
    if (!vs->strs || !vs->ints)
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(vals, i);
        int t = sc_value_type(v);
        if (t & ST_STRING) {
            const char *sv = json_object_get_string(v);
            if ((size_t)json_object_get_string_len(v) != strlen(sv))
                return 1; /* embedded NUL */
            vs->strs[vs->n_str++] = sv;
        } else if (t & ST_BOOL) {
            if (json_object_get_boolean(v))
                vs->has_true = 1;
            else
                vs->has_false = 1;
        } else if (t == (ST_NUMBER | ST_INTEGER) && fabs(sc_num(v)) < 1e15) {
            json_object_array_add(vs->ints, json_object_new_int64((int64_t)sc_num(v)));
        } else if (t != ST_NULL) {
            return 1;
        }
        vs->types |= t & ST_INTEGER ? ST_NUMBER : t;
    }
    return 0;
}

/* Values of the types none of the listed values has. */
static int neg_other_types(const value_set *vs, json_object *alts)
{
    static const struct { int bit; const char *n; } names[] = {
        {ST_NULL, "null"}, {ST_BOOL, "boolean"}, {ST_OBJECT, "object"},
        {ST_ARRAY, "array"}, {ST_STRING, "string"}, {ST_NUMBER, "number"},
    };
    json_object *other = json_object_new_array();
    for (size_t i = 0; other && i < sizeof names / sizeof names[0]; i++)
        if (!(vs->types & names[i].bit))
            json_object_array_add(other, json_object_new_string(names[i].n));
    json_object *to = json_object_new_object();
    if (!other || !to) {
        json_object_put(other);
        json_object_put(to);
        return -1;
    }
    json_object_object_add(to, "type", other);
    json_object_array_add(alts, to);
    return 0;
}

/* Numbers other than the listed integers: below, between, above each one
 * (bounds exclusive). */
static int neg_ints(const value_set *vs, json_object *alts)
{
    size_t k = json_object_array_length(vs->ints);
    if (!k)
        return 0;
    int64_t *iv = malloc(k * sizeof *iv);
    if (!iv)
        return -1;
    for (size_t i = 0; i < k; i++)
        iv[i] = json_object_get_int64(json_object_array_get_idx(vs->ints, i));
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
    return 0;
}

/* Strings other than the listed ones: a pattern of the trie complement. */
static int neg_strings(const value_set *vs, json_object *alts)
{
    if (!vs->n_str)
        return 0;
    gfe_buf re;
    gfe_buf_init(&re, 1u << 20);
    gfe_buf_puts(&re, "^");
    sc_regex_notin(&re, vs->strs, vs->n_str, 0, 0);
    gfe_buf_puts(&re, "$");
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string("string"));
    if (!re.err)
        json_object_object_add(o, "pattern", json_object_new_string(re.s));
    json_object_array_add(alts, o);
    int err = re.err;
    gfe_buf_free(&re);
    return err ? -1 : 0;
}

/* NOT (enum/const): values of other types, or of the same type but
 * different, for null, booleans, integers and strings. */
static json_object *negate_values(sc *c, json_object *vals, const char *path)
{
    value_set vs = {0};
    json_object *alts = json_object_new_array(), *r = NULL;
    int rc = alts ? values_scan(vals, &vs) : -1;
    if (!rc)
        rc = neg_other_types(&vs, alts);
    if (!rc && vs.has_true != vs.has_false) {
        json_object *b = json_object_new_object(), *e = json_object_new_array();
        json_object_array_add(e, json_object_new_boolean(vs.has_false));
        json_object_object_add(b, "enum", e);
        json_object_array_add(alts, b);
    }
    if (!rc)
        rc = neg_ints(&vs, alts);
    if (!rc)
        rc = neg_strings(&vs, alts);
    free(vs.strs);
    json_object_put(vs.ints);
    if (!rc)
        return sc_own(c, obj1("anyOf", alts));
    json_object_put(alts);
    if (rc > 0)
        sc_fail(c, TERN_EUNSUPPORTED, path, "'not' / 'if' of an enum/const with non-scalar or fractional values");
    else
        sc_fail(c, TERN_ENOMEM, path, "out of memory");
    return r;
}

/* ------------------------------------------------------------ per keyword */

/* What a negator did with keyword k of s: NEG_ALT (*alt is the negation,
 * NULL: out of memory), NEG_ADDED (its alternatives are already in alts, or
 * it has none), NEG_UNSUPPORTED (this form cannot be negated), NEG_FAILED
 * (error set). */
enum { NEG_ALT, NEG_ADDED, NEG_UNSUPPORTED, NEG_FAILED };

typedef struct neg_arg {
    sc *c;
    json_object *s; /* the schema (dereferenced) */
    const char *k;
    json_object *v; /* its value */
    int no_eval;
    const char *path;
    json_object *alts;
} neg_arg;

typedef int (*neg_fn)(neg_arg *n, json_object **alt);

/* Bounds: the opposite bound, on the same type (integer counts shifted). */
static const struct { const char *k, *type, *inv; long d; } k_neg_bounds[] = {
    {"minimum", "number", "exclusiveMaximum", 0}, {"exclusiveMinimum", "number", "maximum", 0},
    {"maximum", "number", "exclusiveMinimum", 0}, {"exclusiveMaximum", "number", "minimum", 0},
    {"minLength", "string", "maxLength", -1},     {"maxLength", "string", "minLength", 1},
    {"minItems", "array", "maxItems", -1},        {"maxItems", "array", "minItems", 1},
    {"minProperties", "object", "maxProperties", -1}, {"maxProperties", "object", "minProperties", 1},
};

static int neg_bound(neg_arg *n, json_object **alt)
{
    size_t bi;
    for (bi = 0; strcmp(n->k, k_neg_bounds[bi].k); bi++)
        ;
    json_object *v = n->v;
    if (!json_object_is_type(v, json_type_int) && !(json_object_is_type(v, json_type_double) && !k_neg_bounds[bi].d)) {
        sc_fail(n->c, TERN_EUNSUPPORTED, n->path, "'not' of a non-integer '%s'", n->k);
        return NEG_FAILED;
    }
    if (k_neg_bounds[bi].d < 0 && json_object_get_int64(v) <= 0)
        return NEG_ADDED; /* minX 0 always holds: its negation is empty */
    *alt = typed(k_neg_bounds[bi].type, k_neg_bounds[bi].inv,
                 k_neg_bounds[bi].d ? num_plus(v, k_neg_bounds[bi].d) : json_object_get(v));
    return NEG_ALT;
}

/* The non-integral numbers: {"type": "number", "not": {"multipleOf": 1}}
 * (sc_not_fraction: compiled by the leaf). */
static json_object *non_integers(void)
{
    return typed("number", "not", obj1("multipleOf", json_object_new_int64(1)));
}

/* type: the other types; integer without number: the other types and the
 * non-integral numbers. */
static int neg_type(neg_arg *n, json_object **alt)
{
    int m = sc_type_mask(n->s);
    if (m < 0) {
        sc_fail(n->c, TERN_EUNSUPPORTED, n->path, "'not' of a malformed 'type'");
        return NEG_FAILED;
    }
    if ((m & ST_INTEGER) && !(m & ST_NUMBER)) {
        json_object_array_add(n->alts, non_integers());
        m |= ST_NUMBER;
    }
    static const struct { int bit; const char *n; } names[] = {
        {ST_NULL, "null"}, {ST_BOOL, "boolean"}, {ST_OBJECT, "object"},
        {ST_ARRAY, "array"}, {ST_STRING, "string"}, {ST_NUMBER, "number"},
    };
    json_object *arr = json_object_new_array();
    for (size_t i = 0; arr && i < sizeof names / sizeof names[0]; i++)
        if (!(m & names[i].bit))
            json_object_array_add(arr, json_object_new_string(names[i].n));
    *alt = obj1("type", arr);
    return NEG_ALT;
}

/* required: an object without one of the names. */
static int neg_required(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_array))
        return NEG_UNSUPPORTED;
    for (size_t i = 0; i < json_object_array_length(n->v); i++) {
        json_object *nm = json_object_array_get_idx(n->v, i);
        if (!json_object_is_type(nm, json_type_string))
            continue;
        json_object *ps = obj1(json_object_get_string(nm), json_object_new_boolean(0));
        json_object_array_add(n->alts, typed("object", "properties", ps));
    }
    return NEG_ADDED;
}

/* properties: an object holding one of them with a value its schema
 * rejects. */
static int neg_properties(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_object) || n->no_eval)
        return NEG_UNSUPPORTED;
    json_object_object_foreach(n->v, pn, ps) {
        json_object *np = sc_negate(n->c, ps, 0, n->path);
        if (!np)
            return NEG_FAILED;
        json_object *o = typed("object", "properties", obj1(pn, json_object_get(np)));
        json_object *rq = json_object_new_array();
        json_object_array_add(rq, json_object_new_string(pn));
        if (o)
            json_object_object_add(o, "required", rq);
        else
            json_object_put(rq);
        json_object_array_add(n->alts, o);
    }
    return NEG_ADDED;
}

/* NOT anyOf = allOf of the negations. */
static int neg_any_of(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_array))
        return NEG_UNSUPPORTED;
    json_object *all = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(n->v); i++) {
        json_object *ni = sc_negate(n->c, json_object_array_get_idx(n->v, i), n->no_eval, n->path);
        if (!ni) {
            json_object_put(all);
            return NEG_FAILED;
        }
        json_object_array_add(all, json_object_get(ni));
    }
    *alt = obj1("allOf", all);
    return NEG_ALT;
}

/* NOT allOf = anyOf of the negations (flattened into alts). */
static int neg_all_of(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_array))
        return NEG_UNSUPPORTED;
    for (size_t i = 0; i < json_object_array_length(n->v); i++) {
        json_object *ni = sc_negate(n->c, json_object_array_get_idx(n->v, i), n->no_eval, n->path);
        if (!ni)
            return NEG_FAILED;
        json_object_array_add(n->alts, json_object_get(ni));
    }
    return NEG_ADDED;
}

/* items (a schema, no prefix before it): an array with an item the schema
 * rejects, {"contains": NOT items} (contains evaluates items: not under
 * no_eval). */
static int neg_prefix(neg_arg *n, json_object **alt);

static int neg_items(neg_arg *n, json_object **alt)
{
    if (json_object_is_type(n->v, json_type_array) && n->c->draft == 7)
        return neg_prefix(n, alt);
    if (json_object_is_type(n->v, json_type_array) || n->no_eval)
        return NEG_UNSUPPORTED;
    json_object *pre = sc_get(n->s, "prefixItems");
    if (n->c->draft != 7 && pre && !(json_object_is_type(pre, json_type_array) && json_object_array_length(pre) == 0))
        return NEG_UNSUPPORTED; /* items past a prefix: contains cannot say where */
    json_object *ni = sc_negate(n->c, n->v, 0, n->path);
    if (!ni)
        return NEG_FAILED;
    *alt = typed("array", "contains", json_object_get(ni));
    return NEG_ALT;
}

/* prefixItems (a draft 7 items array): an array long enough to hold item
 * i whose item i the i-th schema rejects, for some i. */
static int neg_prefix(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_array) || n->no_eval)
        return NEG_UNSUPPORTED;
    for (size_t i = 0; i < json_object_array_length(n->v); i++) {
        json_object *ni = sc_negate(n->c, json_object_array_get_idx(n->v, i), 0, n->path);
        if (!ni)
            return NEG_FAILED;
        json_object *pre = json_object_new_array();
        for (size_t j = 0; pre && j < i; j++)
            json_object_array_add(pre, json_object_new_boolean(1));
        if (pre)
            json_object_array_add(pre, json_object_get(ni));
        json_object *o = typed("array", n->c->draft == 7 ? "items" : "prefixItems", pre);
        if (!o)
            return NEG_FAILED;
        json_object_object_add(o, "minItems", json_object_new_int64((int64_t)i + 1));
        /* any items after (strict mode would close the prefix) */
        json_object_object_add(o, n->c->draft == 7 ? "additionalItems" : "items", json_object_new_boolean(1));
        json_object_array_add(n->alts, o);
    }
    return NEG_ADDED;
}

/* NOT oneOf: no branch holds, or two do: allOf of the negations, or
 * allOf[b_i, b_j] for a pair (up to 4 branches; the pairs' annotations
 * would count under no_eval). */
static int neg_one_of(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_array) || n->no_eval || json_object_array_length(n->v) > 4)
        return NEG_UNSUPPORTED;
    size_t k = json_object_array_length(n->v);
    json_object *none = json_object_new_array();
    for (size_t i = 0; none && i < k; i++) {
        json_object *ni = sc_negate(n->c, json_object_array_get_idx(n->v, i), 0, n->path);
        if (!ni) {
            json_object_put(none);
            return NEG_FAILED;
        }
        json_object_array_add(none, json_object_get(ni));
    }
    json_object_array_add(n->alts, obj1("allOf", none));
    for (size_t i = 0; i < k; i++)
        for (size_t j = i + 1; j < k; j++)
            json_object_array_add(n->alts, sc_all_of2(json_object_array_get_idx(n->v, i), json_object_array_get_idx(n->v, j)));
    return NEG_ADDED;
}

/* A string schema whose pattern is the compiler's own list (see
 * merge_pattern) of the one entry e. */
static json_object *string_pattern1(sc *c, json_object *e)
{
    json_object *l = sc_own(c, json_object_new_array());
    if (!l) {
        json_object_put(e);
        return NULL;
    }
    json_object_array_add(l, e);
    return typed("string", "pattern", json_object_get(l));
}

/* pattern: a string the regex does not match (searched); the compiler's
 * list of patterns: a string one entry fails ({"not": p} fails where p
 * matches). */
static int neg_pattern(neg_arg *n, json_object **alt)
{
    if (json_object_is_type(n->v, json_type_string)) {
        *alt = string_pattern1(n->c, obj1("not", json_object_get(n->v)));
        return NEG_ALT;
    }
    if (!sc_patterns_internal(n->c, n->v))
        return NEG_UNSUPPORTED;
    for (size_t i = 0; i < json_object_array_length(n->v); i++) {
        json_object *e = json_object_array_get_idx(n->v, i), *p;
        json_object *o = json_object_object_get_ex(e, "not", &p) ? json_object_get(p) : obj1("not", json_object_get(e));
        json_object *s = string_pattern1(n->c, o);
        if (!s)
            return NEG_FAILED;
        json_object_array_add(n->alts, s);
    }
    return NEG_ADDED;
}

/* format with a regex: a string it does not match; an annotation format
 * always holds (no alternative). */
static int neg_format(neg_arg *n, json_object **alt)
{
    const char *re;
    if (sc_format_re(n->c, n->v, n->path, &re))
        return NEG_FAILED;
    if (!re)
        return NEG_ADDED;
    *alt = string_pattern1(n->c, obj1("not", json_object_new_string(re)));
    return NEG_ALT;
}

/* {"type": "object", SC_MEMBER: [spec]} (spec consumed). */
static json_object *member_schema(sc *c, json_object *spec)
{
    json_object *l = sc_own(c, json_object_new_array());
    if (!l) {
        json_object_put(spec);
        return NULL;
    }
    json_object_array_add(l, spec);
    return typed("object", SC_MEMBER, json_object_get(l));
}

/* additionalProperties: a member whose key is neither listed nor matched
 * by a patternProperties pattern and whose value the schema rejects. */
static int neg_additional(neg_arg *n, json_object **alt)
{
    json_object *props = sc_get(n->s, "properties"), *pp = sc_get(n->s, "patternProperties");
    if (n->no_eval || (props && !json_object_is_type(props, json_type_object)) ||
        (pp && !json_object_is_type(pp, json_type_object)))
        return NEG_UNSUPPORTED;
    json_object *nv = sc_negate(n->c, n->v, 0, n->path);
    if (!nv)
        return NEG_FAILED;
    if (json_object_is_type(nv, json_type_boolean) && !json_object_get_boolean(nv))
        return NEG_ADDED;
    json_object *spec = json_object_new_object(), *out = json_object_new_array(), *pl = json_object_new_array();
    if (props) {
        json_object_object_foreach(props, k, v) {
            (void)v;
            json_object_array_add(out, json_object_new_string(k));
        }
    }
    if (pp) {
        json_object_object_foreach(pp, k, v) {
            (void)v;
            json_object_array_add(pl, json_object_new_string(k));
        }
    }
    json_object_object_add(spec, "out", out);
    json_object_object_add(spec, "pp", pl);
    json_object_object_add(spec, "value", json_object_get(nv));
    *alt = member_schema(n->c, spec);
    return NEG_ALT;
}

/* patternProperties: a member whose key matches a pattern and whose value
 * that pattern's schema rejects. */
static int neg_pattern_props(neg_arg *n, json_object **alt)
{
    if (n->no_eval || !json_object_is_type(n->v, json_type_object))
        return NEG_UNSUPPORTED;
    json_object_object_foreach(n->v, re, ps) {
        json_object *nv = sc_negate(n->c, ps, 0, n->path);
        if (!nv)
            return NEG_FAILED;
        if (json_object_is_type(nv, json_type_boolean) && !json_object_get_boolean(nv))
            continue;
        json_object *spec = obj1("in", json_object_new_string(re));
        json_object_object_add(spec, "value", json_object_get(nv));
        json_object *o = member_schema(n->c, spec);
        if (!o)
            return NEG_FAILED;
        json_object_array_add(n->alts, o);
    }
    return NEG_ADDED;
}

/* propertyNames: a member whose key the schema rejects. */
static int neg_property_names(neg_arg *n, json_object **alt)
{
    json_object *spec = obj1("fails", json_object_get(n->v));
    json_object_object_add(spec, "value", json_object_new_boolean(1));
    *alt = member_schema(n->c, spec);
    return NEG_ALT;
}

/* contains (minContains 1, no maxContains): an array whose every item the
 * schema rejects; minContains 0 always holds. */
static int neg_contains(neg_arg *n, json_object **alt)
{
    json_object *mn = sc_get(n->s, "minContains");
    if (n->no_eval || sc_has(n->s, "maxContains") ||
        (mn && !(json_object_is_type(mn, json_type_int) && json_object_get_int64(mn) <= 1)))
        return NEG_UNSUPPORTED;
    if (mn && json_object_get_int64(mn) <= 0)
        return NEG_ADDED;
    json_object *nv = sc_negate(n->c, n->v, 0, n->path);
    if (!nv)
        return NEG_FAILED;
    *alt = typed("array", "items", json_object_get(nv));
    return NEG_ALT;
}

/* dependentRequired / dependentSchemas / dependencies: an object holding
 * the name and missing one of its list, or failing its schema. */
static int neg_dependencies(neg_arg *n, json_object **alt)
{
    if (!json_object_is_type(n->v, json_type_object))
        return NEG_UNSUPPORTED;
    json_object_object_foreach(n->v, name, dv) {
        json_object *rq = json_object_new_array();
        json_object_array_add(rq, json_object_new_string(name));
        if (json_object_is_type(dv, json_type_array)) {
            if (!strcmp(n->k, "dependentSchemas")) {
                json_object_put(rq);
                return NEG_UNSUPPORTED;
            }
            for (size_t i = 0; i < json_object_array_length(dv); i++) {
                json_object *e = json_object_array_get_idx(dv, i);
                if (!json_object_is_type(e, json_type_string))
                    continue;
                json_object *o = typed("object", "required", json_object_get(rq));
                json_object_object_add(o, "properties", obj1(json_object_get_string(e), json_object_new_boolean(0)));
                json_object_array_add(n->alts, o);
            }
            json_object_put(rq);
            continue;
        }
        if (!strcmp(n->k, "dependentRequired")) {
            json_object_put(rq);
            return NEG_UNSUPPORTED;
        }
        json_object *nd = sc_negate(n->c, dv, n->no_eval, n->path);
        if (!nd) {
            json_object_put(rq);
            return NEG_FAILED;
        }
        json_object *both = json_object_new_array();
        json_object_array_add(both, typed("object", "required", rq));
        json_object_array_add(both, json_object_get(nd));
        json_object_array_add(n->alts, obj1("allOf", both));
    }
    return NEG_ADDED;
}

/* minContains / maxContains: alone they assert nothing; beside contains,
 * neg_contains reads them. */
static int neg_contains_bound(neg_arg *n, json_object **alt)
{
    return NEG_ADDED;
}

/* enum / const: negate_values. */
static int neg_values(neg_arg *n, json_object **alt)
{
    if (!strcmp(n->k, "enum") && sc_has(n->s, "const"))
        return NEG_ADDED; /* const alone decides; enum's negation is wider */
    json_object *tmp = NULL, *vals = sc_values_of(n->s, &tmp);
    json_object *nv = json_object_is_type(vals, json_type_array) ? negate_values(n->c, vals, n->path) : NULL;
    json_object_put(tmp);
    if (!nv) {
        if (!n->c->rc)
            sc_fail(n->c, TERN_EUNSUPPORTED, n->path, "'not' of a malformed enum");
        return NEG_FAILED;
    }
    *alt = json_object_get(nv);
    return NEG_ALT;
}

/* multipleOf 1: the non-integral numbers (other divisors: unsupported). */
static int neg_multiple(neg_arg *n, json_object **alt)
{
    if (!sc_is_num(n->v) || sc_numv(n->v) != 1.0)
        return NEG_UNSUPPORTED;
    *alt = non_integers();
    return NEG_ALT;
}

/* NOT NOT x = x (its annotations would count under no_eval). */
static int neg_not(neg_arg *n, json_object **alt)
{
    if (n->no_eval && !sc_not_fraction(n->s))
        return NEG_UNSUPPORTED;
    *alt = json_object_get(n->v);
    return NEG_ALT;
}

static const struct {
    const char *k;
    neg_fn fn;
} k_negators[] = {
    {"minimum", neg_bound},       {"exclusiveMinimum", neg_bound}, {"maximum", neg_bound},
    {"exclusiveMaximum", neg_bound}, {"minLength", neg_bound},    {"maxLength", neg_bound},
    {"minItems", neg_bound},      {"maxItems", neg_bound},         {"minProperties", neg_bound},
    {"maxProperties", neg_bound}, {"type", neg_type},              {"required", neg_required},
    {"properties", neg_properties}, {"anyOf", neg_any_of},         {"allOf", neg_all_of},
    {"const", neg_values},        {"enum", neg_values},            {"not", neg_not},
    {"multipleOf", neg_multiple}, {"items", neg_items},           {"prefixItems", neg_prefix},
    {"oneOf", neg_one_of},        {"pattern", neg_pattern},       {"format", neg_format},
    {"additionalProperties", neg_additional}, {"patternProperties", neg_pattern_props},
    {"propertyNames", neg_property_names}, {"contains", neg_contains},
    {"minContains", neg_contains_bound}, {"maxContains", neg_contains_bound},
    {"dependentRequired", neg_dependencies}, {"dependentSchemas", neg_dependencies},
    {"dependencies", neg_dependencies},
};

static int negate_keyword(neg_arg *n, json_object **alt)
{
    for (size_t i = 0; i < sizeof k_negators / sizeof k_negators[0]; i++)
        if (!strcmp(n->k, k_negators[i].k))
            return k_negators[i].fn(n, alt);
    return NEG_UNSUPPORTED;
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
    s = sc_deref(c, s, path);
    if (!s)
        goto out;
    if (json_object_is_type(s, json_type_boolean)) {
        r = sc_own(c, json_object_new_boolean(!json_object_get_boolean(s)));
        goto out;
    }
    json_object *alts = sc_own(c, json_object_new_array());
    if (!alts)
        goto out;
    json_object_object_foreach(s, k, v) {
        if (sc_is_annotation(k))
            continue;
        neg_arg n = {c, s, k, v, no_eval, path, alts};
        json_object *alt = NULL;
        switch (negate_keyword(&n, &alt)) {
        case NEG_ADDED:
            continue;
        case NEG_FAILED:
            goto out;
        case NEG_UNSUPPORTED:
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

/* ------------------------------------------------------------ SC_MEMBER */

/* Can the key k be spec's member? 1, 0, or -1 (error set). */
static int member_key(sc *c, json_object *spec, const char *k, const char *path)
{
    json_object *v;
    if (json_object_object_get_ex(spec, "out", &v))
        for (size_t i = 0; i < json_object_array_length(v); i++)
            if (!strcmp(json_object_get_string(json_object_array_get_idx(v, i)), k))
                return 0;
    const char *in = NULL;
    if (json_object_object_get_ex(spec, "in", &v))
        in = json_object_get_string(v);
    json_object *pp = NULL;
    json_object_object_get_ex(spec, "pp", &pp);
    for (size_t i = 0; i < (pp ? json_object_array_length(pp) : 0) + (in != NULL); i++) {
        const char *re = pp && i < json_object_array_length(pp) ? json_object_get_string(json_object_array_get_idx(pp, i)) : in;
        int m = sc_regex_search(re, k, strlen(k));
        if (m < 0) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "pattern '%.100s' unsupported against property names", re);
            return -1;
        }
        if (m != (re == in))
            return 0;
    }
    if (json_object_object_get_ex(spec, "fails", &v)) {
        json_object *ks = json_object_new_string(k);
        int ok = ks ? sc_validate(c, ks, v, 0) : -1;
        json_object_put(ks);
        if (ok < 0) {
            sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of propertyNames too complex for the listed names");
            return -1;
        }
        if (ok)
            return 0;
    }
    return 1;
}

/* enum / const: the values holding such a member (an enum of them). */
static int member_values(sc *c, json_object *base, json_object *spec, json_object *value, const char *path,
                         char name[GFE_NAME_MAX], int *never)
{
    json_object *tmp = NULL, *vals = sc_values_of(base, &tmp), *keep = json_object_new_array();
    int rc = 0;
    for (size_t i = 0; keep && json_object_is_type(vals, json_type_array) && i < json_object_array_length(vals); i++) {
        json_object *v = json_object_array_get_idx(vals, i);
        int has = 0;
        if (json_object_is_type(v, json_type_object)) {
            json_object_object_foreach(v, k, mv) {
                int w = member_key(c, spec, k, path);
                if (w < 0) {
                    rc = c->rc;
                    goto out;
                }
                int ok = w && value ? sc_validate(c, mv, value, 0) : w;
                if (ok < 0) {
                    rc = sc_fail(c, TERN_EUNSUPPORTED, path, "enum/const together with keywords tern cannot check against it");
                    goto out;
                }
                has |= ok;
            }
        }
        if (has)
            json_object_array_add(keep, json_object_get(v));
    }
    if (!keep || !json_object_array_length(keep)) {
        *never = keep != NULL;
        rc = keep ? 0 : sc_fail(c, TERN_ENOMEM, path, "out of memory");
        goto out;
    }
    static const char *const k2[] = {"enum", "const"};
    json_object *m = sc_without(c, base, k2, 2);
    if (!m) {
        rc = c->rc;
        goto out;
    }
    json_object_object_add(m, "enum", keep);
    keep = NULL;
    rc = sc_gen(c, m, path, name, never);
out:
    json_object_put(keep);
    json_object_put(tmp);
    return rc;
}

int sc_apply_member(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    json_object *l = sc_get(s, SC_MEMBER);
    if (!sc_patterns_internal(c, l) || json_object_array_length(l) == 0)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword '%s' unsupported", SC_MEMBER);
    static const char *const k[] = {SC_MEMBER};
    json_object *base = sc_without(c, s, k, 1);
    if (!base)
        return c->rc;
    if (json_object_array_length(l) > 1) { /* the other members: compiled in each alternative */
        json_object *rest = sc_own(c, json_object_new_array());
        if (!rest)
            return c->rc;
        for (size_t i = 1; i < json_object_array_length(l); i++)
            json_object_array_add(rest, json_object_get(json_object_array_get_idx(l, i)));
        json_object_object_add(base, SC_MEMBER, json_object_get(rest));
    }
    json_object *spec = json_object_array_get_idx(l, 0), *value = NULL;
    json_object_object_get_ex(spec, "value", &value);
    if (sc_has(base, "enum") || sc_has(base, "const"))
        return member_values(c, base, spec, value, path, name, never);
    /* objects that hold only their listed and required names */
    json_object *ap = sc_get(base, "additionalProperties");
    if (!ap)
        ap = sc_get(base, "unevaluatedProperties");
    int closed = !sc_has(base, "patternProperties") &&
                 (json_object_is_type(ap, json_type_boolean) ? !json_object_get_boolean(ap) : !ap && c->o.strict);
    if (!closed)
        return sc_fail(c, TERN_EUNSUPPORTED, path,
                       "'not' of additionalProperties, patternProperties or propertyNames on an object open to "
                       "unlisted names");
    json_object *props = sc_get(base, "properties"), *req = sc_get(base, "required");
    json_object *alts = sc_own(c, json_object_new_array());
    if (!alts)
        return c->rc;
    size_t n_props = json_object_is_type(props, json_type_object) ? (size_t)json_object_object_length(props) : 0;
    size_t n_req = json_object_is_type(req, json_type_array) ? json_object_array_length(req) : 0;
    const char **names = calloc(n_props + n_req + 1, sizeof *names);
    size_t n = 0;
    if (!names)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    if (n_props) {
        json_object_object_foreach(props, pk, pv) {
            (void)pv;
            names[n++] = pk;
        }
    }
    for (size_t i = 0; i < n_req; i++) {
        json_object *e = json_object_array_get_idx(req, i);
        size_t j = 0;
        if (!json_object_is_type(e, json_type_string))
            continue;
        while (j < n && strcmp(names[j], json_object_get_string(e)))
            j++;
        if (j == n)
            names[n++] = json_object_get_string(e);
    }
    for (size_t i = 0; i < n; i++) {
        int w = member_key(c, spec, names[i], path);
        if (w < 0) {
            free(names);
            return c->rc;
        }
        if (!w)
            continue;
        json_object *rq = json_object_new_array();
        json_object_array_add(rq, json_object_new_string(names[i]));
        json_object *o = typed("object", "required", rq);
        json_object_object_add(o, "properties", obj1(names[i], value ? json_object_get(value) : json_object_new_boolean(1)));
        json_object_array_add(alts, o);
    }
    free(names);
    if (json_object_array_length(alts) == 0) {
        if (!json_object_is_type(ap, json_type_boolean)) /* closed by strict mode alone */
            c->strict_emptied = 1;
        *never = 1;
        return 0;
    }
    json_object_object_add(base, "anyOf", json_object_get(alts));
    return sc_gen(c, base, path, name, never);
}
