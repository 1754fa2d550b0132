/* JSON Schema helpers that need no grammar: value equality, type masks, and
 * a small validator for the keywords tern enforces, used to filter enum
 * values and property names against sibling constraints. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <string.h>
#include <strings.h>

#include "schema_int.h"

static const char *const k_supported[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "items",
    "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
    "minContains", "maxContains", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "anyOf", "oneOf",
    "not", "$ref", "if", "then", "else", "unevaluatedProperties", "unevaluatedItems",
    "dependentRequired", "dependentSchemas", "dependencies", "nullable", SC_MEMBER,
};

static const char *const k_annotations[] = {
    "title", "description", "examples", "example", "default", "$comment", "$schema", "$id",
    "id", "$anchor", "$dynamicAnchor", "$vocabulary", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "contentSchema", "markdownDescription",
    "enumDescriptions", "$defs", "definitions", "discriminator", "externalDocs", "xml",
    "$recursiveAnchor",
};

/* Assertion keywords of other drafts or vocabularies that tern does not
 * implement: always an error, never ignored. */
static const char *const k_foreign_assertions[] = {
    "$dynamicRef", "$recursiveRef", "disallow", "extends", "divisibleBy", "$data",
};

int sc_is_supported(const char *k)
{
    for (size_t i = 0; i < sizeof k_supported / sizeof k_supported[0]; i++)
        if (strcmp(k, k_supported[i]) == 0)
            return 1;
    return 0;
}

int sc_is_annotation(const char *k)
{
    for (size_t i = 0; i < sizeof k_annotations / sizeof k_annotations[0]; i++)
        if (strcmp(k, k_annotations[i]) == 0)
            return 1;
    if (sc_is_supported(k))
        return 0;
    for (size_t i = 0; i < sizeof k_foreign_assertions / sizeof k_foreign_assertions[0]; i++)
        if (strcmp(k, k_foreign_assertions[i]) == 0)
            return 0;
    /* A case variant of an assertion keyword ("maxlength") is almost surely
     * a typo for it: refuse rather than ignore. Every other unknown keyword
     * is an annotation, as JSON Schema itself defines. */
    for (size_t i = 0; i < sizeof k_supported / sizeof k_supported[0]; i++)
        if (strcasecmp(k, k_supported[i]) == 0)
            return 0;
    return 1;
}

static int num_of(json_object *v, double *d)
{
    if (json_object_is_type(v, json_type_int)) {
        *d = (double)json_object_get_int64(v);
        return 1;
    }
    if (json_object_is_type(v, json_type_double)) {
        *d = json_object_get_double(v);
        return 1;
    }
    return 0;
}

double sc_num(json_object *v)
{
    double d = 0;
    num_of(v, &d);
    return d;
}

int sc_json_equal(json_object *a, json_object *b)
{
    double x, y;
    if (num_of(a, &x) && num_of(b, &y)) {
        if (json_object_is_type(a, json_type_int) && json_object_is_type(b, json_type_int))
            return json_object_get_int64(a) == json_object_get_int64(b);
        return x == y;
    }
    json_type ta = json_object_get_type(a), tb = json_object_get_type(b);
    if (ta != tb)
        return 0;
    switch (ta) {
    case json_type_null: return 1;
    case json_type_boolean: return !json_object_get_boolean(a) == !json_object_get_boolean(b);
    case json_type_string:
        return json_object_get_string_len(a) == json_object_get_string_len(b) &&
               memcmp(json_object_get_string(a), json_object_get_string(b),
                      (size_t)json_object_get_string_len(a)) == 0;
    case json_type_array: {
        size_t n = json_object_array_length(a);
        if (n != json_object_array_length(b))
            return 0;
        for (size_t i = 0; i < n; i++)
            if (!sc_json_equal(json_object_array_get_idx(a, i), json_object_array_get_idx(b, i)))
                return 0;
        return 1;
    }
    case json_type_object: {
        if (json_object_object_length(a) != json_object_object_length(b))
            return 0;
        json_object_object_foreach(a, k, va) {
            json_object *vb;
            if (!json_object_object_get_ex(b, k, &vb) || !sc_json_equal(va, vb))
                return 0;
        }
        return 1;
    }
    default: return 0;
    }
}

int sc_value_type(json_object *v)
{
    double d;
    switch (json_object_get_type(v)) {
    case json_type_null: return ST_NULL;
    case json_type_boolean: return ST_BOOL;
    case json_type_int: return ST_NUMBER | ST_INTEGER;
    case json_type_double:
        d = json_object_get_double(v);
        return isfinite(d) && d == floor(d) ? ST_NUMBER | ST_INTEGER : ST_NUMBER;
    case json_type_string: return ST_STRING;
    case json_type_array: return ST_ARRAY;
    case json_type_object: return ST_OBJECT;
    }
    return 0;
}

