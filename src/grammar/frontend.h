/* Small grammar front ends: guided_choice and the built-in JSON grammar
 * (response_format json_object). Their output is EBNF text in xgrammar's
 * dialect, compiled by the grammar core like any other grammar. */
#ifndef TERN_GRAMMAR_FRONTEND_H
#define TERN_GRAMMAR_FRONTEND_H

#include <json-c/json.h>

#include "base/err.h"

/* array_of_strings (borrowed) must be a non-empty JSON array of strings;
 * the result's root matches exactly one of them (control characters and
 * quotes escaped in the EBNF literals). *ebnf_out is malloc'd; the caller
 * frees it. TERN_EINVAL on a wrong shape. */
int grammar_choice_to_ebnf(json_object *array_of_strings, char **ebnf_out, tern_err *err);

enum grammar_json_kind {
    GRAMMAR_JSON_ANY_VALUE = 0, /* any JSON value */
    GRAMMAR_JSON_OBJECT = 1,    /* json_object mode: an object at top level */
};

/* The built-in JSON grammar for the given kind and whitespace options (as
 * in grammar_schema_opts: any_whitespace, max_whitespace with -1 =
 * unlimited). Returns malloc'd EBNF text the caller frees; NULL for an
 * unknown kind or out of memory. */
char *grammar_json_builtin_ebnf(enum grammar_json_kind kind, int any_whitespace,
                                int max_whitespace);

#endif
