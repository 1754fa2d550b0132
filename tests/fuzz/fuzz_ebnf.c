/* Fuzz entry point for the EBNF parser and automaton builder, with tight
 * bounds. Input: grammar text. When it parses, the printed form must parse
 * again to the same language (checked on the input bytes and its
 * prefixes), and checking never crashes or leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    grammar_limits lim;
    grammar_limits_init(&lim);
    lim.max_states = 20000;
    lim.max_ms = 500;
    tern_err err = {0};
    grammar *g = grammar_from_ebnf((const char *)data, size, NULL, &lim, &err);
    if (!g)
        return 0;
    char *txt = grammar_to_ebnf(g);
    if (!txt)
        abort();
    grammar *g2 = grammar_from_ebnf(txt, strlen(txt), NULL, &lim, &err);
    if (!g2)
        abort(); /* the printer produced something the parser rejects */
    size_t n = size < 64 ? size : 64;
    for (size_t k = 0; k <= n; k++) {
        int a = grammar_check_text(g, (const char *)data, k), b = grammar_check_text(g2, (const char *)data, k);
        int pa = grammar_check_prefix(g, (const char *)data, k);
        if (a != b || (a == 1 && pa != 1))
            abort();
    }
    free(txt);
    grammar_free(g2);
    grammar_free(g);
    return 0;
}
