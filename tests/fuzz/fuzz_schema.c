/* Fuzz entry point for the JSON Schema front end: input is a JSON document
 * used as a schema (first byte, when it is not JSON syntax, selects
 * options). Every input must end in EBNF text the grammar core parses, or
 * an error value, quickly and without leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.max_ms = 300;        /* fuzzing wants fast failures, not real limits */
    o.max_bytes = 1u << 20;
    if (size > 0 && data[0] < 0x10) { /* option byte */
        o.any_whitespace = data[0] & 1;
        o.strict = (data[0] >> 1) & 1;
        o.draft = (data[0] & 4) ? 7 : 2020;
        o.max_whitespace = (data[0] & 8) ? -1 : 20;
        data++;
        size--;
    }
    tern_err err = {0};
    json_object *s = tern_json_parse((const char *)data, size, &err);
    if (!s)
        return 0;
    char *ebnf = NULL;
    if (grammar_schema_to_ebnf(s, &o, &ebnf, &err) == 0) {
        grammar_limits lim;
        grammar_limits_init(&lim);
        lim.max_ms = 300;
        lim.max_states = 200000;
        grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", &lim, &err);
        if (g) {
            grammar_check_text(g, "{}", 2);
            grammar_free(g);
        }
        free(ebnf);
    } else if (ebnf || !err.msg[0]) {
        abort(); /* an error must come with a message and no output */
    }
    json_object_put(s);
    return 0;
}
