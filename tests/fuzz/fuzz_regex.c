/* Fuzz entry point for the regex front end: input is a regex (raw bytes),
 * converted for guided_regex and as a JSON Schema `pattern`. Every input
 * must end in EBNF text the grammar core parses, or an error value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

static void check(const char *ebnf)
{
    grammar_limits lim;
    grammar_limits_init(&lim);
    lim.max_ms = 300;
    lim.max_states = 200000;
    tern_err err;
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", &lim, &err);
    if (g) {
        grammar_check_text(g, "abc", 3);
        grammar_free(g);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tern_err err = {0};
    char *ebnf = NULL;
    if (grammar_regex_to_ebnf((const char *)data, size, &ebnf, &err) == 0) {
        check(ebnf);
        free(ebnf);
    } else if (ebnf || !err.msg[0]) {
        abort();
    }
    /* the same text as a pattern (json-c needs a NUL-terminated string) */
    char *re = malloc(size + 1);
    if (!re)
        return 0;
    memcpy(re, data, size);
    re[size] = 0;
    json_object *s = json_object_new_object();
    json_object_object_add(s, "type", json_object_new_string("string"));
    json_object_object_add(s, "pattern", json_object_new_string(re));
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.max_ms = 300;
    o.max_bytes = 1u << 20;
    if (grammar_schema_to_ebnf(s, &o, &ebnf, &err) == 0) {
        check(ebnf);
        free(ebnf);
    }
    json_object_put(s);
    free(re);
    return 0;
}
