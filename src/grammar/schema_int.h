/* Private to the JSON Schema front end: the compile context and the
 * functions its files share. One dispatch, sc_gen (schema.c), looks a
 * schema's applicator keywords up in a table (schema_ref.c: $ref;
 * schema_comb.c: allOf, anyOf/oneOf, dependencies, not, if) and hands the
 * rest to sc_leaf (schema_leaf.c: enum/const and the type table), whose
 * per-type emitters live in schema_number.c, schema_string.c,
 * schema_array.c and schema_object.c. Merging (allOf) is schema_merge.c,
 * negation (not, if, oneOf exclusivity) schema_negate.c, value equality and
 * the small validator schema_util.c. Files call each other's helpers; the
 * only recursion between files goes through sc_gen. */
#ifndef TERN_GRAMMAR_SCHEMA_INT_H
#define TERN_GRAMMAR_SCHEMA_INT_H

#include <json-c/json.h>
#include <time.h>

#include "fe_int.h"
#include "schema.h"

/* Deepest schema nesting (and merge chain) followed before giving up: real
 * schemas stay far below; hostile ones must not exhaust the stack. */
#define SC_MAX_DEPTH 96
/* Item counts above this are refused rather than written as huge bounded
 * repetitions (no generator needs them; the engine would pay for them). */
#define SC_MAX_COUNT 100000

/* Type bits; "number" includes the integers. */
enum {
    ST_NULL = 1, ST_BOOL = 2, ST_OBJECT = 4, ST_ARRAY = 8, ST_NUMBER = 16, ST_STRING = 32,
    ST_INTEGER = 64, ST_ALL = 127
};

typedef struct sc_ref {
    json_object *target;
    char name[GFE_NAME_MAX];
    int nest_at_entry; /* structural depth when entered; -1 when finished */
    int referenced;    /* used from inside its own expansion */
} sc_ref;

/* An embedded resource or anchor: its absolute URI (with "#name" for an
 * anchor), and the schema (schema_ref.c). */
typedef struct sc_res { char *uri; json_object *s; } sc_res;
/* The base URI in force where a "$ref" value sits in the document. */
typedef struct sc_rbase { json_object *ref; char *base; } sc_rbase;

typedef struct sc {
    grammar_schema_opts o;
    gfe_json_style st;
    gfe_rules r;
    json_object *root;
    int draft; /* 7 or 2020 */
    tern_err *err;
    int rc;
    struct timespec t0;
    int depth, nest;
    char any[GFE_NAME_MAX], unit[GFE_NAME_MAX];
    int have_any, have_unit;
    sc_ref *refs;
    size_t n_refs, cap_refs;
    json_object **owned; /* schemas built by merging, freed at the end */
    size_t n_owned, cap_owned;
    sc_res *res;         /* $id resources and anchors (schema_ref.c) */
    size_t n_res, cap_res;
    sc_rbase *rb;        /* per $ref value, sorted by pointer */
    size_t n_rb, cap_rb;
    int scanned;         /* res / rb filled */
    int strict_emptied;  /* strict mode left a negation's member without a name (sc_apply_member) */
} sc;

/* Object member k of s, or NULL (also when s is not an object). */
static inline json_object *sc_get(json_object *s, const char *k)
{
    json_object *v = NULL;
    if (json_object_is_type(s, json_type_object))
        json_object_object_get_ex(s, k, &v);
    return v;
}

static inline int sc_has(json_object *s, const char *k)
{
    return json_object_is_type(s, json_type_object) && json_object_object_get_ex(s, k, NULL);
}