static int type_bit(const char *t)
{
    static const struct { const char *n; int bit; } map[] = {
        {"null", ST_NULL},       {"boolean", ST_BOOL}, {"object", ST_OBJECT},
        {"array", ST_ARRAY},     {"number", ST_NUMBER | ST_INTEGER},
        {"string", ST_STRING},   {"integer", ST_INTEGER},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(t, map[i].n) == 0)
            return map[i].bit;
    return -1;
}

int sc_not_fraction(json_object *s)
{
    json_object *n = sc_get(s, "not");
    if (!json_object_is_type(n, json_type_object) || json_object_object_length(n) != 1)
        return 0;
    json_object *m = sc_get(n, "multipleOf");
    return m && sc_is_num(m) && sc_numv(m) == 1.0;
}

int sc_type_mask(json_object *s)
{
    json_object *t;
    if (!json_object_is_type(s, json_type_object) || !json_object_object_get_ex(s, "type", &t))
        return ST_ALL;
    if (json_object_is_type(t, json_type_string))
        return type_bit(json_object_get_string(t));
    if (!json_object_is_type(t, json_type_array))
        return -1;
    int m = 0;
    for (size_t i = 0; i < json_object_array_length(t); i++) {
        json_object *e = json_object_array_get_idx(t, i);
        if (!json_object_is_type(e, json_type_string))
            return -1;
        int b = type_bit(json_object_get_string(e));
        if (b < 0)
            return -1;
        m |= b;
    }
    return m;
}

size_t sc_utf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            k++;
    return k;
}

