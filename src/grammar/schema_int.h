/* Private to the JSON Schema front end: the compile context shared by
 * schema.c (dispatch, $ref, combinators, merging), schema_leaf.c (per-type
 * grammars) and schema_util.c (value equality, type masks, a small
 * validator used to filter enum values and property names). */
#ifndef TERN_GRAMMAR_SCHEMA_INT_H
#define TERN_GRAMMAR_SCHEMA_INT_H

#include <json-c/json.h>
#include <time.h>

#include "fe_int.h"
#include "schema.h"

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
} sc;

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

/* Leaf: a schema without $ref / allOf / anyOf / oneOf / not / if. */
int sc_leaf(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never);
/* EBNF for one JSON value literal (enum/const members), appended to b. */
void sc_emit_value(sc *c, gfe_buf *b, json_object *v);
/* EBNF for a JSON string literal with exactly this content. */
void sc_emit_string_lit(sc *c, gfe_buf *b, const char *s, size_t len);

/* A schema matching exactly the values s rejects (owned by c), or NULL
 * with an error for keywords whose negation tern cannot express. no_eval:
 * refuse forms that would add property annotations (under
 * unevaluatedProperties). */
json_object *sc_negate(sc *c, json_object *s, int no_eval, const char *path);

/* Takes ownership of o (kept alive until the compile ends); returns o. */
json_object *sc_own(sc *c, json_object *o);

/* ---- schema_util.c */
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
/* Does the regex (ECMAScript flavour, searched) match s? 1/0, -1 error. */
int sc_regex_search(const char *re, const char *s, size_t n);

/* multipleOf value as p / 10^q (p >= 1, q <= 9); -1 if not representable. */
int sc_decimal(json_object *v, long *p, int *q);

/* Keyword tables: a keyword tern compiles; a keyword with no assertion
 * (listed annotations and, as JSON Schema defines, unknown keywords other
 * than case variants of assertion keywords and foreign assertions). */
int sc_is_supported(const char *k);
int sc_is_annotation(const char *k);

#endif