static inline int sc_is_num(json_object *v)
{
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

/* Value of a number (sc_is_num): integers exactly up to 2^53. */
static inline double sc_numv(json_object *v)
{
    return json_object_is_type(v, json_type_int) ? (double)json_object_get_int64(v)
                                                 : json_object_get_double(v);
}

/* ---- schema.c: context, dispatch */

/* Sets the sticky error (first one wins) and returns it. */
int sc_fail(sc *c, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Compiles schema s at JSON pointer path into a rule; *never set when no
 * value satisfies it (name untouched). */
int sc_gen(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);

/* Rule for any JSON value; rule for one JSON-string character unit. */
const char *sc_any(sc *c);
const char *sc_unit(sc *c);
const char *sc_ws(sc *c); /* " ws " or " " */

/* Takes ownership of o (kept alive until the compile ends); returns o. */
json_object *sc_own(sc *c, json_object *o);
/* 1 when v is a list of patterns sc_merge built (an allOf of two
 * patterns): the compiler's own, never a user's array. */
int sc_patterns_internal(sc *c, json_object *v);
/* 1 once the compile has run past opts.max_ms. */
int sc_over_time(sc *c);
/* Shallow copy of s without the n listed keys; owned by c (NULL: error). */
json_object *sc_without(sc *c, json_object *s, const char *const *keys, int n);
/* Number of keywords of s that are not annotations. */
int sc_n_constraints(json_object *s);

/* An applicator keyword's compiler (the rows of sc_gen's table): s holds
 * the keyword; the same contract as sc_gen. */
typedef int (*sc_apply_fn)(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);

/* ---- schema_ref.c: $ref */

/* The schema a reference names: resolved against the base URI where the
 * $ref sits ($id of the enclosing resources), then a resource of the
 * document, an anchor ($anchor, $dynamicAnchor, draft 7 "#name" $id) or a
 * JSON pointer into the resource; NULL with an error (other documents:
 * unsupported). */
json_object *sc_ref_resolve(sc *c, json_object *refv, const char *path);
/* Frees what resolving kept (c->res, c->rb). */
void sc_ref_free(sc *c);
/* $ref (alone, or draft 7): one rule per target, recursion allowed when it
 * consumes input; otherwise the siblings are merged with the target. */
int sc_apply_ref(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);

/* ---- schema_comb.c: allOf, anyOf / oneOf, dependencies, not, if */

int sc_apply_all_of(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
int sc_apply_any_of(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
int sc_apply_dependencies(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
int sc_apply_not(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
int sc_apply_if(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);

/* ---- schema_negate.c: the negations of additionalProperties,
 * patternProperties and propertyNames say "the object has a member whose
 * key ... and whose value ...": the compiler's own keyword SC_MEMBER (its
 * value a list the compiler owns, one entry per such member: {"out":
 * names, "pp": patterns (the key is none of them and matches none), "in":
 * pattern (the key matches it), "fails": schema (the key fails it),
 * "value": schema}). It is compiled last, when the object's names are
 * known: one alternative per listed or required name that can be the
 * member (objects open to other names: unsupported). */
#define SC_MEMBER "$ternMember"
int sc_apply_member(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
/* Is v a JSON value the compiler made (and owns)? */
int sc_is_own(sc *c, json_object *v);

/* ---- schema_merge.c: allOf as one schema */

/* The intersection of a and b as one schema (owned by c, or a / b
 * themselves), or NULL with an error for keyword pairs tern cannot
 * intersect exactly. */
json_object *sc_merge(sc *c, json_object *a, json_object *b, const char *path);
/* s without a top-level $ref: the target (draft 7, or $ref alone), else
 * the siblings merged with it. NULL with an error. */
json_object *sc_deref(sc *c, json_object *s, const char *path);
/* The values enum / const allow (const wins; an enum without the const
 * empties it), or NULL when neither is present. *tmp receives an array the
 * caller frees (json_object_put) when one had to be built. */
json_object *sc_values_of(json_object *s, json_object **tmp);
/* {"allOf": [x, y]} (references taken), not owned; NULL: out of memory. */
json_object *sc_all_of2(json_object *x, json_object *y);

/* ---- schema_negate.c */

/* A schema matching exactly the values s rejects (owned by c), or NULL
 * with an error for keywords whose negation tern cannot express. no_eval:
 * refuse forms that would add property annotations (under
 * unevaluatedProperties). */
json_object *sc_negate(sc *c, json_object *s, int no_eval, const char *path);

/* ---- schema_leaf.c: enum / const, the type table, shared emitters */

/* Leaf: a schema without $ref / allOf / anyOf / oneOf / not / if. */
int sc_leaf(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
/* EBNF for one JSON value literal (enum/const members), appended to b. */
void sc_emit_value(sc *c, gfe_buf *b, json_object *v);
/* EBNF for a JSON string literal with exactly this content. */
void sc_emit_string_lit(sc *c, gfe_buf *b, const char *s, size_t len);
/* Non-negative integer keyword k of s (minLength...): 0 with *out (-1 when
 * absent or, for a max, beyond SC_MAX_COUNT), else the error. */
int sc_count_get(sc *c, json_object *s, const char *k, const char *path, long *out);
/* Adds b's text as a new rule (name out), failing on b's or the output's
 * error. */
int sc_rule_add(sc *c, gfe_buf *b, const char *path, char name[GFE_NAME_MAX]);
/* Appends the repetition suffix for lo..hi (hi -1: unbounded). */
void sc_rep(gfe_buf *b, long lo, long hi);

/* A per-type emitter (the rows of sc_leaf's table): appends one
 * alternative for the values of type mask & its type to out. Returns 0,
 * 1 when no value of the type satisfies s (out unused), or the error. */
typedef int (*sc_type_fn)(sc *c, json_object *s, int mask, const char *path, gfe_buf *out);

/* ---- schema_number.c, schema_string.c, schema_array.c, schema_object.c */

int sc_number_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out);
int sc_string_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out);
int sc_array_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out);
int sc_object_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out);

/* ---- schema_util.c */
/* 1 when s holds "not": {"multipleOf": 1} and nothing else under not: the
 * non-integral numbers, compiled by the leaf (schema_number.c) rather than
 * negated; the negation of `type: integer` is written this way. */
int sc_not_fraction(json_object *s);
/* JSON Schema equality: numbers by value, objects ignoring key order. */
int sc_json_equal(json_object *a, json_object *b);
/* Type mask of a JSON value (integers also count as numbers: ST_NUMBER|
 * ST_INTEGER for integral numbers). */
int sc_value_type(json_object *v);
/* Type mask from the "type" keyword (ST_ALL when absent); -1 on a bad value. */
int sc_type_mask(json_object *s);
/* Validates v against s for the keywords the grammar compiler supports:
 * 1 valid, 0 invalid, -1 undecidable here (caller treats as unsupported). */
int sc_validate(sc *c, json_object *v, json_object *s, int depth);
/* Numeric value of a JSON number. */
double sc_num(json_object *v);
/* Number of codepoints in a UTF-8 string. */
size_t sc_utf8_len(const char *s, size_t n);
/* schema_negate.c: an ECMAScript regex body (wrap it in ^...$) matching
 * every string except names[0..n) (all sharing their first d bytes): the
 * trie complement; call with d = depth = 0. */
void sc_regex_notin(gfe_buf *b, const char **names, size_t n, size_t d, int depth);
/* Does the regex (ECMAScript flavour, searched) match s? 1/0, -1 error. */
int sc_regex_search(const char *re, const char *s, size_t n);
/* schema_string.c: format's regex (*re anchored), or *re NULL when the
 * name is an annotation. 0, or the error (not a string, or refused). */
int sc_format_re(sc *c, json_object *fmt, const char *path, const char **re);

/* multipleOf value as p / 10^q (p >= 1, q <= 9); -1 if not representable.
 * (schema_number.c) */
int sc_decimal(json_object *v, long *p, int *q);

/* Keyword tables: a keyword tern compiles; a keyword with no assertion
 * (listed annotations and, as JSON Schema defines, unknown keywords other
 * than case variants of assertion keywords and foreign assertions). */
int sc_is_supported(const char *k);
int sc_is_annotation(const char *k);

#endif