int sc_regex_search(const char *re, const char *s, size_t n)
{
    int ec;
    PCRE2_SIZE eo;
    /* ECMAScript escapes: \uHHHH and \u{H...} (PCRE2's alternative forms) */
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc)
        return -1;
    pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!code)
        return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    if (!md) {
        pcre2_code_free(code);
        return -1;
    }
    int rc = pcre2_match(code, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    if (rc >= 0)
        return 1;
    return rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* ---- the validator: one function per keyword, 1 (holds), 0 (fails) or
 * -1 (undecidable here: the caller fails closed). */

typedef struct val_arg {
    sc *c;
    json_object *v;  /* the instance */
    json_object *s;  /* the schema */
    const char *k;   /* the keyword */
    json_object *kv; /* its value */
    int depth;
} val_arg;

typedef int (*val_fn)(const val_arg *a);

static int val_type(const val_arg *a)
{
    int m = sc_type_mask(a->s);
    if (m < 0)
        return -1;
    return (m & sc_value_type(a->v)) ? 1 : 0;
}

static int val_const(const val_arg *a)
{
    return sc_json_equal(a->v, a->kv) ? 1 : 0;
}

static int val_enum(const val_arg *a)
{
    if (!json_object_is_type(a->kv, json_type_array))
        return -1;
    int found = 0;
    for (size_t i = 0; i < json_object_array_length(a->kv); i++)
        found |= sc_json_equal(a->v, json_object_array_get_idx(a->kv, i));
    return found ? 1 : 0;
}

static int val_bound(const val_arg *a)
{
    double d, x;
    const char *k = a->k;
    if (!num_of(a->kv, &d))
        return -1;
    if (!num_of(a->v, &x))
        return 1;
    if ((!strcmp(k, "minimum") && x < d) || (!strcmp(k, "maximum") && x > d) ||
        (!strcmp(k, "exclusiveMinimum") && x <= d) || (!strcmp(k, "exclusiveMaximum") && x >= d))
        return 0;
    return 1;
}

/* min/maxLength, min/maxItems, min/maxProperties: a count of instances of
 * one type ("mi..." a lower bound, "ma..." an upper one). */
static int val_count(const val_arg *a)
{
    double d, n;
    if (!num_of(a->kv, &d))
        return -1;
    const char *k = a->k;
    json_object *v = a->v;
    if (!strcmp(k + 3, "Length")) {
        if (!json_object_is_type(v, json_type_string))
            return 1;
        n = (double)sc_utf8_len(json_object_get_string(v), (size_t)json_object_get_string_len(v));
    } else if (!strcmp(k + 3, "Items")) {
        if (!json_object_is_type(v, json_type_array))
            return 1;
        n = (double)json_object_array_length(v);
    } else {
        if (!json_object_is_type(v, json_type_object))
            return 1;
        n = (double)json_object_object_length(v);
    }
    return (k[1] == 'i' && n < d) || (k[1] == 'a' && n > d) ? 0 : 1;
}

static int val_pattern(const val_arg *a)
{
    if (sc_patterns_internal(a->c, a->kv)) { /* patterns of an allOf: all; {"not": p}: p fails */
        int r = 1;
        for (size_t i = 0; i < json_object_array_length(a->kv) && r == 1; i++) {
            val_arg one = *a;
            json_object *p = json_object_array_get_idx(a->kv, i), *np;
            int neg = json_object_object_get_ex(p, "not", &np);
            one.kv = neg ? np : p;
            r = val_pattern(&one);
            if (neg && r >= 0)
                r = !r || !json_object_is_type(a->v, json_type_string) ? 1 : 0;
        }
        return r;
    }
    if (!json_object_is_type(a->kv, json_type_string))
        return -1;
    if (!json_object_is_type(a->v, json_type_string))
        return 1;
    int m = sc_regex_search(json_object_get_string(a->kv), json_object_get_string(a->v),
                            (size_t)json_object_get_string_len(a->v));
    return m < 0 ? -1 : m ? 1 : 0;
}

static int val_required(const val_arg *a)
{
    if (!json_object_is_type(a->kv, json_type_array))
        return -1;
    if (!json_object_is_type(a->v, json_type_object))
        return 1;
    int ok = 1;
    for (size_t i = 0; i < json_object_array_length(a->kv); i++) {
        json_object *n = json_object_array_get_idx(a->kv, i);
        if (!json_object_is_type(n, json_type_string))
            return -1;
        if (!json_object_object_get_ex(a->v, json_object_get_string(n), NULL))
            ok = 0;
    }
    return ok;
}

/* properties / patternProperties / additionalProperties, each over the
 * members it applies to (additionalProperties: neither listed nor matched
 * by a pattern). */
static int val_properties(const val_arg *a)
{
    if (!json_object_is_type(a->v, json_type_object))
        return 1;
    json_object *props = NULL, *ap = NULL, *pp = NULL;
    json_object_object_get_ex(a->s, "properties", &props);
    json_object_object_get_ex(a->s, "additionalProperties", &ap);
    json_object_object_get_ex(a->s, "patternProperties", &pp);
    if ((props && !json_object_is_type(props, json_type_object)) || (pp && !json_object_is_type(pp, json_type_object)))
        return -1;
    int ok = 1;
    json_object_object_foreach(a->v, pk, pv) {
        json_object *ps = NULL;
        int listed = props && json_object_object_get_ex(props, pk, &ps), r = 1, matched = 0;
        if (!strcmp(a->k, "properties")) {
            if (!listed)
                continue;
            r = sc_validate(a->c, pv, ps, a->depth + 1);
        } else {
            if (pp) {
                json_object_object_foreach(pp, re, rs) {
                    int m = sc_regex_search(re, pk, strlen(pk));
                    if (m < 0)
                        return -1;
                    matched |= m;
                    if (m && !strcmp(a->k, "patternProperties")) {
                        int r2 = sc_validate(a->c, pv, rs, a->depth + 1);
                        if (r2 < 0)
                            return -1;
                        r &= r2;
                    }
                }
            }
            if (!strcmp(a->k, "additionalProperties")) {
                if (listed || matched)
                    continue;
                r = sc_validate(a->c, pv, ap, a->depth + 1);
            }
        }
        if (r < 0)
            return -1;
        if (!r)
            ok = 0;
    }
    return ok;
}

/* Items from position `from` on against s. */
static int val_items_from(const val_arg *a, size_t from, json_object *s)
{
    int ok = 1;
    for (size_t i = from; i < json_object_array_length(a->v); i++) {
        int r = sc_validate(a->c, json_object_array_get_idx(a->v, i), s, a->depth + 1);
        if (r < 0)
            return -1;
        if (!r)
            ok = 0;
    }
    return ok;
}

/* prefixItems (or draft 7's items array): item i against schema i. */
static int val_prefix(const val_arg *a)
{
    if (!json_object_is_type(a->kv, json_type_array))
        return -1;
    if (!json_object_is_type(a->v, json_type_array))
        return 1;
    int ok = 1;
    for (size_t i = 0; i < json_object_array_length(a->v) && i < json_object_array_length(a->kv); i++) {
        int r = sc_validate(a->c, json_object_array_get_idx(a->v, i), json_object_array_get_idx(a->kv, i), a->depth + 1);
        if (r < 0)
            return -1;
        if (!r)
            ok = 0;
    }
    return ok;
}

/* additionalItems: the items past a draft 7 items array (nothing without
 * one). */
static int val_additional_items(const val_arg *a)
{
    json_object *it = NULL;
    if (!json_object_is_type(a->v, json_type_array) || !json_object_object_get_ex(a->s, "items", &it) ||
        !json_object_is_type(it, json_type_array))
        return 1;
    return val_items_from(a, json_object_array_length(it), a->kv);
}

static int val_items(const val_arg *a)
{
    if (json_object_is_type(a->kv, json_type_array))
        return val_prefix(a);
    if (!json_object_is_type(a->v, json_type_array))
        return 1;
    json_object *pre = NULL;
    if (json_object_object_get_ex(a->s, "prefixItems", &pre) && !json_object_is_type(pre, json_type_array))
        return -1;
    return val_items_from(a, pre ? json_object_array_length(pre) : 0, a->kv);
}

static int val_unique(const val_arg *a)
{
    if (!json_object_is_type(a->kv, json_type_boolean))
        return -1;
    if (!json_object_get_boolean(a->kv) || !json_object_is_type(a->v, json_type_array))
        return 1;
    size_t n = json_object_array_length(a->v);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (sc_json_equal(json_object_array_get_idx(a->v, i), json_object_array_get_idx(a->v, j)))
                ok = 0;
    return ok;
}

/* not: the opposite answer (undecidable stays undecidable). */
static int val_not(const val_arg *a)
{
    int r = sc_validate(a->c, a->v, a->kv, a->depth + 1);
    return r < 0 ? -1 : !r;
}

/* multipleOf: exact for integers and for decimals of up to 9 places. */
static int val_multiple(const val_arg *a)
{
    long p, q, pv;
    int iq, vq;
    if (sc_decimal(a->kv, &p, &iq))
        return -1;
    if (!sc_is_num(a->v))
        return 1;
    double x = sc_numv(a->v);
    if (x == 0)
        return 1;
    json_object *ab = json_object_new_double(fabs(x));
    int bad = !ab || sc_decimal(ab, &pv, &vq);
    json_object_put(ab);
    if (bad)
        return -1;
    /* x = pv / 10^vq, m = p / 10^iq: x / m = pv * 10^iq / (p * 10^vq) */
    q = 1;
    for (int i = 0; i < (vq > iq ? vq - iq : iq - vq); i++)
        q *= 10;
    __int128 num = (__int128)pv * (vq < iq ? q : 1), den = (__int128)p * (vq > iq ? q : 1);
    return num % den == 0;
}

/* anyOf / oneOf / allOf: how many members hold (any undecidable member
 * makes the answer undecidable). */
static int val_comb(const val_arg *a)
{
    if (!json_object_is_type(a->kv, json_type_array))
        return -1;
    size_t n = json_object_array_length(a->kv), hold = 0;
    for (size_t i = 0; i < n; i++) {
        int r = sc_validate(a->c, a->v, json_object_array_get_idx(a->kv, i), a->depth + 1);
        if (r < 0)
            return -1;
        hold += (size_t)r;
    }
    if (!strcmp(a->k, "allOf"))
        return hold == n;
    if (!strcmp(a->k, "oneOf"))
        return hold == 1;
    return hold > 0;
}

/* nullable: handled with type (sc_type_mask's callers add null). */
static int val_nothing(const val_arg *a)
{
    return 1;
}

/* Keywords without a row are undecidable. */
static const struct {
    const char *k;
    val_fn fn;
} k_validators[] = {
    {"type", val_type},
    {"const", val_const},
    {"enum", val_enum},
    {"minimum", val_bound},
    {"maximum", val_bound},
    {"exclusiveMinimum", val_bound},
    {"exclusiveMaximum", val_bound},
    {"minLength", val_count},
    {"maxLength", val_count},
    {"pattern", val_pattern},
    {"minItems", val_count},
    {"maxItems", val_count},
    {"minProperties", val_count},
    {"maxProperties", val_count},
    {"required", val_required},
    {"properties", val_properties},
    {"additionalProperties", val_properties},
    {"items", val_items},
    {"patternProperties", val_properties},
    {"prefixItems", val_prefix},
    {"additionalItems", val_additional_items},
    {"uniqueItems", val_unique},
    {"nullable", val_nothing},
    {"not", val_not},
    {"anyOf", val_comb},
    {"oneOf", val_comb},
    {"allOf", val_comb},
    {"multipleOf", val_multiple},
};

/* Validation of the keywords tern compiles; anything else makes the answer
 * undecidable (-1) so the caller fails closed. */
int sc_validate(sc *c, json_object *v, json_object *s, int depth)
{
    if (depth > 32)
        return -1;
    if (json_object_is_type(s, json_type_boolean))
        return json_object_get_boolean(s) ? 1 : 0;
    if (!json_object_is_type(s, json_type_object))
        return -1;
    int ok = 1;
    json_object_object_foreach(s, k, kv) {
        if (sc_is_annotation(k))
            continue;
        val_arg a = {c, v, s, k, kv, depth};
        size_t i;
        for (i = 0; i < sizeof k_validators / sizeof k_validators[0]; i++)
            if (!strcmp(k, k_validators[i].k))
                break;
        int r = i < sizeof k_validators / sizeof k_validators[0] ? k_validators[i].fn(&a) : -1;
        if (r < 0)
            return -1;
        if (!r)
            ok = 0;
    }
    return ok;
}
