/* Regular expression -> EBNF text (xgrammar's dialect), the front end behind
 * guided_regex, also used for JSON Schema `pattern`. Supports classes,
 * \d \w \s ., escapes, groups (capturing and (?:...)), alternation,
 * quantifiers * + ? {m} {m,} {m,n} and their lazy forms, ^ and $ at the
 * ends. Backreferences, lookaround and other constructs are errors. */
#ifndef TERN_GRAMMAR_REGEX_H
#define TERN_GRAMMAR_REGEX_H

#include <stddef.h>

#include "base/err.h"

/* Converts the regex re[0..len) (UTF-8) to EBNF with a rule named root that
 * matches exactly the strings the regex matches in full (the regex is
 * implicitly anchored at both ends, as guided_regex means). On success
 * *ebnf_out is malloc'd; the caller frees it. Errors: TERN_EUNSUPPORTED
 * (construct named in the message, with its byte offset in err->pos),
 * TERN_EFORMAT (malformed regex), TERN_EFULL (output too large),
 * TERN_ENOMEM. */
int grammar_regex_to_ebnf(const char *re, size_t len, char **ebnf_out, tern_err *err);

#endif
