/* The JSON-Schema front end's output for a corpus, for comparing two
 * builds: a refactoring of src/grammar/schema*.c must leave it identical.
 * Reads JSON lines with "schema" (and optionally "draft": 7 or 2020) on
 * stdin - the output of tests/grammar/jsts_prep.py or maskbench_prep.py -
 * and for each line prints, for eight option sets (strict / non-strict,
 * both drafts, compact / capped / unlimited whitespace, small output
 * bounds that end in TERN_EFULL), either the EBNF or the error code and
 * message:
 *   python3 tests/grammar/jsts_prep.py ../shared/data/json-schema-test-suite/tests \
 *     | build/tools/schema_dump > before.txt     (then again after; cmp) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "grammar/schema.h"

#define N_CONFIGS 8

/* Option set i for a line of the given draft. The compile time limit is
 * lifted: output must not depend on the machine's load. */
static void config_opts(int i, int draft, grammar_schema_opts *o)
{
    grammar_schema_opts_init(o);
    o->max_ms = 600000;
    o->draft = draft;
    switch (i) {
    case 1: o->strict = 0; break;
    case 2: o->any_whitespace = 0; o->strict = 0; o->draft = draft == 7 ? 2020 : 7; break;
    case 3: o->max_whitespace = -1; break;
    case 4: o->max_bytes = 3000; break;
    case 5: o->max_bytes = 20000; o->strict = 0; break;
    case 6: o->any_whitespace = 0; o->max_bytes = 600; break;
    case 7: o->max_whitespace = 0; o->strict = 0; o->draft = 7; break;
    default: break;
    }
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    long ln = 0;
    int rc = 0;
    while (getline(&line, &cap, stdin) > 0) {
        ln++;
        json_object *g = json_tokener_parse(line);
        if (!g) {
            fprintf(stderr, "schema_dump: line %ld is not JSON\n", ln);
            rc = 1;
            continue;
        }
        json_object *d = json_object_object_get(g, "draft");
        int draft = d ? json_object_get_int(d) : 2020;
        for (int i = 0; i < N_CONFIGS; i++) {
            grammar_schema_opts o;
            config_opts(i, draft, &o);
            char *ebnf = NULL;
            tern_err err;
            tern_err_clear(&err);
            int r = grammar_schema_to_ebnf(json_object_object_get(g, "schema"), &o, &ebnf, &err);
            if (r)
                printf("== %ld/%d %s %s\n", ln, i, tern_err_name(r), err.msg);
            else
                printf("== %ld/%d ok\n%s\n", ln, i, ebnf);
            free(ebnf);
        }
        json_object_put(g);
    }
    free(line);
    return rc;
}
