/* JSON Schema -> EBNF text (xgrammar's dialect), the front end behind
 * response_format json_schema. Fails closed: a keyword tern cannot enforce
 * is an error naming it, never silently ignored. See docs/json-schema.md. */
#ifndef TERN_GRAMMAR_SCHEMA_H
#define TERN_GRAMMAR_SCHEMA_H

#include <json-c/json.h>

#include "base/err.h"

typedef struct grammar_schema_opts {
    /* 1: whitespace allowed between JSON tokens (capped by max_whitespace);
     * 0: compact output, "," and ":" with no spaces. */
    int any_whitespace;
    /* Longest run of whitespace characters between two tokens; -1 means
     * unlimited. Default 20: a weak model cannot spin on blanks forever. */
    int max_whitespace;
    /* 1: objects admit no property the schema does not list unless the
     * schema says so (additionalProperties / patternProperties); 0: JSON
     * Schema's default (unlisted properties of any value allowed). */
    int strict;
    /* Compile bounds: wall-clock milliseconds and bytes of EBNF output;
     * exceeding either is TERN_ETIMEOUT / TERN_EFULL, never a hang. */
    long max_ms;
    size_t max_bytes;
    /* Draft semantics when the schema has no $schema: 2020 (2020-12, the
     * default) or 7 (draft-07: $ref siblings ignored, items arrays,
     * additionalItems, dependencies). A $schema in the root wins. */
    int draft;
    /* A `pattern` or `format` string with minLength / maxLength whose
     * product automaton (the regex's states x the length counter's values)
     * would have more states than this is written without the lengths and
     * counted at run time (unique_int.h; same strings, same masks, the
     * masks cheaper). Default 4096; a larger value keeps more product
     * automata (tests compare the two). */
    long len_product_max;
} grammar_schema_opts;

/* Fills *o with the defaults (any_whitespace 1, max_whitespace 20, strict 1,
 * 2000 ms, 4 MiB, draft 2020). */
void grammar_schema_opts_init(grammar_schema_opts *o);

/* Converts schema (borrowed) to EBNF text with a rule named root. opts may
 * be NULL for the defaults. On success *ebnf_out is a malloc'd
 * NUL-terminated string the caller frees. Errors: TERN_EUNSUPPORTED (a
 * keyword or value tern cannot enforce; the message names it and its JSON
 * pointer), TERN_EINVAL (malformed schema, or a schema no value satisfies),
 * TERN_ETIMEOUT / TERN_EFULL (bounds), TERN_ENOMEM. */
int grammar_schema_to_ebnf(json_object *schema, const grammar_schema_opts *opts,
                           char **ebnf_out, tern_err *err);

#endif
